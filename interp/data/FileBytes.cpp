// Reading whole data files: mmap for plain regular files, bounded reads for pipes and
// devices, zlib's inflate (bounded by the caller) for gzip members.
#include "interp/data/FileBytes.h"

#include "interp/data/Dataset.h"
#include "support/Files.h"
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

[[noreturn]] void failOpen(const std::string& path, int err) {
  if (err == ENOENT) throw DataError(fmt::format("`{}` does not exist", path));
  throw DataError(fmt::format("cannot read `{}`: {}", path, errorText(err)));
}

bool startsWithGzipMagic(const unsigned char* p, size_t n) {
  return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

// A file descriptor, closed on every way out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A pipe, a device or a file whose size is unknown (/proc): read until it ends. The buffer
// doubles as bytes come, so memory follows what was read, up to kMaxStreamBytes.
std::vector<unsigned char> readStream(int fd, const std::string& path) {
  constexpr size_t max = FileBytes::kMaxStreamBytes;
  std::vector<unsigned char> out(size_t{1} << 16);
  size_t n = 0;
  for (;;) {
    if (n == out.size()) {
      if (n > max)
        throw DataError(fmt::format(
            "`{}` did not end within {} MiB, the most EPL reads from a pipe, a device or a file "
            "of unknown size; copy the data into a file",
            path, max >> 20));
      out.resize(std::min(out.size() * 2, max + 1));
    }
    ssize_t got = ::read(fd, out.data() + n, out.size() - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) failOpen(path, errno);
    if (got == 0) break;
    n += static_cast<size_t>(got);
  }
  out.resize(n);
  return out;
}

// zlib's inflate state for gzip members, ended on every way out.
class Inflater {
public:
  explicit Inflater(const std::string& path) {
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK)
      throw DataError(fmt::format("cannot inflate `{}`: zlib failed to start", path));
  }
  ~Inflater() { inflateEnd(&zs_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // One inflate call from in[inPos, inEnd) into out[outPos, outEnd), in chunks that fit
  // zlib's 32-bit counters; advances both positions.
  int step(const unsigned char* in, size_t& inPos, size_t inEnd, unsigned char* out, size_t& outPos,
           size_t outEnd) {
    constexpr size_t chunk = size_t{1} << 30;
    zs_.next_in = const_cast<unsigned char*>(in + inPos);
    zs_.avail_in = static_cast<uInt>(std::min(chunk, inEnd - inPos));
    zs_.next_out = out + outPos;
    zs_.avail_out = static_cast<uInt>(std::min(chunk, outEnd - outPos));
    uInt inBefore = zs_.avail_in, outBefore = zs_.avail_out;
    int ret = inflate(&zs_, Z_NO_FLUSH);
    inPos += inBefore - zs_.avail_in;
    outPos += outBefore - zs_.avail_out;
    return ret;
  }
  void reset() { inflateReset(&zs_); }
  const char* message() const { return zs_.msg ? zs_.msg : "invalid data"; }

private:
  z_stream zs_{};
};

struct Inflated {
  std::vector<unsigned char> bytes;
  bool more = false; // the content goes on past the limit
};

// The last member's trailer: its size mod 2^32 (a hint only: it may lie).
size_t trailerSize(const unsigned char* in, size_t n) {
  size_t size = 0;
  if (n >= 18)
    for (int i = 3; i >= 0; --i)
      size = size << 8 | in[n - 4 + i];
  return size;
}

// Inflates every gzip member of in[0, n), at most `limit` bytes of them.
//  1. Start the output at the trailer's size (capped, so a lying trailer costs little), and
//     double it whenever inflate fills it, never past limit + 1 bytes.
//  2. A byte past `limit` means the content goes on: stop there, inflating no more.
//  3. At a member's end, another member may follow (gzip allows concatenation); any other
//     bytes after the last member are an error, and so is input that ends mid-stream.
Inflated inflateGzip(const std::string& path, const unsigned char* in, size_t n, size_t limit) {
  const size_t cap = std::min(limit, SIZE_MAX - 1) + 1;
  std::vector<unsigned char> out(
      std::min(std::max<size_t>(std::min(trailerSize(in, n), n * 16), 1 << 16), cap));
  Inflater z(path);
  size_t inPos = 0, outPos = 0;
  for (;;) {
    if (outPos == out.size()) {
      if (out.size() == cap) {
        out.resize(cap - 1);
        return {std::move(out), true};
      }
      out.resize(std::min(out.size() * 2, cap));
    }
    int ret = z.step(in, inPos, n, out.data(), outPos, out.size());
    if (ret == Z_STREAM_END && startsWithGzipMagic(in + inPos, n - inPos)) {
      z.reset();
    } else if (ret == Z_STREAM_END) {
      if (inPos < n)
        throw DataError(fmt::format("`{}` has {} bytes of trailing data after its gzip stream",
                                    path, withCommas(static_cast<int64_t>(n - inPos))));
      out.resize(outPos);
      return {std::move(out), false};
    } else if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_MEM_ERROR ||
               ret == Z_STREAM_ERROR) {
      throw DataError(fmt::format("`{}` is corrupt: gzip reports `{}`", path, z.message()));
    } else if (inPos == n && outPos < out.size()) { // no input left, room left, no end
      throw DataError(fmt::format("`{}` is truncated: its gzip stream ends after {} compressed "
                                  "bytes without the end marker",
                                  path, withCommas(static_cast<int64_t>(n))));
    }
  }
}

} // namespace

