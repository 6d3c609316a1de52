// run.*, train.*, profile.warmup_iters and log.* options, and the registry of all modules' options.
#include "trainscope/train/options.hpp"

#include <algorithm>

#include "trainscope/data/options.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/io/options.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/prof/options.hpp"
#include "trainscope/prof/telemetry_options.hpp"
#include "trainscope/train/llm_options.hpp"
#include "trainscope/train/pipeline.hpp"

namespace trainscope::train {

void declare_options(core::OptionRegistry& r) {
    r.add_choice("run.workload", "cv", {"cv", "llm", "comm"},
                 "what to run: cv = image classification training; llm = Llama fine-tuning "
                 "(llm.method full/lora/qlora/dpo/qat); comm = communication benchmark "
                 "(allreduce/allgather/reduce-scatter/broadcast size sweep, written to /comm)");
    r.add_choice("run.strategy", "ddp-ds", {"ddp-ds", "ddp", "dp", "pipeline"},
                 "ddp-ds: DDP with a distributed sampler (1/N of the data per rank); ddp: every "
                 "rank iterates the whole training set (the studies' baseline); dp: one process "
                 "drives all its devices (nn.DataParallel; launch 1 rank); pipeline: the model's "
                 "layers split into pipeline.stages stages over ranks (GPipe micro-batches)");
    r.add_choice(
        "run.precision", "fp32", {"fp64", "fp32", "tf32", "fp16-mixed", "bf16-mixed", "bf16"},
        "fp64/fp32: plain; tf32: fp32 with TF32 tensor-core matmul and convolution (CUDA); "
        "fp16-mixed: fp32 weights, fp16 autocast and dynamic loss scaling; bf16-mixed: "
        "fp32 weights, bf16 autocast; bf16: bf16 weights and compute (run.workload=llm: bf16 "
        "unless set)");
    r.add_bool("run.deterministic", false,
               "deterministic algorithms (cuDNN/cuBLAS included; sets "
               "CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set). CPU: an operation without a "
               "deterministic implementation fails; CUDA: it warns instead (warn-only, as "
               "torch.use_deterministic_algorithms(True, warn_only=True): MobileNetV2's "
               "adaptive_avg_pool2d and nll_loss backward have none), so bitwise reproducibility "
               "is not guaranteed for those operations");
    r.add_bool("run.cudnn_benchmark", false,
               "let cuDNN time convolution algorithms and pick the fastest for each shape");
    r.add_int("dp.devices", 0,
              "run.strategy=dp: devices the process drives; 0 = every visible CUDA device (1 on "
              "CPU). On CPU, N > 1 makes N replicas in one process (same code path, no speed-up)",
              0, 64);
    r.add_bool("cv.channels_last", false, "NHWC (channels-last) weights and inputs");
    r.add_int("run.seed", 42, "seed for initialisation, shuffling and dropout", 0);
    r.add_choice("run.host_memory", "retain", {"retain", "release"},
                 "host malloc policy (glibc): retain = freed blocks up to 32 MiB stay in the heap "
                 "for the next iteration (no page faults on reuse); release = glibc defaults "
                 "(freed memory goes back to the OS, so every iteration faults it in again)");
    r.add_int("run.threads", 0,
              "intra-op CPU threads per rank; 0 = the CPUs the rank is bound to, or for an unbound "
              "rank the node's cores divided by its ranks (min 1)",
              0, 1024);
    r.add_int("train.epochs", 1, "passes over the training data", 1, 100000);
    r.add_int("train.max_iters", 0, "stop after this many iterations in total (0 = no cap)", 0);
    r.add_int("train.batch_size", 64, "samples per rank per iteration", 1, 1 << 20);
    r.add_choice("run.scaling", "none", {"none", "strong", "weak"},
                 "the scaling study this run is a point of (jobscripts/sweep sets it): strong = "
                 "run.global_batch samples per iteration split over the ranks; weak = "
                 "run.batch_per_rank samples per rank at every rank count; none = "
                 "train.batch_size / train.global_batch_size as given");
    r.add_int("run.global_batch", 0,
              "run.scaling=strong: samples per iteration over all ranks, the same at every point "
              "(must divide by the ranks; per micro-batch under llm.gradient_accumulation)",
              0, 1 << 30);
    r.add_int("run.batch_per_rank", 0,
              "run.scaling=weak: samples per rank per iteration, the same at every point", 0,
              1 << 20);
    r.add_int("train.global_batch_size", 0,
              "samples per iteration over all ranks (0 = train.batch_size x ranks); must divide "
              "evenly across the ranks",
              0);
    r.add_int("train.eval_batch_size", 256, "samples per rank per evaluation batch", 1, 1 << 20);
    r.add_bool("train.eval", true, "evaluate test-set loss and accuracy after every epoch");
    r.add_choice("train.optimizer", "sgd", {"sgd", "adamw"},
                 "optimizer (run.workload=llm: adamw unless set)");
    r.add_float("train.lr", 0.05, "base learning rate (run.workload=llm: 3e-4 unless set)", 0.0,
                100.0);
    r.add_float("train.momentum", 0.9, "SGD momentum", 0.0, 1.0);
    r.add_bool("train.nesterov", false, "SGD with Nesterov momentum");
    r.add_bool("train.fused_optimizer", true,
               "optimizer step through ATen's fused multi-tensor kernels (_fused_adamw_, "
               "_fused_sgd_), one launch per dtype; false = LibTorch's per-parameter loop");
    r.add_float("train.weight_decay", 4e-5,
                "weight decay (SGD: L2; AdamW: decoupled; run.workload=llm: 0.01 unless set)", 0.0,
                1.0);
    r.add_choice("train.schedule", "cosine", {"constant", "step", "cosine"},
                 "learning-rate schedule after warm-up, per iteration");
    r.add_int("train.warmup_iters", 0, "iterations of linear learning-rate warm-up", 0);
    r.add_int("train.step_epochs", 30, "step schedule: epochs between decays", 1);
    r.add_float("train.gamma", 0.1, "step schedule: decay factor", 0.0, 1.0);
    r.add_float("train.min_lr", 0.0, "cosine schedule: final learning rate", 0.0, 100.0);
    r.add_bool("profile.accounting", true,
               "per-iteration accounting in /iterations: memory counters, model-state bytes and "
               "per-bucket gradient traffic (off only to measure its own cost)");
    r.add_int("profile.warmup_iters", 5,
              "first iterations left out of /summary statistics (still recorded)", 0);
    // Faults and pre-emption (run_control.hpp, checkpoint.hpp).
    r.add_float("run.iteration_timeout", 1800,
                "seconds one iteration (or an evaluation pass, or a checkpoint write) may take "
                "before the watchdog aborts the job, naming the rank and phase (0 = no watchdog)",
                0.0, 1e7);
    r.add_choice("run.nonfinite", "abort", {"abort", "skip"},
                 "a NaN/Inf loss or gradient on any rank: abort = stop the run (exit 6, file "
                 "status failed; checked on the device, read with the deferred losses, so no "
                 "host sync per step); skip = drop that optimizer step on every rank and count "
                 "it (/iterations/nonfinite_skipped; one host read per step). fp16-mixed: the "
                 "loss scaler handles inf/NaN gradients itself");
    r.add_string("checkpoint.dir", "",
                 "directory for checkpoints (shared by all ranks; empty = no checkpoints); "
                 "--resume continues from its newest complete one");
    r.add_string("checkpoint.every", "0",
                 "checkpoint period: N (iterations) or Nmin (minutes of wall time, decided on "
                 "rank 0); 0 = only when stopped by SIGTERM/SIGUSR1");
    r.add_int("checkpoint.keep", 2, "complete checkpoints kept (older ones are deleted)", 1, 1000);
    r.add_int("log.every", 20, "rank 0 prints progress every this many iterations (0 = never)", 0);
    r.add_choice("log.level", "info", {"debug", "info", "warn", "error"},
                 "least severe level shown");
}

namespace {

struct WorkloadDefault {
    const char* workload;
    const char* key;
    const char* value;
};

// torchtune's LoRA/full fine-tuning recipes for what the CV defaults would get wrong.
constexpr WorkloadDefault kWorkloadDefaults[] = {
    {"llm", "train.optimizer", "adamw"},
    {"llm", "train.lr", "3e-4"},
    {"llm", "train.weight_decay", "0.01"},
    {"llm", "run.precision", "bf16"},
};

} // namespace

std::vector<std::string> apply_workload_defaults(core::Config& config) {
    std::vector<std::string> applied;
    const std::string workload = config.get_string("run.workload");
    for (const WorkloadDefault& d : kWorkloadDefaults)
        if (workload == d.workload && config.is_default(d.key)) {
            config.set(d.key, d.value);
            applied.push_back(std::string(d.key) + "=" + d.value);
        }
    return applied;
}

core::OptionRegistry all_options() {
    core::OptionRegistry r;
    declare_options(r);
    dist::declare_options(r);
    data::declare_options(r);
    models::declare_options(r);
    io::declare_options(r);
    prof::declare_options(r);
    prof::declare_telemetry_options(r);
    declare_pipeline_options(r);
    declare_llm_options(r);
    return r;
}

std::int64_t RunLength::total_iterations(std::int64_t per_epoch) const {
    const std::int64_t all = per_epoch * epochs;
    return max_iters > 0 ? std::min(all, max_iters) : all;
}

TrainConfig read_train_config(const core::Config& c) {
    TrainConfig t;
    t.length.epochs = c.get_int("train.epochs");
    t.length.max_iters = c.get_int("train.max_iters");
    t.optimizer.kind = c.get_string("train.optimizer");
    t.optimizer.lr = c.get_float("train.lr");
    t.optimizer.momentum = c.get_float("train.momentum");
    t.optimizer.nesterov = c.get_bool("train.nesterov");
    t.optimizer.fused = c.get_bool("train.fused_optimizer");
    t.optimizer.weight_decay = c.get_float("train.weight_decay");
    t.schedule.kind = c.get_string("train.schedule");
    t.schedule.warmup_iters = c.get_int("train.warmup_iters");
    t.schedule.gamma = c.get_float("train.gamma");
    t.schedule.min_lr = c.get_float("train.min_lr");
    t.schedule.step_epochs = c.get_int("train.step_epochs");
    t.eval = c.get_bool("train.eval");
    t.eval_batch_size = c.get_int("train.eval_batch_size");
    t.seed = static_cast<std::uint64_t>(c.get_int("run.seed"));
    t.accounting = c.get_bool("profile.accounting");
    return t;
}

} // namespace trainscope::train
