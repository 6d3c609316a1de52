// PowerSGD per gradient bucket (see powersgd.hpp): the compression's arithmetic and its state
// (Q replicated, error feedback per rank), apart from the synchronizer's bucketing and hooks.
#include "trainscope/distributed/powersgd.hpp"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "trainscope/core/error.hpp"

namespace trainscope::dist {
namespace {

// The smallest positive normal number of a floating-point dtype: dividing by a norm clamped to it
// changes nothing for a nonzero column and keeps a zero column zero.
double smallest_normal(torch::ScalarType t) {
    switch (t) {
    case torch::kHalf:
        return 6.103515625e-05;
    case torch::kBFloat16:
    case torch::kFloat32:
        return static_cast<double>(std::numeric_limits<float>::min());
    default:
        return std::numeric_limits<double>::min();
    }
}

std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

} // namespace

// The handle of a bucket's collectives: waited for together, their own durations summed (the
// bucket's share of comm_collective_s).
class PowerSgdWorkGroup final : public Work {
  public:
    void add(std::shared_ptr<Work> w) {
        if (w) parts_.push_back(std::move(w));
    }
    void wait() override {
        for (auto& w : parts_)
            w->wait();
    }
    bool completed() override {
        for (auto& w : parts_)
            if (!w->completed()) return false;
        return true;
    }
    double seconds() override {
        double s = 0;
        for (auto& w : parts_)
            s += w->seconds();
        return s;
    }
    double exposed_seconds() override {
        double s = 0;
        for (auto& w : parts_)
            s += w->exposed_seconds();
        return s;
    }

  private:
    std::vector<std::shared_ptr<Work>> parts_;
};

std::uint64_t powersgd_q_seed(std::int64_t iteration, std::size_t bucket) {
    return splitmix64(splitmix64(0x706f77657273ULL ^ static_cast<std::uint64_t>(iteration)) ^
                      static_cast<std::uint64_t>(bucket));
}

void orthogonalize_columns(torch::Tensor& m) {
    torch::NoGradGuard no_grad;
    const std::int64_t k = m.size(1);
    const double tiny = smallest_normal(m.scalar_type());
    for (std::int64_t i = 0; i < k; ++i) {
        torch::Tensor col = m.narrow(1, i, 1); // [n, 1]
        col.div_(torch::norm(col, 2, {0}, /*keepdim=*/true).clamp_min(tiny));
        if (i + 1 < k) {
            torch::Tensor rest = m.narrow(1, i + 1, k - i - 1); // [n, k - i - 1]
            rest.sub_(torch::sum(col * rest, {0}, /*keepdim=*/true) * col);
        }
    }
}

bool powersgd_compresses(torch::IntArrayRef sizes, std::int64_t rank, double min_compression_rate,
                         std::int64_t* used_rank) {
    if (sizes.size() < 2) return false;
    const std::int64_t n = sizes[0];
    std::int64_t m = 1;
    for (std::size_t d = 1; d < sizes.size(); ++d)
        m *= sizes[d];
    const std::int64_t r = std::min({n, m, rank});
    if (used_rank) *used_rank = r;
    if (r < 1) return false;
    // PyTorch's _should_compress: compressed * rate < uncompressed.
    return static_cast<double>((n + m) * r) * min_compression_rate < static_cast<double>(n * m);
}

struct PowerSgd::Bucket {
    struct Matrix {
        std::int64_t offset = 0, n = 0, m = 0, r = 0;
        std::int64_t p_offset = 0, q_offset = 0, e_offset = 0;
    };
    torch::Tensor grads;                                    // [numel], the bucket's buffer
    std::vector<std::pair<std::int64_t, std::int64_t>> raw; // uncompressed: (offset, numel)
    std::vector<Matrix> matrices;
    torch::Tensor uncompressed; // [sum of raw numel]
    torch::Tensor p, q, error;  // [sum n r'], [sum m r'], [sum n m]
    bool q_drawn = false;
    std::shared_ptr<PowerSgdWorkGroup> work; // this iteration's collectives
    std::shared_ptr<Work> p_work, raw_work;

