// Private to checkpoint/: a sharded checkpoint's manifest.json, parsed and checked before any of
// it is used. No libtorch here, so the fuzz target (tests/fuzz/) builds it alone.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace fsdp::checkpoint {

constexpr const char* kManifestFormat = "fsdp.cpp sharded checkpoint";
// Version 1 recorded one crc32 per rank file only: its files are checked whole when opened.
// Versions 1 and 2 stored ceil(numel / world) elements of each unit per file; version 3 records
// that number per unit ("stored_per_file"), the shards' own (aligned) size.
constexpr int kOldestReadableVersion = 1;
constexpr int kNewestReadableVersion = 3;  // kCheckpointFormatVersion (sharded_checkpoint.h)

// What a unit of a parsed manifest's "flat_params" stores (flat_ranges.h): its NF4 bytes, or its
// values' numel.
int64_t stored_numel_of(const nlohmann::json& unit);
// Of that, what each rank file of a parsed manifest holds: "stored_per_file" from version 3 on;
// before, ceil(stored / world_size).
int64_t stored_per_file_of(const nlohmann::json& unit, const nlohmann::json& manifest);

// The manifest `text` of the checkpoint in `dir` (named in errors): valid JSON, this format, a
// readable version, and every key the loaders read present with its type and range. Throws
// std::runtime_error naming the key otherwise.
nlohmann::json parse_manifest(const std::string& text, const std::string& dir);

}  // namespace fsdp::checkpoint
