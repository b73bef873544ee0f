// Deterministic text forms of a Module: the IR itself and the plan a user reads.
#pragma once
#include "ir/Module.h"

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace epl::ir {

// The IR, one op a line: `%3 = attention(%2) {heads = 8} : f32[B, 128, 256]  # stage 0`.
void printModule(const Module& m, std::ostream& out);
// The plan: mesh, stages with their layers and parameters, bridges, per-rank bytes.
void printPlan(const Module& m, std::ostream& out);
// "0-1, 4-5": the global ranks of stage s's group in every replica; past four replicas
// "0-7, 64-71, …, 960-967 (16 replicas, every 64)". The printer, hover and `epl repl`
// name a stage's ranks this way.
std::string stageRankRanges(const Mesh& mesh, int s);
// The layers of stage s in order, each the first component of its ops' names as the
// script calls it (`transformer_block.3`), with the parameters of its forward ops.
std::vector<std::pair<std::string, int64_t>> stageLayerParams(const Module& m, int s);
// The plan's memory-per-rank section: each rank program's memory plan in one line (none
// for a plan without programs).
void printRankMemory(const Module& m, std::ostream& out);
// The plan's compute-per-rank section: each rank's matrix-product FLOPs a step, forward,
// backward and recomputed (none for a plan without programs).
void printRankCompute(const Module& m, std::ostream& out);
// The plan's pipeline-schedule section (ir/SchedulePrinter.cpp), for plans of two or more
// stages: the schedule's simulated bubble and the activations each stage keeps in flight.
void printScheduleSection(const Module& m, std::ostream& out);
// One rank's instruction stream (a training step, then evaluation) and memory plan.
void printProgram(const Module& m, int rank, std::ostream& out);
// Sections of the plan on their own (`epl repl`): one stage with its layers and model
// states, the bridges, and what runs again in the backward.
void printStageSection(const Module& m, int stage, std::ostream& out);
void printBridgeSection(const Module& m, std::ostream& out);
void printRecompute(const Module& m, std::ostream& out);

} // namespace epl::ir
