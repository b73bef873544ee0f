// `tokens(path, seq, val_fraction)` and `text(path, seq, val_fraction)`: a stream of token
// ids (uint16 little-endian, nanoGPT's .bin; or raw bytes, vocab 256) cut into windows.
//
// Sample i of a split is the window of seq + 1 tokens starting at token i * seq of that
// split's part of the stream: the model input is window[0, seq), `next(tokens)` is
// window[1, seq]. The last `val_fraction` of the tokens (default 0.1) is the validation
// part; windows never cross from the training part into it.
//
// With `separator = s`, documents instead: each run of tokens ending with an s (the part's
// last run may lack it) is cut into windows of at most seq + 1 tokens starting at its
// tokens 0, seq, 2 seq…, so no window holds two documents; a short window is padded to
// seq + 1 with `pad` (default 0). A second model input, when the model has one, gets each
// input position's padding mask: 1 for a document's token, 0 for padding.
#include "interp/checkpoint/AtomicFile.h"
#include "interp/data/FileBytes.h"
#include "interp/data/Sources.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <algorithm>
#include <sys/stat.h>

namespace epl::data {

namespace {

// How a token file is cut into samples: fixed windows of the stream, or (separator >= 0)
// windows of each document, padded.
struct Cut {
  int64_t seq = 0;
  int64_t separator = -1, pad = 0;
  bool masks = false; // a second model input gets the padding masks
};

class TokenDataset final : public Dataset {
public:
  TokenDataset(FileBytes bytes, bool isText, Cut cut, double valFraction)
      : bytes_(std::move(bytes)), isText_(isText), seq_(cut.seq), cut_(cut) {
    tokens_ = static_cast<int64_t>(isText ? bytes_.size() : bytes_.size() / 2);
    valTokens_ = static_cast<int64_t>(static_cast<double>(tokens_) * valFraction);
    trainTokens_ = tokens_ - valTokens_;
    for (int64_t i = 0; i < tokens_; ++i)
      maxToken_ = std::max(maxToken_, tokenAt(i));
    if (cut_.separator < 0) return;
    maxToken_ = std::max(maxToken_, cut_.pad);
    cutDocuments(0, trainTokens_, windows_[0]);
    cutDocuments(trainTokens_, tokens_, windows_[1]);
  }

  int64_t windows(Split s) const {
    if (cut_.separator >= 0)
      return static_cast<int64_t>(windows_[s == Split::Train ? 0 : 1].size());
    int64_t n = s == Split::Train ? trainTokens_ : valTokens_;
    return n > seq_ ? (n - 1) / seq_ : 0;
  }
  int64_t size(Split s) const override { return windows(s); }
  bool hasNextTokens() const override { return true; }
  int64_t maxToken() const override { return maxToken_; }
  int64_t maxValue(size_t input) const override { return input == 1 ? 1 : maxToken_; }
  int64_t tokens() const { return tokens_; }

  void read(Split s, const std::vector<int64_t>& ids, const std::vector<void*>& inputs,
            int32_t* next) const override {
    checkRead(ids, size(s), inputs, cut_.masks ? 2 : 1);
    int64_t base = s == Split::Train ? 0 : trainTokens_;
    auto* in = static_cast<int32_t*>(inputs[0]);
    auto* mask = cut_.masks ? static_cast<int32_t*>(inputs[1]) : nullptr;
    for (size_t i = 0; i < ids.size(); ++i) {
      // The window's first token and its real tokens; the rest of seq + 1 is padding.
      Window w{base + ids[i] * seq_, seq_ + 1};
      if (cut_.separator >= 0) w = windows_[s == Split::Train ? 0 : 1][ids[i]];
      auto at = [&](int64_t t) {
        return static_cast<int32_t>(t < w.length ? tokenAt(w.start + t) : cut_.pad);
      };
      int64_t row = static_cast<int64_t>(i) * seq_;
      for (int64_t t = 0; t < seq_; ++t) {
        in[row + t] = at(t);
        if (mask) mask[row + t] = t < w.length ? 1 : 0;
        if (next) next[row + t] = at(t + 1);
      }
    }
  }

  std::string describe() const override {
    std::string kind = isText_ ? "text" : "tokens";
    if (cut_.separator < 0)
      return fmt::format("{}: {} tokens, {} train / {} validation windows of seq {} + 1", kind,
                         withCommas(tokens_), withCommas(windows(Split::Train)),
                         withCommas(windows(Split::Validation)), seq_);
    return fmt::format("{}: {} tokens in {} documents ending with token {}, {} train / {} "
                       "validation windows of at most seq {} + 1, padded with token {}{}",
                       kind, withCommas(tokens_), withCommas(documents_), cut_.separator,
                       withCommas(windows(Split::Train)), withCommas(windows(Split::Validation)),
                       seq_, cut_.pad, cut_.masks ? " (masks: the second input)" : "");
  }

private:
  struct Window {
    int64_t start = 0, length = 0; // tokens of the file; length <= seq + 1
  };

