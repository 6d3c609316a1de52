// Recorder: per-iteration rows into /iterations, per-epoch rows into /epochs, /summary at the end.
#include "trainscope/train/recorder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trainscope/core/error.hpp"

namespace trainscope::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<io::Column> iteration_columns() {
    std::vector<io::Column> c = {{"iteration", "1"}, {"epoch", "1"}, {"t_start", "s"}};
    for (std::size_t p = 0; p < prof::kNumPhases; ++p)
        c.push_back({std::string(prof::phase_name(static_cast<prof::Phase>(p))) + "_s", "s"});
    c.insert(c.end(), {{"step_s", "s"},
                       {"loss", "1"},
                       {"samples", "samples"},
                       {"lr", "1"},
                       {"comm_bytes", "B"},
                       {"host_rss_bytes", "B"},
                       {"host_peak_rss_bytes", "B"},
                       {"device_allocated_bytes", "B"},
                       {"device_allocated_peak_bytes", "B"},
                       {"device_reserved_bytes", "B"},
                       {"device_reserved_peak_bytes", "B"}});
    return c;
}

std::vector<io::Column> epoch_columns() {
    return {{"epoch", "1"},    {"epoch_s", "s"},      {"train_loss", "1"},
            {"val_loss", "1"}, {"val_accuracy", "1"}, {"samples", "samples"}};
}

