// Reading a tokenizer's files: shared by the GPT-2 (tokenizer.cpp) and Hugging Face
// (hf_tokenizer.cpp) tokenizers.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace fsdp::data {

// The low 24 bits of the crc32 of the files' contents, in order (TokenizerStamp::checksum).
uint32_t files_checksum(std::initializer_list<std::string> paths);
// The file's JSON; std::runtime_error naming `what` and the path when unreadable or not JSON.
nlohmann::json read_json(const std::string& path, const std::string& what);

}  // namespace fsdp::data
