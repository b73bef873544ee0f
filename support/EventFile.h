// TensorBoard's event files, byte for byte: TFRecord framing around `tensorflow.Event`
// protobuf messages. The few fields a scalar needs are encoded by hand; no protobuf library.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace epl {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing:
// crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view data);

// TFRecord's masked form of crc32c(data): rotated right by 15 bits, plus 0xA282EAD8, so a
// CRC stored in the data does not checksum to a constant.
uint32_t maskedCrc32c(std::string_view data);

// One TFRecord: the data's length (uint64, little-endian), the masked CRC of those 8 bytes,
// the data, and the masked CRC of the data.
std::string tfRecord(std::string_view data);

// One value of a chart: TensorBoard's scalar summaries hold 32-bit floats.
struct Scalar {
  std::string tag; // "train/loss": the part before the slash groups the charts
  float value;
};

// Serialized `tensorflow.Event` messages (tensorflow/core/util/event.proto), each framed
// with tfRecord() before it is written.
// An event file's first: {wall_time, file_version = "brain.Event:2"}.
std::string fileVersionEvent(double wallTime);
// {wall_time, step, summary = {value = [{tag, simple_value}, …]}}.
std::string scalarsEvent(double wallTime, int64_t step, const std::vector<Scalar>& scalars);
// {wall_time, step, session_log = {status = START}}: a run (re)starts at `step`, and
// TensorBoard drops the events it read before at this step and later, which a resumed run
// writes again. In files of version 2 this event is how TensorBoard tells a restart: a
// step that goes back is not.
std::string sessionStartEvent(double wallTime, int64_t step);

} // namespace epl
