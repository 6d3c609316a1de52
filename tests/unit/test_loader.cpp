// Adapted transform (values, shapes, align_corners=false resize, device placement) and the threaded
// Loader: same batches in sampler order for any worker count, drop_last, shutdown mid-epoch,
// worker errors, and data.preprocess=device (raw batches transformed after the copy) matching the
// host transform.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <thread>

#include "test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/datasets.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/loader.hpp"

using namespace trainscope;
using data::AdaptedTransform;
using data::Loader;

TEST(AdaptedTransform, ShapeDtypeAndConstantImage) {
    auto batch = torch::full({4, 1, 28, 28}, 200, torch::kUInt8);
    AdaptedTransform t{3, 32, 0.2860f, 0.3530f};
    auto x = t(batch);
    EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{4, 3, 32, 32}));
    EXPECT_EQ(x.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(x.is_contiguous());
    const float expected = (200.0f / 255.0f - 0.2860f) / 0.3530f;
    EXPECT_NEAR(x.min().item<float>(), expected, 1e-5);
    EXPECT_NEAR(x.max().item<float>(), expected, 1e-5);

    AdaptedTransform gray{1, 32, 0.5f, 0.5f};
    EXPECT_EQ(gray(batch).sizes(), (std::vector<std::int64_t>{4, 1, 32, 32}));
    EXPECT_THROW(t(batch.to(torch::kFloat32)), core::InternalError);
    EXPECT_THROW(t(torch::zeros({4, 2, 28, 28}, torch::kUInt8)), core::InternalError);
}

TEST(AdaptedTransform, ChannelsAreReplicatedGray) {
    auto batch = torch::randint(0, 256, {2, 1, 28, 28}, torch::kUInt8);
    auto x = AdaptedTransform{3, 40, 0.1307f, 0.3081f}(batch);
    EXPECT_TRUE(torch::equal(x.select(1, 0), x.select(1, 1)));
    EXPECT_TRUE(torch::equal(x.select(1, 0), x.select(1, 2)));
}

TEST(AdaptedTransform, BilinearWithoutAlignedCorners) {
    // Row [0, 255] resized 2 → 4: source positions (i + 0.5)/2 - 0.5 = -0.25 (clamped to 0),
    // 0.25, 0.75, 1.25 (clamped to 1) give 0, 0.25, 0.75, 1; align_corners=true would give thirds.
    auto batch = torch::tensor({0, 255, 0, 255}, torch::kUInt8).view({1, 1, 2, 2});
    auto x = AdaptedTransform{1, 4, 0.0f, 1.0f}(batch); // [1, 1, 4, 4]
    auto row = x[0][0][1];
    EXPECT_TRUE(torch::allclose(row, torch::tensor({0.0f, 0.25f, 0.75f, 1.0f}), 1e-6, 1e-6)) << row;
}

TEST(AdaptedTransform, ResizeKeepsTheMeanOfASmoothImage) {
    // A smooth 28x28 ramp image: resizing to 64 must keep its mean brightness.
    auto ramp = torch::arange(28, torch::kFloat32);
    auto img = (ramp.view({28, 1}) * 4 + ramp.view({1, 28}) * 5).to(torch::kUInt8); // max 243
    auto batch = img.view({1, 1, 28, 28});
    AdaptedTransform small{1, 28, 0.0f, 1.0f}, big{1, 64, 0.0f, 1.0f};
    auto x28 = small(batch), x64 = big(batch);
    EXPECT_EQ(x64.sizes(), (std::vector<std::int64_t>{1, 1, 64, 64}));
    EXPECT_NEAR(x64.mean().item<float>(), x28.mean().item<float>(), 2e-3);
    EXPECT_NEAR(x28.mean().item<float>(), (13.5f * 4 + 13.5f * 5) / 255.0f, 1e-5);
}

TEST(AdaptedTransform, ResultStaysOnTheBatchDeviceAndPinsOnlyHostMemory) {
    // A batch on another device (meta: shapes only, no data) must give its result there, and the
    // page-locked output, a host-memory notion, must then be skipped rather than forced to the CPU.
    auto batch = torch::empty({2, 1, 28, 28}, torch::TensorOptions(torch::kUInt8).device("meta"));
    for (bool pinned : {false, true}) {
        auto x = AdaptedTransform{3, 32, 0.5f, 0.5f}.apply(batch, pinned);
        EXPECT_TRUE(x.is_meta());
        EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{2, 3, 32, 32}));
        EXPECT_EQ(x.scalar_type(), torch::kFloat32);
    }
}

