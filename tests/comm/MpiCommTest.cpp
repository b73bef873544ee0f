// The MPI communicator under a real mpirun (CTest runs it with 2, 3 and 4 ranks): every
// collective against references computed from every rank's inputs, wire types with
// the same bits on every rank, point to point, progress while the caller computes, the
// timeout path, misuse and split communicators (SplitCheck.h). Each rank checks its own results and
// prints what failed; the job fails when any rank does. With --abort, rank 1 ends the job with
// Comm::abort while the others are blocked in a wait (abort_test.sh checks that mpirun ends, with
// an error); with
// --abandon, rank 0 frees the buffer of an all-reduce it gave up on (abandon_test.sh).
#include "Reference.h"
#include "SplitCheck.h"
#include "backend/comm/Comm.h"
#include "backend/comm/Wire.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

using namespace epl::backend;
using namespace epl::commtest;
using Clock = std::chrono::steady_clock;

namespace {

int rank = 0, failures = 0;

#define EXPECT(cond)                                                                               \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      ++failures;                                                                                  \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", rank, __FILE__, __LINE__, #cond); \
    }                                                                                              \
  } while (0)

std::string commErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

void testReductions(Comm& c) {
  const int n = c.size(), r = c.rank();
  for (int64_t count : {0, 1, 3, 1000, 70001, 3000001}) {
    std::vector<float> reduced = floats(r, count, true);
    c.allReduce(reduced.data(), count, "grads");
    std::vector<float> in = floats(r, count * n, true), scattered(count, -1.f);
    Request q = c.ireduceScatter(in.data(), scattered.data(), count);
    c.wait(q, "shards");
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) {
      wrong += reduced[i] != static_cast<float>(exactSum(n, i, true));
      wrong += scattered[i] != static_cast<float>(exactSum(n, r * count + i, true));
    }
    EXPECT(wrong == 0);
  }
}

// Blocks of their own sizes, an empty one among them, received in place (ZeRO stage 2's
// buckets), in f32 and bf16: the sum of each rank's block, the same on every rank.
void testUnevenBlocks(Comm& c) {
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> counts, starts;
  int64_t total = 0;
  for (int k = 0; k < n; ++k) {
    counts.push_back(k == 1 ? 0 : 700000 * k + 5); // several 1 MiB segments, and none
    starts.push_back(total);
    total += counts.back();
  }
  for (WireType w : {WireType::F32, WireType::BF16}) {
    std::vector<float> data = floats(r, total, true);
    Request q = c.ireduceScatterBlocks(data.data(), data.data() + starts[r], counts, w);
    c.wait(q, "bucket");
    int64_t wrong = 0;
    for (int64_t i = 0; i < counts[r]; ++i) {
      double exact = exactSum(n, starts[r] + i, true);
      float got = data[starts[r] + i];
      wrong += w == WireType::F32 ? got != static_cast<float>(exact)
                                  : std::fabs(got - exact) > 0.02 * std::fabs(exact) + 0.02 * n;
    }
    EXPECT(wrong == 0);
  }
}

