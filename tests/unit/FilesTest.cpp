// File reads that stop at a limit (/dev/zero has no end) and say why they failed.
#include "support/Files.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

TEST_CASE("file reads stop at the limit and explain failures") {
  auto zero = epl::readFilePrefix("/dev/zero", 1025);
  CHECK(zero.error.empty());
  CHECK(zero.text.size() == 1025);
  CHECK(epl::readFilePrefix("/usr", 10).error == "it is a folder");
  CHECK(epl::readFilePrefix("/no/such/file.epl", 10).error == "no such file or directory");
  auto mem = epl::readFilePrefix("/proc/self/mem", 10);
  CHECK(mem.error == "input/output error");
  CHECK(mem.text.empty());
  auto path = std::filesystem::temp_directory_path() / "epl_read_prefix.epl";
  std::ofstream(path) << "let a = 1\n";
  CHECK(epl::readFilePrefix(path.string(), 100).text == "let a = 1\n");
  CHECK(epl::readFilePrefix(path.string(), 3).text == "let");
  std::filesystem::remove(path);
  CHECK(epl::fileKind("/usr") == epl::FileKind::Folder);
  CHECK(epl::fileKind("/dev/zero") == epl::FileKind::Other);
  CHECK(epl::fileKind("/no/such/file.epl") == epl::FileKind::Missing);
}
