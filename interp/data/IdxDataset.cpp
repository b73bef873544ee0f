// `idx(images, labels, test_images, test_labels)`: IDX files as MNIST and Fashion-MNIST ship
// them, plain or gzip. Images feed the model's float input scaled to [0, 1], labels its
// integer input.
//
// IDX layout: two zero bytes, an element-type byte, a dim-count byte, then each dim as a
// big-endian uint32 (the first is the sample count), then the elements, big-endian.
#include "interp/data/FileBytes.h"
#include "interp/data/Sources.h"
#include "support/Text.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <tuple>

namespace epl::data {

namespace {

enum class IdxKind { Images, Labels };

constexpr unsigned char kUnsignedByte = 0x08, kSignedByte = 0x09, kShort = 0x0B, kInt = 0x0C;

struct IdxFile {
  FileBytes bytes;
  unsigned char type = kUnsignedByte;
  std::vector<int64_t> sampleDims; // dims after the count
  int64_t count = 0;
  int64_t sampleElements = 1;
  const unsigned char* elements = nullptr;
};

uint32_t bigEndian32(const unsigned char* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

int elementBytes(unsigned char type) {
  switch (type) {
  case kUnsignedByte:
  case kSignedByte:
    return 1;
  case kShort:
    return 2;
  case kInt:
    return 4;
  default:
    return 0;
  }
}

const char* what(IdxKind k) {
  return k == IdxKind::Images ? "image" : "label";
}

[[noreturn]] void wrongMagic(const std::string& path, IdxKind kind, uint32_t magic) {
  throw DataError(fmt::format(
      "`{}` is not an IDX {} file: magic number 0x{:08x}, expected {}", path, what(kind), magic,
      kind == IdxKind::Images ? "0x00000803 (unsigned bytes, 3 dims)" : "0x00000801 (1 dim)"));
}

// The largest IDX header: 4 bytes, then a uint32 for each of at most 255 dims.
constexpr size_t kMaxHeader = 4 + 4 * 255;

// Reads and checks the header in head[0, size): magic, element type and dims. Sets every
// field of `f` but its bytes and elements; returns the header's size and the file size it
// declares.
std::pair<size_t, int64_t> readHeader(IdxFile& f, const std::string& path, IdxKind kind,
                                      const unsigned char* p, size_t size) {
  if (size < 4)
    throw DataError(
        fmt::format("`{}` is truncated: expected an IDX header, got {} bytes", path, size));
  uint32_t magic = bigEndian32(p);
  f.type = p[2];
  int ndims = p[3];
  bool typeOk = kind == IdxKind::Images ? f.type == kUnsignedByte : elementBytes(f.type) > 0;
  bool dimsOk = kind == IdxKind::Images ? ndims >= 2 : ndims == 1;
  if (p[0] != 0 || p[1] != 0 || !typeOk || !dimsOk) wrongMagic(path, kind, magic);
  size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (size < header)
    throw DataError(fmt::format("`{}` is truncated: expected an IDX header of {} bytes, got {}",
                                path, header, size));
  f.count = bigEndian32(p + 4);
  for (size_t i = 1; i < static_cast<size_t>(ndims); ++i) {
    f.sampleDims.push_back(bigEndian32(p + 4 + 4 * i));
    if (__builtin_mul_overflow(f.sampleElements, f.sampleDims.back(), &f.sampleElements))
      throw DataError(fmt::format("`{}` declares samples too large to read", path));
  }
  int64_t dataBytes = 0;
  if (__builtin_mul_overflow(f.count, f.sampleElements * elementBytes(f.type), &dataBytes) ||
      dataBytes > INT64_MAX - static_cast<int64_t>(header))
    throw DataError(fmt::format("`{}` declares more data than any file can hold", path));
  return {header, static_cast<int64_t>(header) + dataBytes};
}

std::string contentOf(const IdxFile& f, IdxKind kind) {
  return kind == IdxKind::Images
             ? fmt::format("{} images of {}", withCommas(f.count), dimsStr(f.sampleDims))
             : fmt::format("{} labels", withCommas(f.count));
}

// The content must be exactly what the header declares.
void checkSize(const IdxFile& f, const std::string& path, IdxKind kind, int64_t expected) {
  auto size = static_cast<int64_t>(f.bytes.size());
  if (f.bytes.more())
    throw DataError(fmt::format("`{}` holds more than the {} bytes its header declares for {}",
                                path, withCommas(expected), contentOf(f, kind)));
  if (size < expected)
    throw DataError(fmt::format("`{}` is truncated: expected {} bytes for {}, got {}", path,
                                withCommas(expected), contentOf(f, kind), withCommas(size)));
  if (size > expected)
    throw DataError(fmt::format("`{}` has {} bytes after its {}", path, withCommas(size - expected),
                                contentOf(f, kind)));
  if (f.count == 0) throw DataError(fmt::format("`{}` holds no {}s", path, what(kind)));
}

// The content of a gzip IDX file, inflated no further than its header declares (and a
// byte more, to tell a file that goes on: a gzip bomb stops there). A declared size larger
// than the machine's memory is refused before inflating.
FileBytes inflateDeclared(const FileBytes& raw, const IdxFile& f, IdxKind kind, int64_t expected) {
  size_t memory = physicalMemory();
  if (memory > 0 && static_cast<uint64_t>(expected) > memory)
    throw DataError(fmt::format("`{}` declares {} for {}, more than this machine's memory ({})",
                                raw.path(), formatBytes(static_cast<double>(expected)),
                                contentOf(f, kind), formatBytes(static_cast<double>(memory))));
  return raw.inflated(static_cast<size_t>(expected));
}

// Reads an IDX file, plain or gzip: the header (from at most the largest header's worth of
// inflated bytes), then the content, checked against it. The file is read once: it may be a
// pipe.
IdxFile parseIdx(const std::string& path, IdxKind kind) {
  IdxFile f;
  FileBytes raw = FileBytes::open(path);
  size_t header = 0;
  int64_t expected = 0;
  if (raw.isGzip()) {
    FileBytes head = raw.inflated(kMaxHeader);
    std::tie(header, expected) = readHeader(f, path, kind, head.data(), head.size());
    f.bytes = head.more() ? inflateDeclared(raw, f, kind, expected) : std::move(head);
  } else {
    f.bytes = std::move(raw);
    std::tie(header, expected) = readHeader(f, path, kind, f.bytes.data(), f.bytes.size());
  }
  checkSize(f, path, kind, expected);
  f.elements = f.bytes.data() + header;
  return f;
}

// Labels as int32, checked to be non-negative (signed IDX types could hold negatives).
std::vector<int32_t> decodeLabels(const IdxFile& f, const std::string& path) {
  std::vector<int32_t> out(static_cast<size_t>(f.count));
  const unsigned char* p = f.elements;
  for (size_t i = 0; i < out.size(); ++i) {
    int32_t v = 0;
    switch (f.type) {
    case kUnsignedByte:
      v = p[i];
      break;
    case kSignedByte:
      // IDX type 0x09 is signed bytes.
      v = static_cast<int8_t>(p[i]); // NOLINT(bugprone-signed-char-misuse)
      break;
    case kShort:
      v = static_cast<int16_t>(uint16_t(p[2 * i] << 8 | p[2 * i + 1]));
      break;
    default:
      v = static_cast<int32_t>(bigEndian32(p + 4 * i));
      break;
    }
    if (v < 0)
      throw DataError(
          fmt::format("`{}` holds label {} at index {}; labels must be >= 0", path, v, i));
    out[i] = v;
  }
  return out;
}

struct IdxPair {
  IdxFile images;
  std::vector<int32_t> labels;
};

IdxPair openPair(const std::string& imagesPath, const std::string& labelsPath) {
  IdxPair pair{parseIdx(imagesPath, IdxKind::Images), {}};
  IdxFile labels = parseIdx(labelsPath, IdxKind::Labels);
  if (labels.count != pair.images.count)
    throw DataError(fmt::format("`{}` holds {} images but `{}` holds {} labels", imagesPath,
                                withCommas(pair.images.count), labelsPath,
                                withCommas(labels.count)));
  pair.labels = decodeLabels(labels, labelsPath);
  return pair;
}

class IdxDataset final : public Dataset {
public:
  IdxDataset(IdxPair train, std::optional<IdxPair> test, size_t imageInput, size_t labelInput)
      : train_(std::move(train)), test_(std::move(test)), imageInput_(imageInput),
        labelInput_(labelInput) {
    validation_ = test_ ? test_->images.count : train_.images.count / 10;
    trainCount_ = test_ ? train_.images.count : train_.images.count - validation_;
    for (const IdxPair* p : {&train_, test_ ? &*test_ : nullptr})
      if (p)
        maxLabel_ =
            std::max<int64_t>(maxLabel_, *std::max_element(p->labels.begin(), p->labels.end()));
  }

  int64_t size(Split s) const override { return s == Split::Train ? trainCount_ : validation_; }
  int64_t maxLabel() const override { return maxLabel_; }

  void read(Split s, const std::vector<int64_t>& ids, const std::vector<void*>& inputs,
            int32_t*) const override {
    checkRead(ids, size(s), inputs, 2);
    // Validation without a test pair is the tail of the training files.
    const IdxPair& pair = s == Split::Validation && test_ ? *test_ : train_;
    int64_t offset = s == Split::Validation && !test_ ? trainCount_ : 0;
    int64_t n = pair.images.sampleElements;
    auto* images = static_cast<float*>(inputs[imageInput_]);
    auto* labels = static_cast<int32_t*>(inputs[labelInput_]);
    // The samples lie at random places: each one's lines are asked for a few samples before
    // it is converted, so its misses overlap (about twice as fast a batch on a VM).
    constexpr size_t kAhead = 4;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + kAhead < ids.size()) {
        const unsigned char* ahead = pair.images.elements + (ids[i + kAhead] + offset) * n;
        for (int64_t j = 0; j < n; j += 64)
          __builtin_prefetch(ahead + j);
      }
      int64_t id = ids[i] + offset;
      const unsigned char* px = pair.images.elements + id * n;
      float* row = images + static_cast<int64_t>(i) * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j)
        row[j] = static_cast<float>(px[j]) / 255.0f;
      labels[i] = pair.labels[static_cast<size_t>(id)];
    }
  }

