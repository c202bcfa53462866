#include "fsdp/checkpoint/hf_model_dir.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "fsdp/models/hf_config_reader.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

bool is_hf_model_dir(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error) && fs::exists(fs::path(path) / "config.json", error);
}

models::ModelConfig read_hf_config(const std::string& dir_or_file) {
  std::error_code error;
  const std::string file =
      fs::is_directory(dir_or_file, error) ? (fs::path(dir_or_file) / "config.json").string() : dir_or_file;
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot read model config '" + file + "'");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const std::exception& e) {
    throw std::runtime_error("model config '" + file + "' is not valid JSON: " + e.what());
  }
  if (!json.is_object()) throw std::runtime_error("model config '" + file + "' is not a JSON object");
  const models::HfConfigReader reader(json, file);
  const std::string type = reader.string_or("model_type", "");
  const models::ModelFamily* family = models::family_of_hf_model_type(type);
  if (family == nullptr) {
    std::string supported;
    for (const models::ModelFamily* f : models::model_families()) {
      for (const auto& t : f->hf_model_types()) supported += (supported.empty() ? "" : ", ") + t;
    }
    reader.fail(type.empty() ? "no model_type"
                             : "model_type '" + type + "' is not supported (supported: " + supported + ")");
  }
  const models::ModelConfig model = family->read_hf_config(reader);
  try {
    models::validate(model);
  } catch (const std::invalid_argument& e) {
    reader.fail(e.what());
  }
  return model;
}

namespace {

// The source config.json as JSON, or null when there is none to read.
nlohmann::json read_source_config(const std::string& path) {
  if (path.empty()) return nullptr;
  std::ifstream in(path);
  if (!in) return nullptr;
  try {
    nlohmann::json json;
    in >> json;
    return json;
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

std::string hf_config_text(const models::ModelConfig& model, const std::string& source_config,
                           const std::string& torch_dtype) {
  const nlohmann::json source = read_source_config(source_config);
  nlohmann::json out = nlohmann::json::object();
  // Keys that describe the tokenizer's ids, not the network: kept from the model's origin.
  if (source.is_object()) {
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (source.contains(key)) out[key] = source.at(key);
    }
  }
  models::family_of(model).write_hf_config(model, source, out);
  out["torch_dtype"] = torch_dtype;
  return out.dump(2) + "\n";
}

std::string hf_generation_config_text(const std::string& source_config, int64_t bos_token_id, int64_t eos_token_id,
                                      const std::vector<int64_t>& extra_eos) {
  const nlohmann::json source = read_source_config(source_config);
  nlohmann::json out = {{"_from_model_config", true}};
  if (source.is_object() && source.contains("bos_token_id")) {
    out["bos_token_id"] = source.at("bos_token_id");
  } else if (bos_token_id >= 0) {
    out["bos_token_id"] = bos_token_id;
  }
  if (source.is_object() && source.contains("eos_token_id")) {
    out["eos_token_id"] = source.at("eos_token_id");
  } else if (eos_token_id >= 0) {
    out["eos_token_id"] = eos_token_id;
  }
  if (!extra_eos.empty()) {
    nlohmann::json ids = nlohmann::json::array();
    if (out.contains("eos_token_id")) {
      if (out["eos_token_id"].is_array()) ids = out["eos_token_id"];
      else ids.push_back(out["eos_token_id"]);
    }
    for (int64_t id : extra_eos) {
      if (std::find(ids.begin(), ids.end(), nlohmann::json(id)) == ids.end()) ids.push_back(id);
    }
    out["eos_token_id"] = ids;
  }
  return out.dump(2) + "\n";
}

std::vector<std::string> tokenizer_files_in(const std::string& dir) {
  std::vector<std::string> found;
  if (dir.empty()) return found;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"}) {
    const fs::path path = fs::path(dir) / name;
    std::error_code error;
    if (fs::is_regular_file(path, error)) found.push_back(path.string());
  }
  return found;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw std::runtime_error("cannot write '" + path + "'");
    }
  }
  fs::rename(temporary, path);
}

}  // namespace fsdp::checkpoint
