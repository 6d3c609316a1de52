// Collation of tokenised samples into padded int64 batches (see text_batch.hpp): right padding
// with pad_id / label -100, positions per row, and segment ids for packed rows.
#include "trainscope/data/text_batch.hpp"

#include <algorithm>
#include <limits>

namespace trainscope::data {

namespace {

TextBatch collate_rows(const std::vector<const std::vector<std::int64_t>*>& ids,
                       const std::vector<const std::vector<std::int64_t>*>& labels,
                       std::int64_t pad_id) {
    TextBatch b;
    const auto B = static_cast<std::int64_t>(ids.size());
    std::int64_t T = 0, min_len = std::numeric_limits<std::int64_t>::max();
    for (const auto* r : ids) {
        T = std::max<std::int64_t>(T, static_cast<std::int64_t>(r->size()));
        min_len = std::min<std::int64_t>(min_len, static_cast<std::int64_t>(r->size()));
    }
    b.input_ids = torch::full({B, T}, pad_id, torch::kInt64);
    b.labels = torch::full({B, T}, kIgnoreLabel, torch::kInt64);
    b.position_ids = torch::arange(T, torch::kInt64).unsqueeze(0).repeat({B, 1});
    auto* id = b.input_ids.data_ptr<std::int64_t>();
    auto* lb = b.labels.data_ptr<std::int64_t>();
    for (std::int64_t r = 0; r < B; ++r) {
        const auto n = static_cast<std::int64_t>(ids[r]->size());
        std::copy(ids[r]->begin(), ids[r]->end(), id + r * T);
        std::copy(labels[r]->begin(), labels[r]->end(), lb + r * T);
        b.tokens += n;
        for (std::int64_t t = 1; t < n; ++t)
            if ((*labels[r])[static_cast<std::size_t>(t)] != kIgnoreLabel) ++b.label_tokens;
    }
    b.padded_tokens = B * T - b.tokens;
    b.max_len = T;
    b.min_len = B > 0 ? min_len : 0;
    return b;
}

} // namespace

TextBatch collate_samples(const std::vector<const TokenizedSample*>& samples, std::int64_t pad_id) {
    std::vector<const std::vector<std::int64_t>*> ids, labels;
    for (const auto* s : samples) {
        ids.push_back(&s->ids);
        labels.push_back(&s->labels);
    }
    return collate_rows(ids, labels, pad_id);
}

TextBatch collate_packed(const std::vector<const PackedSample*>& packs, std::int64_t pad_id) {
    std::vector<const std::vector<std::int64_t>*> ids, labels;
    for (const auto* p : packs) {
        ids.push_back(&p->ids);
        labels.push_back(&p->labels);
    }
    TextBatch b = collate_rows(ids, labels, pad_id);
    const auto B = static_cast<std::int64_t>(packs.size());
    const std::int64_t T = b.max_len;
    b.segment_ids = torch::zeros({B, T}, torch::kInt64);
    auto* pos = b.position_ids.data_ptr<std::int64_t>();
    auto* seg = b.segment_ids.data_ptr<std::int64_t>();
    b.tokens = 0;
    b.min_len = std::numeric_limits<std::int64_t>::max();
    b.max_len = 0;
    for (std::int64_t r = 0; r < B; ++r) {
        const PackedSample& p = *packs[r];
        std::copy(p.positions.begin(), p.positions.end(), pos + r * T);
        std::copy(p.segments.begin(), p.segments.end(), seg + r * T);
        b.tokens += p.length; // the pack's padding is not a token
        b.min_len = std::min(b.min_len, p.length);
        b.max_len = std::max(b.max_len, p.length);
    }
    b.padded_tokens = B * T - b.tokens;
    // label_tokens as collate_rows counted them: labels[:, 1:] != -100 over the whole pack, which
    // is what the loss averages over (as torchtune, whose packs shift labels row-wise).
    return b;
}

TextBatch collate_preference(const std::vector<const PreferenceSample*>& samples,
                             std::int64_t pad_id) {
    std::vector<const std::vector<std::int64_t>*> ids, labels;
    for (const auto* s : samples) {
        ids.push_back(&s->chosen.ids);
        labels.push_back(&s->chosen.labels);
    }
    for (const auto* s : samples) {
        ids.push_back(&s->rejected.ids);
        labels.push_back(&s->rejected.labels);
    }
    return collate_rows(ids, labels, pad_id);
}

} // namespace trainscope::data
