// The MPI communicator: one process per rank, MPI_COMM_WORLD, and the communicators split
// from it. One communication thread (the Engine) owns every MPI call after initialisation:
// callers of any of these communicators queue operations and wait on them, and the thread
// posts them as nonblocking MPI operations and drives them with MPI_Test, so they progress
// while the caller computes. It sleeps on a condition variable when nothing is
// outstanding, and halts for good once a collective was given up or failed.
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
// the thread spins longer while an operation somebody waits for is unfinished, and no
// longer: counting the callers instead kept it spinning after the operation finished,
// until its waiter got a core back to say so, and with as many busy threads as cores that
// took the whole spin (a 2 ms wait for a receive that had arrived long before). With nothing
// outstanding it sleeps until the next operation: spinning there (or in a waiter) takes cores that
// compute threads or the other ranks' communication threads need, which made small operations
// slower, not faster. Between polls the thread sleeps kPollInterval, doubling while nothing moves
// up to kPollIdleMax when no caller waits: a pipeline posts every receive of a step at its start,
// and polling those every 50 us for the whole step took a quarter of the core a
// one-thread rank computes on.
constexpr auto kSpinIdle = std::chrono::microseconds(50);
constexpr auto kSpinWaited = std::chrono::milliseconds(2);
constexpr auto kPollInterval = std::chrono::microseconds(50);
constexpr auto kPollIdleMax = std::chrono::microseconds(1000);
// How long the destructor lets operations nobody waited for finish before it gives up.
constexpr auto kStopGrace = std::chrono::seconds(2);
// How long a wait that gave up lets MPI cancel a send or recv before the thread halts.
constexpr double kCancelGraceSeconds = 1;
constexpr const char* kHalted = "the communicator stopped after a collective timed out or failed";

// MPI is initialised once per process; the last communicator to go finalises it if one of
// them initialised it.
std::mutex mpiLifetime;
int liveComms = 0;
bool mpiStartedHere = false;

// The communication thread and what callers share with it. The world communicator makes
// it; every communicator split from it submits to it too, each operation carrying its own
// communicator's Context.
class Engine {
public:
  Engine(int rank, int threadLevel) : rank_(rank), threadLevel_(threadLevel) {}
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Lets outstanding operations finish (kStopGrace at most) and joins the thread; returns
  // whether some never finished (MPI cannot be finalised then).
  bool stop();
  Request submit(std::shared_ptr<Op> op);
  void wait(const Comm& comm, Request& r, const std::string& what);
  [[noreturn]] void abort(int code);

private:
  bool giveUp(Op& op);
  void haltAndWait();

  // The communication thread.
  void run();
  bool post(Op& op);
  bool drive(Op& op);
  bool cancel(Op& op);
  void fail(Op& op, const char* error);
  void halt(std::vector<std::shared_ptr<Op>>& active);
  void reportUnfinished(const std::vector<std::shared_ptr<Op>>& active);

  const int rank_, threadLevel_;

  // Shared between callers and the communication thread, under m_.
  std::mutex m_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Op>> queue_;     // started, not yet posted
  std::vector<std::shared_ptr<Op>> abandoned_; // a wait gave up on them
  bool kick_ = false;                          // something changed: spin again before sleeping
  bool sleeping_ = false;
  bool stopping_ = false;
  bool unfinished_ = false;    // operations never finished: MPI cannot be finalised
  bool haltRequested_ = false; // a cancel took too long, or abort: halt at the next turn
  bool halted_ = false;        // the thread makes no MPI call any more (halt())
  bool exited_ = false;        // the thread returned
  std::condition_variable haltedCv_;

  // The communication thread's own: a collective failed; it halts before anyone hears.
  std::shared_ptr<Op> failed_;
  std::string failedError_;

  std::thread thread_;
};

