// `epl plan --json`: the plan's data as one JSON document (see PlanJson.h). Unlike the text
// printer it folds nothing: every layer, bridge and rank has its own entry, and every size
// is a whole number of bytes.
#include "ir/PlanJson.h"

#include "ir/Ops.h"
#include "ir/PipelineSchedule.h"
#include "ir/Printer.h"

#include <string>
#include <vector>

namespace epl::ir {

namespace {

using OrderedJson = nlohmann::ordered_json; // keys in the order written

const char* ampName(Amp a) {
  switch (a) {
  case Amp::None:
    return "fp32";
  case Amp::Fp16:
    return "fp16";
  case Amp::Bf16:
    return "bf16";
  }
  return "?";
}

const char* recomputeName(Recompute r) {
  switch (r) {
  case Recompute::None:
    return "none";
  case Recompute::Auto:
    return "auto";
  case Recompute::Every:
    return "every";
  case Recompute::Listed:
    return "listed";
  }
  return "?";
}

} // namespace

std::string recomputeText(const Policy& p) {
  if (p.recompute != Recompute::Listed) return recomputeName(p.recompute);
  std::string list = "[";
  for (size_t i = 0; i < p.recomputeBlocks.size(); ++i)
    list += (i ? ", " : "") + p.recomputeBlocks[i];
  return list + "]";
}

namespace {

const char* offloadName(Offload o) {
  switch (o) {
  case Offload::None:
    return "none";
  case Offload::Optimizer:
    return "optimizer";
  case Offload::Params:
    return "params";
  }
  return "?";
}

OrderedJson policyJson(const Module& m) {
  const Policy& p = m.policy;
  OrderedJson recompute = recomputeName(p.recompute);
  if (p.recompute == Recompute::Listed) recompute = p.recomputeBlocks;
  return {{"zero", static_cast<int>(p.zero)},
          {"amp", ampName(p.amp)},
          {"matmul", p.matmul == Matmul::Tf32 ? "tf32" : "fp32"},
          {"optimizer", m.train.optimizer.kind},
          {"recompute", recompute},
          {"offload", offloadName(p.offload)},
          {"offload_to", p.offloadTo == OffloadTarget::Disk ? "disk" : "cpu"},
          {"comm_dtype", dtypeName(p.commDtype)},
          {"schedule", scheduleName(p.schedule)},
          {"micro_batches", p.microBatches},
          {"chunks", p.chunks},
          {"bucket_bytes", p.bucketBytes},
          {"device_memory", p.deviceMemoryBytes}};
}

OrderedJson layersJson(const Module& m, int s) {
  OrderedJson out = OrderedJson::array();
  for (const auto& [layer, params] : stageLayerParams(m, s))
    out.push_back({{"name", layer}, {"params", params}, {"bytes", 4 * params}});
  return out;
}

OrderedJson stageJson(const Module& m, int s) {
  const StagePlan& st = m.mesh.stages[s];
  const char* kind = st.scope < 0                      ? "whole model"
                     : m.scopes[st.scope].isSplitStage ? "split"
                                                       : "replicate";
  OrderedJson ranks = OrderedJson::array();
  for (int r = 0; r < m.mesh.dataParallel; ++r) {
    OrderedJson group = OrderedJson::array();
    for (int k = 0; k < st.group; ++k)
      group.push_back(m.mesh.rank(r, s, k));
    ranks.push_back(group);
  }
  OrderedJson splitOps = OrderedJson::array();
  for (const Op& op : m.ops)
    if (op.stage == s && op.phase == Phase::Forward && op.splitForm != SplitForm::None)
      splitOps.push_back({{"op", op.name},
                          {"form", splitFormName(op.splitForm)},
                          {"width", m.scopes[m.splitScopeOf(op.scope)].width},
                          {"line", m.scopes[m.splitScopeOf(op.scope)].loc.line}});
  return {{"index", s},
          {"kind", kind},
          {"line", st.loc.line},
          {"devices", st.group},
          {"split_width", st.splitWidth},
          {"copies", st.copies()},
          {"ranks", ranks},
          {"layers", layersJson(m, s)},
          {"split_ops", splitOps},
          {"params", {{"count", st.paramCount}, {"bytes", st.paramBytes}}},
          {"held_per_device", {{"count", st.rankParamCount}, {"bytes", st.rankParamBytes}}},
          {"model_states_per_device",
           {{"params", st.stateParamBytes},
            {"grads", st.stateGradBytes},
            {"optimizer", st.stateOptimizerBytes},
            {"total", st.modelStateBytes()},
            {"offloaded", st.offloadedBytes}}}};
}

OrderedJson bridgeJson(const Module& m, const Bridge& b) {
  const Op& op = m.ops[b.op];
  int t = op.inputs.empty() ? op.outputs[0] : op.inputs[0];
  if (op.kind == OpKind::CrossEntropy) t = op.inputs[1];
  return {{"from_stage", b.fromStage},
          {"to_stage", b.toStage},
          {"what", b.what},
          {"tensor", m.tensors[t].name},
          {"type", m.tensors[t].type.str()},
          {"bytes", b.bytes < 0 ? OrderedJson() : OrderedJson(b.bytes)},
          {"line", op.site.line}};
}

// What each rank's program allocates: the figures `epl run` checks against the machine
// and compares with what it measures.
OrderedJson rankJson(const Module& m, const Program& p) {
  Module::StepFlops f = m.stepFlops(p);
  return {{"rank", p.rank},
          {"stage", p.stage},
          {"micro_batch_slots", p.slots},
          {"flops", {{"forward", f.forward}, {"backward", f.backward}, {"recompute", f.recompute}}},
          {"memory",
           {{"peak", p.peakBytes()},
            {"activations", (p.slots == 1 ? p.arenaBytes : p.activationBytes()) + p.recvBytes},
            {"kernel_workspace", p.largestWorkspace()},
            {"params", p.paramBytes},
            {"grads", p.gradBytes},
            {"optimizer", p.optimizerBytes},
            {"staging", p.stagingBytes},
            {"offloaded", p.offloadedBytes},
            {"comm_buffers", p.commBytes},
            {"host_inputs", p.inputBytes}}}};
}

OrderedJson scheduleJson(const Module& m) {
  if (m.mesh.stages.size() < 2) return nullptr;
  PipelineShape shape{m.mesh.depth(), static_cast<int>(m.policy.microBatches), m.mesh.chunks};
  OrderedJson out = {{"name", scheduleName(m.policy.schedule)},
                     {"stages", shape.stages},
                     {"micro_batches", shape.micros},
                     {"chunks", shape.chunks}};
  std::string refusal = scheduleRequirement(m.policy.schedule, shape);
  if (!refusal.empty()) {
    out["refused"] = refusal;
    return out;
  }
  ScheduleSimulation sim = simulateSchedule(m.policy.schedule, shape);
  out["deadlocked"] = sim.deadlocked;
  out["bubble"] = sim.bubble;
  out["makespan_units"] = sim.makespan;
  out["peak_in_flight"] = sim.peakInFlight;
  out["peak_held"] = sim.peakHeld;
  return out;
}

OrderedJson predictionJson(const Prediction* p) {
  if (!p) return nullptr;
  OrderedJson ops = OrderedJson::array();
  for (const Prediction::OpCost& o : p->ops)
    ops.push_back({{"name", o.name}, {"seconds", o.seconds}, {"flops", o.flops}, {"runs", o.runs}});
  return {{"cluster", p->cluster},
          {"device", p->device},
          {"step_seconds", p->stepSeconds},
          {"tflops_per_device", p->tflopsPerDevice},
          {"mfu", p->mfu},
          {"samples_per_second", p->samplesPerSecond},
          {"tokens_per_second", p->tokensPerSecond},
          {"parts",
           {{"compute", p->compute},
            {"stage_compute_per_micro_batch", p->stageCompute},
            {"bubble", p->bubble},
            {"gradient_reduction", p->gradientReduction},
            {"exposed_gradient_reduction", p->exposedReduction},
            {"split_communication", p->splitCommunication},
            {"stage_transfers", p->stageTransfers},
            {"optimizer", p->optimizer},
            {"offload_bytes", p->offloadBytes},
            {"offload", p->offload},
            {"exposed_offload", p->exposedOffload}}},
          {"peak_bytes", p->peakBytes},
          {"device_bytes", p->deviceBytes},
          {"ops_rank", p->opsRank},
          {"ops", ops}};
}

} // namespace

nlohmann::ordered_json planJson(const Module& m, const Prediction* predicted) {
  const Mesh& mesh = m.mesh;
  int64_t total = 0;
  int split = 1;
  for (const StagePlan& st : mesh.stages) {
    total += st.paramCount;
    split = std::max(split, st.splitWidth);
  }
  OrderedJson stages = OrderedJson::array(), bridges = OrderedJson::array(),
              buckets = OrderedJson::array(), ranks = OrderedJson::array();
  for (size_t s = 0; s < mesh.stages.size(); ++s)
    stages.push_back(stageJson(m, static_cast<int>(s)));
  for (const Bridge& b : m.bridges)
    bridges.push_back(bridgeJson(m, b));
  for (const GradBucket& b : m.buckets)
    buckets.push_back({{"stage", b.stage},
                       {"params", {m.params[b.firstParam].name, m.params[b.endParam - 1].name}},
                       {"bytes", b.bytes},
                       {"wire_bytes", m.wireBytes(b)},
                       {"ranks", b.ranks},
                       {"split_pieces", b.pieces},
                       {"tied", b.tied}});
  for (const Program& p : m.programs)
    ranks.push_back(rankJson(m, p));
  OrderedJson batch = nullptr, flops = nullptr;
  if (double sample = m.forwardFlopsPerSample(); sample > 0 && m.train.batch > 0)
    flops = {{"forward_per_sample", sample},
             {"step", 3 * sample * static_cast<double>(m.train.batch)}};
  if (mesh.microBatch > 0)
    batch = {{"global", m.train.batch},
             {"micro_batches", m.policy.microBatches},
             {"micro_batch_per_replica", mesh.microBatch},
             {"symbol", m.batchSymbol}};
  return {{"schema", kPlanJsonSchema},
          {"model", m.modelName},
          {"np", mesh.np},
          {"mesh",
           {{"data_parallel", mesh.dataParallel},
            {"stages", mesh.stages.size()},
            {"split", split},
            {"replica_devices", mesh.replicaSize},
            {"chunks", mesh.chunks},
            {"sequence_parallel", m.policy.sequenceParallel}}},
          {"batch", batch},
          {"params", {{"count", total}, {"bytes", 4 * total}, {"dtype", "f32"}}},
          {"flops", flops},
          {"policy", policyJson(m)},
          {"stages", stages},
          {"bridges", bridges},
          {"gradient_buckets", buckets},
          {"schedule", scheduleJson(m)},
          {"ranks", ranks},
          {"predicted", predictionJson(predicted)}};
}

void printPlanJson(const Module& m, std::ostream& out, const Prediction* predicted) {
  out << planJson(m, predicted).dump(2) << "\n";
}

} // namespace epl::ir
