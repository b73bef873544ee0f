// Compilations that share a frontend::ParseCache (the layout search's plans): a file with
// the same id and text reuses the tree parsed before, and the plan is the same as without
// the cache; changed text parses again, and a syntax error is reported every time.
#include "frontend/Parser.h"
#include "ir/Printer.h"
#include "lib/Epl.h"

#include <catch2/catch.hpp>
#include <sstream>

namespace {

const char* kBlocks = R"(import "std/nn.epl"
model lm(tokens: i32[B, 16]) {
  x = embedding(tokens, 32, 16)
  x = repeat(2) transformer_block(x, 2)
  return cross_entropy(linear(layer_norm(x), 32), next(tokens))
}
train lm {
  data = synthetic(samples = 8)
  batch = 8
}
)";

struct Compiled {
  std::string plan; // the module as printed, empty when it did not plan
  std::vector<std::shared_ptr<const epl::ast::File>> syntax;
  std::vector<std::string> errors;
};

Compiled compile(const std::string& text, epl::frontend::ParseCache* cache,
                 std::vector<std::string> overrides = {}) {
  epl::PlanOptions options;
  options.np = 2;
  options.parseCache = cache;
  options.overrides = std::move(overrides);
  Compiled out;
  options.syntax = &out.syntax;
  epl::Session session;
  if (auto m = epl::planText("cached.epl", text, session, options)) {
    std::ostringstream printed;
    epl::ir::printModule(*m, printed);
    out.plan = printed.str();
  }
  for (const auto& d : session.diags.all())
    out.errors.push_back(d.message);
  return out;
}

} // namespace

TEST_CASE("plans that share a parse cache parse each file once and plan as without it") {
  epl::frontend::ParseCache cache;
  Compiled alone = compile(kBlocks, nullptr, {"policy.zero=1"});
  Compiled first = compile(kBlocks, &cache, {"policy.zero=1"});
  Compiled again = compile(kBlocks, &cache, {"policy.zero=1"});
  REQUIRE(alone.errors.empty());
  REQUIRE_FALSE(alone.plan.empty());
  CHECK(first.plan == alone.plan);
  CHECK(again.plan == alone.plan);
  // std/nn.epl and the script: the same trees the second time, not trees parsed again.
  REQUIRE(first.syntax.size() == 2);
  REQUIRE(again.syntax.size() == 2);
  CHECK(again.syntax[0] == first.syntax[0]);
  CHECK(again.syntax[1] == first.syntax[1]);

  // Another script: its own tree, the import's kept one; the plan is its own.
  std::string wider = kBlocks;
  wider.replace(wider.find("repeat(2)"), 9, "repeat(3)");
  Compiled other = compile(wider, &cache);
  REQUIRE(other.errors.empty());
  CHECK(other.syntax[0] == first.syntax[0]);
  CHECK(other.syntax[1] != first.syntax[1]);
  CHECK(other.plan == compile(wider, nullptr).plan);
  CHECK(other.plan != alone.plan);
}

TEST_CASE("a parse cache keeps no tree of a file with a syntax error") {
  epl::frontend::ParseCache cache;
  std::string broken = kBlocks;
  broken.replace(broken.find("return cross_entropy("), 21, "return cross_entropy((");
  for (int attempt = 0; attempt < 2; ++attempt) {
    Compiled c = compile(broken, &cache);
    CHECK(c.plan.empty());
    REQUIRE_FALSE(c.errors.empty());
    CHECK_THAT(c.errors[0], Catch::Contains("expected `)`"));
  }
  // A setting with a bad value fails each time too (the --set text parses through it).
  for (int attempt = 0; attempt < 2; ++attempt) {
    Compiled c = compile(kBlocks, &cache, {"policy.zero=("});
    CHECK(c.plan.empty());
    CHECK_FALSE(c.errors.empty());
  }
}
