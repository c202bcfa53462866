// fsdp/models/hf_config_reader.h: typed reads from a Hugging Face config.json (or one of its
// sections), every failure naming the file and the key. A family's spec reads its config.json
// through it (ModelFamily::read_hf_config).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdp::models {

class HfConfigReader {
 public:
  // `json` must outlive the reader; `file` names it in errors ("dir/config.json (text_config)").
  HfConfigReader(const nlohmann::json& json, std::string file) : json_(json), file_(std::move(file)) {}

  const nlohmann::json& json() const { return json_; }
  const std::string& file() const { return file_; }
  bool has(const char* key) const;  // present and not null

  int64_t integer(const char* key) const;  // required
  int64_t integer_or(const char* key, int64_t fallback) const;
  double number_or(const char* key, double fallback) const;
  bool boolean_or(const char* key, bool fallback) const;
  std::string string_or(const char* key, const std::string& fallback) const;
  // A section of a composite config (text_config, vision_config): {} when absent or null.
  nlohmann::json section(const char* key) const;
  // Refuses a key whose only supported value is `expected` (where present), saying why.
  void require_value(const char* key, const nlohmann::json& expected, const std::string& why) const;
  [[noreturn]] void fail(const std::string& what) const;  // std::runtime_error "file: what"

 private:
  const nlohmann::json& required(const char* key) const;
  const nlohmann::json& json_;
  std::string file_;
};

}  // namespace fsdp::models