  std::string describe() const override {
    return fmt::format("idx: {} train / {} validation samples of {}{}", withCommas(trainCount_),
                       withCommas(validation_), dimsStr(train_.images.sampleDims),
                       test_ ? "" : " (validation: the last 10% of the training files)");
  }

private:
  IdxPair train_;
  std::optional<IdxPair> test_;
  size_t imageInput_, labelInput_;
  int64_t trainCount_ = 0, validation_ = 0, maxLabel_ = 0;
};

// Which model input takes the images (the float one) and which the labels (the integer
// scalar one), checked against the images' sample size.
std::pair<size_t, size_t> matchInputs(const std::vector<InputSpec>& inputs, const IdxFile& images,
                                      const std::string& imagesPath) {
  checkInputDTypes("idx", inputs);
  if (inputs.size() != 2 || ir::isIntegral(inputs[0].dtype) == ir::isIntegral(inputs[1].dtype))
    throw DataError(fmt::format("`idx` data feeds two model inputs, images (f32) and labels "
                                "(i32); the model takes {}",
                                inputNames(inputs)));
  size_t img = ir::isIntegral(inputs[0].dtype) ? 1 : 0, lab = 1 - img;
  if (sampleElements(inputs[img]) != images.sampleElements)
    throw DataError(
        fmt::format("model input {} holds {} values per sample, but the images in `{}` are {} = {}",
                    inputDecl(inputs[img]), withCommas(sampleElements(inputs[img])), imagesPath,
                    dimsStr(images.sampleDims), withCommas(images.sampleElements)));
  if (sampleElements(inputs[lab]) != 1)
    throw DataError(fmt::format("model input {} must hold one label per sample, as `{}: i32[B]`",
                                inputDecl(inputs[lab]), inputs[lab].name));
  return {img, lab};
}

} // namespace

