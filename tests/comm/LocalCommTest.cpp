// The in-process communicators against references computed directly from every rank's
// inputs: each collective on 1 to 4 ranks, 16-bit wire types (within their rounding, the
// same bits on every rank), point to point with tags, waits in any order, timeouts and
// misuse. Each rank runs on its own thread; Catch2's checks run on the test's thread only.
#include "Reference.h"
#include "SplitCheck.h"
#include "backend/comm/Comm.h"
#include "backend/comm/Wire.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <thread>

using namespace epl::backend;
using namespace epl::commtest;

namespace {

// Runs body(comm) for each rank of `comms` on its own thread, then rethrows the first
// exception a rank threw.
void onRanks(std::vector<std::unique_ptr<Comm>>& comms, const std::function<void(Comm&)>& body) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The message of the CommError `fn` throws, or "" when it throws none.
std::string commErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

const int64_t kCounts[] = {0, 1, 3, 1000, 70001};

} // namespace

TEST_CASE("f32 all-reduce and reduce-scatter sum exactly on 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n)
    for (int64_t count : kCounts) {
      CAPTURE(n, count);
      auto comms = makeLocalComms(n);
      std::vector<std::vector<float>> reduced(n), scattered(n);
      onRanks(comms, [&](Comm& c) {
        int r = c.rank();
        reduced[r] = floats(r, count, true);
        c.allReduce(reduced[r].data(), count, "grads");
        std::vector<float> in = floats(r, count * n, true);
        scattered[r].assign(count, -1.f);
        Request q = c.ireduceScatter(in.data(), scattered[r].data(), count);
        c.wait(q, "shards");
      });
      int64_t wrong = 0;
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) {
          wrong += reduced[r][i] != static_cast<float>(exactSum(n, i, true));
          wrong += scattered[r][i] != static_cast<float>(exactSum(n, r * count + i, true));
        }
      CHECK(wrong == 0);
    }
}

// Blocks of their own sizes (empty ones too), received in place: what ZeRO stage 2's
// buckets are, cut where the ranks' slices fall.
TEST_CASE("reduce-scatter of uneven blocks sums each rank's block in place") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    std::vector<int64_t> counts;
    for (int r = 0; r < n; ++r)
      counts.push_back(r == 1 ? 0 : 1000 * r + 3);
    int64_t total = 0;
    std::vector<int64_t> starts;
    for (int64_t c : counts)
      starts.push_back(total), total += c;
    auto comms = makeLocalComms(n);
    std::vector<std::vector<float>> data(n);
    onRanks(comms, [&](Comm& c) {
      int r = c.rank();
      data[r] = floats(r, total, true);
      Request q = c.ireduceScatterBlocks(data[r].data(), data[r].data() + starts[r], counts);
      c.wait(q, "bucket");
    });
    int64_t wrong = 0;
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < counts[r]; ++i)
        wrong += data[r][starts[r] + i] != static_cast<float>(exactSum(n, starts[r] + i, true));
    CHECK(wrong == 0);
    auto bad = makeLocalComms(1);
    CHECK(commErrorOf([&] {
            bad[0]->ireduceScatterBlocks(nullptr, nullptr, {1, 2});
          }).find("reduce-scatter of 2 blocks, but the communicator has 1 ranks") !=
          std::string::npos);
  }
}

TEST_CASE("all-gather, broadcast and all-to-all move every rank's bytes on 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n)
    for (int64_t bytesEach : {int64_t(0), int64_t(1), int64_t(13), int64_t(4096)}) {
      CAPTURE(n, bytesEach);
      auto comms = makeLocalComms(n);
      std::vector<std::vector<unsigned char>> gathered(n), inPlace(n), toAll(n);
      std::vector<std::vector<std::vector<unsigned char>>> broadcasts(n);
      onRanks(comms, [&](Comm& c) {
        int r = c.rank();
        auto mine = bytes(r, bytesEach);
        gathered[r].assign(bytesEach * n, 0);
        c.allGather(mine.data(), gathered[r].data(), bytesEach, "gather");
        // In place: this rank's block already sits in the output.
        inPlace[r].assign(bytesEach * n, 0);
        std::copy(mine.begin(), mine.end(), inPlace[r].begin() + r * bytesEach);
        c.allGather(inPlace[r].data() + r * bytesEach, inPlace[r].data(), bytesEach, "gather");
        for (int root = 0; root < n; ++root) {
          auto data =
              root == r ? bytes(100 + root, bytesEach) : std::vector<unsigned char>(bytesEach);
          c.broadcast(data.data(), bytesEach, root, "weights");
          broadcasts[r].push_back(data);
        }
        auto send = bytes(r, bytesEach * n);
        toAll[r].assign(bytesEach * n, 0);
        Request q = c.iallToAll(send.data(), toAll[r].data(), bytesEach);
        c.wait(q, "experts");
        c.barrier("end");
      });
      int64_t wrong = 0;
      for (int q = 0; q < n; ++q)
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < bytesEach; ++i) {
            wrong += gathered[q][r * bytesEach + i] != byteValue(r, i);
            wrong += inPlace[q][r * bytesEach + i] != byteValue(r, i);
            wrong += broadcasts[q][r][i] != byteValue(100 + r, i); // root r's data
            wrong += toAll[q][r * bytesEach + i] != byteValue(r, q * bytesEach + i);
          }
      CHECK(wrong == 0);
    }
}

