// dist module under MPI (np 1, 2, 4): the MPI communicator's collectives checked exactly against
// closed forms, point-to-point send/recv, asynchronous allreduce ordering, accounting, collective
// error agreement, option resolution, topology and CPU device binding.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <set>
#include <stdexcept>
#include <thread>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/build_config.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/device.hpp"
#include "trainscope/distributed/event_pool.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/topology.hpp"

namespace dist = trainscope::dist;
namespace core = trainscope::core;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

// 0, 1, ..., n-1 as `dtype`.
torch::Tensor iota(std::int64_t n, torch::Dtype dtype) {
    return torch::arange(n, torch::TensorOptions().dtype(torch::kInt64)).to(dtype);
}

const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kInt64};

} // namespace

// Every collective of the MPI communicator is checked in both of its modes: without a timeout
// (blocking calls on the caller's thread, as the comm benchmark runs) and with dist.timeout set
// (collectives on the progress thread, the caller waiting with a deadline; see communicator.cpp).
class MpiCommunicator : public ::testing::TestWithParam<double> {
  protected:
    std::unique_ptr<dist::Communicator> make() const {
        return dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU),
                                       GetParam());
    }
};

INSTANTIATE_TEST_SUITE_P(Modes, MpiCommunicator, ::testing::Values(0.0, 120.0),
                         [](const ::testing::TestParamInfo<double>& info) {
                             return info.param > 0 ? std::string("WithTimeout")
                                                   : std::string("WithoutTimeout");
                         });

TEST_P(MpiCommunicator, AllreduceMatchesClosedForms) {
    auto comm = make();
    const int r = world_rank(), w = world_size();
    ASSERT_EQ(comm->rank(), r);
    ASSERT_EQ(comm->size(), w);
    EXPECT_EQ(comm->backend(), "mpi");
    for (auto dtype : kDtypes) {
        for (std::int64_t n : {7, 1000}) {
            // Rank r holds (r+1)*(i-3): negative and positive entries make max/min non-trivial.
            const auto base = iota(n, torch::kInt64) - 3;
            const auto pos = (base >= 0);
            auto mine = [&] { return (base * (r + 1)).to(dtype); };
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " n=" + std::to_string(n));

            auto t = mine();
            comm->allreduce(t, dist::ReduceOp::Sum);
            EXPECT_TRUE(torch::equal(t, (base * (w * (w + 1) / 2)).to(dtype)));

            t = mine();
            comm->allreduce(t, dist::ReduceOp::Max);
            EXPECT_TRUE(torch::equal(t, torch::where(pos, base * w, base).to(dtype)));

            t = mine();
            comm->allreduce(t, dist::ReduceOp::Min);
            EXPECT_TRUE(torch::equal(t, torch::where(pos, base, base * w).to(dtype)));

            if (dtype != torch::kInt64) {
                // mean of (r+1) over ranks = (w+1)/2: exact in binary for w = 1, 2, 4.
                t = mine();
                comm->allreduce(t, dist::ReduceOp::Average);
                EXPECT_TRUE(torch::equal(t, base.to(dtype) * ((w + 1) / 2.0)));
            }
        }
    }
}

TEST_P(MpiCommunicator, BroadcastFromLastRank) {
    auto comm = make();
    const int r = world_rank(), w = world_size(), root = w - 1;
    for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt64, torch::kUInt8}) {
        auto t = (iota(7, torch::kInt64) + 10 * r).to(dtype);
        comm->broadcast(t, root);
        EXPECT_TRUE(torch::equal(t, (iota(7, torch::kInt64) + 10 * root).to(dtype)))
            << c10::toString(dtype);
    }
    EXPECT_THROW(comm->broadcast(torch::zeros({3}), w), core::InternalError);
}

TEST_P(MpiCommunicator, AllgatherInRankOrder) {
    auto comm = make();
    const int r = world_rank(), w = world_size();
    for (auto dtype : kDtypes) {
        auto in = (iota(7, torch::kInt64) + 100 * r).to(dtype);
        auto out = torch::full({7 * w}, -1, torch::TensorOptions().dtype(dtype));
        comm->allgather(in, out);
        // Element r*7+i came from rank r: 100*r + i.
        auto j = iota(7 * w, torch::kInt64);
        auto expected = (torch::floor_divide(j, 7) * 100 + torch::remainder(j, 7)).to(dtype);
        EXPECT_TRUE(torch::equal(out, expected)) << c10::toString(dtype);
    }
    EXPECT_THROW(comm->allgather(torch::zeros({7}), torch::zeros({7 * w + 1})),
                 core::InternalError);
}

TEST_P(MpiCommunicator, ReduceScatterBlocks) {
    auto comm = make();
    const int r = world_rank(), w = world_size();
    const std::int64_t m = 5;
    for (auto dtype : kDtypes) {
        auto in = (iota(m * w, torch::kInt64) * (r + 1)).to(dtype);
        auto out = torch::zeros({m}, torch::TensorOptions().dtype(dtype));
        comm->reduce_scatter(in, out, dist::ReduceOp::Sum);
        // Block r of sum over ranks of (rank+1)*j = j * w(w+1)/2 for j in [r*m, (r+1)*m).
        auto j = iota(m, torch::kInt64) + r * m;
        EXPECT_TRUE(torch::equal(out, (j * (w * (w + 1) / 2)).to(dtype))) << c10::toString(dtype);
        if (dtype != torch::kInt64) {
            comm->reduce_scatter(in, out, dist::ReduceOp::Average);
            EXPECT_TRUE(torch::equal(out, j.to(dtype) * ((w + 1) / 2.0)));
        }
    }
    EXPECT_THROW(
        comm->reduce_scatter(torch::zeros({m * w + 1}), torch::zeros({m}), dist::ReduceOp::Sum),
        core::InternalError);
}

TEST_P(MpiCommunicator, EmptyTensorsAreNoOpsAndKeepRanksInStep) {
    auto comm = make();
    const int w = world_size();
    auto empty = torch::zeros({0}, torch::kFloat64);
    auto work = comm->allreduce_async(empty, dist::ReduceOp::Sum);
    EXPECT_TRUE(work->completed());
    work->wait();
    comm->broadcast(empty, 0);
    comm->allgather(empty, torch::zeros({0}, torch::kFloat64));
    comm->reduce_scatter(empty, torch::zeros({0}, torch::kFloat64), dist::ReduceOp::Sum);
    EXPECT_TRUE(comm->stats().empty()); // nothing was communicated
    // A real collective afterwards still matches across ranks.
    auto one = torch::ones({3}, torch::kFloat64);
    comm->allreduce(one, dist::ReduceOp::Sum);
    EXPECT_TRUE(torch::equal(one, torch::full({3}, double(w), torch::kFloat64)));
}