class MpiComm final : public Comm {
public:
  MpiComm(); // MPI_COMM_WORLD: initialises MPI and starts the engine
  // A communicator split from another, run by the same engine.
  MpiComm(std::shared_ptr<Engine> engine, std::shared_ptr<mpi::Context> context, int tagUpperBound)
      : engine_(std::move(engine)), context_(std::move(context)), world_(false),
        rank_(context_->rank), size_(context_->size), tagUpperBound_(tagUpperBound) {}
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Request iallReduce(float* data, int64_t count, WireType wire, float scale) override {
    checkReduction(count, wire, scale);
    return submit(mpi::makeRingAllReduce(this, data, count, wire, scale));
  }
  Request ireduceScatterBlocks(const float* send, float* recv, const std::vector<int64_t>& counts,
                               WireType wire, float scale) override {
    checkReduction(detail::checkBlocks(*this, counts), wire, scale);
    return submit(mpi::makeRingReduceScatter(this, send, recv, counts, wire, scale));
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
  std::unique_ptr<Comm> split(int color, int key) override;

  void wait(Request& r, const std::string& what) override { engine_->wait(*this, r, what); }
  bool test(Request& r) override;
  [[noreturn]] void abort(int code) override { engine_->abort(code); }

private:
  void checkReduction(int64_t count, WireType wire, float scale) const;
  void checkPointToPoint(int64_t bytes, int peer, int tag, const char* role) const;
  Request submit(std::shared_ptr<Op> op) {
    op->context = context_;
    return engine_->submit(std::move(op));
  }

  std::shared_ptr<Engine> engine_;
  std::shared_ptr<mpi::Context> context_;
  bool world_ = true;
  int rank_ = 0, size_ = 1, tagUpperBound_ = 32767;
};

// split(): MPI_Comm_split of the three communicators, on the communication thread. It
// blocks that thread until every rank of the parent posted it; every rank posts its
// operations in start order without waiting on any, so each one gets there.
class SplitOp final : public Op {
public:
  SplitOp(const Comm* owner, int color, int key)
      : Op(owner, fmt::format("split into color {}", color)), color_(color), key_(key) {}
  void start(mpi::Context& parent) override {
    auto c = std::make_shared<mpi::Context>();
    EPL_MPI(MPI_Comm_split(parent.collectives, color_, key_, &c->collectives));
    EPL_MPI(MPI_Comm_split(parent.ring, color_, key_, &c->ring));
    EPL_MPI(MPI_Comm_split(parent.pointToPoint, color_, key_, &c->pointToPoint));
    for (MPI_Comm comm : {c->collectives, c->ring, c->pointToPoint})
      EPL_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    EPL_MPI(MPI_Comm_rank(c->collectives, &c->rank));
    EPL_MPI(MPI_Comm_size(c->collectives, &c->size));
    result = std::move(c);
    finish();
  }
  bool progress(mpi::Context&) override { return false; }
  std::shared_ptr<mpi::Context> result;

private:
  int color_, key_;
};

// A split communicator's end: once none of its operations is in flight any more, the
// thread frees its MPI communicators and datatypes.
class ReleaseOp final : public Op {
public:
  explicit ReleaseOp(const Comm* owner) : Op(owner, "freeing a split communicator") {}
  void start(mpi::Context&) override {}
  bool progress(mpi::Context& c) override {
    if (c.inFlight > 1) return false; // itself is one
    c.freeComms();
    c.freeTypes();
    finish();
    return true;
  }
};

// Steps: 1. initialise MPI if nobody did, asking for MPI_THREAD_MULTIPLE so that abort()
// may call MPI_Abort from any thread while the communication thread is inside MPI (and a
// host program may call MPI itself); at least MPI_THREAD_SERIALIZED is needed, as the
// communication thread is not the thread that initialised MPI; 2. duplicate MPI_COMM_WORLD
// for collectives, ring messages and point to point, so that they never match each other,
// and make their errors return codes; 3. start the communication thread.
MpiComm::MpiComm() {
  int threadLevel = MPI_THREAD_SINGLE;
  {
    std::lock_guard<std::mutex> lock(mpiLifetime);
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw CommError("MPI was finalised already: it cannot start again");
    if (!initialised) {
      EPL_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &threadLevel));
      mpiStartedHere = true;
    } else {
      EPL_MPI(MPI_Query_thread(&threadLevel));
    }
    if (threadLevel < MPI_THREAD_SERIALIZED)
      throw CommError(fmt::format("MPI provides thread level {}; EPL's communication thread "
                                  "needs MPI_THREAD_SERIALIZED or above",
                                  threadLevel));
    ++liveComms;
  }
  context_ = std::make_shared<mpi::Context>();
  for (MPI_Comm* c : {&context_->collectives, &context_->ring, &context_->pointToPoint}) {
    EPL_MPI(MPI_Comm_dup(MPI_COMM_WORLD, c));
    EPL_MPI(MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN));
  }
  EPL_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  EPL_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  context_->rank = rank_;
  context_->size = size_;
  int* upper = nullptr;
  int found = 0;
  EPL_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found));
  if (found && upper) tagUpperBound_ = *upper;
  engine_ = std::make_shared<Engine>(rank_, threadLevel);
  engine_->start();
}

