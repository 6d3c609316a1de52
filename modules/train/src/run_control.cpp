// Run control: stop signals, the watchdog thread and the per-iteration agreement of all ranks.
#include "trainscope/train/run_control.hpp"

#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/prof/phase_timer.hpp"

namespace trainscope::train {
namespace stop_signals {
namespace {

volatile std::sig_atomic_t g_first = 0;
std::atomic<bool> g_installed{false};

extern "C" void on_stop_signal(int sig) {
    if (g_first != 0) _exit(128 + sig); // the second signal: no more grace
    g_first = sig;
}

} // namespace

void install() {
    if (g_installed.exchange(true)) return;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; // blocking calls (MPI, file I/O) continue after the handler
    for (int sig : {SIGTERM, SIGUSR1, SIGINT})
        sigaction(sig, &sa, nullptr);
}

int received() {
    return static_cast<int>(g_first);
}

} // namespace stop_signals

FaultInjection FaultInjection::from_environment() {
    FaultInjection f;
    const char* env = std::getenv("TRAINSCOPE_FAULT");
    if (!env || !*env) return f;
    const std::string text = env;
    auto bad = [&] {
        return core::ConfigError(
            "TRAINSCOPE_FAULT='" + text +
            "' (a test hook): expected "
            "stall|nonfinite|checkpoint_stall|flush_stall|resolve_stall:rank=R:"
            "iteration=I");
    };
    std::istringstream in(text);
    std::string part;
    std::getline(in, part, ':');
    if (part == "stall")
        f.kind = Kind::Stall;
    else if (part == "nonfinite")
        f.kind = Kind::NonFinite;
    else if (part == "checkpoint_stall")
        f.kind = Kind::CheckpointStall;
    else if (part == "flush_stall")
        f.kind = Kind::FlushStall;
    else if (part == "resolve_stall")
        f.kind = Kind::ResolveStall;
    else
        throw bad();
    while (std::getline(in, part, ':')) {
        const auto eq = part.find('=');
        if (eq == std::string::npos) throw bad();
        const std::string key = part.substr(0, eq);
        char* end = nullptr;
        const long long v = std::strtoll(part.c_str() + eq + 1, &end, 10);
        if (end == part.c_str() + eq + 1 || *end) throw bad();
        if (key == "rank")
            f.rank = static_cast<int>(v);
        else if (key == "iteration")
            f.iteration = v;
        else
            throw bad();
    }
    if (f.rank < 0 || f.iteration < 0) throw bad();
    return f;
}

torch::Tensor nonfinite_flag(const torch::Tensor& loss, const std::vector<torch::Tensor>& params,
                             const std::vector<torch::Tensor>& sums) {
    // Float64 values whose total is NaN/Inf iff some element is: the loss, one marker for all
    // gradients (dist::nonfinite_marker: a multi-tensor check, not a kernel per parameter) and
    // the shards' markers.
    std::vector<torch::Tensor> parts, grads;
    torch::Device device = torch::kCPU;
    if (loss.defined()) {
        parts.push_back(loss.detach().to(torch::kFloat64).reshape({1}));
        device = loss.device();
    }
    for (const auto& p : params)
        if (p.grad().defined()) {
            grads.push_back(p.grad());
            device = p.grad().device();
        }
    if (!grads.empty()) parts.push_back(dist::nonfinite_marker(grads, device).reshape({1}));
    for (const auto& t : sums)
        if (t.defined()) {
            parts.push_back(t.to(torch::kFloat64).reshape({1}));
            device = t.device();
        }
    if (parts.empty()) return torch::zeros({}, torch::dtype(torch::kFloat64).device(device));
    return torch::cat(parts).sum().isfinite().logical_not().to(torch::kFloat64);
}

[[noreturn]] void throw_nonfinite(std::int64_t iteration, std::int64_t found_after) {
    std::string when;
    if (found_after > iteration)
        when = "; found when the losses were resolved after iteration " +
               std::to_string(found_after) +
               " (the check runs on the device and is read with "
               "the deferred losses, so iterations " +
               std::to_string(iteration + 1) + ".." + std::to_string(found_after) +
               " ran on non-finite values; no checkpoint holds them)";
    core::NumericalError e("iteration " + std::to_string(iteration) +
                           ": the loss or a gradient is NaN/Inf on at least one rank "
                           "(run.nonfinite=abort" +
                           when +
                           "). Lower train.lr, add warm-up "
                           "(train.warmup_iters), use fp32 or bf16, or set run.nonfinite=skip to "
                           "drop such steps");
    e.set_collective(true); // every rank took this decision together
    throw e;
}

void inject_fault(const RunControl& control, std::int64_t iteration, torch::Tensor& loss) {
    const FaultInjection& f = control.fault();
    if (f.fires(FaultInjection::Kind::Stall, control.rank(), iteration))
        for (;;)
            std::this_thread::sleep_for(std::chrono::seconds(1));
    if (f.fires(FaultInjection::Kind::NonFinite, control.rank(), iteration))
        loss = loss * std::numeric_limits<double>::quiet_NaN();
}

namespace {

// Hangs forever once `kind` is armed for this rank and the run reached its iteration.
void stall_from(const RunControl& control, FaultInjection::Kind kind, std::int64_t last_iteration) {
    const FaultInjection& f = control.fault();
    if (f.kind == kind && f.rank == control.rank() && last_iteration >= f.iteration)
        for (;;)
            std::this_thread::sleep_for(std::chrono::seconds(1));
}

} // namespace

void inject_flush_fault(const RunControl& control, std::int64_t last_iteration) {
    stall_from(control, FaultInjection::Kind::FlushStall, last_iteration);
}

void inject_resolve_fault(const RunControl& control, std::int64_t last_iteration) {
    stall_from(control, FaultInjection::Kind::ResolveStall, last_iteration);
}

RunControlOptions RunControlOptions::from_config(const core::Config& c) {
    RunControlOptions o;
    o.iteration_timeout_s = c.get_float("run.iteration_timeout");
    o.peer_timeout_s = c.get_float("dist.timeout");
    o.skip_nonfinite = c.get_string("run.nonfinite") == "skip";
    o.checkpointing = !c.get_string("checkpoint.dir").empty();
    const std::string every = c.get_string("checkpoint.every");
    const auto bad = [&] {
        return core::ConfigError(
            "checkpoint.every = '" + every +
            "': expected N (iterations, e.g. 500), Nmin (minutes, e.g. 30min) or 0 (only when "
            "stopped by a signal)");
    };
    std::size_t used = 0;
    double value = 0;
    try {
        value = std::stod(every, &used);
    } catch (const std::exception&) {
        throw bad();
    }
    std::string unit = every.substr(used);
    while (!unit.empty() && unit.front() == ' ')
        unit.erase(0, 1);
    if (!std::isfinite(value) || value < 0) throw bad();
    if (unit.empty()) {
        if (value != std::floor(value)) throw bad();
        o.checkpoint_every_iters = static_cast<std::int64_t>(value);
    } else if (unit == "min") {
        if (value <= 0) throw bad();
        o.checkpoint_every_s = value * 60.0;
    } else {
        throw bad();
    }
    if (!o.checkpointing && (o.checkpoint_every_iters > 0 || o.checkpoint_every_s > 0))
        throw core::ConfigError("checkpoint.every = '" + every +
                                "' needs checkpoint.dir: set the directory the checkpoints go to");
    return o;
}

RunControl::RunControl(const RunControlOptions& options, MPI_Comm world,
                       const prof::PhaseTimer* timer, dist::Communicator* comm,
                       std::vector<dist::Communicator*> others)
    : o_(options), world_(world), timer_(timer), comm_(comm),
      last_checkpoint_(std::chrono::steady_clock::now()) {
    if (comm_) polled_.push_back(comm_);
    for (dist::Communicator* c : others)
        if (c) polled_.push_back(c);
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
    fault_ = FaultInjection::from_environment();
    stop_signals::install();
    if (o_.iteration_timeout_s > 0 || o_.peer_timeout_s > 0 || !polled_.empty())
        watchdog_ = std::thread([this] { watch(); });
}

RunControl::~RunControl() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        quit_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
}

