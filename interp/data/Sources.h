// The data sources behind openDataset, one a file, and the checks they share.
#pragma once
#include "interp/data/Dataset.h"

#include <memory>
#include <string>
#include <vector>

namespace epl::data {

std::unique_ptr<Dataset> openIdx(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                 const std::string& baseDir);
// `tokens(…)` (uint16 little-endian) when isText is false, `text(…)` (bytes) when true.
std::unique_ptr<Dataset> openTokens(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                    const std::string& baseDir, bool isText);
std::unique_ptr<Dataset> openSynthetic(const ir::CallSpec& spec,
                                       const std::vector<InputSpec>& inputs, uint64_t seed);

// Arguments of the data call. The front end has checked kinds and ranges; these re-check
// what a host program calling openDataset directly could get wrong.
std::string stringArg(const ir::CallSpec& spec, const std::string& name); // required
std::string optionalStringArg(const ir::CallSpec& spec, const std::string& name);
int64_t integerArg(const ir::CallSpec& spec, const std::string& name, int64_t fallback,
                   int64_t min); // fallback < 0: required
double numberArg(const ir::CallSpec& spec, const std::string& name, double fallback);

// `images` as the model declares it: "`images: f32[B, 1, 28, 28]`".
std::string inputDecl(const InputSpec& in);
// Elements of one sample of the input (1 for a scalar); DataError on a negative dim.
int64_t sampleElements(const InputSpec& in);
// The model's inputs, named: "`images`, `labels`".
std::string inputNames(const std::vector<InputSpec>& inputs);
// Float inputs must be f32 and integer inputs i32: the layout the sources write.
void checkInputDTypes(const std::string& source, const std::vector<InputSpec>& inputs);
// Caller bugs, not user mistakes: ids past the split's end, or a buffer list that does not
// match the InputSpecs given to openDataset.
void checkRead(const std::vector<int64_t>& ids, int64_t size, const std::vector<void*>& inputs,
               size_t inputCount);

// Dims as "28 x 28".
std::string dimsStr(const std::vector<int64_t>& dims);

} // namespace epl::data