// The world: stops the communication thread (it finishes what is outstanding first), then
// frees the communicators and finalises MPI if this process's communicators initialised
// it. A split communicator: the thread frees its communicators once its operations are
// over (after the world stopped, nothing can: MPI is then finalised without).
MpiComm::~MpiComm() {
  if (!world_) {
    Request r = submit(std::make_shared<ReleaseOp>(this));
    try {
      wait(r, "freeing a split communicator");
    } catch (const CommError&) {
      // The thread halted or stopped: the communicators stay until the process ends.
    }
    return;
  }
  if (engine_->stop()) return; // MPI_Finalize would wait for them forever
  context_->freeTypes();
  context_->freeComms();
  std::lock_guard<std::mutex> lock(mpiLifetime);
  if (--liveComms == 0 && mpiStartedHere) MPI_Finalize();
}

// Steps: 1. the thread splits this communicator's three MPI communicators by (color, key);
// 2. the new MpiComm holds the Context it made and submits to the same engine.
std::unique_ptr<Comm> MpiComm::split(int color, int key) {
  if (color < 0) detail::misuse(*this, fmt::format("split with negative color {}", color));
  auto op = std::make_shared<SplitOp>(this, color, key);
  Request r = submit(op);
  wait(r, fmt::format("split into color {}", color));
  auto comm = std::make_unique<MpiComm>(engine_, op->result, tagUpperBound_);
  comm->setTimeout(timeout());
  return comm;
}

bool Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
    wake_.notify_one();
  }
  thread_.join();
  return unfinished_;
}

void MpiComm::checkReduction(int64_t count, WireType wire, float scale) const {
  detail::checkSize(*this, count, "count");
  detail::checkScale(*this, wire, scale);
}

void MpiComm::checkPointToPoint(int64_t bytes, int peer, int tag, const char* role) const {
  detail::checkSize(*this, bytes, "byte count");
  detail::checkPeer(*this, peer, role);
  if (tag < 0 || tag > tagUpperBound_)
    detail::misuse(*this, fmt::format("tag {} is outside MPI's range 0..{}", tag, tagUpperBound_));
}

Request Engine::submit(std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lock(m_);
  if (halted_ || stopping_) {
    op->finish(halted_ ? kHalted : "the MPI world communicator was destroyed");
    return Request(std::move(op));
  }
  queue_.push_back(op);
  kick_ = true;
  if (sleeping_) wake_.notify_one();
  return Request(std::move(op));
}