namespace {

// 103 synthetic images, shuffled sampler order of one rank.
struct Fixture {
    data::ImageSet set = data::make_synthetic(103, 1, 28, 28, 10, 99);
    AdaptedTransform transform{3, 32, 0.5f, 0.5f};
    std::vector<std::int64_t> indices = [] {
        data::DistributedSampler s(103, 0, 1, true, 5, false);
        s.set_epoch(2);
        return s.indices();
    }();
};

} // namespace

TEST(Loader, SameBatchesInSamplerOrderForAnyWorkerCount) {
    Fixture f;
    Loader serial(f.set, f.transform, f.indices, 16, 0, 2, false, false);
    EXPECT_EQ(serial.num_batches(), 7);
    auto reference = trainscope::testing::drain(serial);
    ASSERT_EQ(reference.size(), 7u);
    // Batch k is exactly the transform of the rows indices[16k, 16k + 16), in that order.
    for (std::size_t k = 0; k < reference.size(); ++k) {
        const std::int64_t begin = static_cast<std::int64_t>(k) * 16;
        const std::int64_t size = std::min<std::int64_t>(16, 103 - begin);
        auto idx = torch::tensor(
            std::vector<std::int64_t>(f.indices.begin() + begin, f.indices.begin() + begin + size));
        EXPECT_EQ(reference[k].size, size);
        EXPECT_TRUE(torch::equal(reference[k].labels, f.set.labels.index_select(0, idx)));
        EXPECT_TRUE(
            torch::equal(reference[k].images, f.transform(f.set.images.index_select(0, idx))));
    }
    for (auto [workers, prefetch] : {std::pair{1, 1}, {1, 2}, {2, 2}, {2, 5}, {3, 1}}) {
        SCOPED_TRACE("workers " + std::to_string(workers) + " prefetch " +
                     std::to_string(prefetch));
        Loader threaded(f.set, f.transform, f.indices, 16, workers, prefetch, false, false);
        auto batches = trainscope::testing::drain(threaded);
        ASSERT_EQ(batches.size(), reference.size());
        for (std::size_t k = 0; k < batches.size(); ++k) {
            EXPECT_EQ(batches[k].size, reference[k].size);
            EXPECT_TRUE(torch::equal(batches[k].images, reference[k].images)) << "batch " << k;
            EXPECT_TRUE(torch::equal(batches[k].labels, reference[k].labels)) << "batch " << k;
        }
        EXPECT_FALSE(threaded.next().has_value()); // stays at the end
    }
}

TEST(Loader, DropLast) {
    Fixture f;
    for (int workers : {0, 2}) {
        Loader dropping(f.set, f.transform, f.indices, 16, workers, 2, false, true);
        EXPECT_EQ(dropping.num_batches(), 6);
        auto batches = trainscope::testing::drain(dropping);
        ASSERT_EQ(batches.size(), 6u);
        for (const auto& b : batches) {
            EXPECT_EQ(b.size, 16);
            EXPECT_EQ(b.images.size(0), 16);
        }
        Loader keeping(f.set, f.transform, f.indices, 16, workers, 2, false, false);
        batches = trainscope::testing::drain(keeping);
        ASSERT_EQ(batches.size(), 7u);
        EXPECT_EQ(batches.back().size, 103 - 6 * 16);
        EXPECT_EQ(batches.back().labels.size(0), 7);
    }
    // Fewer samples than one batch: nothing with drop_last, one small batch without.
    std::vector<std::int64_t> few{5, 3, 1};
    EXPECT_EQ(Loader(f.set, f.transform, few, 16, 1, 2, false, true).num_batches(), 0);
    Loader one(f.set, f.transform, few, 16, 1, 2, false, false);
    EXPECT_EQ(one.next()->size, 3);
}

