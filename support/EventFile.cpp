// TFRecord framing and the protobuf wire format of the few `tensorflow.Event` fields that
// scalars need.
#include "support/EventFile.h"

#include <array>
#include <cstring>

namespace epl {

namespace {

// The CRC-32C of each byte value: one table lookup per byte instead of eight shifts.
constexpr std::array<uint32_t, 256> crcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = crcTable();

void putLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

// The protobuf wire format: each field is a key (its number and wire type) then its value.
enum class WireType : uint32_t { Varint = 0, Fixed64 = 1, LengthDelimited = 2, Fixed32 = 5 };

void putVarint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7)
    out += static_cast<char>((v & 0x7F) | 0x80);
  out += static_cast<char>(v);
}

void putKey(std::string& out, uint32_t field, WireType type) {
  putVarint(out, (field << 3) | static_cast<uint32_t>(type));
}

void putDouble(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, WireType::Fixed64);
  putLittleEndian(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  putKey(out, field, WireType::Fixed32);
  putLittleEndian(out, bits, 4);
}

// int64 fields are varints of the two's complement: a negative takes ten bytes.
void putInt64(std::string& out, uint32_t field, int64_t v) {
  putKey(out, field, WireType::Varint);
  putVarint(out, static_cast<uint64_t>(v));
}

// A string, bytes or an embedded message.
void putBytes(std::string& out, uint32_t field, std::string_view bytes) {
  putKey(out, field, WireType::LengthDelimited);
  putVarint(out, bytes.size());
  out.append(bytes);
}

// tensorflow.Event's field numbers, and those of the messages inside it.
namespace event {
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
}
namespace summary {
constexpr uint32_t kValue = 1;                 // Summary.value (repeated)
constexpr uint32_t kTag = 1, kSimpleValue = 2; // Summary.Value
} // namespace summary
namespace session_log {
constexpr uint32_t kStatus = 1;
constexpr uint64_t kStart = 1; // SessionLog.SessionStatus.START
} // namespace session_log

std::string eventHeader(double wallTime, int64_t step) {
  std::string out;
  putDouble(out, event::kWallTime, wallTime);
  putInt64(out, event::kStep, step);
  return out;
}

} // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data)
    crc = kCrcTable[(crc ^ byte) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t maskedCrc32c(std::string_view data) {
  uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfRecord(std::string_view data) {
  std::string length;
  putLittleEndian(length, data.size(), 8);
  std::string out = length;
  putLittleEndian(out, maskedCrc32c(length), 4);
  out.append(data);
  putLittleEndian(out, maskedCrc32c(data), 4);
  return out;
}

std::string fileVersionEvent(double wallTime) {
  std::string out;
  putDouble(out, event::kWallTime, wallTime);
  putBytes(out, event::kFileVersion, "brain.Event:2");
  return out;
}

std::string scalarsEvent(double wallTime, int64_t step, const std::vector<Scalar>& scalars) {
  std::string summary;
  for (const Scalar& s : scalars) {
    std::string value;
    putBytes(value, summary::kTag, s.tag);
    putFloat(value, summary::kSimpleValue, s.value);
    putBytes(summary, summary::kValue, value);
  }
  std::string out = eventHeader(wallTime, step);
  putBytes(out, event::kSummary, summary);
  return out;
}

std::string sessionStartEvent(double wallTime, int64_t step) {
  std::string log;
  putKey(log, session_log::kStatus, WireType::Varint);
  putVarint(log, session_log::kStart);
  std::string out = eventHeader(wallTime, step);
  putBytes(out, event::kSessionLog, log);
  return out;
}

} // namespace epl
