// Just enough of CUDA to run a kernel's device code on the host, for machines without a GPU:
// a block's threads are fibers (ucontext) on one host thread, switched at every barrier
// (__syncthreads, __syncwarp, and each __shfl_xor_sync, which is a warp's exchange); WMMA's
// fragments hold their whole matrix in every thread, so a warp's product is every thread's.
//
// What it checks: the kernel's arithmetic, indexing and ordering as CUDA defines them, that
// every thread of a block (of a warp) reaches each barrier (else the launch throws: it would
// hang on a GPU), and that no value is read from shared memory before it is written (it
// starts as NaN each block). What it cannot: timing, bank conflicts, a fragment's real
// layout of elements over the lanes (the kernels touch fragments only elementwise, which
// any layout gives alike), and TF32 products' order of additions.
#pragma once

#define EPL_CUDA_EMULATION 1

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <math.h>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <ucontext.h>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(n)
#define EPL_UNROLL
#define EPL_DYNAMIC_SHARED(name) float* name = ::epl::emu::sharedFloats()
#define threadIdx (::epl::emu::thread())
#define blockIdx (::epl::emu::block().index)
#define blockDim (::epl::emu::block().dim)
#define gridDim (::epl::emu::block().grid)

namespace epl::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// TF32 rounding of products' operands (wmma::__float_to_tf32): on by default, as the GPU
// does; off, the products are exact f32 and the kernel can be held to f32's tolerance.
inline bool& tf32Rounding() {
  static bool on = true;
  return on;
}

// One block's threads and barriers, run to the end by run().
class Block {
public:
  Dim3 index, dim, grid;
  std::vector<float> shared;
  std::vector<float> exchange; // a slot a thread, for the warps' shuffles

  void run(int threads, const std::function<void()>& body) {
    body_ = &body;
    error_.clear();
    fibers_.resize(static_cast<size_t>(threads));
    arrived_.assign(1 + threads / kWarp, 0);
    generation_.assign(1 + threads / kWarp, 0);
    exchange.assign(static_cast<size_t>(threads), 0.f);
    for (int i = 0; i < threads; ++i) {
      Fiber& f = fibers_[static_cast<size_t>(i)];
      f.stack.resize(kStack);
      f.done = false;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = &scheduler_;
      makecontext(&f.ctx, &Block::entry, 0);
    }
    // Each round resumes every live thread once; a round in which no thread arrived at a
    // barrier or ended is a barrier some thread never reaches.
    for (bool alive = true; alive;) {
      alive = false;
      int64_t before = events_;
      for (int i = 0; i < threads; ++i) {
        if (fibers_[static_cast<size_t>(i)].done) continue;
        alive = true;
        current_ = i;
        swapcontext(&scheduler_, &fibers_[static_cast<size_t>(i)].ctx);
        if (!error_.empty()) throw std::runtime_error(error_);
      }
      if (alive && events_ == before)
        throw std::runtime_error("a barrier that not every thread of the block (or warp) reaches");
    }
  }

  int current() const { return current_; }

  // Barrier `id` (0: the block's; 1 + w: warp w's) of `count` threads.
  void arrive(int id, int count) {
    ++events_;
    if (++arrived_[static_cast<size_t>(id)] == count) {
      arrived_[static_cast<size_t>(id)] = 0;
      ++generation_[static_cast<size_t>(id)];
      return;
    }
    int64_t mine = generation_[static_cast<size_t>(id)];
    while (generation_[static_cast<size_t>(id)] == mine)
      swapcontext(&fibers_[static_cast<size_t>(current_)].ctx, &scheduler_);
  }

  static constexpr int kWarp = 32;

private:
  static constexpr size_t kStack = 256 * 1024;
  struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
  };

  static void entry();

  std::vector<Fiber> fibers_;
  std::vector<int> arrived_;
  std::vector<int64_t> generation_;
  ucontext_t scheduler_;
  const std::function<void()>* body_ = nullptr;
  int current_ = 0;
  int64_t events_ = 0;
  std::string error_; // what a thread threw, ending the block

  friend Block& block();
};

inline Block& block() {
  static Block b;
  return b;
}

inline void Block::entry() {
  Block& b = block();
  try {
    (*b.body_)();
  } catch (const std::exception& e) {
    b.error_ = e.what();
  }
  ++b.events_;
  b.fibers_[static_cast<size_t>(b.current_)].done = true;
} // returns to the scheduler (uc_link)

inline Dim3 thread() {
  Block& b = block();
  Dim3 t;
  t.x = static_cast<unsigned>(b.current());
  return t;
}

inline float* sharedFloats() {
  return block().shared.data();
}

