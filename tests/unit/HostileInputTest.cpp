// Hostile input never crashes the compiler: each case ends in a clear error (or a plan),
// never a crash, hang or stack overflow. The suite also runs under ASan + UBSan.
#include "lib/Epl.h"
#include "support/Utf8.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

namespace {

struct Outcome {
  bool planned = false;
  std::string errors;
};

Outcome planHostile(const std::string& text, int np = 0) {
  epl::Session session;
  epl::PlanOptions options;
  options.np = np;
  options.verifyEach = true;
  Outcome out;
  out.planned = epl::planText("input.epl", text, session, options).has_value();
  for (const auto& d : session.diags.all())
    out.errors += d.message + "\n";
  return out;
}

std::string repeatText(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * n);
  for (int i = 0; i < n; ++i)
    out += s;
  return out;
}

const std::string kHead = "model m(x: f32[B, 4], y: i32[B]) {\n";
const std::string kTail = "  return cross_entropy(linear(x, 3), y)\n}\n";

} // namespace

TEST_CASE("an empty file reports that there is no model") {
  auto r = planHostile("");
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "no `model` in this script\n");
}

TEST_CASE("binary junk is a syntax error, never a crash") {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::string junk(1 + rng() % 4096, '\0');
    for (char& c : junk)
      c = static_cast<char>(rng() & 0xff);
    auto r = planHostile(junk);
    CHECK_FALSE(r.planned);
    CHECK_FALSE(r.errors.empty());
  }
}

TEST_CASE("10000 nested blocks stop at the nesting limit") {
  std::string text = kHead + repeatText("split {\n", 10000) + repeatText("}\n", 10000) + kTail;
  auto r = planHostile(text);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "nesting deeper than 256 levels\n");
}

TEST_CASE("10000 nested parentheses stop at the nesting limit") {
  std::string text =
      "let a = " + repeatText("(", 10000) + "1" + repeatText(")", 10000) + "\n" + kHead + kTail;
  auto r = planHostile(text);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "nesting deeper than 256 levels\n");
}

TEST_CASE("expressions deeper than the limit are an error, never a stack overflow") {
  // `1 + 1 + …` nests one level per operator; 256 levels is the limit.
  CHECK(planHostile("let a = 1" + repeatText(" + 1", 255) + "\n" + kHead + kTail).planned);
  auto sum = planHostile("let a = 1" + repeatText(" + 1", 100000) + "\n" + kHead + kTail);
  CHECK_FALSE(sum.planned);
  CHECK(sum.errors == "expression nested deeper than 256 levels\n");
  CHECK(planHostile("let a = " + repeatText("-", 200) + "1\n" + kHead + kTail).planned);
  auto neg = planHostile("let a = " + repeatText("-", 100000) + "1\n" + kHead + kTail);
  CHECK_FALSE(neg.planned);
  CHECK(neg.errors == "nesting deeper than 256 levels\n");
}

TEST_CASE("an integer past 2^63 is an error") {
  auto r = planHostile("let big = 9223372036854775808\n" + kHead + kTail);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "integer `9223372036854775808` is too large\n");
  auto ok = planHostile("let big = 9223372036854775807\n" + kHead + kTail);
  CHECK(ok.planned);
}

TEST_CASE("integer overflow in arithmetic is an error") {
  auto r = planHostile("let big = 9223372036854775807 * 2\n" + kHead + kTail);
  CHECK_FALSE(r.planned);
  CHECK(r.errors.find("integer overflow") != std::string::npos);
}

TEST_CASE("an unterminated string is an error") {
  auto r = planHostile("import \"std/nn.epl\n" + kHead + kTail);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "unterminated string\n");
}

TEST_CASE("a missing import is an error") {
  auto r = planHostile("import \"no/such/file.epl\"\n" + kHead + kTail);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "cannot find import `no/such/file.epl`\n");
}

