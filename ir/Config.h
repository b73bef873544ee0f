// The typed `policy` and `train` settings of a script, as the passes and runtime read them.
// The front end fills these after checking every key (frontend/Settings.cpp); defaults here.
#pragma once
#include "ir/Types.h"
#include "support/SourceManager.h"

#include <map>
#include <string>
#include <vector>

namespace epl::ir {

enum class Schedule { GPipe, OneFOneB, Interleaved, ZeroBubble };
enum class ZeroStage { None, OptimizerStates, Gradients, Parameters };
enum class Recompute { None, Auto, Every, Listed };
enum class Offload { None, Optimizer, Params };
enum class OffloadTarget { Cpu, Disk };
enum class Amp { None, Fp16, Bf16 };
// The precision of fp32 matrix products on GPUs: exact, or on tensor cores with the
// operands rounded to TF32 and fp32 sums (PyTorch's float32 matmul precision "high"). The
// CPU multiplies in fp32 whichever it says (docs/gpu.md).
enum class Matmul { Fp32, Tf32 };

struct Policy {
  int64_t microBatches = 1;
  Schedule schedule = Schedule::OneFOneB;
  // Interleaved: model chunks per pipeline rank. The stage blocks go round-robin over
  // blocks / chunks pipeline ranks (block k on rank k mod that), Megatron-LM's virtual stages.
  int64_t chunks = 1;
  ZeroStage zero = ZeroStage::None;
  Recompute recompute = Recompute::None;
  std::vector<std::string> recomputeBlocks; // with Recompute::Listed
  Offload offload = Offload::None;
  OffloadTarget offloadTo = OffloadTarget::Cpu;
  Amp amp = Amp::None;
  // amp = fp16: the loss scale of the first step (dynamic: halved on an overflow, doubled
  // after kLossScaleWindow steps without one).
  double lossScale = 65536;
  static constexpr int kLossScaleWindow = 2000;
  Matmul matmul = Matmul::Fp32;
  DType commDtype = DType::F32;
  int64_t bucketBytes = 25'000'000; // 0: every gradient in one bucket
  bool overlapComm = true;          // start each bucket's reduction as soon as it is ready
  // Inside split regions, row-wise ops and dropout work on a slice of the sequence (dim 1),
  // and the all-reduces become reduce-scatters and all-gathers (Korthikanti et al., 2022).
  bool sequenceParallel = false;
  double commTimeoutSeconds = 300;
  int64_t deviceMemoryBytes = 0;            // 0: not declared, no fit check
  std::map<std::string, SourceLoc> keyLocs; // where each key was set, for later errors
};

// A call-shaped setting value: `adamw(lr = 3e-4)`, `tokens("data.bin", seq = 128)`.
struct CallSpec {
  std::string kind;
  std::map<std::string, std::string> strings; // path arguments by name
  std::map<std::string, double> numbers;
  SourceLoc loc;
};

// The call names of `optimizer` and `lr_schedule`, as the front end checked them
// (frontend/SettingSchemas.cpp lists the calls), named once here.
enum class Optimizer { Sgd, Adam, AdamW };
enum class LrSchedule { Constant, Linear, Cosine };
inline Optimizer optimizerOf(const CallSpec& c) {
  return c.kind == "sgd" ? Optimizer::Sgd : c.kind == "adam" ? Optimizer::Adam : Optimizer::AdamW;
}
inline LrSchedule lrScheduleOf(const CallSpec& c) {
  return c.kind == "constant" ? LrSchedule::Constant
         : c.kind == "linear" ? LrSchedule::Linear
                              : LrSchedule::Cosine;
}

struct TrainConfig {
  bool present = false;
  std::string model;
  CallSpec data;
  int64_t batch = 0; // global batch in samples; 0 when no train block
  CallSpec optimizer{"adamw", {}, {{"lr", 1e-3}}, {}};
  CallSpec lrSchedule{"constant", {}, {}, {}};
  int64_t steps = 100;
  double clipGradNorm = 0;
  int64_t logEvery = 10;
  CallSpec eval; // kind "" when absent
  // The evaluation after the last step: -1 the whole validation split, 0 none, else that
  // many batches of the global micro-batch (`eval = { final = true | false | N }`).
  int64_t finalEvalBatches = -1;
  std::string checkpointDir;
  int64_t checkpointEvery = 0;
  int64_t checkpointKeep = 0; // 0: keep every checkpoint
  int64_t seed = 0;
  std::map<std::string, SourceLoc> keyLocs;
};

} // namespace epl::ir