TEST_P(MpiCommunicator, AsyncAllreducesCompleteInLaunchOrder) {
    auto comm = make();
    const int r = world_rank(), w = world_size();
    std::vector<torch::Tensor> tensors;
    std::vector<std::shared_ptr<dist::Work>> works;
    for (int k = 0; k < 8; ++k) {
        tensors.push_back(
            torch::full({std::int64_t{1} << (2 * k)}, double(r + 1) * (k + 1), torch::kFloat64));
        works.push_back(comm->allreduce_async(tensors.back(), dist::ReduceOp::Sum));
    }
    // A blocking collective on the caller's thread while those are in flight does not mix with
    // them (separate duplicated communicators).
    auto b = torch::full({4}, double(r), torch::kFloat64);
    comm->broadcast(b, w - 1);
    EXPECT_TRUE(torch::equal(b, torch::full({4}, double(w - 1), torch::kFloat64)));

    works.back()->wait();
    // FIFO progress thread: once the last one is done, every earlier one is done too.
    for (int k = 0; k < 8; ++k)
        EXPECT_TRUE(works[k]->completed()) << k;
    for (int k = 0; k < 8; ++k) {
        works[k]->wait();
        const double expected = (k + 1) * w * (w + 1) / 2.0;
        EXPECT_TRUE(torch::equal(tensors[k], torch::full_like(tensors[k], expected))) << k;
    }
}

TEST_P(MpiCommunicator, WorkReportsTheCollectivesOwnDuration) {
    auto comm = make();
    auto t = torch::ones({1 << 18}, torch::kFloat32); // 1 MiB
    const auto t0 = std::chrono::steady_clock::now();
    auto work = comm->allreduce_async(t, dist::ReduceOp::Sum);
    work->wait();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double seconds = work->seconds();
    EXPECT_GT(seconds, 0.0);
    EXPECT_LE(seconds, wall); // measured on the progress thread, inside the caller's interval
    EXPECT_EQ(work->seconds(), seconds);
    auto empty = comm->allreduce_async(torch::empty({0}), dist::ReduceOp::Sum);
    EXPECT_EQ(empty->seconds(), 0.0); // no-op
}

// Work::exposed_seconds on the MPI backend: the host time the waiter spent in its first wait().
// A late peer makes rank 0's wait long; a collective that completed before the wait exposes
// nothing.
TEST_P(MpiCommunicator, WorkReportsTheExposedWait) {
    const int r = world_rank();
    if (world_size() < 2) GTEST_SKIP() << "a late peer needs 2 ranks";
    auto comm = make();
    auto t = torch::ones({1024}, torch::kFloat32);
    if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto late = comm->allreduce_async(t, dist::ReduceOp::Sum);
    EXPECT_EQ(late->exposed_seconds(), 0.0); // not waited for yet
    const auto t0 = std::chrono::steady_clock::now();
    late->wait();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LE(late->exposed_seconds(), wall);
    if (r == 0) EXPECT_GT(late->exposed_seconds(), 0.15); // waited for the late peers
    late->wait();                                         // a second wait exposes nothing more
    EXPECT_LE(late->exposed_seconds(), wall);

    auto early = comm->allreduce_async(t, dist::ReduceOp::Sum);
    while (!early->completed())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    early->wait();
    EXPECT_LT(early->exposed_seconds(), 0.05); // finished before the wait: nothing exposed
    EXPECT_GE(early->exposed_seconds(), 0.0);
}

