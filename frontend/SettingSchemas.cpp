// The key tables of `policy` and `train`, and the call-shaped values they accept.
#include "frontend/SettingSchemas.h"

#include <fmt/format.h>

namespace epl::frontend {

namespace {

CallArg path(std::string name, bool required = true) {
  return {std::move(name), ArgType::String, required};
}
CallArg count(std::string name, bool required, double lo) {
  return {std::move(name), ArgType::Integer, required, lo};
}
CallArg positive(std::string name, bool required = false) {
  return {std::move(name), ArgType::Number, required, 0, 1e300, true};
}
CallArg nonNegative(std::string name) {
  return {std::move(name), ArgType::Number, false, 0};
}
CallArg fraction(std::string name) {
  return {std::move(name), ArgType::Number, false, 0, 1};
} // [0, 1)

} // namespace

const std::vector<CallSchema>& callSchemas() {
  static const std::vector<CallSchema> t = {
      {"data",
       "tokens",
       {path("path"), count("seq", true, 1), fraction("val_fraction"), count("separator", false, 0),
        count("pad", false, 0)},
       "uint16 little-endian token file (nanoGPT .bin); windows of seq + 1 tokens, or with "
       "`separator` of each document, padded with `pad`"},
      {"data",
       "text",
       {path("path"), count("seq", true, 1), fraction("val_fraction"), count("separator", false, 0),
        count("pad", false, 0)},
       "raw text read as bytes (vocab 256); windows of seq + 1 bytes, or with `separator` of "
       "each line or document, padded with `pad`"},
      {"data",
       "idx",
       {path("images"), path("labels"), path("test_images", false), path("test_labels", false)},
       "IDX image and label files, gzip allowed (MNIST, Fashion-MNIST); the test pair is the "
       "evaluation split"},
      {"data",
       "synthetic",
       {count("samples", true, 1), count("classes", false, 1)},
       "seeded random inputs and targets"},
      {"optimizer",
       "sgd",
       {positive("lr", true), fraction("momentum"), nonNegative("weight_decay")},
       "stochastic gradient descent with optional momentum"},
      {"optimizer",
       "adam",
       {positive("lr", true), fraction("beta1"), fraction("beta2"), positive("eps"),
        nonNegative("weight_decay")},
       "Adam (L2 weight decay added to the gradient)"},
      {"optimizer",
       "adamw",
       {positive("lr", true), fraction("beta1"), fraction("beta2"), positive("eps"),
        nonNegative("weight_decay")},
       "Adam with decoupled weight decay"},
      {"lr_schedule",
       "constant",
       {count("warmup", false, 0)},
       "constant rate after an optional linear warmup"},
      {"lr_schedule",
       "linear",
       {count("warmup", false, 0), nonNegative("final_lr")},
       "linear warmup, then linear decay to final_lr at the last step"},
      {"lr_schedule",
       "cosine",
       {count("warmup", false, 0), nonNegative("min_lr")},
       "linear warmup, then cosine decay to min_lr at the last step"},
  };
  return t;
}

const std::vector<KeyDoc>& policyKeys() {
  static const std::vector<KeyDoc> t = {
      {"micro_batches", "integer >= 1", "1",
       "micro-batches per step (pipeline depth and gradient accumulation)"},
      {"schedule", "gpipe | 1f1b | interleaved | zb", "1f1b", "pipeline schedule"},
      {"chunks", "integer >= 1", "1",
       "interleaved: stage blocks per pipeline rank, placed round-robin (virtual stages)"},
      {"zero", "0 | 1 | 2 | 3", "0",
       "ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters"},
      {"recompute", "none | auto | every | [def names]", "none",
       "which blocks recompute activations in backward"},
      {"offload", "none | optimizer | params", "none",
       "what lives off the device between uses (params needs zero = 3)"},
      {"offload_to", "cpu | disk", "cpu", "where offloaded state goes"},
      {"amp", "none | fp16 | bf16", "none", "mixed precision (fp16 uses a dynamic loss scale)"},
      {"loss_scale", "number > 0", "65536",
       "amp = fp16: the first step's loss scale; halved on an overflow, doubled after 2000 "
       "steps without one"},
      {"matmul", "fp32 | tf32", "fp32",
       "GPUs: fp32 matrix products exact, or on tensor cores with operands rounded to tf32 "
       "(the CPU multiplies in fp32)"},
      {"comm_dtype", "fp32 | bf16 | fp16", "fp32", "dtype of gradient reduction"},
      {"bucket_mb", "integer MB or a size", "25",
       "gradient bucket size for the data-parallel reduction (0: one bucket)"},
      {"overlap_comm", "true | false", "true",
       "reduce each gradient bucket during the backward, as soon as it is ready"},
      {"sequence_parallel", "true | false", "false",
       "inside split regions, norms and dropout work on a slice of the sequence"},
      {"comm_timeout", "seconds", "300",
       "a collective waiting longer ends the job, naming the instruction"},
      {"device_memory", "size (e.g. 80GB)", "none",
       "memory of one device; a plan that does not fit is an error"},
  };
  return t;
}

const std::vector<KeyDoc>& trainKeys() {
  static const std::vector<KeyDoc> t = {
      {"data", "tokens(…) | text(…) | idx(…) | synthetic(…)", "required", "the training data"},
      {"batch", "integer >= 1", "required",
       "global batch in samples, over all data-parallel ranks and micro-batches"},
      {"optimizer", "sgd(…) | adam(…) | adamw(…)", "adamw(lr = 1e-3)",
       "the optimizer and its hyper-parameters"},
      {"lr_schedule", "constant | linear(…) | cosine(…)", "constant",
       "learning-rate schedule over `steps`"},
      {"steps", "integer >= 1", "100", "optimizer steps to run"},
      {"clip_grad_norm", "number >= 0", "0 (off)", "clip the global gradient norm to this value"},
      {"log_every", "integer >= 1", "10", "steps between log lines"},
      {"eval", "{ every = n, batches = n, final = true | false | n }", "none",
       "evaluate on the validation split every n steps"},
      {"checkpoint", "{ dir = \"…\", every = n, keep = n }", "none",
       "write checkpoints every n steps"},
      {"seed", "integer >= 0", "0", "seed for initialisation, data order and dropout"},
  };
  return t;
}

const std::vector<KeyDoc>& settingCalls() {
  static const std::vector<KeyDoc> t = [] {
    std::vector<KeyDoc> out;
    for (const auto& c : callSchemas()) {
      std::vector<std::string> args;
      for (const auto& a : c.args)
        args.push_back(a.name);
      out.push_back({c.name, c.group, fmt::format("{}", fmt::join(args, ", ")), c.doc});
    }
    return out;
  }();
  return t;
}

} // namespace epl::frontend
