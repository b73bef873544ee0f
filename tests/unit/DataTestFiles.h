// Small files for the data and checkpoint tests: a temporary folder, raw and gzip writers,
// and IDX encoders.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <zlib.h>

namespace epl::testing {

// A fresh folder under /tmp, removed with everything in it at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "epl-test-XXXXXX").string();
    path = mkdtemp(templ.data()) ? templ : "";
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string gzipped(const std::string& bytes) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, bytes.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void putBigEndian32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    s += static_cast<char>((v >> shift) & 0xff);
}

// An IDX file of unsigned bytes: magic 0x0000 08 <dims.size()>, the dims, the values.
inline std::string idxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values,
                            unsigned char type = 0x08) {
  std::string s{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    putBigEndian32(s, d);
  s.append(values.begin(), values.end());
  return s;
}

} // namespace epl::testing
