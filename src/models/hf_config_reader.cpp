#include "fsdp/models/hf_config_reader.h"

#include <stdexcept>

namespace fsdp::models {

bool HfConfigReader::has(const char* key) const { return json_.contains(key) && !json_.at(key).is_null(); }

int64_t HfConfigReader::integer(const char* key) const {
  const auto& value = required(key);
  if (!value.is_number_integer()) fail(std::string(key) + " must be an integer, got " + value.dump());
  return value.get<int64_t>();
}

int64_t HfConfigReader::integer_or(const char* key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

double HfConfigReader::number_or(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const auto& value = json_.at(key);
  if (!value.is_number()) fail(std::string(key) + " must be a number, got " + value.dump());
  return value.get<double>();
}

bool HfConfigReader::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& value = json_.at(key);
  if (!value.is_boolean()) fail(std::string(key) + " must be true or false, got " + value.dump());
  return value.get<bool>();
}

std::string HfConfigReader::string_or(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& value = json_.at(key);
  if (!value.is_string()) fail(std::string(key) + " must be a string, got " + value.dump());
  return value.get<std::string>();
}

nlohmann::json HfConfigReader::section(const char* key) const {
  if (!has(key)) return nlohmann::json::object();
  if (!json_.at(key).is_object()) fail(std::string(key) + " must be an object, got " + json_.at(key).dump());
  return json_.at(key);
}

void HfConfigReader::require_value(const char* key, const nlohmann::json& expected, const std::string& why) const {
  if (has(key) && json_.at(key) != expected)
    fail(std::string(key) + " = " + json_.at(key).dump() + " is not supported (" + why + ")");
}

void HfConfigReader::fail(const std::string& what) const { throw std::runtime_error(file_ + ": " + what); }

const nlohmann::json& HfConfigReader::required(const char* key) const {
  if (!has(key)) fail(std::string("missing key '") + key + "'");
  return json_.at(key);
}

}  // namespace fsdp::models
