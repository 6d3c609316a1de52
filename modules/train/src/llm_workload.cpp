// run.workload=llm: Llama fine-tuning (full, LoRA, QLoRA, DPO, QAT). Owns the LLM options, the
// tokenizer and text dataset, the model with its method applied, the LlmTrainer (the
// TrainingLoop's step), the memory plan of every method, the plan text, /plan and the PEFT adapter
// directory written when training ends.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/text_dataset.hpp"
#include "trainscope/data/tokenizer.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/device.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/io/schema.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/llm_memory.hpp"
#include "trainscope/train/llm_options.hpp"
#include "trainscope/train/llm_trainer.hpp"
#include "workloads_internal.hpp"

namespace trainscope::train {

namespace schema = io::schema;
namespace {

class LlmWorkload final : public Workload {
  public:
    explicit LlmWorkload(const RunEnvironment& env)
        : Workload(env), l_(LlmOptions::from_config(env.cfg, env.train)) {
        if (env.layout.strategy != Strategy::DdpDs)
            throw core::ConfigError("run.strategy=" + std::string(to_string(env.layout.strategy)) +
                                    " is for run.workload=cv; LLM fine-tuning is data "
                                    "parallel over ranks (each rank its own shard, "
                                    "optionally dist.zero): set run.strategy=ddp-ds");
    }

    WorkloadKind kind() const override { return WorkloadKind::Llm; }
    std::string precision() const override { return l_.precision; } // bf16 unless set
    std::int64_t gradient_accumulation() const override { return l_.gradient_accumulation; }

    void claim_outputs(const std::string& run_file) override {
        if (!l_.adapters_beside_run_file || !uses_lora(l_)) return;
        // Written at the very end of the run: refuse an existing file now, as the run file is.
        l_.save_adapters = adapter_dir_beside(run_file);
        dist::agree_on_errors(env_.world, [&] {
            if (env_.topo.rank == 0)
                check_adapter_dir(l_.save_adapters, "auto", env_.cfg.get_bool("output.overwrite"),
                                  run_file);
        });
    }

    void build() override;
    std::string plan_text() const override { return plan_text_; }
    std::vector<io::Attribute> plan_attributes() const override;

  protected:
    TrainStep* train_step() override { return trainer_.get(); }
    dist::Communicator* communicator() override { return comm_.get(); }
    std::vector<io::Column> extra_columns() const override { return LlmTrainer::extra_columns(); }
    std::vector<std::size_t> bucket_bytes() const override {
        const dist::GradientSynchronizer* sync = trainer_->synchronizer();
        return sync ? sync->bucket_bytes() : std::vector<std::size_t>{};
    }
    void describe_run(Recorder::RunInfo& info) const override {
        info.global_batch = static_cast<double>(env_.layout.global_batch());
        info.flops_per_token = trainer_->flops_per_token();
    }
    std::string start_message(const std::string& file) const override {
        return "fine-tuning (" + std::string(to_string(l_.method)) + ") " +
               std::to_string(
                   env_.train.length.total_iterations(trainer_->iterations_per_epoch())) +
               " iterations on " + std::to_string(env_.topo.world_size) + " rank(s), " +
               std::to_string(env_.layout.global_batch()) + " sequences per step, writing " + file;
    }
    void after_training(io::RunFile& file) override {
        // Rank 0 writes; agreeing first keeps a failed write from leaving the other ranks in the
        // collective attribute write below.
        std::string adapters;
        dist::agree_on_errors(env_.world,
                              [&] { adapters = trainer_->save_adapters(l_.save_adapters); });
        // The held-out samples (dataset line / element indices), for re-evaluating elsewhere.
        if (l_.val_fraction > 0)
            file.write_vector(schema::kPlanValIndices,
                              std::vector<double>(split_.val.begin(), split_.val.end()), "1");
        if (adapters.empty()) return;
        file.set_attributes(schema::kPlan, {{"adapters_dir", adapters}});
        core::log::info() << "LoRA adapters written to " << adapters
                          << "/ (PEFT: PeftModel.from_pretrained(model, dir))";
    }

