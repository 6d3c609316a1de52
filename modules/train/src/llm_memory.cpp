// Memory plan arithmetic. Activations count the tensors autograd saves in trainscope's Llama,
// per token (tests/e2e/test_memory_plan.py holds them against the host tensor counter's phase
// peaks for every method). Notation: e = compute element size, r = residual/parameter element size
// (= e unless autocast), h hidden, q = heads x head_dim, kv = KV heads x head_dim, f FFN, T the
// sequence length. Per decoder layer:
//   RMSNorm (x2): its fp32 input (4h; in fp32 the input itself) and, when the norm weight trains,
//     the normalised value (r h). Its output (r h) is kept once if a consumer saves its input
//     (a trainable projection, or a LoRA adapter's A).
//   Attention: q and k after rope, v, and the SDPA output (e (2q + 2kv); GQA is not expanded,
//     except where the SDPA kernel needs it: a packed batch on a GPU, e (2q + 2q));
//     the output is o_proj's input too. Packed sequences add SDPA's additive mask (e T).
//   MLP: gate, silu(gate), up (3 e f) and their product (e f, when down_proj saves its input).
//   A projection that computes on a copy of its input keeps that copy instead of sharing it:
//     QAT's fake-quantised activations, and autocast's cast to the compute dtype (mixed
//     precision). QAT also keeps the fake-quantised weights (e per projection weight), autocast
//     the compute-dtype copies of the dense weights (e per weight; per forward, not per token).
//   LoRA: each adapter keeps A's output (e rank) and, with dropout, the dropped input and mask.
// QLoRA: the dequantised weight of the largest projection (e per weight) and the int32 indices of
// one slice of its codes. Once per token: rope cos/sin (2 x 4 head_dim), the final norm (4h, + r h
// if trainable, + the head's input if the head trains, or always with the chunked loss). Activation
// checkpointing keeps each layer's input (e h per token and layer) plus one layer's full set during
// its recompute. The head: the step's peak holds 12 bytes per logit (backward of the fp32 loss:
// log-softmax output, the incoming and the outgoing gradient), or in forward the logits (e V),
// their fp32 upcast (4V unless e = 4) and the log-softmax output (4V), whichever is larger; with
// llm.loss_chunks > 1 for one chunk's tokens only, plus the head input's gradient (twice r h per
// token: the chunks' parts and their concatenation) and, where the head trains, its gradient
// summed over the chunks beside the chunk's own (see plan_llm_memory); or a decoder layer's
// backward working set where that is larger. Under activation checkpointing the head's working set
// and a layer's recomputed set are never alive together: the head counts beyond that set only.
#include "trainscope/train/llm_memory.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/models/nf4.hpp"

namespace trainscope::train {

namespace {

double tokens_of(double sequences, std::int64_t seq_len) {
    return sequences * static_cast<double>(seq_len);
}

double elem(torch::ScalarType t) {
    return static_cast<double>(c10::elementSize(t));
}

// NF4 bytes per weight: 4-bit code, one int8 scale per 64 weights, one fp32 factor per 256 scales.
constexpr double kNf4BytesPerWeight = 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0);

bool is_lora_method(const LlmMemoryInputs& in) {
    return in.method == LlmMethod::Lora || in.method == LlmMethod::Qlora ||
           in.method == LlmMethod::Dpo || (in.method == LlmMethod::Qat && in.qat_lora);
}

// The trainable tensors' sizes as the model holds them: LoRA's lora_a [rank, in] and lora_b
// [out, rank] per targeted projection (and the untied head), or every weight (the embedding,
// each layer's projections [out, in] and two norms, the final norm, the untied head).
std::vector<std::vector<std::int64_t>> trainable_sizes(const LlmMemoryInputs& in) {
    const models::LlamaConfig& c = in.config;
    const std::int64_t h = c.hidden_size, v = c.vocab_size;
    const std::vector<models::ProjectionShape> projections = c.projection_shapes();
    std::vector<std::vector<std::int64_t>> sizes;
    if (is_lora_method(in)) {
        const std::int64_t r = in.lora.rank;
        auto targeted = [&](const std::string& t) {
            return std::find(in.lora.targets.begin(), in.lora.targets.end(), t) !=
                   in.lora.targets.end();
        };
        for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
            for (const models::ProjectionShape& p : projections)
                if (targeted(p.name)) {
                    sizes.push_back({r, p.in});
                    sizes.push_back({p.out, r});
                }
        if (targeted("lm_head") && !c.tie_word_embeddings) {
            sizes.push_back({r, h});
            sizes.push_back({v, r});
        }
        return sizes;
    }
    sizes.push_back({v, h});
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
        for (const models::ProjectionShape& p : projections)
            sizes.push_back({p.out, p.in});
        sizes.push_back({h});
        sizes.push_back({h});
    }
    sizes.push_back({h});
    if (!c.tie_word_embeddings) sizes.push_back({v, h});
    return sizes;
}

