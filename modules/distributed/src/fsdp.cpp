#include "trainscope/distributed/fsdp.hpp"

#include <c10/core/StorageImpl.h>

#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "trainscope/core/error.hpp"

namespace trainscope::dist {

namespace {

double nbytes(const torch::Tensor& t) {
    return static_cast<double>(t.nbytes());
}

// Reduce-scatters in flight before the oldest is waited for: bounds the full flat gradients
// alive at once (FSDP keeps a similar small window), so memory does not grow with the depth.
constexpr std::size_t kMaxReducesInFlight = 2;

// The memory behind `t`'s storage (and every view of it): allocated anew with `bytes` from the
// storage's own allocator, or released with 0. Sizes, strides and offsets of the views are
// untouched, so autograd's saved views read the new memory once it is filled.
void set_storage_bytes(const torch::Tensor& t, std::size_t bytes) {
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
    s->set_nbytes(bytes);
}

} // namespace

struct FsdpModel::Group {
    torch::ScalarType dtype = torch::kFloat32;
    bool trainable = false;
    std::vector<torch::Tensor> tensors; // the module's tensors (views of `full` when gathered)
    std::vector<std::string> names;     // their names in the model
    std::vector<std::int64_t> offsets;  // element offsets in the flat buffer
    std::int64_t numel = 0, shard = 0, padded = 0;
    torch::Tensor full;  // [padded]; storage empty while sharded
    torch::Tensor local; // [shard], this rank's part, permanent
    // Trainable groups: the gradient shard (summed over micro-batches) and AdamW's moments.
    torch::Tensor grad_shard, exp_avg, exp_avg_sq;
    bool nf4 = false; // buffers of NF4 projections (codes, scales, factors)
    double full_bytes() const { return static_cast<double>(padded) * c10::elementSize(dtype); }
};

struct FsdpModel::Unit {
    std::string name;
    std::vector<Group> groups;
    enum class State { Sharded, Gathering, Gathered } state = State::Sharded;
    std::vector<std::shared_ptr<Work>> gathers; // pending while Gathering
    bool backward_pending = false;              // forward ran with grad; after_backward not yet
    bool trainable = false;
    double full_bytes = 0;
};

struct FsdpModel::PendingReduce {
    std::shared_ptr<Work> work;
    torch::Tensor flat, out; // kept alive until the collective finished
    Group* group = nullptr;
};

FsdpModel::FsdpModel(Communicator& comm, UnitModel& model, FsdpOptions options)
    : comm_(comm), gather_lane_(comm.make_lane()), model_(model), o_(options), rank_(comm.rank()),
      world_(comm.size()) {
    if (world_ == 1) o_.reduce_dtype.reset(); // nothing travels, nothing to compress
    torch::NoGradGuard no_grad;
    std::set<const c10::TensorImpl*> seen; // a tensor registered twice (QAT's weight) once
    for (int index = 0; index < model.num_units(); ++index) {
        // A model built on the meta device gets this unit's memory and values now; the unit is
        // sharded and its full buffer released before the next one is materialised, so no rank
        // ever holds more than its shards and one unit.
        if (o_.materialize) o_.materialize(index);
        if (!model.unit_materialized(index))
            throw core::InternalError("FSDP: unit " + std::to_string(index) +
                                      " is still on the meta device");
        const auto modules = model.unit_modules(index);
        auto unit = std::make_unique<Unit>();
        unit->name = index == 0                       ? std::string("embed_tokens")
                     : index == model.num_units() - 1 ? std::string("head")
                                                      : modules.front().first;
        if (unit->name.back() == '.') unit->name.pop_back();
        // (dtype, trainable, buffer) -> group; buffers (NF4 codes and scales) apart from the
        // dense weights, so the memory columns can tell them apart.
        std::map<std::tuple<int, bool, bool>, Group> groups;
        auto add = [&](const std::string& name, const torch::Tensor& t, bool nf4) {
            if (!t.defined() || t.numel() == 0) return;
            if (!seen.insert(t.unsafeGetTensorImpl()).second) return;
            if (!t.is_contiguous())
                throw core::InternalError("FSDP: tensor " + name + " is not contiguous");
            Group& g = groups[{static_cast<int>(t.scalar_type()), t.requires_grad(), nf4}];
            g.dtype = t.scalar_type();
            g.trainable = t.requires_grad();
            g.nf4 = nf4;
            g.tensors.push_back(t);
            g.names.push_back(name);
            g.offsets.push_back(g.numel);
            g.numel += t.numel();
        };
        for (const auto& [prefix, module] : modules) {
            for (const auto& p : module->named_parameters(/*recurse=*/true))
                add(prefix + p.key(), p.value(), false);
            for (const auto& b : module->named_buffers(/*recurse=*/true))
                add(prefix + b.key(), b.value(), true);
        }
        for (auto& [key, g] : groups) {
            g.shard = (g.numel + world_ - 1) / world_;
            g.padded = g.shard * world_;
            const auto opts = g.tensors.front().options();
            // Rank 0's values for everyone, then this rank's shard; the module's tensors become
            // views of the full buffer.
            g.full = torch::zeros({g.padded}, opts.requires_grad(false));
            for (std::size_t i = 0; i < g.tensors.size(); ++i)
                g.full.narrow(0, g.offsets[i], g.tensors[i].numel())
                    .copy_(g.tensors[i].reshape({-1}));
            comm_.broadcast(g.full, 0);
            g.local = g.full.narrow(0, rank_ * g.shard, g.shard).clone();
            for (std::size_t i = 0; i < g.tensors.size(); ++i) {
                torch::Tensor& t = g.tensors[i];
                t.set_data(g.full.narrow(0, g.offsets[i], t.numel()).view(t.sizes()));
            }
            if (g.trainable) {
                g.grad_shard = torch::zeros({g.shard}, opts.requires_grad(false));
                g.exp_avg = torch::zeros({g.shard}, opts.requires_grad(false));
                g.exp_avg_sq = torch::zeros({g.shard}, opts.requires_grad(false));
                unit->trainable = true;
            }
            unit->full_bytes += g.full_bytes();
            unit->groups.push_back(std::move(g));
        }
        unit->state = Unit::State::Gathered;
        free(*unit);
        units_.push_back(std::move(unit));
    }
    o_.materialize = nullptr; // what it holds (a checkpoint's mapping) is no longer needed
    model_.set_unit_hooks(this);
}

FsdpModel::~FsdpModel() {
    model_.set_unit_hooks(nullptr);
    // Collectives still pending own their buffers; waiting here could hang on a dead peer, and
    // the destructor runs when the job ends or fails.
}

bool FsdpModel::keep_after_forward(int unit) const {
    // The head (the last unit) reads a tied embedding.
    if (unit == 0 && model_.first_and_last_tied()) return true;
    if (!torch::GradMode::is_enabled()) return false; // no backward follows
    if (!o_.reshard_after_forward) return true;
    return unit == num_units() - 1; // the head: backward needs it at once
}

void FsdpModel::gather(Unit& u) {
    if (u.state != Unit::State::Sharded) return;
    for (Group& g : u.groups) {
        set_storage_bytes(g.full, static_cast<std::size_t>(g.full_bytes()));
        u.gathers.push_back(
            (gather_lane_ ? *gather_lane_ : comm_).allgather_async(g.local, g.full));
        comm_now_.allgather_bytes += static_cast<double>(g.local.nbytes());
        ++comm_now_.allgathers;
    }
    u.state = Unit::State::Gathering;
}

void FsdpModel::wait_gathered(Unit& u) {
    if (u.state == Unit::State::Sharded) gather(u);
    if (u.state == Unit::State::Gathered) return;
    for (auto& w : u.gathers) {
        w->wait(); // its exposed part is measured by the Work (resolved in iteration_comm)
        gathers_done_.push_back(w);
    }
    u.gathers.clear();
    u.state = Unit::State::Gathered;
}

void FsdpModel::free(Unit& u) {
    if (u.state == Unit::State::Gathering) wait_gathered(u); // its buffers are in use
    if (u.state != Unit::State::Gathered) return;
    for (Group& g : u.groups)
        set_storage_bytes(g.full, 0);
    u.state = Unit::State::Sharded;
}

void FsdpModel::before_forward(int unit) {
    Unit& u = *units_[static_cast<std::size_t>(unit)];
    if (o_.prefetch) gather(u); // no-op when a prefetch issued it
    wait_gathered(u);
    if (o_.prefetch && unit + 1 < num_units()) gather(*units_[static_cast<std::size_t>(unit + 1)]);
}

void FsdpModel::after_forward(int unit) {
    Unit& u = *units_[static_cast<std::size_t>(unit)];
    const bool grad = torch::GradMode::is_enabled();
    if (grad) u.backward_pending = true;
    if (!keep_after_forward(unit)) free(u);
    // Without grad (DPO's reference forward) the tied embedding was kept for the head only.
    if (!grad && unit == num_units() - 1 && model_.first_and_last_tied()) free(*units_.front());
}

void FsdpModel::before_backward(int unit) {
    wait_gathered(*units_[static_cast<std::size_t>(unit)]);
    // The next unit backward reaches (the embedding's backward needs no weights).
    if (o_.prefetch && unit - 1 >= 1) {
        Unit& next = *units_[static_cast<std::size_t>(unit - 1)];
        if (next.backward_pending) gather(next);
    }
}

void FsdpModel::after_backward(int unit) {
    Unit& u = *units_[static_cast<std::size_t>(unit)];
    if (!u.backward_pending) return;
    u.backward_pending = false;
    reduce_gradients(u);
    free(u);
}

void FsdpModel::reduce_gradients(Unit& u) {
    torch::NoGradGuard no_grad;
    for (Group& g : u.groups) {
        if (!g.trainable) continue;
        // One flat gradient [padded] from the tensors' .grad (zeros where autograd left none: every
        // rank must issue the same collectives), the padding zero; in the reduce dtype when
        // compressed (copy_ casts).
        const auto options =
            o_.reduce_dtype ? g.local.options().dtype(*o_.reduce_dtype) : g.local.options();
        torch::Tensor flat = torch::zeros({g.padded}, options);
        for (std::size_t i = 0; i < g.tensors.size(); ++i) {
            torch::Tensor& t = g.tensors[i];
            if (t.grad().defined())
                flat.narrow(0, g.offsets[i], t.numel()).copy_(t.grad().reshape({-1}));
            t.mutable_grad() = torch::Tensor();
        }
        if (o_.reduce_dtype) flat.div_(world_); // pre-divided, as PyTorch's fp16 hook
        while (reduces_.size() >= kMaxReducesInFlight)
            retire_reduce();
        PendingReduce r;
        r.out = torch::empty({g.shard}, options);
        r.flat = flat;
        r.group = &g;
        r.work = comm_.reduce_scatter_async(flat, r.out, ReduceOp::Sum);
        comm_now_.reduce_scatter_bytes += static_cast<double>(r.out.nbytes());
        comm_now_.reduce_scatter_uncompressed_bytes +=
            static_cast<double>(g.shard) * static_cast<double>(c10::elementSize(g.dtype));
        ++comm_now_.reduce_scatters;
        reduces_.push_back(std::move(r));
    }
}

void FsdpModel::retire_reduce() {
    PendingReduce& r = reduces_.front();
    r.work->wait();
    {
        torch::NoGradGuard no_grad;
        r.group->grad_shard.add_(r.out); // widens a compressed shard
    }
    reduces_done_.push_back(r.work);
    reduces_.pop_front();
}

void FsdpModel::begin_iteration() {
    torch::NoGradGuard no_grad;
    comm_now_ = FsdpIterationComm{};
    gathers_done_.clear();
    reduces_done_.clear();
    for (auto& u : units_)
        for (Group& g : u->groups)
            if (g.trainable) g.grad_shard.zero_();
}

void FsdpModel::end_backward() {
    // Units autograd did not finish (the embedding; units whose input needed no gradient), last
    // unit first as backward would have.
    for (int i = num_units() - 1; i >= 0; --i)
        after_backward(i);
    for (auto& u : units_)
        free(*u);
}

void FsdpModel::wait_reduces() {
    while (!reduces_.empty())
        retire_reduce();
}

void FsdpModel::finish_gradients(double grad_scale) {
    wait_reduces();
    std::vector<torch::Tensor> shards;
    for (auto& u : units_)
        for (Group& g : u->groups)
            if (g.trainable) shards.push_back(g.grad_shard);
    // Compressed reduce-scatters were divided by the world size before the sum.
    foreach_scale(shards, o_.reduce_dtype ? grad_scale : grad_scale / world_);
}

torch::Tensor FsdpModel::shard_gradient_sum() const {
    std::vector<torch::Tensor> shards;
    for (const auto& u : units_)
        for (const Group& g : u->groups)
            if (g.trainable && g.grad_shard.numel() > 0) shards.push_back(g.grad_shard);
    // One multi-tensor check instead of a sum per shard.
    return shards.empty() ? torch::Tensor() : nonfinite_marker(shards, shards.front().device());
}

void FsdpModel::step(double lr) {
    ++step_count_;
    std::vector<torch::Tensor> params, grads, avgs, sqs;
    for (auto& u : units_)
        for (Group& g : u->groups)
            if (g.trainable) {
                if (!o_.adamw.fused) {
                    adamw_update(g.local, g.grad_shard, g.exp_avg, g.exp_avg_sq, step_count_, lr,
                                 o_.adamw);
                    continue;
                }
                params.push_back(g.local);
                grads.push_back(g.grad_shard);
                avgs.push_back(g.exp_avg);
                sqs.push_back(g.exp_avg_sq);
            }
    // Every unit's shards in one fused kernel per dtype.
    if (!params.empty()) fused_adamw_update(params, grads, avgs, sqs, step_count_, lr, o_.adamw);
}

FsdpIterationComm FsdpPendingComm::resolve() const {
    FsdpIterationComm c = known;
    for (const auto& w : gathers) {
        c.allgather_s += w->seconds();
        c.allgather_exposed_s += w->exposed_seconds();
    }
    for (const auto& w : reduces) {
        c.reduce_scatter_s += w->seconds();
        c.reduce_scatter_exposed_s += w->exposed_seconds();
    }
    return c;
}

FsdpPendingComm FsdpModel::take_iteration_comm() {
    FsdpPendingComm p;
    p.known = comm_now_;
    p.gathers = std::move(gathers_done_);
    p.reduces = std::move(reduces_done_);
    gathers_done_.clear();
    reduces_done_.clear();
    return p;
}

FsdpIterationComm FsdpModel::iteration_comm() {
    return take_iteration_comm().resolve();
}

void FsdpModel::with_trainable_gathered(const std::function<void()>& fn) {
    torch::NoGradGuard no_grad;
    // Trainable groups only, into the module's own storage; the units stay "sharded" for the
    // forward logic (their frozen groups are not gathered).
    std::vector<Group*> done;
    for (auto& u : units_) {
        if (u->state != Unit::State::Sharded)
            throw core::InternalError("FSDP: gathering trainable tensors while unit " + u->name +
                                      " is in use");
        for (Group& g : u->groups)
            if (g.trainable) {
                set_storage_bytes(g.full, static_cast<std::size_t>(g.full_bytes()));
                comm_.allgather(g.local, g.full);
                done.push_back(&g);
            }
    }
    // fn reads the gathered tensors on the host (rank 0's adapter or checkpoint): the gathers end
    // within dist.timeout, or the stalled peer is named (NCCL; nothing to wait for on MPI).
    comm_.synchronize("gathering the trainable tensors");
    std::exception_ptr error;
    try {
        fn();
    } catch (...) {
        error = std::current_exception();
    }
    for (Group* g : done)
        set_storage_bytes(g->full, 0);
    if (error) std::rethrow_exception(error);
}

std::vector<torch::Tensor> FsdpModel::gather_trainable(const std::vector<std::string>& names) {
    std::map<std::string, torch::Tensor> by_name;
    with_trainable_gathered([&] {
        for (auto& u : units_)
            for (Group& g : u->groups)
                if (g.trainable)
                    for (std::size_t i = 0; i < g.tensors.size(); ++i)
                        by_name[g.names[i]] = g.tensors[i].detach().to(torch::kCPU).clone();
    });
    std::vector<torch::Tensor> out;
    for (const auto& n : names) {
        auto it = by_name.find(n);
        if (it == by_name.end()) throw core::InternalError("FSDP: no trainable tensor named " + n);
        out.push_back(it->second);
    }
    return out;
}

void FsdpModel::save(torch::serialize::OutputArchive& out) const {
    std::int64_t k = 0;
    for (const auto& u : units_)
        for (const Group& g : u->groups)
            if (g.trainable) {
                const std::string p = "g" + std::to_string(k++) + ".";
                out.write(p + "param", g.local, /*is_buffer=*/true);
                out.write(p + "exp_avg", g.exp_avg, /*is_buffer=*/true);
                out.write(p + "exp_avg_sq", g.exp_avg_sq, /*is_buffer=*/true);
            }
    out.write("groups", c10::IValue(k));
    out.write("world_size", c10::IValue(static_cast<std::int64_t>(world_)));
    out.write("step_count", c10::IValue(step_count_));
}

namespace {
// The end of a dist.zero=3 shard archive: its trainable group count (checked against the k this
// model loaded) and the optimizer's step count.
std::int64_t saved_step_count(torch::serialize::InputArchive& in, std::int64_t k) {
    c10::IValue v;
    in.read("groups", v);
    if (v.toInt() != k)
        throw core::InputError("checkpoint: " + std::to_string(v.toInt()) +
                               " trainable dist.zero=3 groups saved, this model has " +
                               std::to_string(k) + ": resume with the same model and method");
    in.read("step_count", v);
    return v.toInt();
}
} // namespace

void FsdpModel::load_resharded(ShardSource& saved) {
    torch::NoGradGuard no_grad;
    torch::serialize::InputArchive first;
    saved.rank(0).read("fsdp_shard", first);
    std::int64_t k = 0;
    for (auto& u : units_)
        for (Group& g : u->groups)
            if (g.trainable) {
                const std::string p = "g" + std::to_string(k++) + ".";
                torch::Tensor param =
                    saved.reshard("fsdp_shard", p + "param", g.numel, rank_, world_);
                if (param.scalar_type() != g.dtype)
                    throw core::InputError(
                        "checkpoint: the dist.zero=3 shard of unit " + u->name + " is " +
                        std::string(c10::toString(param.scalar_type())) + ", this run's is " +
                        c10::toString(g.dtype) + ": resume with the same precision");
                g.local.copy_(param);
                g.exp_avg.copy_(saved.reshard("fsdp_shard", p + "exp_avg", g.numel, rank_, world_));
                g.exp_avg_sq.copy_(
                    saved.reshard("fsdp_shard", p + "exp_avg_sq", g.numel, rank_, world_));
            }
    step_count_ = saved_step_count(first, k);
}

void FsdpModel::load(torch::serialize::InputArchive& in) {
    torch::NoGradGuard no_grad;
    c10::IValue v;
    in.read("world_size", v);
    if (v.toInt() != world_)
        throw core::InputError("checkpoint: saved by " + std::to_string(v.toInt()) +
                               " ranks under dist.zero=3, this job has " + std::to_string(world_) +
                               ": resume with the same rank count (each rank holds its shard)");
    std::int64_t k = 0;
    for (auto& u : units_)
        for (Group& g : u->groups)
            if (g.trainable) {
                const std::string p = "g" + std::to_string(k++) + ".";
                torch::Tensor param, a, b;
                in.read(p + "param", param, /*is_buffer=*/true);
                in.read(p + "exp_avg", a, /*is_buffer=*/true);
                in.read(p + "exp_avg_sq", b, /*is_buffer=*/true);
                if (!param.sizes().equals(g.local.sizes()) || param.scalar_type() != g.dtype)
                    throw core::InputError("checkpoint: the dist.zero=3 shard of unit " + u->name +
                                           " has " + std::to_string(param.numel()) +
                                           " elements, this rank's has " +
                                           std::to_string(g.local.numel()) +
                                           ": resume with the same model, method "
                                           "and rank count");
                g.local.copy_(param);
                g.exp_avg.copy_(a);
                g.exp_avg_sq.copy_(b);
            }
    step_count_ = saved_step_count(in, k);
}

double FsdpModel::sum_groups(const std::function<double(const Group&)>& bytes) const {
    double b = 0;
    for (const auto& u : units_)
        for (const Group& g : u->groups)
            b += bytes(g);
    return b;
}
double FsdpModel::trainable_shard_bytes() const {
    return sum_groups([](const Group& g) { return g.trainable ? nbytes(g.local) : 0.0; });
}
double FsdpModel::frozen_shard_bytes() const {
    return sum_groups(
        [](const Group& g) { return !g.trainable && !g.nf4 ? nbytes(g.local) : 0.0; });
}
double FsdpModel::nf4_shard_bytes() const {
    return sum_groups([](const Group& g) { return g.nf4 ? nbytes(g.local) : 0.0; });
}
double FsdpModel::gradient_bytes() const {
    double b = sum_groups([](const Group& g) { return g.trainable ? nbytes(g.grad_shard) : 0.0; });
    for (const auto& r : reduces_)
        b += nbytes(r.flat) + nbytes(r.out);
    return b;
}
double FsdpModel::optimizer_state_bytes() const {
    return sum_groups([](const Group& g) {
        return g.trainable ? nbytes(g.exp_avg) + nbytes(g.exp_avg_sq) : 0.0;
    });
}
double FsdpModel::gathered_bytes() const {
    double b = 0;
    for (const auto& u : units_)
        if (u->state != Unit::State::Sharded) b += u->full_bytes;
    return b;
}
double FsdpModel::largest_unit_bytes() const {
    double b = 0;
    for (const auto& u : units_)
        b = std::max(b, u->full_bytes);
    return b;
}

namespace {

class FsdpParallelism final : public DataParallelism {
  public:
    FsdpParallelism(Communicator& comm, std::shared_ptr<UnitModel> model, FsdpOptions options,
                    std::vector<std::string> names)
        : model_(std::move(model)), names_(std::move(names)), fsdp_(comm, *model_, options) {
        if (names_.empty()) // known only now when the units were materialised by fsdp_
            for (const auto& p : model_->module().named_parameters(/*recurse=*/true))
                if (p.value().requires_grad()) names_.push_back(p.key());
    }

