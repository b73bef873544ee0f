// A plan too big for the machine is a located error before anything is allocated, and an
// allocation that fails anyway says the same thing instead of crashing.
#include "interp/MemoryFit.h"
#include "backend/Device.h"
#include "backend/comm/Comm.h"
#include "interp/Executor.h"
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

namespace {

// One linear layer of width x width, f32, trained with Adam: params, grads and two
// optimizer states of width^2 floats each.
std::optional<epl::ir::Module> planLinear(epl::Session& session, int64_t width, int np = 1) {
  std::string text = fmt::format(R"(
model net(x: f32[B, {0}]) {{
  return mse(linear(x, {0}, bias = false), x)
}}
train net {{
  data = synthetic(samples = 64)
  batch = 8
  optimizer = adam(lr = 1e-3)
}}
)",
                                 width);
  epl::PlanOptions options;
  options.np = np;
  auto m = epl::planText("big.epl", text, session, options);
  REQUIRE(m.has_value());
  return m;
}

std::string rendered(const epl::Diagnostics& diags) {
  REQUIRE(diags.all().size() == 1);
  return diags.render(diags.all()[0]);
}

// A device with no memory at all: every allocation fails, as it would on a full machine.
class FullDevice : public epl::backend::Device {
public:
  explicit FullDevice(std::unique_ptr<epl::backend::Device> d) : d_(std::move(d)) {}
  std::string name() const override { return "full"; }
  bool hostAddressable() const override { return true; }
  void* allocate(int64_t bytes) override {
    if (++allocations_ > 1) throw std::bad_alloc();
    return d_->allocate(bytes); // the first succeeds: the others must release it
  }
  void release(void* p) override {
    ++releases_;
    d_->release(p);
  }
  void copyToDevice(void* d, const void* s, int64_t n, epl::backend::StreamId i) override {
    d_->copyToDevice(d, s, n, i);
  }
  void copyToHost(void* d, const void* s, int64_t n, epl::backend::StreamId i) override {
    d_->copyToHost(d, s, n, i);
  }
  void copyOnDevice(void* d, const void* s, int64_t n, epl::backend::StreamId i) override {
    d_->copyOnDevice(d, s, n, i);
  }
  void fillZero(void* d, int64_t n, epl::backend::StreamId i) override { d_->fillZero(d, n, i); }
  void launch(const epl::backend::KernelCall& c, epl::backend::StreamId i) override {
    d_->launch(c, i);
  }
  void optimizerStep(const epl::backend::OptimizerCall& c, epl::backend::StreamId i) override {
    d_->optimizerStep(c, i);
  }
  void sumSquares(const epl::backend::TensorView& x, float* r, bool a,
                  epl::backend::StreamId i) override {
    d_->sumSquares(x, r, a, i);
  }
  void scale(const epl::backend::TensorView& x, float f, epl::backend::StreamId i) override {
    d_->scale(x, f, i);
  }
  epl::backend::EventId record(epl::backend::StreamId s) override { return d_->record(s); }
  void wait(epl::backend::StreamId s, epl::backend::EventId e) override { d_->wait(s, e); }
  void synchronize() override { d_->synchronize(); }

  int allocations_ = 0, releases_ = 0;

private:
  std::unique_ptr<epl::backend::Device> d_;
};

} // namespace

TEST_CASE("a plan that does not fit the machine is an error at `batch`") {
  epl::Session session;
  auto m = planLinear(session, 1000); // 4 MB of each model state, 32 KB of activations
  epl::Diagnostics diags(session.sources);
  CHECK(epl::interp::checkMemoryFits(*m, 1, int64_t{1} << 30, diags));
  CHECK_FALSE(epl::interp::checkMemoryFits(*m, 1, 10'000'000, diags));
  CHECK(rendered(diags) ==
        "error: the plan needs 16.1 MB of memory, and this machine has 10.0 MB available\n"
        "  --> big.epl:7:3\n"
        "  |\n"
        "7 |   batch = 8\n"
        "  |   ^^^^^\n"
        "  = note: per rank: activations 96.1 KB + params 4.00 MB + grads 4.00 MB + optimizer "
        "8.00 MB + the step's inputs 32.0 KB\n"
        "  = help: the parameters, gradients and optimizer states alone take 16.0 MB per rank: "
        "make the model smaller\n");
}

TEST_CASE("ranks that share a machine are counted together") {
  epl::Session session;
  auto m = planLinear(session, 1000, 2);
  epl::Diagnostics diags(session.sources);
  // Per rank: 16.1 MB, and 4.19 MB of the ring all-reduce's scratch (4 segments of 1 MiB).
  CHECK(epl::interp::checkMemoryFits(*m, 1, 25'000'000, diags));
  CHECK_FALSE(epl::interp::checkMemoryFits(*m, 2, 25'000'000, diags));
  CHECK_THAT(rendered(diags), Catch::StartsWith("error: the plan's 2 ranks on this machine need "
                                                "40.5 MB of memory, and this machine has 25.0 "
                                                "MB available\n"));
}

TEST_CASE("activations that do not fit point at the batch and micro-batches") {
  epl::Session session;
  auto m = planLinear(session, 1000);
  epl::Diagnostics diags(session.sources);
  CHECK_FALSE(epl::interp::checkMemoryFits(*m, 1, 16'050'000, diags));
  CHECK_THAT(rendered(diags), Catch::Contains("= help: lower `batch`, raise `micro_batches`, or "
                                              "spread the ranks over more machines"));
}

TEST_CASE("the available memory is known on Linux") {
  auto available = epl::interp::availableMemory();
  REQUIRE(available.has_value());
  CHECK(*available > 0);
}

TEST_CASE("an allocation that fails releases what the executor held and says why") {
  epl::Session session;
  auto m = planLinear(session, 100);
  FullDevice device(epl::backend::makeCpuDevice(1));
  auto comm = epl::backend::makeSelfComm();
  CHECK_THROWS_WITH(epl::interp::Executor(*m, device, *comm, {}),
                    "out of memory allocating the plan's 173 KB");
  CHECK(device.releases_ == 1);
  epl::Diagnostics diags(session.sources);
  epl::interp::reportOutOfMemory(*m, 1, diags);
  std::string text = rendered(diags);
  CHECK_THAT(text, Catch::StartsWith("error: the plan needs "));
  CHECK_THAT(text, Catch::Contains("= note: allocating it failed\n"));
}