std::unique_ptr<Dataset> openIdx(const ir::CallSpec& spec, const std::vector<InputSpec>& inputs,
                                 const std::string& baseDir) {
  std::string images = resolvePath(stringArg(spec, "images"), baseDir);
  std::string labels = resolvePath(stringArg(spec, "labels"), baseDir);
  std::string testImages = optionalStringArg(spec, "test_images");
  std::string testLabels = optionalStringArg(spec, "test_labels");
  if (testImages.empty() != testLabels.empty())
    throw DataError(fmt::format("`idx` needs both `test_images` and `test_labels`, got only `{}`",
                                testImages.empty() ? "test_labels" : "test_images"));
  IdxPair train = openPair(images, labels);
  auto [img, lab] = matchInputs(inputs, train.images, images);
  std::optional<IdxPair> test;
  if (!testImages.empty()) {
    testImages = resolvePath(testImages, baseDir);
    test = openPair(testImages, resolvePath(testLabels, baseDir));
    if (test->images.sampleDims != train.images.sampleDims)
      throw DataError(fmt::format("images in `{}` are {}, but those in `{}` are {}", testImages,
                                  dimsStr(test->images.sampleDims), images,
                                  dimsStr(train.images.sampleDims)));
  }
  return std::make_unique<IdxDataset>(std::move(train), std::move(test), img, lab);
}

} // namespace epl::data
