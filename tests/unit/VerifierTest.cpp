// The IR verifier catches broken invariants (so a pass that breaks the IR is caught in
// test builds), and accepts every module the compiler makes.
#include "ir/Verifier.h"
#include "ir/Printer.h"
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <sstream>

namespace {

epl::ir::Module verifiedPlan(const std::string& text, int np = 0) {
  epl::Session session;
  epl::PlanOptions options;
  options.np = np;
  auto m = epl::planText("v.epl", text, session, options);
  REQUIRE(m.has_value());
  return *m;
}

const char* kNet = R"(
model net(x: f32[B, 32], y: i32[B]) {
  replicate {
    split(2) {
      h = linear(relu(linear(x, 64)), 32)
    }
  }
  replicate {
    loss = cross_entropy(linear(h, 10), y)
  }
  return loss
}
train net {
  data = synthetic(samples = 64)
  batch = 8
}
)";

bool mentions(const std::vector<std::string>& problems, const std::string& what) {
  for (const auto& p : problems)
    if (p.find(what) != std::string::npos) return true;
  return false;
}

} // namespace

TEST_CASE("a planned module verifies") {
  auto m = verifiedPlan(kNet, 4);
  CHECK(epl::ir::verify(m).empty());
}

TEST_CASE("the verifier catches a use before definition") {
  auto m = verifiedPlan(kNet, 4);
  std::swap(m.ops[0], m.ops[1]);
  CHECK(mentions(epl::ir::verify(m), "before it is defined"));
}

TEST_CASE("the verifier catches a type that disagrees with the op table") {
  auto m = verifiedPlan(kNet, 4);
  m.tensors[m.ops[0].outputs[0]].type.shape.back() = epl::ir::Dim::constant(65);
  CHECK(mentions(epl::ir::verify(m), "differs from inferred"));
}

TEST_CASE("the verifier catches a mesh that does not cover -np") {
  auto m = verifiedPlan(kNet, 4);
  m.mesh.dataParallel = 3;
  CHECK(mentions(epl::ir::verify(m), "mesh does not cover -np"));
}

TEST_CASE("the verifier catches an op with no stage after planning") {
  auto m = verifiedPlan(kNet, 4);
  m.ops.back().stage = 7;
  CHECK(mentions(epl::ir::verify(m), "no stage after planning"));
}

TEST_CASE("the same script plans to the same bytes") {
  auto text = [](const epl::ir::Module& m) {
    std::ostringstream s;
    epl::ir::printModule(m, s);
    epl::ir::printPlan(m, s);
    return s.str();
  };
  CHECK(text(verifiedPlan(kNet, 8)) == text(verifiedPlan(kNet, 8)));
}