void RunControl::begin_iteration(std::int64_t iteration) {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
    iteration_ = iteration;
    activity_.clear();
    since_ = std::chrono::steady_clock::now();
}

void RunControl::begin_activity(const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
    activity_ = what;
    since_ = std::chrono::steady_clock::now();
}

void RunControl::idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
}

void RunControl::begin_peer_wait(const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    peer_wait_ = what;
    peer_wait_since_ = std::chrono::steady_clock::now();
}

void RunControl::end_peer_wait() {
    std::lock_guard<std::mutex> lock(mutex_);
    peer_wait_ = nullptr;
}

Verdict RunControl::agree(std::int64_t iteration, bool local_nonfinite) {
    int flags[3] = {local_nonfinite ? 1 : 0, stop_signals::received(), 0};
    if (o_.checkpointing) {
        if (o_.checkpoint_every_iters > 0 && (iteration + 1) % o_.checkpoint_every_iters == 0)
            flags[2] = 1;
        // Wall-clock periods are rank 0's: clocks and progress differ slightly between ranks.
        if (o_.checkpoint_every_s > 0 && rank_ == 0 &&
            std::chrono::duration<double>(std::chrono::steady_clock::now() - last_checkpoint_)
                    .count() >= o_.checkpoint_every_s)
            flags[2] = 1;
    }
    // Control traffic goes through the run's communicator (host-side on every backend); tests
    // without one use the world directly.
    std::vector<double> all(flags, flags + 3);
    if (comm_)
        comm_->allreduce_host(all, dist::ReduceOp::Max);
    else
        MPI_Allreduce(MPI_IN_PLACE, all.data(), 3, MPI_DOUBLE, MPI_MAX, world_);
    Verdict v;
    v.nonfinite = all[0] != 0;
    v.signal = static_cast<int>(all[1]);
    v.stop = all[1] != 0;
    v.checkpoint = all[2] != 0 || (v.stop && o_.checkpointing);
    return v;
}

