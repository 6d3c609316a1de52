// Pipeline parallelism for MobileNetV2: the split into stages (per-unit parameters and MACs, an
// exact min-max partition or explicit cuts), the rank layout (stage-major within a replica), the
// stage module sharing a full model's units, and the GPipe schedule over batched point-to-point.
//
// Communication order (issue 25, point 10). A rank talks over two communicators: `pipe` (its
// replica's stages, point-to-point) and `dp` (its stage across replicas, the gradient allreduce),
// which on NCCL run on two streams of one GPU. NCCL requires communicators that share GPUs to be
// driven in one consistent order on every rank, or a kernel of one may wait forever behind a
// kernel of the other. So, on every rank and every step:
//   1. PipelineEngine::step issues only `pipe` point-to-point operations, in a schedule every
//      pair of neighbours agrees on: forward, the input of micro-batch 0 alone, then per
//      micro-batch one batch {send output m to stage+1, receive input m+1 from stage-1};
//      backward mirrored ({send input-gradient m to stage-1, receive output-gradient m-1 from
//      stage+1}). A batch is posted as one group (Communicator::exchange: ncclGroupStart/End,
//      as PyTorch's batch_isend_irecv; MPI: Isend/Irecv then wait), so a send is never coupled
//      to the next receive behind it, and the chain of batches cannot deadlock (stage 0 only
//      sends forward, the last stage only sends backward).
//   2. Only after step() returned (every point-to-point operation of the step enqueued) does the
//      caller start the `dp` gradient allreduces (GradientSynchronizer armed after the step,
//      all buckets launched in bucket order by finish()), identically on every rank.
// Every rank therefore enqueues: [the step's pipe operations] then [the step's dp allreduces]
// (batch-norm buffer broadcasts over `dp` come before the step, also on every rank), a global
// order all ranks share. The price: no overlap of the gradient allreduce with the last
// micro-batch's backward. tests/mpi/test_pipeline.cpp checks the recorded order at 2 x 2 ranks.
#include "trainscope/train/pipeline.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <mutex>
#include <numeric>
#include <sstream>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"

