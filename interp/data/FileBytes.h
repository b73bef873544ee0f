// The bytes of a whole data file: mapped read-only when it is a plain regular file, read into
// memory when it is a pipe or a device, and inflated into memory when gzip-compressed
// (detected by its magic bytes, not its name). What is held in memory is always bounded.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace epl::data {

class FileBytes {
public:
  // A pipe, a device or a file whose size the system does not know (/proc) is read until it
  // ends; one that goes on past this is an error (/dev/zero, `yes`).
  static constexpr size_t kMaxStreamBytes = size_t{256} << 20;

  // The bytes of `path`, as they are. Throws DataError naming the file: missing,
  // unreadable, a folder, or a stream past kMaxStreamBytes.
  static FileBytes open(const std::string& path);

  // Whether the bytes are gzip (told by the magic bytes, not the file's name).
  bool isGzip() const;
  // The content of these gzip bytes, inflated no further than `maxContent` bytes: more()
  // then says whether it goes on. Throws DataError for a truncated or corrupt gzip stream
  // (one cut at `maxContent` is not checked past it).
  FileBytes inflated(size_t maxContent) const;

  FileBytes() = default;
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether the inflated content went on past `maxContent` (size() is then that).
  bool more() const { return more_; }
  const std::string& path() const { return path_; }

private:
  void release();
  void hold(std::vector<unsigned char> bytes);
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr; // the mapping of a plain regular file, or null
  size_t mapSize_ = 0;
  std::vector<unsigned char> owned_; // the content read from a stream, or inflated
  bool more_ = false;
};

// `path` as given when absolute (or when baseDir is empty), else joined to baseDir.
std::string resolvePath(const std::string& path, const std::string& baseDir);

// The machine's physical memory in bytes (0 when the system does not say).
size_t physicalMemory();

} // namespace epl::data
