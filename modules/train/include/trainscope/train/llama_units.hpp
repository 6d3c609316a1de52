// The Llama model as the units sharded data parallelism works on (dist::UnitModel): the embedding,
// each decoder layer, the head. train chooses the LLM's FSDP units here and hands them to
// distributed, which depends on no model.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainscope/distributed/unit_model.hpp"
#include "trainscope/models/llama.hpp"

namespace trainscope::train {

class LlamaUnits final : public dist::UnitModel {
  public:
    explicit LlamaUnits(models::LlamaForCausalLMImpl& model) : model_(model) {}
    int num_units() const override { return static_cast<int>(model_.num_units()); }
    std::vector<std::pair<std::string, torch::nn::Module*>> unit_modules(int unit) override {
        return model_.unit_modules(unit);
    }
    bool unit_materialized(int unit) override { return model_.unit_materialized(unit); }
    void set_unit_hooks(core::UnitHooks* hooks) override { model_.set_unit_hooks(hooks); }
    bool first_and_last_tied() const override { return model_.config().tie_word_embeddings; }
    torch::nn::Module& module() override { return model_; }

  private:
    models::LlamaForCausalLMImpl& model_;
};

} // namespace trainscope::train