    std::string name() const override { return "fsdp"; }
    void begin_iteration() override { fsdp_.begin_iteration(); }
    void after_backward() override { fsdp_.end_backward(); }
    void wait_in_flight() override { fsdp_.wait_reduces(); }
    void finish_gradients(double grad_scale) override { fsdp_.finish_gradients(grad_scale); }
    std::vector<torch::Tensor> gradient_shard_sums() const override {
        return {fsdp_.shard_gradient_sum()};
    }
    void set_lr(double lr) override { lr_ = lr; }
    bool step(const OptimizerStep&) override {
        fsdp_.step(lr_);
        return true;
    }
    PendingParallelComm take_iteration_comm() override {
        auto pending = std::make_shared<FsdpPendingComm>(fsdp_.take_iteration_comm());
        PendingParallelComm p;
        const FsdpIterationComm& c = pending->known;
        p.known.bytes = c.allgather_bytes + c.reduce_scatter_bytes;
        p.known.uncompressed_bytes = c.allgather_bytes + c.reduce_scatter_uncompressed_bytes;
        p.known.allgather_bytes = c.allgather_bytes;
        p.known.reduce_scatter_bytes = c.reduce_scatter_bytes;
        p.resolve = [known = p.known, pending] {
            const FsdpIterationComm r = pending->resolve();
            ParallelComm out = known;
            out.collective_s = r.allgather_s + r.reduce_scatter_s;
            out.allgather_s = r.allgather_s;
            out.allgather_exposed_s = r.allgather_exposed_s;
            out.reduce_scatter_s = r.reduce_scatter_s;
            out.reduce_scatter_exposed_s = r.reduce_scatter_exposed_s;
            return out;
        };
        return p;
    }
    HeldBytes held_bytes() const override {
        HeldBytes h;
        h.trainable = fsdp_.trainable_shard_bytes();
        h.gradients = fsdp_.gradient_bytes();
        h.optimizer_state = fsdp_.optimizer_state_bytes();
        h.gathered = fsdp_.gathered_bytes();
        return h;
    }
    void frozen_bytes(double& dense, double& nf4) const override {
        dense = fsdp_.frozen_shard_bytes();
        nf4 = fsdp_.nf4_shard_bytes();
    }
    void save(torch::serialize::OutputArchive& out, int) const override {
        torch::serialize::OutputArchive shard;
        fsdp_.save(shard);
        out.write("fsdp_shard", shard);
    }
    void load(ShardSource& saved, int rank, bool elastic) override {
        if (elastic) return fsdp_.load_resharded(saved);
        torch::serialize::InputArchive shard;
        saved.rank(rank).read("fsdp_shard", shard);
        fsdp_.load(shard);
    }
    std::vector<torch::Tensor> full_trainable() override { return fsdp_.gather_trainable(names_); }
    void with_full_trainable(const std::function<void()>& fn) override {
        fsdp_.with_trainable_gathered(fn);
    }

  private:
    std::shared_ptr<UnitModel> model_; // the adapter fsdp_ refers to: declared first, freed last
    std::vector<std::string> names_;
    FsdpModel fsdp_;
    double lr_ = 0;
};

} // namespace

std::unique_ptr<DataParallelism> make_fsdp(Communicator& comm, std::shared_ptr<UnitModel> model,
                                           FsdpOptions options,
                                           std::vector<std::string> trainable_names) {
    return std::make_unique<FsdpParallelism>(comm, std::move(model), options,
                                             std::move(trainable_names));
}

} // namespace trainscope::dist