TEST_CASE("an import cycle is an error, not a hang") {
  auto dir = std::filesystem::temp_directory_path() / "epl_import_cycle";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a.epl") << "import \"b.epl\"\n";
  std::ofstream(dir / "b.epl") << "import \"a.epl\"\n";
  std::ofstream(dir / "main.epl") << "import \"a.epl\"\n" << kHead << kTail;
  epl::Session session;
  epl::PlanOptions options;
  auto m = epl::planFile((dir / "main.epl").string(), session, options);
  CHECK_FALSE(m.has_value());
  REQUIRE(session.diags.errorCount() == 1);
  CHECK(session.diags.all()[0].message == "import cycle: `a.epl` is already being imported");
  std::filesystem::remove_all(dir);
}

TEST_CASE("a very long line renders a shortened caret line") {
  std::string text = kHead + "  z = q" + repeatText(" ", 50000) + "+ x\n" + kTail;
  epl::Session session;
  epl::PlanOptions options;
  auto m = epl::planText("long.epl", text, session, options);
  CHECK_FALSE(m.has_value());
  REQUIRE(session.diags.errorCount() == 1);
  std::string shown = session.diags.render(session.diags.all()[0]);
  CHECK(shown.find("unknown name `q`") != std::string::npos);
  CHECK(shown.size() < 2000);
}

TEST_CASE("huge repeat counts are bounded") {
  auto r = planHostile(kHead + "  x = repeat(1000000) relu(x)\n" + kTail);
  CHECK_FALSE(r.planned);
  CHECK(r.errors.find("repeat count must be between 1 and 100000") != std::string::npos);
}

TEST_CASE("many stages plan in linear time") {
  std::string text =
      "model m(x: f32[B, 4], y: i32[B]) {\n  repeat(20000) replicate { x = relu(x) }\n" + kTail;
  auto r = planHostile(text, 20000);
  CHECK(r.planned);
}

// The memory plan of a pipeline stage once kept a count per micro-batch for every
// instruction of the step, micro-batches squared: 320 GB for these 100,000.
TEST_CASE("many micro-batches plan in linear time and memory") {
  std::string text = "model m(x: f32[B, 4], y: i32[B]) {\n"
                     "  repeat(2) replicate { x = relu(linear(x, 4)) }\n" +
                     kTail +
                     "policy {\n  micro_batches = 100000\n  schedule = 1f1b\n}\n"
                     "train m {\n  data = synthetic(samples = 200000)\n  batch = 100000\n"
                     "  optimizer = sgd(lr = 0.1)\n  steps = 1\n}\n";
  auto r = planHostile(text, 2);
  CHECK(r.planned);
}

TEST_CASE("invalid UTF-8 is an error with its location, and NUL bytes in comments are fine") {
  auto bad = planHostile("let s = \"\xc3\x28\"\n" + kHead + kTail);
  CHECK_FALSE(bad.planned);
  CHECK(bad.errors == "this file is not valid UTF-8\n");
  std::string text = "# a comment with a NUL: ?\n" + kHead + kTail;
  text[text.find('?')] = '\0';
  CHECK(planHostile(text).planned);
}

TEST_CASE("every kind of malformed UTF-8 is an error at its byte, never a crash") {
  // Each sequence sits in a string on line 2, column 10; the note says what is wrong.
  const std::pair<std::string, std::string> cases[] = {{"\xf4\x90\x80\x80", "past U+10FFFF"},
                                                       {"\xed\xa0\x80", "surrogate"},
                                                       {"\xc0\x80", "overlong"},
                                                       {"\xe0\x80\x80", "overlong"},
                                                       {"\xf0\x80\x80\x80", "overlong"},
                                                       {"\xe2\x82", "stops after 2 of its 3 bytes"},
                                                       {"\x80", "never started"},
                                                       {"\xfe", "never appears in UTF-8"}};
  for (const auto& [bytes, why] : cases) {
    epl::Session session;
    std::string text = "# first line\nlet s = \"" + bytes + "\"\n" + kHead + kTail;
    CHECK_FALSE(epl::planText("utf8.epl", text, session, epl::PlanOptions{}).has_value());
    REQUIRE(session.diags.errorCount() == 1);
    const epl::Diagnostic& d = session.diags.all()[0];
    CHECK(d.message == "this file is not valid UTF-8");
    CHECK(d.loc.line == 2);
    CHECK(d.loc.col == 10);
    REQUIRE_FALSE(d.plainNotes.empty());
    CHECK(d.plainNotes[0].find(why) != std::string::npos);
    // The rendered snippet shows U+FFFD in place of the bytes: valid text for a terminal.
    CHECK_FALSE(epl::findInvalidUtf8(session.diags.render(d)).has_value());
  }
}

