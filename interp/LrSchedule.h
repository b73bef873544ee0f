// Learning-rate schedules over the run's steps (train.lr_schedule).
#pragma once
#include "ir/Config.h"

#include <cstdint>

namespace epl::interp {

// The learning rate of 0-based `step` out of `steps`, for base rate `lr`:
//   warmup: lr * (step + 1) / warmup for the first `warmup` steps, then
//   constant: lr;
//   linear:   from lr down to final_lr (default 0) at the last step;
//   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2, t from 0 to 1 at the last step.
double learningRate(const ir::CallSpec& schedule, double lr, int64_t step, int64_t steps);

} // namespace epl::interp