// The blocking reduce-scatter with a handle (ZeRO's): its seconds are the call's host time on the
// MPI backend, known at once, all of it exposed; the result is the blocking call's.
TEST_P(MpiCommunicator, TimedReduceScatterReportsTheCallsDuration) {
    const int r = world_rank(), w = world_size();
    auto comm = make();
    auto in = torch::full({4 * w}, float(r + 1));
    auto out = torch::zeros({4});
    const auto t0 = std::chrono::steady_clock::now();
    auto work = comm->reduce_scatter_timed(in, out, dist::ReduceOp::Sum);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(work->completed());
    EXPECT_TRUE(torch::equal(out, torch::full({4}, float(w * (w + 1) / 2))));
    EXPECT_GT(work->seconds(), 0.0);
    EXPECT_LE(work->seconds(), wall);
    EXPECT_EQ(work->exposed_seconds(), work->seconds());
    EXPECT_EQ(comm->stats()["reduce_scatter"].calls, 1u);
    // time_batch on MPI: a host clock around the batch.
    const auto t1 = std::chrono::steady_clock::now();
    const double batch = comm->time_batch([&] {
        for (int i = 0; i < 5; ++i)
            comm->allreduce(torch::ones({16}), dist::ReduceOp::Sum);
    });
    EXPECT_GT(batch, 0.0);
    EXPECT_LE(batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
}

TEST(ExposedWait, IsTheWaitersStallClampedAtZero) {
    EXPECT_EQ(dist::exposed_wait_seconds(0.25), 0.25); // the collective ended 0.25 s after
    EXPECT_EQ(dist::exposed_wait_seconds(0.0), 0.0);
    EXPECT_EQ(dist::exposed_wait_seconds(-0.1), 0.0); // it had ended before the wait
}

// The NCCL backend's event pools (their bookkeeping, with integers for events): events are
// created only up to the number in flight at once, reused afterwards, destroyed with the pool,
// and after an abort never handed out or destroyed again.
TEST(EventPool, CreatesOnlyWhatIsInFlightAndReusesIt) {
    int next = 0;
    std::vector<int> destroyed;
    {
        dist::EventPool<int> pool([&] { return next++; }, [&](int e) { destroyed.push_back(e); });
        for (int op = 0; op < 1000; ++op) { // an operation: ready, start, done
            const int a = pool.acquire(), b = pool.acquire(), c = pool.acquire();
            EXPECT_NE(a, b);
            EXPECT_NE(b, c);
            pool.release(a);
            pool.release(b);
            pool.release(c);
        }
        EXPECT_EQ(pool.created(), 3u);
        EXPECT_EQ(pool.idle(), 3u);
        std::vector<int> held;
        for (int i = 0; i < 5; ++i) // five in flight at once (e.g. retained handles)
            held.push_back(pool.acquire());
        EXPECT_EQ(pool.created(), 5u);
        EXPECT_EQ(pool.idle(), 0u);
        for (int e : held)
            pool.release(e);
        EXPECT_TRUE(destroyed.empty());
    }
    EXPECT_EQ(destroyed.size(), 5u); // the pool's end destroys what it caches

    destroyed.clear();
    {
        dist::EventPool<int> pool([&] { return next++; }, [&](int e) { destroyed.push_back(e); });
        const int a = pool.acquire(), b = pool.acquire();
        pool.release(a);
        pool.abandon(); // the communicator was aborted
        EXPECT_TRUE(pool.abandoned());
        EXPECT_EQ(pool.idle(), 0u);
        pool.release(b); // dropped, not cached
        EXPECT_EQ(pool.idle(), 0u);
    }
    EXPECT_TRUE(destroyed.empty()); // nothing of an aborted communicator is destroyed
}

TEST_P(MpiCommunicator, AccountsCallsAndBytesPerKind) {
    auto comm = make();
    const int w = world_size();
    for (int i = 0; i < 3; ++i)
        comm->allreduce(torch::ones({7}, torch::kFloat64), dist::ReduceOp::Sum);
    comm->broadcast(torch::ones({5}, torch::kFloat32), 0);
    comm->allgather(torch::ones({2}, torch::kInt64), torch::zeros({2 * w}, torch::kInt64));
    comm->reduce_scatter(torch::ones({4 * w}, torch::kFloat32), torch::zeros({4}, torch::kFloat32),
                         dist::ReduceOp::Sum);
    auto s = comm->stats();
    ASSERT_EQ(s.size(), 4u);
    EXPECT_EQ(s["allreduce"].calls, 3u);
    EXPECT_EQ(s["allreduce"].bytes, 3u * 7 * 8);
    EXPECT_EQ(s["broadcast"].bytes, 20u);
    EXPECT_EQ(s["allgather"].bytes, 16u);
    EXPECT_EQ(s["reduce_scatter"].bytes, 16u);
    EXPECT_GE(s["allreduce"].seconds, 0.0);
}

// Point-to-point: each rank's payload encodes (sender, receiver), so a message delivered to the
// wrong rank or out of order shows. Blocking sends are ordered by rank parity (even ranks send
// first), the deadlock-free schedule the pipeline engine relies on for its neighbour exchanges.
TEST_P(MpiCommunicator, SendRecvPairsAndRing) {
    const int r = world_rank(), w = world_size();
    if (w < 2) GTEST_SKIP() << "point-to-point needs at least 2 ranks";
    auto comm = make();
    auto payload = [](int from, int to, std::int64_t n, torch::Dtype dtype) {
        return (iota(n, torch::kInt64) + 1000 * from + 100 * to).to(dtype);
    };
    std::uint64_t sent_bytes = 0, recv_bytes = 0, calls = 0;

    // Pairs (0,1), (2,3): the even rank sends, then receives the odd rank's answer.
    const int partner = r ^ 1;
    if (partner < w) {
        for (auto dtype : kDtypes) {
            SCOPED_TRACE(c10::toString(dtype));
            auto out = payload(r, partner, 1000, dtype);
            auto in = torch::full({10, 100}, -1, torch::TensorOptions().dtype(dtype));
            if (r % 2 == 0) {
                comm->send(out, partner);
                comm->recv(in, partner);
            } else {
                comm->recv(in, partner);
                comm->send(out, partner);
            }
            EXPECT_TRUE(torch::equal(in.flatten(), payload(partner, r, 1000, dtype)));
            sent_bytes += out.nbytes();
            recv_bytes += in.nbytes();
            ++calls;
        }
    }

    // Ring: every rank sends to its successor and receives from its predecessor, in float64.
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    auto out = payload(r, next, 37, torch::kFloat64) / 8; // fractions survive bytewise transfer
    auto in = torch::zeros({37}, torch::kFloat64);
    if (r % 2 == 0) {
        comm->send(out, next);
        comm->recv(in, prev);
    } else {
        comm->recv(in, prev);
        comm->send(out, next);
    }
    EXPECT_TRUE(torch::equal(in, payload(prev, r, 37, torch::kFloat64) / 8));
    sent_bytes += out.nbytes();
    recv_bytes += in.nbytes();
    ++calls;

    // Empty tensors are no-ops on both sides (no message, nothing accounted).
    comm->send(torch::zeros({0}), next);
    comm->recv(torch::zeros({0}), prev);

    auto s = comm->stats();
    EXPECT_EQ(s["send"].calls, calls);
    EXPECT_EQ(s["send"].bytes, sent_bytes);
    EXPECT_EQ(s["recv"].calls, calls);
    EXPECT_EQ(s["recv"].bytes, recv_bytes);
    EXPECT_EQ(s.count("allreduce"), 0u);

    EXPECT_THROW(comm->send(torch::ones({3}), r), core::InternalError); // never matched
    EXPECT_THROW(comm->recv(torch::ones({3}), w), core::InternalError);
    EXPECT_THROW(comm->send(torch::ones({4, 4}).t(), next), core::InternalError); // strided
}

// exchange(): sends and receives posted together. Every rank sends 4 MiB to its successor and
// receives from its predecessor in one batch, with no parity ordering (blocking sends in that
// order could wait for each other forever); then pairs swap in both directions at once.
TEST_P(MpiCommunicator, ExchangePostsSendsAndReceivesTogether) {
    const int r = world_rank(), w = world_size();
    if (w < 2) GTEST_SKIP() << "point-to-point needs at least 2 ranks";
    auto comm = make();
    using Op = dist::P2POp;
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    const std::int64_t n = 1 << 20; // 4 MiB of float32: past any eager limit
    auto out = torch::full({n}, float(r)), in = torch::full({n}, -1.0f);
    comm->exchange({Op{Op::Kind::Send, out, next}, Op{Op::Kind::Recv, in, prev}});
    EXPECT_TRUE(torch::equal(in, torch::full({n}, float(prev))));

    const int partner = r ^ 1;
    std::uint64_t calls = 1;
    if (partner < w) {
        auto mine = torch::full({3, 5}, double(10 * r + partner), torch::kFloat64);
        auto theirs = torch::zeros({3, 5}, torch::kFloat64);
        comm->exchange({Op{Op::Kind::Recv, theirs, partner}, Op{Op::Kind::Send, mine, partner},
                        Op{Op::Kind::Send, torch::zeros({0}), partner}}); // empty: skipped
        EXPECT_TRUE(
            torch::equal(theirs, torch::full({3, 5}, double(10 * partner + r), torch::kFloat64)));
        ++calls;
    }
    comm->exchange({}); // nothing to do
    auto s = comm->stats();
    EXPECT_EQ(s["send"].calls, calls);
    EXPECT_EQ(s["recv"].calls, calls);
    EXPECT_GE(s["send"].seconds, 0.0);
    EXPECT_THROW(comm->exchange({Op{Op::Kind::Send, torch::ones({2}), r}}), core::InternalError);
}

// 16-bit floats (dist.compress=fp16/bf16): sums through MPI user operations, each step rounded
// to 16 bits as a 16-bit addition on the CPU; the payload stays 2 bytes per element.
TEST_P(MpiCommunicator, SumsFloat16AndBfloat16In16Bits) {
    auto comm = make();
    const int r = world_rank(), w = world_size();
    for (auto dtype : {torch::kFloat16, torch::kBFloat16}) {
        SCOPED_TRACE(c10::toString(dtype));
        // Values whose every partial sum is exact in 16 bits, so any combination order agrees.
        torch::Tensor t = torch::arange(5, torch::kFloat32).add(r).to(dtype);
        comm->allreduce(t, dist::ReduceOp::Sum);
        torch::Tensor want = torch::arange(5, torch::kFloat32).mul(w).add(w * (w - 1) / 2);
        EXPECT_TRUE(torch::equal(t.to(torch::kFloat32), want)) << t;
        torch::Tensor a = torch::full({4}, 1.0 + r, torch::TensorOptions().dtype(dtype));
        comm->allreduce_async(a, dist::ReduceOp::Average)->wait();
        EXPECT_TRUE(torch::allclose(a.to(torch::kFloat32),
                                    torch::full({4}, (1.0 + w) / 2.0, torch::kFloat32)))
            << a;
        // Rounding: 1 + 2^-11 is not a float16, so (on 2 ranks) 1 + 2^-11 rounds to even: 1.
        if (dtype == torch::kFloat16 && w == 2) {
            torch::Tensor h = torch::full({1}, r == 0 ? 1.0 : std::ldexp(1.0, -11), dtype);
            comm->allreduce(h, dist::ReduceOp::Sum);
            EXPECT_EQ(h.item<float>(), 1.0f);
        }
        torch::Tensor in = torch::ones({3 * w}, dtype), out = torch::empty({3}, dtype);
        comm->reduce_scatter(in, out, dist::ReduceOp::Sum);
        EXPECT_TRUE(torch::equal(out.to(torch::kFloat32), torch::full({3}, 1.0f * w)));
        comm->reduce_scatter_async(in, out, dist::ReduceOp::Sum)->wait();
        EXPECT_TRUE(torch::equal(out.to(torch::kFloat32), torch::full({3}, 1.0f * w)));
    }
}

TEST_P(MpiCommunicator, RejectsWhatItCannotReduce) {
    auto comm = make();
    EXPECT_THROW(comm->allreduce(torch::ones({3}, torch::kInt64), dist::ReduceOp::Average),
                 core::InternalError);
    try {
        comm->allreduce(torch::ones({3}, torch::kFloat16), dist::ReduceOp::Max);
        ADD_FAILURE() << "float16 maximum on the MPI backend should throw";
    } catch (const core::DistributedError& e) {
        EXPECT_NE(std::string(e.what()).find("Half"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm->allreduce(torch::ones({3}, torch::kComplexFloat), dist::ReduceOp::Sum),
                 core::DistributedError);
    EXPECT_THROW(comm->allreduce(torch::ones({4, 4}).t(), dist::ReduceOp::Sum),
                 core::InternalError); // not contiguous
    // Bytewise collectives accept any dtype.
    auto h = torch::full({3}, world_rank(), torch::kFloat16);
    comm->broadcast(h, 0);
    EXPECT_TRUE(torch::equal(h, torch::zeros({3}, torch::kFloat16)));
}

TEST(MakeCommunicator, RejectsImpossibleBackends) {
    try {
        dist::make_communicator("nccl", MPI_COMM_WORLD, torch::Device(torch::kCPU));
        ADD_FAILURE() << "nccl on a CPU device should throw";
    } catch (const core::ConfigError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(TRAINSCOPE_HAVE_NCCL ? "needs a CUDA device" : "built without NCCL"),
                  std::string::npos)
            << m;
    }
    EXPECT_THROW(dist::make_communicator("gloo", MPI_COMM_WORLD, torch::Device(torch::kCPU)),
                 core::ConfigError);
}

// ---- dist.timeout: a peer that stops without dying ----------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// A receive nobody sends (one rank suffices): wait_for_peers gives up after the timeout with a
// PeerTimeoutError naming the wait and dist.timeout; without a limit it completes once the
// message is there.
TEST(PeerTimeout, WaitForPeersGivesUpAfterTheTimeout) {
    const int r = world_rank();
    int token = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Irecv(&token, 1, MPI_INT, r, /*tag=*/4242, MPI_COMM_WORLD, &request);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        core::wait_for_peers(request, 0.3, "a test receive");
        ADD_FAILURE() << "nobody sent: the wait must time out";
    } catch (const core::PeerTimeoutError& e) {
        const double waited = seconds_since(t0);
        EXPECT_GE(waited, 0.3);
        EXPECT_LT(waited, 1.5);
        EXPECT_TRUE(contains(e.what(), "a test receive did not complete within dist.timeout=0.3 s"))
            << e.what();
        EXPECT_TRUE(contains(e.what(), "Raise dist.timeout")) << e.what();
        EXPECT_EQ(e.kind(), core::ErrorKind::Distributed);
    }
    MPI_Cancel(&request); // point-to-point can be cancelled (a collective cannot)
    MPI_Wait(&request, MPI_STATUS_IGNORE);

    MPI_Request send = MPI_REQUEST_NULL;
    const int seven = 7;
    MPI_Irecv(&token, 1, MPI_INT, r, /*tag=*/4243, MPI_COMM_WORLD, &request);
    MPI_Isend(&seven, 1, MPI_INT, r, /*tag=*/4243, MPI_COMM_WORLD, &send);
    core::wait_for_peers(request, 0, "a test receive");
    core::wait_for_peers(send, 0, "a test send");
    EXPECT_EQ(token, 7);
}

// Rank 0 waits for a gradient-style allreduce that the other ranks join 2 s late, with a 0.5 s
// timeout: its wait ends with a PeerTimeoutError naming the operation, and the communicator then
// refuses every call at once (its progress thread is still inside the pending collective). The
// late ranks' allreduce still completes: rank 0's progress thread was waiting inside it.
TEST(PeerTimeout, ALatePeerEndsTheWaitAndBreaksTheCommunicator) {
    const int r = world_rank(), w = world_size();
    if (w < 2) GTEST_SKIP() << "needs a peer";
    auto comm = dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU),
                                        /*timeout_s=*/0.5);
    auto t = torch::ones({1000}, torch::kFloat32);
    if (r == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        auto work = comm->allreduce_async(t, dist::ReduceOp::Sum);
        try {
            work->wait();
            ADD_FAILURE() << "the peers are 2 s late: the wait must time out";
        } catch (const core::PeerTimeoutError& e) {
            const double waited = seconds_since(t0);
            EXPECT_GE(waited, 0.5);
            EXPECT_LT(waited, 1.9);
            EXPECT_TRUE(contains(e.what(), "an asynchronous MPI allreduce (gradient buckets) did "
                                           "not complete within dist.timeout=0.5 s"))
                << e.what();
        }
        const auto t1 = std::chrono::steady_clock::now();
        std::vector<double> v = {1.0};
        EXPECT_THROW(comm->allreduce_host(v, dist::ReduceOp::Sum), core::PeerTimeoutError);
        EXPECT_THROW(comm->barrier(), core::PeerTimeoutError);
        EXPECT_THROW(comm->send(torch::ones({1}), 1), core::PeerTimeoutError);
        try {
            comm->allreduce_async(torch::ones({2}), dist::ReduceOp::Sum)->wait();
            ADD_FAILURE() << "a broken communicator must refuse";
        } catch (const core::PeerTimeoutError& e) {
            EXPECT_TRUE(contains(e.what(), "cannot be used any more")) << e.what();
        }
        EXPECT_LT(seconds_since(t1), 0.3); // refused at once, nothing waited for
        // The late ranks complete the first allreduce; then rank 0's progress thread has left MPI
        // and the world can meet again.
        const auto t2 = std::chrono::steady_clock::now();
        while (!work->completed() && seconds_since(t2) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_TRUE(work->completed());
    } else {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        comm->allreduce_async(t, dist::ReduceOp::Sum)->wait();
        EXPECT_TRUE(torch::equal(t, torch::full({1000}, float(w))));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// agree_on_errors with a timeout gives up on a late peer too; and a PeerTimeoutError thrown
// inside it passes through at once (no agreement with peers that cannot be reached).
TEST(PeerTimeout, AgreeOnErrorsGivesUpOnALatePeer) {
    const int r = world_rank(), w = world_size();
    try {
        dist::agree_on_errors(
            MPI_COMM_WORLD, [] { throw core::PeerTimeoutError("gone"); }, 0.5);
        ADD_FAILURE() << "must rethrow";
    } catch (const core::PeerTimeoutError& e) {
        EXPECT_STREQ(e.what(), "gone");
        EXPECT_FALSE(e.collective());
    }
    if (w < 2) return;
    if (r == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_THROW(dist::agree_on_errors(
                         MPI_COMM_WORLD, [] {}, 0.5),
                     core::PeerTimeoutError);
        EXPECT_LT(seconds_since(t0), 1.9);
    } else {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        dist::agree_on_errors(
            MPI_COMM_WORLD, [] {}, 0.5); // completes: rank 0 progresses below
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// ---- collective error agreement ---------------------------------------------------------------

TEST(AgreeOnErrors, ReturnsWhenNobodyThrows) {
    int calls = 0;
    dist::agree_on_errors(MPI_COMM_WORLD, [&] { ++calls; });
    EXPECT_EQ(calls, 1);
}

TEST(AgreeOnErrors, OneFailingRankMakesEveryRankThrowTheSameKind) {
    const int r = world_rank(), w = world_size(), bad = w - 1;
    try {
        dist::agree_on_errors(MPI_COMM_WORLD, [&] {
            if (r == bad) throw core::ConfigError("data.path '/nope' does not exist\nsecond line");
        });
        ADD_FAILURE() << "every rank must throw";
    } catch (const core::ConfigError& e) {
        EXPECT_TRUE(e.collective());
        if (r == bad)
            EXPECT_STREQ(e.what(), "data.path '/nope' does not exist\nsecond line");
        else
            EXPECT_EQ(std::string(e.what()),
                      "rank " + std::to_string(bad) + " failed: data.path '/nope' does not exist");
    }
}

TEST(AgreeOnErrors, SeveralFailingRanksAndForeignExceptions) {
    const int r = world_rank(), w = world_size();
    try {
        dist::agree_on_errors(MPI_COMM_WORLD, [&] {
            if (r == 0) throw std::runtime_error("bad thing on 0");
            if (r == w - 1) throw core::InputError("bad thing on last");
        });
        ADD_FAILURE() << "every rank must throw";
    } catch (const core::InternalError& e) {
        // Rank 0 (the lowest failing one) threw a std::runtime_error: it becomes InternalError
        // on every rank that did not fail itself, and on rank 0.
        EXPECT_TRUE(e.collective());
        if (w > 1) EXPECT_NE(r, w - 1);
        const std::string m = e.what();
        if (r == 0) {
            EXPECT_EQ(m, "bad thing on 0");
        } else {
            EXPECT_EQ(m, "ranks 0, " + std::to_string(w - 1) + " failed; rank 0: bad thing on 0");
        }
    } catch (const core::InputError& e) {
        EXPECT_EQ(r, w - 1);
        EXPECT_NE(r, 0);
        EXPECT_TRUE(e.collective());
        EXPECT_STREQ(e.what(), "bad thing on last");
    }
}

TEST(MpiRuntime, LeavesAnMpiItDidNotStartAlone) {
    int argc = 1;
    char name[] = "dist_mpi_tests";
    char* args[] = {name, nullptr};
    char** argv = args;
    {
        dist::MpiRuntime runtime(argc, argv); // the test main already initialised MPI
        EXPECT_EQ(runtime.thread_level(), dist::kMpiThreadLevel);
        EXPECT_EQ(dist::thread_level_name(runtime.thread_level()), "MPI_THREAD_SERIALIZED");
    }
    int finalized = 1;
    MPI_Finalized(&finalized);
    EXPECT_EQ(finalized, 0);
    MPI_Barrier(MPI_COMM_WORLD); // still usable
}

// ---- options, topology, device binding
// ------------------------------------------------------------

TEST(DistOptions, ResolvesAutoAndRejectsImpossibleCombinations) {
    core::OptionRegistry reg;
    dist::declare_options(reg);
    auto cfg = [&](std::map<std::string, std::string> v) {
        return core::Config::from_values(reg, v);
    };

    auto o = dist::resolve_options(cfg({}), /*visible_cuda_devices=*/0);
    EXPECT_EQ(o.device, "cpu");
    EXPECT_EQ(o.backend, "mpi");
    EXPECT_EQ(o.bucket_cap_bytes, 25u * 1024 * 1024);
    EXPECT_EQ(o.first_bucket_cap_bytes, 1u << 20); // DDP's dist._DEFAULT_FIRST_BUCKET_BYTES

    o = dist::resolve_options(cfg({}), 4);
    EXPECT_EQ(o.device, TRAINSCOPE_HAVE_CUDA ? "cuda" : "cpu");
    if (TRAINSCOPE_HAVE_CUDA && TRAINSCOPE_HAVE_NCCL) EXPECT_EQ(o.backend, "nccl");

    o = dist::resolve_options(cfg({{"run.device", "cuda"},
                                   {"dist.backend", "mpi"},
                                   {"dist.bucket_mb", "0.5"},
                                   {"dist.first_bucket_mb", "0.25"}}),
                              0);
    EXPECT_EQ(o.backend, "mpi");
    EXPECT_EQ(o.bucket_cap_bytes, 512u * 1024);
    EXPECT_EQ(o.first_bucket_cap_bytes, 256u * 1024);

    try {
        dist::resolve_options(cfg({{"run.device", "cpu"}, {"dist.backend", "nccl"}}), 0);
        ADD_FAILURE() << "nccl with a cpu device must be rejected";
    } catch (const core::ConfigError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("dist.backend=nccl"), std::string::npos) << m;
        if (TRAINSCOPE_HAVE_NCCL) EXPECT_NE(m.find("run.device=cpu"), std::string::npos) << m;
    }
    EXPECT_THROW(dist::resolve_options(cfg({{"dist.bucket_mb", "0"}}), 0), core::ConfigError);
    EXPECT_THROW(cfg({{"dist.bucket_mb", "-1"}}), core::ConfigError);
    try {
        dist::resolve_options(cfg({{"dist.first_bucket_mb", "0"}}), 0);
        ADD_FAILURE() << "dist.first_bucket_mb=0 must be rejected";
    } catch (const core::ConfigError& e) { // names the option, the value and what is allowed
        const std::string m = e.what();
        EXPECT_NE(m.find("dist.first_bucket_mb = '0'"), std::string::npos) << m;
        EXPECT_NE(m.find("> 0"), std::string::npos) << m;
    }
    EXPECT_THROW(cfg({{"dist.first_bucket_mb", "-1"}}), core::ConfigError);
    EXPECT_THROW(cfg({{"dist.backend", "gloo"}}), core::ConfigError);
}

// dist.allreduce (issue 40): flat by default; auto (each communicator decides for its ranks) and
// hierarchical as asked; hierarchical with NCCL is refused naming both options (NCCL is
// node-aware already), by the option resolution and by the communicator factory alike.
TEST(DistOptions, AllreduceAlgorithmAndItsRefusalWithNccl) {
    core::OptionRegistry reg;
    dist::declare_options(reg);
    auto cfg = [&](std::map<std::string, std::string> v) {
        return core::Config::from_values(reg, v);
    };
    using A = dist::AllreduceAlgorithm;
    EXPECT_EQ(dist::resolve_options(cfg({}), 0).allreduce, A::Flat); // the default
    EXPECT_EQ(dist::resolve_options(cfg({{"dist.allreduce", "auto"}}), 0).allreduce, A::Auto);
    EXPECT_EQ(dist::resolve_options(cfg({{"dist.allreduce", "flat"}}), 0).allreduce, A::Flat);
    EXPECT_EQ(dist::resolve_options(cfg({{"dist.allreduce", "hierarchical"}}), 0).allreduce,
              A::Hierarchical);
    try {
        cfg({{"dist.allreduce", "ring"}});
        ADD_FAILURE() << "dist.allreduce=ring must be rejected";
    } catch (const core::ConfigError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("dist.allreduce"), std::string::npos) << m;
        EXPECT_NE(m.find("hierarchical"), std::string::npos) << m; // what is allowed
    }
    EXPECT_THROW(dist::parse_allreduce_algorithm("ring"), core::ConfigError);
    EXPECT_STREQ(dist::to_string(dist::parse_allreduce_algorithm("hierarchical")), "hierarchical");
    auto expect_nccl_refusal = [](const std::string& m) {
        EXPECT_NE(m.find("dist.allreduce=hierarchical"), std::string::npos) << m;
        EXPECT_NE(m.find("dist.backend"), std::string::npos) << m;
        EXPECT_NE(m.find("node-aware"), std::string::npos) << m;
    };
    if (TRAINSCOPE_HAVE_NCCL) { // else dist.backend=nccl is refused first (built without it)
        for (const char* backend : {"nccl", "auto"}) {
            try {
                dist::resolve_options(cfg({{"run.device", "cuda"},
                                           {"dist.backend", backend},
                                           {"dist.allreduce", "hierarchical"}}),
                                      1);
                ADD_FAILURE() << "hierarchical with nccl must be rejected";
            } catch (const core::ConfigError& e) {
                expect_nccl_refusal(e.what());
            }
        }
        EXPECT_EQ(
            dist::resolve_options(cfg({{"run.device", "cuda"}, {"dist.allreduce", "auto"}}), 1)
                .allreduce,
            A::Auto);
    }
    try {
        dist::make_communicator("nccl", MPI_COMM_WORLD, torch::Device(torch::kCPU), 0,
                                {A::Hierarchical});
        ADD_FAILURE() << "make_communicator: hierarchical with nccl must be rejected";
    } catch (const core::ConfigError& e) {
        expect_nccl_refusal(e.what());
    }
}

// Issue 25: auto must not fall back to the CPU on a node the scheduler gave GPUs to.
TEST(DistOptions, CompressionOptionsAreReadAndImpossibleOnesRefused) {
    core::OptionRegistry reg;
    dist::declare_options(reg);
    auto cfg = [&](std::map<std::string, std::string> v) {
        return core::Config::from_values(reg, v);
    };
    // Defaults: nothing compressed; PowerSGD's as PyTorch's PowerSGDState (rank 2, warm start,
    // min_compression_rate 2) with 2 plain iterations first.
    dist::CompressionOptions o = dist::resolve_options(cfg({}), 0).compression;
    EXPECT_EQ(o.kind, dist::CompressionKind::None);
    EXPECT_FALSE(o.active());
    EXPECT_EQ(o.powersgd_rank, 2);
    EXPECT_TRUE(o.warm_start);
    EXPECT_EQ(o.start_iter, 2);
    EXPECT_EQ(o.min_compression_rate, 2.0);
    EXPECT_EQ(dist::resolve_options(cfg({{"dist.compress", "fp16"}}), 0).compression.kind,
              dist::CompressionKind::Fp16);
    EXPECT_EQ(dist::resolve_options(cfg({{"dist.compress", "bf16"}, {"dist.zero", "3"}}), 0)
                  .compression.kind,
              dist::CompressionKind::Bf16); // the reduce dtype of FSDP's reduce-scatters
    o = dist::resolve_options(cfg({{"dist.compress", "powersgd"},
                                   {"dist.powersgd_rank", "4"},
                                   {"dist.powersgd_warm_start", "false"},
                                   {"dist.powersgd_start_iter", "0"},
                                   {"dist.powersgd_min_compression_rate", "1.5"}}),
                              0)
            .compression;
    EXPECT_EQ(o.kind, dist::CompressionKind::PowerSgd);
    EXPECT_EQ(o.powersgd_rank, 4);
    EXPECT_FALSE(o.warm_start);
    EXPECT_EQ(o.start_iter, 0);
    EXPECT_EQ(o.min_compression_rate, 1.5);

    // Each refusal names the option, the value and the fix.
    auto refused = [&](std::map<std::string, std::string> v, std::vector<std::string> needles) {
        try {
            dist::resolve_options(cfg(v), 0);
            ADD_FAILURE() << "accepted: " << needles.front();
        } catch (const core::ConfigError& e) {
            const std::string m = e.what();
            for (const auto& n : needles)
                EXPECT_NE(m.find(n), std::string::npos) << m;
        }
    };
    refused({{"dist.compress", "powersgd"}, {"dist.zero", "1"}},
            {"dist.compress=powersgd", "dist.zero=1", "use dist.zero=0"});
    refused({{"dist.compress", "powersgd"}, {"dist.zero", "3"}}, {"dist.zero=3", "fp16/bf16"});
    refused({{"dist.powersgd_rank", "4"}},
            {"dist.powersgd_rank = '4'", "dist.compress=none", "set dist.compress=powersgd"});
    refused({{"dist.compress", "fp16"}, {"dist.powersgd_warm_start", "false"}},
            {"dist.powersgd_warm_start = 'false'", "dist.compress=fp16"});
    // Out of range or unknown: the registry's own messages (option, value, what is allowed).
    for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
             {"dist.powersgd_rank", "0"},
             {"dist.powersgd_rank", "-2"},
             {"dist.powersgd_start_iter", "-1"},
             {"dist.powersgd_min_compression_rate", "-1"},
             {"dist.compress", "int8"}}) {
        try {
            cfg({{key, value}});
            ADD_FAILURE() << key << "=" << value << " accepted";
        } catch (const core::ConfigError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find(key + " = '" + value + "'"), std::string::npos) << m;
        }
    }
}

