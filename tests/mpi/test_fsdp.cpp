// dist.zero=3 (FSDP) against unsharded data parallelism (dist.zero=0), through the real LlmTrainer:
// a tiny fp64 Llama, the shipped tokenizer and datasets, every fine-tuning method, with and without
// activation checkpointing, gradient accumulation, prefetching and resharding after forward.
// Sharding must not change the arithmetic: after three AdamW steps the trainable tensors agree to
// 1e-10 and the losses to 1e-12. Also: each rank stores ~1/N of the weights, the run file's
// all-gather / reduce-scatter columns count the traffic, and nothing stays gathered.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist_test_util.hpp"
#include "trainscope/data/text_dataset.hpp"
#include "trainscope/data/tokenizer.hpp"
#include "trainscope/distributed/fsdp.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/llama_units.hpp"
#include "trainscope/train/llm_trainer.hpp"
#include "trainscope/train/recorder.hpp"

namespace tt = trainscope::train;
namespace td = trainscope::data;

namespace {

const std::string kData = std::string(TRAINSCOPE_SOURCE_DIR) + "/inputs/llm/data/";

struct Case {
    tt::LlmMethod method = tt::LlmMethod::Lora;
    bool checkpointing = false;
    std::int64_t accumulation = 1;
    bool prefetch = true, reshard = true;
    bool tied = false; // tied embeddings: the head is the embedding (unit 0 stays gathered)
    // dist.compress: DDP's buckets, FSDP's reduce dtype.
    trainscope::dist::CompressionKind compress = trainscope::dist::CompressionKind::None;
    std::string name() const {
        return std::string(tt::to_string(method)) + (tied ? " tied" : "") +
               (checkpointing ? " +AC" : "") + " accum " + std::to_string(accumulation) +
               (prefetch ? " prefetch" : "") + (reshard ? " reshard" : " no-reshard");
    }
};

struct Result {
    std::vector<double> losses;
    std::vector<torch::Tensor> trainable;
    double parameter_bytes = 0, gathered_bytes = 0, allgather_bytes = 0, reduce_scatter_bytes = 0;
    double comm_bytes = 0, comm_uncompressed_bytes = 0;
    // The last iteration's durations: as account() left them (NaN: resolved later), then after
    // resolve_accounting.
    double collective_s_accounted = 0, allgather_s_accounted = 0;
    double collective_s = 0, allgather_s = 0, allgather_exposed_s = 0, reduce_scatter_s = 0,
           reduce_scatter_exposed_s = 0;
};

int extra_index(const std::string& name) {
    const auto cols = tt::LlmTrainer::extra_columns();
    for (std::size_t i = 0; i < cols.size(); ++i)
        if (cols[i].name == name) return static_cast<int>(i);
    ADD_FAILURE() << "no /iterations column " << name;
    return 0;
}

Result train(const Case& c, int zero, int steps = 3) {
    auto comm = trainscope::testing::mpi_communicator();
    static std::unique_ptr<td::Tokenizer> tok = td::load_tokenizer(kData + "tiny_tokenizer.model");
    tt::LlmOptions l;
    l.method = c.method;
    l.lora.rank = 4;
    l.lora.alpha = 8;
    l.qat_start_step = 1; // the first step without fake quantisation, as qat-tiny.ini
    l.activation_checkpointing = c.checkpointing;
    // llm.loss_chunks stays at its default, 8: the chunked head under FSDP's unit hooks.
    l.gradient_accumulation = c.accumulation;
    l.sharding.zero = static_cast<trainscope::dist::ZeroStage>(zero);
    l.sharding.prefetch = c.prefetch;
    l.sharding.reshard_after_forward = c.reshard;
    l.precision = "fp64";
    const bool dpo = c.method == tt::LlmMethod::Dpo;
    l.dataset.path = kData + (dpo ? "preference.jsonl" : "instruct.jsonl");
    l.dataset.format = dpo ? td::TextFormat::Preference : td::TextFormat::Instruct;
    l.dataset.max_seq_len = 96; // long enough that every batch has label tokens
    td::TextDataset data(l.dataset, *tok);

    trainscope::models::LlamaConfig config = trainscope::models::LlamaConfig::preset("tiny");
    config.vocab_size = std::max<std::int64_t>(config.vocab_size, tok->vocab_size());
    config.tie_word_embeddings = c.tied;
    tt::PrecisionPolicy policy;
    policy.mode = tt::Precision::FP64;
    policy.param_dtype = torch::kFloat64;
    torch::manual_seed(5); // as the app: every rank the same seed
    tt::LlmModel model = tt::build_llm_model(l, config, policy, torch::kCPU, 5);

    tt::LlmTrainerOptions t;
    t.llm = l;
    t.optimizer.kind = "adamw"; // what dist.zero > 0 implements
    t.optimizer.lr = 1e-2;
    t.optimizer.weight_decay = 0.01;
    t.precision = policy;
    t.batch_size = 2;
    t.workers = 1;
    t.prefetch = 1;
    t.compression.kind = c.compress;
    tt::LlmTrainer trainer(t, std::move(model), data, *tok, *comm, MPI_COMM_WORLD);
    trainscope::prof::PhaseTimer timer;
    trainer.begin_epoch(0, 0);
    Result out;
    for (int k = 0; k < steps; ++k) {
        EXPECT_TRUE(trainer.next_batch());
        trainer.set_lr(1e-2);
        timer.begin_iteration(k);
        tt::StepResult r = trainer.step(k, timer, nullptr);
        EXPECT_EQ(tt::read_scalar(trainer.nonfinite_flag(r)), 0.0);
        double peak = 0;
        EXPECT_TRUE(trainer.apply(false, peak));
        tt::IterationValues v;
        v.iteration = k;
        v.extra = r.extra;
        trainer.account(v);
        out.collective_s_accounted = v.comm_collective_s;
        out.allgather_s_accounted = v.extra[extra_index("allgather_s")];
        trainer.resolve_accounting(k, v); // the loop's resolution point
        out.collective_s = v.comm_collective_s;
        out.allgather_s = v.extra[extra_index("allgather_s")];
        out.allgather_exposed_s = v.extra[extra_index("allgather_exposed_s")];
        out.reduce_scatter_s = v.extra[extra_index("reduce_scatter_s")];
        out.reduce_scatter_exposed_s = v.extra[extra_index("reduce_scatter_exposed_s")];
        timer.end_iteration();
        std::vector<tt::DeferredStep> d(1);
        d[0].loss = r.loss;
        d[0].metrics = r.metrics;
        trainer.resolve(d);
        out.losses.push_back(d[0].loss_value);
        out.parameter_bytes = v.parameter_bytes;
        out.comm_bytes = v.comm_bytes;
        out.comm_uncompressed_bytes = v.comm_uncompressed_bytes;
        out.gathered_bytes = v.extra[extra_index("gathered_weight_bytes")];
        out.allgather_bytes = v.extra[extra_index("allgather_bytes")];
        out.reduce_scatter_bytes = v.extra[extra_index("reduce_scatter_bytes")];
    }
    out.trainable = trainer.trainable_values();
    // Every rank holds the same values (data parallelism's invariant, sharded or not).
    for (const auto& t : out.trainable) {
        torch::Tensor mine = t.contiguous().clone(), first = mine.clone();
        MPI_Bcast(first.data_ptr(), static_cast<int>(first.nbytes()), MPI_BYTE, 0, MPI_COMM_WORLD);
        EXPECT_TRUE(torch::equal(mine, first))
            << c.name() << " zero " << zero << ": ranks disagree on a trainable tensor";
    }
    return out;
}

void expect_same(const Result& plain, const Result& sharded, const std::string& what) {
    ASSERT_EQ(plain.losses.size(), sharded.losses.size());
    double loss_diff = 0, param_diff = 0;
    for (std::size_t i = 0; i < plain.losses.size(); ++i) {
        ASSERT_TRUE(std::isfinite(plain.losses[i]) && std::isfinite(sharded.losses[i]))
            << what << ": iteration " << i << " loss " << plain.losses[i] << " unsharded, "
            << sharded.losses[i] << " sharded";
        loss_diff = std::max(loss_diff, std::abs(plain.losses[i] - sharded.losses[i]));
    }
    if (loss_diff > 1e-12)
        for (std::size_t i = 0; i < plain.losses.size(); ++i)
            ADD_FAILURE() << what << " iteration " << i << ": " << plain.losses[i] << " vs "
                          << sharded.losses[i];
    ASSERT_EQ(plain.trainable.size(), sharded.trainable.size()) << what;
    for (std::size_t i = 0; i < plain.trainable.size(); ++i)
        param_diff = std::max(
            param_diff, (plain.trainable[i] - sharded.trainable[i]).abs().max().item<double>());
    EXPECT_LE(loss_diff, 1e-12) << what;
    EXPECT_LE(param_diff, 1e-10) << what;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        std::printf("[fsdp] %-40s max |loss diff| %.1e  max |param diff| %.1e\n", what.c_str(),
                    loss_diff, param_diff);
}

} // namespace