// Every wire type on values whose sums round: within rounding of the exact sum, exactly
// one hop for two ranks, and the same bits on every rank (gathered and compared).
void testWireTypes(Comm& c) {
  const int n = c.size(), r = c.rank();
  const int64_t count = 1500001; // more than one 1 MiB segment per block
  for (WireType w : {WireType::F32, WireType::BF16, WireType::F16}) {
    const float scale = w == WireType::F16 ? 512.f : 1.f;
    std::vector<float> reduced = floats(r, count, false);
    c.allReduce(reduced.data(), count, "grads", w, scale);
    std::vector<float> everyone(count * n);
    c.allGather(reduced.data(), everyone.data(), count * 4, "compare");
    EXPECT(std::memcmp(everyone.data(), everyone.data() + r * count, count * 4) == 0);
    for (int q = 1; q < n; ++q)
      EXPECT(std::memcmp(everyone.data(), everyone.data() + q * count, count * 4) == 0);
    int64_t outside = 0, notOneHop = 0;
    for (int64_t i = 0; i < count; ++i) {
      outside += std::fabs(reduced[i] - exactSum(n, i, false)) >
                 wireTolerance(w, n, magnitudeSum(n, i), scale);
      if (n != 2) continue;
      uint32_t a, b, sum; // room for any wire type
      float x = roughValue(0, i), y = roughValue(1, i), expected;
      wire::encode(w, &x, &a, 1, scale);
      wire::encode(w, &y, &b, 1, scale);
      wire::add(w, &sum, &a, &b, 1);
      wire::decode(w, &sum, &expected, 1, scale);
      notOneHop += bitsOf(reduced[i]) != bitsOf(expected);
    }
    EXPECT(outside == 0);
    EXPECT(notOneHop == 0);

    const int64_t block = 100003;
    std::vector<float> in = floats(r, block * n, false), shard(block);
    Request q = c.ireduceScatter(in.data(), shard.data(), block, w, scale);
    c.wait(q, "shards");
    outside = 0;
    for (int64_t i = 0; i < block; ++i) {
      double sum = 0, sumAbs = 0;
      for (int k = 0; k < n; ++k) {
        sum += roughValue(k, r * block + i);
        sumAbs += std::fabs(roughValue(k, r * block + i));
      }
      outside += std::fabs(shard[i] - sum) > wireTolerance(w, n, sumAbs, scale);
    }
    EXPECT(outside == 0);
  }
}

void testByteCollectives(Comm& c) {
  const int n = c.size(), r = c.rank();
  for (int64_t each : {0, 1, 13, 1 << 20}) {
    auto mine = bytes(r, each);
    std::vector<unsigned char> gathered(each * n), inPlace(each * n), toAll(each * n);
    c.allGather(mine.data(), gathered.data(), each, "gather");
    std::copy(mine.begin(), mine.end(), inPlace.begin() + r * each);
    c.allGather(inPlace.data() + r * each, inPlace.data(), each, "gather in place");
    auto send = bytes(r, each * n);
    Request q = c.iallToAll(send.data(), toAll.data(), each);
    c.wait(q, "experts");
    int64_t wrong = 0;
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < each; ++i) {
        wrong += gathered[k * each + i] != byteValue(k, i);
        wrong += inPlace[k * each + i] != byteValue(k, i);
        wrong += toAll[k * each + i] != byteValue(k, r * each + i);
      }
    for (int root = 0; root < n; ++root) {
      auto data = root == r ? bytes(100 + root, each) : std::vector<unsigned char>(each);
      c.broadcast(data.data(), each, root, "weights");
      wrong += data != bytes(100 + root, each);
    }
    EXPECT(wrong == 0);
    c.barrier("bytes done");
  }
}

// Tags decide the match, two messages of one tag arrive in order, both directions at once,
// a rank sends to itself, and a large message.
void testPointToPoint(Comm& c) {
  const int n = c.size(), r = c.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  auto a = bytes(10 * r + 1, 100), b = bytes(10 * r + 2, 100), d = bytes(10 * r + 3, 100);
  std::vector<std::vector<unsigned char>> in(4, std::vector<unsigned char>(100));
  Request r2 = c.irecv(in[2].data(), 100, left, 2);
  Request r1 = c.irecv(in[0].data(), 100, left, 1);
  Request r1b = c.irecv(in[1].data(), 100, left, 1);
  Request s1 = c.isend(a.data(), 100, right, 1);
  Request s2 = c.isend(b.data(), 100, right, 2);
  Request s1b = c.isend(d.data(), 100, right, 1);
  Request s3 = c.isend(d.data(), 100, left, 3);
  Request r3 = c.irecv(in[3].data(), 100, right, 3);
  auto big = bytes(r, 8 << 20);
  std::vector<unsigned char> bigIn(8 << 20), self(100);
  Request sb = c.isend(big.data(), 8 << 20, right, 4);
  Request rb = c.irecv(bigIn.data(), 8 << 20, left, 4);
  Request rs = c.irecv(self.data(), 100, r, 5);
  Request ss = c.isend(a.data(), 100, r, 5);
  for (Request* q : {&rb, &s3, &r3, &s1b, &r1, &ss, &s2, &r2, &s1, &r1b, &sb, &rs})
    c.wait(*q, "p2p");
  EXPECT(in[0] == bytes(10 * left + 1, 100));
  EXPECT(in[1] == bytes(10 * left + 3, 100));
  EXPECT(in[2] == bytes(10 * left + 2, 100));
  EXPECT(in[3] == bytes(10 * right + 3, 100));
  EXPECT(bigIn == bytes(left, 8 << 20));
  EXPECT(self == a);
}

