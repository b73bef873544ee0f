// Reading whole data files: mmap for plain files, zlib's inflate for gzip members.
#include "interp/data/FileBytes.h"

#include "interp/data/Dataset.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

namespace epl::data {

namespace {

std::string lowerFirst(std::string s) {
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

[[noreturn]] void failOpen(const std::string& path, int err) {
  if (err == ENOENT) throw DataError(fmt::format("`{}` does not exist", path));
  throw DataError(fmt::format("cannot read `{}`: {}", path, lowerFirst(std::strerror(err))));
}

bool startsWithGzipMagic(const unsigned char* p, size_t n) {
  return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

// Inflates every gzip member of in[0, n) into a byte vector.
//  1. Start the output at the size the last member's trailer records (a hint only: it is
//     the size mod 2^32 of one member, and may lie), and double it whenever inflate fills it.
//  2. Feed input in chunks that fit zlib's 32-bit counters.
//  3. At a member's end, another member may follow (gzip allows concatenation); any other
//     bytes after the last member are an error, and so is input that ends mid-stream.
std::vector<unsigned char> inflateGzip(const std::string& path, const unsigned char* in, size_t n) {
  std::vector<unsigned char> out;
  size_t hint = 0; // the trailer's ISIZE, little-endian; capped so a lying trailer costs little
  if (n >= 18)
    for (int i = 3; i >= 0; --i)
      hint = hint << 8 | in[n - 4 + i];
  out.resize(std::max<size_t>(std::min(hint, n * 16), 1 << 16));

  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)
    throw DataError(fmt::format("cannot inflate `{}`: zlib failed to start", path));
  size_t inPos = 0, outPos = 0;
  constexpr size_t chunk = 1u << 30;
  for (;;) {
    if (outPos == out.size()) out.resize(out.size() * 2);
    zs.next_in = const_cast<unsigned char*>(in + inPos);
    zs.avail_in = static_cast<uInt>(std::min(chunk, n - inPos));
    zs.next_out = out.data() + outPos;
    zs.avail_out = static_cast<uInt>(std::min(chunk, out.size() - outPos));
    uInt inBefore = zs.avail_in, outBefore = zs.avail_out;
    int ret = inflate(&zs, Z_NO_FLUSH);
    inPos += inBefore - zs.avail_in;
    outPos += outBefore - zs.avail_out;
    if (ret == Z_STREAM_END) {
      if (startsWithGzipMagic(in + inPos, n - inPos)) {
        inflateReset(&zs);
        continue;
      }
      size_t trailing = n - inPos;
      inflateEnd(&zs);
      if (trailing > 0)
        throw DataError(fmt::format("`{}` has {} bytes of trailing data after its gzip stream",
                                    path, withCommas(static_cast<int64_t>(trailing))));
      out.resize(outPos);
      return out;
    }
    if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_MEM_ERROR || ret == Z_STREAM_ERROR) {
      std::string msg = zs.msg ? zs.msg : "invalid data";
      inflateEnd(&zs);
      throw DataError(fmt::format("`{}` is corrupt: gzip reports `{}`", path, msg));
    }
    if (inPos == n && zs.avail_out > 0) { // no input left, room left, and no end of stream
      inflateEnd(&zs);
      throw DataError(fmt::format(
          "`{}` is truncated: its gzip stream ends after {} compressed bytes without the end "
          "marker",
          path, withCommas(static_cast<int64_t>(n))));
    }
  }
}

} // namespace

FileBytes FileBytes::open(const std::string& path, Gzip gzip) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) failOpen(path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    failOpen(path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("`{}` is a folder, not a data file", path));
  }
  FileBytes f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      failOpen(path, err);
    }
    f.map_ = m;
    f.mapSize_ = f.size_;
    f.data_ = static_cast<const unsigned char*>(m);
  }
  ::close(fd);
  if (gzip == Gzip::Detect && startsWithGzipMagic(f.data_, f.size_)) {
    f.inflated_ = inflateGzip(path, f.data_, f.size_);
    munmap(f.map_, f.mapSize_);
    f.map_ = nullptr;
    f.mapSize_ = 0;
    f.gzip_ = true;
    f.data_ = f.inflated_.data();
    f.size_ = f.inflated_.size();
  }
  return f;
}

FileBytes::FileBytes(FileBytes&& o) noexcept {
  *this = std::move(o);
}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  inflated_ = std::move(o.inflated_);
  gzip_ = o.gzip_;
  map_ = o.map_;
  mapSize_ = o.mapSize_;
  size_ = o.size_;
  data_ = gzip_ ? inflated_.data() : o.data_;
  o.map_ = nullptr;
  o.mapSize_ = 0;
  o.data_ = nullptr;
  o.size_ = 0;
  return *this;
}

FileBytes::~FileBytes() {
  release();
}

void FileBytes::release() {
  if (map_) munmap(map_, mapSize_);
  map_ = nullptr;
  mapSize_ = 0;
}

std::string resolvePath(const std::string& path, const std::string& baseDir) {
  if (path.empty() || path[0] == '/' || baseDir.empty()) return path;
  return baseDir.back() == '/' ? baseDir + path : baseDir + "/" + path;
}

} // namespace epl::data