// Bytes autograd keeps for one micro-batch (formula at the top of this file): `total`, and within
// it, under activation checkpointing, `recompute`: one layer's full set during its recomputation
// (with QLoRA's dequantised weight), which exists only in backward.
struct ActivationBytes {
    double total = 0, recompute = 0;
};
ActivationBytes activation_bytes(const LlmMemoryInputs& in) {
    const models::LlamaConfig& c = in.config;
    const double e = elem(in.compute_dtype), r = elem(in.param_dtype);
    const double h = static_cast<double>(c.hidden_size),
                 f = static_cast<double>(c.intermediate_size);
    const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
    const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
    const double T = static_cast<double>(in.seq_len);
    const double layers = static_cast<double>(c.num_hidden_layers);
    const bool lora = is_lora_method(in);
    const bool weights_train = !lora; // full, or QAT without LoRA: every weight trains
    const bool qat = in.method == LlmMethod::Qat;
    const bool autocast = in.compute_dtype != in.param_dtype;
    auto targeted = [&](const char* name) {
        return lora && std::find(in.lora.targets.begin(), in.lora.targets.end(), name) !=
                           in.lora.targets.end();
    };
    const double dropout_per_input = lora && in.lora.dropout > 0 ? 2.0 * e : 0.0; // copy + mask

    // The input of a group of projections: kept once (shared) or per consumer (a copy each).
    auto projection_inputs = [&](std::initializer_list<const char*> names, double width,
                                 double shared_bytes) {
        double bytes = 0;
        bool shared = false;
        for (const char* n : names) {
            if (weights_train) {
                if (qat || autocast)
                    bytes += e * width; // the fake-quantised or cast copy the matmul saves
                else
                    shared = true;
            }
            if (targeted(n)) {
                bytes += e * static_cast<double>(in.lora.rank) + dropout_per_input * width;
                if (autocast)
                    bytes += e * width; // autocast's copy of A's input
                else if (dropout_per_input == 0)
                    shared = true;
            }
        }
        return bytes + (shared ? shared_bytes : 0.0);
    };
    const double norm = 4.0 * h + (weights_train ? r * h : 0.0);
    double per_layer = 2.0 * norm;
    per_layer += projection_inputs({"q_proj", "k_proj", "v_proj"}, h, r * h);
    // q, k (roped), v, SDPA output; k and v with the query heads' width where expanded
    per_layer += e * (2.0 * q + (in.kv_expanded ? 2.0 * q : 2.0 * kv));
    per_layer += projection_inputs({"o_proj"}, q, 0.0); // shares the SDPA output
    per_layer += projection_inputs({"gate_proj", "up_proj"}, h, r * h);
    per_layer += 3.0 * e * f;                                // gate, silu(gate), up
    per_layer += projection_inputs({"down_proj"}, f, e * f); // their product
    if (in.packed) per_layer += e * T;                       // SDPA's additive mask

    // The head's input: saved by a trainable head, or (r h) by the chunked loss (which projects
    // it chunk by chunk, and recomputes from it where it cannot compute gradients in forward).
    const bool head_trains = weights_train || targeted("lm_head");
    double per_token = 8.0 * static_cast<double>(c.head_dim) + 4.0 * h +
                       (weights_train ? r * h : 0.0) +
                       (in.loss_chunks > 1 ? r * h : (head_trains ? (autocast ? e : r) * h : 0.0));
    if (in.packed) per_token += T; // the boolean mask
    per_token += in.activation_checkpointing ? layers * e * h : layers * per_layer;

    const double sequences =
        static_cast<double>(in.micro_batch) * (in.method == LlmMethod::Dpo ? 2.0 : 1.0);
    ActivationBytes out;
    out.recompute = in.activation_checkpointing ? sequences * T * per_layer : 0.0;
    double bytes = sequences * T * per_token + out.recompute;
    // Per forward, not per token: QAT's fake-quantised weights, which its matmuls save; under
    // autocast the compute-dtype copies of the weights: cached for trainable leaves, saved by the
    // matmul for frozen ones (the input gradient needs them). QAT's weights are not leaves (they
    // are counted above) and NF4 weights are dequantised again in backward.
    const double projections = static_cast<double>(llama_projection_parameters(c));
    if (qat) bytes += e * projections;
    if (in.method == LlmMethod::Qlora && in.activation_checkpointing) {
        // One NF4 weight dequantised at a time (forward, and again in backward): the dense weight
        // in the compute dtype and the int32 indices of one slice of its codes (nf4.hpp). It adds
        // to the peak during a layer's recomputation; without checkpointing the peak is at the
        // head, before any backward dequantisation.
        const double largest = std::max({h * q, h * kv, h * f});
        const double dequantised =
            e * largest +
            4.0 * std::min(static_cast<double>(models::kNf4DequantSliceCodes), largest / 2);
        bytes += dequantised;
        out.recompute += dequantised;
    }
    if (autocast) {
        double weights = static_cast<double>(c.tie_word_embeddings ? c.embedding_parameters()
                                                                   : c.head_parameters());
        if (!qat && in.method != LlmMethod::Qlora) weights += projections;
        if (lora) weights += static_cast<double>(models::lora_parameter_count(c, in.lora));
        bytes += e * weights;
    }
    out.total = bytes;
    return out;
}

