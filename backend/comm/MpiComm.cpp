// The MPI communicator: one process per rank, MPI_COMM_WORLD. A communication thread owns
// every MPI call after initialisation: callers queue operations and wait on them, and the
// thread posts them as nonblocking MPI operations and drives them with MPI_Test, so they
// progress while the caller computes. It sleeps on a condition variable when nothing is
// outstanding.
#include "backend/comm/Mpi.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <optional>
#include <thread>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace epl::backend {

namespace {

using Clock = std::chrono::steady_clock;
using mpi::Op;

// How the communication thread polls while operations are outstanding: it spins (calls
// MPI_Test back to back) for a while after anything moved, then sleeps between polls so
// that compute threads get the cores. A caller blocked in wait has nothing else to do, so
// the thread spins longer for it. With nothing outstanding it sleeps until the next
// operation: spinning there (or in a waiter) takes cores that compute threads or the other
// ranks' communication threads need, which made small operations slower, not faster.
constexpr auto kSpinIdle = std::chrono::microseconds(50);
constexpr auto kSpinWaited = std::chrono::milliseconds(2);
constexpr auto kPollInterval = std::chrono::microseconds(50);
// How long the destructor lets operations nobody waited for finish before it gives up.
constexpr auto kStopGrace = std::chrono::seconds(2);

// MPI is initialised once per process; the last communicator to go finalises it if one of
// them initialised it.
std::mutex mpiLifetime;
int liveComms = 0;
bool mpiStartedHere = false;

class MpiComm final : public Comm {
public:
  MpiComm();
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Request iallReduce(float* data, int64_t count, WireType wire, float scale) override {
    checkReduction(count, wire, scale);
    return submit(mpi::makeRingAllReduce(this, data, count, wire, scale));
  }
  Request ireduceScatter(const float* send, float* recv, int64_t recvCount, WireType wire,
                         float scale) override {
    checkReduction(recvCount, wire, scale);
    return submit(mpi::makeRingReduceScatter(this, send, recv, recvCount, wire, scale));
  }
  Request iallGather(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    return submit(mpi::makeAllGather(this, send, recv, bytes));
  }
  Request ibroadcast(void* data, int64_t bytes, int root) override {
    detail::checkSize(*this, bytes, "byte count");
    detail::checkPeer(*this, root, "broadcast from");
    return submit(mpi::makeBroadcast(this, data, bytes, root));
  }
  Request iallToAll(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    if (send == recv && bytes > 0 && size_ > 1)
      detail::misuse(*this, "all-to-all needs separate send and recv buffers");
    return submit(mpi::makeAllToAll(this, send, recv, bytes));
  }
  Request isend(const void* data, int64_t bytes, int peer, int tag) override {
    checkPointToPoint(bytes, peer, tag, "send to");
    return submit(mpi::makeSend(this, data, bytes, peer, tag));
  }
  Request irecv(void* data, int64_t bytes, int peer, int tag) override {
    checkPointToPoint(bytes, peer, tag, "recv from");
    return submit(mpi::makeRecv(this, data, bytes, peer, tag));
  }
  Request ibarrier() override { return submit(mpi::makeBarrier(this)); }

  void wait(Request& r, const std::string& what) override;
  bool test(Request& r) override;
  [[noreturn]] void abort(int code) override;

private:
  void checkReduction(int64_t count, WireType wire, float scale) const;
  void checkPointToPoint(int64_t bytes, int peer, int tag, const char* role) const;
  Request submit(std::shared_ptr<Op> op);

  // The communication thread.
  void run();
  bool post(Op& op);
  bool drive(Op& op);
  void fail(Op& op, const char* error);
  void reportUnfinished(const std::vector<std::shared_ptr<Op>>& active);

  int rank_ = 0, size_ = 1, tagUpperBound_ = 32767, threadLevel_ = MPI_THREAD_SINGLE;
  mpi::Context context_; // the communication thread's, once it runs

  // Shared between callers and the communication thread, under m_.
  std::mutex m_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Op>> queue_;     // started, not yet posted
  std::vector<std::shared_ptr<Op>> abandoned_; // a wait gave up on them
  int waiters_ = 0;                            // callers blocked in wait
  bool kick_ = false;                          // something changed: spin again before sleeping
  bool sleeping_ = false;
  bool stopping_ = false;
  bool unfinished_ = false; // operations never finished: MPI cannot be finalised

