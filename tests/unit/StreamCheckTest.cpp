// The communication check accepts the streams of working pipelines and names the
// instructions that disagree in broken ones.
#include "ir/StreamCheck.h"
#include "tests/unit/PipelineStreams.h"

#include <catch2/catch.hpp>

using epl::ir::CollectiveKind;
using epl::ir::CommEvent;
using epl::ir::CommOp;
using epl::ir::CommStreams;
using epl::ir::DType;
using epl::testing::PipelineSchedule;
using epl::testing::pipelineStreams;

namespace {

// The whole report, "" when the streams fit together.
std::string streamProblem(const CommStreams& s) {
  auto e = epl::ir::checkStreams(s);
  return e ? e->str() : "";
}

std::string message(const CommStreams& s) {
  auto e = epl::ir::checkStreams(s);
  return e ? e->message : "";
}

CommStreams withRanks(int n) {
  CommStreams s;
  s.ranks.resize(n);
  return s;
}

int indexOf(const CommStreams& s, int rank, const std::string& label) {
  const auto& events = s.ranks[rank];
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].label == label) return static_cast<int>(i);
  FAIL("no event `" << label << "` on rank " << rank);
  return -1;
}

// Swaps two events of a rank, as a stream builder that emitted them in the wrong order.
void swapEvents(CommStreams& s, int rank, const std::string& a, const std::string& b) {
  auto& events = s.ranks[rank];
  int i = indexOf(s, rank, a), j = indexOf(s, rank, b);
  std::swap(events[i], events[j]);
  std::swap(events[i].position, events[j].position);
}

} // namespace

TEST_CASE("streams of working pipelines fit together") {
  for (auto schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB})
    for (auto [stages, replicas] : {std::pair{2, 1}, {4, 1}, {2, 2}, {4, 2}, {1, 4}})
      for (int micro : {1, 3, 8}) {
        epl::testing::PipelineShape p;
        p.stages = stages;
        p.replicas = replicas;
        p.microBatches = micro;
        p.schedule = schedule;
        INFO(stages << " stages, " << replicas << " replicas, " << micro << " micro-batches, "
                    << (schedule == PipelineSchedule::GPipe ? "gpipe" : "1f1b"));
        CHECK(streamProblem(pipelineStreams(p)) == "");
      }
}

TEST_CASE("a long pipeline fits together") {
  epl::testing::PipelineShape p;
  p.stages = 8;
  p.microBatches = 1250; // about 10,000 events on a middle stage
  p.schedule = PipelineSchedule::OneFOneB;
  auto s = pipelineStreams(p);
  CHECK(s.ranks[3].size() > 9000);
  CHECK(streamProblem(s) == "");
}

TEST_CASE("receives posted together may complete in any order") {
  auto s = withRanks(2);
  s.add(0, CommEvent::send(1, 0, 64, DType::F32, "send x to rank 1"));
  s.add(0, CommEvent::send(1, 2, 64, DType::F32, "send y to rank 1"));
  int y = s.add(1, CommEvent::irecv(0, 2, 64, DType::F32, "irecv y from rank 0"));
  int x = s.add(1, CommEvent::irecv(0, 0, 64, DType::F32, "irecv x from rank 0"));
  s.add(1, CommEvent::wait(y));
  s.add(1, CommEvent::wait(x));
  CHECK(streamProblem(s) == "");
}

TEST_CASE("swapped receives of different sizes disagree on the size") {
  // Two tensors on one tag: the receives match the sends in order.
  auto s = withRanks(2);
  s.add(0, CommEvent::send(1, 0, 4096, DType::F32, "send hidden states to rank 1"));
  s.add(0, CommEvent::send(1, 0, 1024, DType::F32, "send attention mask to rank 1"));
  s.add(1, CommEvent::recv(0, 0, 1024, DType::F32, "recv attention mask from rank 0"));
  s.add(1, CommEvent::recv(0, 0, 4096, DType::F32, "recv hidden states from rank 0"));
  CHECK(streamProblem(s) ==
        "send and receive disagree: rank 0 at instruction 0 (send hidden states to rank 1) sends "
        "4,096 bytes of f32, rank 1 at instruction 0 (recv attention mask from rank 0) receives "
        "1,024 bytes of f32\n"
        "  = note: a receive matches the sends from its peer with its tag in the order they were "
        "posted: this is the 1st message from rank 0 to rank 1 with tag 0");
}

