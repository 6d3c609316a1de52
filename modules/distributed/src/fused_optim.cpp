#include "trainscope/distributed/fused_optim.hpp"

#include <limits>
#include <map>
#include <tuple>

namespace trainscope::dist {

namespace {

using GroupKey = std::tuple<int, int, int>; // device type, device index, dtype

GroupKey key_of(const torch::Tensor& t) {
    return {static_cast<int>(t.device().type()), t.device().index(),
            static_cast<int>(t.scalar_type())};
}

// Indices of `tensors` by (device, dtype): the fused kernels take one group per call.
std::map<GroupKey, std::vector<std::size_t>> groups_of(const std::vector<torch::Tensor>& tensors) {
    std::map<GroupKey, std::vector<std::size_t>> g;
    for (std::size_t i = 0; i < tensors.size(); ++i)
        if (tensors[i].defined()) g[key_of(tensors[i])].push_back(i);
    return g;
}

std::vector<torch::Tensor> pick(const std::vector<torch::Tensor>& v,
                                const std::vector<std::size_t>& idx) {
    std::vector<torch::Tensor> out;
    out.reserve(idx.size());
    for (std::size_t i : idx)
        out.push_back(v[i]);
    return out;
}

// The loss closure, as torch.optim's step(closure) runs it: with grad enabled.
torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
    if (!closure) return {};
    torch::AutoGradMode enable(true);
    return closure();
}

} // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
    for (const auto& group : param_groups()) {
        const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
        if (o.amsgrad()) return torch::optim::AdamW::step(closure);
    }
    torch::Tensor loss = run_closure(closure);
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
        const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
        std::vector<torch::Tensor> params, grads, avgs, sqs, steps;
        for (auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
            auto& slot = state_[p.unsafeGetTensorImpl()];
            if (!slot) {
                auto s = std::make_unique<torch::optim::AdamWParamState>();
                s->step(0);
                s->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
                s->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
                slot = std::move(s);
            }
            auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
            s.step(s.step() + 1);
            Step& st = steps_[p.unsafeGetTensorImpl()];
            if (st.count != s.step()) { // first step, or the state was loaded
                st.tensor = torch::full({}, static_cast<double>(s.step()),
                                        torch::dtype(torch::kFloat32).device(p.device()));
                st.count = s.step();
            }
            params.push_back(p);
            grads.push_back(p.grad());
            avgs.push_back(s.exp_avg());
            sqs.push_back(s.exp_avg_sq());
            steps.push_back(st.tensor);
        }
        for (const auto& [key, idx] : groups_of(params)) {
            std::vector<torch::Tensor> ps = pick(params, idx), ss = pick(steps, idx);
            (void)key;
            at::_fused_adamw_(ps, pick(grads, idx), pick(avgs, idx), pick(sqs, idx), {}, ss, o.lr(),
                              std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(),
                              o.eps(), /*amsgrad=*/false, /*maximize=*/false);
        }
        // The step tensors count one ahead of the kernel's next read.
        if (!steps.empty()) torch::_foreach_add_(steps, 1.0);
        for (auto& p : params)
            ++steps_[p.unsafeGetTensorImpl()].count;
    }
    return loss;
}

torch::Tensor FusedSGD::step(LossClosure closure) {
    torch::Tensor loss = run_closure(closure);
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
        const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
        // Parameters whose momentum buffer starts now and the others: the kernel's first step
        // copies the gradient into the (empty) buffer, as torch.optim.SGD's clone.
        std::vector<torch::Tensor> params[2], grads[2], bufs[2];
        for (auto& p : group.params()) {
            if (!p.grad().defined()) continue;
            int first = 0;
            if (o.momentum() != 0) {
                auto& slot = state_[p.unsafeGetTensorImpl()];
                if (!slot) {
                    auto s = std::make_unique<torch::optim::SGDParamState>();
                    s->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
                    slot = std::move(s);
                    first = 1;
                }
                bufs[first].push_back(
                    static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
            }
            params[first].push_back(p);
            grads[first].push_back(p.grad());
        }
        for (int first = 0; first < 2; ++first)
            for (const auto& [key, idx] : groups_of(params[first])) {
                (void)key;
                std::vector<torch::Tensor> ps = pick(params[first], idx);
                at::_fused_sgd_(ps, pick(grads[first], idx),
                                o.momentum() != 0 ? pick(bufs[first], idx)
                                                  : std::vector<torch::Tensor>{},
                                o.weight_decay(), o.momentum(), o.lr(), o.dampening(), o.nesterov(),
                                /*maximize=*/false, /*is_first_step=*/first == 1);
            }
    }
    return loss;
}