// The most dynamic shared memory a block may ask for on an H100 or H200 (227 KiB).
constexpr size_t kSharedOptIn = 232448;

// kernel(args...) over grid x block.x threads with `sharedBytes` of dynamic shared memory,
// one block after another.
template <class Kernel, class... Args>
void launch(Dim3 grid, int threads, size_t sharedBytes, Kernel kernel, Args... args) {
  if (threads % Block::kWarp != 0 || threads > 1024)
    throw std::runtime_error("a block is at most 1024 threads, in whole warps");
  if (sharedBytes > kSharedOptIn)
    throw std::runtime_error("more shared memory than a block of an H100 or H200 can have");
  Block& b = block();
  b.grid = grid;
  b.dim = Dim3{static_cast<unsigned>(threads), 1, 1};
  std::function<void()> body = [&] { kernel(args...); };
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.index = Dim3{x, y, z};
        b.shared.assign((sharedBytes + 3) / 4, std::numeric_limits<float>::quiet_NaN());
        b.run(threads, body);
      }
}

} // namespace epl::emu

inline void __syncthreads() {
  epl::emu::Block& b = epl::emu::block();
  b.arrive(0, static_cast<int>(b.dim.x));
}

inline void __syncwarp(unsigned = 0xffffffffu) {
  epl::emu::Block& b = epl::emu::block();
  b.arrive(1 + b.current() / epl::emu::Block::kWarp, epl::emu::Block::kWarp);
}

// Every lane of the warp (the kernels' only use) gives v and takes lane ^ o's.
inline float __shfl_xor_sync(unsigned, float v, int o) {
  epl::emu::Block& b = epl::emu::block();
  int self = b.current(), lane = self % epl::emu::Block::kWarp;
  b.exchange[static_cast<size_t>(self)] = v;
  __syncwarp();
  float r = b.exchange[static_cast<size_t>(self - lane + (lane ^ o))];
  __syncwarp();
  return r;
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

// The fragment's matrix: A [M, K], B [K, N], the sums [M, N]; x[] is it row by row.
template <class Use, int M, int N, int K> struct Extent;
template <int M, int N, int K> struct Extent<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct Extent<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct Extent<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  using Use_ = Use;
  using Layout_ = Layout;
  static constexpr int rows = Extent<Use, M, N, K>::rows, cols = Extent<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];
};

// The warp's threads meet at each call (the `_sync` of WMMA's names): every thread's load
// is done before any thread's store that follows it, as a converged warp's are. A matrix in
// shared memory must start 32 bytes from its start and have rows (columns) a multiple of 16
// bytes apart, as WMMA requires.
inline void converge(const float* p, unsigned ld) {
  __syncwarp();
  const std::vector<float>& shared = epl::emu::block().shared;
  if (p >= shared.data() && p < shared.data() + shared.size() && (p - shared.data()) % 8 != 0)
    throw std::runtime_error("a WMMA matrix in shared memory not on 32 bytes");
  if (ld % 4 != 0) throw std::runtime_error("a WMMA matrix's leading dimension not of 16 bytes");
}

// Element (i, j) of a matrix at p, ld apart, row- or column-major.
inline float& at(float* p, unsigned ld, bool rowMajor, int i, int j) {
  return rowMajor ? p[static_cast<size_t>(i) * ld + j] : p[i + static_cast<size_t>(j) * ld];
}

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const float* p, unsigned ld) {
  converge(p, ld);
  using F = fragment<Use, M, N, K, T, Layout>;
  constexpr bool rowMajor = std::is_same<Layout, row_major>::value;
  for (int i = 0; i < F::rows; ++i)
    for (int j = 0; j < F::cols; ++j)
      f.x[i * F::cols + j] = at(const_cast<float*>(p), ld, rowMajor, i, j);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ld,
                      layout_t layout) {
  converge(p, ld);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      f.x[i * N + j] = at(const_cast<float*>(p), ld, layout == mem_row_major, i, j);
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ld,
                       layout_t layout) {
  converge(p, ld);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      at(p, ld, layout == mem_row_major, i, j) = f.x[i * N + j];
}

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v) {
  for (float& e : f.x)
    e = v;
}

// d = a b + c, f32 sums in the order of k.
template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  __syncwarp();
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k)
        s += a.x[i * K + k] * b.x[k * N + j];
      out[i * N + j] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}

// f32 to TF32 (10 bits of mantissa), to nearest with ties away from zero, as cvt.rna does.
inline float __float_to_tf32(float v) {
  if (!epl::emu::tf32Rounding() || !std::isfinite(v)) return v;
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &u, 4);
  return v;
}

} // namespace nvcuda::wmma
