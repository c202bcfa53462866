#include "fsdp/nn/hooks.h"

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
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
thread_local const torch::nn::Module* t_parameter_free_backward = nullptr;

// Every block given to push_block, by address; weak, so a destroyed block (whose address may be
// reused) is not taken for a pushed one.
struct PushedBlocks {
  std::mutex mutex;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> blocks;
};

PushedBlocks& pushed_blocks() {
  static PushedBlocks instance;
  return instance;
}

}  // namespace

void backward_reads_no_parameters(const torch::nn::Module& module) { t_parameter_free_backward = &module; }

namespace detail {
const torch::nn::Module* parameter_free_backward_said() { return t_parameter_free_backward; }

const torch::nn::Module* exchange_parameter_free_backward(const torch::nn::Module* module) {
  const torch::nn::Module* before = t_parameter_free_backward;
  t_parameter_free_backward = module;
  return before;
}
}  // namespace detail

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
  {
    std::lock_guard<std::mutex> lock(pushed_blocks().mutex);
    auto& blocks = pushed_blocks().blocks;
    for (auto it = blocks.begin(); it != blocks.end();) it = it->second.expired() ? blocks.erase(it) : std::next(it);
    blocks[block.get()] = block;
  }
  if (t_block_listener) t_block_listener(block, "");
}

void announce_built(const std::shared_ptr<torch::nn::Module>& module, const std::string& name) {
  if (name.empty()) throw std::invalid_argument("fsdp::nn::announce_built: the module's name is empty");
  if (t_block_listener) t_block_listener(module, name);
}

bool is_pushed_block(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(pushed_blocks().mutex);
  auto found = pushed_blocks().blocks.find(module);
  return found != pushed_blocks().blocks.end() && !found->second.expired();
}

}  // namespace fsdp::nn
