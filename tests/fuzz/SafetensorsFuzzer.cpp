// The safetensors reader on any bytes as a checkpoint file. A malformed file must be a
// CheckpointError; any other exception escapes and is reported as a finding, as are
// crashes and sanitizer reports.
#include "MemoryFile.h"
#include "interp/checkpoint/Safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static epl::fuzz::MemoryFile file;
  file.write(data, size);
  std::map<std::string, std::string> metadata;
  try {
    epl::checkpoint::readSafetensors(file.path(), &metadata);
  } catch (const epl::checkpoint::CheckpointError&) {
  }
  return 0;
}
