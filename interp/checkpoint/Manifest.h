// `manifest.json`, the index of a checkpoint folder: which run wrote it (model, optimizer,
// seed), after which step, and the CRC-32 of every tensor of `model.safetensors`, so that
// a load tells a damaged or mixed-up checkpoint from a good one. Format version 1 (before
// the checksums) has no `crc32`; it still reads, and its tensors go unverified. Version 3
// adds `steps`, the writing run's total (what its learning-rate schedule spans).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace epl::checkpoint {

constexpr int kManifestVersion = 3;

struct Manifest {
  int version = kManifestVersion;
  std::string model;
  std::string optimizer; // the `optimizer` setting's kind: sgd, adam, adamw
  int64_t step = 0;      // optimizer steps done
  int64_t steps = 0;     // the writing run's `steps`; 0 in versions 1 and 2 (unknown)
  uint64_t seed = 0;
  std::map<std::string, uint32_t> crc32; // tensor name -> CRC-32 of its bytes; empty in v1
};

// The manifest as JSON text.
std::string manifestText(const Manifest& m);

// Reads `path` and checks it on its own terms: a JSON object with `format`
// "epl-checkpoint", a version this EPL reads, every field of that version with its type and
// no other, a step that is not negative, and `rng` and `data` records that agree with
// `step` and `seed`. Throws CheckpointError naming the file and the field.
Manifest readManifest(const std::string& path);

// CRC-32 of `bytes` (zlib's: the one of gzip and PNG).
uint32_t crc32Of(const std::vector<unsigned char>& bytes);

} // namespace epl::checkpoint