TEST(DistOptions, AutoRefusesTheCpuWhereGpusWereGranted) {
    core::OptionRegistry reg;
    dist::declare_options(reg);
    const core::Config auto_cfg = core::Config::from_values(reg, {});
    const std::string why = "cudaGetDeviceCount: cudaErrorInsufficientDriver, CUDA driver version "
                            "is insufficient for CUDA runtime version";
    for (const auto& [key, value] :
         std::vector<std::pair<std::string, std::string>>{{"SLURM_GPUS_ON_NODE", "4"},
                                                          {"SLURM_JOB_GPUS", "0,1"},
                                                          {"SLURM_GPUS_PER_TASK", "1"},
                                                          {"CUDA_VISIBLE_DEVICES", "GPU-5e0c"}}) {
        try {
            dist::resolve_options(auto_cfg, 0, why, {{key, value}});
            ADD_FAILURE() << key << " granted GPUs: auto must refuse the CPU";
        } catch (const core::ConfigError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("run.device=auto"), std::string::npos) << m;
            EXPECT_NE(m.find(key + "=" + value), std::string::npos) << m; // what granted them
            EXPECT_NE(m.find("cudaErrorInsufficientDriver"), std::string::npos) << m; // why
            EXPECT_NE(m.find("run.device=cpu"), std::string::npos) << m;              // the fix
        }
    }
    // No GPU granted, GPUs hidden on purpose, or a CPU run asked for: the CPU, with the reason.
    for (const auto& env :
         std::vector<std::map<std::string, std::string>>{{},
                                                         {{"CUDA_VISIBLE_DEVICES", ""}},
                                                         {{"CUDA_VISIBLE_DEVICES", "-1"}},
                                                         {{"SLURM_GPUS_ON_NODE", "0"}},
                                                         {{"SLURM_NTASKS", "2"}}}) {
        const dist::DistOptions o = dist::resolve_options(auto_cfg, 0, why, env);
        EXPECT_EQ(o.device, "cpu");
        EXPECT_NE(o.auto_reason.find("cudaErrorInsufficientDriver"), std::string::npos);
    }
    const core::Config cpu_cfg = core::Config::from_values(reg, {{"run.device", "cpu"}});
    EXPECT_EQ(dist::resolve_options(cpu_cfg, 0, why, {{"SLURM_GPUS_ON_NODE", "4"}}).device, "cpu");
    EXPECT_EQ(dist::granted_gpus({{"SLURM_STEP_GPUS", "2"}}), "SLURM_STEP_GPUS=2");
    EXPECT_EQ(dist::granted_gpus({{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}}), "");
}