TEST(Fsdp, EveryMethodEqualsUnshardedDataParallelism) {
    using M = tt::LlmMethod;
    const char* only = std::getenv("FSDP_TEST_METHOD"); // for debugging one method
    for (M method : {M::Full, M::Lora, M::Qlora, M::Dpo, M::Qat})
        for (bool ac : {false, true})
            for (std::int64_t accum : {1, 2}) {
                if (only && tt::to_string(method) != std::string(only)) continue;
                Case c;
                c.method = method;
                c.checkpointing = ac;
                c.accumulation = accum;
                const Result plain = train(c, 0);
                // The training moved the weights (the comparison is not between two untouched
                // models): the first step's loss differs from the last.
                EXPECT_NE(plain.losses.front(), plain.losses.back());
                for (bool prefetch : {true, false}) {
                    c.prefetch = prefetch;
                    // Keeping units gathered from forward to backward is checked once per method.
                    for (bool reshard : {true, false}) {
                        if (!reshard && (ac || accum > 1 || !prefetch)) continue;
                        c.reshard = reshard;
                        expect_same(plain, train(c, 3), c.name());
                    }
                }
            }
}

TEST(Fsdp, Bf16AndFp16ReduceDtypeMatchCompressedDdp) {
    // dist.compress=fp16/bf16 under FSDP: each unit's reduce-scatter in 16 bits with PyTorch's
    // hook's pre-division, per element what DDP's compressed bucket allreduce computes: on two
    // ranks one 16-bit addition whatever the collective, so the runs agree as sharding does.
    using trainscope::dist::CompressionKind;
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    Case c;
    c.method = tt::LlmMethod::Full;
    const Result plain = train(c, 3, 2);
    for (CompressionKind kind : {CompressionKind::Bf16, CompressionKind::Fp16}) {
        c.compress = kind;
        const Result ddp = train(c, 0, 2), fsdp = train(c, 3, 2);
        const std::string what = std::string("dist.compress=") + trainscope::dist::to_string(kind);
        if (world <= 2) expect_same(ddp, fsdp, what);
        if (world == 1) continue; // nothing travels, nothing is compressed
        // fp64 gradients reduce-scattered as 16 bits: a quarter of the bytes; the all-gathers
        // are unchanged.
        EXPECT_DOUBLE_EQ(fsdp.reduce_scatter_bytes * 4, plain.reduce_scatter_bytes) << what;
        EXPECT_DOUBLE_EQ(fsdp.comm_uncompressed_bytes, plain.comm_bytes) << what;
        EXPECT_DOUBLE_EQ(fsdp.comm_bytes, fsdp.allgather_bytes + fsdp.reduce_scatter_bytes);
        EXPECT_DOUBLE_EQ(ddp.comm_bytes * 4, ddp.comm_uncompressed_bytes) << what;
        double moved = 0;
        for (std::size_t i = 0; i < plain.trainable.size(); ++i)
            moved = std::max(moved,
                             (plain.trainable[i] - fsdp.trainable[i]).abs().max().item<double>());
        EXPECT_GT(moved, 1e-9) << what << ": nothing was compressed";
    }
}