TEST_CASE("reductions round each hop to the wire type and give every rank the same bits") {
  const int64_t count = 5000;
  for (WireType w : {WireType::F32, WireType::BF16, WireType::F16})
    for (int n = 2; n <= 4; ++n) {
      CAPTURE(wireTypeName(w), n);
      const float scale = w == WireType::F16 ? 1024.f : 1.f;
      auto comms = makeLocalComms(n);
      std::vector<std::vector<float>> reduced(n), scattered(n);
      onRanks(comms, [&](Comm& c) {
        int r = c.rank();
        reduced[r] = floats(r, count, false);
        c.allReduce(reduced[r].data(), count, "grads", w, scale);
        std::vector<float> in = floats(r, count * n, false);
        scattered[r].resize(count);
        Request q = c.ireduceScatter(in.data(), scattered[r].data(), count, w, scale);
        c.wait(q, "shards");
      });
      int64_t notSameBits = 0, outside = 0, notOneHop = 0;
      for (int64_t i = 0; i < count; ++i) {
        double tolerance = wireTolerance(w, n, magnitudeSum(n, i), scale);
        for (int r = 0; r < n; ++r)
          notSameBits += bitsOf(reduced[r][i]) != bitsOf(reduced[0][i]);
        outside += std::fabs(reduced[0][i] - exactSum(n, i, false)) > tolerance;
        if (n == 2) {         // one hop: exactly wire(wire(a) + wire(b))
          uint32_t a, b, sum; // room for any wire type
          float x = roughValue(0, i), y = roughValue(1, i);
          wire::encode(w, &x, &a, 1, scale);
          wire::encode(w, &y, &b, 1, scale);
          wire::add(w, &sum, &a, &b, 1);
          float expected;
          wire::decode(w, &sum, &expected, 1, scale);
          notOneHop += bitsOf(reduced[0][i]) != bitsOf(expected);
        }
      }
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i) {
          int64_t e = r * count + i;
          double sumAbs = 0, sum = 0;
          for (int q = 0; q < n; ++q) {
            sumAbs += std::fabs(roughValue(q, e));
            sum += roughValue(q, e);
          }
          outside += std::fabs(scattered[r][i] - sum) > wireTolerance(w, n, sumAbs, scale);
        }
      CHECK(notSameBits == 0);
      CHECK(outside == 0);
      CHECK(notOneHop == 0);
    }
}

TEST_CASE("f16 with a loss scale keeps gradients that would underflow") {
  auto comms = makeLocalComms(2);
  std::vector<std::vector<float>> out(2);
  onRanks(comms, [&](Comm& c) {
    out[c.rank()] = {3e-8f, -1e-7f};
    c.allReduce(out[c.rank()].data(), 2, "grads", WireType::F16, 65536.f);
  });
  // Unscaled, 3e-8 is below half of f16's smallest subnormal (6e-8) and would vanish.
  CHECK(out[0][0] == Approx(6e-8).epsilon(1e-3));
  CHECK(out[0][1] == Approx(-2e-7).epsilon(1e-3));
}