TEST(Topology, DescribesRanksNodesAndHosts) {
    auto t = dist::discover_topology(MPI_COMM_WORLD);
    EXPECT_EQ(t.rank, world_rank());
    EXPECT_EQ(t.world_size, world_size());
    // Issue 39: the host names are gathered to rank 0 only (it alone prints them).
    ASSERT_EQ(t.hostnames.size(), t.rank == 0 ? static_cast<std::size_t>(t.world_size) : 0u);
    const auto hostnames = core::allgather_strings(MPI_COMM_WORLD, t.hostname);
    if (t.rank == 0) EXPECT_EQ(t.hostnames, hostnames);
    EXPECT_EQ(hostnames[t.rank], t.hostname);
    EXPECT_FALSE(t.hostname.empty());
    std::set<std::string> hosts(hostnames.begin(), hostnames.end());
    EXPECT_EQ(t.num_nodes, static_cast<int>(hosts.size()));
    EXPECT_GE(t.node, 0);
    EXPECT_LT(t.node, t.num_nodes);
    EXPECT_GE(t.local_rank, 0);
    EXPECT_LT(t.local_rank, t.local_size);
    // Local size = ranks on this host; node leaders count the nodes.
    EXPECT_EQ(t.local_size,
              static_cast<int>(std::count(hostnames.begin(), hostnames.end(), t.hostname)));
    int leaders = t.local_rank == 0 ? 1 : 0, total = 0;
    MPI_Allreduce(&leaders, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total, t.num_nodes);
    EXPECT_NE(dist::mpi_library_version().find("MPI"), std::string::npos);
}