TEST(Fsdp, TiedEmbeddingsStayGatheredForTheHead) {
    // The head reads the embedding: unit 0 must outlive the forward (also DPO's no-grad
    // reference forward) and receive both gradient contributions.
    for (tt::LlmMethod method : {tt::LlmMethod::Full, tt::LlmMethod::Dpo}) {
        Case c;
        c.method = method;
        c.tied = true;
        const Result plain = train(c, 0);
        expect_same(plain, train(c, 3), c.name());
    }
}

TEST(Fsdp, EachRankStoresItsShardAndTheRunFileCountsTheTraffic) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (tt::LlmMethod method : {tt::LlmMethod::Full, tt::LlmMethod::Qlora}) {
        Case c;
        c.method = method;
        const Result plain = train(c, 0, 1);
        const Result sharded = train(c, 3, 1);
        // Weights outside the gathered units: 1/N of the unsharded figure, plus padding of at most
        // one element per group and rank (a few hundred bytes at most here).
        EXPECT_NEAR(sharded.parameter_bytes, plain.parameter_bytes / world, 4096.0)
            << tt::to_string(method);
        EXPECT_EQ(sharded.gathered_bytes, 0.0) << "units left gathered after the iteration";
        // All-gathers: each unit at least once in forward; reduce-scatters: the trainable
        // shards' bytes (this rank's share of every trainable gradient).
        EXPECT_GE(sharded.allgather_bytes, sharded.parameter_bytes * 0.99);
        EXPECT_GT(sharded.reduce_scatter_bytes, 0.0);
        EXPECT_DOUBLE_EQ(sharded.comm_bytes,
                         sharded.allgather_bytes + sharded.reduce_scatter_bytes);
        EXPECT_TRUE(std::isnan(plain.allgather_bytes)) << "unsharded runs leave the columns NaN";
        // Durations are not read in account() (on NCCL that would wait for the device) but at
        // the resolution point: all-gathers and reduce-scatters took time, exposed waits are
        // within [0, ...), and the collective column is their sum.
        EXPECT_TRUE(std::isnan(sharded.collective_s_accounted));
        EXPECT_TRUE(std::isnan(sharded.allgather_s_accounted));
        EXPECT_GT(sharded.allgather_s, 0.0);
        EXPECT_GT(sharded.reduce_scatter_s, 0.0);
        EXPECT_GE(sharded.allgather_exposed_s, 0.0);
        EXPECT_GE(sharded.reduce_scatter_exposed_s, 0.0);
        EXPECT_DOUBLE_EQ(sharded.collective_s, sharded.allgather_s + sharded.reduce_scatter_s);
        EXPECT_TRUE(std::isnan(plain.allgather_s)) << "unsharded runs leave the columns NaN";
        // Unsharded (DDP buckets at world > 1): resolved the same way.
        EXPECT_TRUE(world == 1 || std::isnan(plain.collective_s_accounted));
        EXPECT_GE(plain.collective_s, 0.0);
    }
}