// dist.zero=3 (FSDP) units as the engine wraps them: the embedding, one per decoder layer, and the
// head (final norm + lm_head; the norm only when tied). Each unit's tensors form one flat group
// per (dtype, trainable), padded to a multiple of the world size; every rank keeps 1/N of each.
struct FsdpGroup {
    std::int64_t numel = 0;
    double elem = 0; // bytes per element
    bool trainable = false;
    bool nf4 = false;
};
double shard_bytes(const FsdpGroup& g, std::int64_t world) {
    return static_cast<double>((g.numel + world - 1) / world) * g.elem;
}
struct FsdpUnit {
    std::vector<FsdpGroup> groups;
    // The all-gathered buffers (N shards each, padding included), or their trainable part: the
    // unit's full gradient.
    double full_bytes(std::int64_t world, bool trainable_only = false) const {
        double b = 0;
        for (const FsdpGroup& g : groups)
            if (g.trainable || !trainable_only)
                b += static_cast<double>(world) * shard_bytes(g, world);
        return b;
    }
};

std::vector<FsdpUnit> fsdp_units(const LlmMemoryInputs& in) {
    const models::LlamaConfig& c = in.config;
    const double e = elem(in.param_dtype);
    const bool lora = is_lora_method(in);
    const bool qlora = in.method == LlmMethod::Qlora;
    auto targeted = [&](const char* name) {
        return std::find(in.lora.targets.begin(), in.lora.targets.end(), name) !=
               in.lora.targets.end();
    };
    // Dense weights in the parameter dtype: trainable unless a LoRA method freezes the base.
    auto dense = [&](std::int64_t numel) { return FsdpGroup{numel, e, !lora, false}; };
    auto adapters = [&](std::int64_t numel) { return FsdpGroup{numel, e, true, false}; };
    std::vector<FsdpUnit> units;
    units.push_back({{dense(c.embedding_parameters())}});

    const std::int64_t projections = c.projection_parameters(); // per layer
    models::LlamaConfig no_head = c; // LoRA parameters of one decoder layer
    no_head.num_hidden_layers = 1;
    no_head.tie_word_embeddings = true;
    const std::int64_t layer_adapters = lora ? models::lora_parameter_count(no_head, in.lora) : 0;
    FsdpUnit layer;
    if (qlora) {
        // NF4 buffers: uint8 codes (2 per byte), int8 scales (1 per 64), fp32 factors (1 per 256
        // scales); the norms stay dense.
        layer.groups = {
            dense(2 * c.hidden_size), FsdpGroup{projections / 2, 1.0, false, true},
            FsdpGroup{projections / models::kNf4BlockSize, 1.0, false, true},
            FsdpGroup{projections / (models::kNf4BlockSize * models::kNf4ScalerBlockSize), 4.0,
                      false, true}};
    } else {
        layer.groups = {dense(c.layer_parameters())};
    }
    if (layer_adapters > 0) layer.groups.push_back(adapters(layer_adapters));
    for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
        units.push_back(layer);

    FsdpUnit head{{dense(c.hidden_size + c.head_parameters())}};
    if (lora && targeted("lm_head") && !c.tie_word_embeddings)
        head.groups.push_back(adapters(in.lora.rank * (c.hidden_size + c.vocab_size)));
    units.push_back(head);
    return units;
}

