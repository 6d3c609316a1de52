#include "trainscope/distributed/parallelism.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"

namespace trainscope::dist {
namespace {

// DDP: every rank holds the full model and optimizer; the synchronizer's bucket allreduces
// (armed before the last micro-batch's backward) average the gradients while backward runs.
class DdpParallelism final : public DataParallelism {
  public:
    DdpParallelism(Communicator& comm, TrainableSet trainable,
                   std::unique_ptr<torch::optim::Optimizer> optimizer, std::size_t bucket_bytes,
                   std::size_t first_bucket_bytes, const CompressionOptions& compression)
        : t_(std::move(trainable)), optimizer_(std::move(optimizer)),
          sync_(comm, t_.tensors, bucket_bytes, first_bucket_bytes, compression) {
        sync_.broadcast_parameters(0);
    }

    std::string name() const override { return "ddp"; }
    void before_last_backward() override { sync_.begin_iteration(); }
    void finish_gradients(double grad_scale) override {
        sync_.finish();
        if (grad_scale == 1.0) return;
        std::vector<torch::Tensor> grads;
        for (auto& t : t_.tensors)
            grads.push_back(t.grad());
        foreach_scale(grads, grad_scale); // one multi-tensor kernel per dtype
    }
    std::vector<torch::Tensor> full_gradient_parameters() const override { return t_.tensors; }

    void set_lr(double lr) override {
        for (auto& group : optimizer_->param_groups())
            group.options().set_lr(lr);
    }
    bool step(const OptimizerStep& via) override {
        const bool stepped = via(*optimizer_);
        optimizer_->zero_grad(/*set_to_none=*/false);
        return stepped;
    }
    void skip_step() override { optimizer_->zero_grad(/*set_to_none=*/false); }

    PendingParallelComm take_iteration_comm() override { return sync_.last_iteration_pending(); }
    HeldBytes held_bytes() const override {
        HeldBytes h;
        for (const auto& t : t_.tensors) {
            h.trainable += bytes_of(t);
            h.gradients += bytes_of(t.grad());
        }
        h.optimizer_state = optimizer_state_bytes(*optimizer_);
        return h;
    }

    void save(torch::serialize::OutputArchive& out, int rank) const override {
        sync_.save_compression_state(out); // PowerSGD: every rank's error feedback
        if (rank != 0) return;             // replicated: rank 0's copy is everyone's
        save_weights(out, t_);
        torch::serialize::OutputArchive optimizer;
        optimizer_->save(optimizer);
        out.write("optimizer", optimizer);
    }
    void load(ShardSource& saved, int rank, bool) override {
        load_weights(saved, t_);
        torch::serialize::InputArchive optimizer;
        saved.rank(0).read("optimizer", optimizer);
        optimizer_->load(optimizer);
        // Elastic resume: a rank the saved job did not have starts with zero error feedback.
        if (sync_.has_compression_state())
            sync_.load_compression_state(saved.rank(0),
                                         rank < saved.saved_world() ? &saved.rank(rank) : nullptr,
                                         saved.where());
    }

    std::vector<torch::Tensor> full_trainable() override { return cpu_clones(t_.tensors); }
    const GradientSynchronizer* synchronizer() const override { return &sync_; }

  private:
    TrainableSet t_;
    std::unique_ptr<torch::optim::Optimizer> optimizer_;
    GradientSynchronizer sync_;
};

} // namespace

std::optional<torch::ScalarType> compressed_dtype(CompressionKind kind) {
    if (kind == CompressionKind::Fp16) return torch::kHalf;
    if (kind == CompressionKind::Bf16) return torch::kBFloat16;
    return std::nullopt;
}

double optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
    double bytes = 0;
    for (const auto& [key, state] : optimizer.state())
        if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get()))
            bytes += bytes_of(adamw->exp_avg()) + bytes_of(adamw->exp_avg_sq()) +
                     bytes_of(adamw->max_exp_avg_sq());
        else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get()))
            bytes += bytes_of(sgd->momentum_buffer());
    return bytes;
}

void save_tensors(torch::serialize::OutputArchive& out, const std::vector<std::string>& names,
                  const std::vector<torch::Tensor>& tensors, bool buffers) {
    for (std::size_t i = 0; i < names.size(); ++i)
        out.write(names[i], tensors[i], /*is_buffer=*/buffers);
}

void load_tensors(torch::serialize::InputArchive& in, const std::vector<std::string>& names,
                  std::vector<torch::Tensor>& tensors, const std::string& where, bool buffers) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < names.size(); ++i) {
        torch::Tensor saved;
        if (!in.try_read(names[i], saved, buffers))
            throw core::InputError("checkpoint " + where + " has no tensor '" + names[i] +
                                   "': it was written for another model");
        torch::Tensor& t = tensors[i];
        if (!saved.sizes().equals(t.sizes()))
            throw core::InputError("checkpoint " + where + ": tensor '" + names[i] +
                                   "' has shape " + c10::str(saved.sizes()) + ", the model's is " +
                                   c10::str(t.sizes()));
        t.copy_(saved); // in place: views (ZeRO's flat buffers) and strides stay as they are
    }
}

void save_weights(torch::serialize::OutputArchive& out, const TrainableSet& trainable) {
    torch::serialize::OutputArchive weights;
    save_tensors(weights, trainable.names, trainable.tensors);
    out.write("weights", weights);
}

void load_weights(ShardSource& saved, TrainableSet& trainable) {
    torch::serialize::InputArchive weights;
    saved.rank(0).read("weights", weights);
    load_tensors(weights, trainable.names, trainable.tensors, saved.where());
}

std::vector<torch::Tensor> cpu_clones(const std::vector<torch::Tensor>& tensors) {
    std::vector<torch::Tensor> out;
    for (const auto& t : tensors)
        out.push_back(t.detach().to(torch::kCPU).clone());
    return out;
}

std::unique_ptr<DataParallelism> make_ddp(Communicator& comm, TrainableSet trainable,
                                          std::unique_ptr<torch::optim::Optimizer> optimizer,
                                          std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                                          const CompressionOptions& compression) {
    return std::make_unique<DdpParallelism>(comm, std::move(trainable), std::move(optimizer),
                                            bucket_bytes, first_bucket_bytes, compression);
}

} // namespace trainscope::dist
