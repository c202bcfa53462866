// src/data/utf8_repair.h: bytes -> valid UTF-8, for showing decoded tokens.
//
// A byte-level tokenizer's ids decode to bytes, and a sampled sequence may stop inside a character
// or hold bytes no character starts with. Decoders return valid UTF-8 all the same, the way
// Hugging Face's ByteLevel decoder does (Rust's String::from_utf8_lossy): each maximal stretch that
// is no character, or a character's cut-off start, becomes one U+FFFD ("substitution of maximal
// subparts", Unicode 15 section 3.9; also Python's bytes.decode("utf-8", "replace")).
#pragma once

#include <string>

namespace fsdp::data {

std::string replace_invalid_utf8(const std::string& bytes);

}  // namespace fsdp::data
