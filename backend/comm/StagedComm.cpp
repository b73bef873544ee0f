// The host-staged communicator (StagedComm.h).
#include "backend/comm/StagedComm.h"

#include "backend/Device.h"
#include "backend/comm/Pending.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <utility>
#include <vector>

namespace epl::backend {

namespace {

// Requests dropped before their wait (a caller's error path), with the host copies their
// inner operations may still read or write: kept until those finish.
struct Orphans {
  std::mutex m;
  std::vector<std::pair<Request, std::vector<unsigned char>>> held;
};

// One started operation: the inner communicator's request on the host copies, and what to
// copy back to the device once it finished. Its description is the inner request's.
struct StagedPending final : detail::Pending {
  StagedPending(const Comm* owner, std::shared_ptr<Orphans> orphans)
      : Pending(owner, ""), orphans(std::move(orphans)) {}
  ~StagedPending() override {
    if (inner.empty()) return; // waited
    std::lock_guard<std::mutex> lock(orphans->m);
    orphans->held.emplace_back(std::move(inner), std::move(host));
  }
  std::string describe() const {
    return inner.empty() ? "finished operation" : inner.get()->description;
  }
  std::shared_ptr<Orphans> orphans;
  Request inner;
  std::vector<unsigned char> host; // the host copy of the operation's buffers
  // Device ranges to write back from `host`: (device address, offset in host, bytes).
  struct Back {
    void* device;
    int64_t offset, bytes;
  };
  std::vector<Back> back;
};

class StagedComm final : public Comm {
public:
  StagedComm(Comm& inner, Device& device, std::unique_ptr<Comm> owned = nullptr)
      : inner_(inner), device_(device), owned_(std::move(owned)) {}

  ~StagedComm() override {
    reap();
    // What has not finished may still touch its host copy: leaked rather than freed under
    // it (only after a caller dropped a request, on its way out).
    std::lock_guard<std::mutex> lock(orphans_->m);
    for (auto& [request, host] : orphans_->held)
      new std::vector<unsigned char>(std::move(host));
    orphans_->held.clear();
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name() + " (host-staged)"; }

  Request iallReduce(float* data, int64_t count, WireType wire, float scale) override {
    auto p = stage({{data, 4 * count}});
    p->inner = inner_.iallReduce(hostFloats(*p, 0), count, wire, scale);
    writeBack(*p, 0, data, 4 * count);
    return Request(std::move(p));
  }

  Request ireduceScatterBlocks(const float* send, float* recv, const std::vector<int64_t>& counts,
                               WireType wire, float scale) override {
    int64_t total = detail::checkBlocks(*this, counts);
    int64_t mine = counts.at(static_cast<size_t>(rank()));
    // In place (recv inside send) stays in place on the host.
    auto [p, recvAt] = stageTwo(send, 4 * total, recv, 4 * mine);
    p->inner =
        inner_.ireduceScatterBlocks(hostFloats(*p, 0), hostFloats(*p, recvAt), counts, wire, scale);
    writeBack(*p, recvAt, recv, 4 * mine);
    return Request(std::move(p));
  }

  Request iallGather(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    auto [p, recvAt] = stageTwo(send, bytes, recv, bytes * size());
    p->inner = inner_.iallGather(p->host.data(), p->host.data() + recvAt, bytes);
    writeBack(*p, recvAt, recv, bytes * size());
    return Request(std::move(p));
  }

  Request ibroadcast(void* data, int64_t bytes, int root) override {
    detail::checkSize(*this, bytes, "byte count");
    auto p = stage({{data, bytes}});
    p->inner = inner_.ibroadcast(p->host.data(), bytes, root);
    writeBack(*p, 0, data, bytes);
    return Request(std::move(p));
  }

  Request iallToAll(const void* send, void* recv, int64_t bytes) override {
    detail::checkSize(*this, bytes, "byte count");
    auto [p, recvAt] = stageTwo(send, bytes * size(), recv, bytes * size());
    p->inner = inner_.iallToAll(p->host.data(), p->host.data() + recvAt, bytes);
    writeBack(*p, recvAt, recv, bytes * size());
    return Request(std::move(p));
  }

  Request isend(const void* data, int64_t bytes, int peer, int tag) override {
    detail::checkSize(*this, bytes, "byte count");
    auto p = stage({{data, bytes}});
    p->inner = inner_.isend(p->host.data(), bytes, peer, tag);
    return Request(std::move(p));
  }