  std::thread thread_;
};

// Steps: 1. initialise MPI if nobody did, asking for MPI_THREAD_MULTIPLE so that abort()
// may call MPI_Abort from any thread while the communication thread is inside MPI (and a
// host program may call MPI itself); at least MPI_THREAD_SERIALIZED is needed, as the
// communication thread is not the thread that initialised MPI; 2. duplicate MPI_COMM_WORLD
// for collectives, ring messages and point to point, so that they never match each other,
// and make their errors return codes; 3. start the communication thread.
MpiComm::MpiComm() {
  {
    std::lock_guard<std::mutex> lock(mpiLifetime);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw CommError("MPI was finalised already: it cannot start again");
    if (!initialised) {
      EPL_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &threadLevel_));
      mpiStartedHere = true;
    } else {
      EPL_MPI(MPI_Query_thread(&threadLevel_));
    }
    if (threadLevel_ < MPI_THREAD_SERIALIZED)
      throw CommError(fmt::format("MPI provides thread level {}; EPL's communication thread "
                                  "needs MPI_THREAD_SERIALIZED or above",
                                  threadLevel_));
    ++liveComms;
  }
  for (MPI_Comm* c : {&context_.collectives, &context_.ring, &context_.pointToPoint}) {
    EPL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, c));
    EPL_MPI(MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN));
  }
  EPL_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  EPL_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  context_.rank = rank_;
  context_.size = size_;
  int* upper = nullptr;
  int found = 0;
  EPL_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found));
  if (found && upper) tagUpperBound_ = *upper;
  thread_ = std::thread([this] { run(); });
}

// Stops the communication thread (it finishes what is outstanding first), then frees the
// communicators and finalises MPI if this process's communicators initialised it.
MpiComm::~MpiComm() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
    wake_.notify_one();
  }
  thread_.join();
  if (unfinished_) return; // MPI_Finalize would wait for them forever
  for (MPI_Comm* c : {&context_.collectives, &context_.ring, &context_.pointToPoint})
    MPI_Comm_free(c);
  std::lock_guard<std::mutex> lock(mpiLifetime);
  if (--liveComms == 0 && mpiStartedHere) MPI_Finalize();
}

void MpiComm::checkReduction(int64_t count, WireType wire, float scale) const {
  detail::checkSize(*this, count, "count");
  if (wire == WireType::F16 && !(std::isfinite(scale) && scale > 0))
    detail::misuse(
        *this, fmt::format("f16 reduction with scale {}: it must be positive and finite", scale));
}

void MpiComm::checkPointToPoint(int64_t bytes, int peer, int tag, const char* role) const {
  detail::checkSize(*this, bytes, "byte count");
  detail::checkPeer(*this, peer, role);
  if (tag < 0 || tag > tagUpperBound_)
    detail::misuse(*this, fmt::format("tag {} is outside MPI's range 0..{}", tag, tagUpperBound_));
}

Request MpiComm::submit(std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lock(m_);
  queue_.push_back(op);
  kick_ = true;
  if (sleeping_) wake_.notify_one();
  return Request(std::move(op));
}

void MpiComm::wait(Request& r, const std::string& what) {
  if (r.empty()) return;
  {
    std::lock_guard<std::mutex> lock(m_);
    ++waiters_;
    kick_ = true;
    if (sleeping_) wake_.notify_one();
  }
  auto giveUp = [&](detail::Pending& p) {
    std::lock_guard<std::mutex> lock(m_);
    abandoned_.push_back(static_cast<Op&>(p).shared_from_this());
    kick_ = true;
    if (sleeping_) wake_.notify_one();
    return true;
  };
  try {
    detail::waitRequest(*this, r, what, giveUp);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m_);
    --waiters_;
    throw;
  }
  std::lock_guard<std::mutex> lock(m_);
  --waiters_;
}

bool MpiComm::test(Request& r) {
  if (r.empty()) return true;
  if (r.get()->owner != this)
    detail::misuse(
        *this, fmt::format("test of a {} started by another communicator", r.get()->description));
  return r.get()->finished();
}

