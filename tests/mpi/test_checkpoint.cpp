// Checkpoint directories (checkpoint.hpp) at 1 and 2 ranks: every rank's archive round-trips,
// only complete checkpoints (ckpt-*/MANIFEST.json) are found, left-overs of a crashed save are
// ignored and cleaned, checkpoint.keep prunes the oldest, and --resume names every option that
// would change the training. Also checkpoint.every parsing and the loss scaler's saved state.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "dist_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/precision.hpp"
#include "trainscope/train/run_control.hpp"

namespace fs = std::filesystem;
namespace tt = trainscope::train;
namespace core = trainscope::core;

namespace {

int rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
int world() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// One directory shared by the ranks of this test, empty at the start.
std::string shared_dir(const std::string& name) {
    std::string dir;
    if (rank() == 0) {
        dir = (fs::temp_directory_path() /
               ("trainscope_ckpt_" + name + "_" + std::to_string(::getpid())))
                  .string();
        fs::remove_all(dir);
    }
    int n = static_cast<int>(dir.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    dir.resize(static_cast<std::size_t>(n));
    MPI_Bcast(dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    return dir;
}

core::Config config(std::map<std::string, std::string> values) {
    static const core::OptionRegistry registry = tt::all_options();
    return core::Config::from_values(registry, values);
}

} // namespace

TEST(Checkpoint, SavesEveryRankFindsTheNewestCompleteAndPrunes) {
    const std::string dir = shared_dir("save");
    const core::Config cfg =
        config({{"checkpoint.dir", dir}, {"checkpoint.keep", "2"}, {"output.file", "runs/x.h5"}});
    tt::Checkpointer ck(dir, 2, MPI_COMM_WORLD, cfg, "runs/x.h5", 0, 8);
    for (std::int64_t it : {5, 10, 15})
        ck.save(it, [&](torch::serialize::OutputArchive& out) {
            out.write("mine", torch::full({3}, 100.0 * rank() + static_cast<double>(it)));
        });
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_FALSE(fs::exists(dir + "/ckpt-000000005")); // pruned: keep = 2
    EXPECT_TRUE(fs::exists(dir + "/ckpt-000000010/MANIFEST.json"));

    // A crashed save (no manifest, or still partial) is never picked up.
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) {
        fs::create_directories(dir + "/ckpt-000000020");
        fs::create_directories(dir + "/.partial-ckpt-000000025");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    EXPECT_EQ(m.next_iteration, 15);
    EXPECT_EQ(m.world_size, world());
    EXPECT_EQ(m.run_file, "runs/x.h5");
    torch::serialize::InputArchive in;
    tt::Checkpointer::load(m, rank(), in, torch::kCPU);
    torch::Tensor mine;
    in.read("mine", mine);
    EXPECT_TRUE(torch::equal(mine, torch::full({3}, 100.0 * rank() + 15.0)));
    EXPECT_EQ(tt::read_int(in, "next_iteration"), 15);

    // The next save removes the partial left-over and keeps two complete checkpoints.
    ck.save(30, [](torch::serialize::OutputArchive&) {});
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_FALSE(fs::exists(dir + "/.partial-ckpt-000000025"));
    EXPECT_TRUE(fs::exists(dir + "/ckpt-000000030/MANIFEST.json"));
    EXPECT_TRUE(fs::exists(dir + "/ckpt-000000015/MANIFEST.json"));
    EXPECT_FALSE(fs::exists(dir + "/ckpt-000000010"));
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

// A rank reads its own archive and the state source's onto its own device: the optimizer state and
// weights saved from another device must not come back there (issue 25: every rank of a
// multi-GPU job allocated rank 0's optimizer state on cuda:0). The meta device stands in for
// "another device" on CPU.
static void save_optimizer_checkpoint(tt::Checkpointer& ck, torch::Device device) {
    torch::manual_seed(3);
    torch::Tensor w =
        torch::randn({4}, torch::dtype(torch::kFloat64).device(device)).requires_grad_(true);
    torch::optim::AdamW opt({w}, torch::optim::AdamWOptions(0.1));
    (w * w).sum().backward();
    opt.step();
    ck.save(2, [&](torch::serialize::OutputArchive& out) {
        torch::serialize::OutputArchive optimizer;
        opt.save(optimizer);
        out.write("weights", w.detach(), /*is_buffer=*/true);
        out.write("optimizer", optimizer);
        tt::save_rng_state(out, device.is_cuda() ? device.index() : -1);
    });
}

static void expect_loaded_onto(const tt::CheckpointManifest& m, torch::Device device,
                               bool with_optimizer = true) {
    torch::serialize::InputArchive in;
    tt::Checkpointer::load(m, rank(), in, device);
    torch::Tensor w;
    in.read("weights", w, /*is_buffer=*/true);
    EXPECT_EQ(w.device(), device);
    // (AdamW::load reads its step count with item(), which meta tensors cannot give.)
    if (!with_optimizer) return;
    torch::serialize::InputArchive optimizer;
    in.read("optimizer", optimizer);
    // An optimizer over a parameter on `device` takes the state as loaded: it must be there too.
    torch::Tensor p = torch::zeros({4}, torch::dtype(torch::kFloat64).device(device));
    p.requires_grad_(true);
    torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(0.1));
    opt.load(optimizer);
    ASSERT_EQ(opt.state().size(), 1U);
    const auto& st =
        static_cast<const torch::optim::AdamWParamState&>(*opt.state().begin()->second);
    EXPECT_EQ(st.exp_avg().device(), device);
    EXPECT_EQ(st.exp_avg_sq().device(), device);
}

TEST(Checkpoint, LoadMapsEveryTensorOntoTheRanksDevice) {
    const std::string dir = shared_dir("device");
    const core::Config cfg = config({{"checkpoint.dir", dir}, {"output.file", "d.h5"}});
    tt::Checkpointer ck(dir, 1, MPI_COMM_WORLD, cfg, "d.h5", 0, 8);
    save_optimizer_checkpoint(ck, torch::kCPU);
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    expect_loaded_onto(m, torch::Device(torch::kMeta), /*with_optimizer=*/false);
    expect_loaded_onto(m, torch::kCPU);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

// The same from a GPU: saved on cuda:0, loaded onto the host and back onto the rank's GPU (label
// gpu, through scripts/gpu-check; skipped without a GPU).
TEST(Checkpoint, CudaSavedStateLoadsOntoTheRequestedDevice) {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    const std::string dir = shared_dir("cuda");
    const core::Config cfg = config({{"checkpoint.dir", dir}, {"output.file", "c.h5"}});
    tt::Checkpointer ck(dir, 1, MPI_COMM_WORLD, cfg, "c.h5", 0, 8);
    const int gpus = static_cast<int>(torch::cuda::device_count());
    save_optimizer_checkpoint(ck, torch::Device(torch::kCUDA, 0));
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    expect_loaded_onto(m, torch::kCPU);
    const torch::Device mine(torch::kCUDA, static_cast<c10::DeviceIndex>(rank() % gpus));
    expect_loaded_onto(m, mine);
    // The RNG states, mapped onto the GPU with the rest, go back to the host for the generators.
    torch::serialize::InputArchive in;
    tt::Checkpointer::load(m, rank(), in, mine);
    EXPECT_NO_THROW(tt::load_rng_state(in, mine.index()));
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

// This job's layout for check_compatible: `c`'s strategy on `world` ranks with `global_batch`
// samples per step (one replica of that batch: only the product is compared).
tt::ParallelLayout layout_of(const core::Config& c, int world, std::int64_t global_batch) {
    tt::ParallelLayout l = tt::ParallelLayout::kinds(c);
    l.world_size = world;
    l.batch_per_rank = global_batch;
    return l;
}

TEST(Checkpoint, ResumeNamesTheOptionsThatChangeTraining) {
    const std::string dir = shared_dir("compat");
    const core::Config saved =
        config({{"checkpoint.dir", dir}, {"train.lr", "0.01"}, {"output.file", "a.h5"}});
    tt::Checkpointer ck(dir, 1, MPI_COMM_WORLD, saved, "a.h5", 0, 8);
    ck.save(3, [](torch::serialize::OutputArchive&) {});
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    EXPECT_EQ(m.global_batch, 8);
    // Output, logging and timeouts may change, and the batch options with the global batch kept.
    const core::Config same = config({{"checkpoint.dir", dir},
                                      {"train.lr", "0.01"},
                                      {"output.file", "b.h5"},
                                      {"train.batch_size", "3"},
                                      {"run.iteration_timeout", "60"}});
    EXPECT_NO_THROW(tt::Checkpointer::check_compatible(m, same, layout_of(same, world(), 8)));
    try {
        const core::Config changed =
            config({{"checkpoint.dir", dir}, {"train.lr", "0.02"}, {"run.seed", "7"}});
        tt::Checkpointer::check_compatible(m, changed, layout_of(changed, world(), 8));
        FAIL() << "a changed learning rate and seed were accepted";
    } catch (const core::ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("train.lr: checkpoint '0.01', now '0.02'"), std::string::npos) << what;
        EXPECT_NE(what.find("run.seed"), std::string::npos) << what;
    }
    // Another rank count keeping the global batch: an elastic resume (ddp-ds, the default).
    EXPECT_NO_THROW(tt::Checkpointer::check_compatible(m, saved, layout_of(saved, world() + 1, 8)));
    try {
        tt::Checkpointer::check_compatible(m, saved, layout_of(saved, world() + 1, 16));
        FAIL() << "another global batch was accepted";
    } catch (const core::ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("global batch is 16 samples per step"), std::string::npos) << what;
        EXPECT_NE(what.find("train.global_batch_size=8"), std::string::npos) << what;
    }
    // Strategies whose steps depend on the rank count are refused another one, naming why.
    for (const char* strategy : {"pipeline", "ddp"}) {
        core::Config other =
            config({{"checkpoint.dir", dir}, {"train.lr", "0.01"}, {"run.strategy", strategy}});
        try {
            tt::Checkpointer::check_compatible(m, other, layout_of(other, world() + 1, 8));
            FAIL() << strategy << " on another rank count was accepted";
        } catch (const core::ConfigError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find(std::string("run.strategy=") + strategy), std::string::npos)
                << what;
            EXPECT_NE(what.find("resume with the same number of ranks"), std::string::npos) << what;
        }
    }
    // A checkpoint without its global batch (older format) resumes only on its rank count.
    tt::CheckpointManifest old = m;
    old.global_batch = 0;
    EXPECT_THROW(tt::Checkpointer::check_compatible(old, saved, layout_of(saved, world() + 1, 8)),
                 core::ConfigError);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

TEST(Checkpoint, FlatShardsAreCutAgainForAnotherRankCount) {
    // A flat tensor of 11 elements saved as world() shards of ceil(11 / world()) (zeros after the
    // end), read back as the shards of 1, 2, 3, 4 and 16 ranks: each is its slice, zero-padded.
    const std::string dir = shared_dir("reshard");
    const std::int64_t numel = 11;
    const torch::Tensor full = torch::arange(1, numel + 1, torch::kFloat64);
    const std::int64_t shard = (numel + world() - 1) / world();
    const torch::Tensor padded =
        torch::cat({full, torch::zeros({shard * world() - numel}, torch::kFloat64)});
    const core::Config cfg = config({{"checkpoint.dir", dir}, {"output.file", "s.h5"}});
    tt::Checkpointer ck(dir, 1, MPI_COMM_WORLD, cfg, "s.h5", 0, 8);
    ck.save(2, [&](torch::serialize::OutputArchive& out) {
        torch::serialize::OutputArchive part;
        part.write("exp_avg", padded.narrow(0, rank() * shard, shard).clone(), /*is_buffer=*/true);
        out.write("zero_shard", part);
    });
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    // Rank 0's file wanted by every rank: read once per node and shared; the others on demand.
    tt::CheckpointShards saved(m, torch::kCPU, MPI_COMM_WORLD, {0});
    for (int new_world : {1, 2, 3, 4, 16}) {
        const std::int64_t size = (numel + new_world - 1) / new_world;
        for (int r = 0; r < new_world; ++r) {
            const torch::Tensor got = saved.reshard("zero_shard", "exp_avg", numel, r, new_world);
            torch::Tensor want = torch::zeros({size}, torch::kFloat64);
            const std::int64_t begin = std::min(numel, r * size);
            const std::int64_t n = std::min(numel, begin + size) - begin;
            if (n > 0) want.narrow(0, 0, n).copy_(full.narrow(0, begin, n));
            EXPECT_TRUE(torch::equal(got, want)) << "rank " << r << " of " << new_world;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

// Issue 39: a file read once for the node and found missing (or corrupt) is the same InputError,
// naming it, on every rank that wanted it; nobody waits for bytes that never come.
TEST(Checkpoint, ASharedRankFileThatCannotBeReadFailsEveryRankThatWantedIt) {
    const std::string dir = shared_dir("shared_missing");
    const core::Config cfg = config({{"checkpoint.dir", dir}, {"output.file", "s.h5"}});
    tt::Checkpointer ck(dir, 1, MPI_COMM_WORLD, cfg, "s.h5", 0, 8);
    ck.save(3, [&](torch::serialize::OutputArchive& out) { tt::write_int(out, "x", rank()); });
    const tt::CheckpointManifest m = tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
    for (const bool corrupt : {true, false}) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank() == 0) {
            if (corrupt)
                std::ofstream(m.path + "/rank00000.pt", std::ios::trunc) << "not a zip archive";
            else
                fs::remove(m.path + "/rank00000.pt");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        tt::CheckpointShards shards(m, torch::kCPU, MPI_COMM_WORLD, {0, rank()});
        if (rank() > 0) EXPECT_EQ(tt::read_int(shards.rank(rank()), "x"), rank());
        try {
            shards.rank(0);
            FAIL() << "a " << (corrupt ? "corrupt" : "missing") << " rank file was accepted";
        } catch (const core::InputError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("rank00000.pt cannot be read"), std::string::npos) << what;
            if (!corrupt) EXPECT_NE(what.find("No such file"), std::string::npos) << what;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

TEST(Checkpoint, NoCheckpointOrBrokenManifestIsAnInputErrorOnEveryRank) {
    const std::string dir = shared_dir("missing");
    EXPECT_THROW(tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD), core::InputError);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) {
        fs::create_directories(dir + "/ckpt-000000004");
        std::ofstream(dir + "/ckpt-000000004/MANIFEST.json") << "{\"next_iteration\": ";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    try {
        tt::Checkpointer::find_latest(dir, MPI_COMM_WORLD);
        FAIL() << "a truncated manifest was accepted";
    } catch (const core::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("MANIFEST.json"), std::string::npos) << e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) fs::remove_all(dir);
}

TEST(RunControlOptions, CheckpointEveryIsIterationsOrMinutes) {
    auto parse = [](const std::string& every, const std::string& dir = "/tmp/c") {
        return tt::RunControlOptions::from_config(
            config({{"checkpoint.dir", dir}, {"checkpoint.every", every}}));
    };
    EXPECT_EQ(parse("500").checkpoint_every_iters, 500);
    EXPECT_DOUBLE_EQ(parse("30min").checkpoint_every_s, 1800.0);
    EXPECT_DOUBLE_EQ(parse("1.5 min").checkpoint_every_s, 90.0);
    EXPECT_EQ(parse("0").checkpoint_every_iters, 0);
    for (const char* bad : {"5h", "-1", "1.5", "min", "", "nan", "0min"})
        EXPECT_THROW(parse(bad), core::ConfigError) << bad;
    EXPECT_THROW(parse("10", ""), core::ConfigError); // a period without a directory
}

TEST(GradScaler, SavedStateContinuesTheSameScaleSequence) {
    tt::GradScaler::Options o;
    o.init_scale = 1024;
    o.growth_interval = 2;
    tt::GradScaler a(o, torch::kCPU);
    torch::Tensor w = torch::ones({2}, torch::requires_grad());
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
    for (int i = 0; i < 3; ++i) { // two finite steps (growth), one inf step (backoff)
        opt.zero_grad();
        a.scale((w * (i == 2 ? INFINITY : 1.0)).sum()).backward();
        a.step(opt);
        a.update();
    }
    torch::serialize::OutputArchive out;
    a.save(out);
    std::ostringstream bytes;
    out.save_to(bytes);
    tt::GradScaler b(o, torch::kCPU);
    torch::serialize::InputArchive in;
    std::istringstream src(bytes.str());
    in.load_from(src);
    b.load(in);
    EXPECT_DOUBLE_EQ(b.scale_value(), a.scale_value());
    EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
    EXPECT_EQ(b.skipped_steps(), 1);
}

namespace {
// Counts the watchdog's polls for asynchronous failures (healthy: "").
class PolledCommunicator final : public trainscope::testing::RecordingCommunicator {
  public:
    using RecordingCommunicator::RecordingCommunicator;
    std::string poll_async_error() override {
        ++polls;
        return "";
    }
    std::atomic<int> polls{0};
};
} // namespace

TEST(RunControl, TheWatchdogPollsEveryCommunicatorItIsGiven) {
    // NCCL reports a failed collective asynchronously, per communicator: the watchdog polls the
    // run's communicator and the others the workload names (the pipeline's pipe and data-parallel
    // groups, Workload::side_communicators), or a failure there would surface only as a timeout
    // of whatever waits for it, or never without dist.timeout.
    auto comm = trainscope::testing::mpi_communicator();
    trainscope::testing::OperationLog log;
    PolledCommunicator main(*comm, "main", log), pipe(*comm, "pipe", log), dp(*comm, "dp", log);
    {
        tt::RunControlOptions o;
        o.iteration_timeout_s = 0;
        o.peer_timeout_s = 0; // no timeout: the communicators alone start the watchdog
        tt::RunControl control(o, MPI_COMM_WORLD, nullptr, &main, {&pipe, &dp});
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while ((main.polls == 0 || pipe.polls == 0 || dp.polls == 0) &&
               std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_GT(main.polls.load(), 0);
    EXPECT_GT(pipe.polls.load(), 0);
    EXPECT_GT(dp.polls.load(), 0);
}
