// The chat formats whose templates put a turn's header and its text in one stretch of text (ChatML,
// Mistral's [INST], Gemma's <start_of_turn>): a conversation is rendered as the template renders it,
// one string, encoded once, as transformers' apply_chat_template then encode does; the trained
// tokens are found from the byte ranges of the assistant's turns.
//
// Why one renderer per format and not a Jinja engine: the formats are few and fixed, each is checked
// against its template in transformers (tests/hf/check_chat_formats.py), and the template alone
// cannot say which tokens are the assistant's: that needs {% generation %} marks the published
// templates lack. A Jinja engine (llama.cpp's minja) would be a larger thing to trust than these.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/data/instructions.h"

namespace fsdp::data {

struct ChatText {
  std::string text;
  Tokenizer::ByteRanges contents;  // the messages' own text (literal under split_special_tokens)
  Tokenizer::ByteRanges trained;   // the assistant's answers and the tokens that end them
};

// add_generation_prompt: end with the assistant's header, as for generation.
// ChatML (Qwen2.5 when a system message is given, and the generic form transformers documents):
//   per message <|im_start|>{role}\n{content}<|im_end|>\n; trained: content<|im_end|>
ChatText chatml_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt);
// Mistral's v3 instruct format (Mistral 7B Instruct v0.3, Nemo; mistral-common's InstructTokenizerV3):
//   <s>[INST] {user}[/INST] {assistant, trimmed}</s>..., a system message put before the last user
//   message's text with "\n\n"; user and assistant alternate. Trained: " {assistant}</s>".
ChatText mistral_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt);
// Gemma 3: <bos><start_of_turn>user\n{system + "\n\n" if first}{content, trimmed}<end_of_turn>\n
//   <start_of_turn>model\n{content, trimmed}<end_of_turn>\n ...; user and model alternate.
//   Trained: {content}<end_of_turn>.
ChatText gemma_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// The text encoded once; a token is trained where it holds a byte of a trained range (one made
// across a range's edge included, as transformers' assistant mask has it).
RenderedExample encode_chat_text(const ChatText& chat, const Tokenizer& tokenizer, ContentSpecialTokens content);

// Python's str.strip() (Jinja's `trim`): Unicode whitespace at both ends removed.
std::string python_strip(const std::string& text);

}  // namespace fsdp::data