// A collective started before a stretch of computation that never calls the communicator
// must have finished by the end of it: the communication thread progresses it.
void testProgressWhileComputing(Comm& c) {
  const int64_t count = 4 << 20; // 16 MB
  std::vector<float> grads = floats(c.rank(), count, true);
  c.barrier("before overlap");
  Request q = c.iallReduce(grads.data(), count);
  auto start = Clock::now();
  double x = 0;
  while (Clock::now() - start < std::chrono::milliseconds(500))
    for (int i = 0; i < 1000; ++i)
      x += std::sqrt(static_cast<double>(i) + x * 1e-9);
  bool finishedDuringCompute = c.test(q);
  EXPECT(finishedDuringCompute);
  EXPECT(x > 0);
  c.wait(q, "overlapped grads");
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i)
    wrong += grads[i] != static_cast<float>(exactSum(c.size(), i, true));
  EXPECT(wrong == 0);
}

// Rank 0 waits for a message nobody sends: CommError after 1 s, naming what waited. The recv
// is withdrawn, so the next message of that tag goes to the next recv, and the job ends
// cleanly.
void testTimeout(Comm& c) {
  char buffer[64] = {};
  if (c.rank() == 0) {
    c.setTimeout(1);
    Request q = c.irecv(buffer, 64, 1, 99);
    auto start = Clock::now();
    std::string error = commErrorOf([&] { c.wait(q, "never-sent activation"); });
    double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT(error == "rank 0: `never-sent activation` did not finish within 1 s (recv of 64 bytes "
                    "from rank 1 (tag 99))");
    EXPECT(waited >= 0.99 && waited < 3);
    EXPECT(q.empty());
    c.setTimeout(30);
  }
  c.barrier("after the timeout");
  if (c.rank() == 1) {
    auto message = bytes(7, 64);
    Request first = c.isend(message.data(), 64, 0, 99);
    Request second = c.isend(message.data(), 64, 0, 99);
    c.wait(first, "activation");
    c.wait(second, "activation");
  }
  if (c.rank() == 0) {
    for (int k = 0; k < 2; ++k) {
      Request q = c.irecv(buffer, 64, 1, 99);
      c.wait(q, "sent activation");
      EXPECT(std::memcmp(buffer, bytes(7, 64).data(), 64) == 0);
    }
  }
  c.barrier("timeout done");
}

void testMisuse(Comm& c) {
  char buffer[16] = {};
  const int r = c.rank();
  EXPECT(commErrorOf([&] { c.isend(buffer, 4, c.size(), 0); }) ==
         "rank " + std::to_string(r) + ": send to rank " + std::to_string(c.size()) +
             ", but the communicator has " + std::to_string(c.size()) + " ranks");
  EXPECT(startsWith(commErrorOf([&] { c.irecv(buffer, 4, 0, -3); }),
                    "rank " + std::to_string(r) + ": tag -3 is outside MPI's range 0.."));
  // Sizes that do not match: a shorter and a longer send than the recv expects.
  if (r == 0) {
    Request s = c.isend(buffer, 8, 1, 5);
    c.wait(s, "short send");
    Request l = c.isend(buffer, 16, 1, 6);
    commErrorOf([&] { c.wait(l, "long send"); }); // MPI may fail the sender too
  } else if (r == 1) {
    Request q = c.irecv(buffer, 16, 0, 5);
    EXPECT(commErrorOf([&] { c.wait(q, "short"); }) ==
           "rank 1: `short` failed: the matching send had 8 bytes, not 16 (recv of 16 bytes from "
           "rank 0 (tag 5))");
    Request l = c.irecv(buffer, 8, 0, 6);
    EXPECT(startsWith(commErrorOf([&] { c.wait(l, "long"); }),
                      "rank 1: `long` failed: the matching message is longer than 8 bytes"));
  }
  c.barrier("misuse done");
}

