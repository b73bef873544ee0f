// Writing and reading safetensors files, with nlohmann-json for the header.
#include "interp/checkpoint/Safetensors.h"

#include "support/Files.h"
#include "support/Text.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace epl::checkpoint {

using nlohmann::json;

namespace {

constexpr const char* kMetadataKey = "__metadata__";
// The reference implementation refuses headers over 100 MB; so does this reader.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string shapeStr(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string count(uint64_t n) {
  return unsignedWithCommas(n);
}

// Elements of `shape`, or -1 for a negative dim or an overflow.
int64_t elementsOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// The header of `tensors`: JSON, then spaces up to a multiple of 8 bytes (with the 8-byte
// length before it, the data then starts 8-aligned).
std::string headerOf(const std::string& path, const std::vector<TensorRecord>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey || header.contains(t.name))
      throw CheckpointError(fmt::format("cannot write `{}`: tensor name `{}` is {}", path, t.name,
                                        t.name.empty()           ? "empty"
                                        : t.name == kMetadataKey ? "reserved"
                                                                 : "used twice"));
    int64_t n = elementsOf(t.shape);
    if (n < 0 || static_cast<uint64_t>(n) * t.dtype.bytes() != t.bytes.size())
      throw CheckpointError(fmt::format("cannot write `{}`: tensor `{}` of {} {} holds {} bytes",
                                        path, t.name, t.dtype.name(), shapeStr(t.shape),
                                        count(t.bytes.size())));
    uint64_t end = offset + t.bytes.size();
    header[t.name] = {
        {"dtype", t.dtype.name()}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::type_error&) {
    throw CheckpointError(
        fmt::format("cannot write `{}`: a tensor name or metadata string is not UTF-8", path));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

} // namespace

const char* TensorDType::name() const {
  if (!ir_) return "U8";
  switch (*ir_) {
  case ir::DType::F32:
    return "F32";
  case ir::DType::F16:
    return "F16";
  case ir::DType::BF16:
    return "BF16";
  case ir::DType::I32:
    return "I32";
  case ir::DType::I64:
    return "I64";
  }
  return "?";
}

std::optional<TensorDType> TensorDType::parse(const std::string& name) {
  if (name == "U8") return u8();
  for (ir::DType t :
       {ir::DType::F32, ir::DType::F16, ir::DType::BF16, ir::DType::I32, ir::DType::I64})
    if (name == TensorDType(t).name()) return TensorDType(t);
  return std::nullopt;
}

int64_t TensorDType::bytes() const {
  return ir_ ? ir::dtypeBytes(*ir_) : 1;
}

int64_t TensorRecord::numElements() const {
  return elementsOf(shape);
}

void writeSafetensors(const std::string& path, const std::vector<TensorRecord>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string header = headerOf(path, tensors, metadata);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  AtomicFileWriter out(path);
  out.write(length, 8);
  out.write(header.data(), header.size());
  for (const auto& t : tensors)
    out.write(t.bytes.data(), t.bytes.size());
  out.commit();
}