  Request irecv(void* data, int64_t bytes, int peer, int tag) override {
    detail::checkSize(*this, bytes, "byte count");
    auto p = started();
    p->host.resize(static_cast<size_t>(bytes));
    p->inner = inner_.irecv(p->host.data(), bytes, peer, tag);
    writeBack(*p, 0, data, bytes);
    return Request(std::move(p));
  }

  Request ibarrier() override {
    auto p = started();
    p->inner = inner_.ibarrier();
    return Request(std::move(p));
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    inner_.setTimeout(timeout());
    auto sub = inner_.split(color, key);
    Comm& ref = *sub;
    auto staged = std::make_unique<StagedComm>(ref, device_, std::move(sub));
    staged->setTimeout(timeout());
    return staged;
  }

  void wait(Request& r, const std::string& what) override {
    if (r.empty()) return;
    auto* p = dynamic_cast<StagedPending*>(r.get());
    if (!p || p->owner != this) {
      std::string description = p ? p->describe() : r.get()->description;
      r.reset();
      detail::misuse(*this, fmt::format("`{}` waits on a {} started by another communicator", what,
                                        description));
    }
    inner_.setTimeout(timeout());
    try {
      inner_.wait(p->inner, what);
    } catch (...) {
      r.reset();
      throw;
    }
    for (const StagedPending::Back& b : p->back)
      device_.copyToDevice(b.device, p->host.data() + b.offset, b.bytes);
    if (!p->back.empty()) device_.synchronize(); // the host copy goes with the request
    r.reset();
  }

  bool test(Request& r) override {
    if (r.empty()) return true;
    auto* p = dynamic_cast<StagedPending*>(r.get());
    return p && inner_.test(p->inner);
  }

  [[noreturn]] void abort(int code) override {
    inner_.abort(code);
    std::abort(); // not reached: the inner communicator's abort does not return
  }

private:
  // A new operation's state; first, the dropped requests that finished are let go.
  std::shared_ptr<StagedPending> started() {
    reap();
    return std::make_shared<StagedPending>(this, orphans_);
  }

  void reap() {
    std::lock_guard<std::mutex> lock(orphans_->m);
    auto& held = orphans_->held;
    for (size_t i = 0; i < held.size();) {
      if (!inner_.test(held[i].first)) {
        ++i;
        continue;
      }
      try {
        inner_.wait(held[i].first, "a request dropped before its wait");
      } catch (const CommError&) { // its failure was the dropped caller's
      }
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  struct Range {
    const void* device;
    int64_t bytes;
  };

  // A request whose host copy holds `ranges` side by side, copied from the device.
  std::shared_ptr<StagedPending> stage(const std::vector<Range>& ranges) {
    auto p = started();
    int64_t total = 0;
    for (const Range& r : ranges)
      total += std::max<int64_t>(r.bytes, 0);
    p->host.resize(static_cast<size_t>(total));
    int64_t at = 0;
    for (const Range& r : ranges) {
      if (r.bytes > 0 && r.device) device_.copyToHost(p->host.data() + at, r.device, r.bytes);
      at += std::max<int64_t>(r.bytes, 0);
    }
    device_.synchronize();
    return p;
  }

  // Two buffers: where the second lies inside the first (an operation in place), one host
  // copy with the same offset; else the second after the first. Only the first is read, so
  // only it is copied. Returns the request and the second's offset in its host copy.
  std::pair<std::shared_ptr<StagedPending>, int64_t>
  stageTwo(const void* first, int64_t firstBytes, const void* second, int64_t secondBytes) {
    if (detail::liesWithin(second, secondBytes, first, firstBytes))
      return {stage({{first, firstBytes}}),
              static_cast<const char*>(second) - static_cast<const char*>(first)};
    auto p = stage({{first, firstBytes}});
    int64_t at = static_cast<int64_t>(p->host.size());
    p->host.resize(p->host.size() + static_cast<size_t>(std::max<int64_t>(secondBytes, 0)));
    return {p, at};
  }

  static float* hostFloats(StagedPending& p, int64_t offset) {
    return reinterpret_cast<float*>(p.host.data() + offset);
  }

  static void writeBack(StagedPending& p, int64_t offset, void* device, int64_t bytes) {
    if (bytes > 0 && device) p.back.push_back({device, offset, bytes});
  }

  Comm& inner_;
  Device& device_;
  std::shared_ptr<Orphans> orphans_ = std::make_shared<Orphans>();
  std::unique_ptr<Comm> owned_; // a sub-communicator's inner communicator
};

} // namespace

std::unique_ptr<Comm> makeStagedComm(Comm& inner, Device& device) {
  auto c = std::make_unique<StagedComm>(inner, device);
  c->setTimeout(inner.timeout());
  return c;
}

} // namespace epl::backend