// Rank 1 ends the job while every other rank is blocked waiting for it.
int abortJob(Comm& c) {
  if (c.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::fprintf(stderr, "rank 1 aborts the job\n");
    c.abort(3);
  }
  char buffer[8];
  Request q = c.irecv(buffer, 8, 1, 1);
  c.wait(q, "a message rank 1 never sends");
  std::fprintf(stderr, "error: rank %d was not stopped by the abort\n", c.rank());
  return 1;
}

// Rank 0 gives up on an all-reduce that rank 1 joins late, and frees its buffer at once,
// as a caller's stack unwinding from the timeout does. Its communicator must have stopped
// touching that buffer before the wait threw (it used to write into it when rank 1 joined,
// and crash), then refuse further work, and the job ends by rank 0's abort (code 3).
int abandonCollective(Comm& c) {
  const int64_t count = int64_t{1} << 24; // 64 MB: freed memory is unmapped
  if (c.rank() == 0) {
    c.setTimeout(1);
    auto data = std::make_unique<float[]>(count);
    Request q = c.iallReduce(data.get(), count);
    EXPECT(commErrorOf([&] { c.wait(q, "late all-reduce"); }) ==
           "rank 0: `late all-reduce` did not finish within 1 s (all-reduce of 16,777,216 floats)");
    data.reset();
    std::this_thread::sleep_for(std::chrono::seconds(2)); // rank 1 joins meanwhile
    EXPECT(commErrorOf([&] { c.barrier("after the timeout"); }) ==
           "rank 0: `after the timeout` failed: the communicator stopped after a collective "
           "timed out or failed (barrier)");
    std::fprintf(stderr, "rank 0 outlived the abandoned all-reduce (%d failed checks)\n", failures);
    c.abort(failures == 0 ? 3 : 4);
  }
  if (c.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<float> data(count, 1.f);
    c.allReduce(data.data(), count, "the late all-reduce");
  }
  std::this_thread::sleep_for(std::chrono::seconds(30)); // until rank 0's abort
  std::fprintf(stderr, "error: rank %d was not stopped by the abort\n", c.rank());
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  if (!insideMpiJob()) {
    std::fprintf(stderr, "error: run this under mpirun\n");
    return 2;
  }
  auto comm = makeMpiComm();
  rank = comm->rank();
  comm->setTimeout(30); // a hang fails the test with a message, not only CTest's timeout
  if (argc > 1 && std::string(argv[1]) == "--abort") return abortJob(*comm);
  if (argc > 1 && std::string(argv[1]) == "--abandon") return abandonCollective(*comm);
  auto start = Clock::now();
  try {
    testReductions(*comm);
    testWireTypes(*comm);
    testUnevenBlocks(*comm);
    testByteCollectives(*comm);
    testPointToPoint(*comm);
    testProgressWhileComputing(*comm);
    testTimeout(*comm);
    testMisuse(*comm);
    std::string split = checkSplit(*comm);
    if (!split.empty()) {
      std::fprintf(stderr, "rank %d: split: %s\n", rank, split.c_str());
      ++failures;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, e.what());
    ++failures;
  }
  float failed = static_cast<float>(failures);
  comm->allReduce(&failed, 1, "count failures");
  if (rank == 0)
    std::printf("%d ranks: %s (%.1f s)\n", comm->size(),
                failed == 0 ? "every check passed" : "some checks failed",
                std::chrono::duration<double>(Clock::now() - start).count());
  return failures == 0 && failed == 0 ? 0 : 1;
}
