// ZeRO-1/2 (dist.zero) against plain data parallelism: a tiny Llama in fp64, each rank its own
// micro-batches, three AdamW steps with torchtune's token normalisation; and a small MobileNetV2
// driven as the CV trainer drives its DataParallelism (with a checkpoint round trip). Sharding the
// optimizer state (and the gradients) must not change the arithmetic: both reach the same
// parameters.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "../unit/llama_test_util.hpp"
#include "dist_test_util.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/llm_loss.hpp"
#include "trainscope/train/optimizer.hpp"

namespace tt = trainscope::train;
namespace tm_ = trainscope::models;

namespace {

tm_::LlamaConfig tiny() {
    return trainscope::testing::small_llama(96, 48);
}

tm_::LlamaForCausalLM make_model() {
    torch::manual_seed(11);
    return tm_::LlamaForCausalLM(tiny(), torch::TensorOptions().dtype(torch::kFloat64));
}

// Rank-specific batch for step `k` with some masked labels, and its label-token count.
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int k) {
    torch::manual_seed(1000 + 17 * rank + k);
    torch::Tensor ids = torch::randint(0, 96, {2, 9}, torch::kInt64);
    torch::Tensor labels = ids.clone();
    labels.index_put_({0, torch::indexing::Slice(0, 3 + rank)}, -100);
    return {ids, labels};
}

double global_tokens(const torch::Tensor& labels) {
    double n = static_cast<double>(tt::count_label_tokens(labels));
    MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return n;
}

std::vector<torch::Tensor>
train_plain(int steps,
            trainscope::dist::CompressionKind compress = trainscope::dist::CompressionKind::None) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    trainscope::dist::CompressionOptions compression;
    compression.kind = compress;
    trainscope::dist::GradientSynchronizer sync(*comm, params, 4096, 4096, compression);
    sync.broadcast_parameters(0);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
    for (int k = 0; k < steps; ++k) {
        auto [ids, labels] = batch(comm->rank(), k);
        sync.begin_iteration();
        tt::causal_lm_loss_sum(model->forward(ids), labels).backward();
        sync.finish();
        const double scale = comm->size() / global_tokens(labels);
        for (auto& p : params)
            p.mutable_grad().mul_(scale);
        opt.step();
        opt.zero_grad();
    }
    std::vector<torch::Tensor> out;
    for (auto& p : params)
        out.push_back(p.detach().clone());
    return out;
}

std::vector<torch::Tensor> train_zero(int stage, int steps,
                                      std::optional<torch::ScalarType> reduce_dtype = {}) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    trainscope::dist::ZeroAdamW h;
    h.lr = 1e-2;
    h.weight_decay = 0.01;
    trainscope::dist::ZeroOptimizer zero(*comm, params, stage, h, reduce_dtype);
    for (int k = 0; k < steps; ++k) {
        auto [ids, labels] = batch(comm->rank(), k);
        zero.zero_grad();
        tt::causal_lm_loss_sum(model->forward(ids), labels).backward();
        zero.reduce_gradients(comm->size() / global_tokens(labels));
        zero.step(1e-2);
    }
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters())
        out.push_back(p.detach().clone());
    return out;
}

} // namespace

TEST(Zero, Stage1And2ReachThePlainDataParallelParameters) {
    const auto plain = train_plain(3);
    for (int stage : {1, 2}) {
        const auto zero = train_zero(stage, 3);
        ASSERT_EQ(zero.size(), plain.size());
        double worst = 0;
        for (std::size_t i = 0; i < plain.size(); ++i)
            worst = std::max(worst, (zero[i] - plain[i]).abs().max().item<double>());
        EXPECT_LT(worst, 1e-12) << "dist.zero=" << stage;
        // And the training moved the weights (the comparison is not between two untouched models).
        auto fresh = make_model()->parameters();
        double moved = 0;
        for (std::size_t i = 0; i < plain.size(); ++i)
            moved = std::max(moved, (fresh[i] - plain[i]).abs().max().item<double>());
        EXPECT_GT(moved, 1e-3);
    }
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    return worst;
}