    torch::Tensor matrix(const Matrix& x) const {
        return grads.narrow(0, x.offset, x.n * x.m).view({x.n, x.m});
    }
    torch::Tensor p_of(const Matrix& x) const {
        return p.narrow(0, x.p_offset, x.n * x.r).view({x.n, x.r});
    }
    torch::Tensor q_of(const Matrix& x) const {
        return q.narrow(0, x.q_offset, x.m * x.r).view({x.m, x.r});
    }
    torch::Tensor e_of(const Matrix& x) const {
        return error.narrow(0, x.e_offset, x.n * x.m).view({x.n, x.m});
    }
};

PowerSgd::PowerSgd(Communicator& comm, const CompressionOptions& options)
    : comm_(comm), o_(options) {}

PowerSgd::~PowerSgd() = default;

void PowerSgd::add_bucket(const torch::Tensor& grads, const std::vector<Member>& members) {
    auto b = std::make_unique<Bucket>();
    b->grads = grads;
    std::int64_t raw = 0, p = 0, q = 0, e = 0;
    for (const Member& member : members) {
        std::int64_t numel = 1;
        for (std::int64_t d : member.sizes)
            numel *= d;
        std::int64_t r = 0;
        if (!powersgd_compresses(member.sizes, o_.powersgd_rank, o_.min_compression_rate, &r)) {
            b->raw.emplace_back(member.offset, numel);
            raw += numel;
            continue;
        }
        Bucket::Matrix x;
        x.offset = member.offset;
        x.n = member.sizes[0];
        x.m = numel / x.n;
        x.r = r;
        x.p_offset = p;
        x.q_offset = q;
        x.e_offset = e;
        p += x.n * r;
        q += x.m * r;
        e += numel;
        b->matrices.push_back(x);
    }
    const auto options = grads.options();
    torch::NoGradGuard no_grad;
    b->uncompressed = torch::zeros({raw}, options);
    b->p = torch::zeros({p}, options);
    b->q = torch::zeros({q}, options);
    b->error = torch::zeros({e}, options);
    buckets_.push_back(std::move(b));
}

std::size_t PowerSgd::compressed_bytes(std::size_t k) const {
    const Bucket& b = *buckets_.at(k);
    return static_cast<std::size_t>(b.uncompressed.nbytes() + b.p.nbytes() + b.q.nbytes());
}

void PowerSgd::draw_q(Bucket& b, std::size_t k, std::int64_t iteration) {
    // On the CPU, from a generator of its own (the training's random streams stay untouched), then
    // to the device: every rank draws the same Q whatever its device.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(powersgd_q_seed(iteration, k));
    for (const Bucket::Matrix& x : b.matrices) {
        torch::Tensor q = b.q_of(x);
        q.copy_(at::randn({x.m, x.r}, gen, torch::TensorOptions().dtype(q.scalar_type())));
    }
    b.q_drawn = true;
}

std::shared_ptr<Work> PowerSgd::launch(std::size_t k, std::int64_t iteration) {
    Bucket& b = *buckets_.at(k);
    torch::NoGradGuard no_grad;
    const bool fresh = !o_.warm_start || !b.q_drawn;
    if (fresh) draw_q(b, k, iteration);
    std::int64_t at = 0;
    for (const auto& [offset, numel] : b.raw) {
        b.uncompressed.narrow(0, at, numel).copy_(b.grads.narrow(0, offset, numel));
        at += numel;
    }
    for (const Bucket::Matrix& x : b.matrices) {
        torch::Tensor m = b.matrix(x), e = b.e_of(x), q = b.q_of(x), p = b.p_of(x);
        m.add_(e);  // error feedback
        e.copy_(m); // keeps M (with its feedback) until finish() subtracts M'
        orthogonalize_columns(q);
        torch::mm_out(p, m, q); // [n, r'] = [n, m] x [m, r']
    }
    b.work = std::make_shared<PowerSgdWorkGroup>();
    // Empty buffers (no uncompressed member, no matrix) issue nothing, on every rank alike.
    b.raw_work =
        b.uncompressed.numel() ? comm_.allreduce_async(b.uncompressed, ReduceOp::Sum) : nullptr;
    b.p_work = b.p.numel() ? comm_.allreduce_async(b.p, ReduceOp::Sum) : nullptr;
    b.work->add(b.raw_work);
    b.work->add(b.p_work);
    return b.work;
}

void PowerSgd::exchange_q(std::size_t k) {
    Bucket& b = *buckets_.at(k);
    if (!b.p_work) return;
    torch::NoGradGuard no_grad;
    b.p_work->wait();
    for (const Bucket::Matrix& x : b.matrices) {
        torch::Tensor p = b.p_of(x), q = b.q_of(x);
        // P is not divided by the world size: its columns are normalized anyway.
        orthogonalize_columns(p);
        torch::mm_out(q, b.matrix(x).t(), p); // [m, r'] = [m, n] x [n, r']
    }
    b.work->add(comm_.allreduce_async(b.q, ReduceOp::Sum));
}

void PowerSgd::finish(std::size_t k) {
    Bucket& b = *buckets_.at(k);
    torch::NoGradGuard no_grad;
    b.work->wait();
    const double world = comm_.size();
    if (b.raw_work) {
        b.uncompressed.div_(world);
        std::int64_t at = 0;
        for (const auto& [offset, numel] : b.raw) {
            b.grads.narrow(0, offset, numel).copy_(b.uncompressed.narrow(0, at, numel));
            at += numel;
        }
    }
    if (!b.p_work) return;
    b.q.div_(world);
    for (const Bucket::Matrix& x : b.matrices) {
        torch::Tensor m = b.matrix(x);
        torch::mm_out(m, b.p_of(x), b.q_of(x).t()); // M' [n, m] = [n, r'] x [r', m]
        b.e_of(x).sub_(m);                          // e = (M + e_old) - M'
    }
}

torch::Tensor PowerSgd::error_norm_squared() const {
    torch::NoGradGuard no_grad;
    torch::Tensor total;
    for (const auto& b : buckets_) {
        if (!b->error.numel() || !b->q_drawn) continue;
        torch::Tensor sq = b->error.to(torch::kFloat64).square().sum();
        total = total.defined() ? total + sq : sq;
    }
    return total;
}

void PowerSgd::save(torch::serialize::OutputArchive& out) const {
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
        const Bucket& b = *buckets_[k];
        if (b.q_drawn) out.write("q" + std::to_string(k), b.q, /*is_buffer=*/true);
        out.write("error" + std::to_string(k), b.error, /*is_buffer=*/true);
    }
}

void PowerSgd::load(torch::serialize::InputArchive& replicated, torch::serialize::InputArchive* own,
                    const std::string& where) {
    torch::NoGradGuard no_grad;
    auto fill = [&](torch::serialize::InputArchive& in, const std::string& key,
                    torch::Tensor& into) {
        torch::Tensor saved;
        if (!in.try_read(key, saved, /*is_buffer=*/true)) return false;
        if (saved.numel() != into.numel())
            throw core::InputError("checkpoint " + where + ": PowerSGD state '" + key + "' has " +
                                   std::to_string(saved.numel()) + " elements, this run's has " +
                                   std::to_string(into.numel()) +
                                   " (another model, dist.bucket_mb, dist.first_bucket_mb or "
                                   "dist.powersgd_rank): resume with the options it was saved "
                                   "with");
        into.copy_(saved.reshape(into.sizes()));
        return true;
    };
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
        Bucket& b = *buckets_[k];
        b.q_drawn = fill(replicated, "q" + std::to_string(k), b.q);
        b.error.zero_();
        if (own) fill(*own, "error" + std::to_string(k), b.error);
    }
}

} // namespace trainscope::dist
