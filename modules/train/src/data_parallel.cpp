// Single-process data parallelism (see data_parallel.hpp).
#include "trainscope/train/data_parallel.hpp"

#include "trainscope/core/error.hpp"

namespace trainscope::train {

DataParallel::DataParallel(models::MobileNetV2 master,
                           std::function<models::MobileNetV2()> make_replica,
                           std::vector<torch::Device> devices, torch::Dtype dtype,
                           bool channels_last)
    : master_(std::move(master)), devices_(std::move(devices)), channels_last_(channels_last) {
    if (devices_.empty()) throw core::InternalError("DataParallel: no devices");
    replicas_.push_back(master_);
    for (std::size_t i = 1; i < devices_.size(); ++i) {
        models::MobileNetV2 r = make_replica();
        r->to(devices_[i], dtype);
        replicas_.push_back(r);
    }
    refresh();
}

void DataParallel::refresh() {
    if (replicas_.size() < 2) return;
    torch::NoGradGuard no_grad;
    const auto params = master_->parameters();
    const auto buffers = master_->buffers();
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
        auto rp = replicas_[i]->parameters();
        auto rb = replicas_[i]->buffers();
        if (rp.size() != params.size() || rb.size() != buffers.size())
            throw core::InternalError("DataParallel: replica " + std::to_string(i) +
                                      " does not have the master's parameters and buffers");
        for (std::size_t k = 0; k < params.size(); ++k) {
            if (channels_last_ && params[k].dim() == 4 &&
                !rp[k].is_contiguous(torch::MemoryFormat::ChannelsLast))
                rp[k].set_data(rp[k].contiguous(torch::MemoryFormat::ChannelsLast));
            rp[k].copy_(params[k], /*non_blocking=*/true);
        }
        for (std::size_t k = 0; k < buffers.size(); ++k)
            rb[k].copy_(buffers[k], /*non_blocking=*/true);
    }
}

torch::Tensor DataParallel::forward(const torch::Tensor& x) {
    if (replicas_.size() < 2) return master_->forward(x);
    const auto chunks = x.chunk(static_cast<std::int64_t>(replicas_.size()), 0);
    std::vector<torch::Tensor> outputs;
    outputs.reserve(chunks.size());
    // Launches are asynchronous on GPUs, so the replicas' kernels overlap even though one thread
    // issues them; on the CPU the chunks run one after the other.
    for (std::size_t i = 0; i < chunks.size(); ++i) {
        torch::Tensor xi = chunks[i].to(devices_[i], /*non_blocking=*/true);
        if (channels_last_) xi = xi.contiguous(torch::MemoryFormat::ChannelsLast);
        outputs.push_back(replicas_[i]->forward(xi).to(devices_[0]));
    }
    return torch::cat(outputs, 0);
}

void DataParallel::reduce_gradients() {
    if (replicas_.size() < 2) return;
    torch::NoGradGuard no_grad;
    auto params = master_->parameters();
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
        auto rp = replicas_[i]->parameters();
        for (std::size_t k = 0; k < params.size(); ++k) {
            torch::Tensor& g = rp[k].mutable_grad();
            if (!g.defined()) continue;
            torch::Tensor& mg = params[k].mutable_grad();
            if (!mg.defined())
                mg = g.to(params[k].device()).clone();
            else
                mg.add_(g.to(params[k].device()));
            g.zero_();
        }
    }
}

void DataParallel::train(bool on) {
    for (auto& r : replicas_)
        r->train(on);
}

} // namespace trainscope::train