TEST_CASE("swapped blocking receives of equal sizes wait for each other's tag") {
  epl::testing::PipelineShape p; // 2 stages, GPipe
  auto s = pipelineStreams(p);
  swapEvents(s, 1, "recv activation of micro-batch 0 from rank 0",
             "recv activation of micro-batch 1 from rank 0");
  CHECK(streamProblem(s) ==
        "deadlock: rank 0 waits at instruction 2 (send activation of micro-batch 0 to rank 1) "
        "while rank 1 waits at instruction 1 (recv activation of micro-batch 1 from rank 0)\n"
        "  = note: rank 0 needs rank 1 to receive from it with tag 0\n"
        "  = note: rank 1 needs rank 0 to send to it with tag 2\n"
        "  = help: a blocking send waits until its receive is posted (no eager buffering is "
        "assumed): post the receive first, or start the send with isend and wait for it later");
}

TEST_CASE("a send with the wrong byte count is named with its receive") {
  epl::testing::PipelineShape p;
  p.stages = 4;
  auto s = pipelineStreams(p);
  s.ranks[2][indexOf(s, 2, "send activation of micro-batch 1 to rank 3")].bytes = 2048;
  CHECK(message(s) ==
        "send and receive disagree: rank 2 at instruction 6 (send activation of micro-batch 1 to "
        "rank 3) sends 2,048 bytes of f32, rank 3 at instruction 3 (recv activation of "
        "micro-batch 1 from rank 2) receives 4,096 bytes of f32");
}

TEST_CASE("a send in another element type disagrees") {
  auto s = withRanks(2);
  s.add(0, CommEvent::send(1, 7, 4096, DType::BF16, "send logits to rank 1"));
  s.add(1, CommEvent::recv(0, 7, 4096, DType::F32, "recv logits from rank 0"));
  CHECK(message(s) == "send and receive disagree: rank 0 at instruction 0 (send logits to rank "
                      "1) sends 4,096 bytes of bf16, rank 1 at instruction 0 (recv logits from "
                      "rank 0) receives 4,096 bytes of f32");
}

TEST_CASE("a receive nobody sends is named") {
  auto s = withRanks(2);
  s.add(0, CommEvent::recv(1, 3, 64, DType::F32, "recv loss from rank 1"));
  CHECK(streamProblem(s) ==
        "rank 0 waits at instruction 0 (recv loss from rank 1), but rank 1 never "
        "sends it\n"
        "  = note: rank 1 finished its stream without another send to rank 0 with "
        "tag 3");
}

TEST_CASE("a send nobody receives is named") {
  auto s = withRanks(2);
  int r = s.add(0, CommEvent::isend(1, 3, 64, DType::F32, "isend loss to rank 1"));
  s.add(0, CommEvent::wait(r));
  CHECK(message(s) == "rank 0 waits at instruction 1 for instruction 0 (isend loss to rank 1), "
                      "but rank 1 never receives it");
  s.ranks[0].pop_back(); // and without its wait
  CHECK(streamProblem(s) ==
        "rank 0 at instruction 0 (isend loss to rank 1) sends a message that rank "
        "1 never receives\n"
        "  = note: no receive from rank 0 with tag 3 is left");
}

TEST_CASE("a collective missing on one rank is named") {
  auto s = withRanks(2);
  int g = s.addGroup({0, 1});
  s.add(0, CommEvent::collectiveOp(CollectiveKind::AllReduce, g, 4096, DType::F32,
                                   "all-reduce gradient bucket 0"));
  s.add(0, CommEvent::collectiveOp(CollectiveKind::AllReduce, g, 4096, DType::F32,
                                   "all-reduce gradient bucket 1"));
  s.add(1, CommEvent::collectiveOp(CollectiveKind::AllReduce, g, 4096, DType::F32,
                                   "all-reduce gradient bucket 0"));
  CHECK(streamProblem(s) ==
        "rank 0 waits at instruction 1 (all-reduce gradient bucket 1), the 2nd "
        "collective of group [0, 1], but rank 1 never starts it\n"
        "  = note: rank 1 finished its stream after 1 collective of that group");
}