TEST(Loader, DestructionMidEpochDoesNotHang) {
    Fixture f;
    std::vector<std::int64_t> many;
    for (int r = 0; r < 40; ++r)
        many.insert(many.end(), f.indices.begin(), f.indices.end());
    auto loader = std::make_shared<std::unique_ptr<Loader>>(
        std::make_unique<Loader>(f.set, f.transform, many, 8, 2, 3, false, true));
    ASSERT_TRUE((*loader)->next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // let the ring fill up
    // Destroy in another thread so that a hang fails this test instead of blocking the suite.
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    std::thread([loader, done] {
        loader->reset();
        done->set_value();
    }).detach();
    EXPECT_EQ(finished.wait_for(std::chrono::seconds(20)), std::future_status::ready);
}

TEST(Loader, WorkerExceptionSurfacesFromNext) {
    Fixture f;
    data::ImageSet broken = f.set;
    broken.images = f.set.images.to(torch::kFloat32); // the transform rejects non-uint8 images
    for (int workers : {0, 1, 2}) {
        SCOPED_TRACE("workers " + std::to_string(workers));
        Loader loader(broken, f.transform, f.indices, 16, workers, 2, false, true);
        try {
            loader.next();
            FAIL() << "no exception";
        } catch (const core::InternalError& e) {
            EXPECT_NE(std::string(e.what()).find("expects a uint8 [B, C, H, W] batch, got Float"),
                      std::string::npos)
                << e.what();
        }
        EXPECT_THROW(loader.next(), core::InternalError); // sticky: the epoch cannot go on
    }
    EXPECT_THROW(Loader(f.set, f.transform, {0, 103}, 16, 1, 2, false, true), core::InternalError);
}

TEST(Loader, WorkersDoNotChangeTheProcessThreadCount) {
    // Workers run single-threaded without at::set_num_threads(1), which would make every thread
    // created afterwards (and the trainer, if it had not run an op yet) single-threaded.
    const int before = at::get_num_threads();
    at::set_num_threads(2);
    Fixture f;
    {
        Loader loader(f.set, f.transform, f.indices, 16, 2, 2, false, true);
        trainscope::testing::drain(loader);
    }
    EXPECT_EQ(at::get_num_threads(), 2);
    int in_new_thread = 0;
    std::thread([&] { in_new_thread = at::get_num_threads(); }).join();
    EXPECT_EQ(in_new_thread, 2);
    at::set_num_threads(before);
}

TEST(Loader, PinMemoryOnlyWithCuda) {
    Fixture f;
    Loader loader(f.set, f.transform, f.indices, 16, 1, 2, /*pin_memory=*/true, true);
    EXPECT_EQ(loader.pinned(), torch::cuda::is_available());
    auto b = loader.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->images.is_pinned(), loader.pinned());
    EXPECT_EQ(b->labels.is_pinned(), loader.pinned());
}

TEST(Loader, DevicePreprocessingMatchesHost) {
    // data.preprocess=device: the loader ships the gathered uint8 rows, the trainer transforms them
    // after the copy (on CPU the "device" is the CPU). Same tensors as the host transform.
    Fixture f;
    auto host_source = std::make_shared<data::ImageSetSource>(f.set, f.transform);
    auto raw_source =
        std::make_shared<data::ImageSetSource>(f.set, f.transform, data::Preprocess::Device);
    for (int workers : {0, 2}) {
        SCOPED_TRACE("workers " + std::to_string(workers));
        Loader host(host_source, f.indices, 3, 16, workers, 2, false, false);
        Loader device(raw_source, f.indices, 3, 16, workers, 2, false, false);
        auto hb = trainscope::testing::drain(host), db = trainscope::testing::drain(device);
        ASSERT_EQ(hb.size(), 7u);
        ASSERT_EQ(db.size(), hb.size());
        for (std::size_t k = 0; k < hb.size(); ++k) {
            EXPECT_FALSE(hb[k].raw);
            ASSERT_TRUE(db[k].raw);
            const std::int64_t begin = static_cast<std::int64_t>(k) * 16;
            auto idx = torch::tensor(std::vector<std::int64_t>(
                f.indices.begin() + begin, f.indices.begin() + begin + hb[k].size));
            EXPECT_EQ(db[k].images.scalar_type(), torch::kUInt8);
            EXPECT_TRUE(torch::equal(db[k].images, f.set.images.index_select(0, idx)));
            EXPECT_TRUE(torch::equal(db[k].labels, hb[k].labels));
            auto x = data::network_input(db[k], f.transform, torch::kCPU, torch::kFloat32, false);
            EXPECT_EQ(x.sizes(), hb[k].images.sizes());
            EXPECT_TRUE(torch::allclose(x, hb[k].images, 1e-6, 1e-6)) << "batch " << k;
            // The host batch passes through with the dtype cast only.
            auto h64 = data::network_input(hb[k], f.transform, torch::kCPU, torch::kFloat64, false);
            auto d64 = data::network_input(db[k], f.transform, torch::kCPU, torch::kFloat64, false);
            EXPECT_EQ(d64.scalar_type(), torch::kFloat64);
            EXPECT_TRUE(torch::equal(h64, hb[k].images.to(torch::kFloat64)));
            EXPECT_TRUE(torch::allclose(d64, h64, 1e-6, 1e-6));
        }
    }
}

