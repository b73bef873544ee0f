// Learning-rate schedules (formulas in LrSchedule.h).
#include "interp/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace epl::interp {

namespace {
double number(const ir::CallSpec& c, const char* key, double def) {
  auto it = c.numbers.find(key);
  return it == c.numbers.end() ? def : it->second;
}
} // namespace

double learningRate(const ir::CallSpec& schedule, double lr, int64_t step, int64_t steps) {
  auto warmup = static_cast<int64_t>(number(schedule, "warmup", 0));
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  ir::LrSchedule kind = ir::lrScheduleOf(schedule);
  if (kind == ir::LrSchedule::Constant) return lr;
  int64_t span = std::max<int64_t>(steps - 1 - warmup, 1);
  double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  if (kind == ir::LrSchedule::Linear) {
    double end = number(schedule, "final_lr", 0);
    return lr + (end - lr) * t;
  }
  double low = number(schedule, "min_lr", 0);
  return low + (lr - low) * 0.5 * (1 + std::cos(M_PI * t));
}

} // namespace epl::interp
