// The bytes of a whole data file: mapped read-only when plain, inflated into memory when
// gzip-compressed (detected by its magic bytes, not its name).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace epl::data {

class FileBytes {
public:
  enum class Gzip { Detect, Never };
  // Throws DataError naming the file: missing, unreadable, a folder, or a truncated or
  // corrupt gzip stream.
  static FileBytes open(const std::string& path, Gzip gzip);

  FileBytes() = default;
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  bool wasGzip() const { return gzip_; }
  const std::string& path() const { return path_; }

private:
  void release();
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr; // the mapping of a plain file, or null
  size_t mapSize_ = 0;
  std::vector<unsigned char> inflated_; // the content of a gzip file
  bool gzip_ = false;
};

// `path` as given when absolute (or when baseDir is empty), else joined to baseDir.
std::string resolvePath(const std::string& path, const std::string& baseDir);

} // namespace epl::data
