// Checkpoint files in the safetensors format, which PyTorch, JAX and Hugging Face tools read:
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object, UTF-8, padded with spaces so the data starts at a multiple of 8:
//             {"__metadata__": {"k": "v", …},            (optional, string -> string)
//              "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, …}
//   the rest  the tensors' bytes, little-endian, row-major; offsets are relative to the
//             start of this part, and the tensors cover it exactly, without holes or overlap
//
// (https://github.com/huggingface/safetensors, "Format"). Writing is atomic; reading
// checks every rule above and throws CheckpointError naming the file.
#pragma once
#include "interp/checkpoint/AtomicFile.h"
#include "ir/Types.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace epl::checkpoint {

// The element type of a stored tensor: an IR dtype, or U8 for raw bytes (optimizer and RNG
// state a caller wants to keep as a blob). Converts implicitly from ir::DType, so
// `TensorRecord{"w", ir::DType::F32, {2, 3}, bytes}` reads as it should.
class TensorDType {
public:
  TensorDType(ir::DType t) : ir_(t) {} // NOLINT(google-explicit-constructor): see above
  static TensorDType u8() { return TensorDType(); }
  // The name in the header: "F32", "F16", "BF16", "I32", "I64", "U8".
  const char* name() const;
  static std::optional<TensorDType> parse(const std::string& name);
  int64_t bytes() const;
  bool isU8() const { return !ir_; }
  std::optional<ir::DType> irDType() const { return ir_; }
  bool operator==(const TensorDType& o) const { return ir_ == o.ir_; }
  bool operator!=(const TensorDType& o) const { return !(*this == o); }

private:
  TensorDType() = default;
  std::optional<ir::DType> ir_; // empty: U8
};

struct TensorRecord {
  std::string name;
  TensorDType dtype = ir::DType::F32;
  std::vector<int64_t> shape;       // [] is a scalar
  std::vector<unsigned char> bytes; // elements of shape, row-major, little-endian
  int64_t numElements() const;
};

// Writes `tensors` in the given order, with `metadata` as "__metadata__" when not empty.
// Throws CheckpointError for a record whose bytes do not match its shape and dtype, an
// empty, repeated or reserved ("__metadata__") name, or a failed write; the file already
// at `path`, if any, is then left as it was.
void writeSafetensors(const std::string& path, const std::vector<TensorRecord>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Reads every tensor, in the order of their data, and the metadata when `metadata` is not
// null. Throws CheckpointError naming the file: a header length past the end of the file,
// a header that is not JSON or not a safetensors header, an unknown dtype, offsets that
// overlap, leave holes, run past the data or do not match shape x dtype, duplicate names,
// and trailing bytes after the last tensor.
std::vector<TensorRecord> readSafetensors(const std::string& path,
                                          std::map<std::string, std::string>* metadata = nullptr);

} // namespace epl::checkpoint
