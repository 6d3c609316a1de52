// Recorder: per-iteration rows into /iterations, per-epoch rows into /epochs, /summary at the end.
#include "trainscope/train/recorder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/numeric.hpp"
#include "trainscope/io/schema.hpp"
#include "trainscope/prof/statistics.hpp"
#include "trainscope/train/run_file_tables.hpp"

namespace trainscope::train {

namespace schema = io::schema;
namespace {

using core::kNaN;
namespace stats = prof::stats;

std::vector<io::Column> iteration_columns() {
    std::vector<io::Column> c = {
        {"iteration", "1"}, {"epoch", "1"}, {"t_start", "s"}, {"flush_s", "s"}};
    for (std::size_t p = 0; p < prof::kNumPhases; ++p)
        c.push_back({std::string(prof::phase_name(static_cast<prof::Phase>(p))) + "_s", "s"});
    c.insert(c.end(), {{"step_s", "s"},
                       {"loss", "1"},
                       {"samples", "samples"},
                       {"lr", "1"},
                       {"comm_bytes", "B"},
                       {"comm_collective_s", "s"},
                       {"comm_uncompressed_bytes", "B"},
                       {"comm_error_norm", "1"},
                       {"parameter_bytes", "B"},
                       {"gradient_bytes", "B"},
                       {"optimizer_state_bytes", "B"},
                       {"host_rss_bytes", "B"},
                       {"host_peak_rss_bytes", "B"},
                       {"host_tensor_bytes", "B"},
                       {"host_tensor_peak_bytes", "B"},
                       {"device_allocated_bytes", "B"},
                       {"device_allocated_peak_bytes", "B"},
                       {"device_reserved_bytes", "B"},
                       {"device_reserved_peak_bytes", "B"},
                       {"device_active_bytes", "B"},
                       {"device_active_peak_bytes", "B"},
                       {"device_alloc_retries", "1"},
                       {"device_ooms", "1"},
                       {"device_free_bytes", "B"},
                       {"device_total_bytes", "B"},
                       {"forward_peak_bytes", "B"},
                       {"backward_peak_bytes", "B"},
                       {"optimizer_peak_bytes", "B"},
                       {"loss_scale", "1"},
                       {"step_skipped", "1"},
                       {"nonfinite_skipped", "1"},
                       {"host_syncs", "1"},
                       {"tokens", "tokens"},
                       {"label_tokens", "tokens"}});
    return c;
}

std::vector<io::Column> epoch_columns() {
    return {{"epoch", "1"},          {"epoch_s", "s"},      {"train_loss", "1"},
            {"val_loss", "1"},       {"val_accuracy", "1"}, {"samples", "samples"},
            {"val_perplexity", "1"}, {"eval_s", "s"}};
}

// Element-wise over ranks, in place on every rank (one MPI_Allreduce).
void allreduce_in_place(MPI_Comm comm, std::vector<double>& values, MPI_Op op) {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, op,
                  comm);
}

// "3,17,40": at most `most` ranks, then " (+K more)", so the attribute stays small at any scale.
std::string join_ranks(const std::vector<int>& ranks, std::size_t most = 64) {
    std::string out;
    for (std::size_t i = 0; i < ranks.size() && i < most; ++i)
        out += (out.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (ranks.size() > most) out += " (+" + std::to_string(ranks.size() - most) + " more)";
    return out;
}

} // namespace

Recorder::Recorder(io::RunFile& file, MPI_Comm comm, prof::PhaseTimer& timer, int flush_every,
                   int warmup_iters, std::vector<io::Column> extra_columns,
                   std::int64_t expected_iterations)
    : file_(file), comm_(comm), timer_(timer), flush_every_(flush_every),
      warmup_iters_(warmup_iters), extra_count_(extra_columns.size()) {
    // Chunks sized to the run and to the ranks writing per-rank rows (io::series_chunk_rows): a
    // 5-iteration run allocates 8 rows a chunk, a 100,000-iteration run 1 MiB chunks.
    const int rows_r = std::max(1, file_.per_rank_count());
    chunk_rows_ = io::series_chunk_rows(expected_iterations, rows_r);
    std::vector<io::Column> columns = iteration_columns();
    columns.insert(columns.end(), extra_columns.begin(), extra_columns.end());
    // Per-row aggregates over every rank; a row's slowest rank is the one with the longest step
    // (the epoch's duration for /epochs).
    file_.declare_series(schema::kIterations, columns, chunk_rows_, "step_s");
    file_.declare_series(schema::kEpochs, epoch_columns(), io::series_chunk_rows(0, rows_r),
                         "epoch_s");
}

void Recorder::record_iteration(const IterationValues& v) {
    if (v.extra.size() != extra_count_)
        throw core::InternalError("Recorder: " + std::to_string(v.extra.size()) +
                                  " extra values for " + std::to_string(extra_count_) +
                                  " extra columns");
    pending_[v.iteration] = v;
    ++since_flush_;
}

void Recorder::declare_buckets(const std::vector<std::size_t>& bytes) {
    // Every rank must declare the same columns, but pipeline stages hold different parameters and
    // so different bucket counts (the small first bucket makes that the rule): one column per
    // bucket of the rank with the most; a rank's extra columns stay NaN.
    unsigned long long mine = bytes.size(), most = 0;
    MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_);
    buckets_ = static_cast<std::size_t>(most);
    if (most == 0) return;
    std::vector<io::Column> columns;
    for (std::size_t k = 0; k < buckets_; ++k)
        columns.push_back({"bucket_" + std::to_string(k) + "_s", "s"});
    file_.declare_series(schema::kCommBuckets, columns, chunk_rows_);
    file_.write_vector(schema::kCommBucketsBytes, std::vector<double>(bytes.begin(), bytes.end()),
                       "B");
}

