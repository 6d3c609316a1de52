// Learning-rate schedules by iteration: linear warm-up, then constant, step decay or cosine
// annealing to a floor (as torch.optim.lr_scheduler's StepLR/CosineAnnealingLR, per iteration).
#pragma once

#include <cstdint>
#include <string>

#include "trainscope/core/config.hpp"

namespace trainscope::train {

struct LrSchedule {
    std::string kind = "constant"; // constant | step | cosine
    double base_lr = 0.1;
    std::int64_t warmup_iters = 0; // lr ramps linearly from base_lr/warmup to base_lr
    std::int64_t total_iters = 1;  // cosine: end of the schedule
    std::int64_t step_iters = 1;   // step: decay period
    double gamma = 0.1;            // step: factor per period
    double min_lr = 0.0;           // cosine: floor

    double at(std::int64_t iteration) const; // iteration counts from 0
};

// The schedule the train.* options describe (train.schedule, train.lr, train.warmup_iters,
// train.gamma, train.min_lr, train.step_epochs) over a run of total_iters iterations in epochs of
// per_epoch: the one place both workloads build it.
LrSchedule schedule_from_config(const core::Config& config, std::int64_t total_iters,
                                std::int64_t per_epoch);

} // namespace trainscope::train
