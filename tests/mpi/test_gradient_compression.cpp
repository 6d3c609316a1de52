// Gradient compression (dist.compress) of the GradientSynchronizer's bucket allreduces, checked
// against references computed here from every rank's local gradients (gathered): none is the
// plain average bit for bit; fp16/bf16 are PyTorch's fp16/bf16_compress_hook (cast, divide by the
// world size, sum, cast back); powersgd is Vogels et al.'s algorithm, written again below, over
// several iterations with warm start and error feedback (fp64, to 1e-6); PowerSGD's state (Q,
// error feedback, iteration count) survives a DDP checkpoint.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <sstream>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/distributed/powersgd.hpp"

namespace dist = trainscope::dist;
namespace core = trainscope::core;

namespace {

using trainscope::testing::mpi_communicator;
using trainscope::testing::world_rank;
using trainscope::testing::world_size;

// Registered fc1.weight [24, 32], fc1.bias [24], fc2.weight [16, 24], fc2.bias [16],
// fc3.weight [4, 16], fc3.bias [4]. Under PowerSGD rank 2 (min_compression_rate 2) fc1.weight
// and fc2.weight are compressed ((24 + 32) x 2 x 2 < 768, (16 + 24) x 2 x 2 < 384), fc3.weight
// is not (80 >= 64). With caps kCap / kFirstCap in fp64 the buckets are {fc3.bias, fc3.weight,
// fc2.bias} (no matrix compressed), {fc2.weight, fc1.bias} (both kinds), {fc1.weight} (only a
// matrix).
struct MlpImpl : torch::nn::Module {
    MlpImpl() {
        fc1 = register_module("fc1", torch::nn::Linear(32, 24));
        fc2 = register_module("fc2", torch::nn::Linear(24, 16));
        fc3 = register_module("fc3", torch::nn::Linear(16, 4));
    }
    torch::Tensor forward(torch::Tensor x) { // x: [B, 32]
        return fc3(torch::tanh(fc2(torch::tanh(fc1(x)))));
    }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

constexpr std::size_t kCap = 4096, kFirstCap = 1024;

Mlp make_mlp(torch::ScalarType dtype, std::uint64_t seed = 11) {
    torch::manual_seed(seed);
    Mlp m;
    m->to(dtype);
    return m;
}

// This rank's loss of iteration `it` (its own batch: every rank's gradients differ).
torch::Tensor loss_of(Mlp& model, int rank, int it) {
    torch::manual_seed(1000 * it + rank + 7);
    const auto dtype = model->fc1->weight.scalar_type();
    torch::Tensor x = torch::randn({5, 32}, dtype);
    torch::Tensor target = torch::randn({5, 4}, dtype);
    return (model->forward(x) - target).pow(2).sum();
}

// The gradients `model` gets on this rank's batch of `it`, without any communication.
std::vector<torch::Tensor> local_gradients(Mlp& plain, int rank, int it) {
    for (auto& p : plain->parameters())
        p.mutable_grad() = torch::Tensor();
    loss_of(plain, rank, it).backward();
    std::vector<torch::Tensor> out;
    for (auto& p : plain->parameters())
        out.push_back(p.grad().clone());
    return out;
}

// all[r][i]: rank r's tensor i (one allgather of the flattened concatenation).
std::vector<std::vector<torch::Tensor>> gather_all(dist::Communicator& comm,
                                                   const std::vector<torch::Tensor>& mine) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : mine)
        flat.push_back(t.reshape({-1}));
    torch::Tensor in = torch::cat(flat);
    torch::Tensor out = torch::empty({in.numel() * comm.size()}, in.options());
    comm.allgather(in, out);
    std::vector<std::vector<torch::Tensor>> all(static_cast<std::size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) {
        std::int64_t at = r * in.numel();
        for (const auto& t : mine) {
            all[r].push_back(out.narrow(0, at, t.numel()).view(t.sizes()).clone());
            at += t.numel();
        }
    }
    return all;
}

// One synchronized iteration of `model` on this rank's batch of `it`; returns the gradients.
std::vector<torch::Tensor> synchronized_gradients(Mlp& model, dist::GradientSynchronizer& sync,
                                                  int rank, int it) {
    for (auto& p : model->parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
    sync.begin_iteration();
    loss_of(model, rank, it).backward();
    sync.finish();
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters())
        out.push_back(p.grad().clone());
    return out;
}

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        m = std::max(
            m, (a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)).abs().max().item<double>());
    return m;
}

