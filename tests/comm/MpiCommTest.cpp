// The MPI communicator under a real mpirun (CTest runs it with 2, 3 and 4 ranks): the
// conformance suite every backend passes (Conformance.h), and MPI's own tag range. Each
// rank checks its own results and prints what failed; the job fails when any rank does.
// With --abort, rank 1 ends the job with Comm::abort while the others are blocked in a wait
// (abort_test.sh checks that mpirun ends, with an error); with --abandon, rank 0 frees the
// buffer of an all-reduce it gave up on (abandon_test.sh); with --staged, the suite runs
// through the host-staged communicator over MPI.
#include "Conformance.h"
#include "CopyingDevice.h"
#include "backend/comm/Comm.h"
#include "backend/comm/StagedComm.h"

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

// What only MPI says: a tag outside the range MPI allows.
void checkMpiTags(Comm& c) {
  char buffer[4] = {};
  EXPECT(startsWith(commErrorOf([&] { c.irecv(buffer, 4, 0, -3); }),
                    "rank " + std::to_string(c.rank()) + ": tag -3 is outside MPI's range 0.."));
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
  // --staged: the suite through the host-staged communicator over MPI, as ranks sharing a
  // GPU run (backend/comm/StagedComm.h), with a device whose memory is the host's.
  CopyingDevice device;
  std::unique_ptr<Comm> staged;
  Comm* tested = comm.get();
  if (argc > 1 && std::string(argv[1]) == "--staged") {
    staged = makeStagedComm(*comm, device);
    tested = staged.get();
  }
  auto start = Clock::now();
  for (const Conformance& check : conformanceSuite()) {
    if (comm->size() < check.minRanks) continue;
    Checks results;
    try {
      check.run(*tested, results);
    } catch (const std::exception& e) {
      results.failed.push_back(std::string("unexpected error: ") + e.what());
    }
    for (const std::string& f : results.failed)
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, check.name, f.c_str());
    failures += static_cast<int>(results.failed.size());
  }
  try {
    checkMpiTags(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, e.what());
    ++failures;
  }
  float failed = static_cast<float>(failures);
  comm->allReduce(&failed, 1, "count failures");
  if (rank == 0)
    std::printf("%d ranks, %s: %s (%.1f s)\n", comm->size(), tested->name().c_str(),
                failed == 0 ? "every check passed" : "some checks failed",
                std::chrono::duration<double>(Clock::now() - start).count());
  return failures == 0 && failed == 0 ? 0 : 1;
}