void RunControl::checkpoint_written() {
    last_checkpoint_ = std::chrono::steady_clock::now();
}

void RunControl::abort_world(const std::string& why) {
    core::log::error() << why;
    dist::MpiRuntime::abort(static_cast<int>(core::ErrorKind::Distributed));
}

void RunControl::watch() {
    using namespace std::chrono;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!quit_) {
        wake_.wait_for(lock, milliseconds(500));
        if (quit_) break;
        for (dist::Communicator* c : polled_) { // fixed after construction
            lock.unlock();
            const std::string failure = c->poll_async_error();
            lock.lock();
            if (!failure.empty())
                abort_world("watchdog: " + failure +
                            "; aborting the job so that no rank waits "
                            "forever");
        }
        if (peer_wait_ && o_.peer_timeout_s > 0 &&
            duration<double>(steady_clock::now() - peer_wait_since_).count() > o_.peer_timeout_s)
            abort_world(std::string(core::to_string(core::ErrorKind::Distributed)) + ": " +
                        core::peer_timeout_message(peer_wait_, o_.peer_timeout_s));
        if (!armed_ || o_.iteration_timeout_s <= 0) continue;
        const double waited = duration<double>(steady_clock::now() - since_).count();
        if (waited <= o_.iteration_timeout_s) continue;
        std::ostringstream why;
        why << std::fixed << std::setprecision(1) << "watchdog: ";
        if (activity_.empty()) {
            const char* phase = timer_ ? timer_->current_phase() : nullptr;
            why << "iteration " << iteration_ << " has run for " << waited
                << " s (run.iteration_timeout=" << o_.iteration_timeout_s << ") and this rank is "
                << (phase ? std::string("in phase '") + phase + "'" : std::string("between phases"))
                << ". Ranks stuck in 'comm_wait' wait for a peer: the rank reporting another phase "
                   "(or none, if it died) is the one that stalled. Aborting the job.";
        } else {
            why << activity_ << " has run for " << waited
                << " s (run.iteration_timeout=" << o_.iteration_timeout_s
                << ") on this rank. Aborting the job.";
        }
        core::log::error() << why.str();
        // Give the other ranks' watchdogs (armed at about the same time) a moment to report
        // where they are, so the log names the stalled rank, then end every rank.
        lock.unlock();
        std::this_thread::sleep_for(seconds(2));
        abort_world("watchdog: ending all " + std::to_string(size_) + " ranks (exit code 5)");
    }
}

} // namespace trainscope::train
