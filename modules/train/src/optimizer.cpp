#include "trainscope/train/optimizer.hpp"

#include "trainscope/distributed/fused_optim.hpp"

namespace trainscope::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& opt,
                                                        const std::vector<torch::Tensor>& params,
                                                        bool with_momentum) {
    if (opt.kind == "adamw") {
        auto o = torch::optim::AdamWOptions(opt.lr).weight_decay(opt.weight_decay);
        if (opt.fused) return std::make_unique<dist::FusedAdamW>(params, o);
        return std::make_unique<torch::optim::AdamW>(params, o);
    }
    auto o = torch::optim::SGDOptions(opt.lr).weight_decay(opt.weight_decay);
    if (with_momentum) o.momentum(opt.momentum).nesterov(opt.nesterov);
    if (opt.fused) return std::make_unique<dist::FusedSGD>(params, o);
    return std::make_unique<torch::optim::SGD>(params, o);
}

} // namespace trainscope::train