TEST(Fsdp, AllGathersRunOnTheLaneTheBackendOffers) {
    // NCCL gives FSDP's all-gathers their own communicator and stream (Communicator::make_lane),
    // so a prefetched all-gather does not queue behind a reduce-scatter; MPI offers none. A
    // recorder standing in for NCCL's lane: every all-gather on the lane, every reduce-scatter
    // and the set-up broadcasts on the main communicator, the same gradients as without a lane.
    auto comm = trainscope::testing::mpi_communicator();
    EXPECT_EQ(comm->make_lane(), nullptr) << "MPI (MPI_THREAD_SERIALIZED) must not offer a lane";
    auto config = trainscope::models::LlamaConfig::preset("tiny");
    std::vector<torch::Tensor> params[2];
    for (bool lane : {false, true}) {
        trainscope::testing::OperationLog log;
        trainscope::testing::RecordingCommunicator main(*comm, "main", log, lane);
        torch::manual_seed(11);
        trainscope::models::LlamaForCausalLM model(config,
                                                   torch::TensorOptions().dtype(torch::kFloat64));
        trainscope::train::LlamaUnits units(*model);
        trainscope::dist::FsdpModel fsdp(main, units, trainscope::dist::FsdpOptions{});
        fsdp.begin_iteration();
        torch::manual_seed(12); // the same batch on every rank
        const torch::Tensor ids = torch::randint(0, config.vocab_size, {2, 12}, torch::kInt64);
        model->forward(ids).pow(2).mean().backward();
        fsdp.end_backward();
        fsdp.finish_gradients(1.0);
        fsdp.step(1e-2);
        const auto trained = log.ops(); // before gather_trainable's own (blocking) all-gathers
        std::vector<torch::Tensor> full = fsdp.gather_trainable([&] {
            std::vector<std::string> names;
            for (const auto& p : model->named_parameters())
                names.push_back(p.key());
            return names;
        }());
        params[lane] = full;
        int allgathers = 0, reduce_scatters = 0;
        for (const auto& op : trained) {
            if (op.op == "allgather" && op.numel > 0 && op.comm != "main") ++allgathers;
            if (op.op == "reduce_scatter") {
                EXPECT_EQ(op.comm, "main");
                ++reduce_scatters;
            }
            if (op.op == "broadcast") EXPECT_EQ(op.comm, "main");
            if (op.op == "allgather" && lane && op.comm == "main")
                ADD_FAILURE() << "an all-gather on the main communicator beside a lane";
        }
        // Forward and backward gather every unit at least once (the head's stay gathered).
        if (lane)
            EXPECT_GE(allgathers, config.num_hidden_layers + 2);
        else
            EXPECT_EQ(allgathers, 0);
        EXPECT_GE(reduce_scatters, config.num_hidden_layers + 2);
    }
    // The parameters after one AdamW step agree exactly.
    ASSERT_EQ(params[0].size(), params[1].size());
    for (std::size_t i = 0; i < params[0].size(); ++i)
        EXPECT_TRUE(torch::equal(params[0][i], params[1][i])) << i;
}