// Stage 3 per rank: every unit's shards, plus the units (and the one gradient) in flight.
// head_gradient: the head's full gradient as the chunked loss already counts it in the logits
// column (0 without chunks).
void plan_fsdp(const LlmMemoryInputs& in, LlmMemoryPlan& p, double head_gradient) {
    const std::int64_t world = std::max(1, in.world_size);
    const std::vector<FsdpUnit> units = fsdp_units(in);
    const bool tied = in.config.tie_word_embeddings;
    p.frozen_weight_bytes = p.nf4_weight_bytes = p.trainable_weight_bytes = 0;
    double whole = 0, largest = 0, largest_pair = 0, largest_grad = 0, other_grad = 0;
    for (std::size_t i = 0; i < units.size(); ++i) {
        for (const FsdpGroup& g : units[i].groups)
            (g.trainable ? p.trainable_weight_bytes
                         : (g.nf4 ? p.nf4_weight_bytes : p.frozen_weight_bytes)) +=
                shard_bytes(g, world);
        whole += units[i].full_bytes(world);
        // A tied embedding stays gathered (and, trainable, keeps its gradient) from the start of
        // forward to the end of backward: counted below on its own, not as a unit in flight.
        if (tied && i == 0) continue;
        largest = std::max(largest, units[i].full_bytes(world));
        // With dist.prefetch a unit is gathered while its neighbour runs (the next one in
        // forward, the previous one in backward): the largest adjacent pair is in flight.
        if (i + 1 < units.size())
            largest_pair =
                std::max(largest_pair, units[i].full_bytes(world) + units[i + 1].full_bytes(world));
        largest_grad = std::max(largest_grad, units[i].full_bytes(world, true));
        if (i + 1 < units.size())
            other_grad = std::max(other_grad, units[i].full_bytes(world, true));
    }
    p.gradient_bytes = p.trainable_weight_bytes;
    p.optimizer_state_bytes = 2.0 * p.trainable_weight_bytes;
    if (!in.reshard_after_forward) {
        p.gathered_weight_bytes = whole; // every unit from its forward until its backward ends
    } else {
        p.gathered_weight_bytes = in.prefetch ? std::max(largest, largest_pair) : largest;
        if (tied) p.gathered_weight_bytes += units.front().full_bytes(world);
    }
    // One unit's full gradient before its reduce-scatter. With the chunked loss the head's is in
    // the logits column (twice: the chunks' sum and one chunk's); another unit's exists only once
    // the head's backward has ended, so it adds only what exceeds that.
    p.unit_gradient_bytes =
        head_gradient > 0 ? std::max(0.0, other_grad - 2.0 * head_gradient) : largest_grad;
    // A tied embedding's gradient lives through the whole backward (it is the head's G where
    // the chunked loss counts that).
    if (tied && head_gradient == 0) p.unit_gradient_bytes += units.front().full_bytes(world, true);
}

} // namespace

