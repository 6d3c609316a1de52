#include "trainscope/train/optimizer.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/zero.hpp"

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

dist::ZeroAdamW zero_adamw(const OptimizerConfig& opt) {
    dist::ZeroAdamW h;
    h.lr = opt.lr;
    h.weight_decay = opt.weight_decay;
    h.fused = opt.fused;
    return h;
}

std::unique_ptr<dist::DataParallelism>
make_data_parallelism(dist::ZeroStage zero, const OptimizerConfig& opt, bool with_momentum,
                      bool loss_scaling, dist::Communicator& comm, dist::TrainableSet trainable,
                      std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                      const dist::CompressionOptions& compression) {
    if (zero == dist::ZeroStage::None) {
        std::unique_ptr<torch::optim::Optimizer> optimizer =
            make_optimizer(opt, trainable.tensors, with_momentum);
        return dist::make_ddp(comm, std::move(trainable), std::move(optimizer), bucket_bytes,
                              first_bucket_bytes, compression);
    }
    if (zero == dist::ZeroStage::Parameters)
        throw core::InternalError("make_data_parallelism: dist.zero=3 is built by FSDP's caller");
    // The workloads' option checks refused other optimizers and fp16-mixed's loss scaling.
    if (opt.kind != "adamw" || loss_scaling)
        throw core::InternalError("dist.zero > 0 without AdamW or with loss scaling");
    return dist::make_zero(comm, std::move(trainable), dist::to_int(zero), zero_adamw(opt),
                           dist::compressed_dtype(compression.kind));
}

} // namespace trainscope::train