TEST_CASE("a sequence cut off at the end of the file is an error") {
  auto r = planHostile(kHead + kTail + "# \xf0\x9f\x98");
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "this file is not valid UTF-8\n");
}

TEST_CASE("number literals out of range are errors, never an abort") {
  for (const char* lit : {"1e309", "1e-400", "4e-320"}) {
    auto r = planHostile(std::string("let v = ") + lit + "\n" + kHead + kTail);
    CHECK_FALSE(r.planned);
    CHECK(r.errors.find(std::string("number `") + lit + "` is too") == 0);
  }
  auto size = planHostile("let v = 25" + std::string(398, '0') + "MB\n" + kHead + kTail);
  CHECK_FALSE(size.planned);
  CHECK(size.errors.find("is too large") != std::string::npos);
}

TEST_CASE("the script is read up to the size limit, whatever it is") {
  epl::Session zero;
  CHECK_FALSE(epl::planFile("/dev/zero", zero, epl::PlanOptions{}).has_value());
  REQUIRE(zero.diags.errorCount() == 1);
  CHECK(zero.diags.all()[0].message == "this file is larger than 1048576 bytes");
  // Its first line, 200 NUL bytes and more, shows as control pictures, cut short.
  std::string shown = zero.diags.render(zero.diags.all()[0]);
  CHECK(shown.find('\0') == std::string::npos);
  CHECK(shown.find("\u2400\u2400\u2400") != std::string::npos);
  CHECK(shown.size() < 1000);
  epl::Session folder;
  CHECK_FALSE(epl::planFile("/usr", folder, epl::PlanOptions{}).has_value());
  REQUIRE(folder.diags.errorCount() == 1);
  CHECK(folder.diags.all()[0].message == "cannot read `/usr`: it is a folder");
  epl::Session mem;
  CHECK_FALSE(epl::planFile("/proc/self/mem", mem, epl::PlanOptions{}).has_value());
  REQUIRE(mem.diags.errorCount() == 1);
  CHECK(mem.diags.all()[0].message == "cannot read `/proc/self/mem`: input/output error");
}

TEST_CASE("an import of a large stream stops at the size limit") {
  auto dir = std::filesystem::temp_directory_path() / "epl_import_limit";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "big.epl") << repeatText("# padding padding padding padding\n", 40000);
  std::ofstream(dir / "main.epl") << "import \"big.epl\"\n" << kHead << kTail;
  epl::Session session;
  CHECK_FALSE(epl::planFile((dir / "main.epl").string(), session, epl::PlanOptions{}).has_value());
  REQUIRE(session.diags.errorCount() == 1);
  CHECK(session.diags.all()[0].message == "this file is larger than 1048576 bytes");
  CHECK(session.diags.sources().text(session.diags.all()[0].loc.file).size() == 1048577);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a file over 1 MiB is refused before parsing") {
  std::string text = kHead + kTail + repeatText("# padding padding padding padding\n", 40000);
  auto r = planHostile(text);
  CHECK_FALSE(r.planned);
  CHECK(r.errors == "this file is larger than 1048576 bytes\n");
}
