#include "manifest.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace fsdp::checkpoint {

namespace {

using json = nlohmann::json;

// ceil(stored / files) without overflow (a manifest's numel may be any int64): what each of
// `files` rank files holds of a unit in versions 1 and 2, and the least it can hold in version 3.
int64_t even_per_file(int64_t stored, int64_t files) { return stored / files + (stored % files != 0); }

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
  // check(element, "key[i].") for every element of the array object[key], each an object.
  auto each_object = [&](const json& object, const char* key, const std::string& where, auto&& check) {
    if (!object.contains(key) || !object.at(key).is_array()) fail(where + "'" + key + "' is missing or not an array");
    for (size_t i = 0; i < object.at(key).size(); ++i) {
      const json& element = object.at(key)[i];
      const std::string at = where + key + "[" + std::to_string(i) + "]";
      if (!element.is_object()) fail(at + " is not an object");
      check(element, at + ".");
    }
  };
  integer(m, "step", "", 0);
  integer(m, "world_size", "", 1);
  if (m.at("world_size").get<int64_t>() > std::numeric_limits<int>::max())
    fail("'world_size' is not a number of ranks");
  each_object(m, "flat_params", "", [&](const json& flat, const std::string& where) {
    text(flat, "unit", where);
    integer(flat, "numel", where, 0);
    if (!flat.contains("trainable") || !flat.at("trainable").is_boolean())
      fail(where + "'trainable' is missing or not a boolean");
    if (flat.contains("nf4_bytes")) integer(flat, "nf4_bytes", where, 0);
    if (version >= 3) {
      // The files, stored_per_file each, must cover what the unit stores (its NF4 bytes or values).
      integer(flat, "stored_per_file", where, 1);
      const int64_t stored = stored_numel_of(flat), world = m.at("world_size").get<int64_t>();
      if (flat.at("stored_per_file").get<int64_t>() < even_per_file(stored, world)) {
        fail(where + "'stored_per_file' " + flat.at("stored_per_file").dump() + " in " + std::to_string(world) +
             " files cannot hold the unit's " + std::to_string(stored) + " stored elements");
      }
    }
    each_object(flat, "entries", where, [&](const json& entry, const std::string& at) {
      text(entry, "name", at);
      shape(entry, at);
      integer(entry, "offset", at, 0);
    });
  });
  each_object(m, "files", "", [&](const json& file, const std::string& where) {
    text(file, "file", where);
    integer(file, "bytes", where, 0);
    integer(file, "crc32", where, 0);
    if (version < 2) return;
    if (!file.contains("tensors") || !file.at("tensors").is_object())
      fail(where + "'tensors' is missing or not an object");
    for (const auto& [name, crc] : file.at("tensors").items()) {
      if (!crc.is_number_unsigned()) fail(where + "tensors['" + name + "'] is not a crc32");
    }
  });
  if (m.contains("buffers")) {
    each_object(m, "buffers", "", [&](const json& buffer, const std::string& where) {
      text(buffer, "name", where);
      text(buffer, "dtype", where);
      shape(buffer, where);
    });
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

int64_t stored_numel_of(const json& unit) {
  const int64_t nf4_bytes = unit.value("nf4_bytes", int64_t{0});
  return nf4_bytes > 0 ? nf4_bytes : unit.at("numel").get<int64_t>();
}

int64_t stored_per_file_of(const json& unit, const json& manifest) {
  if (manifest.at("version").get<int>() >= 3) return unit.at("stored_per_file").get<int64_t>();
  return even_per_file(stored_numel_of(unit), manifest.at("world_size").get<int64_t>());
}

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
    throw std::runtime_error("checkpoint '" + dir + "': format version " + std::to_string(version) +
                             ", this build reads versions " + std::to_string(kOldestReadableVersion) + " to " +
                             std::to_string(kNewestReadableVersion));
  }
  validate_manifest(manifest, dir, version);
  return manifest;
}

}  // namespace fsdp::checkpoint