double LlmMemoryPlan::total_bytes() const {
    return frozen_weight_bytes + nf4_weight_bytes + trainable_weight_bytes + gradient_bytes +
           optimizer_state_bytes + activation_bytes + logits_bytes + gathered_weight_bytes +
           unit_gradient_bytes + workspace_bytes + comm_buffer_bytes;
}

std::int64_t llama_projection_parameters(const models::LlamaConfig& c) {
    return c.num_hidden_layers * c.projection_parameters();
}

LlmMemoryPlan plan_llm_memory(const LlmMemoryInputs& in) {
    const models::LlamaConfig& c = in.config;
    LlmMemoryPlan p;
    p.method = in.method;
    p.zero = in.zero;
    p.parameters = c.num_parameters();
    const double e_param = elem(in.param_dtype), e_act = elem(in.compute_dtype);
    const double n = static_cast<double>(p.parameters);
    const bool lora = is_lora_method(in);
    const double world = std::max(1, in.world_size);
    if (lora) {
        p.trainable_parameters = models::lora_parameter_count(c, in.lora);
        if (in.method == LlmMethod::Qlora) {
            const double proj = static_cast<double>(llama_projection_parameters(c));
            p.nf4_weight_bytes = proj * kNf4BytesPerWeight;
            p.frozen_weight_bytes = (n - proj) * e_param; // embeddings, norms, head
        } else {
            p.frozen_weight_bytes = n * e_param;
        }
    } else {
        p.trainable_parameters = p.parameters;
    }
    const double t = static_cast<double>(p.trainable_parameters);
    p.trainable_weight_bytes = t * e_param;
    const dist::StateShards shards =
        dist::state_shards(static_cast<dist::ZeroStage>(in.zero), in.world_size);
    p.gradient_bytes = t * e_param / static_cast<double>(shards.gradient);
    p.optimizer_state_bytes = 2.0 * t * e_param / static_cast<double>(shards.optimizer_state);
    // ZeRO-2 keeps only its gradient shard between iterations, but backward accumulates into the
    // full flat gradient, a buffer of its own from the iteration's start to its reduce-scatter.
    if (in.zero == 2) p.unit_gradient_bytes = t * e_param; // beside the persistent shard
    // ZeRO-1 keeps the full flat gradient and the reduce-scatter's shard of it.
    if (in.zero == 1) p.gradient_bytes = t * e_param * (1.0 + 1.0 / world);

    const ActivationBytes activations = activation_bytes(in);
    p.activation_bytes = activations.total;
    const double sequences =
        static_cast<double>(in.micro_batch) * (in.method == LlmMethod::Dpo ? 2.0 : 1.0);
    // The logits exist for one chunk of ceil(T / chunks) positions at a time (llm.loss_chunks).
    const std::int64_t chunks = std::max<std::int64_t>(1, in.loss_chunks);
    double G = 0; // the head's trainable gradient, summed over the chunks
    const double chunk_len = static_cast<double>((in.seq_len + chunks - 1) / chunks);
    const double chunk_logits = sequences * chunk_len * static_cast<double>(c.vocab_size);
    const double forward = e_act + (e_act == 4.0 ? 4.0 : 8.0), backward = 12.0;
    p.logits_bytes = chunk_logits * std::max(forward, backward);
    if (chunks > 1) {
        // The chunked backward (llm_loss.cpp) sums the gradient G of the head's trainable
        // parameters over the chunks before autograd accumulates it once: G beside a chunk's 12
        // bytes per logit, or 2 G (the sum and this chunk's) beside its 4-byte logit gradient,
        // whichever is larger.
        const bool targeted_head = lora && std::find(in.lora.targets.begin(), in.lora.targets.end(),
                                                     "lm_head") != in.lora.targets.end();
        if (!lora)
            G = e_param * static_cast<double>(c.vocab_size * c.hidden_size);
        else if (targeted_head && !c.tie_word_embeddings)
            G = e_param * static_cast<double>(in.lora.rank) *
                static_cast<double>(c.vocab_size + c.hidden_size);
        p.logits_bytes = std::max(p.logits_bytes + G, chunk_logits * 4.0 + 2.0 * G);
    }
    // Where the chunks make the head small, the step's peak moves to a decoder layer's backward:
    // per token one [T, f] gradient in the compute dtype (e f), an fp32 temporary of RMSNorm's
    // backward (4h) and, in a low-precision dtype, the fp32 upcast of its incoming gradient
    // ((4 - e) h); calibrated on CPU in fp32 and bf16 (tests/e2e/test_memory_plan.py).
    const double tokens = tokens_of(sequences, in.seq_len);
    const double norm_backward = tokens * (8.0 - e_act) * static_cast<double>(c.hidden_size);
    if (in.activation_checkpointing) {
        // The head's working set exists in forward (the chunked loss computes its gradients
        // there) or at the start of backward, a layer's recomputed set only after it: never both.
        // So the head adds only what exceeds that set (in the activations column). Beside the
        // set, a layer's backward needs RMSNorm's fp32 temporaries; its [T, f] gradients take the
        // place of the recomputed tensors they consume. Measured on CPU (bf16, Llama-3-8B's
        // widths, 2 layers, 2 x 2048 tokens): backward peak 1,105 MiB against 1,244 planned.
        p.logits_bytes = std::max(p.logits_bytes - activations.recompute, norm_backward);
    } else {
        const double layer_backward =
            tokens * e_act * static_cast<double>(c.intermediate_size) + norm_backward;
        p.logits_bytes = std::max(p.logits_bytes, layer_backward);
    }
    if (chunks > 1) // the head input's gradient, alive from the head's backward to the layers'
        p.logits_bytes += 2.0 * tokens * static_cast<double>(c.hidden_size) * e_param;
    if (in.zero == 3) plan_fsdp(in, p, G);
    // Measured on an H200 (scripts/gpu-check, tiny shapes): the allocator's iteration peak
    // exceeded the plan by 59-65 MiB for every method, i.e. two 32 MiB workspaces.
    p.workspace_bytes = 2.0 * in.cublas_workspace_bytes;
    if (in.zero == 0)
        p.comm_buffer_bytes = dist::synchronizer_buffer_bytes(
            trainable_sizes(in), in.param_dtype, in.backend, in.world_size, in.compression);
    else if (in.zero == 1 || in.zero == 2)
        p.comm_buffer_bytes =
            dist::zero_buffer_bytes(p.trainable_parameters, in.world_size, in.compression);
    return p;
}

