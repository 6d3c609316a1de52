// Learning-rate schedules by iteration: linear warm-up, then constant, step decay or cosine
// annealing to a floor (as torch.optim.lr_scheduler's StepLR/CosineAnnealingLR, per iteration).
#pragma once

#include <cstdint>
#include <string>

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

// What train.schedule, train.warmup_iters, train.gamma, train.min_lr and train.step_epochs say,
// before the run length is known (TrainConfig::schedule).
struct ScheduleConfig {
    std::string kind = "constant";
    std::int64_t warmup_iters = 0;
    double gamma = 0.1;
    double min_lr = 0.0;
    std::int64_t step_epochs = 1;
};

// The schedule from base_lr over a run of total_iters iterations in epochs of per_epoch: built by
// the TrainingLoop, the one owner of the run length.
LrSchedule make_schedule(const ScheduleConfig& config, double base_lr, std::int64_t total_iters,
                         std::int64_t per_epoch);

} // namespace trainscope::train
