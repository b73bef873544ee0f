// TensorBoard's event-file bytes: CRC-32C against the published check values (RFC 3720's
// iSCSI vectors), a TFRecord laid out by hand, and events spelled out in protobuf's wire
// format. tests/training/tensorboard.py decodes a run's file with the protobuf library.
#include "support/EventFile.h"

#include <catch2/catch.hpp>
#include <string>

namespace {

std::string bytes(std::initializer_list<unsigned> list) {
  std::string s;
  for (unsigned b : list)
    s += static_cast<char>(b);
  return s;
}

} // namespace

TEST_CASE("crc32c gives the Castagnoli check values") {
  CHECK(epl::crc32c("") == 0u);
  CHECK(epl::crc32c("123456789") == 0xE3069283u);
  CHECK(epl::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(epl::crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i)
    ascending += static_cast<char>(i);
  CHECK(epl::crc32c(ascending) == 0x46DD794Eu);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xA282EAD8, modulo 2^32.
  CHECK(epl::maskedCrc32c("123456789") == 0xC78AB0E5u);
}

TEST_CASE("a TFRecord is length, its masked CRC, the data and the data's masked CRC") {
  std::string want = bytes({3, 0, 0, 0, 0, 0, 0, 0})   // the length, little-endian
                     + bytes({0xB0, 0x99, 0x49, 0x0E}) // 0x0E4999B0: masked CRC of the 8 bytes
                     + "abc" + bytes({0x6E, 0x57, 0xF1, 0x21}); // 0x21F1576E
  CHECK(epl::tfRecord("abc") == want);
  CHECK(epl::tfRecord("").size() == 16);
}

TEST_CASE("events are tensorflow.Event messages in protobuf's wire format") {
  // wall_time: field 1, fixed64 (key 0x09); 1.5 is 0x3FF8000000000000.
  std::string wallTime = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F});
  // file_version: field 3, length-delimited (key 0x1A), 13 bytes.
  CHECK(epl::fileVersionEvent(1.5) == wallTime + bytes({0x1A, 13}) + "brain.Event:2");
  // step: field 2, varint (key 0x10); 300 is 0xAC 0x02. summary: field 5 (key 0x2A) holds
  // Summary.value (field 1, key 0x0A) = Value{tag (0x0A) "a", simple_value (0x15) 1.0f}.
  std::string value = bytes({0x0A, 1}) + "a" + bytes({0x15, 0, 0, 0x80, 0x3F});
  std::string summary = bytes({0x0A, 8}) + value + bytes({0x0A, 8}) + value;
  CHECK(epl::scalarsEvent(1.5, 300, {{"a", 1.0f}, {"a", 1.0f}}) ==
        wallTime + bytes({0x10, 0xAC, 0x02, 0x2A, 20}) + summary);
  // session_log: field 7 (key 0x3A) = SessionLog{status (field 1, varint) = START (1)}.
  CHECK(epl::sessionStartEvent(1.5, 4) == wallTime + bytes({0x10, 4, 0x3A, 2, 0x08, 0x01}));
}