// Issue 39: one rank per node reads a file, the node's other ranks get its bytes or its verdict.
TEST(NodeComm, GroupsTheTopologysNodeAndSharesOneRead) {
    auto t = dist::discover_topology(MPI_COMM_WORLD);
    core::NodeComm node(MPI_COMM_WORLD);
    EXPECT_EQ(node.size(), t.local_size);
    EXPECT_EQ(node.rank(), t.local_rank);
    const auto hosts = core::gather_strings(node.get(), t.hostname);
    if (node.rank() == 0) EXPECT_EQ(hosts, std::vector<std::string>(node.size(), t.hostname));
    if (node.rank() != 0) EXPECT_TRUE(hosts.empty());

    // Each node's last local rank reads: the bytes (binary, with NULs) arrive everywhere intact.
    const std::string path = ::testing::TempDir() + "node_read_" + std::to_string(t.node) + "_" +
                             std::to_string(::getppid());
    std::string content("\0header\0", 8);
    for (int i = 0; i < 3000; ++i)
        content += static_cast<char>(i * 7);
    const int reader = node.size() - 1;
    if (node.rank() == reader) {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        std::fwrite(content.data(), 1, content.size(), f);
        std::fclose(f);
    }
    MPI_Barrier(node.get());
    const core::SharedFile got = core::read_file_on_node(node.get(), path, reader);
    EXPECT_EQ(got.error, "");
    EXPECT_EQ(got.bytes, content);
    MPI_Barrier(node.get());
    if (node.rank() == reader) std::remove(path.c_str());
    MPI_Barrier(node.get());
    // A missing file: the reader's error on every rank, no bytes, nobody left waiting.
    const core::SharedFile missing = core::read_file_on_node(node.get(), path, reader);
    EXPECT_NE(missing.error.find("No such file"), std::string::npos) << missing.error;
    EXPECT_TRUE(missing.bytes.empty());
}

