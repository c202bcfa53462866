#include "manifest.h"

#include <stdexcept>
#include <string>

namespace fsdp::checkpoint {

namespace {

using json = nlohmann::json;

// Every key the loaders read, with its type, checked before any is used (a manifest edited by
// hand or damaged must be refused, naming the key, not read as undefined behaviour).
void validate_manifest(const json& m, const std::string& dir, int version) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error("checkpoint '" + dir + "': manifest.json: " + what);
  };
  auto integer = [&](const json& object, const char* key, const std::string& where, int64_t least) {
    if (!object.is_object() || !object.contains(key) || !object.at(key).is_number_integer()) {
      fail(where + "'" + key + "' is missing or not an integer");
    }
    if (object.at(key).get<int64_t>() < least) fail(where + "'" + key + "' must be at least " + std::to_string(least));
  };
  auto text = [&](const json& object, const char* key, const std::string& where) {
    if (!object.contains(key) || !object.at(key).is_string()) fail(where + "'" + key + "' is missing or not a string");
  };
  auto shape = [&](const json& object, const std::string& where) {
    if (!object.contains("shape") || !object.at("shape").is_array()) fail(where + "'shape' is missing or not an array");
    for (const auto& d : object.at("shape")) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where + "'shape' holds " + d.dump() + ", not a size");
    }
  };
  integer(m, "step", "", 0);
  integer(m, "world_size", "", 1);
  if (!m.contains("flat_params") || !m.at("flat_params").is_array()) fail("'flat_params' is missing or not an array");
  for (size_t i = 0; i < m.at("flat_params").size(); ++i) {
    const json& flat = m.at("flat_params")[i];
    const std::string where = "flat_params[" + std::to_string(i) + "].";
    if (!flat.is_object()) fail(where.substr(0, where.size() - 1) + " is not an object");
    text(flat, "unit", where);
    integer(flat, "numel", where, 0);
    if (!flat.contains("trainable") || !flat.at("trainable").is_boolean()) fail(where + "'trainable' is missing or not a boolean");
    if (!flat.contains("entries") || !flat.at("entries").is_array()) fail(where + "'entries' is missing or not an array");
    for (size_t j = 0; j < flat.at("entries").size(); ++j) {
      const json& entry = flat.at("entries")[j];
      const std::string at = where + "entries[" + std::to_string(j) + "].";
      if (!entry.is_object()) fail(at.substr(0, at.size() - 1) + " is not an object");
      text(entry, "name", at);
      shape(entry, at);
      integer(entry, "offset", at, 0);
    }
  }
  if (!m.contains("files") || !m.at("files").is_array()) fail("'files' is missing or not an array");
  for (size_t r = 0; r < m.at("files").size(); ++r) {
    const json& file = m.at("files")[r];
    const std::string where = "files[" + std::to_string(r) + "].";
    if (!file.is_object()) fail(where.substr(0, where.size() - 1) + " is not an object");
    text(file, "file", where);
    integer(file, "bytes", where, 0);
    integer(file, "crc32", where, 0);
    if (version >= 2 && (!file.contains("tensors") || !file.at("tensors").is_object())) fail(where + "'tensors' is missing or not an object");
    if (version >= 2) {
      for (const auto& [name, crc] : file.at("tensors").items()) {
        if (!crc.is_number_unsigned()) fail(where + "tensors['" + name + "'] is not a crc32");
      }
    }
  }
  if (m.contains("buffers")) {
    if (!m.at("buffers").is_array()) fail("'buffers' is not an array");
    for (size_t i = 0; i < m.at("buffers").size(); ++i) {
      const json& buffer = m.at("buffers")[i];
      const std::string where = "buffers[" + std::to_string(i) + "].";
      if (!buffer.is_object()) fail(where.substr(0, where.size() - 1) + " is not an object");
      text(buffer, "name", where);
      text(buffer, "dtype", where);
      shape(buffer, where);
    }
  }
  for (const char* key : {"model", "config_toml", "optimizer"}) {
    if (m.contains(key) && !m.at(key).is_string()) fail(std::string("'") + key + "' is not a string");
  }
  if (m.contains("optimizer_steps")) integer(m, "optimizer_steps", "", 0);
  if (m.contains("optimizer_state")) {
    if (!m.at("optimizer_state").is_array()) fail("'optimizer_state' is not an array");
    for (const auto& name : m.at("optimizer_state")) {
      if (!name.is_string()) fail("'optimizer_state' holds " + name.dump() + ", not a name");
    }
  }
}

}  // namespace

json parse_manifest(const std::string& text, const std::string& dir) {
  json manifest;
  try {
    manifest = json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint '" + dir + "': manifest.json is not valid JSON: " + e.what());
  }
  if (!manifest.is_object() || !manifest.contains("format") || manifest.at("format") != kManifestFormat) {
    throw std::runtime_error("checkpoint '" + dir + "': manifest.json is not a " + std::string(kManifestFormat));
  }
  if (!manifest.contains("version") || !manifest.at("version").is_number_integer()) {
    throw std::runtime_error("checkpoint '" + dir + "': manifest.json: 'version' is missing or not an integer");
  }
  const int version = manifest.at("version").get<int>();
  if (version < kOldestReadableVersion || version > kNewestReadableVersion) {
    throw std::runtime_error("checkpoint '" + dir + "': format version " + std::to_string(version) + ", this build reads versions " +
                             std::to_string(kOldestReadableVersion) + " to " + std::to_string(kNewestReadableVersion));
  }
  validate_manifest(manifest, dir, version);
  return manifest;
}

}  // namespace fsdp::checkpoint
