#include "trainscope/models/projection.hpp"

#include <vector>

namespace trainscope::models {

LinearProjectionImpl::LinearProjectionImpl(std::int64_t in_features, std::int64_t out_features,
                                           const torch::TensorOptions& options)
    : ProjectionImpl(in_features, out_features) {
    weight = register_parameter("weight", torch::empty({out_features, in_features}, options));
    // torch.nn.Linear's default: kaiming-uniform(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)).
    torch::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight.uniform_(-bound, bound);
}

torch::Tensor LinearProjectionImpl::forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, weight);
}

namespace {

void visit(torch::nn::Module& module, const std::string& prefix, const ProjectionVisitor& fn) {
    // Copy the list first: fn may replace children while we walk.
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> children;
    for (const auto& item : module.named_children())
        children.emplace_back(item.key(), item.value());
    for (auto& [name, child] : children) {
        const std::string full = prefix.empty() ? name : prefix + "." + name;
        if (auto projection = std::dynamic_pointer_cast<ProjectionImpl>(child))
            fn(module, name, full, projection);
        else
            visit(*child, full, fn);
    }
}

} // namespace

void for_each_projection(torch::nn::Module& root, const ProjectionVisitor& fn) {
    visit(root, "", fn);
}

bool in_scope(const NameScope& scope, const std::string& name) {
    if (scope.empty()) return true;
    const std::string dotted = name + ".";
    for (const auto& prefix : scope)
        if (dotted.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
}

} // namespace trainscope::models
