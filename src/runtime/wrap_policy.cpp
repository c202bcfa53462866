#include "fsdp/runtime/wrap_policy.h"

#include <unordered_set>

#include "fsdp/nn/hooks.h"

namespace fsdp::runtime {

std::string short_type_name(const torch::nn::Module& module) {
  std::string name = module.name();
  auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const std::string suffix = "Impl";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return name;
}

namespace {

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t total = 0;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) total += p.numel();
  }
  return total;
}

}  // namespace

bool WrapPolicy::selects(const torch::nn::Module& module, const std::string& path) const {
  const std::string type = short_type_name(module);
  for (const std::string& wanted : module_types) {
    if (wanted == type || wanted == module.name()) return true;
  }
  for (const std::string& wanted : module_paths) {
    if (!path.empty() && wanted == path) return true;
  }
  return min_params > 0 && fsdp::nn::is_pushed_block(&module) && parameter_count(module) >= min_params;
}

}  // namespace fsdp::runtime