// Gram-Schmidt on the columns of a [n, k] (written apart from the library's).
void gram_schmidt(torch::Tensor& a) {
    for (std::int64_t i = 0; i < a.size(1); ++i) {
        torch::Tensor col = a.narrow(1, i, 1);
        col.div_(col.norm());
        for (std::int64_t j = i + 1; j < a.size(1); ++j) {
            torch::Tensor other = a.narrow(1, j, 1);
            other.sub_((col * other).sum() * col);
        }
    }
}

dist::CompressionOptions compression(dist::CompressionKind kind) {
    dist::CompressionOptions o;
    o.kind = kind;
    return o;
}

} // namespace

TEST(GradientCompression, NoneIsThePlainBucketAverageBitForBit) {
    // What the synchronizer did before compression existed: every bucket's flat gradients
    // allreduced with ReduceOp::Average, in place.
    const int r = world_rank();
    auto comm = mpi_communicator();
    Mlp model = make_mlp(torch::kFloat32), plain = make_mlp(torch::kFloat32);
    dist::GradientSynchronizer sync(*comm, model->parameters(), kCap / 2, kFirstCap / 2,
                                    compression(dist::CompressionKind::None));
    const auto buckets = sync.bucket_parameters();
    for (int it = 0; it < 2; ++it) {
        const std::vector<torch::Tensor> mine = local_gradients(plain, r, it);
        std::vector<torch::Tensor> want(mine.size());
        for (const auto& members : buckets) {
            std::vector<torch::Tensor> flat;
            for (std::size_t i : members)
                flat.push_back(mine[i].reshape({-1}));
            torch::Tensor bucket = torch::cat(flat);
            comm->allreduce(bucket, dist::ReduceOp::Average);
            std::int64_t at = 0;
            for (std::size_t i : members) {
                want[i] = bucket.narrow(0, at, mine[i].numel()).view(mine[i].sizes());
                at += mine[i].numel();
            }
        }
        const std::vector<torch::Tensor> got = synchronized_gradients(model, sync, r, it);
        for (std::size_t i = 0; i < got.size(); ++i)
            EXPECT_TRUE(torch::equal(got[i], want[i])) << "parameter " << i << " iteration " << it;
        const dist::ParallelComm c = sync.last_iteration();
        EXPECT_EQ(c.bytes, static_cast<double>(sync.bytes_per_iteration()));
        EXPECT_EQ(c.uncompressed_bytes, c.bytes);
        EXPECT_TRUE(std::isnan(c.error_norm));
    }
}

TEST(GradientCompression, Fp16AndBf16FollowPyTorchsCompressHooks) {
    const int r = world_rank(), w = world_size();
    for (auto kind : {dist::CompressionKind::Fp16, dist::CompressionKind::Bf16}) {
        const torch::ScalarType low =
            kind == dist::CompressionKind::Fp16 ? torch::kHalf : torch::kBFloat16;
        // Unit roundoff of the 16-bit format: each addition rounds by at most u of its result.
        const double u =
            kind == dist::CompressionKind::Fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
        SCOPED_TRACE(dist::to_string(kind));
        auto comm = mpi_communicator();
        Mlp model = make_mlp(torch::kFloat32), plain = make_mlp(torch::kFloat32);
        dist::GradientSynchronizer sync(*comm, model->parameters(), kCap / 2, kFirstCap / 2,
                                        compression(kind));
        for (int it = 0; it < 2; ++it) {
            const auto all = gather_all(*comm, local_gradients(plain, r, it));
            const std::vector<torch::Tensor> got = synchronized_gradients(model, sync, r, it);
            if (w == 1) { // one rank communicates nothing, so nothing is compressed
                for (std::size_t i = 0; i < got.size(); ++i)
                    EXPECT_TRUE(torch::equal(got[i], all[0][i]));
                continue;
            }
            for (std::size_t i = 0; i < got.size(); ++i) {
                // The hook on every rank: cast, then divide by the world size in 16 bits; the
                // 16-bit sum in rank order; cast back.
                torch::Tensor sum, magnitude;
                for (int q = 0; q < w; ++q) {
                    torch::Tensor part = all[q][i].to(low).div_(w);
                    sum = q == 0 ? part : sum + part;
                    magnitude = q == 0 ? part.abs().to(torch::kFloat64)
                                       : magnitude + part.abs().to(torch::kFloat64);
                }
                const torch::Tensor want = sum.to(torch::kFloat32);
                if (w <= 2) { // one addition: the same rounding whatever MPI's order
                    EXPECT_TRUE(torch::equal(got[i], want)) << "parameter " << i;
                } else { // another summation order: within (w-1) roundings on each side
                    const torch::Tensor bound = magnitude * (2.0 * (w - 1) * u);
                    EXPECT_TRUE(
                        ((got[i].to(torch::kFloat64) - want.to(torch::kFloat64)).abs() <= bound)
                            .all()
                            .item<bool>())
                        << "parameter " << i;
                }
                EXPECT_EQ(got[i].scalar_type(), torch::kFloat32);
                // It is a compressed mean: close to the exact one, but rounded.
                torch::Tensor mean = torch::zeros_like(all[0][i], torch::kFloat64);
                for (int q = 0; q < w; ++q)
                    mean += all[q][i].to(torch::kFloat64) / w;
                EXPECT_LE((got[i].to(torch::kFloat64) - mean).abs().max().item<double>(),
                          4.0 * w * u * mean.abs().max().item<double>() + 1e-6);
            }
            const dist::ParallelComm c = sync.last_iteration();
            if (w > 1) {
                EXPECT_EQ(c.uncompressed_bytes, 2.0 * c.bytes); // float32 -> 16 bits
                EXPECT_EQ(c.bytes, static_cast<double>(sync.bytes_per_iteration()));
            }
            EXPECT_TRUE(std::isnan(c.error_norm));
        }
        if (w > 1) {
            auto stats = comm->stats();
            EXPECT_EQ(stats["allreduce"].bytes, 2u * sync.bytes_per_iteration());
        }
    }
}

