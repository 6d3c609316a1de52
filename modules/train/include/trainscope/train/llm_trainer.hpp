// LLM fine-tuning step (run.workload=llm), driven by the TrainingLoop: Llama with the configured
// method applied (full, LoRA, QLoRA, DPO, QAT), data parallel over the run's Communicator through
// one dist::DataParallelism (DDP, ZeRO-1/2 or FSDP, chosen once by parallelize_llm), gradient
// accumulation with torchtune's token normalisation, AdamW with cosine warm-up. Every phase timed,
// every iteration recorded with its token counts and method-specific values.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/data/text_batch.hpp"
#include "trainscope/data/tokenizer.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/llm_options.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/precision.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_control.hpp"
#include "trainscope/train/training_loop.hpp"

namespace trainscope::train {

// The model with its method applied, and what is trained.
struct LlmModel {
    models::LlamaForCausalLM model{nullptr};
    std::vector<std::string> trainable_names;
    std::vector<torch::Tensor> trainable;
    std::int64_t parameters = 0; // all model weights (NF4 ones counted as weights)
    std::int64_t trainable_parameters = 0;
    std::map<std::string, std::int64_t> projections; // kind ("linear", "lora", "nf4+lora") -> count
    // Set while units are still on the meta device (dist.zero=3 until FSDP shards them): gives
    // unit u memory, its values and the method's transform. Empty once the model is complete.
    std::function<void(int unit)> materialize_unit;
    std::string describe() const;
};

// Builds the Llama model on `device` in the policy's parameter dtype, one unit (embedding, layer,
// head) at a time: random init from a generator seeded by (seed, unit), so that the values do not
// depend on how the model is sharded, or the checkpoint's weights; then the method per unit: LoRA
// (lora, dpo), NF4 + LoRA (qlora), fake quantisation (qat, + LoRA with llm.qat.lora), nothing
// (full). Under dist.zero=3 the units stay on the meta device and parallelize_llm materialises
// each just before FSDP shards it, so no rank ever holds the whole model.
// world: the ranks building the model together (collective over it when options.checkpoint is
// set): one rank per node reads the checkpoint's files and the node's others get its bytes
// (issue 39); MPI_COMM_NULL: this process reads them itself.
LlmModel build_llm_model(const LlmOptions& options, const models::LlamaConfig& config,
                         const PrecisionPolicy& policy, torch::Device device, std::uint64_t seed,
                         MPI_Comm world = MPI_COMM_NULL);
// The trainable lists and projection counts of a complete model (build_llm_model and
// parallelize_llm call it).
void finish_llm_model(LlmModel& model);

// Parallelises the model once, as the configuration asks (dist.zero: 0 DDP with a local AdamW or
// SGD, 1-2 ZeRO, 3 FSDP; rank 0's values everywhere). The one place that knows the kinds: the
// trainer drives the result through dist::DataParallelism.
std::unique_ptr<dist::DataParallelism>
parallelize_llm(const LlmOptions& options, const OptimizerConfig& optimizer, bool loss_scaling,
                dist::Communicator& comm, LlmModel& model, std::size_t bucket_bytes,
                std::size_t first_bucket_bytes, const dist::CompressionOptions& compression);

struct LlmTrainerOptions {
    LlmOptions llm;
    PrecisionPolicy precision;
    torch::Device device{torch::kCPU};
    OptimizerConfig optimizer;   // train.optimizer, train.lr, train.weight_decay
    std::int64_t batch_size = 2; // sequences per micro-batch
    std::uint64_t seed = 42;
    int workers = 1, prefetch = 2; // collation threads and iterations built ahead (data.*)
    double bucket_bytes = 25.0 * 1024 * 1024;
    double first_bucket_bytes = 1.0 * 1024 * 1024;
    dist::CompressionOptions compression; // dist.compress (DDP buckets, ZeRO/FSDP reduce dtype)
    bool accounting = true;
};

// The held-out validation set (llm.val_fraction or llm.val_dataset.path) and the training items.
struct LlmSplit {
    std::vector<std::int64_t> train;             // dataset indices trained on; empty = all of them
    const data::TextDataset* val_data = nullptr; // null = no validation
    std::vector<std::int64_t> val;               // indices into *val_data
};

// Deterministic split of n samples: n_val of them (chosen by a Fisher-Yates shuffle seeded with
// `seed`, the same on every rank and every run with that seed) held out; both lists ascending and
// disjoint, together 0..n-1.
LlmSplit split_validation(std::int64_t n, std::int64_t n_val, std::uint64_t seed);

class LlmTrainer final : public TrainStep {
  public:
    LlmTrainer(const LlmTrainerOptions& options, LlmModel model, const data::TextDataset& data,
               const data::Tokenizer& tokenizer, dist::Communicator& comm, MPI_Comm world,
               LlmSplit split = {});
    ~LlmTrainer() override;
    // The workload's own /iterations columns (Recorder extra_columns).
    static std::vector<io::Column> extra_columns();
    const dist::GradientSynchronizer* synchronizer() const; // null unless DDP
    // Training FLOPs per token for MFU: forward 2N + backward 2N through all weights + 2
    // N_trainable for the weight gradients, plus attention (see llm_trainer.cpp).
    double flops_per_token() const;
    // Rank 0 writes the LoRA adapters as a PEFT adapter directory at `path`
    // (models::save_peft_adapter; base model = the checkpoint directory) and every rank returns
    // the path; "" when the method has no adapters.
    std::string save_adapters(const std::string& path);
    const LlmModel& model() const;
    // Collective: the full values of the trainable tensors in model().trainable_names order, as
    // CPU clones (gathered from the shards under dist.zero=3). For tests and exports.
    std::vector<torch::Tensor> trainable_values();
    // Faults and restarts: the checkpoint holds the trainable weights (LoRA adapters, or all
    // weights for full/QAT), the optimizer (or this rank's ZeRO shard), the loss scaler and the
    // RNG; frozen and NF4 weights are rebuilt from llm.init.
    void restore(const CheckpointManifest& m);

    // TrainStep
    std::int64_t iterations_per_epoch() const override;
    std::int64_t start_iteration() const override;
    void begin_epoch(std::int64_t epoch, std::int64_t skip) override;
    bool next_batch() override;
    void set_lr(double lr) override;
    StepResult step(std::int64_t iteration, prof::PhaseTimer& timer, RunControl* control) override;
    torch::Tensor nonfinite_flag(const StepResult& r) override;
    void prepare_apply(StepResult& r) override;
    bool apply(bool skip, double& optimizer_peak) override;
    void account(IterationValues& v) override;
    void resolve_accounting(std::int64_t iteration, IterationValues& v) override;
    void resolve(std::vector<DeferredStep>& steps) override;
    std::vector<int> metric_columns() const override;
    std::pair<double, double> evaluate() override;
    bool evaluates() const override;
    bool reports_perplexity() const override;
    std::string save_checkpoint(Checkpointer& checkpointer, std::int64_t next_iteration) override;
    std::string progress_suffix(const DeferredStep& d) const override;

  private:
    struct State;
    std::unique_ptr<State> s_;
};

} // namespace trainscope::train
