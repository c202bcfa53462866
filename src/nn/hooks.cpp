#include "fsdp/nn/hooks.h"

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace fsdp::nn {
namespace {

struct HookRegistry {
  std::shared_mutex mutex;
  // unique_ptr: the ForwardHooks address handed out by find_forward_hooks stays put on rehash.
  std::unordered_map<const torch::nn::Module*, std::unique_ptr<ForwardHooks>> hooks;
};

HookRegistry& registry() {
  static HookRegistry instance;
  return instance;
}

thread_local BlockBuiltListener t_block_listener;

}  // namespace

void set_forward_hooks(const torch::nn::Module* module, ForwardHooks hooks) {
  std::unique_lock<std::shared_mutex> lock(registry().mutex);
  registry().hooks[module] = std::make_unique<ForwardHooks>(std::move(hooks));
}

void clear_forward_hooks(const torch::nn::Module* module) {
  std::unique_lock<std::shared_mutex> lock(registry().mutex);
  registry().hooks.erase(module);
}

const ForwardHooks* find_forward_hooks(const torch::nn::Module* module) {
  std::shared_lock<std::shared_mutex> lock(registry().mutex);
  auto it = registry().hooks.find(module);
  return it == registry().hooks.end() ? nullptr : it->second.get();
}

ScopedBlockBuiltListener::ScopedBlockBuiltListener(BlockBuiltListener listener)
    : previous_(std::move(t_block_listener)) {
  t_block_listener = std::move(listener);
}

ScopedBlockBuiltListener::~ScopedBlockBuiltListener() { t_block_listener = std::move(previous_); }

void notify_block_built(const std::shared_ptr<torch::nn::Module>& block) {
  if (t_block_listener) t_block_listener(block);
}

}  // namespace fsdp::nn
