// The communicator conformance suite: one set of checks that every Comm backend passes,
// run on each rank of a communicator. LocalCommTest runs it on the in-process ranks (1 to
// 4 threads) and the one-rank communicator, MpiCommTest under mpirun with 2, 3 and 4
// ranks; a new backend (NCCL) runs the same list. Each rank checks its own results against
// references computed from every rank's inputs (Reference.h) and records what failed.
#pragma once
#include "Reference.h"
#include "SplitCheck.h"
#include "backend/comm/Comm.h"
#include "backend/comm/Wire.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <string>
#include <vector>

namespace epl::commtest {

// One rank's failed checks, each with its line in this file.
struct Checks {
  std::vector<std::string> failed;
  void expect(bool ok, const char* what, int line) {
    if (!ok) failed.push_back(fmt::format("Conformance.h:{}: {}", line, what));
  }
};
#define EPL_EXPECT(checks, cond) (checks).expect((cond), #cond, __LINE__)

// The message of the CommError `fn` throws, or "" when it throws none.
inline std::string commErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const backend::CommError& e) {
    return e.what();
  }
  return "";
}

inline bool startsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// f32 sums of exact values, bit for bit, from none to several 1 MiB ring segments a block.
inline void checkReductions(backend::Comm& c, Checks& e) {
  const int n = c.size(), r = c.rank();
  for (int64_t count : {0, 1, 3, 1000, 70001, 3000001}) {
    std::vector<float> reduced = floats(r, count, true);
    c.allReduce(reduced.data(), count, "grads");
    std::vector<float> in = floats(r, count * n, true), scattered(count, -1.f);
    backend::Request q = c.ireduceScatter(in.data(), scattered.data(), count);
    c.wait(q, "shards");
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; ++i) {
      wrong += reduced[i] != static_cast<float>(exactSum(n, i, true));
      wrong += scattered[i] != static_cast<float>(exactSum(n, r * count + i, true));
    }
    EPL_EXPECT(e, wrong == 0);
  }
}

// Blocks of their own sizes, an empty one among them, received in place (ZeRO stage 2's
// buckets, cut where the ranks' slices fall), in f32 and bf16: the sum of each rank's
// block.
inline void checkUnevenBlocks(backend::Comm& c, Checks& e) {
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
    backend::Request q = c.ireduceScatterBlocks(data.data(), data.data() + starts[r], counts, w);
    c.wait(q, "bucket");
    int64_t wrong = 0;
    for (int64_t i = 0; i < counts[r]; ++i) {
      double exact = exactSum(n, starts[r] + i, true);
      float got = data[starts[r] + i];
      wrong += w == WireType::F32 ? got != static_cast<float>(exact)
                                  : std::fabs(got - exact) > 0.02 * std::fabs(exact) + 0.02 * n;
    }
    EPL_EXPECT(e, wrong == 0);
  }
  EPL_EXPECT(e,
             commErrorOf([&] {
               std::vector<int64_t> wrongCount(static_cast<size_t>(n + 1), 1);
               c.ireduceScatterBlocks(nullptr, nullptr, wrongCount);
             })
                     .find(fmt::format("reduce-scatter of {} blocks, but the communicator has {} "
                                       "rank",
                                       n + 1, n)) != std::string::npos);
}

// Every wire type on values whose sums round: within rounding of the exact sum, exactly
// one hop for two ranks, and the same bits on every rank (gathered and compared).
inline void checkWireTypes(backend::Comm& c, Checks& e) {
  const int n = c.size(), r = c.rank();
  const int64_t count = 1500001; // more than one 1 MiB segment per block
  for (WireType w : {WireType::F32, WireType::BF16, WireType::F16}) {
    const float scale = w == WireType::F16 ? 512.f : 1.f;
    std::vector<float> reduced = floats(r, count, false);
    c.allReduce(reduced.data(), count, "grads", w, scale);
    std::vector<float> everyone(count * n);
    c.allGather(reduced.data(), everyone.data(), count * 4, "compare");
    for (int q = 1; q < n; ++q)
      EPL_EXPECT(e, std::memcmp(everyone.data(), everyone.data() + q * count, count * 4) == 0);
    int64_t outside = 0, notOneHop = 0;
    for (int64_t i = 0; i < count; ++i) {
      outside += std::fabs(reduced[i] - exactSum(n, i, false)) >
                 wireTolerance(w, n, magnitudeSum(n, i), scale);
      if (n != 2) continue;
      uint32_t a, b, sum; // room for any wire type
      float x = roughValue(0, i), y = roughValue(1, i), expected;
      backend::wire::encode(w, &x, &a, 1, scale);
      backend::wire::encode(w, &y, &b, 1, scale);
      backend::wire::add(w, &sum, &a, &b, 1);
      backend::wire::decode(w, &sum, &expected, 1, scale);
      notOneHop += bitsOf(reduced[i]) != bitsOf(expected);
    }
    EPL_EXPECT(e, outside == 0);
    EPL_EXPECT(e, notOneHop == 0);

    const int64_t block = 100003;
    std::vector<float> in = floats(r, block * n, false), shard(block);
    backend::Request q = c.ireduceScatter(in.data(), shard.data(), block, w, scale);
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
    EPL_EXPECT(e, outside == 0);
  }
}

