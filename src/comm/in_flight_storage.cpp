#include "fsdp/comm/in_flight_storage.h"

#include <mutex>
#include <unordered_map>

namespace fsdp::comm {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_multimap<const void*, const InFlightStorage*> holders;  // by StorageImpl*
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: works may end during exit
  return *instance;
}

}  // namespace

InFlightStorage::InFlightStorage(const std::vector<at::Tensor>& tensors, std::string description)
    : description_(std::move(description)) {
  for (const at::Tensor& tensor : tensors) {
    if (tensor.defined() && tensor.has_storage()) storages_.push_back(tensor.storage().unsafeGetStorageImpl());
  }
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (const void* storage : storages_) registry().holders.emplace(storage, this);
}

InFlightStorage::~InFlightStorage() { release(); }

void InFlightStorage::release() {
  if (released_.exchange(true)) return;
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (const void* storage : storages_) {
    auto [first, last] = registry().holders.equal_range(storage);
    for (auto it = first; it != last; ++it) {
      if (it->second == this) {
        registry().holders.erase(it);
        break;
      }
    }
  }
}

std::string collective_holding(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return "";
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto found = registry().holders.find(tensor.storage().unsafeGetStorageImpl());
  return found == registry().holders.end() ? "" : found->second->description();
}

}  // namespace fsdp::comm
