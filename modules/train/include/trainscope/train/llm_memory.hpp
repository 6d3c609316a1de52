// Per-rank memory plan of an LLM fine-tuning run, by arithmetic before anything is allocated: what
// --dry-run prints so a user sees, before submitting, whether a method fits the device (e.g. that
// full fine-tuning of Llama-3-8B needs dist.zero >= 1 on 80 GB cards). Every figure is bytes per
// rank; activations count the tensors autograd keeps (formula in llm_memory.cpp). Under dist.zero=3
// (FSDP) weights, gradients and optimizer state are the rank's padded 1/N shards, and the plan adds
// what is full-size only while a unit is in flight: its gathered weights and its gradient.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainscope/distributed/options.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/train/llm_options.hpp"

namespace trainscope::train {

struct LlmMemoryInputs {
    models::LlamaConfig config;
    LlmMethod method = LlmMethod::Lora;
    models::LoraOptions lora;
    bool qat_lora = false;
    torch::ScalarType param_dtype =
        torch::kBFloat16; // weights (and AdamW state, as torch keeps it)
    torch::ScalarType compute_dtype = torch::kBFloat16; // activations
    int zero = 0;
    int world_size = 1;
    bool reshard_after_forward =
        true;                     // dist.zero=3: false keeps every unit gathered until backward
    bool prefetch = true;         // dist.zero=3: the next unit is gathered during the current
    std::int64_t micro_batch = 1; // sequences per micro-batch per rank (DPO: pairs)
    std::int64_t seq_len = 2048;
    bool activation_checkpointing = false;
    std::int64_t loss_chunks = 1; // llm.loss_chunks: the logits exist one chunk at a time
    bool packed = false;          // llm.packed: attention takes a per-pack mask ([B, 1, T, T])
    bool kv_expanded = false;     // attention_kernel expands the KV heads (packed GQA on a GPU)
    // One cuBLAS workspace (dist::cublas_workspace_bytes; 0 on the CPU). The plan counts two:
    // the step's thread runs the forward's matmuls, autograd's device thread the backward's.
    double cublas_workspace_bytes = 0;
    // The gradient synchronizer's own buffers at dist.zero=0 (comm_buffer_bytes): the backend
    // ("mpi" widens 16-bit gradients to float32 on the wire) and dist.compress.
    std::string backend = "nccl";
    dist::CompressionOptions compression;
};

struct LlmMemoryPlan {
    LlmMethod method = LlmMethod::Lora;
    int zero = 0;
    std::int64_t parameters = 0;           // whole model
    std::int64_t trainable_parameters = 0; // adapters or all weights
    double frozen_weight_bytes = 0;        // base weights kept dense (bf16/fp32), not trained
    double nf4_weight_bytes = 0;           // QLoRA: NF4 projections incl. double-quantised scales
    double trainable_weight_bytes = 0;
    double gradient_bytes = 0;
    double optimizer_state_bytes = 0; // AdamW exp_avg + exp_avg_sq
    double activation_bytes = 0;      // kept for backward (+ one layer's recompute with AC)
    double logits_bytes = 0;          // logits in the compute dtype + fp32 log-softmax for the loss
    // dist.zero=3 only (0 otherwise): the full weights of the units gathered at once, in their
    // stored dtypes (the largest unit x 2 with dist.prefetch, x 1 without; the whole model with
    // dist.reshard_after_forward=false; + the tied embedding, gathered throughout), and the full
    // gradient of the largest trainable unit during its backward (before its reduce-scatter).
    // dist.zero=2: unit_gradient_bytes is the full flat gradient, which backward fills before
    // the reduce-scatter (beside the persistent shard).
    double gathered_weight_bytes = 0;
    double unit_gradient_bytes = 0;
    double workspace_bytes = 0; // GPU: LibTorch's cuBLAS workspaces (2 x one, see the inputs)
    // dist.zero=0 at world size > 1: what the gradient synchronizer keeps beside the gradients
    // (dist::synchronizer_buffer_bytes: MPI's float32 wire copy of 16-bit gradients,
    // dist.compress's 16-bit copy or PowerSGD's error feedback, P and Q).
    double comm_buffer_bytes = 0;
    double total_bytes() const;
};

LlmMemoryPlan plan_llm_memory(const LlmMemoryInputs& in);

// A table of the given plans (GiB per rank) with a verdict against `device_bytes` (0: no verdict);
// the row at index `this_run` (if any) is marked as the configured run.
std::string format_memory_plans(const std::vector<LlmMemoryPlan>& plans, double device_bytes,
                                int this_run = -1);

// Projection weights of all decoder layers (what QLoRA stores in NF4).
std::int64_t llama_projection_parameters(const models::LlamaConfig& config);

} // namespace trainscope::train