namespace {

// The open file being read, for errors that name it.
class Reader {
public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) throw CheckpointError(fmt::format("`{}` does not exist", path_));
      failErrno();
    }
    struct stat st {};
    if (fstat(fd_, &st) != 0) failErrno();
    if (S_ISDIR(st.st_mode)) fail("it is a folder");
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~Reader() { ::close(fd_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  uint64_t size() const { return size_; }

  void read(void* out, uint64_t bytes, uint64_t at) {
    auto* p = static_cast<char*>(out);
    while (bytes > 0) {
      ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) failErrno();
      if (n == 0) fail("it ended while being read");
      p += n;
      at += static_cast<uint64_t>(n);
      bytes -= static_cast<uint64_t>(n);
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(fmt::format("`{}` is not a valid safetensors file: {}", path_, what));
  }
  [[noreturn]] void failErrno() const {
    throw CheckpointError(fmt::format("cannot read `{}`: {}", path_, errorText(errno)));
  }

private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Parses the header, rejecting a key repeated in any object (nlohmann-json would keep the
// last one silently).
json parseHeader(Reader& in, const std::string& text) {
  if (text.empty() || text[0] != '{') in.fail("the header does not start with `{`");
  std::vector<std::set<std::string>> keys; // one set per object being parsed
  std::string duplicate;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::exception& e) {
    std::string msg = e.what(); // "[json.exception.parse_error.101] parse error at …"
    size_t close = msg.find("] ");
    in.fail("the header is not valid JSON: " +
            (close == std::string::npos ? msg : msg.substr(close + 2)));
  }
  if (!duplicate.empty()) in.fail(fmt::format("the header names `{}` twice", duplicate));
  return header;
}

std::map<std::string, std::string> readMetadata(Reader& in, const json& value) {
  if (!value.is_object()) in.fail("`__metadata__` is not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) in.fail(fmt::format("metadata `{}` is not a string", k));
    out[k] = v.get<std::string>();
  }
  return out;
}

struct Entry {
  TensorRecord record;
  uint64_t begin = 0, end = 0;
};

// One tensor's entry: {"dtype": …, "shape": […], "data_offsets": [begin, end]}, checked
// against itself (offsets against each other come later).
Entry readEntry(Reader& in, const std::string& name, const json& value) {
  auto bad = [&](const std::string& what) { in.fail(fmt::format("tensor `{}` {}", name, what)); };
  if (!value.is_object()) bad("is not an object");
  for (const auto& [k, v] : value.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      bad(fmt::format("has unknown field `{}`", k));
  if (!value.contains("dtype") || !value["dtype"].is_string()) bad("has no `dtype` string");
  if (!value.contains("shape") || !value["shape"].is_array()) bad("has no `shape` list");
  if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
      value["data_offsets"].size() != 2)
    bad("has no `data_offsets` pair");

  std::string dtype = value["dtype"].get<std::string>();
  auto type = TensorDType::parse(dtype);
  if (!type) bad(fmt::format("has dtype `{}`; EPL reads F32, F16, BF16, I32, I64 and U8", dtype));
  Entry e{TensorRecord{name, *type, {}, {}}, 0, 0};
  for (const auto& d : value["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{1} << 62)
      bad("has a shape entry that is not a non-negative integer");
    e.record.shape.push_back(d.get<int64_t>());
  }
  for (const auto& o : value["data_offsets"])
    if (!o.is_number_unsigned()) bad("has `data_offsets` that are not non-negative integers");
  e.begin = value["data_offsets"][0].get<uint64_t>();
  e.end = value["data_offsets"][1].get<uint64_t>();
  int64_t n = elementsOf(e.record.shape);
  uint64_t expected = 0;
  if (n < 0 || __builtin_mul_overflow(static_cast<uint64_t>(n), type->bytes(), &expected))
    bad(fmt::format("has a shape too large to hold: {}", shapeStr(e.record.shape)));
  if (e.end < e.begin || e.end - e.begin != expected)
    bad(fmt::format("has data_offsets [{}, {}], but {} {} takes {} bytes", e.begin, e.end, dtype,
                    shapeStr(e.record.shape), count(expected)));
  return e;
}

// The tensors must cover the data exactly: sorted by offset, each starts where the last
// ended, the first at 0 and the last at the end of the file.
void checkLayout(Reader& in, std::vector<Entry>& entries, uint64_t dataBytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const std::string* last = nullptr;
  for (const auto& e : entries) {
    const std::string& name = e.record.name;
    if (e.end > dataBytes)
      in.fail(fmt::format("tensor `{}` ends at byte {}, past the {} bytes of data", name,
                          count(e.end), count(dataBytes)));
    if (e.begin < at) in.fail(fmt::format("tensors `{}` and `{}` overlap", *last, name));
    if (e.begin > at)
      in.fail(fmt::format("{} bytes before tensor `{}` belong to no tensor", count(e.begin - at),
                          name));
    at = e.end;
    last = &name;
  }
  if (at != dataBytes)
    in.fail(fmt::format("{} bytes of trailing data after the last tensor", count(dataBytes - at)));
}

} // namespace

std::vector<TensorRecord> readSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata) {
  if (metadata) metadata->clear();
  Reader in(path);
  if (in.size() < 8)
    in.fail(fmt::format("it has {} bytes, fewer than the 8 of the header length", in.size()));
  unsigned char length[8];
  in.read(length, 8, 0);
  uint64_t headerBytes = 0;
  for (int i = 7; i >= 0; --i)
    headerBytes = headerBytes << 8 | length[i];
  if (headerBytes > in.size() - 8)
    in.fail(fmt::format("the header length {} runs past the end of the file ({} bytes)",
                        count(headerBytes), count(in.size())));
  if (headerBytes > kMaxHeaderBytes)
    in.fail(fmt::format("the header length {} is over the limit of {}", count(headerBytes),
                        count(kMaxHeaderBytes)));
  std::string text(headerBytes, '\0');
  in.read(text.data(), headerBytes, 8);
  json header = parseHeader(in, text);
  if (!header.is_object()) in.fail("the header is not a JSON object");

  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      auto m = readMetadata(in, value);
      if (metadata) *metadata = std::move(m);
    } else {
      entries.push_back(readEntry(in, name, value));
    }
  }
  uint64_t dataStart = 8 + headerBytes;
  checkLayout(in, entries, in.size() - dataStart);

  std::vector<TensorRecord> out;
  out.reserve(entries.size());
  for (auto& e : entries) {
    e.record.bytes.resize(e.end - e.begin);
    in.read(e.record.bytes.data(), e.end - e.begin, dataStart + e.begin);
    out.push_back(std::move(e.record));
  }
  return out;
}

} // namespace epl::checkpoint