TEST_CASE("a pipeline whose replica skips its gradient all-reduce deadlocks at the barrier") {
  epl::testing::PipelineShape p;
  p.replicas = 2;
  p.schedule = PipelineSchedule::OneFOneB;
  auto s = pipelineStreams(p);
  // Rank 3 (stage 1 of replica 1) drops its all-reduce and the wait after it.
  auto& events = s.ranks[3];
  int start = indexOf(s, 3, "all-reduce gradients of stage 1");
  REQUIRE(events[start + 1].op == CommOp::Wait);
  events.erase(events.begin() + start, events.begin() + start + 2);
  CHECK(streamProblem(s) ==
        "deadlock: rank 1 waits at instruction 25 for instruction 23 (all-reduce "
        "gradients of stage 1) while rank 3 waits at instruction 26 (barrier at "
        "the end of the step)\n"
        "  = note: rank 1 needs rank 3 to start the 1st collective of group [1, 3]\n"
        "  = note: rank 3 needs rank 1 to start the 1st collective of group "
        "[0, 1, 2, 3]");
}

TEST_CASE("collectives of one group in different orders disagree") {
  auto s = withRanks(2);
  int g = s.addGroup({0, 1});
  auto bucket = [&](int rank, int64_t bytes, const char* label) {
    s.add(rank, CommEvent::collectiveOp(CollectiveKind::AllReduce, g, bytes, DType::F32, label));
  };
  bucket(0, 4096, "all-reduce gradients of layer 1");
  bucket(0, 1024, "all-reduce gradients of layer 0");
  bucket(1, 1024, "all-reduce gradients of layer 0");
  bucket(1, 4096, "all-reduce gradients of layer 1");
  CHECK(streamProblem(s) ==
        "ranks 0 and 1 disagree on the 1st collective of group [0, 1]: rank 0 at "
        "instruction 0 (all-reduce gradients of layer 1) starts all-reduce of 4,096 "
        "bytes of f32, rank 1 at instruction 0 (all-reduce gradients of layer 0) "
        "starts all-reduce of 1,024 bytes of f32\n"
        "  = note: every rank of a group starts the group's collectives in the same "
        "order, with the same kind, size, element type and root");
}

TEST_CASE("collectives of different groups in crossed orders deadlock") {
  auto s = withRanks(3);
  int a = s.addGroup({0, 1}), b = s.addGroup({1, 2}), c = s.addGroup({0, 2});
  auto reduce = [&](int rank, int group, const char* label) {
    s.add(rank, CommEvent::collectiveOp(CollectiveKind::AllReduce, group, 256, DType::F32, label));
  };
  reduce(0, a, "all-reduce over ranks 0 and 1");
  reduce(0, c, "all-reduce over ranks 0 and 2");
  reduce(1, b, "all-reduce over ranks 1 and 2");
  reduce(1, a, "all-reduce over ranks 0 and 1");
  reduce(2, c, "all-reduce over ranks 0 and 2");
  reduce(2, b, "all-reduce over ranks 1 and 2");
  CHECK(message(s) == "deadlock: rank 0 waits at instruction 0 (all-reduce over ranks 0 and 1) "
                      "while rank 1 waits at instruction 0 (all-reduce over ranks 1 and 2) while "
                      "rank 2 waits at instruction 0 (all-reduce over ranks 0 and 2)");
}

TEST_CASE("a broadcast from another root disagrees") {
  auto s = withRanks(2);
  int g = s.addGroup({0, 1});
  s.add(0, CommEvent::broadcast(g, 0, 4096, DType::F32, "broadcast the initial weights"));
  s.add(1, CommEvent::broadcast(g, 1, 4096, DType::F32, "broadcast the initial weights"));
  CHECK(message(s) == "ranks 0 and 1 disagree on the 1st collective of group [0, 1]: rank 0 at "
                      "instruction 0 (broadcast the initial weights) starts broadcast from rank 0 "
                      "of 4,096 bytes of f32, rank 1 at instruction 0 (broadcast the initial "
                      "weights) starts broadcast from rank 1 of 4,096 bytes of f32");
}