  int64_t tokenAt(int64_t i) const {
    const unsigned char* p = bytes_.data();
    return isText_ ? p[i] : (p[2 * i] | p[2 * i + 1] << 8);
  }

  // The windows of the documents in tokens [begin, end): a document of n tokens (its
  // separator included) gives windows at its tokens 0, seq, 2 seq… while at least two
  // tokens (an input and its target) are left; a lone separator gives none.
  void cutDocuments(int64_t begin, int64_t end, std::vector<Window>& out) {
    for (int64_t first = begin, i = begin; i < end; ++i) {
      if (tokenAt(i) != cut_.separator && i + 1 < end) continue;
      int64_t stop = i + 1;
      documents_ += stop - first >= 2;
      for (int64_t w = first; stop - w >= 2; w += seq_)
        out.push_back({w, std::min(seq_ + 1, stop - w)});
      first = stop;
    }
  }

  FileBytes bytes_;
  bool isText_;
  int64_t seq_;
  Cut cut_;
  int64_t tokens_ = 0, trainTokens_ = 0, valTokens_ = 0, maxToken_ = 0, documents_ = 0;
  std::vector<Window> windows_[2]; // with a separator: of the training and validation parts
};

// The model inputs: integer tokens of shape [seq], and with documents, maybe their padding
// masks of the same shape.
void checkTokenInput(const std::string& source, const std::vector<InputSpec>& inputs,
                     const Cut& cut) {
  if (inputs.size() == 2 && cut.separator < 0)
    throw DataError(fmt::format("`{}` data feeds a second model input, the padding masks, only "
                                "when cut into documents: give `separator`; the model takes {}",
                                source, inputNames(inputs)));
  if (inputs.size() != 1 && inputs.size() != 2)
    throw DataError(fmt::format("`{}` data feeds one model input, the token windows{}; the model "
                                "takes {}",
                                source, cut.separator >= 0 ? ", and maybe their padding masks" : "",
                                inputNames(inputs)));
  for (const InputSpec& in : inputs)
    if (in.dtype != ir::DType::I32 || in.sampleShape != std::vector<int64_t>{cut.seq})
      throw DataError(fmt::format("model input {} does not fit `{}` data with seq = {}; declare "
                                  "it `{}: i32[B, {}]`",
                                  inputDecl(in), source, cut.seq, in.name, cut.seq));
}

} // namespace

std::unique_ptr<Dataset> openTokens(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                    const std::string& baseDir, bool isText) {
  std::string path = resolvePath(stringArg(spec, "path"), baseDir);
  Cut cut;
  cut.seq = integerArg(spec, "seq", -1, 1);
  double valFraction = numberArg(spec, "val_fraction", 0.1);
  if (!(valFraction >= 0 && valFraction < 1))
    throw DataError(fmt::format("argument `val_fraction` of `{}` must be in [0, 1), got {}",
                                spec.kind, valFraction));
  int64_t vocab = isText ? 256 : 65536;
  for (const char* name : {"separator", "pad"}) {
    int64_t v = integerArg(spec, name, 0, 0);
    if (v >= vocab)
      throw DataError(fmt::format("argument `{}` of `{}` is a token id, below {}; got {}", name,
                                  spec.kind, vocab, v));
  }
  cut.separator = spec.numbers.count("separator") ? integerArg(spec, "separator", 0, 0) : -1;
  cut.pad = integerArg(spec, "pad", 0, 0);
  if (spec.numbers.count("pad") && cut.separator < 0)
    throw DataError(
        fmt::format("argument `pad` of `{}` pads documents: give `separator` too", spec.kind));
  cut.masks = inputs.size() == 2;
  checkTokenInput(spec.kind, inputs, cut);
  int64_t seq = cut.seq;
  FileBytes bytes = FileBytes::open(path);
  if (!isText && bytes.size() % 2 != 0)
    throw DataError(fmt::format("`{}` has an odd number of bytes ({}); a token file holds uint16 "
                                "tokens of 2 bytes each",
                                path, withCommas(static_cast<int64_t>(bytes.size()))));
  auto data = std::make_unique<TokenDataset>(std::move(bytes), isText, cut, valFraction);
  if (data->size(Split::Train) == 0 && cut.separator >= 0)
    throw DataError(fmt::format("`{}` holds no document of two tokens or more (documents end "
                                "with token {}){}",
                                path, cut.separator,
                                valFraction > 0 ? fmt::format(" before the last {}% kept for "
                                                              "validation",
                                                              valFraction * 100)
                                                : ""));
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