// An operation that finished already is not the thread's business any more; otherwise it
// is marked waited and the thread woken to poll it without sleeping.
void Engine::wait(const Comm& comm, Request& r, const std::string& what) {
  if (r.empty()) return;
  auto& op = static_cast<Op&>(*r.get());
  if (!op.finished() && !op.waited.exchange(true)) {
    std::lock_guard<std::mutex> lock(m_);
    kick_ = true;
    if (sleeping_) wake_.notify_one();
  }
  detail::waitRequest(comm, r, what,
                      [&](detail::Pending& p) { return giveUp(static_cast<Op&>(p)); });
}

// A wait timed out on `op`. Returns once MPI no longer touches its buffers, since the
// caller's error path may free them at once: MPI cancelled it (or it finished after all:
// then false, and the wait succeeds), or the communication thread halted, as it does
// at once for a collective, which MPI cannot cancel.
bool Engine::giveUp(Op& op) {
  {
    std::lock_guard<std::mutex> lock(m_);
    abandoned_.push_back(op.shared_from_this());
    kick_ = true;
    if (sleeping_) wake_.notify_one();
  }
  if (!op.waitFor(kCancelGraceSeconds)) {
    {
      std::lock_guard<std::mutex> lock(m_);
      haltRequested_ = true;
      kick_ = true;
      if (sleeping_) wake_.notify_one();
    }
    op.waitFor(0); // halt() finishes every outstanding operation
  }
  return !op.error().empty();
}

bool MpiComm::test(Request& r) {
  if (r.empty()) return true;
  if (r.get()->owner != this)
    detail::misuse(
        *this, fmt::format("test of a {} started by another communicator", r.get()->description));
  return r.get()->finished();
}

// The communication thread halts first: MPI_Abort is allowed from any thread at
// MPI_THREAD_MULTIPLE, but a progress call beside it may still touch buffers the caller
// freed on its way here, or state the abort tears down. Below that level, or outside MPI's
// lifetime, the process exits and mpirun ends the other ranks.
void Engine::abort(int code) {
  if (code == 0) code = 1;
  std::fflush(stdout);
  std::fflush(stderr);
  haltAndWait();
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised && threadLevel_ == MPI_THREAD_MULTIPLE)
    MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

// Asks the communication thread to halt and waits until it has (or returned), for a
// moment at most: a thread stuck elsewhere must not keep the job from ending.
void Engine::haltAndWait() {
  if (std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock<std::mutex> lock(m_);
  haltRequested_ = true;
  kick_ = true;
  wake_.notify_one();
  haltedCv_.wait_for(lock, std::chrono::seconds(1), [&] { return halted_ || exited_; });
}

// The communication thread. Each turn: 1. sleep when nothing is outstanding, or between
// polls once nothing moved for a while (kSpinIdle, kSpinWaited); 2. post newly started
// operations in start order (every rank starts collectives in the same order, so MPI sees
// them in the same order); 3. cancel what waits gave up on; 4. drive every outstanding
// operation once. It halts instead when a wait gave up on a collective, a collective
// failed, or a caller asked (halt()). On stop it lets outstanding operations finish, for
// kStopGrace at most.
void Engine::run() {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL); // in ns: short sleeps between polls stay short
#endif
  std::vector<std::shared_ptr<Op>> active;
  auto lastMove = Clock::now();
  auto interval = std::chrono::duration_cast<Clock::duration>(kPollInterval);
  bool moved = true, halting = false;
  std::optional<Clock::time_point> stopSince;
  for (;;) {
    std::vector<std::shared_ptr<Op>> started, abandoned;
    bool stop;
    {
      bool waited = std::any_of(active.begin(), active.end(),
                                [](const std::shared_ptr<Op>& op) { return op->waited.load(); });
      std::unique_lock<std::mutex> lock(m_);
      auto spin = waited ? kSpinWaited : kSpinIdle;
      if (!moved && !kick_ && (active.empty() || Clock::now() - lastMove > spin)) {
        sleeping_ = true;
        auto woken = [&] { return kick_ || stopping_; };
        if (active.empty()) {
          wake_.wait(lock, woken);
        } else {
          wake_.wait_for(lock, interval, woken);
          interval = waited ? std::chrono::duration_cast<Clock::duration>(kPollInterval)
                            : std::min<Clock::duration>(2 * interval, kPollIdleMax);
        }
        sleeping_ = false;
      }
      if (kick_ || moved) interval = kPollInterval;
      if (kick_) lastMove = Clock::now();
      kick_ = false;
      started.swap(queue_);
      abandoned.swap(abandoned_);
      stop = stopping_;
      halting = haltRequested_;
    }
    for (auto& op : started) { // no MPI call once halting
      if (halting || failed_) {
        active.push_back(std::move(op));
      } else if (!post(*op)) {
        ++op->context->inFlight;
        active.push_back(std::move(op));
      }
    }
    for (auto& op : abandoned)
      halting = halting || (!op->finished() && !cancel(*op));
    moved = false;
    for (size_t i = 0; i < active.size() && !halting && !failed_; ++i)
      moved |= drive(*active[i]);
    if (halting || failed_) break;
    auto done = [](const std::shared_ptr<Op>& op) {
      if (!op->finished()) return false;
      --op->context->inFlight;
      return true;
    };
    active.erase(std::remove_if(active.begin(), active.end(), done), active.end());
    if (moved) lastMove = Clock::now();
    if (!stop) continue;
    if (active.empty()) break;
    if (!stopSince) {
      stopSince = Clock::now();
      for (auto& op : active)
        cancel(*op);
    } else if (Clock::now() - *stopSince > kStopGrace) {
      reportUnfinished(active);
      break;
    }
  }
  if (halting || failed_) halt(active);
  std::lock_guard<std::mutex> lock(m_);
  exited_ = true;
  haltedCv_.notify_all();
}