TEST(Zero, Fp16AndBf16ReduceDtypeMatchCompressedDdp) {
    // dist.compress=fp16/bf16 under ZeRO: the reduce-scatter in 16 bits with the hook's
    // pre-division, element for element what DDP's compressed bucket allreduce computes. With two
    // ranks each element is one 16-bit addition whatever the collective, so both agree to the
    // AdamW arithmetic's 1e-12; with more, the collectives may sum in other orders.
    using trainscope::dist::CompressionKind;
    const int w = trainscope::testing::world_size();
    const auto plain = train_plain(3);
    for (auto [kind, dtype] : {std::pair{CompressionKind::Fp16, torch::kHalf},
                               std::pair{CompressionKind::Bf16, torch::kBFloat16}}) {
        const auto ddp = train_plain(3, kind);
        for (int stage : {1, 2}) {
            const auto zero = train_zero(stage, 3, dtype);
            if (w <= 2) EXPECT_LT(max_diff(zero, ddp), 1e-12) << "dist.zero=" << stage;
            if (w > 1) EXPECT_GT(max_diff(zero, plain), 1e-9) << "nothing was compressed";
        }
    }
}

TEST(Zero, The16BitReduceInputOverwritesTheFlatGradient) {
    // narrow_in_place (ZeRO's 16-bit reduce-scatter input) gives what .to(dtype) gives, bit for
    // bit, in the storage of its input, allocating at most its first chunk: sizes below, at and
    // across the first chunk and the doublings after it, values across the 16-bit ranges
    // (overflow to inf in fp16, subnormals, NaN).
    trainscope::prof::install_host_tensor_counter();
    using trainscope::dist::kNarrowInPlaceFirst;
    const std::int64_t f = kNarrowInPlaceFirst;
    for (auto [wide, narrow] :
         {std::pair{torch::kFloat32, torch::kBFloat16}, std::pair{torch::kFloat32, torch::kHalf},
          std::pair{torch::kFloat64, torch::kBFloat16},
          std::pair{torch::kFloat64, torch::kFloat32}}) {
        for (std::int64_t n : {std::int64_t{1}, f - 1, f, f + 1, 2 * f + 3, 5 * f + 7, 37 * f}) {
            torch::manual_seed(n);
            torch::Tensor v = torch::randn({n}, torch::dtype(torch::kFloat64)) *
                              torch::pow(10.0, torch::randint(-9, 9, {n}, torch::kFloat64));
            v.index_put_({0}, std::nan(""));
            v = v.to(wide);
            const torch::Tensor expected = v.to(narrow);
            const void* storage = v.data_ptr();
            const double before = trainscope::prof::host_tensor_bytes().current;
            trainscope::prof::reset_host_tensor_peak();
            const torch::Tensor got = trainscope::dist::narrow_in_place(v, narrow);
            const double grown = trainscope::prof::host_tensor_bytes().peak - before;
            const std::string what = std::string(c10::toString(wide)) + " -> " +
                                     c10::toString(narrow) + ", " + std::to_string(n);
            ASSERT_EQ(got.scalar_type(), narrow) << what;
            ASSERT_EQ(got.numel(), n) << what;
            EXPECT_EQ(got.data_ptr(), storage) << what;
            EXPECT_LE(grown, static_cast<double>(std::min(n, f) * c10::elementSize(narrow)))
                << what;
            // Bit for bit, NaN and inf included: compare the raw bytes.
            const auto bits = narrow == torch::kFloat32 ? torch::kInt32 : torch::kInt16;
            EXPECT_TRUE(torch::equal(got.view(bits), expected.view(bits))) << what;
        }
    }
    // The same dtype is the tensor itself; narrower by less than half, a copy.
    torch::Tensor h = torch::ones({10}, torch::kHalf);
    EXPECT_TRUE(trainscope::dist::narrow_in_place(h, torch::kHalf).is_same(h));
    EXPECT_NE(trainscope::dist::narrow_in_place(h, torch::kBFloat16).data_ptr(), h.data_ptr());
}

TEST(Zero, A16BitReduceHoldsNoSecondCopyOfTheGradients) {
    // dist.zero=1/2 with dist.compress=bf16 over fp32 parameters: reduce_gradients allocates the
    // first chunk of the in-place cast, not a 16-bit copy of the whole flat gradient (2 bytes per
    // parameter, which the memory plans do not count).
    trainscope::prof::install_host_tensor_counter();
    auto comm = trainscope::testing::mpi_communicator();
    for (int stage : {1, 2}) {
        torch::manual_seed(5);
        auto m = tm_::LlamaForCausalLM(tiny(), torch::TensorOptions().dtype(torch::kFloat32));
        trainscope::dist::ZeroOptimizer zero(*comm, m->parameters(), stage,
                                             trainscope::dist::ZeroAdamW{}, torch::kBFloat16);
        ASSERT_GT(zero.numel(), 4 * trainscope::dist::kNarrowInPlaceFirst);
        auto [ids, labels] = batch(comm->rank(), 0);
        zero.zero_grad();
        tt::causal_lm_loss_sum(m->forward(ids), labels).backward();
        const double before = trainscope::prof::host_tensor_bytes().current;
        trainscope::prof::reset_host_tensor_peak();
        zero.reduce_gradients(1.0);
        const double grown = trainscope::prof::host_tensor_bytes().peak - before;
        EXPECT_LT(grown, 0.25 * 2.0 * static_cast<double>(zero.numel()))
            << "dist.zero=" << stage << ": " << grown << " bytes allocated for " << zero.numel()
            << " parameters";
        zero.step(1e-3);
    }
}

