// fsdp/runtime/wrap_policy.h: which modules of a model become FSDP units.
//
// A unit is a module whose parameters are gathered and freed together. The policy selects modules
// by type name, by path, or (for the blocks a model adds with fsdp::nn::push_block) by size.
// Units do not nest: the outermost selected module wins. Parameters in no unit form the root unit.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::runtime {

struct WrapPolicy {
  // Modules whose type name (torch::nn::Module::name(), e.g. "Block" for BlockImpl) is listed.
  std::vector<std::string> module_types;
  // Blocks (modules added with fsdp::nn::push_block) holding at least this many parameters (0: off).
  // Only such blocks: any other module may be called directly by its model (an embedding looked
  // up with tokens(ids)), and a unit called directly would compute on freed parameters.
  int64_t min_params = 0;
  // Modules at these paths, e.g. "blocks.0" or "embed_tokens". With build_fully_sharded they are
  // applied once the model is built (blocks selected by type are sharded while it is built).
  std::vector<std::string> module_paths;

  bool empty() const { return module_types.empty() && min_params <= 0 && module_paths.empty(); }
  // Does the policy select `module` (at `path`, "" when not yet known)?
  bool selects(const torch::nn::Module& module, const std::string& path) const;
};

// "fsdp::models::BlockImpl" -> "Block": the name module_types match.
std::string short_type_name(const torch::nn::Module& module);

}  // namespace fsdp::runtime