void Recorder::set_loss(std::int64_t iteration, double loss) {
    auto it = pending_.find(iteration);
    if (it != pending_.end()) it->second.loss = loss;
}

void Recorder::set_extra(std::int64_t iteration, int column, double value) {
    auto it = pending_.find(iteration);
    if (it != pending_.end() && column >= 0 &&
        static_cast<std::size_t>(column) < it->second.extra.size())
        it->second.extra[static_cast<std::size_t>(column)] = value;
}

IterationValues* Recorder::pending_values(std::int64_t iteration) {
    auto it = pending_.find(iteration);
    return it == pending_.end() ? nullptr : &it->second;
}

void Recorder::record_epoch(const EpochValues& v) {
    file_.append(schema::kEpochs,
                 {static_cast<double>(v.epoch), v.epoch_s, v.train_loss, v.val_loss, v.val_accuracy,
                  v.samples, v.val_perplexity, v.eval_s});
    last_epoch_ = v;
    have_epoch_ = true;
}

bool Recorder::flush_due() const {
    return since_flush_ >= flush_every_;
}

void Recorder::flush() {
    // The previous flush's own time goes to the first row it did not write: the iteration that
    // started after it (flush_s, 0 in the other rows).
    double flush_before = last_flush_s_;
    for (const prof::PhaseTimes& t : timer_.collect(/*wait=*/true)) {
        auto it = pending_.find(t.iteration);
        if (it == pending_.end())
            throw core::InternalError("Recorder: timing for unrecorded iteration " +
                                      std::to_string(t.iteration));
        const IterationValues& v = it->second;
        std::vector<double> row = {static_cast<double>(v.iteration), static_cast<double>(v.epoch),
                                   t.t_start, flush_before};
        flush_before = 0;
        row.insert(row.end(), t.seconds.begin(), t.seconds.end());
        const prof::MemorySample& m = v.memory;
        row.insert(row.end(), {t.step_seconds,
                               v.loss,
                               v.samples,
                               v.lr,
                               v.comm_bytes,
                               v.comm_collective_s,
                               v.comm_uncompressed_bytes,
                               v.comm_error_norm,
                               v.parameter_bytes,
                               v.gradient_bytes,
                               v.optimizer_state_bytes,
                               m.host_rss_bytes,
                               m.host_peak_rss_bytes,
                               m.host_tensor_bytes,
                               m.host_tensor_peak_bytes,
                               m.device_allocated_bytes,
                               m.device_allocated_peak_bytes,
                               m.device_reserved_bytes,
                               m.device_reserved_peak_bytes,
                               m.device_active_bytes,
                               m.device_active_peak_bytes,
                               m.device_alloc_retries,
                               m.device_ooms,
                               m.device_free_bytes,
                               m.device_total_bytes,
                               v.forward_peak_bytes,
                               v.backward_peak_bytes,
                               v.optimizer_peak_bytes,
                               v.loss_scale,
                               v.step_skipped,
                               v.nonfinite_skipped,
                               v.host_syncs,
                               v.tokens,
                               v.label_tokens});
        row.insert(row.end(), v.extra.begin(), v.extra.end());
        file_.append(schema::kIterations, row);
        if (buckets_ > 0 && !v.bucket_s.empty()) {
            std::vector<double> buckets = v.bucket_s;
            buckets.resize(buckets_, kNaN); // fewer buckets than the rank with the most
            file_.append(schema::kCommBuckets, buckets);
        }
        nonfinite_skipped_ += v.nonfinite_skipped;
        peak_rss_ = std::max(peak_rss_, m.host_peak_rss_bytes);
        if (!std::isnan(m.host_tensor_peak_bytes))
            peak_tensor_ = std::isnan(peak_tensor_)
                               ? m.host_tensor_peak_bytes
                               : std::max(peak_tensor_, m.host_tensor_peak_bytes);
        if (!std::isnan(m.device_allocated_peak_bytes))
            peak_device_ = std::isnan(peak_device_)
                               ? m.device_allocated_peak_bytes
                               : std::max(peak_device_, m.device_allocated_peak_bytes);
        if (recorded_ >= warmup_iters_) {
            step_seconds_.push_back(t.step_seconds);
            t_start_.push_back(t.t_start);
            phase_seconds_.push_back(t.seconds);
            samples_.push_back(v.samples);
            tokens_.push_back(v.tokens);
            host_syncs_ += v.host_syncs;
        }
        ++recorded_;
        pending_.erase(it);
    }
    if (telemetry_) append_telemetry(file_, *telemetry_);
    file_.flush();
    // Kept for the next row when this flush wrote none (e.g. only telemetry), summed otherwise.
    last_flush_s_ = flush_before + file_.flush_stats().last_s;
    since_flush_ = 0;
}