TEST(Zero, ShardsOptimizerStateAndStage2Gradients) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    std::int64_t n = 0;
    for (auto& p : params)
        n += p.numel();
    for (int stage : {1, 2}) {
        auto m = make_model();
        trainscope::dist::ZeroOptimizer zero(*comm, m->parameters(), stage,
                                             trainscope::dist::ZeroAdamW{});
        const std::int64_t shard = (n + comm->size() - 1) / comm->size();
        EXPECT_EQ(zero.numel(), n);
        EXPECT_EQ(zero.shard_numel(), shard);
        EXPECT_DOUBLE_EQ(zero.optimizer_state_bytes(), 2.0 * shard * 8);
        auto [ids, labels] = batch(comm->rank(), 0);
        zero.zero_grad();
        tt::causal_lm_loss_sum(m->forward(ids), labels).backward();
        zero.reduce_gradients(1.0);
        // Stage 1 keeps the full gradient buffer, stage 2 only its shard.
        const double full = static_cast<double>(shard * comm->size()) * 8;
        EXPECT_DOUBLE_EQ(zero.gradient_bytes(), shard * 8.0 + (stage == 1 ? full : 0.0));
        zero.step(1e-3);
    }
}

// ---- The CV trainer's data parallelism (tt::make_data_parallelism), driven as
// ClassificationTrainer drives it: a small MobileNetV2 in fp64, each rank its own images (batch
// norm in training mode), AdamW. dist.zero=1|2 against DDP (dist.zero=0).
namespace {

namespace dist = trainscope::dist;

// A small fp64 MobileNetV2, initialised from `seed`.
tm_::MobileNetV2 small_mobilenet(std::uint64_t seed = 7) {
    torch::manual_seed(seed);
    tm_::MobileNetV2Options o;
    o.num_classes = 10;
    o.width_mult = 0.25;
    o.dropout = 0.0;
    tm_::MobileNetV2 m(o);
    m->to(torch::kFloat64);
    return m;
}

std::unique_ptr<dist::DataParallelism> cv_parallelism(dist::Communicator& comm, tm_::MobileNetV2& m,
                                                      dist::ZeroStage zero) {
    tt::OptimizerConfig opt;
    opt.kind = "adamw";
    opt.lr = 1e-2;
    opt.weight_decay = 0.01;
    dist::TrainableSet trainable;
    for (auto& p : m->named_parameters()) {
        trainable.names.push_back(p.key());
        trainable.tensors.push_back(p.value());
    }
    return tt::make_data_parallelism(zero, opt, /*with_momentum=*/true, /*loss_scaling=*/false,
                                     comm, std::move(trainable), 64 * 1024, 16 * 1024, {});
}

// Steps [from, to) of the trainer's sequence on rank-specific images ([4, 3, 32, 32], 10
// classes).
void cv_steps(dist::DataParallelism& parallel, tm_::MobileNetV2& m, int rank, int from, int to) {
    m->train();
    for (int k = from; k < to; ++k) {
        torch::manual_seed(500 + 31 * rank + k);
        torch::Tensor x = torch::randn({4, 3, 32, 32}, torch::kFloat64);
        torch::Tensor y = torch::randint(0, 10, {4}, torch::kInt64);
        parallel.begin_iteration();
        torch::Tensor loss = torch::nn::functional::cross_entropy(m->forward(x), y);
        parallel.before_last_backward();
        loss.backward();
        parallel.finish_gradients(1.0);
        parallel.set_lr(1e-2);
        EXPECT_TRUE(parallel.step([](torch::optim::Optimizer& o) {
            o.step();
            return true;
        }));
    }
}

std::vector<torch::Tensor> cv_train(dist::ZeroStage zero, int steps) {
    auto comm = trainscope::testing::mpi_communicator();
    auto m = small_mobilenet();
    auto parallel = cv_parallelism(*comm, m, zero);
    cv_steps(*parallel, m, comm->rank(), 0, steps);
    return parallel->full_trainable();
}

// Each rank's checkpoint archive in a shared directory, read back as the checkpointer's shards
// are (same rank count: no resharding).
class FileShards final : public dist::ShardSource {
  public:
    FileShards(std::string dir, int world) : dir_(std::move(dir)), world_(world) {}
    int saved_world() const override { return world_; }
    const std::string& where() const override { return dir_; }
    torch::serialize::InputArchive& rank(int r) override {
        auto& a = archives_[r];
        if (!a) {
            a = std::make_unique<torch::serialize::InputArchive>();
            a->load_from(dir_ + "/rank" + std::to_string(r) + ".pt");
        }
        return *a;
    }
    torch::Tensor reshard(const std::string&, const std::string&, std::int64_t, int, int) override {
        throw std::logic_error("FileShards: no elastic resume here");
    }