namespace {

struct PowerSgdCase {
    std::int64_t rank;
    bool warm_start;
    std::int64_t start_iter;
    int iterations;
};

} // namespace

TEST(GradientCompression, PowerSgdEqualsTheReferenceAlgorithm) {
    const int r = world_rank(), w = world_size();
    for (const PowerSgdCase& c :
         {PowerSgdCase{2, true, 1, 5}, PowerSgdCase{1, false, 0, 3}, PowerSgdCase{3, true, 0, 3}}) {
        SCOPED_TRACE("rank " + std::to_string(c.rank) + " warm start " +
                     std::to_string(c.warm_start) + " start " + std::to_string(c.start_iter));
        auto comm = mpi_communicator();
        Mlp model = make_mlp(torch::kFloat64), plain = make_mlp(torch::kFloat64);
        dist::CompressionOptions o = compression(dist::CompressionKind::PowerSgd);
        o.powersgd_rank = c.rank;
        o.warm_start = c.warm_start;
        o.start_iter = c.start_iter;
        dist::GradientSynchronizer sync(*comm, model->parameters(), kCap, kFirstCap, o);
        const auto buckets = sync.bucket_parameters();
        ASSERT_EQ(buckets, (std::vector<std::vector<std::size_t>>{{5, 4, 3}, {2, 1}, {0}}));
        const auto params = model->parameters();

        // The reference's state: Q per compressed parameter (replicated), error feedback per
        // rank and parameter.
        std::map<std::size_t, torch::Tensor> q;
        std::vector<std::map<std::size_t, torch::Tensor>> error(static_cast<std::size_t>(w));
        for (int it = 0; it < c.iterations; ++it) {
            SCOPED_TRACE("iteration " + std::to_string(it));
            const auto all = gather_all(*comm, local_gradients(plain, r, it));
            std::vector<torch::Tensor> want(params.size()), mean(params.size());
            for (std::size_t i = 0; i < params.size(); ++i) {
                mean[i] = torch::zeros_like(all[0][i]);
                for (int k = 0; k < w; ++k)
                    mean[i] += all[k][i];
                mean[i] /= w;
                want[i] = mean[i];
            }
            bool compressed_any = false;
            if (it >= c.start_iter && w > 1)
                for (std::size_t b = 0; b < buckets.size(); ++b) {
                    auto gen =
                        at::make_generator<at::CPUGeneratorImpl>(dist::powersgd_q_seed(it, b));
                    for (std::size_t i : buckets[b]) {
                        const auto sizes = params[i].sizes();
                        if (sizes.size() < 2) continue;
                        const std::int64_t n = sizes[0], m = params[i].numel() / n;
                        const std::int64_t k = std::min({n, m, c.rank});
                        if (!((n + m) * k * 2 < n * m)) continue; // min_compression_rate 2
                        compressed_any = true;
                        if (!c.warm_start || !q.count(i))
                            q[i] = at::randn({m, k}, gen,
                                             torch::TensorOptions().dtype(torch::kFloat64));
                        gram_schmidt(q[i]);
                        std::vector<torch::Tensor> M;
                        torch::Tensor P = torch::zeros({n, k}, torch::kFloat64);
                        for (int x = 0; x < w; ++x) {
                            torch::Tensor& e = error[x][i];
                            if (!e.defined()) e = torch::zeros({n, m}, torch::kFloat64);
                            M.push_back(all[x][i].reshape({n, m}) + e);
                            P += M.back().mm(q[i]);
                        }
                        gram_schmidt(P);
                        torch::Tensor Q = torch::zeros({m, k}, torch::kFloat64);
                        for (int x = 0; x < w; ++x)
                            Q += M[x].t().mm(P);
                        q[i] = Q / w;
                        const torch::Tensor approx = P.mm(q[i].t());
                        for (int x = 0; x < w; ++x)
                            error[x][i] = M[x] - approx;
                        want[i] = approx.view(sizes);
                    }
                }
            const std::vector<torch::Tensor> got = synchronized_gradients(model, sync, r, it);
            EXPECT_LE(max_abs_diff(got, want), 1e-6);
            if (compressed_any) // the test can tell PowerSGD from the plain average
                EXPECT_GT(max_abs_diff(want, mean), 1e-4);
            double norm2 = 0;
            for (const auto& [i, e] : error[r])
                norm2 += e.square().sum().item<double>();
            const dist::ParallelComm got_comm = sync.last_iteration();
            if (w == 1) {
                EXPECT_EQ(got_comm.bytes, 0.0); // nothing communicated, nothing compressed
                continue;
            }
            EXPECT_NEAR(got_comm.error_norm, std::sqrt(norm2), 1e-6 * (1 + std::sqrt(norm2)));
            if (compressed_any) {
                EXPECT_GT(got_comm.error_norm, 0.0); // error feedback is in play
                // Uncompressed members + P + Q, float64.
                double want_bytes = 0;
                for (std::size_t i = 0; i < params.size(); ++i) {
                    const auto sizes = params[i].sizes();
                    const std::int64_t n = sizes[0], m = params[i].numel() / n;
                    const std::int64_t k = std::min({n, m, c.rank});
                    const bool comp = sizes.size() >= 2 && (n + m) * k * 2 < n * m;
                    want_bytes += 8.0 * (comp ? (n + m) * k : params[i].numel());
                }
                EXPECT_EQ(got_comm.bytes, want_bytes);
                EXPECT_LT(got_comm.bytes, got_comm.uncompressed_bytes);
            } else {
                EXPECT_EQ(got_comm.error_norm, 0.0);
                EXPECT_EQ(got_comm.bytes, got_comm.uncompressed_bytes);
            }
            double numel = 0;
            for (const auto& p : params)
                numel += static_cast<double>(p.numel());
            EXPECT_EQ(got_comm.uncompressed_bytes, 8.0 * numel); // every parameter, float64
        }
    }
}

