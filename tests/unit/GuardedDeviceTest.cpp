// The guarded CPU device (backend/Device.h, makeGuardedCpuDevice): its memory reaches the
// host through its copies only, and a read of it from anywhere else ends the process with
// its message; its kernels are the CPU's.
#include "backend/Device.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

// A child's stderr and how it ended: `body` runs in a forked process.
template <class Body> std::pair<int, std::string> inChild(Body body) {
  int pipes[2];
  REQUIRE(pipe(pipes) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(pipes[1], STDERR_FILENO);
    body();
    _exit(0);
  }
  close(pipes[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = read(pipes[0], buf, sizeof buf)) > 0;)
    said.append(buf, static_cast<size_t>(n));
  close(pipes[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return {status, said};
}

// y = a + b, four floats each, on the device.
void add4(epl::backend::Device& dev, float* y, float* a, float* b) {
  static const epl::ir::Attrs none;
  epl::backend::KernelCall c;
  c.kind = epl::ir::OpKind::Add;
  c.attrs = &none;
  epl::backend::TensorView v;
  v.shape = {4};
  c.in = {v, v};
  c.out = {v};
  c.in[0].data = a;
  c.in[1].data = b;
  c.out[0].data = y;
  dev.launch(c);
}

} // namespace

TEST_CASE("the guarded device: its memory through its copies, and nowhere else") {
  auto dev = epl::backend::makeGuardedCpuDevice(1);
  CHECK_FALSE(dev->hostAddressable());
  CHECK(dev->name().rfind("cpu", 0) == 0);
  CHECK(dev->name().find("guarded") != std::string::npos);
  std::vector<float> in{1, 2, 3, 4}, out(4, 0.f);
  auto* p = static_cast<float*>(dev->allocate(16));
  dev->copyToDevice(p, in.data(), 16);
  // A kernel of the CPU device on it: scale in place.
  epl::backend::TensorView view;
  view.data = p;
  view.shape = {4};
  view.dtype = epl::ir::DType::F32;
  dev->scale(view, 2.f);
  dev->copyToHost(out.data(), p, 16);
  CHECK(out == std::vector<float>{2, 4, 6, 8});

  // The host reading it directly, in a child: a segmentation fault, said as such.
  auto [status, said] = inChild([&] {
    volatile float seen = p[0]; // the fault
    (void)seen;
  });
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(said.find("EPL_GUARD_DEVICE: a segmentation fault") != std::string::npos);
  dev->release(p);
}

TEST_CASE("the guarded device: a kernel given host memory stops the process, naming the call") {
  auto dev = epl::backend::makeGuardedCpuDevice(1);
  auto* p = static_cast<float*>(dev->allocate(16));
  std::vector<float> host(4, 1.f);
  // What a GPU's kernel could not read.
  auto [status, said] = inChild([&] { add4(*dev, p, p, host.data()); });
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(said.find("EPL_GUARD_DEVICE: add input 1 (16 bytes at") != std::string::npos);
  CHECK(said.find("is not in the device's memory") != std::string::npos);
  // Its own memory it takes.
  std::vector<float> two(4, 2.f), out(4);
  dev->copyToDevice(p, two.data(), 16);
  add4(*dev, p, p, p);
  dev->copyToHost(out.data(), p, 16);
  CHECK(out == std::vector<float>{4, 4, 4, 4});
  dev->release(p);
}

TEST_CASE("copyRows: a piece of each row, and the pieces joined back, on the cpu devices") {
  for (bool guarded : {false, true}) {
    auto dev = guarded ? epl::backend::makeGuardedCpuDevice(1) : epl::backend::makeCpuDevice(1);
    INFO(dev->name());
    // 3 rows of 8 floats, cut in 4 pieces of 2: piece 1 of each row, then all 4 joined.
    std::vector<float> whole(24), got(6), joined(24, -1.f);
    for (int i = 0; i < 24; ++i)
      whole[static_cast<size_t>(i)] = static_cast<float>(i);
    auto* w = static_cast<float*>(dev->allocate(96));
    auto* piece = static_cast<float*>(dev->allocate(24));
    auto* back = static_cast<float*>(dev->allocate(96));
    dev->copyToDevice(w, whole.data(), 96);
    dev->copyRows(piece, 8, w + 2, 32, 8, 3);
    dev->copyToHost(got.data(), piece, 24);
    CHECK(got == std::vector<float>{2, 3, 10, 11, 18, 19});
    for (int k = 0; k < 4; ++k) {
      dev->copyRows(piece, 8, w + 2 * k, 32, 8, 3);
      dev->copyRows(back + 2 * k, 32, piece, 8, 8, 3);
    }
    dev->copyToHost(joined.data(), back, 96);
    CHECK(joined == whole);
    // Whole rows: one copy.
    dev->copyRows(back, 32, w, 32, 32, 3);
    dev->copyToHost(joined.data(), back, 96);
    CHECK(joined == whole);
    for (float* b : {w, piece, back})
      dev->release(b);
  }
}
