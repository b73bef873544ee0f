// The host-staged communicator (StagedComm.h) over the in-process ranks, with a device
// whose copies are counted: the conformance suite on 1 to 4 ranks, and what it copies.
#include "backend/comm/StagedComm.h"
#include "Conformance.h"
#include "CopyingDevice.h"
#include "OnRanks.h"

#include <catch2/catch.hpp>

using namespace epl::backend;
using namespace epl::commtest;

namespace {

// n staged communicators over n in-process ones, each rank with its own device.
struct StagedRanks {
  explicit StagedRanks(int n) : inner(makeLocalComms(n)), devices(n) {
    for (int r = 0; r < n; ++r)
      staged.push_back(makeStagedComm(*inner[r], devices[r]));
  }
  std::vector<std::unique_ptr<Comm>> inner;
  std::vector<CopyingDevice> devices;
  std::vector<std::unique_ptr<Comm>> staged;
};

} // namespace

TEST_CASE("the host-staged communicator passes the conformance suite") {
  for (const Conformance& check : conformanceSuite()) {
    for (int n = check.minRanks; n <= 4; ++n) {
      CAPTURE(check.name, n);
      StagedRanks ranks(n);
      std::vector<Checks> results(n);
      onRanks(ranks.staged, [&](Comm& c) {
        c.setTimeout(30);
        check.run(c, results[c.rank()]);
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(results[r].failed == std::vector<std::string>{});
      }
    }
  }
}

// Each operation copies what it reads to the host when it starts and what it writes back
// when it is waited, nothing more; in place stays in place.
TEST_CASE("the host-staged communicator copies each operation's buffers once each way") {
  StagedRanks ranks(2);
  CHECK(ranks.staged[0]->name() == "local (host-staged)");
  onRanks(ranks.staged, [&](Comm& c) {
    CopyingDevice& d = ranks.devices[c.rank()];
    std::vector<float> grads(1000, 1.f + c.rank());
    c.allReduce(grads.data(), 1000, "grads");
    CHECK(grads[999] == 3.f);
    CHECK(d.toHost == 4000);
    CHECK(d.toDevice == 4000);
    // ZeRO's in-place reduce-scatter: the whole bucket goes, this rank's block comes back.
    std::vector<float> bucket(10, 1.f);
    std::vector<int64_t> counts = {3, 7};
    float* mine = bucket.data() + (c.rank() == 0 ? 0 : 3);
    Request q = c.ireduceScatterBlocks(bucket.data(), mine, counts);
    c.wait(q, "bucket");
    CHECK(mine[0] == 2.f);
    CHECK(d.toHost == 4000 + 40);
    CHECK(d.toDevice == 4000 + 4 * counts[c.rank()]);
    // A send reads; a recv writes.
    char out[8] = "staged", in[8] = {};
    Request s = c.isend(out, 8, 1 - c.rank(), 3);
    Request r = c.irecv(in, 8, 1 - c.rank(), 3);
    c.wait(s, "send");
    c.wait(r, "recv");
    CHECK(std::string(in) == "staged");
    CHECK(d.toHost == 4000 + 40 + 8);
    CHECK(d.toDevice == 4000 + 4 * counts[c.rank()] + 8);
    // Sub-communicators stage too.
    auto sub = c.split(0, -c.rank());
    CHECK(sub->name() == "local (host-staged)");
    CHECK(sub->rank() == 1 - c.rank());
    float one = 1.f;
    sub->allReduce(&one, 1, "one");
    CHECK(one == 2.f);
    CHECK(d.toHost == 4000 + 40 + 8 + 4);
  });
}

TEST_CASE("a request is waited on the staged communicator that started it") {
  StagedRanks ranks(1);
  char buffer[4] = {};
  Request q = ranks.staged[0]->isend(buffer, 4, 0, 1);
  CHECK(commErrorOf([&] { ranks.inner[0]->wait(q, "stray"); }).find("started by another") !=
        std::string::npos);
  auto other = makeStagedComm(*ranks.inner[0], ranks.devices[0]);
  Request r = ranks.staged[0]->irecv(buffer, 4, 0, 1);
  CHECK(commErrorOf([&] { other->wait(r, "stray"); }) ==
        "rank 0: `stray` waits on a recv of 4 bytes from rank 0 (tag 1) started by another "
        "communicator");
}