void Recorder::finish(const RunInfo& info) {
    flush();
    int size = 1, rank = 0;
    MPI_Comm_size(comm_, &size);
    MPI_Comm_rank(comm_, &rank);

    // Ranks may differ by an iteration (uneven shards without drop_last): use the common prefix.
    long long mine = static_cast<long long>(step_seconds_.size()), n = 0;
    MPI_Allreduce(&mine, &n, 1, MPI_LONG_LONG, MPI_MIN, comm_);

    // Every statistic below comes from reductions over ranks of per-iteration vectors: O(n) memory
    // per rank whatever the world size (issue 39: gathering every rank's series onto every rank
    // took N x n doubles, 2.6 GB per rank at 16,384 ranks x 10,000 iterations).
    //
    // Ranks run in lock-step (every iteration ends in collectives), so each rank's iteration time
    // measures the same cycle; per iteration the mean over ranks estimates it without the bias of
    // a max, which picks up whichever rank waited longest each time and so overstates the cycle.
    // The slowest rank's series is summarised too, for stragglers. Busy time is the step minus
    // exposed communication: in lock-step every rank's step time is the same, and the straggler is
    // the rank that waits least.
    const auto un = static_cast<std::size_t>(n);
    const auto wait_index = static_cast<std::size_t>(prof::Phase::CommWait);
    std::vector<double> sums(un * (2 + prof::kNumPhases)), maxima(2 * un);
    double my_busy = 0; // this rank's busy time over the measured iterations (stragglers)
    for (std::size_t i = 0; i < un; ++i) {
        const double w = phase_seconds_[i][wait_index];
        const double busy = step_seconds_[i] - (std::isnan(w) ? 0.0 : w);
        my_busy += busy;
        sums[i] = maxima[i] = step_seconds_[i];
        sums[un + i] = maxima[un + i] = busy;
        for (std::size_t p = 0; p < prof::kNumPhases; ++p)
            sums[(2 + p) * un + i] = phase_seconds_[i][p];
    }
    allreduce_in_place(comm_, sums, MPI_SUM);
    allreduce_in_place(comm_, maxima, MPI_MAX);
    const double ranks = static_cast<double>(size);
    auto mean_of = [&](std::size_t block) {
        std::vector<double> out(un);
        for (std::size_t i = 0; i < un; ++i)
            out[i] = sums[block * un + i] / ranks;
        return out;
    };
    const std::vector<double> mean_step = mean_of(0);
    const std::vector<double> slowest(maxima.begin(), maxima.begin() + static_cast<long>(un));

    std::vector<io::Attribute> s;
    stats::SummaryReport report;
    report.world_size = size;
    report.measured_iterations = n;
    report.warmup_iterations = warmup_iters_;
    s.push_back({"measured_iterations", static_cast<std::int64_t>(n)});
    s.push_back({"warmup_iterations", static_cast<std::int64_t>(warmup_iters_)});
    s.push_back({"total_iterations", static_cast<std::int64_t>(recorded_)});
    if (n == 0) {
        // Every iteration was warm-up (or the run stopped before the first measured one): say so
        // rather than leave a reader to wonder why every statistic is NaN.
        report.warning = "no measured iterations: all " + std::to_string(recorded_) +
                         " iteration(s) run were warm-up (profile.warmup_iters=" +
                         std::to_string(warmup_iters_) +
                         "), so the statistics below are NaN; set profile.warmup_iters below the "
                         "number of iterations";
        s.push_back({"warning", report.warning});
    }
    s.push_back({"wall_s", info.wall_seconds});
    const double med = stats::median(mean_step);
    s.push_back({"median_step_s", med});
    s.push_back({"p95_step_s", stats::p95(mean_step)});
    s.push_back({"mean_step_s", stats::mean(mean_step)});
    s.push_back({"median_slowest_rank_step_s", stats::median(slowest)});
    s.push_back({"global_batch_samples", info.global_batch});
    const double throughput = med > 0 ? info.global_batch / med : kNaN;
    s.push_back({"throughput_samples_per_s", throughput});
    report.throughput_samples_per_s = throughput;

    // Token throughput: all ranks' tokens over the measured iterations divided by their duration
    // (the sum of the per-iteration mean step times); per rank = that / world size.
    double my_tokens = 0, total_tokens = 0;
    for (long long i = 0; i < n; ++i)
        my_tokens += tokens_[i];
    MPI_Allreduce(&my_tokens, &total_tokens, 1, MPI_DOUBLE, MPI_SUM, comm_); // NaN propagates
    double measured_s = 0;
    for (double t : mean_step)
        measured_s += t;
    const bool token_workload = n > 0 && !std::isnan(total_tokens);
    if (token_workload) {
        const double tps = measured_s > 0 ? total_tokens / measured_s : kNaN;
        s.push_back({"tokens", total_tokens});
        s.push_back({"throughput_tokens_per_s", tps});
        s.push_back({"throughput_tokens_per_s_per_rank", tps / size});
        report.throughput_tokens_per_s = tps;
    }

    // Phases: per iteration the mean over ranks, then median and p95 over iterations.
    for (std::size_t p = 0; p < prof::kNumPhases; ++p) {
        const std::vector<double> per_iter = mean_of(2 + p);
        const std::string name = prof::phase_name(static_cast<prof::Phase>(p));
        s.push_back({"median_" + name + "_s", stats::median(per_iter)});
        s.push_back({"p95_" + name + "_s", stats::p95(per_iter)});
        report.phases.push_back({name, stats::median(per_iter), stats::p95(per_iter)});
    }
    report.phases.push_back({"step", med, stats::p95(mean_step)});

    // Imbalance: per iteration the busiest rank's busy time over the mean (max / mean).
    std::vector<double> imbalance(un, kNaN);
    for (std::size_t i = 0; i < un; ++i) {
        const double avg = sums[un + i] / ranks;
        if (avg > 0) imbalance[i] = maxima[un + i] / avg;
    }
    report.imbalance_median = stats::median(imbalance);
    report.imbalance_p95 = stats::p95(imbalance);
    s.push_back({"imbalance_median", report.imbalance_median});
    s.push_back({"imbalance_p95", report.imbalance_p95});
    // Stragglers: ranks whose mean busy time exceeds the mean over ranks by the threshold. Each
    // rank's mean reaches rank 0 only (N doubles there, one per rank elsewhere).
    my_busy = n > 0 ? my_busy / static_cast<double>(n) : kNaN;
    std::vector<double> busy_means(rank == 0 ? static_cast<std::size_t>(size) : 0);
    MPI_Gather(&my_busy, 1, MPI_DOUBLE, busy_means.data(), 1, MPI_DOUBLE, 0, comm_);
    const double kStragglerThreshold = stats::Stragglers{}.threshold; // the project's 5 %
    if (rank == 0 && n > 0) {
        const double overall = stats::mean(busy_means);
        for (int r = 0; r < size; ++r)
            if (overall > 0 &&
                busy_means[static_cast<std::size_t>(r)] > overall * (1.0 + kStragglerThreshold))
                report.stragglers.push_back(r);
    }
    s.push_back({"straggler_ranks", join_ranks(report.stragglers)});
    s.push_back({"straggler_threshold", kStragglerThreshold});
    // Compatibility with readers of the first schema revision.
    double my_mean = stats::mean(step_seconds_), lo = my_mean, hi = my_mean, avg = 0;
    MPI_Allreduce(&my_mean, &lo, 1, MPI_DOUBLE, MPI_MIN, comm_);
    MPI_Allreduce(&my_mean, &hi, 1, MPI_DOUBLE, MPI_MAX, comm_);
    MPI_Allreduce(&my_mean, &avg, 1, MPI_DOUBLE, MPI_SUM, comm_);
    avg /= size;
    s.push_back({"rank_step_imbalance", avg > 0 ? (hi - lo) / avg : 0.0});

    // Model FLOP utilisation, only where the peak table knows the device.
    report.device_name = info.device_name;
    report.precision = info.precision;
    double flops_per_device = kNaN;
    if (token_workload && info.flops_per_token > 0 && measured_s > 0) {
        flops_per_device = info.flops_per_token * total_tokens / measured_s / size;
        s.push_back({"flops_per_token", info.flops_per_token});
    } else if (med > 0 && info.macs_per_sample > 0) {
        flops_per_device =
            stats::training_flops_per_sample(info.macs_per_sample) * info.global_batch / med / size;
    }
    if (!std::isnan(flops_per_device)) {
        s.push_back({"model_flops_per_s_per_device", flops_per_device});
        report.mfu =
            stats::model_flops_utilization(flops_per_device, info.device_name, info.precision);
        if (report.mfu) {
            // The peak it divides by and why that one (bf16-mixed: the bf16 tensor-core peak).
            s.push_back({"mfu", *report.mfu});
            s.push_back({"mfu_peak_flops", *stats::peak_flops(info.device_name, info.precision)});
            s.push_back(
                {"mfu_peak_basis", std::string(stats::precision_math(info.precision)->basis)});
        }
    }

    // Energy over the measured iterations, all ranks (NVML counters), when available.
    double energy = kNaN;
    if (info.telemetry && n > 0) {
        energy = info.telemetry->energy_joules_between(t_start_.front(),
                                                       t_start_[n - 1] + step_seconds_[n - 1]);
    }
    double total_energy = 0;
    MPI_Allreduce(&energy, &total_energy, 1, MPI_DOUBLE, MPI_SUM, comm_); // NaN propagates
    s.push_back({"energy_j", total_energy});
    s.push_back({"energy_per_iteration_j", n ? total_energy / n : kNaN});
    s.push_back({"energy_per_sample_j", n ? total_energy / (n * info.global_batch) : kNaN});
    if (!std::isnan(total_energy)) {
        report.energy_j = total_energy;
        report.energy_per_iteration_j = total_energy / n;
        report.energy_per_sample_j = total_energy / (n * info.global_batch);
    }

    double peak_rss = 0, peak_dev = std::isnan(peak_device_) ? -1 : peak_device_;
    MPI_Allreduce(&peak_rss_, &peak_rss, 1, MPI_DOUBLE, MPI_MAX, comm_);
    MPI_Allreduce(MPI_IN_PLACE, &peak_dev, 1, MPI_DOUBLE, MPI_MAX, comm_);
    s.push_back({"peak_host_rss_bytes", peak_rss});
    s.push_back({"peak_device_allocated_bytes", peak_dev < 0 ? kNaN : peak_dev});
    double peak_tensor = std::isnan(peak_tensor_) ? -1 : peak_tensor_;
    MPI_Allreduce(MPI_IN_PLACE, &peak_tensor, 1, MPI_DOUBLE, MPI_MAX, comm_);
    s.push_back({"peak_host_tensor_bytes", peak_tensor < 0 ? kNaN : peak_tensor});
    report.peak_host_tensor_bytes = peak_tensor;
    report.peak_host_rss_bytes = peak_rss;
    report.peak_device_bytes = peak_dev;
    if (have_epoch_) {
        s.push_back({"epochs_completed", static_cast<std::int64_t>(last_epoch_.epoch + 1)});
        s.push_back({"final_val_accuracy", last_epoch_.val_accuracy});
        s.push_back({"final_val_loss", last_epoch_.val_loss});
        s.push_back({"final_val_perplexity", last_epoch_.val_perplexity});
        s.push_back({"final_train_loss", last_epoch_.train_loss});
    }
    s.push_back({"nonfinite_skipped_steps", static_cast<std::int64_t>(nonfinite_skipped_)});
    // The tool's own cost: the run file's flushes on the rank that spent longest in them.
    const io::FlushStats& fs = file_.flush_stats();
    double flush[5] = {fs.total_s, fs.max_s, static_cast<double>(fs.syncs), fs.wait_total_s,
                       fs.sync_total_s};
    MPI_Allreduce(MPI_IN_PLACE, flush, 5, MPI_DOUBLE, MPI_MAX, comm_);
    s.push_back({"flushes", static_cast<std::int64_t>(fs.flushes)});
    s.push_back({"flush_syncs", static_cast<std::int64_t>(flush[2])});
    s.push_back({"flush_total_s", flush[0]});
    s.push_back({"flush_max_s", flush[1]});
    s.push_back(
        {"flush_mean_s", fs.flushes > 0 ? flush[0] / static_cast<double>(fs.flushes) : kNaN});
    s.push_back({"flush_sync_total_s", flush[4]});
    s.push_back({"flush_wait_total_s", flush[3]});
    // The harness's device->host reads per measured iteration, the largest over ranks.
    const auto measured = static_cast<double>(step_seconds_.size());
    const double syncs = measured > 0 ? host_syncs_ / measured : kNaN;
    double syncs_max = std::isnan(syncs) ? -1 : syncs;
    MPI_Allreduce(MPI_IN_PLACE, &syncs_max, 1, MPI_DOUBLE, MPI_MAX, comm_);
    s.push_back({"host_syncs_per_iteration", syncs_max < 0 ? kNaN : syncs_max});
    file_.set_attributes(schema::kSummary, s);
    if (rank == 0) core::log::info() << "summary\n" << stats::format_summary_table(report);
}

} // namespace trainscope::train