TEST_CASE("a cycle of blocking receives deadlocks") {
  auto s = withRanks(3);
  for (int r = 0; r < 3; ++r) {
    int from = (r + 1) % 3, to = (r + 2) % 3;
    s.add(r,
          CommEvent::recv(from, 0, 64, DType::F32, fmt::format("recv token from rank {}", from)));
    s.add(r, CommEvent::send(to, 0, 64, DType::F32, fmt::format("send token to rank {}", to)));
  }
  CHECK(streamProblem(s) ==
        "deadlock: rank 0 waits at instruction 0 (recv token from rank 1) while "
        "rank 1 waits at instruction 0 (recv token from rank 2) while rank 2 waits "
        "at instruction 0 (recv token from rank 0)\n"
        "  = note: rank 0 needs rank 1 to send to it with tag 0\n"
        "  = note: rank 1 needs rank 2 to send to it with tag 0\n"
        "  = note: rank 2 needs rank 0 to send to it with tag 0");
}

TEST_CASE("blocking sends both ways work only with eager buffering") {
  auto s = withRanks(2);
  for (int r = 0; r < 2; ++r) {
    s.add(r, CommEvent::send(1 - r, 0, 1 << 20, DType::F32,
                             fmt::format("send halo to rank {}", 1 - r)));
    s.add(r, CommEvent::recv(1 - r, 0, 1 << 20, DType::F32,
                             fmt::format("recv halo from rank {}", 1 - r)));
  }
  CHECK(streamProblem(s) ==
        "deadlock: rank 0 waits at instruction 0 (send halo to rank 1) while rank "
        "1 waits at instruction 0 (send halo to rank 0)\n"
        "  = note: rank 0 needs rank 1 to receive from it with tag 0\n"
        "  = note: rank 1 needs rank 0 to receive from it with tag 0\n"
        "  = help: a blocking send waits until its receive is posted (no eager "
        "buffering is assumed): post the receive first, or start the send with "
        "isend and wait for it later");
}

TEST_CASE("1F1B with blocking sends in the steady state deadlocks") {
  epl::testing::PipelineShape p;
  p.schedule = PipelineSchedule::NaiveOneFOneB;
  CHECK(message(pipelineStreams(p)) ==
        "deadlock: rank 0 waits at instruction 4 (send activation of micro-batch 1 to rank 1) "
        "while rank 1 waits at instruction 4 (send gradient of micro-batch 0 to rank 0)");
}

TEST_CASE("a request never waited is named") {
  auto s = withRanks(2);
  s.add(0, CommEvent::isend(1, 0, 64, DType::F32, "isend loss to rank 1"));
  s.add(1, CommEvent::recv(0, 0, 64, DType::F32, "recv loss from rank 0"));
  CHECK(streamProblem(s) ==
        "rank 0 at instruction 0 (isend loss to rank 1) starts an operation that "
        "is never waited for\n"
        "  = note: each started operation is waited exactly once: its buffer stays "
        "in use until then");
}

TEST_CASE("malformed events are named") {
  auto s = withRanks(2);
  int r = s.add(0, CommEvent::irecv(1, 0, 64, DType::F32, "irecv loss from rank 1"));
  s.add(0, CommEvent::wait(r));
  s.add(0, CommEvent::wait(r));
  s.add(1, CommEvent::send(0, 0, 64, DType::F32, "send loss to rank 0"));
  CHECK(message(s) == "rank 0 at instruction 2 waits a second time for instruction 0 (irecv loss "
                      "from rank 1)");

  s.ranks[0][2].request = 2;
  CHECK(message(s) == "rank 0 at instruction 2 waits for event 2, which is not an earlier "
                      "asynchronous operation of rank 0");

  s.ranks[0].pop_back();
  s.ranks[1][0].peer = 2;
  CHECK(message(s) == "rank 1 at instruction 0 (send loss to rank 0) names rank 2, but the job "
                      "has 2 ranks");

  s.ranks[1][0].peer = 0;
  s.addGroup({0, 1});
  s.add(1, CommEvent::broadcast(0, 3, 64, DType::F32, "broadcast the seed"));
  CHECK(message(s) == "rank 1 at instruction 1 (broadcast the seed) broadcasts from rank 3, "
                      "which is not in group [0, 1]");
}
