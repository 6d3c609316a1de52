// Padded batches of tokenised text samples as LibTorch tensors (torchtune's padded_collate_sft,
// packed and DPO collation). Kept apart from text_dataset.hpp so that reading and tokenising a
// dataset does not need LibTorch.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "trainscope/data/text_dataset.hpp"

namespace trainscope::data {

// A padded batch. Labels are NOT shifted (the loss shifts: logits[:, :-1] predict labels[:, 1:]).
struct TextBatch {
    torch::Tensor input_ids;        // int64 [B, T], right-padded with pad_id
    torch::Tensor labels;           // int64 [B, T], -100 where masked or padded
    torch::Tensor position_ids;     // int64 [B, T]: 0..len-1 (packed: restart per sample)
    torch::Tensor segment_ids;      // int64 [B, T] for packed batches, undefined otherwise
    std::int64_t tokens = 0;        // non-pad tokens
    std::int64_t label_tokens = 0;  // labels != -100 after the shift (what the loss averages over)
    std::int64_t padded_tokens = 0; // B * T - tokens
    std::int64_t max_len = 0, min_len = 0; // sequence lengths before padding (packed: pack fill)
};

// Pads to the longest sample in the batch.
TextBatch collate_samples(const std::vector<const TokenizedSample*>& samples, std::int64_t pad_id);
TextBatch collate_packed(const std::vector<const PackedSample*>& packs, std::int64_t pad_id);
// Preference batch: [chosen_0 .. chosen_{B-1}, rejected_0 .. rejected_{B-1}] padded together to the
// longest of all 2B sequences (torchtune's padded_collate_dpo).
TextBatch collate_preference(const std::vector<const PreferenceSample*>& samples,
                             std::int64_t pad_id);

} // namespace trainscope::data
