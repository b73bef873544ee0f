// A checkpoint's manifest.json on any bytes, through the reader `epl run --resume` uses
// (checkpoint::readManifest). A malformed manifest must be a CheckpointError; any other
// exception escapes and is a finding, as are crashes and sanitizer reports.
#include "MemoryFile.h"
#include "interp/checkpoint/AtomicFile.h"
#include "interp/checkpoint/Manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static epl::fuzz::MemoryFile file;
  file.write(data, size);
  try {
    epl::checkpoint::readManifest(file.path());
  } catch (const epl::checkpoint::CheckpointError&) {
  }
  return 0;
}
