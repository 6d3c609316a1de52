// The LLM model as a run trains it: built with its fine-tuning method applied, split into
// training and validation items, and parallelised once (the only place that knows the
// data-parallel kinds).
#include <malloc.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/fsdp.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/models/fake_quant.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/models/safetensors.hpp"
#include "trainscope/train/llama_units.hpp"
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

namespace {

// Seed of one unit's generator: its initial values depend on the run's seed and the unit only.
std::uint64_t unit_seed(std::uint64_t seed, int unit) {
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(unit + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL; // splitmix64's finaliser
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// A checkpoint read once per node: the node's local rank 0 opens the files, the node's other
// ranks get the headers and each tensor's bytes by broadcast inside the node.
class NodeSafetensorsShare final : public models::SafetensorsShare {
  public:
    explicit NodeSafetensorsShare(MPI_Comm world) : node_(world) {}
    bool reader() const override { return node_.rank() == 0; }
    std::string share_text(const std::string& text) override {
        return core::broadcast_string(node_.get(), text);
    }
    void share_bytes(void* data, std::size_t bytes) override {
        core::broadcast_bytes(node_.get(), data, bytes);
    }

  private:
    core::NodeComm node_;
};

} // namespace

void finish_llm_model(LlmModel& m) {
    m.trainable_names.clear();
    m.trainable.clear();
    m.trainable_parameters = 0;
    m.projections.clear();
    for (const auto& item : m.model->named_parameters(/*recurse=*/true))
        if (item.value().requires_grad()) {
            m.trainable_names.push_back(item.key());
            m.trainable.push_back(item.value());
            m.trainable_parameters += item.value().numel();
        }
    models::for_each_projection(
        *m.model, [&](torch::nn::Module&, const std::string&, const std::string&,
                      std::shared_ptr<models::ProjectionImpl> p) { ++m.projections[p->kind()]; });
    m.materialize_unit = nullptr; // releases the checkpoint's mapping
    // Building and quantising freed large temporaries (the dense weights before NF4, the
    // checkpoint's mapped pages): hand them back to the OS so RSS shows what training holds.
    ::malloc_trim(0);
}

LlmModel build_llm_model(const LlmOptions& o, const models::LlamaConfig& config,
                         const PrecisionPolicy& policy, torch::Device device, std::uint64_t seed,
                         MPI_Comm world) {
    LlmModel m;
    const auto options = torch::TensorOptions().dtype(policy.param_dtype).device(device);
    // Shapes only (the meta device); each unit gets memory, values, checkpoint weights and the
    // method's transform in materialize_unit, here for every unit or unit by unit under FSDP.
    m.model = models::LlamaForCausalLM(config, options,
                                       models::LlamaForCausalLMImpl::Materialize::PerUnit);
    m.model->set_activation_checkpointing(o.activation_checkpointing);
    m.parameters = config.num_parameters();
    if (uses_lora(o)) {
        // Refused before anything is materialised (and the same on every rank).
        bool any = false;
        models::for_each_projection(*m.model, [&](torch::nn::Module&, const std::string& child,
                                                  const std::string&,
                                                  std::shared_ptr<models::ProjectionImpl>) {
            any = any || std::find(o.lora.targets.begin(), o.lora.targets.end(), child) !=
                             o.lora.targets.end();
        });
        models::validate_lora_targets(o.lora.targets);
        if (!any)
            throw core::ConfigError("llm.method=" + std::string(to_string(o.method)) +
                                    " left nothing to train (llm.lora.targets matched no "
                                    "projection: lm_head alone with tied embeddings?)");
    }
    std::shared_ptr<models::HfWeightLoader> loader;
    if (!o.checkpoint.empty()) // names, shapes and unused tensors checked before any read
        loader = std::make_shared<models::HfWeightLoader>(
            *m.model, o.checkpoint,
            world == MPI_COMM_NULL ? nullptr : std::make_shared<NodeSafetensorsShare>(world));
    models::LlamaForCausalLMImpl* model = m.model.get();
    const LlmOptions opts = o;
    const torch::ScalarType dtype = policy.param_dtype;
    m.materialize_unit = [model, loader, opts, dtype, seed](int unit) {
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(unit_seed(seed, unit));
        model->materialize_unit(unit, gen);
        if (loader) loader->load_unit(*model, unit);
        models::NameScope scope;
        for (const auto& [prefix, module] : model->unit_modules(unit))
            scope.push_back(prefix);
        switch (opts.method) {
        case LlmMethod::Full:
            break;
        case LlmMethod::Lora:
        case LlmMethod::Dpo:
            models::apply_lora(*model, opts.lora, scope, gen);
            break;
        case LlmMethod::Qlora:
            models::quantize_nf4(*model, dtype, scope);
            models::apply_lora(*model, opts.lora, scope, gen);
            break;
        case LlmMethod::Qat:
            models::apply_qat(*model, opts.qat_group_size, scope);
            if (opts.qat_lora) models::apply_lora(*model, opts.lora, scope, gen);
            models::set_qat_enabled(*model, opts.qat_start_step == 0);
            break;
        }
    };
    if (loader) {
        const models::LoadReport& r = loader->report();
        core::log::info() << "checkpoint " << o.checkpoint << ": " << config.num_parameters()
                          << " parameters planned"
                          << (r.tensors_derived ? ", " + std::to_string(r.tensors_derived) +
                                                      " derivable tensors skipped (rotary "
                                                      "caches, a tied head)"
                                                : std::string());
    }
    if (o.sharding.zero == dist::ZeroStage::Parameters) return m; // FSDP materialises per unit
    for (int u = 0; u < m.model->num_units(); ++u)
        m.materialize_unit(u);
    if (loader)
        core::log::info() << "loaded " << loader->report().tensors_loaded << " tensors ("
                          << loader->report().bytes_read / (1024.0 * 1024.0) << " MiB) from "
                          << o.checkpoint;
    finish_llm_model(m);
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

std::unique_ptr<dist::DataParallelism>
parallelize_llm(const LlmOptions& o, const OptimizerConfig& opt, bool loss_scaling,
                dist::Communicator& comm, LlmModel& m, std::size_t bucket_bytes,
                std::size_t first_bucket_bytes, const dist::CompressionOptions& compression) {
    const dist::ZeroStage zero = o.sharding.zero;
    if (zero != dist::ZeroStage::Parameters)
        return make_data_parallelism(zero, opt, /*with_momentum=*/false, loss_scaling, comm,
                                     {m.trainable_names, m.trainable}, bucket_bytes,
                                     first_bucket_bytes, compression);
    // LlmOptions::from_config refused other optimizers and fp16-mixed's loss scaling.
    if (opt.kind != "adamw" || loss_scaling)
        throw core::InternalError("dist.zero=3 without AdamW or with loss scaling");
    const dist::ZeroAdamW h = zero_adamw(opt);
    dist::FsdpOptions fo;
    fo.reshard_after_forward = o.sharding.reshard_after_forward;
    fo.prefetch = o.sharding.prefetch;
    fo.adamw = h;
    fo.reduce_dtype = dist::compressed_dtype(compression.kind); // dist.compress=fp16/bf16
    // Each unit is materialised (initialised, loaded, transformed) just before it is sharded.
    fo.materialize = m.materialize_unit;
    // train picks the units (LlamaUnits: embedding, decoder layers, head) and hands them over.
    auto fsdp = dist::make_fsdp(comm, std::make_shared<LlamaUnits>(*m.model), fo, {});
    finish_llm_model(m);
    return fsdp;
}

} // namespace trainscope::train