namespace trainscope::train {

void declare_pipeline_options(core::OptionRegistry& r) {
    r.add_int("pipeline.stages", 2,
              "run.strategy=pipeline: stages MobileNetV2 is split into (consecutive ranks; the "
              "world size must be a multiple: stages x data-parallel replicas)",
              2, kPipelineUnits);
    r.add_int("pipeline.microbatches", 4,
              "run.strategy=pipeline: micro-batches per batch (GPipe: all forwards, then all "
              "backwards; batch-norm statistics are per micro-batch)",
              1, 1 << 20);
    r.add_choice("pipeline.balance", "flops", {"params", "flops"},
                 "run.strategy=pipeline: what the split balances across stages (parameters or "
                 "forward FLOPs per sample); ignored when pipeline.cuts is set");
    r.add_string("pipeline.cuts", "",
                 "run.strategy=pipeline: comma-separated unit indices (1..19) where stages 1..S-1 "
                 "begin, overriding pipeline.balance (units: 0-18 features, 19 head; see "
                 "--dry-run)");
}

const char* to_string(PipelineBalance balance) {
    return balance == PipelineBalance::Params ? "params" : "flops";
}

PipelineOptions PipelineOptions::from_config(const core::Config& cfg) {
    PipelineOptions o;
    o.stages = static_cast<int>(cfg.get_int("pipeline.stages"));
    o.microbatches = static_cast<int>(cfg.get_int("pipeline.microbatches"));
    o.balance = cfg.get_string("pipeline.balance") == "params" ? PipelineBalance::Params
                                                               : PipelineBalance::Flops;
    o.cuts = cfg.get_string("pipeline.cuts");
    return o;
}

namespace {

std::string shape_string(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
        s += (i ? "x" : "") + std::to_string(shape[i]);
    return s + "]";
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

// Walks one feature unit's convolutions in execution order (registration order in these blocks)
// from a per-sample input [C, H, W]: MACs per sample and the output shape. Batch-norm and ReLU6
// cost no MACs and keep the shape; a residual add keeps it too.
void walk_unit(torch::nn::Module& unit, PipelineUnit& out, std::vector<std::int64_t> shape) {
    for (const auto& m : unit.modules(/*include_self=*/true)) {
        const auto* conv = m->as<torch::nn::Conv2d>();
        if (!conv) continue;
        const auto& o = conv->options;
        std::int64_t side[2];
        for (int d = 0; d < 2; ++d) {
            const auto pad = (*std::get<torch::ExpandingArray<2>>(o.padding()))[d];
            side[d] =
                (shape[1 + d] + 2 * pad - o.dilation()->at(d) * (o.kernel_size()->at(d) - 1) - 1) /
                    o.stride()->at(d) +
                1;
        }
        const std::int64_t k2 = o.kernel_size()->at(0) * o.kernel_size()->at(1);
        out.macs += side[0] * side[1] * o.out_channels() * (o.in_channels() / o.groups()) * k2;
        shape = {o.out_channels(), side[0], side[1]};
    }
    out.params = models::count_parameters(unit);
    out.output = shape;
}

// Restores the default CPU generator on scope exit: planning builds a model (random init) and must
// not shift the run's random stream.
class KeepCpuRandomState {
  public:
    KeepCpuRandomState() {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(gen.mutex());
        state_ = gen.get_state();
    }
    ~KeepCpuRandomState() {
        at::Generator gen = at::detail::getDefaultCPUGenerator();
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(state_);
    }

  private:
    at::Tensor state_;
};

std::vector<PipelineUnit> measure_units(models::MobileNetV2Options options,
                                        std::int64_t image_size) {
    options.sync_bn_allreduce = nullptr; // same parameters; never called while planning
    KeepCpuRandomState keep;
    torch::NoGradGuard no_grad;
    models::MobileNetV2 model(options);
    if (model->features->size() != kPipelineUnits - 1)
        throw core::InternalError("MobileNetV2 has " + std::to_string(model->features->size()) +
                                  " feature units; the pipeline planner expects " +
                                  std::to_string(kPipelineUnits - 1));
    std::vector<PipelineUnit> units(kPipelineUnits);
    std::vector<std::int64_t> shape{options.in_channels, image_size, image_size};
    for (int i = 0; i + 1 < kPipelineUnits; ++i) {
        units[i].name = "features." + std::to_string(i);
        walk_unit(*model->features->ptr(i), units[i], shape);
        shape = units[i].output;
    }
    PipelineUnit& head = units.back();
    head.name = "head";
    head.params = models::count_parameters(*model->classifier);
    const auto* linear = model->classifier->ptr(1)->as<torch::nn::Linear>();
    if (!linear) throw core::InternalError("MobileNetV2 classifier: expected [Dropout, Linear]");
    head.macs = linear->options.in_features() * linear->options.out_features();
    head.output = {linear->options.out_features()};
    return units;
}

// Stage start indices (size stages, first is 0) minimising the largest stage cost: exact dynamic
// programme over (stages, prefix length); 20 units make it trivially cheap.
std::vector<int> balanced_starts(const std::vector<std::int64_t>& cost, int stages) {
    const int n = static_cast<int>(cost.size());
    std::vector<std::int64_t> prefix(n + 1, 0);
    for (int i = 0; i < n; ++i)
        prefix[i + 1] = prefix[i] + cost[i];
    constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max();
    // best[k][j]: minimal largest cost splitting units [0, j) into k stages; from[k][j]: where the
    // k-th stage starts in that split.
    std::vector<std::vector<std::int64_t>> best(stages + 1, std::vector<std::int64_t>(n + 1, kInf));
    std::vector<std::vector<int>> from(stages + 1, std::vector<int>(n + 1, 0));
    best[0][0] = 0;
    for (int k = 1; k <= stages; ++k)
        for (int j = k; j <= n - (stages - k); ++j)
            for (int i = k - 1; i < j; ++i) {
                if (best[k - 1][i] == kInf) continue;
                const std::int64_t c = std::max(best[k - 1][i], prefix[j] - prefix[i]);
                if (c < best[k][j]) {
                    best[k][j] = c;
                    from[k][j] = i;
                }
            }
    std::vector<int> starts(stages);
    for (int k = stages, j = n; k >= 1; --k) {
        starts[k - 1] = from[k][j];
        j = from[k][j];
    }
    return starts;
}

std::vector<int> parse_cuts(const std::string& text, int stages) {
    auto fail = [&](const std::string& why) {
        throw core::ConfigError(
            "pipeline.cuts = '" + text + "': " + why + "; give " + std::to_string(stages - 1) +
            " strictly increasing unit indices in [1, " + std::to_string(kPipelineUnits - 1) +
            "] where stages 1.." + std::to_string(stages - 1) +
            " begin (units: 0-18 features, 19 head; --dry-run lists them), "
            "or leave it empty to balance by pipeline.balance");
    };
    std::vector<int> starts{0};
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
        const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
        if (item.empty() || item.size() > 3 ||
            item.find_first_not_of("0123456789") != std::string::npos)
            fail("'" + item + "' is not a unit index");
        const int cut = std::stoi(item);
        if (cut < 1 || cut > kPipelineUnits - 1)
            fail("unit " + item + " is outside [1, " + std::to_string(kPipelineUnits - 1) + "]");
        if (cut <= starts.back()) fail("unit " + item + " does not come after the previous cut");
        starts.push_back(cut);
    }
    if (!text.empty() && text.back() == ',') fail("trailing comma");
    if (static_cast<int>(starts.size()) != stages)
        fail(std::to_string(starts.size() - 1) +
             " cut(s) for pipeline.stages=" + std::to_string(stages));
    return starts;
}

} // namespace

PipelinePlan plan_pipeline(const models::MobileNetV2Options& model, std::int64_t image_size,
                           int stages, PipelineBalance balance, const std::string& cuts) {
    if (stages < 2 || stages > kPipelineUnits)
        throw core::ConfigError("pipeline.stages=" + std::to_string(stages) +
                                ": MobileNetV2 splits into at most " +
                                std::to_string(kPipelineUnits) +
                                " units (19 feature units + the classifier head) and a pipeline "
                                "needs at least 2 stages; use 2.." +
                                std::to_string(kPipelineUnits));
    PipelinePlan plan;
    plan.balance = balance;
    plan.explicit_cuts = !cuts.empty();
    plan.image_size = image_size;
    plan.input = {model.in_channels, image_size, image_size};
    plan.units = measure_units(model, image_size);

    std::vector<int> starts;
    if (plan.explicit_cuts) {
        starts = parse_cuts(cuts, stages);
    } else {
        std::vector<std::int64_t> cost;
        for (const auto& u : plan.units)
            cost.push_back(balance == PipelineBalance::Params ? u.params : u.macs);
        starts = balanced_starts(cost, stages);
    }
    for (int s = 0; s < stages; ++s) {
        StagePlan st;
        st.first_unit = starts[s];
        st.last_unit = s + 1 < stages ? starts[s + 1] - 1 : kPipelineUnits - 1;
        for (int u = st.first_unit; u <= st.last_unit; ++u) {
            st.unit_names.push_back(plan.units[u].name);
            st.params += plan.units[u].params;
            st.macs += plan.units[u].macs;
        }
        st.input = st.first_unit == 0 ? plan.input : plan.units[st.first_unit - 1].output;
        st.output = plan.units[st.last_unit].output;
        plan.stages.push_back(std::move(st));
    }
    return plan;
}

std::string describe(const PipelinePlan& plan) {
    std::int64_t params = 0, macs = 0, max_cost = 0;
    const bool by_params = plan.balance == PipelineBalance::Params && !plan.explicit_cuts;
    for (const auto& s : plan.stages) {
        params += s.params;
        macs += s.macs;
        max_cost = std::max(max_cost, by_params ? s.params : s.macs);
    }
    std::ostringstream o;
    o << "pipeline: " << plan.num_stages() << " stages over " << plan.units.size()
      << " units, image " << shape_string(plan.input) << ", "
      << (plan.explicit_cuts ? std::string("explicit pipeline.cuts")
                             : std::string("balanced by ") + to_string(plan.balance))
      << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "%-5s  %-34s  %11s  %7s  %14s  %7s  %s\n", "stage", "units",
                  "params", "params%", "MFLOPs/sample", "FLOPs%", "sends/sample");
    o << line;
    for (int i = 0; i < plan.num_stages(); ++i) {
        const StagePlan& s = plan.stages[i];
        const std::string units =
            s.first_unit == s.last_unit
                ? std::to_string(s.first_unit) + " (" + s.unit_names.front() + ")"
                : std::to_string(s.first_unit) + "-" + std::to_string(s.last_unit) + " (" +
                      s.unit_names.front() + ".." + s.unit_names.back() + ")";
        const bool last = i + 1 == plan.num_stages();
        const std::string sends =
            last ? "(loss)" : shape_string(s.output) + " = " + std::to_string(numel(s.output));
        std::snprintf(line, sizeof line, "%-5d  %-34s  %11lld  %6.1f%%  %14.2f  %6.1f%%  %s\n", i,
                      units.c_str(), static_cast<long long>(s.params),
                      100.0 * s.params / std::max<std::int64_t>(params, 1), 2e-6 * s.macs,
                      100.0 * s.macs / std::max<std::int64_t>(macs, 1), sends.c_str());
        o << line;
    }
    const double mean = static_cast<double>(by_params ? params : macs) / plan.num_stages();
    std::snprintf(line, sizeof line,
                  "total  %-34s  %11lld  %7s  %14.2f  %7s  (slowest stage %.2fx the mean %s)\n", "",
                  static_cast<long long>(params), "", 2e-6 * macs, "",
                  mean > 0 ? max_cost / mean : 0.0, by_params ? "params" : "FLOPs");
    o << line;
    return o.str();
}

