// The in-process communicators: the conformance suite every backend passes (Conformance.h)
// on 1 to 4 ranks and on the one-rank communicator, then what only they can show: a rank
// that comes late to a collective another gave up on, misuse across communicators of one
// process, the one-rank communicator's identities. Each rank runs on its own thread;
// Catch2's checks run on the test's thread only.
#include "Conformance.h"
#include "OnRanks.h"
#include "Reference.h"
#include "backend/comm/Comm.h"
#include "backend/comm/Wire.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <thread>

using namespace epl::backend;
using namespace epl::commtest;

// Each check of the suite on every rank of 1 to 4 in-process ranks (as many as it needs),
// and on the one-rank communicator.
TEST_CASE("the in-process communicators pass the conformance suite") {
  for (const Conformance& check : conformanceSuite()) {
    for (int n = check.minRanks; n <= 4; ++n) {
      CAPTURE(check.name, n);
      auto comms = makeLocalComms(n);
      std::vector<Checks> results(n);
      onRanks(comms, [&](Comm& c) {
        c.setTimeout(30);
        check.run(c, results[c.rank()]);
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(results[r].failed == std::vector<std::string>{});
      }
    }
    if (check.minRanks > 1) continue;
    CAPTURE(check.name, "self");
    auto self = makeSelfComm();
    Checks results;
    check.run(*self, results);
    CHECK(results.failed == std::vector<std::string>{});
  }
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

// Beyond the suite's misuse: what one process holding every rank can get wrong, and the
// in-process communicator's exact words for sizes that do not match.
TEST_CASE("misuse is a CommError that says what is wrong") {
  auto comms = makeLocalComms(2);
  char buffer[16] = {};
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

TEST_CASE("a split with a negative color is refused") {
  auto self = makeSelfComm();
  CHECK(commErrorOf([&] { self->split(-1, 0); }) == "rank 0: split with negative color -1");
}