double median(std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
    if (v.empty()) return kNaN;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace

Recorder::Recorder(io::RunFile& file, MPI_Comm comm, prof::PhaseTimer& timer, int flush_every,
                   int warmup_iters)
    : file_(file), comm_(comm), timer_(timer), flush_every_(flush_every),
      warmup_iters_(warmup_iters) {
    file_.declare_series("iterations", iteration_columns());
    file_.declare_series("epochs", epoch_columns());
}

void Recorder::record_iteration(const IterationValues& v) {
    pending_[v.iteration] = v;
    ++since_flush_;
}

void Recorder::set_loss(std::int64_t iteration, double loss) {
    auto it = pending_.find(iteration);
    if (it != pending_.end()) it->second.loss = loss;
}

void Recorder::record_epoch(const EpochValues& v) {
    file_.append("epochs", {static_cast<double>(v.epoch), v.epoch_s, v.train_loss, v.val_loss,
                            v.val_accuracy, v.samples});
    last_epoch_ = v;
    have_epoch_ = true;
}

bool Recorder::flush_due() const {
    return since_flush_ >= flush_every_;
}

void Recorder::flush() {
    for (const prof::PhaseTimes& t : timer_.collect(/*wait=*/true)) {
        auto it = pending_.find(t.iteration);
        if (it == pending_.end())
            throw core::InternalError("Recorder: timing for unrecorded iteration " +
                                      std::to_string(t.iteration));
        const IterationValues& v = it->second;
        std::vector<double> row = {static_cast<double>(v.iteration), static_cast<double>(v.epoch),
                                   t.t_start};
        row.insert(row.end(), t.seconds.begin(), t.seconds.end());
        const prof::MemorySample& m = v.memory;
        row.insert(row.end(),
                   {t.step_seconds, v.loss, v.samples, v.lr, v.comm_bytes, m.host_rss_bytes,
                    m.host_peak_rss_bytes, m.device_allocated_bytes, m.device_allocated_peak_bytes,
                    m.device_reserved_bytes, m.device_reserved_peak_bytes});
        file_.append("iterations", row);
        peak_rss_ = std::max(peak_rss_, m.host_peak_rss_bytes);
        if (!std::isnan(m.device_allocated_peak_bytes))
            peak_device_ = std::isnan(peak_device_)
                               ? m.device_allocated_peak_bytes
                               : std::max(peak_device_, m.device_allocated_peak_bytes);
        if (recorded_ >= warmup_iters_) {
            step_seconds_.push_back(t.step_seconds);
            phase_seconds_.push_back(t.seconds);
            samples_.push_back(v.samples);
        }
        ++recorded_;
        pending_.erase(it);
    }
    file_.flush();
    since_flush_ = 0;
}

void Recorder::finish(double wall_seconds, double global_batch,
                      const std::vector<std::pair<std::string, std::string>>& extra) {
    flush();
    int size = 1;
    MPI_Comm_size(comm_, &size);

    // Ranks may differ by an iteration (uneven shards without drop_last): use the common prefix.
    long long mine = static_cast<long long>(step_seconds_.size()), n = 0;
    MPI_Allreduce(&mine, &n, 1, MPI_LONG_LONG, MPI_MIN, comm_);

    // Ranks run in lock-step (every iteration ends in collectives), so each rank's iteration time
    // measures the same cycle; per iteration the mean over ranks estimates it without the bias of
    // a max, which picks up whichever rank waited longest each time and so overstates the cycle.
    // The slowest rank's series is summarised too, for stragglers.
    std::vector<double> mean_step(step_seconds_.begin(), step_seconds_.begin() + n);
    std::vector<double> slowest = mean_step;
    MPI_Allreduce(MPI_IN_PLACE, mean_step.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm_);
    MPI_Allreduce(MPI_IN_PLACE, slowest.data(), static_cast<int>(n), MPI_DOUBLE, MPI_MAX, comm_);
    for (double& x : mean_step)
        x /= size;

    std::vector<io::Attribute> s;
    s.push_back({"measured_iterations", static_cast<std::int64_t>(n)});
    s.push_back({"warmup_iterations", static_cast<std::int64_t>(warmup_iters_)});
    s.push_back({"total_iterations", static_cast<std::int64_t>(recorded_)});
    s.push_back({"wall_s", wall_seconds});
    const double med = median(mean_step);
    s.push_back({"median_step_s", med});
    s.push_back({"mean_step_s", n ? std::accumulate(mean_step.begin(), mean_step.end(), 0.0) /
                                        static_cast<double>(n)
                                  : kNaN});
    s.push_back({"median_slowest_rank_step_s", median(slowest)});
    s.push_back({"global_batch_samples", global_batch});
    s.push_back({"throughput_samples_per_s", med > 0 ? global_batch / med : kNaN});

    // Phase medians: per iteration the mean over ranks, then the median over iterations.
    for (std::size_t p = 0; p < prof::kNumPhases; ++p) {
        std::vector<double> per_iter(n);
        for (long long i = 0; i < n; ++i)
            per_iter[i] = phase_seconds_[i][p];
        MPI_Allreduce(MPI_IN_PLACE, per_iter.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                      comm_);
        for (double& x : per_iter)
            x /= size;
        s.push_back({std::string("median_") + prof::phase_name(static_cast<prof::Phase>(p)) + "_s",
                     median(per_iter)});
    }

    // Imbalance: spread of the ranks' mean step times relative to their mean.
    double my_mean =
        n ? std::accumulate(step_seconds_.begin(), step_seconds_.begin() + n, 0.0) / n : 0;
    std::vector<double> means(size);
    MPI_Allgather(&my_mean, 1, MPI_DOUBLE, means.data(), 1, MPI_DOUBLE, comm_);
    const auto [lo, hi] = std::minmax_element(means.begin(), means.end());
    const double avg = std::accumulate(means.begin(), means.end(), 0.0) / size;
    s.push_back({"rank_step_imbalance", avg > 0 ? (*hi - *lo) / avg : 0.0});
    s.push_back({"slowest_rank", static_cast<std::int64_t>(hi - means.begin())});

    double peak_rss = 0, peak_dev = std::isnan(peak_device_) ? -1 : peak_device_;
    MPI_Allreduce(&peak_rss_, &peak_rss, 1, MPI_DOUBLE, MPI_MAX, comm_);
    MPI_Allreduce(MPI_IN_PLACE, &peak_dev, 1, MPI_DOUBLE, MPI_MAX, comm_);
    s.push_back({"peak_host_rss_bytes", peak_rss});
    s.push_back({"peak_device_allocated_bytes", peak_dev < 0 ? kNaN : peak_dev});
    if (have_epoch_) {
        s.push_back({"epochs_completed", static_cast<std::int64_t>(last_epoch_.epoch + 1)});
        s.push_back({"final_val_accuracy", last_epoch_.val_accuracy});
        s.push_back({"final_val_loss", last_epoch_.val_loss});
        s.push_back({"final_train_loss", last_epoch_.train_loss});
    }
    for (const auto& [k, v] : extra)
        s.push_back({k, v});
    file_.set_attributes("/summary", s);
}

} // namespace trainscope::train