  private:
    void split_validation_set(std::int64_t seed);
    void check_trained_tokens() const;
    std::int64_t train_samples() const {
        return split_.train.empty() ? text_->size()
                                    : static_cast<std::int64_t>(split_.train.size());
    }

    LlmOptions l_;
    std::unique_ptr<data::Tokenizer> tokenizer_;
    std::unique_ptr<data::TextDataset> text_;
    std::unique_ptr<data::TextDataset> val_text_; // llm.val_dataset.path
    LlmSplit split_;                              // training items and the validation set
    std::string val_description_;
    models::LlamaConfig llama_;
    models::SdpaChoice sdpa_; // the attention kernel of this run (build())
    std::unique_ptr<dist::Communicator> comm_;
    std::unique_ptr<LlmTrainer> trainer_;
    std::string dataset_description_, plan_text_;
    // Largest tensor peak of any rank while the model was built and parallelised (NaN: not
    // measured, i.e. the host tensor counter is off).
    double build_peak_bytes_ = std::numeric_limits<double>::quiet_NaN();
    LlmMemoryPlan memory_; // this run's method
};

// Every rank computes the same split from run.seed (no communication); errors are thrown on every
// rank alike.
void LlmWorkload::split_validation_set(std::int64_t seed) {
    const std::int64_t n = text_->size();
    if (l_.val_fraction > 0) {
        const auto n_val = static_cast<std::int64_t>(std::llround(l_.val_fraction * n));
        std::ostringstream f;
        f << l_.val_fraction;
        if (n_val == 0)
            throw core::ConfigError("llm.val_fraction = " + f.str() + " of " + std::to_string(n) +
                                    " samples (" + l_.dataset.path +
                                    ") holds out none: raise it to at least " +
                                    std::to_string(0.5 / static_cast<double>(n)) +
                                    ", use more data, or set 0 for no validation");
        if (n_val >= n)
            throw core::ConfigError("llm.val_fraction = " + f.str() + " holds out all " +
                                    std::to_string(n) + " samples of " + l_.dataset.path +
                                    ": nothing is left to train on; lower it");
        // Fewer training samples than ranks is the split's doing, not the dataset's: name the
        // option (the sampler would report "the dataset has 1 sample").
        if (n - n_val < env_.layout.world_size)
            throw core::ConfigError("llm.val_fraction = " + f.str() + " holds out " +
                                    std::to_string(n_val) + " of " + std::to_string(n) +
                                    " samples of " + l_.dataset.path + ", leaving " +
                                    std::to_string(n - n_val) + " to train on, fewer than the " +
                                    std::to_string(env_.layout.world_size) +
                                    " ranks: lower llm.val_fraction (at most " +
                                    std::to_string(static_cast<double>(n - env_.layout.world_size) /
                                                   static_cast<double>(n)) +
                                    "), use more data, or set llm.val_dataset.path instead");
        split_ = split_validation(n, n_val, static_cast<std::uint64_t>(seed));
        split_.val_data = text_.get();
        val_description_ = std::to_string(n_val) + " of " + std::to_string(n) +
                           " samples held out (llm.val_fraction " + f.str() + ", run.seed " +
                           std::to_string(seed) + ")";
    } else if (!l_.val_path.empty()) {
        data::TextDatasetOptions vo = l_.dataset;
        vo.path = l_.val_path;
        val_text_ = std::make_unique<data::TextDataset>(vo, *tokenizer_);
        if (val_text_->size() == 0)
            throw core::InputError("llm.val_dataset.path = '" + l_.val_path +
                                   "' holds no samples: name a non-empty file in "
                                   "llm.dataset.format, or leave it empty");
        split_.val_data = val_text_.get();
        split_.val.resize(static_cast<std::size_t>(val_text_->size()));
        std::iota(split_.val.begin(), split_.val.end(), std::int64_t{0});
        val_description_ = std::to_string(val_text_->size()) + " samples of " + l_.val_path;
    }
}

// A set in which llm.max_seq_len cut every sample inside its masked prompt has no token to train
// or score on: training would divide 0 by 0 (NaN loss, yet "completed") and validation would
// report a NaN val_loss. Refused at the start, naming the shortest prompt and the option; a set
// where only some samples are cut trains (as torchtune does) with a warning.
void LlmWorkload::check_trained_tokens() const {
    auto check = [&](const data::TextDataset& d, const std::vector<std::int64_t>& items,
                     const std::string& what, const std::string& path) {
        std::int64_t empty = 0, shortest = -1, at = -1;
        const auto n = static_cast<std::int64_t>(items.empty() ? d.size() : items.size());
        for (std::int64_t k = 0; k < n; ++k) {
            const std::int64_t i = items.empty() ? k : items[static_cast<std::size_t>(k)];
            if (d.trained_tokens(i) > 0) continue;
            ++empty;
            if (shortest < 0 || d.prompt_tokens(i) < shortest) {
                shortest = d.prompt_tokens(i);
                at = i;
            }
        }
        if (empty == 0) return;
        const std::string len = std::to_string(l_.dataset.max_seq_len);
        const std::string fix = "raise llm.max_seq_len above " + std::to_string(shortest) +
                                (l_.dataset.train_on_input || d.is_preference()
                                     ? std::string()
                                     : ", or set llm.train_on_input=true to train on the prompts");
        if (empty == n)
            throw core::ConfigError(
                "llm.max_seq_len = " + len + " leaves no trained token in any of the " +
                std::to_string(n) + " " + what + " samples of " + path +
                ": every sample is cut inside its masked prompt (the shortest prompt, sample " +
                std::to_string(at) + ", is " + std::to_string(shortest) + " tokens); " + fix);
        core::log::warn() << what << " set: " << empty << " of " << n << " samples of " << path
                          << " have no trained token at llm.max_seq_len = " << len
                          << " (cut inside the prompt; the shortest such prompt, sample " << at
                          << ", is " << shortest << " tokens): they add no loss";
    };
    check(*text_, split_.train, "training", l_.dataset.path);
    if (split_.val_data != nullptr)
        check(*split_.val_data, split_.val, "validation",
              val_text_ ? l_.val_path : l_.dataset.path);
}

void LlmWorkload::build() {
    const core::Config& c = env_.cfg;
    const ParallelLayout& layout = env_.layout;
    const PrecisionPolicy& policy = env_.policy;
    dist::agree_on_errors(env_.world, [&] {
        tokenizer_ = data::load_tokenizer(l_.tokenizer);
        llama_ = resolve_llama_config(l_, tokenizer_->vocab_size());
        text_ = std::make_unique<data::TextDataset>(l_.dataset, *tokenizer_);
        split_validation_set(static_cast<std::int64_t>(env_.train.seed));
        check_trained_tokens();
        comm_ = dist::make_communicator(env_.dist.backend, env_.world, env_.device.device,
                                        env_.dist.timeout_s, {env_.dist.allreduce});
    });
    dataset_description_ =
        std::string(data::to_string(l_.dataset.format)) + " " + l_.dataset.path + " (" +
        std::to_string(text_->size()) + " samples" +
        (text_->truncated() ? ", " + std::to_string(text_->truncated()) + " truncated to " +
                                  std::to_string(l_.dataset.max_seq_len)
                            : std::string()) +
        ")";

    // The attention kernel this run's calls get (flash, efficient, math, ...) and whether the
    // KV heads are expanded for it (models::attention_kernel), asked of the dispatcher with probe
    // tensors on the run's device in its compute dtype.
    const torch::ScalarType compute =
        policy.autocast_dtype ? *policy.autocast_dtype : policy.param_dtype;
    sdpa_ =
        models::sdpa_choice(llama_, l_.dataset.max_seq_len, l_.packed, env_.device.device, compute);

    // The memory plan: every method for this model, batch and sequence length, per rank.
    LlmMemoryInputs mi;
    mi.config = llama_;
    mi.lora = l_.lora;
    mi.qat_lora = l_.qat_lora;
    mi.param_dtype = policy.param_dtype;
    mi.compute_dtype = policy.autocast_dtype ? *policy.autocast_dtype : policy.param_dtype;
    mi.world_size = layout.world_size;
    mi.micro_batch = layout.batch_per_rank;
    mi.seq_len = l_.dataset.max_seq_len;
    mi.activation_checkpointing = l_.activation_checkpointing;
    mi.loss_chunks = l_.loss_chunks;
    mi.packed = l_.packed;
    mi.kv_expanded = sdpa_.kv_expanded;
    mi.cublas_workspace_bytes = dist::cublas_workspace_bytes(env_.device.device);
    // Stage 3 rows with this run's dist.reshard_after_forward and dist.prefetch.
    mi.reshard_after_forward = l_.sharding.reshard_after_forward;
    mi.prefetch = l_.sharding.prefetch;
    // dist.zero=0 rows: the gradient synchronizer's buffers with this run's backend and
    // dist.compress (the zero-0 rows of other methods as if they ran with them too).
    mi.backend = env_.dist.backend;
    mi.compression = env_.dist.compression;
    std::vector<std::pair<LlmMethod, int>> rows; // (method, dist.zero)
    for (LlmMethod m :
         {LlmMethod::Full, LlmMethod::Lora, LlmMethod::Qlora, LlmMethod::Dpo, LlmMethod::Qat}) {
        for (int z : {0, 1, 2, 3})
            if (z == 0 || z == 3 || m == LlmMethod::Full) rows.emplace_back(m, z);
    }
    // The configured run is one of the rows, or appended last (e.g. QAT under dist.zero=1):
    // its index either way.
    auto found = std::find(rows.begin(), rows.end(),
                           std::make_pair(l_.method, dist::to_int(l_.sharding.zero)));
    const int this_run = static_cast<int>(found - rows.begin());
    if (found == rows.end()) rows.emplace_back(l_.method, dist::to_int(l_.sharding.zero));
    std::vector<LlmMemoryPlan> plans;
    for (const auto& [m, z] : rows) {
        mi.method = m;
        mi.zero = z;
        plans.push_back(plan_llm_memory(mi));
    }
    const LlmMemoryPlan mine = plans[static_cast<std::size_t>(this_run)];
    memory_ = mine;
    const bool cuda = env_.device.device.is_cuda();
    const double device_bytes =
        cuda ? prof::sample_memory(env_.device.device.index()).device_total_bytes : 80.0 * 1e9;

    std::ostringstream o;
    o << "trainscope plan (dry run: nothing is trained or written)\n"
      << "  workload      llm, method " << to_string(l_.method) << ", precision " << env_.precision
      << ", dist.zero " << dist::to_int(l_.sharding.zero) << "\n"
      << ranks_text() << "  gradients     " << compression_text() << "\n";
    o << "  model         Llama " << llama_.name << ": " << llama_.num_hidden_layers
      << " layers, hidden " << llama_.hidden_size << ", FFN " << llama_.intermediate_size
      << ", heads " << llama_.num_attention_heads << "/" << llama_.num_key_value_heads
      << " (q/kv), vocab " << llama_.vocab_size << ", " << llama_.num_parameters()
      << " parameters, "
      << (l_.checkpoint.empty() ? std::string("random init") : "weights from " + l_.checkpoint)
      << "\n"
      << "  tokenizer     " << tokenizer_->kind() << " " << l_.tokenizer << " ("
      << tokenizer_->vocab_size() << " ids)\n"
      << "  data          " << dataset_description_ << (l_.packed ? ", packed" : "")
      << "; max_seq_len " << l_.dataset.max_seq_len << "; " << pinning_text(cuda) << "\n"
      << "  validation    "
      << (val_description_.empty() ? std::string("none (llm.val_fraction, llm.val_dataset.path)")
                                   : val_description_ + ", after every epoch")
      << "\n"
      << "  batch         " << layout.batch_per_rank << " sequences per rank x "
      << l_.gradient_accumulation << " micro-batches x " << layout.world_size
      << " ranks = " << layout.global_batch() << " per optimizer step\n"
      << "  optimizer     " << env_.train.optimizer.kind << " lr " << env_.train.optimizer.lr
      << " weight_decay " << env_.train.optimizer.weight_decay << ", schedule "
      << env_.train.schedule.kind << "\n";
    if (uses_lora(l_)) {
        std::string t;
        for (const auto& x : l_.lora.targets)
            t += (t.empty() ? "" : ",") + x;
        o << "  lora          rank " << l_.lora.rank << ", alpha " << l_.lora.alpha << ", targets "
          << t << ": " << models::lora_parameter_count(llama_, l_.lora)
          << " trainable parameters\n";
    }
    o << "  memory/rank   by method (GiB per rank; activations: " << layout.batch_per_rank << " x "
      << l_.dataset.max_seq_len << " tokens"
      << (l_.activation_checkpointing ? ", activation checkpointing" : "") << "; fits: against "
      << std::fixed << std::setprecision(0) << device_bytes / 1e9 << " GB"
      << (cuda ? " (this device)" : " (an 80 GB H100/A100)") << ")\n"
      << format_memory_plans(plans, device_bytes, this_run)
      << "  zero 3        weights, grads, optim: this rank's 1/" << layout.world_size
      << " shards; gathered: the units in flight ("
      << (l_.sharding.reshard_after_forward
              ? (l_.sharding.prefetch ? "2 x the largest, dist.prefetch" : "the largest unit")
              : "the whole model, dist.reshard_after_forward=false")
      << "); unitgrad: one unit's gradient before its reduce-scatter (zero 2: the full flat "
         "gradient beyond the shard)\n"
      << "  this run      ~" << mib(mine.total_bytes()) << " per rank\n";
    plan_text_ = o.str();
    if (env_.dry_run) return;

    // The model (initial values from the seed per unit, the same on every rank; rank 0's values
    // broadcast by the trainer). The build's tensor peak on this rank is measured from here to the
    // parallelised model: under dist.zero=3 it is the shards and one unit, not the whole model.
    torch::manual_seed(static_cast<std::int64_t>(env_.train.seed));
    const int cuda_index = cuda ? env_.device.device.index() : -1;
    if (cuda)
        prof::reset_device_peaks(cuda_index);
    else
        prof::reset_host_tensor_peak();
    LlmModel model;
    dist::agree_on_errors(env_.world, [&] {
        model =
            build_llm_model(l_, llama_, policy, env_.device.device, env_.train.seed, env_.world);
    });
    core::log::info() << "model " << llama_.name << ": " << model.describe();
    LlmTrainerOptions t;
    t.llm = l_;
    t.precision = policy;
    t.device = env_.device.device;
    t.optimizer = env_.train.optimizer;
    t.batch_size = layout.batch_per_rank;
    t.seed = env_.train.seed;
    t.workers = static_cast<int>(c.get_int("data.workers"));
    t.prefetch = static_cast<int>(c.get_int("data.prefetch"));
    t.bucket_bytes = static_cast<double>(env_.dist.bucket_cap_bytes);
    t.first_bucket_bytes = static_cast<double>(env_.dist.first_bucket_cap_bytes);
    t.compression = env_.dist.compression;
    t.accounting = env_.train.accounting;
    // train.eval=false: the held-out samples stay out of training, unevaluated.
    LlmSplit validation = split_;
    if (!env_.train.eval) validation.val_data = nullptr;
    dist::agree_on_errors(env_.world, [&] {
        trainer_ = std::make_unique<LlmTrainer>(t, std::move(model), *text_, *tokenizer_, *comm_,
                                                env_.world, validation);
    });
    const double build_peak =
        cuda ? prof::device_allocated_peak_bytes(cuda_index) : prof::host_tensor_bytes().peak;
    if (std::isfinite(build_peak)) {
        core::log::info() << "model build: peak " << std::fixed << std::setprecision(1)
                          << build_peak / (1024.0 * 1024.0) << " MiB of tensors on this rank";
        double max = build_peak;
        MPI_Allreduce(MPI_IN_PLACE, &max, 1, MPI_DOUBLE, MPI_MAX, env_.world);
        build_peak_bytes_ = max;
    }
    if (env_.resumed) trainer_->restore(*env_.resumed);
}

std::vector<io::Attribute> LlmWorkload::plan_attributes() const {
    const ParallelLayout& layout = env_.layout;
    std::vector<io::Attribute> a = {
        {"workload", std::string(to_string(kind()))},
        {"method", std::string(to_string(l_.method))},
        {"precision", env_.precision},
        {"device", env_.device.device.str()},
        {"backend", env_.dist.backend},
        {"allreduce", comm_->allreduce_algorithm()},
        {"model", llama_.name},
        {"dataset", dataset_description_},
        {"dataset_format", std::string(data::to_string(l_.dataset.format))},
        {"dataset_path", l_.dataset.path},
        {"packed", std::int64_t{l_.packed}},
        {"max_seq_len", l_.dataset.max_seq_len},
        {"tokenizer", l_.tokenizer},
        // Token batches are pinned on every GPU run (data.pin_memory is not consulted).
        {"pin_memory", std::int64_t{env_.device.device.is_cuda()}},
        {"threads_per_rank", static_cast<std::int64_t>(env_.threads_per_rank)},
        {"batch_per_rank", layout.batch_per_rank},
        {"gradient_accumulation", l_.gradient_accumulation},
        {"global_batch", layout.global_batch()},
        {"train_samples", train_samples()},
        {"val_samples", static_cast<std::int64_t>(split_.val.size())},
        {"val_source", val_description_.empty() ? std::string("none") : val_description_},
        {"zero", std::int64_t{dist::to_int(l_.sharding.zero)}},
        {"activation_checkpointing", std::int64_t{l_.activation_checkpointing}},
        {"loss_chunks", l_.loss_chunks},
        {"sdpa_backend", sdpa_.backend + (sdpa_.kv_expanded ? " (kv heads expanded)" : "")},
        {"memory_estimate_bytes", memory_.total_bytes()},
        {"memory_plan_weight_bytes",
         memory_.frozen_weight_bytes + memory_.nf4_weight_bytes + memory_.trainable_weight_bytes},
        {"memory_plan_frozen_weight_bytes", memory_.frozen_weight_bytes},
        {"memory_plan_nf4_weight_bytes", memory_.nf4_weight_bytes},
        {"memory_plan_trainable_weight_bytes", memory_.trainable_weight_bytes},
        {"memory_plan_gradient_bytes", memory_.gradient_bytes},
        {"memory_plan_optimizer_state_bytes", memory_.optimizer_state_bytes},
        {"memory_plan_activation_bytes", memory_.activation_bytes},
        {"memory_plan_logits_bytes", memory_.logits_bytes},
        {"memory_plan_gathered_weight_bytes", memory_.gathered_weight_bytes},
        {"memory_plan_unit_gradient_bytes", memory_.unit_gradient_bytes},
        {"memory_plan_workspace_bytes", memory_.workspace_bytes},
        {"memory_plan_comm_buffer_bytes", memory_.comm_buffer_bytes}};
    const dist::StateShards shards = dist::state_shards(l_.sharding.zero, env_.layout.world_size);
    a.insert(a.end(), {{"memory_plan_weight_shards", shards.weight},
                       {"memory_plan_gradient_shards", shards.gradient},
                       {"memory_plan_optimizer_state_shards", shards.optimizer_state}});
    const std::vector<io::Attribute> compression = compression_attributes();
    a.insert(a.end(), compression.begin(), compression.end());
    if (trainer_) {
        const LlmModel& m = trainer_->model();
        std::string kinds;
        for (const auto& [k, n] : m.projections)
            kinds += (kinds.empty() ? "" : ",") + k + ":" + std::to_string(n);
        a.push_back({"iterations_per_epoch", trainer_->iterations_per_epoch()});
        a.push_back({"total_iterations",
                     env_.train.length.total_iterations(trainer_->iterations_per_epoch())});
        a.push_back({"parameters", m.parameters});
        a.push_back({"trainable_parameters", m.trainable_parameters});
        a.push_back({"projections", kinds});
        a.push_back({"flops_per_token", trainer_->flops_per_token()});
        if (std::isfinite(build_peak_bytes_)) a.push_back({"build_peak_bytes", build_peak_bytes_});
    }
    return a;
}

} // namespace

std::unique_ptr<Workload> make_llm_workload(const RunEnvironment& env) {
    return std::make_unique<LlmWorkload>(env);
}

} // namespace trainscope::train