// A loss scale keeps f16 gradients that would underflow: unscaled, 3e-8 is below half of
// f16's smallest subnormal (6e-8) and would vanish.
inline void checkLossScale(backend::Comm& c, Checks& e) {
  float grads[2] = {3e-8f, -1e-7f};
  c.allReduce(grads, 2, "grads", WireType::F16, 65536.f);
  const double n = c.size();
  EPL_EXPECT(e, std::fabs(grads[0] - 3e-8 * n) < 3e-8 * n * 1e-3);
  EPL_EXPECT(e, std::fabs(grads[1] + 1e-7 * n) < 1e-7 * n * 1e-3);
}

// All-gather (also in place), all-to-all and broadcast from every root move every rank's
// bytes, from none to 1 MiB each.
inline void checkByteCollectives(backend::Comm& c, Checks& e) {
  const int n = c.size(), r = c.rank();
  for (int64_t each : {0, 1, 13, 1 << 20}) {
    auto mine = bytes(r, each);
    std::vector<unsigned char> gathered(each * n), inPlace(each * n), toAll(each * n);
    c.allGather(mine.data(), gathered.data(), each, "gather");
    std::copy(mine.begin(), mine.end(), inPlace.begin() + r * each);
    c.allGather(inPlace.data() + r * each, inPlace.data(), each, "gather in place");
    auto send = bytes(r, each * n);
    backend::Request q = c.iallToAll(send.data(), toAll.data(), each);
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
    EPL_EXPECT(e, wrong == 0);
    c.barrier("bytes done");
  }
}

// Tags decide the match, two messages of one tag arrive in order, both directions at once
// (one peer when there are two ranks), a rank sends to itself, and a large message.
inline void checkPointToPoint(backend::Comm& c, Checks& e) {
  const int n = c.size(), r = c.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  auto a = bytes(10 * r + 1, 100), b = bytes(10 * r + 2, 100), d = bytes(10 * r + 3, 100);
  std::vector<std::vector<unsigned char>> in(4, std::vector<unsigned char>(100));
  in[3].resize(7);
  backend::Request r2 = c.irecv(in[2].data(), 100, left, 2);
  backend::Request r1 = c.irecv(in[0].data(), 100, left, 1);
  backend::Request r1b = c.irecv(in[1].data(), 100, left, 1);
  backend::Request s1 = c.isend(a.data(), 100, right, 1);
  backend::Request s2 = c.isend(b.data(), 100, right, 2);
  backend::Request s1b = c.isend(d.data(), 100, right, 1);
  backend::Request s3 = c.isend(d.data(), 7, left, 3);
  backend::Request r3 = c.irecv(in[3].data(), 7, right, 3);
  auto big = bytes(r, 8 << 20);
  std::vector<unsigned char> bigIn(8 << 20), self(100);
  backend::Request sb = c.isend(big.data(), 8 << 20, right, 4);
  backend::Request rb = c.irecv(bigIn.data(), 8 << 20, left, 4);
  backend::Request rs = c.irecv(self.data(), 100, r, 5);
  backend::Request ss = c.isend(a.data(), 100, r, 5);
  for (backend::Request* q : {&rb, &s3, &r3, &s1b, &r1, &ss, &s2, &r2, &s1, &r1b, &sb, &rs})
    c.wait(*q, "p2p");
  EPL_EXPECT(e, in[0] == bytes(10 * left + 1, 100));
  EPL_EXPECT(e, in[1] == bytes(10 * left + 3, 100));
  EPL_EXPECT(e, in[2] == bytes(10 * left + 2, 100));
  EPL_EXPECT(e, in[3] == bytes(10 * right + 3, 7));
  EPL_EXPECT(e, bigIn == bytes(left, 8 << 20));
  EPL_EXPECT(e, self == a);
}

