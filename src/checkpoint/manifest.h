// Private to checkpoint/: a sharded checkpoint's manifest.json, parsed and checked before any of
// it is used. No libtorch here, so the fuzz target (tests/fuzz/) builds it alone.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace fsdp::checkpoint {

constexpr const char* kManifestFormat = "fsdp.cpp sharded checkpoint";
// Version 1 recorded one crc32 per rank file only: its files are checked whole when opened.
constexpr int kOldestReadableVersion = 1;
constexpr int kNewestReadableVersion = 2;  // kCheckpointFormatVersion (sharded_checkpoint.h)

// The manifest `text` of the checkpoint in `dir` (named in errors): valid JSON, this format, a
// readable version, and every key the loaders read present with its type and range. Throws
// std::runtime_error naming the key otherwise.
nlohmann::json parse_manifest(const std::string& text, const std::string& dir);

}  // namespace fsdp::checkpoint
