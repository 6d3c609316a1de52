// The fused optimizer steps (distributed/fused_optim.hpp, train.fused_optimizer=true) against
// LibTorch's per-parameter torch::optim::AdamW / SGD and dist::adamw_update, the arithmetic every
// run used before: several steps on parameters of several shapes (one without a gradient in one
// step), in fp64 to 1e-12 and fp32 to 1e-6; the state survives save/load into a fresh fused
// optimizer; the multi-tensor scale and non-finite marker match their per-tensor forms.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/train/optimizer.hpp"

namespace dist = trainscope::dist;
namespace tt = trainscope::train;

namespace {

std::vector<torch::Tensor> optim_make_params(torch::ScalarType dtype) {
    torch::manual_seed(21);
    std::vector<torch::Tensor> ps;
    for (auto shape : std::vector<std::vector<std::int64_t>>{{7, 5}, {5}, {3, 4, 2}, {1}})
        ps.push_back(torch::randn(shape, torch::dtype(dtype)).requires_grad_(true));
    return ps;
}

std::vector<torch::Tensor> optim_clones(const std::vector<torch::Tensor>& v) {
    std::vector<torch::Tensor> out;
    for (const auto& t : v)
        out.push_back(t.detach().clone().requires_grad_(true));
    return out;
}

// Steps both optimizers with the same seeded gradients; the parameter at index 1 has no gradient
// in step 2 (it must not step, nor count a step).
void optim_step_both(torch::optim::Optimizer& a, std::vector<torch::Tensor>& pa,
                     torch::optim::Optimizer& b, std::vector<torch::Tensor>& pb, int steps,
                     int first = 0) {
    for (int s = first; s < first + steps; ++s) {
        torch::manual_seed(100 + s);
        for (std::size_t i = 0; i < pa.size(); ++i) {
            if (s == 2 && i == 1) {
                pa[i].mutable_grad() = torch::Tensor();
                pb[i].mutable_grad() = torch::Tensor();
                continue;
            }
            torch::Tensor g = torch::randn_like(pa[i]);
            pa[i].mutable_grad() = g.clone();
            pb[i].mutable_grad() = g.clone();
        }
        a.step();
        b.step();
    }
}

double optim_max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double d = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
    return d;
}

} // namespace

TEST(FusedOptimizer, AdamWAndSgdEqualLibTorchsLoop) {
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
        const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
        struct Case {
            const char* kind;
            double momentum;
            bool nesterov;
            double wd;
        };
        for (const Case& c : {Case{"adamw", 0, false, 0.01}, Case{"adamw", 0, false, 0.0},
                              Case{"sgd", 0.0, false, 1e-3}, Case{"sgd", 0.9, false, 1e-3},
                              Case{"sgd", 0.9, true, 0.0}}) {
            tt::OptimizerConfig cfg;
            cfg.kind = c.kind;
            cfg.lr = 0.01;
            cfg.momentum = c.momentum;
            cfg.nesterov = c.nesterov;
            cfg.weight_decay = c.wd;
            auto pa = optim_make_params(dtype), pb = optim_clones(pa);
            cfg.fused = false;
            auto loop = tt::make_optimizer(cfg, pa, true);
            cfg.fused = true;
            auto fused = tt::make_optimizer(cfg, pb, true);
            ASSERT_NE(dynamic_cast<dist::FusedAdamW*>(fused.get()) ||
                          dynamic_cast<dist::FusedSGD*>(fused.get()),
                      false);
            optim_step_both(*loop, pa, *fused, pb, 5);
            EXPECT_LT(optim_max_diff(pa, pb), tol)
                << c.kind << " momentum " << c.momentum << " " << torch::toString(dtype);
            EXPECT_GT(optim_max_diff(pa, optim_make_params(dtype)), 1e-4); // they moved

            // The fused optimizer's state is LibTorch's: saved and loaded into a fresh fused
            // optimizer, it continues as the loop does (AdamW's step counts included).
            std::stringstream buf;
            {
                torch::serialize::OutputArchive out;
                fused->save(out);
                out.save_to(buf);
            }
            auto pc = optim_clones(pb);
            auto resumed = tt::make_optimizer(cfg, pc, true);
            {
                torch::serialize::InputArchive in;
                in.load_from(buf);
                resumed->load(in);
            }
            auto pa2 = pa;
            optim_step_both(*loop, pa2, *resumed, pc, 2, 5);
            EXPECT_LT(optim_max_diff(pa2, pc), tol) << c.kind << " after load";
        }
    }
}

TEST(FusedOptimizer, ShardUpdateEqualsAdamwUpdate) {
    for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
        const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
        dist::ZeroAdamW h;
        h.weight_decay = 0.05;
        auto pa = optim_make_params(dtype), pb = optim_clones(pa);
        std::vector<torch::Tensor> ma, va, mb, vb;
        for (const auto& p : pa) {
            ma.push_back(torch::zeros_like(p));
            va.push_back(torch::zeros_like(p));
            mb.push_back(torch::zeros_like(p));
            vb.push_back(torch::zeros_like(p));
        }
        torch::NoGradGuard no_grad;
        for (std::int64_t step = 1; step <= 4; ++step) {
            std::vector<torch::Tensor> grads;
            for (auto& p : pa) {
                grads.push_back(torch::randn_like(p));
            }
            for (std::size_t i = 0; i < pa.size(); ++i) {
                torch::Tensor p = pa[i].detach();
                dist::adamw_update(p, grads[i], ma[i], va[i], step, 1e-2, h);
            }
            std::vector<torch::Tensor> db;
            for (auto& p : pb)
                db.push_back(p.detach());
            dist::fused_adamw_update(db, grads, mb, vb, step, 1e-2, h);
        }
        EXPECT_LT(optim_max_diff(pa, pb), tol);
        EXPECT_LT(optim_max_diff(va, vb), tol);
    }
}

TEST(FusedOptimizer, ForeachScaleAndNonfiniteMarker) {
    const auto cpu = torch::Device(torch::kCPU);
    std::vector<torch::Tensor> ts = {torch::randn({4, 3}, torch::kFloat64), torch::Tensor(),
                                     torch::randn({5}, torch::kFloat32),
                                     torch::randn({2}, torch::kBFloat16)};
    std::vector<torch::Tensor> before;
    for (const auto& t : ts)
        before.push_back(t.defined() ? t.clone() : t);
    dist::foreach_scale(ts, 0.25);
    for (std::size_t i = 0; i < ts.size(); ++i)
        if (ts[i].defined()) EXPECT_TRUE(torch::equal(ts[i], before[i] * 0.25)) << i;

    torch::Tensor ok = dist::nonfinite_marker(ts, cpu);
    EXPECT_EQ(ok.scalar_type(), torch::kFloat64);
    EXPECT_EQ(ok.item<double>(), 0.0);
    for (std::size_t i = 0; i < ts.size(); ++i)
        if (ts[i].defined()) EXPECT_TRUE(torch::equal(ts[i], before[i] * 0.25)) << i; // unchanged
    for (const double bad :
         {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
        for (std::size_t i : {std::size_t{0}, std::size_t{2}, std::size_t{3}}) {
            std::vector<torch::Tensor> v = {ts[0].clone(), ts[2].clone(), ts[3].clone()};
            v[i == 0 ? 0 : (i == 2 ? 1 : 2)].view({-1})[1] = bad;
            EXPECT_TRUE(std::isnan(dist::nonfinite_marker(v, cpu).item<double>()))
                << "tensor " << i << " value " << bad;
        }
    EXPECT_EQ(dist::nonfinite_marker({}, cpu).item<double>(), 0.0);
}