  private:
    std::string dir_;
    int world_;
    std::map<int, std::unique_ptr<torch::serialize::InputArchive>> archives_;
};

} // namespace

TEST(Zero, CvStage1And2ReachDdpParameters) {
    // ZeRO's AdamW is torch's arithmetic on a shard, and its reduce-scatter sums what DDP's
    // allreduce sums. On one or two ranks each element's sum is one addition whatever the
    // collective, so in fp64 the runs agree to 1e-10 (measured: equal). On more ranks the two
    // collectives may add in other orders (last-bit differences, ~1e-16 relative), and AdamW's
    // m / sqrt(v) turns those of near-zero gradients (batch norm makes many) into larger ones:
    // measured 8e-8 after three steps on 4 ranks, so 1e-6 there. Both stay far below what a wrong
    // shard, a lost average or a skipped step gives: three steps of lr 1e-2 move the weights by
    // more than 1e-3.
    const double tolerance = trainscope::testing::world_size() <= 2 ? 1e-10 : 1e-6;
    const auto ddp = cv_train(dist::ZeroStage::None, 3);
    const auto fresh = small_mobilenet()->parameters();
    std::vector<torch::Tensor> initial;
    for (const auto& p : fresh)
        initial.push_back(p.detach().clone());
    EXPECT_GT(max_diff(ddp, initial), 1e-3) << "training did not move the weights";
    for (auto zero : {dist::ZeroStage::OptimizerState, dist::ZeroStage::Gradients}) {
        const auto sharded = cv_train(zero, 3);
        ASSERT_EQ(sharded.size(), ddp.size());
        EXPECT_LT(max_diff(sharded, ddp), tolerance) << "dist.zero=" << dist::to_int(zero);
    }
}

TEST(Zero, CvCheckpointRoundTripContinuesTheSameTraining) {
    // Two steps, save (rank 0 the weights, every rank its optimizer shard), a fresh model and
    // parallelism load them, one more step: the parameters of three uninterrupted steps.
    auto comm = trainscope::testing::mpi_communicator();
    const int r = comm->rank(), w = comm->size();
    for (auto zero : {dist::ZeroStage::OptimizerState, dist::ZeroStage::Gradients}) {
        const auto straight = cv_train(zero, 3);
        std::string dir;
        if (r == 0) {
            dir = (std::filesystem::temp_directory_path() /
                   ("trainscope_cv_zero_" + std::to_string(::getpid())))
                      .string();
            std::filesystem::remove_all(dir);
            std::filesystem::create_directories(dir);
        }
        int n = static_cast<int>(dir.size());
        MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
        dir.resize(static_cast<std::size_t>(n));
        MPI_Bcast(dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
        {
            auto m = small_mobilenet();
            auto parallel = cv_parallelism(*comm, m, zero);
            cv_steps(*parallel, m, r, 0, 2);
            torch::serialize::OutputArchive out;
            parallel->save(out, r);
            out.save_to(dir + "/rank" + std::to_string(r) + ".pt");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        // another initialisation: everything must come from the files
        tm_::MobileNetV2 m = small_mobilenet(99);
        auto parallel = cv_parallelism(*comm, m, zero);
        FileShards shards(dir, w);
        parallel->load(shards, r, /*elastic=*/false);
        // Batch-norm running statistics are the trainer's to save; this step uses batch
        // statistics (training mode), so they do not enter the comparison.
        cv_steps(*parallel, m, r, 2, 3);
        EXPECT_LT(max_diff(parallel->full_trainable(), straight), 1e-10)
            << "dist.zero=" << dist::to_int(zero);
        MPI_Barrier(MPI_COMM_WORLD);
        if (r == 0) std::filesystem::remove_all(dir);
    }
}
