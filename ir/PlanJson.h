// The plan as JSON (`epl plan --json`): the mesh, the stages with their layers and split
// ops, the bridges, the gradient buckets, a pipeline's schedule and each rank's memory
// ledger, from the same module the text printer reads. docs/plan-json.md describes the
// fields.
#pragma once
#include "ir/Module.h"
#include "ir/Predict.h"

#include <nlohmann/json.hpp>
#include <ostream>

namespace epl::ir {

constexpr int kPlanJsonSchema = 1;

// With a prediction (`epl plan --cluster`), its figures under `predicted`; else null.
nlohmann::ordered_json planJson(const Module& m, const Prediction* predicted = nullptr);
void printPlanJson(const Module& m, std::ostream& out, const Prediction* predicted = nullptr);

// The policy's recompute as a script writes it: `none`, `auto`, `every` or `[a, b]`.
std::string recomputeText(const Policy& p);

} // namespace epl::ir