TEST_CASE("point to point matches by peer and tag, in order, in both directions at once") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = makeLocalComms(n);
    // got[r][k]: the k-th message rank r received.
    std::vector<std::vector<std::vector<unsigned char>>> got(n);
    onRanks(comms, [&](Comm& c) {
      int r = c.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
      auto a = bytes(10 * r + 1, 100), b = bytes(10 * r + 2, 100), d = bytes(10 * r + 3, 100);
      std::vector<std::vector<unsigned char>> in(4, std::vector<unsigned char>(100));
      in[3].resize(7);
      // Receives posted in a different order from the sends: tags decide, and two messages
      // of one tag arrive in the order they were sent.
      Request r2 = c.irecv(in[2].data(), 100, left, 2);
      Request r1 = c.irecv(in[0].data(), 100, left, 1);
      Request r1b = c.irecv(in[1].data(), 100, left, 1);
      Request s1 = c.isend(a.data(), 100, right, 1);
      Request s2 = c.isend(b.data(), 100, right, 2);
      Request s1b = c.isend(d.data(), 100, right, 1);
      // Both directions: to the left neighbour too (for n = 2 it is the same peer).
      Request s3 = c.isend(d.data(), 7, left, 3);
      Request r3 = c.irecv(in[3].data(), 7, right, 3);
      for (Request* q : {&s3, &r3, &s1b, &r1, &s2, &r2, &s1, &r1b})
        c.wait(*q, "p2p");
      got[r] = in;
    });
    int64_t wrong = 0;
    for (int r = 0; r < n; ++r) {
      int left = (r + n - 1) % n, right = (r + 1) % n;
      wrong += got[r][0] != bytes(10 * left + 1, 100);
      wrong += got[r][1] != bytes(10 * left + 3, 100);
      wrong += got[r][2] != bytes(10 * left + 2, 100);
      wrong += got[r][3] != bytes(10 * right + 3, 7);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("requests may be waited in any order, differently on each rank") {
  const int n = 3;
  auto comms = makeLocalComms(n);
  std::vector<std::vector<float>> a(n), b(n);
  std::vector<std::vector<unsigned char>> g(n);
  onRanks(comms, [&](Comm& c) {
    int r = c.rank();
    a[r] = floats(r, 64, true);
    b[r] = floats(r + 7, 64, true);
    auto mine = bytes(r, 5);
    g[r].resize(5 * n);
    std::vector<Request> q;
    q.push_back(c.iallReduce(a[r].data(), 64));
    q.push_back(c.iallGather(mine.data(), g[r].data(), 5));
    q.push_back(c.iallReduce(b[r].data(), 64));
    q.push_back(c.ibarrier());
    for (int k = 0; k < 4; ++k)
      c.wait(q[(k + r) % 4], "any order");
  });
  int64_t wrong = 0;
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 64; ++i) {
      double sa = 0, sb = 0;
      for (int q = 0; q < n; ++q) {
        sa += exactValue(q, i);
        sb += exactValue(q + 7, i);
      }
      wrong += a[r][i] != sa || b[r][i] != sb;
    }
  CHECK(wrong == 0);
}

TEST_CASE("a wait that takes longer than the timeout throws, naming what waited") {
  auto comms = makeLocalComms(2);
  std::string error, laterError;
  std::thread rank0([&] {
    comms[0]->setTimeout(0.2);
    float grads[4] = {1, 2, 3, 4};
    Request q = comms[0]->iallReduce(grads, 4);
    error = commErrorOf([&] { comms[0]->wait(q, "grads of layer 3"); });
  });
  rank0.join(); // rank 1 never joined in time
  CHECK(error == "rank 0: `grads of layer 3` did not finish within 0.2 s (all-reduce of 4 floats)");
  // When rank 1 comes late, it learns that rank 0 gave up instead of waiting forever.
  float late[4] = {};
  laterError = commErrorOf([&] { comms[1]->allReduce(late, 4, "grads of layer 3"); });
  CHECK(laterError.find("rank 1: `grads of layer 3` failed: rank 0 gave up waiting") == 0);

  // A recv nobody sends: withdrawn on timeout, so a later send does not write into it.
  comms[0]->setTimeout(0.1);
  char buffer[8];
  Request q = comms[0]->irecv(buffer, 8, 1, 7);
  CHECK(commErrorOf([&] { comms[0]->wait(q, "activation"); }) ==
        "rank 0: `activation` did not finish within 0.1 s (recv of 8 bytes from rank 1 (tag 7))");
  CHECK(q.empty());
}