void fused_adamw_update(const std::vector<torch::Tensor>& params,
                        const std::vector<torch::Tensor>& grads,
                        const std::vector<torch::Tensor>& exp_avgs,
                        const std::vector<torch::Tensor>& exp_avg_sqs, std::int64_t step, double lr,
                        const ZeroAdamW& h) {
    torch::NoGradGuard no_grad;
    for (const auto& [key, idx] : groups_of(params)) {
        (void)key;
        std::vector<torch::Tensor> ps = pick(params, idx), steps;
        for (std::size_t i = 0; i < ps.size(); ++i)
            steps.push_back(torch::full({}, static_cast<double>(step),
                                        torch::dtype(torch::kFloat32).device(ps[i].device())));
        at::_fused_adamw_(ps, pick(grads, idx), pick(exp_avgs, idx), pick(exp_avg_sqs, idx), {},
                          steps, lr, h.beta1, h.beta2, h.weight_decay, h.eps, /*amsgrad=*/false,
                          /*maximize=*/false);
    }
}

void foreach_scale(const std::vector<torch::Tensor>& tensors, double factor) {
    torch::NoGradGuard no_grad;
    for (const auto& [key, idx] : groups_of(tensors)) {
        (void)key;
        std::vector<torch::Tensor> ts = pick(tensors, idx);
        torch::_foreach_mul_(ts, factor);
    }
}

torch::Tensor nonfinite_marker(const std::vector<torch::Tensor>& tensors,
                               const torch::Device& fallback) {
    torch::NoGradGuard no_grad;
    torch::Tensor flag;
    for (const auto& [key, idx] : groups_of(tensors)) {
        (void)key;
        std::vector<torch::Tensor> ts = pick(tensors, idx);
        const auto opts = torch::dtype(torch::kFloat32).device(ts.front().device());
        torch::Tensor found;
        const torch::ScalarType dtype = ts.front().scalar_type();
        if (dtype == torch::kFloat32 || dtype == torch::kFloat64 || dtype == torch::kHalf) {
            found = torch::zeros({1}, opts);
            at::_amp_foreach_non_finite_check_and_unscale_(ts, found, torch::ones({1}, opts));
        } else {
            // The AMP kernel has no bf16 variant on CUDA ("not implemented for 'BFloat16'": pure
            // bf16 training, e.g. the 8B inputs). A tensor's sum of magnitudes (fp32) is NaN or
            // infinite when any element is (a sum propagates both, whatever a kernel's max does
            // with NaN; a finite sum past 3.4e38 would need gradients near bf16's own limit):
            // one multi-tensor kernel, one check.
            const std::vector<torch::Tensor> sums = at::_foreach_norm(ts, 1, torch::kFloat32);
            found = torch::logical_not(torch::isfinite(torch::stack(sums)))
                        .any()
                        .to(torch::kFloat32)
                        .reshape({1});
        }
        flag = flag.defined() ? torch::maximum(flag, found.to(flag.device())) : found;
    }
    if (!flag.defined()) return torch::zeros({}, torch::dtype(torch::kFloat64).device(fallback));
    const torch::Tensor f = flag.reshape({}).to(torch::kFloat64);
    return torch::where(f > 0, std::numeric_limits<double>::quiet_NaN(), 0.0).to(torch::kFloat64);
}

} // namespace trainscope::dist
