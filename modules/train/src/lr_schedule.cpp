// Learning-rate schedule arithmetic (no torch: tested on its own).
#include "trainscope/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace trainscope::train {

LrSchedule make_schedule(const ScheduleConfig& c, double base_lr, std::int64_t total_iters,
                         std::int64_t per_epoch) {
    LrSchedule s;
    s.kind = c.kind;
    s.base_lr = base_lr;
    s.warmup_iters = c.warmup_iters;
    s.gamma = c.gamma;
    s.min_lr = c.min_lr;
    s.total_iters = total_iters;
    s.step_iters = c.step_epochs * std::max<std::int64_t>(1, per_epoch);
    return s;
}

double LrSchedule::at(std::int64_t it) const {
    if (warmup_iters > 0 && it < warmup_iters)
        return base_lr * static_cast<double>(it + 1) / static_cast<double>(warmup_iters);
    const std::int64_t t = it - warmup_iters;
    if (kind == "step")
        return base_lr *
               std::pow(gamma, static_cast<double>(t / std::max<std::int64_t>(1, step_iters)));
    if (kind == "cosine") {
        const double span =
            static_cast<double>(std::max<std::int64_t>(1, total_iters - warmup_iters));
        const double progress = std::min(1.0, static_cast<double>(t) / span);
        return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    }
    return base_lr;
}

} // namespace trainscope::train
