// Strict UTF-8 validation, the first check every source text passes.
#include "support/Utf8.h"

#include <catch2/catch.hpp>

using epl::findInvalidUtf8;

namespace {

// The reason given for the first malformed byte of `text`, or "" when it is valid.
std::string reason(const std::string& text) {
  auto e = findInvalidUtf8(text);
  return e ? e->reason : "";
}

} // namespace

TEST_CASE("well-formed UTF-8 passes, up to U+10FFFF") {
  CHECK_FALSE(findInvalidUtf8("").has_value());
  CHECK_FALSE(findInvalidUtf8(std::string_view("a NUL \0 inside", 15)).has_value());
  CHECK_FALSE(findInvalidUtf8("\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e").has_value()); // é € 𝄞
  CHECK_FALSE(findInvalidUtf8("\xed\x9f\xbf \xee\x80\x80").has_value()); // U+D7FF, U+E000
  CHECK_FALSE(findInvalidUtf8("\xf4\x8f\xbf\xbf").has_value());          // U+10FFFF
}

TEST_CASE("each kind of malformed UTF-8 is found with its reason") {
  CHECK(reason("\xf4\x90\x80\x80") == "the bytes `F4 90 80 80` encode a code point past U+10FFFF");
  CHECK(reason("\xed\xa0\x80") ==
        "the bytes `ED A0 80` encode a UTF-16 surrogate, which UTF-8 does not allow");
  CHECK(reason("\xed\xbf\xbf") ==
        "the bytes `ED BF BF` encode a UTF-16 surrogate, which UTF-8 does not allow");
  CHECK(reason("\xc0\x80") == "the bytes `C0 80` are an overlong encoding");
  CHECK(reason("\xc1\xbf") == "the bytes `C1 BF` are an overlong encoding");
  CHECK(reason("\xe0\x80\x80") == "the bytes `E0 80 80` are an overlong encoding");
  CHECK(reason("\xf0\x8f\xbf\xbf") == "the bytes `F0 8F BF BF` are an overlong encoding");
  CHECK(reason("\xe2\x82") == "the sequence `E2 82` stops after 2 of its 3 bytes");
  CHECK(reason("\xe2\x82x") == "the sequence `E2 82` stops after 2 of its 3 bytes");
  CHECK(reason("\xf0\x9d\x84") == "the sequence `F0 9D 84` stops after 3 of its 4 bytes");
  CHECK(reason("\xc3") == "the sequence `C3` stops after 1 of its 2 bytes");
  CHECK(reason("\x80") == "byte 0x80 continues a sequence that was never started");
  CHECK(reason("\xc3\xa9\xa9") == "byte 0xA9 continues a sequence that was never started");
  CHECK(reason("\xf5\x80\x80\x80") == "byte 0xF5 never appears in UTF-8");
  CHECK(reason("\xff") == "byte 0xFF never appears in UTF-8");
}

TEST_CASE("the first malformed byte is located by line and code-point column") {
  auto e = findInvalidUtf8("line one\n\xc3\xa9t\xc3\xa9 \xed\xa0\x80 after");
  REQUIRE(e.has_value());
  CHECK(e->offset == 15);
  CHECK(e->line == 2);
  CHECK(e->col == 5); // é, t, é and a space are four columns
}

TEST_CASE("malformed bytes are replaced by U+FFFD for display, one per byte") {
  CHECK(epl::replaceInvalidUtf8("a\xff"
                                "b") == "a\xef\xbf\xbd"
                                        "b");
  CHECK(epl::replaceInvalidUtf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(epl::replaceInvalidUtf8("\xc3\xa9") == "\xc3\xa9");
}
