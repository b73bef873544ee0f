// The training data of a script (`data = tokens(…)`, `text(…)`, `idx(…)`, `synthetic(…)`):
// a Dataset writes samples into model inputs, and a Sampler gives the seeded sample order.
#pragma once
#include "ir/Config.h"
#include "ir/Types.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace epl::data {

enum class Split { Train, Validation };

// One model input, batch dim dropped: `images: f32[B, 1, 28, 28]` is {"images", F32,
// {1, 28, 28}}. Float inputs must be f32 and integer inputs i32.
struct InputSpec {
  std::string name;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> sampleShape;
  // An integer input: how many values the layers that read it accept (the smallest
  // embedding vocab or cross-entropy class count among them); 0 when none says.
  int64_t accepts = 0;
};

// A user-facing data problem: a missing, truncated or malformed file, or data that does not
// fit the model's inputs. The message names the file and what is wrong, in EPL's style
// (lower case, no trailing period, names in backticks).
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Samples of one data source, numbered 0..size(split) - 1 within each split.
class Dataset {
public:
  virtual ~Dataset();
  virtual int64_t size(Split split) const = 0;
  // Whether `next(tokens)` targets exist: token and text data, and synthetic data whose one
  // integer input is a sequence.
  virtual bool hasNextTokens() const;
  // Writes samples `ids` of `split` one after another into inputs[i], which has room for
  // ids.size() samples of the i-th InputSpec given to openDataset. When hasNextTokens(),
  // `next` (may be null) gets, for each sample, its token window shifted by one token
  // (ids.size() x seq int32 values). Ids must be below size(split). Const and free of
  // state, so threads may read at once.
  virtual void read(Split split, const std::vector<int64_t>& ids, const std::vector<void*>& inputs,
                    int32_t* next) const = 0;
  // One line for the run's header: "idx: 60,000 train / 10,000 validation samples".
  virtual std::string describe() const = 0;
  // The largest token id an integer input can hold, for the check against an embedding's
  // vocab: the file's largest token for token and text data, classes - 1 for synthetic
  // data with an integer input; -1 otherwise.
  virtual int64_t maxToken() const;
  // The largest class label, for the check against a classifier's width: the largest
  // label in either idx label file, classes - 1 for synthetic data with an integer input;
  // -1 when the data has no labels.
  virtual int64_t maxLabel() const;
  // The largest value integer input `input` can hold when the data knows it per input
  // (synthetic data), else -1 (maxToken and maxLabel tell).
  virtual int64_t maxValue(size_t input) const;
};

// Opens the data source `spec` (TrainConfig::data) for a model with `inputs`, checking the
// files and that they fit the inputs. Relative paths resolve against `baseDir`, the
// script's folder. `seed` fixes synthetic data. Throws DataError.
std::unique_ptr<Dataset> openDataset(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                     uint64_t seed, const std::string& baseDir);

// The seeded sample order. Epoch e is a permutation of [0, size) seeded by (seed, e); the
// global sample position p = step * batch + i reads sample perm_e(p % size) of epoch
// e = p / size. Stateless and deterministic: a resumed run sees exactly the same samples,
// and any rank can compute any step's batch in O(batch) time.
class Sampler {
public:
  Sampler(int64_t size, uint64_t seed); // size >= 1
  // Sample ids of the global batch of `step`, in order (batch positions 0..batch - 1).
  std::vector<int64_t> globalBatch(int64_t step, int64_t batch) const;
  // The epoch of the first sample of `step`.
  int64_t epochOf(int64_t step, int64_t batch) const;
  // The sample at global position p.
  int64_t sampleAt(int64_t position) const;

private:
  uint64_t permute(uint64_t index, uint64_t epoch) const;
  int64_t size_;
  uint64_t seed_;
  int halfBits_; // the permutation runs over [0, 2^(2 * halfBits_)) and walks into [0, size)
};

// `epl data`: converts a text file to a token file (one uint16 little-endian token per
// byte, vocab 256), written atomically; returns the tokens written. Throws DataError for an
// empty or unreadable text (a pipe or device is read as FileBytes reads one) and an output
// that cannot be written.
int64_t textToTokens(const std::string& textPath, const std::string& tokenPath);

} // namespace epl::data