// Issue 25: distinct GPUs are counted by PCI bus id across a node's ranks (faked device lists).
TEST(DeviceBinding, AssignsByPciBusIdAcrossTheNodesRanks) {
    const std::vector<std::string> four = {"0000:1b:00.0", "0000:41:00.0", "0000:9a:00.0",
                                           "0000:c1:00.0"};
    // srun --gpus-per-task=1 / --gpu-bind: each of 4 ranks sees its own single GPU.
    std::vector<dist::RankGpus> per_task;
    for (int r = 0; r < 4; ++r)
        per_task.push_back({"n1", r, {four[static_cast<std::size_t>(r)]}});
    dist::GpuAssignment a = dist::assign_gpus(per_task, /*nccl_backend=*/true);
    EXPECT_EQ(a.error, "");
    EXPECT_EQ(a.index, (std::vector<int>{0, 0, 0, 0}));
    // A plain launch: every rank sees all 4 and takes local_rank % 4; two nodes are independent.
    std::vector<dist::RankGpus> plain;
    for (int r = 0; r < 8; ++r)
        plain.push_back({r < 4 ? "n1" : "n2", r % 4, four});
    a = dist::assign_gpus(plain, true);
    EXPECT_EQ(a.error, "");
    EXPECT_EQ(a.index, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
    // 8 ranks on one node of 4 GPUs: ranks 0 and 4 meet on the first GPU.
    for (int r = 0; r < 8; ++r)
        plain[static_cast<std::size_t>(r)] = {"n1", r, four};
    a = dist::assign_gpus(plain, true);
    EXPECT_NE(a.error.find("ranks 0 and 4 on node n1 both use the GPU at PCI bus id 0000:1b:00.0"),
              std::string::npos)
        << a.error;
    EXPECT_NE(a.error.find("NCCL cannot put two ranks on one GPU"), std::string::npos);
    EXPECT_NE(a.error.find("--gpus-per-task=1"), std::string::npos);
    // Two ranks given the same single GPU through their own CUDA_VISIBLE_DEVICES.
    const std::vector<dist::RankGpus> same = {{"n1", 0, {four[2]}}, {"n1", 1, {four[2]}}};
    a = dist::assign_gpus(same, true);
    EXPECT_NE(a.error.find("ranks 0 and 1 on node n1 both use the GPU at PCI bus id 0000:9a:00.0"),
              std::string::npos)
        << a.error;
    // The MPI backend may share (one-GPU smoke runs): noted, not refused.
    a = dist::assign_gpus(same, /*nccl_backend=*/false);
    EXPECT_EQ(a.error, "");
    EXPECT_NE(a.shared.find("allowed with dist.backend=mpi"), std::string::npos);
    EXPECT_EQ(a.index, (std::vector<int>{0, 0}));
}

// Issue 25: what else the ranks' exchange decides (faked device lists).
TEST(DeviceBinding, RefusesMixedDevicesAndNamesIdleGpus) {
    const std::vector<std::string> four = {"0000:1b:00.0", "0000:41:00.0", "0000:9a:00.0",
                                           "0000:c1:00.0"};
    // run.device=auto on a node whose CUDA is broken: that node computes on the CPU, the others
    // on GPUs. Refused on every rank, naming one rank of each kind.
    std::vector<dist::RankGpus> mixed = {{"n1", 0, four}, {"n1", 1, four}, {"n2", 0, {}, false}};
    dist::GpuAssignment a = dist::assign_gpus(mixed, /*nccl_backend=*/false);
    EXPECT_NE(a.error.find("rank 0 (node n1) computes on cuda but rank 2 (node n2) on cpu"),
              std::string::npos)
        << a.error;
    EXPECT_NE(a.error.find("run.device=cpu (or cuda) for every rank"), std::string::npos);
    // All on the CPU: nothing to choose, nothing to say.
    a = dist::assign_gpus({{"n1", 0, {}, false}, {"n1", 1, {}, false}}, false);
    EXPECT_EQ(a.error + a.shared + a.idle, "");
    EXPECT_EQ(a.index, (std::vector<int>{-1, -1}));
    // 2 ranks on a node of 4 GPUs: accepted, and the 2 idle GPUs are named.
    a = dist::assign_gpus({{"n1", 0, four}, {"n1", 1, four}}, true);
    EXPECT_EQ(a.error, "");
    EXPECT_EQ(a.index, (std::vector<int>{0, 1}));
    EXPECT_NE(a.idle.find("node n1: its ranks use 2 of the 4 GPUs they see; idle: 0000:9a:00.0, "
                          "0000:c1:00.0"),
              std::string::npos)
        << a.idle;
    // Per-task binding on two nodes: every GPU used, none idle.
    std::vector<dist::RankGpus> per_task;
    for (int r = 0; r < 8; ++r)
        per_task.push_back({r < 4 ? "n1" : "n2", r % 4, {four[static_cast<std::size_t>(r % 4)]}});
    a = dist::assign_gpus(per_task, true);
    EXPECT_EQ(a.error + a.idle, "");
    EXPECT_EQ(a.index, (std::vector<int>(8, 0)));
    // A rank that sees no GPU gets no index (bind_device refuses it on that rank, with CUDA's
    // reason); the others are decided as usual.
    a = dist::assign_gpus({{"n1", 0, {four[0]}}, {"n1", 1, {}}}, true);
    EXPECT_EQ(a.error, "");
    EXPECT_EQ(a.index, (std::vector<int>{0, -1}));
}

// bind_device exchanges what every rank sees before any rank may fail: ranks that disagree (here
// rank 0 asks for cuda, the others for cpu) all fail, none waits in the exchange for ever.
TEST(DeviceBinding, EveryRankFailsTogetherWhenTheRanksDisagree) {
    const auto topo = dist::discover_topology(MPI_COMM_WORLD);
    if (topo.world_size < 2) GTEST_SKIP() << "needs 2 ranks";
    EXPECT_THROW(dist::bind_device(topo.rank == 0 ? "cuda" : "cpu", topo, /*nccl_backend=*/false,
                                   MPI_COMM_WORLD),
                 core::ConfigError);
}

TEST(DeviceBinding, CpuAndMissingGpu) {
    auto topo = dist::discover_topology(MPI_COMM_WORLD);
    auto b = dist::bind_device("cpu", topo, /*nccl_backend=*/false, MPI_COMM_WORLD);
    EXPECT_TRUE(b.device.is_cpu());
    EXPECT_EQ(b.name, "cpu");
    EXPECT_EQ(b.pci_bus_id, "");
    EXPECT_TRUE(
        std::regex_match(b.cpu_affinity, std::regex("[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")))
        << b.cpu_affinity;

    if (torch::cuda::is_available())
        GTEST_SKIP() << "a GPU is visible: the no-GPU error cannot occur";
    try {
        dist::bind_device("cuda", topo, false, MPI_COMM_WORLD);
        ADD_FAILURE() << "run.device=cuda without a GPU must be rejected";
    } catch (const core::ConfigError& e) {
        EXPECT_EQ(
            std::string(e.what()).rfind(
                "run.device=cuda but no CUDA device is visible on host " + topo.hostname + " (", 0),
            0u)
            << e.what();
        // and why, in the CUDA runtime's words (or the build's)
        EXPECT_NE(std::string(e.what()).find(dist::cuda_unavailable_reason()), std::string::npos);
    }
}

// Launch checks for batch jobs: an srun step whose MPI did not get PMI (N tasks, 1-rank worlds).
// The GPUs Slurm counts on a node are not compared with its ranks (issue 25): with per-task
// binding SLURM_GPUS_ON_NODE may count one task's GPUs, and bind_device judges by PCI bus id.
TEST(LaunchProblem, SrunWithoutPmiButAnyGpuCount) {
    dist::Topology one;
    one.hostname = "n1";
    EXPECT_EQ(dist::launch_problem(one, {}), "");
    EXPECT_EQ(dist::launch_problem(one, {{"SLURM_STEP_NUM_TASKS", "1"}}), "");
    const std::string m = dist::launch_problem(one, {{"SLURM_STEP_NUM_TASKS", "4"}});
    EXPECT_NE(m.find("4 tasks (SLURM_STEP_NUM_TASKS) but MPI sees 1 rank"), std::string::npos) << m;
    EXPECT_NE(m.find("srun --mpi=pmix"), std::string::npos);

    dist::Topology four = one;
    four.world_size = 8;
    four.local_size = 4;
    for (const char* gpus : {"4", "1", "2", "8", "junk"}) // per node, per task, shared, dp
        EXPECT_EQ(dist::launch_problem(four, {{"SLURM_STEP_NUM_TASKS", "8"},
                                              {"SLURM_GPUS_ON_NODE", gpus},
                                              {"SLURM_GPUS_PER_TASK", "1"}}),
                  "")
            << gpus;
}
