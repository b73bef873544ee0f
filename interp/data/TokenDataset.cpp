// `tokens(path, seq, val_fraction)` and `text(path, seq, val_fraction)`: a stream of token
// ids (uint16 little-endian, nanoGPT's .bin; or raw bytes, vocab 256) cut into windows.
//
// Sample i of a split is the window of seq + 1 tokens starting at token i * seq of that
// split's part of the stream: the model input is window[0, seq), `next(tokens)` is
// window[1, seq]. The last `val_fraction` of the tokens (default 0.1) is the validation
// part; windows never cross from the training part into it.
#include "interp/checkpoint/AtomicFile.h"
#include "interp/data/FileBytes.h"
#include "interp/data/Sources.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <algorithm>
#include <sys/stat.h>

namespace epl::data {

namespace {

class TokenDataset final : public Dataset {
public:
  TokenDataset(FileBytes bytes, bool isText, int64_t seq, double valFraction)
      : bytes_(std::move(bytes)), isText_(isText), seq_(seq) {
    tokens_ = static_cast<int64_t>(isText ? bytes_.size() : bytes_.size() / 2);
    valTokens_ = static_cast<int64_t>(static_cast<double>(tokens_) * valFraction);
    trainTokens_ = tokens_ - valTokens_;
    for (int64_t i = 0; i < tokens_; ++i)
      maxToken_ = std::max(maxToken_, tokenAt(i));
  }

  int64_t windows(Split s) const {
    int64_t n = s == Split::Train ? trainTokens_ : valTokens_;
    return n > seq_ ? (n - 1) / seq_ : 0;
  }
  int64_t size(Split s) const override { return windows(s); }
  bool hasNextTokens() const override { return true; }
  int64_t maxToken() const override { return maxToken_; }
  int64_t tokens() const { return tokens_; }

  void read(Split s, const std::vector<int64_t>& ids, const std::vector<void*>& inputs,
            int32_t* next) const override {
    checkRead(ids, size(s), inputs, 1);
    int64_t base = s == Split::Train ? 0 : trainTokens_;
    auto* in = static_cast<int32_t*>(inputs[0]);
    for (size_t i = 0; i < ids.size(); ++i) {
      int64_t start = base + ids[i] * seq_;
      int32_t* row = in + static_cast<int64_t>(i) * seq_;
      for (int64_t t = 0; t < seq_; ++t)
        row[t] = static_cast<int32_t>(tokenAt(start + t));
      if (!next) continue;
      int32_t* targets = next + static_cast<int64_t>(i) * seq_;
      std::copy(row + 1, row + seq_, targets);
      targets[seq_ - 1] = static_cast<int32_t>(tokenAt(start + seq_));
    }
  }

  std::string describe() const override {
    return fmt::format("{}: {} tokens, {} train / {} validation windows of seq {} + 1",
                       isText_ ? "text" : "tokens", withCommas(tokens_),
                       withCommas(windows(Split::Train)), withCommas(windows(Split::Validation)),
                       seq_);
  }

private:
  int64_t tokenAt(int64_t i) const {
    const unsigned char* p = bytes_.data();
    return isText_ ? p[i] : (p[2 * i] | p[2 * i + 1] << 8);
  }

  FileBytes bytes_;
  bool isText_;
  int64_t seq_;
  int64_t tokens_ = 0, trainTokens_ = 0, valTokens_ = 0, maxToken_ = 0;
};

// The one model input: integer tokens of shape [seq].
void checkTokenInput(const std::string& source, const std::vector<InputSpec>& inputs, int64_t seq) {
  if (inputs.size() != 1)
    throw DataError(fmt::format("`{}` data feeds one model input, the token windows; the model "
                                "takes {}",
                                source, inputNames(inputs)));
  const InputSpec& in = inputs[0];
  if (in.dtype != ir::DType::I32 || in.sampleShape != std::vector<int64_t>{seq})
    throw DataError(fmt::format("model input {} does not fit `{}` data with seq = {}; declare it "
                                "`{}: i32[B, {}]`",
                                inputDecl(in), source, seq, in.name, seq));
}

} // namespace

std::unique_ptr<Dataset> openTokens(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                    const std::string& baseDir, bool isText) {
  std::string path = resolvePath(stringArg(spec, "path"), baseDir);
  int64_t seq = integerArg(spec, "seq", -1, 1);
  double valFraction = numberArg(spec, "val_fraction", 0.1);
  if (!(valFraction >= 0 && valFraction < 1))
    throw DataError(fmt::format("argument `val_fraction` of `{}` must be in [0, 1), got {}",
                                spec.kind, valFraction));
  checkTokenInput(spec.kind, inputs, seq);
  FileBytes bytes = FileBytes::open(path);
  if (!isText && bytes.size() % 2 != 0)
    throw DataError(fmt::format("`{}` has an odd number of bytes ({}); a token file holds uint16 "
                                "tokens of 2 bytes each",
                                path, withCommas(static_cast<int64_t>(bytes.size()))));
  auto data = std::make_unique<TokenDataset>(std::move(bytes), isText, seq, valFraction);
  if (data->size(Split::Train) == 0)
    throw DataError(fmt::format(
        "`{}` holds {} tokens, too few for one training window of seq + 1 = {} tokens{}", path,
        withCommas(data->tokens()), seq + 1,
        valFraction > 0 ? fmt::format(" after the last {}% kept for validation", valFraction * 100)
                        : ""));
  return data;
}

int64_t textToTokens(const std::string& textPath, const std::string& tokenPath) {
  FileBytes text = FileBytes::open(textPath);
  if (text.size() == 0)
    throw DataError(fmt::format("`{}` is empty: there is no text to convert", textPath));
  struct stat st {};
  if (stat(tokenPath.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw DataError(
        fmt::format("`{}` is a folder; give the path of the token file to write", tokenPath));
  try {
    checkpoint::AtomicFileWriter out(tokenPath);
    // A chunk at a time, so memory stays small whatever the size of the text.
    std::vector<unsigned char> tokens;
    constexpr size_t chunk = size_t{1} << 20;
    for (size_t at = 0; at < text.size(); at += chunk) {
      size_t n = std::min(chunk, text.size() - at);
      tokens.assign(2 * n, 0); // high bytes stay 0: vocab 256
      for (size_t i = 0; i < n; ++i)
        tokens[2 * i] = text.data()[at + i];
      out.write(tokens.data(), tokens.size());
    }
    out.commit();
  } catch (const checkpoint::CheckpointError& e) {
    throw DataError(e.what());
  }
  return static_cast<int64_t>(text.size());
}

} // namespace epl::data