int pipeline_replicas(int world_size, int stages) {
    if (stages < 1 || world_size % stages != 0) {
        std::string divisors;
        for (int d = 2; d <= std::min(world_size, kPipelineUnits); ++d)
            if (world_size % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
        throw core::ConfigError(
            "run.strategy=pipeline with pipeline.stages=" + std::to_string(stages) + " needs a " +
            "world size that is a multiple of " + std::to_string(stages) +
            " (stages x data-parallel replicas), but " + std::to_string(world_size) +
            " ranks were launched: launch " + std::to_string(stages) + ", " +
            std::to_string(2 * stages) + ", ... ranks" +
            (divisors.empty() ? std::string()
                              : ", or set pipeline.stages to a divisor of " +
                                    std::to_string(world_size) + " (" + divisors + ")"));
    }
    return world_size / stages;
}

PipelineGroups make_pipeline_groups(MPI_Comm world, int stages, const std::string& backend,
                                    torch::Device device, double timeout_s,
                                    const dist::AllreduceOptions& allreduce) {
    auto check = [](int code, const char* call) {
        if (code != MPI_SUCCESS)
            throw core::DistributedError(std::string(call) + " failed (MPI error " +
                                         std::to_string(code) + ")");
    };
    int rank = 0, size = 1;
    check(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
    check(MPI_Comm_size(world, &size), "MPI_Comm_size");
    PipelineGroups g;
    g.stages = stages;
    g.replicas = pipeline_replicas(size, stages);
    g.stage = rank % stages;
    g.replica = rank / stages;
    MPI_Comm pipe = MPI_COMM_NULL, dp = MPI_COMM_NULL;
    check(MPI_Comm_split(world, /*color=*/g.replica, /*key=*/g.stage, &pipe), "MPI_Comm_split");
    check(MPI_Comm_split(world, /*color=*/g.stage, /*key=*/g.replica, &dp), "MPI_Comm_split");
    // make_communicator duplicates what it is given, so the split communicators can go.
    try {
        g.pipe = dist::make_communicator(backend, pipe, device, timeout_s, allreduce);
        g.dp = dist::make_communicator(backend, dp, device, timeout_s, allreduce);
    } catch (...) {
        MPI_Comm_free(&pipe);
        MPI_Comm_free(&dp);
        throw;
    }
    MPI_Comm_free(&pipe);
    MPI_Comm_free(&dp);
    return g;
}

// ---- stage module
// --------------------------------------------------------------------------------

PipelineStageImpl::PipelineStageImpl(const models::MobileNetV2& full, const PipelinePlan& plan,
                                     int stage)
    : stage_(stage) {
    if (stage < 0 || stage >= plan.num_stages())
        throw core::InternalError("pipeline stage " + std::to_string(stage) + " outside [0, " +
                                  std::to_string(plan.num_stages()) + ")");
    plan_ = plan.stages[stage];
    const int feature_units = static_cast<int>(full->features->size());
    if (feature_units != kPipelineUnits - 1)
        throw core::InternalError("MobileNetV2 has " + std::to_string(feature_units) +
                                  " feature units; the pipeline expects " +
                                  std::to_string(kPipelineUnits - 1));
    // Registered under their index in the full model's "features", so names match it.
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> kept;
    for (int u = plan_.first_unit; u <= std::min(plan_.last_unit, feature_units - 1); ++u) {
        units_.push_back(*(full->features->begin() + u));
        kept.emplace_back(std::to_string(u), full->features->ptr(u));
    }
    if (!kept.empty()) register_module("features", torch::nn::ModuleDict(kept));
    if (plan_.last_unit == kPipelineUnits - 1)
        classifier_ = register_module("classifier", full->classifier);
}

torch::Tensor PipelineStageImpl::forward(const torch::Tensor& x) {
    torch::Tensor h = x;
    for (auto& unit : units_)
        h = unit.forward(h);
    if (!classifier_) return h;
    h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1); // [B, C]
    return classifier_->forward(h);                       // [B, classes]
}

// ---- GPipe engine
// --------------------------------------------------------------------------------

PipelineEngine::PipelineEngine(PipelineStage stage, const PipelinePlan& plan,
                               dist::Communicator& pipe, int microbatches, std::int64_t batch_size)
    : stage_(std::move(stage)), pipe_(pipe), stage_index_(stage_->stage()),
      num_stages_(plan.num_stages()), microbatches_(microbatches), batch_size_(batch_size) {
    if (pipe.size() != num_stages_ || pipe.rank() != stage_index_)
        throw core::InternalError("pipeline engine: stage " + std::to_string(stage_index_) +
                                  " of " + std::to_string(num_stages_) +
                                  " on a pipe communicator rank " + std::to_string(pipe.rank()) +
                                  " of " + std::to_string(pipe.size()) +
                                  " (rank must equal stage)");
    if (microbatches < 1)
        throw core::ConfigError("pipeline.microbatches=" + std::to_string(microbatches) +
                                ": need at least 1");
    if (stage_->parameters().empty())
        throw core::InternalError("pipeline stage without parameters");
}

std::vector<std::int64_t> PipelineEngine::microbatch_sizes(std::int64_t batch) const {
    // torch::chunk: pieces of ceil(B/M), the last one smaller (so possibly fewer than M pieces).
    const std::int64_t piece = (batch + microbatches_ - 1) / microbatches_;
    std::vector<std::int64_t> sizes;
    for (std::int64_t done = 0; done < batch; done += piece)
        sizes.push_back(std::min(piece, batch - done));
    return sizes;
}

std::int64_t PipelineEngine::resolve_batch(const torch::Tensor& images, const torch::Tensor& labels,
                                           std::int64_t batch_size) const {
    if (is_first() && !images.defined())
        throw core::InternalError("pipeline stage 0 needs the images");
    if (images.defined() && labels.defined() && images.size(0) != labels.size(0))
        throw core::InternalError("pipeline step: " + std::to_string(images.size(0)) +
                                  " images but " + std::to_string(labels.size(0)) + " labels");
    const std::int64_t b = images.defined()   ? images.size(0)
                           : labels.defined() ? labels.size(0)
                           : batch_size > 0   ? batch_size
                                              : batch_size_;
    if (b < 1)
        throw core::InternalError("pipeline stage " + std::to_string(stage_index_) +
                                  ": batch size unknown or empty (" + std::to_string(b) + ")");
    return b;
}

torch::Tensor PipelineEngine::buffer(const std::vector<std::int64_t>& per_sample,
                                     std::int64_t n) const {
    std::vector<std::int64_t> shape{n};
    shape.insert(shape.end(), per_sample.begin(), per_sample.end());
    return torch::empty(shape, stage_->parameters().front().options());
}

torch::Tensor PipelineEngine::step(const torch::Tensor& images, const torch::Tensor& labels,
                                   std::int64_t batch_size,
                                   const std::function<void()>& after_forward) {
    if (is_last() && !labels.defined())
        throw core::InternalError("the last pipeline stage needs the labels");
    const std::int64_t batch = resolve_batch(images, labels, batch_size);
    const std::vector<std::int64_t> sizes = microbatch_sizes(batch);
    const int m_count = static_cast<int>(sizes.size());
    const torch::Dtype dtype = stage_->parameters().front().scalar_type();
    std::vector<torch::Tensor> image_parts, label_parts;
    if (is_first()) image_parts = images.split_with_sizes(sizes);
    if (is_last()) label_parts = labels.split_with_sizes(sizes);
    using Op = dist::P2POp;
    const int prev = stage_index_ - 1, next = stage_index_ + 1;

    // Per micro-batch: the received input (a leaf whose .grad goes back to stage-1) and what
    // backward starts from (the weighted loss on the last stage, the output elsewhere).
    std::vector<torch::Tensor> inputs(m_count), outputs(m_count);
    torch::Tensor loss_sum;
    const StagePlan& sp = stage_->plan();
    torch::Tensor received; // the next micro-batch's input, received by the previous batch
    if (!is_first()) {
        received = buffer(sp.input, sizes[0]);
        pipe_.exchange({Op{Op::Kind::Recv, received, prev}});
    }
    for (int m = 0; m < m_count; ++m) {
        torch::Tensor x;
        if (is_first()) {
            x = image_parts[m];
        } else {
            x = received.requires_grad_(true);
            inputs[m] = x;
        }
        torch::Tensor y = stage_->forward(x);
        std::vector<Op> ops;
        if (is_last()) {
            // Mean over the micro-batch x its share of the batch: the sum is the batch mean.
            torch::Tensor loss = torch::nn::functional::cross_entropy(y, label_parts[m]) *
                                 (static_cast<double>(sizes[m]) / static_cast<double>(batch));
            loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
            outputs[m] = loss;
        } else {
            ops.push_back({Op::Kind::Send, y.detach().to(dtype).contiguous(), next});
            outputs[m] = y;
        }
        if (!is_first() && m + 1 < m_count) {
            received = buffer(sp.input, sizes[m + 1]);
            ops.push_back({Op::Kind::Recv, received, prev});
        }
        if (!ops.empty()) pipe_.exchange(ops);
    }
    if (after_forward) after_forward();
    torch::Tensor grad_received; // d loss / d output of the next micro-batch backward runs
    if (!is_last()) {
        grad_received = buffer(sp.output, sizes[m_count - 1]);
        pipe_.exchange({Op{Op::Kind::Recv, grad_received, next}});
    }
    for (int m = m_count - 1; m >= 0; --m) {
        torch::Tensor grad_out; // undefined on the last stage (scalar loss)
        if (!is_last()) grad_out = grad_received.to(outputs[m].scalar_type());
        outputs[m].backward(grad_out);
        std::vector<Op> ops;
        if (!is_first()) {
            const torch::Tensor& g = inputs[m].grad();
            ops.push_back({Op::Kind::Send,
                           g.defined() ? g.contiguous() : torch::zeros_like(inputs[m]), prev});
        }
        if (!is_last() && m > 0) {
            grad_received = buffer(sp.output, sizes[m - 1]);
            ops.push_back({Op::Kind::Recv, grad_received, next});
        }
        if (!ops.empty()) pipe_.exchange(ops);
        inputs[m] = outputs[m] = torch::Tensor(); // free the micro-batch's graph and activations
    }
    return is_last() ? loss_sum : torch::Tensor();
}

torch::Tensor PipelineEngine::forward_only(const torch::Tensor& images, std::int64_t batch_size) {
    torch::NoGradGuard no_grad;
    const std::int64_t batch = resolve_batch(images, torch::Tensor(), batch_size);
    const std::vector<std::int64_t> sizes = microbatch_sizes(batch);
    const torch::Dtype dtype = stage_->parameters().front().scalar_type();
    std::vector<torch::Tensor> image_parts, logits;
    if (is_first()) image_parts = images.split_with_sizes(sizes);
    using Op = dist::P2POp;
    // The forward schedule of step(): {send output m, receive input m+1} per batch.
    torch::Tensor received;
    if (!is_first()) {
        received = buffer(stage_->plan().input, sizes[0]);
        pipe_.exchange({Op{Op::Kind::Recv, received, stage_index_ - 1}});
    }
    for (std::size_t m = 0; m < sizes.size(); ++m) {
        torch::Tensor x = is_first() ? image_parts[m] : received;
        torch::Tensor y = stage_->forward(x);
        std::vector<Op> ops;
        if (is_last())
            logits.push_back(y);
        else
            ops.push_back({Op::Kind::Send, y.to(dtype).contiguous(), stage_index_ + 1});
        if (!is_first() && m + 1 < sizes.size()) {
            received = buffer(stage_->plan().input, sizes[m + 1]);
            ops.push_back({Op::Kind::Recv, received, stage_index_ - 1});
        }
        if (!ops.empty()) pipe_.exchange(ops);
    }
    return is_last() ? torch::cat(logits) : torch::Tensor();
}

} // namespace trainscope::train