TEST(Loader, DevicePreprocessingOnCuda) {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    Fixture f;
    auto raw_source =
        std::make_shared<data::ImageSetSource>(f.set, f.transform, data::Preprocess::Device);
    Loader device(raw_source, f.indices, 0, 16, 1, 2, /*pin_memory=*/true, true);
    Loader host(f.set, f.transform, f.indices, 16, 1, 2, false, true);
    while (auto db = device.next()) {
        auto hb = host.next();
        ASSERT_TRUE(hb.has_value());
        EXPECT_TRUE(db->images.is_pinned());
        auto x = data::network_input(*db, f.transform, torch::kCUDA, torch::kFloat32, true);
        EXPECT_TRUE(x.is_cuda());
        EXPECT_TRUE(torch::allclose(x.cpu(), hb->images, 1e-5, 1e-5));
    }
}

TEST(Loader, BatchSourceOfADatasetSplit) {
    core::OptionRegistry r;
    data::declare_options(r);
    auto splits = data::open_dataset(core::Config::from_values(
        r, {{"data.dataset", "synthetic"}, {"data.synthetic_samples", "40"}}));
    EXPECT_FALSE(splits.is_image_folder());
    EXPECT_EQ(splits.size(data::Split::Train), 40);
    EXPECT_EQ(splits.size(data::Split::Test), 10);
    EXPECT_EQ(splits.num_classes(), 10);
    AdaptedTransform t{3, 32, splits.train.mean, splits.train.std};
    auto test_raw =
        data::make_batch_source(splits, data::Split::Test, t, data::Preprocess::Device, 1);
    auto train_host =
        data::make_batch_source(splits, data::Split::Train, t, data::Preprocess::Host, 1);
    EXPECT_EQ(test_raw->size(), 10);
    EXPECT_EQ(train_host->size(), 40);
    std::vector<std::int64_t> rows{9, 0, 4};
    auto raw = test_raw->build(rows, 0, false);
    EXPECT_TRUE(raw.raw);
    EXPECT_TRUE(torch::equal(raw.images, splits.test.images.index_select(0, torch::tensor(rows))));
    auto ready = train_host->build(rows, 0, false);
    EXPECT_FALSE(ready.raw);
    EXPECT_TRUE(
        torch::equal(ready.images, t(splits.train.images.index_select(0, torch::tensor(rows)))));
    // Rows beyond the split are rejected by the loader.
    EXPECT_THROW(Loader(test_raw, {10}, 0, 4, 0, 1, false, false), core::InternalError);
}

// Throughput of the loader alone (not part of the suite): run with
//   data_unit_tests --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
TEST(Loader, DISABLED_Throughput) {
    auto set = data::make_synthetic(60000, 1, 28, 28, 10, 1);
    data::DistributedSampler sampler(60000, 0, 1, true, 1, true);
    for (int workers : {0, 1, 2}) {
        Loader loader(set, AdaptedTransform{3, 64, 0.5f, 0.5f}, sampler.indices(), 128, workers, 2,
                      false, true);
        auto t0 = std::chrono::steady_clock::now();
        std::int64_t n = 0;
        while (loader.next() && n < 200)
            ++n;
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("batch 128, 3x64x64, workers %d: %.1f batches/s (%.0f images/s)\n", workers,
                    n / s, n * 128 / s);
    }
}