namespace {

// Checkpoint archives held in memory: this rank's own and rank 0's (broadcast), as the
// checkpoint directory would serve them.
class MemoryShards final : public dist::ShardSource {
  public:
    MemoryShards(const std::string& mine, int world) : world_(world) {
        const int r = world_rank();
        std::string zero = r == 0 ? mine : std::string();
        long long n = static_cast<long long>(zero.size());
        MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
        zero.resize(static_cast<std::size_t>(n));
        MPI_Bcast(zero.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
        files_[0] = zero;
        files_[r] = mine;
    }
    int saved_world() const override { return world_; }
    const std::string& where() const override { return where_; }
    torch::serialize::InputArchive& rank(int r) override {
        auto& slot = archives_[r];
        if (!slot) {
            slot = std::make_unique<torch::serialize::InputArchive>();
            std::istringstream in(files_.at(r));
            slot->load_from(in);
        }
        return *slot;
    }
    torch::Tensor reshard(const std::string&, const std::string&, std::int64_t, int, int) override {
        throw core::InternalError("MemoryShards::reshard: DDP does not reshard");
    }

  private:
    int world_;
    std::string where_ = "memory";
    std::map<int, std::string> files_;
    std::map<int, std::unique_ptr<torch::serialize::InputArchive>> archives_;
};

std::unique_ptr<dist::DataParallelism> make_powersgd_ddp(dist::Communicator& comm, Mlp& model) {
    dist::CompressionOptions o = compression(dist::CompressionKind::PowerSgd);
    o.start_iter = 1;
    dist::TrainableSet t;
    for (const auto& p : model->named_parameters()) {
        t.names.push_back(p.key());
        t.tensors.push_back(p.value());
    }
    auto optimizer = std::make_unique<torch::optim::SGD>(
        t.tensors, torch::optim::SGDOptions(0.05).momentum(0.9));
    return dist::make_ddp(comm, std::move(t), std::move(optimizer), kCap, kFirstCap, o);
}

void ddp_step(dist::DataParallelism& ddp, Mlp& model, int rank, int it) {
    ddp.begin_iteration();
    ddp.before_last_backward();
    loss_of(model, rank, it).backward();
    ddp.after_backward();
    ddp.finish_gradients(1.0);
    ddp.set_lr(0.05);
    ddp.step([](torch::optim::Optimizer& o) {
        o.step();
        return true;
    });
}

std::vector<torch::Tensor> values(Mlp& model) {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters())
        out.push_back(p.detach().clone());
    return out;
}

} // namespace

