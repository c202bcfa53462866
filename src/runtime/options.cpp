#include "fsdp/runtime/options.h"

#include <stdexcept>

namespace fsdp::runtime {

const char* to_string(ShardingStrategy strategy) { return enum_name(strategy); }

ShardingStrategy sharding_strategy_from_string(const std::string& name) {
  try {
    return enum_from_name<ShardingStrategy>(name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("unknown sharding strategy ") + e.what());
  }
}

}  // namespace fsdp::runtime
