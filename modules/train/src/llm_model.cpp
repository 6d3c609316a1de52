// The LLM model as a run trains it: built with its fine-tuning method applied, split into
// training and validation items, and parallelised once (the only place that knows the
// data-parallel kinds).
#include <malloc.h>

#include <numeric>
#include <random>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/dist/fsdp.hpp"
#include "trainscope/dist/zero.hpp"
#include "trainscope/models/fake_quant.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/models/safetensors.hpp"
#include "trainscope/train/llm_trainer.hpp"
#include "trainscope/train/optimizer.hpp"

namespace trainscope::train {

std::string LlmModel::describe() const {
    std::ostringstream o;
    o << parameters << " parameters, " << trainable_parameters << " trainable";
    if (!projections.empty()) {
        o << "; projections:";
        for (const auto& [kind, n] : projections)
            o << " " << n << " " << kind;
    }
    return o.str();
}

LlmModel build_llm_model(const LlmOptions& o, const models::LlamaConfig& config,
                         const PrecisionPolicy& policy, torch::Device device) {
    LlmModel m;
    const auto options = torch::TensorOptions().dtype(policy.param_dtype).device(device);
    m.model = models::LlamaForCausalLM(config, options);
    if (!o.checkpoint.empty()) {
        const models::LoadReport r = models::load_hf_weights(*m.model, o.checkpoint);
        core::log::info() << "loaded " << r.tensors_loaded << " tensors ("
                          << r.bytes_read / (1024.0 * 1024.0) << " MiB) from " << o.checkpoint
                          << (r.tensors_derived ? ", skipped " + std::to_string(r.tensors_derived) +
                                                      " derivable (rotary caches, a tied head)"
                                                : std::string());
    }
    m.model->set_activation_checkpointing(o.activation_checkpointing);
    m.parameters = config.num_parameters();
    switch (o.method) {
    case LlmMethod::Full:
        break;
    case LlmMethod::Lora:
    case LlmMethod::Dpo:
        models::apply_lora(*m.model, o.lora);
        break;
    case LlmMethod::Qlora:
        models::quantize_nf4(*m.model, policy.param_dtype);
        models::apply_lora(*m.model, o.lora);
        break;
    case LlmMethod::Qat:
        models::apply_qat(*m.model, o.qat_group_size);
        if (o.qat_lora) models::apply_lora(*m.model, o.lora);
        models::set_qat_enabled(*m.model, o.qat_start_step == 0);
        break;
    }
    for (const auto& item : m.model->named_parameters(/*recurse=*/true))
        if (item.value().requires_grad()) {
            m.trainable_names.push_back(item.key());
            m.trainable.push_back(item.value());
            m.trainable_parameters += item.value().numel();
        }
    models::for_each_projection(
        *m.model, [&](torch::nn::Module&, const std::string&, const std::string&,
                      std::shared_ptr<models::ProjectionImpl> p) { ++m.projections[p->kind()]; });
    // Building and quantising freed large temporaries (the dense weights before NF4, the
    // checkpoint's mapped pages): hand them back to the OS so RSS shows what training holds.
    ::malloc_trim(0);
    if (m.trainable.empty())
        throw core::ConfigError("llm.method=" + std::string(to_string(o.method)) +
                                " left nothing to train (llm.lora.targets matched no projection?)");
    return m;
}

LlmSplit split_validation(std::int64_t n, std::int64_t n_val, std::uint64_t seed) {
    // Fisher-Yates with the engine's raw output (std::shuffle and the standard distributions may
    // differ between library versions; mt19937_64's sequence is fixed by the standard). The
    // modulo bias is far below anything a split could show.
    std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), std::int64_t{0});
    std::mt19937_64 rng(seed ^ 0x76616c5f73706c74ULL); // "val_splt": not the sampler's stream
    for (std::int64_t i = n - 1; i > 0; --i)
        std::swap(perm[static_cast<std::size_t>(i)],
                  perm[static_cast<std::size_t>(rng() % static_cast<std::uint64_t>(i + 1))]);
    LlmSplit out;
    out.val.assign(perm.begin(), perm.begin() + n_val);
    out.train.assign(perm.begin() + n_val, perm.end());
    std::sort(out.val.begin(), out.val.end());
    std::sort(out.train.begin(), out.train.end());
    return out;
}

std::unique_ptr<dist::DataParallelism> parallelize_llm(const LlmOptions& o,
                                                       const OptimizerConfig& opt,
                                                       bool loss_scaling, dist::Communicator& comm,
                                                       LlmModel& m, std::size_t bucket_bytes,
                                                       std::size_t first_bucket_bytes) {
    dist::TrainableSet trainable{m.trainable_names, m.trainable};
    const dist::ZeroStage zero = o.sharding.zero;
    if (zero == dist::ZeroStage::None) {
        std::unique_ptr<torch::optim::Optimizer> optimizer =
            make_optimizer(opt, m.trainable, /*with_momentum=*/false);
        return dist::make_ddp(comm, std::move(trainable), std::move(optimizer), bucket_bytes,
                              first_bucket_bytes);
    }
    // LlmOptions::from_config refused other optimizers and fp16-mixed's loss scaling.
    if (opt.kind != "adamw" || loss_scaling)
        throw core::InternalError("dist.zero > 0 without AdamW or with loss scaling");
    dist::ZeroAdamW h;
    h.lr = opt.lr;
    h.weight_decay = opt.weight_decay;
    h.fused = opt.fused;
    if (zero != dist::ZeroStage::Parameters)
        return dist::make_zero(comm, std::move(trainable), dist::to_int(zero), h);
    dist::FsdpOptions fo;
    fo.reshard_after_forward = o.sharding.reshard_after_forward;
    fo.prefetch = o.sharding.prefetch;
    fo.adamw = h;
    auto fsdp = dist::make_fsdp(comm, *m.model, fo, m.trainable_names);
    ::malloc_trim(0); // the full weights built on every rank are gone
    return fsdp;
}

} // namespace trainscope::train