TEST(GradientCompression, PowerSgdStateSurvivesADdpCheckpoint) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    // Uninterrupted: 4 steps (1 plain, 3 PowerSGD), the checkpoint taken after the third.
    Mlp a = make_mlp(torch::kFloat64);
    auto ddp_a = make_powersgd_ddp(*comm, a);
    for (int it = 0; it < 3; ++it)
        ddp_step(*ddp_a, a, r, it);
    std::string file;
    {
        torch::serialize::OutputArchive out;
        ddp_a->save(out, r);
        std::ostringstream bytes;
        out.save_to(bytes);
        file = bytes.str();
    }
    ddp_step(*ddp_a, a, r, 3);
    const std::vector<torch::Tensor> uninterrupted = values(a);

    // Resumed: another model (other initial weights), loaded, then the fourth step.
    Mlp b = make_mlp(torch::kFloat64, /*seed=*/99);
    auto ddp_b = make_powersgd_ddp(*comm, b);
    MemoryShards saved(file, w);
    ddp_b->load(saved, r, /*elastic=*/false);
    // The count is compression state, carried where there is some (more than one rank).
    ASSERT_EQ(ddp_b->synchronizer()->iterations(), w > 1 ? 3 : 0);
    ddp_step(*ddp_b, b, r, 3);
    EXPECT_EQ(max_abs_diff(values(b), uninterrupted), 0.0);

    if (w == 1) return; // nothing is compressed on one rank: no state to lose
    EXPECT_EQ(ddp_b->synchronizer()->last_iteration().error_norm,
              ddp_a->synchronizer()->last_iteration().error_norm);
    // Control, and the elastic rule: the checkpoint read as if the saved job had had one rank.
    // Rank 0 keeps its error feedback, the others start at zero (ranks the saved job did not
    // have); Q and the count are replicated. The step differs, so the comparison above sees the
    // state.
    Mlp c = make_mlp(torch::kFloat64, /*seed=*/99);
    auto ddp_c = make_powersgd_ddp(*comm, c);
    MemoryShards one_rank(file, /*world=*/1);
    ddp_c->load(one_rank, r, /*elastic=*/true);
    EXPECT_EQ(ddp_c->synchronizer()->iterations(), 3);
    ddp_step(*ddp_c, c, r, 3);
    EXPECT_GT(max_abs_diff(values(c), uninterrupted), 1e-9);
}

TEST(GradientCompression, PowerSgdStartsFreshFromACheckpointWithoutItsState) {
    // A checkpoint written without PowerSGD (dist.compress=none) resumed with it: the state
    // starts fresh (count 0, so start_iter plain iterations first) instead of failing.
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    Mlp a = make_mlp(torch::kFloat64);
    dist::TrainableSet t;
    for (const auto& p : a->named_parameters()) {
        t.names.push_back(p.key());
        t.tensors.push_back(p.value());
    }
    auto plain = dist::make_ddp(
        *comm, t, std::make_unique<torch::optim::SGD>(t.tensors, torch::optim::SGDOptions(0.05)),
        kCap, kFirstCap);
    ddp_step(*plain, a, r, 0);
    torch::serialize::OutputArchive out;
    plain->save(out, r);
    std::ostringstream bytes;
    out.save_to(bytes);
    Mlp b = make_mlp(torch::kFloat64, 5);
    auto ddp_b = make_powersgd_ddp(*comm, b);
    MemoryShards saved(bytes.str(), w);
    ddp_b->load(saved, r, false);
    EXPECT_EQ(ddp_b->synchronizer()->iterations(), 0);
    EXPECT_EQ(max_abs_diff(values(b), values(a)), 0.0);
}