// Requests of several collectives in flight at once, each rank waiting them in its own
// order.
inline void checkAnyOrder(backend::Comm& c, Checks& e) {
  const int n = c.size(), r = c.rank();
  std::vector<float> a = floats(r, 64, true), b = floats(r + 7, 64, true);
  auto mine = bytes(r, 5);
  std::vector<unsigned char> g(5 * n);
  std::vector<backend::Request> q;
  q.push_back(c.iallReduce(a.data(), 64));
  q.push_back(c.iallGather(mine.data(), g.data(), 5));
  q.push_back(c.iallReduce(b.data(), 64));
  q.push_back(c.ibarrier());
  for (int k = 0; k < 4; ++k)
    c.wait(q[(k + r) % 4], "any order");
  int64_t wrong = 0;
  for (int64_t i = 0; i < 64; ++i) {
    double sa = 0, sb = 0;
    for (int k = 0; k < n; ++k) {
      sa += exactValue(k, i);
      sb += exactValue(k + 7, i);
    }
    wrong += a[i] != sa || b[i] != sb;
  }
  for (int k = 0; k < n; ++k)
    wrong += !std::equal(g.begin() + 5 * k, g.begin() + 5 * (k + 1), bytes(k, 5).begin());
  EPL_EXPECT(e, wrong == 0);
}

// A collective started before a stretch of computation that never calls the communicator
// must have finished by the end of it: the communicator progresses it in the background.
// The stretch is 10 times what the same all-reduce takes when waited for (at least 0.5 s,
// at most 30 s): a machine that is slow (sanitizers, more ranks than cores, a busy CI)
// gets the time it needs, and one that never progresses in the background still fails.
inline void checkProgressWhileComputing(backend::Comm& c, Checks& e) {
  using Clock = std::chrono::steady_clock;
  const int64_t count = 4 << 20; // 16 MB
  std::vector<float> grads = floats(c.rank(), count, true);
  c.barrier("before timing");
  auto timed = Clock::now();
  c.allReduce(std::vector<float>(grads).data(), count, "timed grads");
  auto alone = Clock::now() - timed;
  auto stretch = std::clamp<Clock::duration>(10 * alone, std::chrono::milliseconds(500),
                                             std::chrono::seconds(30));
  c.barrier("before overlap");
  backend::Request q = c.iallReduce(grads.data(), count);
  auto start = Clock::now();
  double x = 0;
  while (Clock::now() - start < stretch)
    for (int i = 0; i < 1000; ++i)
      x += std::sqrt(static_cast<double>(i) + x * 1e-9);
  bool finishedDuringCompute = c.test(q);
  EPL_EXPECT(e, finishedDuringCompute);
  EPL_EXPECT(e, x > 0);
  c.wait(q, "overlapped grads");
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i)
    wrong += grads[i] != static_cast<float>(exactSum(c.size(), i, true));
  EPL_EXPECT(e, wrong == 0);
}

// Rank 0 waits for a message nobody sends: CommError after the timeout, naming what
// waited. The recv is withdrawn, so the next message of that tag goes to the next recv.
inline void checkTimeout(backend::Comm& c, Checks& e) {
  using Clock = std::chrono::steady_clock;
  char buffer[64] = {};
  if (c.rank() == 0) {
    c.setTimeout(0.5);
    backend::Request q = c.irecv(buffer, 64, 1, 99);
    auto start = Clock::now();
    std::string error = commErrorOf([&] { c.wait(q, "never-sent activation"); });
    double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EPL_EXPECT(e, error == "rank 0: `never-sent activation` did not finish within 0.5 s (recv of "
                           "64 bytes from rank 1 (tag 99))");
    EPL_EXPECT(e, waited >= 0.49 && waited < 3);
    EPL_EXPECT(e, q.empty());
    c.setTimeout(30);
  }
  c.barrier("after the timeout");
  if (c.rank() == 1) {
    auto message = bytes(7, 64);
    backend::Request first = c.isend(message.data(), 64, 0, 99);
    backend::Request second = c.isend(message.data(), 64, 0, 99);
    c.wait(first, "activation");
    c.wait(second, "activation");
  }
  if (c.rank() == 0) {
    for (int k = 0; k < 2; ++k) {
      backend::Request q = c.irecv(buffer, 64, 1, 99);
      c.wait(q, "sent activation");
      EPL_EXPECT(e, std::memcmp(buffer, bytes(7, 64).data(), 64) == 0);
    }
  }
  c.barrier("timeout done");
}