std::string format_memory_plans(const std::vector<LlmMemoryPlan>& plans, double device_bytes,
                                int this_run) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::ostringstream o;
    o << std::fixed << std::setprecision(2);
    o << "    method  zero  trainable      frozen    nf4  trainable  grads  optim  activ  logits"
         "  gathered  unitgrad  cublas  comm   total [GiB/rank]"
      << (device_bytes > 0 ? "  fits" : "") << "\n";
    for (std::size_t i = 0; i < plans.size(); ++i) {
        const LlmMemoryPlan& p = plans[i];
        o << "    " << std::left << std::setw(6) << to_string(p.method) << std::right
          << std::setw(6) << p.zero << std::setw(11) << p.trainable_parameters << std::setw(12)
          << p.frozen_weight_bytes / gib << std::setw(7) << p.nf4_weight_bytes / gib
          << std::setw(11) << p.trainable_weight_bytes / gib << std::setw(7)
          << p.gradient_bytes / gib << std::setw(7) << p.optimizer_state_bytes / gib << std::setw(7)
          << p.activation_bytes / gib << std::setw(8) << p.logits_bytes / gib << std::setw(10)
          << p.gathered_weight_bytes / gib << std::setw(10) << p.unit_gradient_bytes / gib
          << std::setw(8) << p.workspace_bytes / gib << std::setw(6) << p.comm_buffer_bytes / gib
          << std::setw(9) << p.total_bytes() / gib;
        if (device_bytes > 0) o << "  " << (p.total_bytes() <= device_bytes ? "yes" : "NO");
        if (static_cast<int>(i) == this_run) o << "  <- this run";
        o << "\n";
    }
    return o.str();
}

} // namespace trainscope::train