FileBytes FileBytes::open(const std::string& path) {
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) failOpen(path, errno);
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) failOpen(path, errno);
  if (S_ISDIR(st.st_mode)) throw DataError(fmt::format("`{}` is a folder, not a data file", path));
  FileBytes f;
  f.path_ = path;
  if (!S_ISREG(st.st_mode) || st.st_size == 0) {
    f.hold(readStream(fd.fd, path));
    return f;
  }
  auto size = static_cast<size_t>(st.st_size);
  void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (m == MAP_FAILED) failOpen(path, errno);
  f.map_ = m;
  f.mapSize_ = f.size_ = size;
  f.data_ = static_cast<const unsigned char*>(m);
  return f;
}

bool FileBytes::isGzip() const {
  return size_ >= 2 && data_[0] == 0x1f && data_[1] == 0x8b;
}

FileBytes FileBytes::inflated(size_t maxContent) const {
  Inflated content = inflateGzip(path_, data_, size_, maxContent);
  FileBytes f;
  f.path_ = path_;
  f.hold(std::move(content.bytes));
  f.more_ = content.more;
  return f;
}

// Samples are read at random places (one image here, one there): in pages of 4 KiB nearly
// every read misses the TLB, which on a virtual machine walks two page tables. Content of
// several huge pages is moved into memory the system is asked to back with 2 MiB pages
// (which it may decline; the bytes are the same either way), read-only from then on.
void FileBytes::hold(std::vector<unsigned char> bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes.size() >= 2 * kHugePage) {
    size_t size = (bytes.size() + kHugePage - 1) / kHugePage * kHugePage;
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      madvise(m, size, MADV_HUGEPAGE);
      std::memcpy(m, bytes.data(), bytes.size());
      mprotect(m, size, PROT_READ);
      map_ = m;
      mapSize_ = size;
      data_ = static_cast<const unsigned char*>(m);
      size_ = bytes.size();
      return;
    }
  }
  owned_ = std::move(bytes);
  data_ = owned_.data();
  size_ = owned_.size();
}

FileBytes::FileBytes(FileBytes&& o) noexcept {
  *this = std::move(o);
}

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  owned_ = std::move(o.owned_);
  more_ = o.more_;
  map_ = o.map_;
  mapSize_ = o.mapSize_;
  size_ = o.size_;
  data_ = map_ ? o.data_ : owned_.data();
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

size_t physicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && pageSize > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(pageSize) : 0;
}

} // namespace epl::data