// What a caller gets wrong is a CommError that says what: a peer or root outside the
// communicator, a negative size, and a recv whose size does not match the send's (the
// backends word the last differently: each names both ranks' sizes where it knows them).
inline void checkMisuse(backend::Comm& c, Checks& e) {
  char buffer[16] = {};
  const int r = c.rank(), n = c.size();
  std::string ranks = fmt::format("but the communicator has {} rank{}", n, n == 1 ? "" : "s");
  EPL_EXPECT(e, commErrorOf([&] { c.isend(buffer, 4, n, 0); }) ==
                    fmt::format("rank {}: send to rank {}, {}", r, n, ranks));
  EPL_EXPECT(e, commErrorOf([&] { c.irecv(buffer, 4, -1, 0); }) ==
                    fmt::format("rank {}: recv from rank -1, {}", r, ranks));
  EPL_EXPECT(e, commErrorOf([&] { c.ibroadcast(buffer, 4, n + 3); }) ==
                    fmt::format("rank {}: broadcast from rank {}, {}", r, n + 3, ranks));
  EPL_EXPECT(e, commErrorOf([&] { c.isend(buffer, -1, 0, 0); }) ==
                    fmt::format("rank {}: negative byte count (-1)", r));
  EPL_EXPECT(e, commErrorOf([&] {
                  c.iallReduce(nullptr, 4, WireType::F16, 0.f);
                }).find("f16 reduction with scale 0") != std::string::npos);
  // In place is refused where ranks exchange anything; one rank's is the identity.
  std::string inPlace = commErrorOf([&] {
    backend::Request q = c.iallToAll(buffer, buffer, 8);
    c.wait(q, "experts");
  });
  EPL_EXPECT(e, inPlace == (n == 1 ? std::string()
                                   : fmt::format("rank {}: all-to-all needs separate send and "
                                                 "recv buffers",
                                                 r)));
  if (n < 2) return;
  // Sizes that do not match: a shorter and a longer send than the recv expects.
  if (r == 0) {
    backend::Request s = c.isend(buffer, 8, 1, 5);
    commErrorOf([&] { c.wait(s, "short send"); }); // the sender may fail too
    backend::Request l = c.isend(buffer, 16, 1, 6);
    commErrorOf([&] { c.wait(l, "long send"); });
  } else if (r == 1) {
    backend::Request q = c.irecv(buffer, 16, 0, 5);
    std::string shortError = commErrorOf([&] { c.wait(q, "short"); });
    EPL_EXPECT(e, startsWith(shortError, "rank 1: `short` failed: "));
    EPL_EXPECT(e, shortError.find("8 bytes") != std::string::npos);
    EPL_EXPECT(e, shortError.find("16 bytes") != std::string::npos);
    backend::Request l = c.irecv(buffer, 8, 0, 6);
    std::string longError = commErrorOf([&] { c.wait(l, "long"); });
    EPL_EXPECT(e, startsWith(longError, "rank 1: `long` failed: "));
    EPL_EXPECT(e, longError.find("8 bytes") != std::string::npos);
  }
  c.barrier("misuse done");
}

// Sub-communicators (SplitCheck.h).
inline void checkSplits(backend::Comm& c, Checks& e) {
  std::string problem = checkSplit(c);
  e.expect(problem.empty(), problem.c_str(), __LINE__);
}

struct Conformance {
  const char* name;
  int minRanks; // the check needs this many ranks
  void (*run)(backend::Comm&, Checks&);
};

// The suite, in the order it runs.
inline const std::vector<Conformance>& conformanceSuite() {
  static const std::vector<Conformance> suite = {
      {"f32 reductions", 1, checkReductions},
      {"uneven reduce-scatter blocks", 1, checkUnevenBlocks},
      {"wire types", 1, checkWireTypes},
      {"f16 loss scale", 1, checkLossScale},
      {"byte collectives", 1, checkByteCollectives},
      {"point to point", 1, checkPointToPoint},
      {"waits in any order", 1, checkAnyOrder},
      {"progress while computing", 1, checkProgressWhileComputing},
      {"timeout", 2, checkTimeout},
      {"misuse", 1, checkMisuse},
      {"splits", 1, checkSplits},
  };
  return suite;
}

} // namespace epl::commtest