// Posts a new operation; returns whether it already finished (or failed).
bool Engine::post(Op& op) {
  try {
    op.start(*op.context);
  } catch (const std::exception& e) {
    fail(op, e.what());
  }
  return op.finished();
}

// Drives an outstanding operation; returns whether anything moved.
bool Engine::drive(Op& op) {
  try {
    return op.progress(*op.context) || op.finished();
  } catch (const std::exception& e) {
    fail(op, e.what());
    return true;
  }
}

// Asks MPI to cancel an operation nobody will wait for; false where it cannot.
bool Engine::cancel(Op& op) {
  if (!op.cancellable()) return false;
  try {
    op.cancel(*op.context);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// A send or recv that failed is over. A collective that failed may still have messages in
// flight on the caller's buffers, which any later MPI call would move on: the thread halts
// before its waiter hears of the failure.
void Engine::fail(Op& op, const char* error) {
  if (op.cancellable()) return op.finish(error);
  if (failed_) return;
  failed_ = op.shared_from_this();
  failedError_ = error;
}

// Stops the communication thread for good: it makes no MPI call after this, so no
// operation touches a caller's buffer again, and every outstanding one fails. MPI cannot
// cancel a collective, and even a freed request moves on in any later MPI call, so this is
// what lets a caller free its buffers once a wait on a collective threw (its stack unwinds
// at once), and what keeps MPI_Abort from running beside a progress call. MPI is then left
// unfinalised: the job is ending.
void Engine::halt(std::vector<std::shared_ptr<Op>>& active) {
  std::vector<std::shared_ptr<Op>> rest;
  {
    std::lock_guard<std::mutex> lock(m_);
    halted_ = unfinished_ = true;
    rest.swap(queue_);
    rest.insert(rest.end(), abandoned_.begin(), abandoned_.end());
    abandoned_.clear();
  }
  if (failed_) failed_->finish(failedError_);
  for (auto* ops : {&active, &rest})
    for (auto& op : *ops)
      op->finish(kHalted);
}

void Engine::reportUnfinished(const std::vector<std::shared_ptr<Op>>& active) {
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