// MPI_Abort is safe from any thread at MPI_THREAD_MULTIPLE, even while the communication
// thread is inside MPI; below that level, or outside MPI's lifetime, the process exits and
// mpirun ends the other ranks.
void MpiComm::abort(int code) {
  if (code == 0) code = 1;
  std::fflush(stdout);
  std::fflush(stderr);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised && threadLevel_ == MPI_THREAD_MULTIPLE)
    MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

// The communication thread. Each turn: 1. sleep when nothing is outstanding, or between
// polls once nothing moved for a while (kSpinIdle, kSpinWaited); 2. post newly started
// operations in start order (every rank starts collectives in the same order, so MPI sees
// them in the same order); 3. cancel what waits gave up on; 4. drive every outstanding
// operation once. On stop it lets outstanding operations finish, for kStopGrace at most.
void MpiComm::run() {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL); // in ns: short sleeps between polls stay short
#endif
  std::vector<std::shared_ptr<Op>> active;
  auto lastMove = Clock::now();
  bool moved = true;
  std::optional<Clock::time_point> stopSince;
  for (;;) {
    std::vector<std::shared_ptr<Op>> started, abandoned;
    bool stop;
    {
      std::unique_lock<std::mutex> lock(m_);
      auto spin = waiters_ > 0 ? kSpinWaited : kSpinIdle;
      if (!moved && !kick_ && (active.empty() || Clock::now() - lastMove > spin)) {
        sleeping_ = true;
        auto woken = [&] { return kick_ || stopping_; };
        if (active.empty())
          wake_.wait(lock, woken);
        else
          wake_.wait_for(lock, kPollInterval, woken);
        sleeping_ = false;
      }
      if (kick_) lastMove = Clock::now();
      kick_ = false;
      started.swap(queue_);
      abandoned.swap(abandoned_);
      stop = stopping_;
    }
    for (auto& op : started)
      if (!post(*op)) active.push_back(std::move(op));
    for (auto& op : abandoned)
      if (!op->finished()) op->cancel(context_);
    moved = false;
    for (auto& op : active)
      moved |= drive(*op);
    auto done = [](const std::shared_ptr<Op>& op) { return op->finished(); };
    active.erase(std::remove_if(active.begin(), active.end(), done), active.end());
    if (moved) lastMove = Clock::now();
    if (!stop) continue;
    if (active.empty()) break;
    if (!stopSince) {
      stopSince = Clock::now();
      for (auto& op : active)
        op->cancel(context_);
    } else if (Clock::now() - *stopSince > kStopGrace) {
      reportUnfinished(active);
      break;
    }
  }
  context_.freeTypes();
}

// Posts a new operation; returns whether it already finished (or failed).
bool MpiComm::post(Op& op) {
  try {
    op.start(context_);
  } catch (const std::exception& e) {
    fail(op, e.what());
  }
  return op.finished();
}

// Drives an outstanding operation; returns whether anything moved.
bool MpiComm::drive(Op& op) {
  try {
    return op.progress(context_) || op.finished();
  } catch (const std::exception& e) {
    fail(op, e.what());
    return true;
  }
}

void MpiComm::fail(Op& op, const char* error) {
  try {
    op.abandonAfterFailure(context_);
  } catch (const std::exception&) {
    // The first error is the one to report.
  }
  op.finish(error);
}

void MpiComm::reportUnfinished(const std::vector<std::shared_ptr<Op>>& active) {
  std::string list;
  for (size_t i = 0; i < active.size() && i < 3; ++i)
    list += fmt::format("{}{}", i ? ", " : "", active[i]->description);
  if (active.size() > 3) list += ", ...";
  std::fprintf(stderr,
               "warning: rank %d: %zu communication operation%s never finished (%s); MPI is "
               "left unfinalised\n",
               rank_, active.size(), active.size() == 1 ? "" : "s", list.c_str());
  std::lock_guard<std::mutex> lock(m_);
  unfinished_ = true;
}

} // namespace

bool insideMpiJob() {
  // Open MPI's mpirun, PMIx launchers (Open MPI 5, Slurm with PMIx) and MPICH's Hydra.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

std::unique_ptr<Comm> makeMpiComm() {
  return std::make_unique<MpiComm>();
}

} // namespace epl::backend
