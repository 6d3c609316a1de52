// LlmTrainer's state, shared by its translation units (llm_trainer.cpp: the step, accounting,
// checkpoints; llm_evaluation.cpp: loss resolution, validation, FLOPs and columns). Internal.
#pragma once

#include <torch/torch.h>

#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "trainscope/core/numeric.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/prefetcher.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/comm_accounting.hpp"
#include "trainscope/train/llm_trainer.hpp"

namespace trainscope::train {

using core::kNaN;

// Extra /iterations columns of the LLM workload, in this order.
enum Extra {
    kPaddingFraction,
    kSeqLenMax,
    kSeqLenMin,
    kSequences,
    kDpoRewardChosen,
    kDpoRewardRejected,
    kDpoRewardMargin,
    kDpoRewardAccuracy,
    kQatEnabled,
    kFrozenWeightBytes,
    kNf4WeightBytes,
    kTrainableWeightBytes,
    kAllgatherBytes,
    kAllgatherS,
    kAllgatherExposedS,
    kReduceScatterBytes,
    kReduceScatterS,
    kReduceScatterExposedS,
    kGatheredWeightBytes,
    kExtraCount
};

using dist::bytes_of;

struct LlmTrainer::State {
    LlmTrainerOptions o;
    LlmModel m;
    const data::TextDataset& data;
    const data::Tokenizer& tokenizer;
    dist::Communicator& comm;
    MPI_Comm world;
    LlmSplit split;
    int rank = 0, size = 1;
    State(const LlmTrainerOptions& options, LlmModel model, const data::TextDataset& d,
          const data::Tokenizer& t, dist::Communicator& c, MPI_Comm w, LlmSplit s)
        : o(options), m(std::move(model)), data(d), tokenizer(t), comm(c), world(w),
          split(std::move(s)) {}
    std::vector<data::PackedSample> packs;           // llm.packed (of the training samples)
    std::unique_ptr<dist::DataParallelism> parallel; // DDP, ZeRO-1/2 or FSDP
    std::unique_ptr<GradScaler> scaler;
    std::int64_t per_epoch = 0;
    double frozen_bytes = 0, nf4_bytes = 0; // fixed for the run
    std::int64_t start_iteration = 0;       // > 0 after restore()
    // The epoch's prefetching loader (one item = one iteration's micro-batches) and the item the
    // data phase fetched.
    std::vector<std::int64_t> order;
    std::unique_ptr<data::Prefetcher<std::vector<data::TextBatch>>> loader;
    std::vector<data::TextBatch> micro;
    prof::PhasePeak peak{-1, false};
    torch::Tensor loss_acc; // this iteration's, on the device
    // Per recorded iteration, the collectives whose durations account() left open (reading them
    // there would wait for the device on NCCL): resolved and dropped by resolve_accounting.
    DeferredComm deferred_comm;
    int cuda_index() const { return o.device.is_cuda() ? o.device.index() : -1; }

    std::size_t num_items() const {
        if (o.llm.packed) return packs.size();
        if (!split.train.empty()) return split.train.size();
        return static_cast<std::size_t>(data.size());
    }
    // The dataset index of training item i (packs are built from the training samples only).
    std::int64_t sample_of(std::int64_t i) const {
        return split.train.empty() ? i : split.train[static_cast<std::size_t>(i)];
    }
    data::DistributedSampler make_sampler() const {
        return data::DistributedSampler(num_items(), rank, size, /*shuffle=*/true, o.seed,
                                        /*drop_last=*/true);
    }
    data::TextBatch collate(const std::vector<std::int64_t>& idx) const {
        const std::int64_t pad = tokenizer.specials().pad >= 0 ? tokenizer.specials().pad : 0;
        if (o.llm.packed) {
            std::vector<const data::PackedSample*> v;
            for (auto i : idx)
                v.push_back(&packs[static_cast<std::size_t>(i)]);
            return data::collate_packed(v, pad);
        }
        if (data.is_preference()) {
            std::vector<const data::PreferenceSample*> v;
            for (auto i : idx)
                v.push_back(&data.preference(sample_of(i)));
            return data::collate_preference(v, pad);
        }
        std::vector<const data::TokenizedSample*> v;
        for (auto i : idx)
            v.push_back(&data.sample(sample_of(i)));
        return data::collate_samples(v, pad);
    }
    // Validation samples (dataset indices of *split.val_data), never packed: the loss per token
    // is the same either way (packed attention is per sample).
    data::TextBatch collate_val(const std::vector<std::int64_t>& idx) const {
        const std::int64_t pad = tokenizer.specials().pad >= 0 ? tokenizer.specials().pad : 0;
        const data::TextDataset& d = *split.val_data;
        if (d.is_preference()) {
            std::vector<const data::PreferenceSample*> v;
            for (auto i : idx)
                v.push_back(&d.preference(i));
            return data::collate_preference(v, pad);
        }
        std::vector<const data::TokenizedSample*> v;
        for (auto i : idx)
            v.push_back(&d.sample(i));
        return data::collate_samples(v, pad);
    }
};

} // namespace trainscope::train