TEST_CASE("misuse is a CommError that says what is wrong") {
  auto comms = makeLocalComms(2);
  char buffer[16] = {};
  CHECK(commErrorOf([&] { comms[0]->isend(buffer, 4, 2, 0); }) ==
        "rank 0: send to rank 2, but the communicator has 2 ranks");
  CHECK(commErrorOf([&] { comms[1]->irecv(buffer, 4, -1, 0); }) ==
        "rank 1: recv from rank -1, but the communicator has 2 ranks");
  CHECK(commErrorOf([&] { comms[0]->ibroadcast(buffer, 4, 5); }) ==
        "rank 0: broadcast from rank 5, but the communicator has 2 ranks");
  CHECK(commErrorOf([&] { comms[0]->isend(buffer, -1, 1, 0); }) ==
        "rank 0: negative byte count (-1)");
  CHECK(commErrorOf([&] {
          comms[0]->iallReduce(nullptr, 4, WireType::F16, 0.f);
        }).find("f16 reduction with scale 0") != std::string::npos);
  CHECK(commErrorOf([&] { comms[0]->iallToAll(buffer, buffer, 8); }) ==
        "rank 0: all-to-all needs separate send and recv buffers");

  // A request waited on by another communicator.
  Request q = comms[0]->isend(buffer, 4, 1, 0);
  CHECK(commErrorOf([&] {
          comms[1]->wait(q, "stray");
        }).find("waits on a send of 4 bytes to rank 1 (tag 0) started by another communicator") !=
        std::string::npos);

  // Sizes that do not match.
  std::string sendError, recvError;
  onRanks(comms, [&](Comm& c) {
    char mine[16] = {};
    if (c.rank() == 0) sendError = commErrorOf([&] { c.broadcast(mine, 8, 0, "b"); });
    if (c.rank() == 1) recvError = commErrorOf([&] { c.broadcast(mine, 16, 0, "b"); });
  });
  CHECK(sendError == "rank 0: `b` failed: ranks disagree: rank 0 started broadcast of 8 bytes from "
                     "rank 0, rank 1 started broadcast of 16 bytes from rank 0 (broadcast of 8 "
                     "bytes from rank 0)");
  CHECK(recvError.find("rank 1: `b` failed: ranks disagree") == 0);
  onRanks(comms, [&](Comm& c) {
    char mine[16] = {};
    if (c.rank() == 0)
      sendError = commErrorOf([&] {
        Request s = c.isend(mine, 8, 1, 4);
        c.wait(s, "s");
      });
    if (c.rank() == 1)
      recvError = commErrorOf([&] {
        Request s = c.irecv(mine, 16, 0, 4);
        c.wait(s, "r");
      });
  });
  CHECK(recvError == "rank 1: `r` failed: a send of 8 bytes met a recv of 16 bytes (rank 0 to rank "
                     "1, tag 4) (recv of 16 bytes from rank 0 (tag 4))");
  CHECK(sendError.find("rank 0: `s` failed: a send of 8 bytes met a recv of 16 bytes") == 0);
}

TEST_CASE("the one-rank communicator copies or is the identity") {
  auto self = makeSelfComm();
  CHECK(self->rank() == 0);
  CHECK(self->size() == 1);
  CHECK(self->name() == "self");
  float grads[3] = {1.f / 3, 2, 3};
  self->allReduce(grads, 3, "grads", WireType::BF16); // nothing travels: nothing rounds
  CHECK(bitsOf(grads[0]) == bitsOf(1.f / 3));
  float shard[3];
  Request q = self->ireduceScatter(grads, shard, 3);
  CHECK(self->test(q));
  self->wait(q, "shard");
  CHECK(shard[2] == 3.f);
  char in[4] = {'e', 'p', 'l', '!'}, out[4] = {};
  self->allGather(in, out, 4, "gather");
  CHECK(std::string(out, 4) == "epl!");
  self->broadcast(in, 4, 0, "weights");
  self->barrier("end");
  // A rank may send to itself.
  char back[4] = {};
  Request s = self->isend(in, 4, 0, 9);
  Request r = self->irecv(back, 4, 0, 9);
  self->wait(r, "r");
  self->wait(s, "s");
  CHECK(std::string(back, 4) == "epl!");
  CHECK(commErrorOf([&] { self->isend(in, 4, 1, 0); }) ==
        "rank 0: send to rank 1, but the communicator has 1 rank");
  Request empty;
  self->wait(empty, "nothing"); // an empty request is complete
  CHECK(self->test(empty));
}

TEST_CASE("split communicators run collectives inside disjoint groups at once, in key order") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = makeLocalComms(n);
    std::vector<std::string> problems(n);
    onRanks(comms, [&](Comm& c) {
      c.setTimeout(30);
      problems[c.rank()] = checkSplit(c);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(problems[r] == "");
    }
  }
}

TEST_CASE("a split with a negative color is refused") {
  auto self = makeSelfComm();
  CHECK(commErrorOf([&] { self->split(-1, 0); }) == "rank 0: split with negative color -1");
}
