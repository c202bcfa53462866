// fsdp/data/instructions.h: instruction data for fine-tuning, as torchtune and TRL read it.
//
// JSONL, one example per line, either
//   {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
//   {"prompt": "...", "completion": "..."}      (a user turn and the assistant's answer)
// rendered into tokens with the family's chat format, as its tokenizer_config.json's template does:
//   llama3   <|begin_of_text|> then per message
//            <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
//   chatml   (Qwen) per message <|im_start|>{role}\n{content}<|im_end|>\n
//   mistral  (v3 instruct) <s>[INST] {user}[/INST] {assistant, trimmed}</s>..., the system
//            message before the last user message's text
//   gemma    (Gemma 3) <bos><start_of_turn>user\n{content, trimmed}<end_of_turn>\n
//            <start_of_turn>model\n..., the system message before the first user message's text
//   plain    the contents back to back, then the end-of-text token where the vocabulary has one
//            (GPT-2: prompt + completion + <|endoftext|>)
// (src/data/chat_text.h has the exact forms.) Only the assistant's tokens are trained: its content
// and the token that ends its turn (<|eot_id|>, <|im_end|>, </s>, <end_of_turn>, or end-of-text);
// headers, system and user turns are context.
//
// Each example is one row of the batch, padded to the window: rows never attend to each other, so
// an example's loss does not depend on its neighbours (data.packing puts several in a row instead,
// each still seeing only itself: data/packed_instructions.h). Targets are -100 (ignored by the loss)
// wherever no trained token is predicted, padding included.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/data/chat_format.h"
#include "fsdp/data/datasets.h"
#include "fsdp/data/tokenizer.h"

namespace fsdp::data {

constexpr int64_t kIgnoredTarget = -100;  // cross-entropy's ignore_index

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct InstructionExample {
  std::vector<ChatMessage> messages;
  int64_t line = 0;  // 1-based line of the file it came from (0: not from a file)
};

// Reads a JSONL file of examples (blank lines skipped). Throws std::runtime_error naming the file
// and line: not JSON, neither form, an unknown role, a non-string content, no assistant turn.
std::vector<InstructionExample> read_instruction_jsonl(const std::string& path);
// One line's example (line numbers for messages only).
InstructionExample parse_instruction_line(const std::string& text, const std::string& where);

// The format a run renders in: `requested` (data.chat_format), or where empty ("auto") the first of
// llama3, chatml, mistral, gemma whose tokens the tokenizer has, else plain. Throws
// std::invalid_argument for a format on a tokenizer without its tokens (naming the first missing).
ChatFormat resolve_chat_format(std::optional<ChatFormat> requested, const Tokenizer& tokenizer);

struct RenderedExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // per token: 1 where the model is trained to produce it
};

// special_tokens_in_content: how a message's own text is encoded. Control (the default, as
// transformers' apply_chat_template then encode does): "<|eot_id|>" written in a message becomes
// that control token. Text: it stays the characters it is (split_special_tokens=True).
enum class ContentSpecialTokens { Control, Text };
RenderedExample render_chat(const InstructionExample& example, ChatFormat format, const Tokenizer& tokenizer,
                            ContentSpecialTokens content = ContentSpecialTokens::Control);
// The prompt a model answers in the chat format: the messages, then the assistant's header, as the
// chat template renders it with add_generation_prompt.
std::vector<int32_t> render_prompt(const std::vector<ChatMessage>& messages, ChatFormat format,
                                   const Tokenizer& tokenizer,
                                   ContentSpecialTokens content = ContentSpecialTokens::Control);
// The token that ends an assistant turn: <|eot_id|>, <|im_end|>, </s>, <end_of_turn>, or end-of-text
// (plain; -1 if none).
int32_t end_of_turn(ChatFormat format, const Tokenizer& tokenizer);

// Rendered examples, one per row of seq tokens. Examples longer than seq + 1 tokens are dropped
// (and counted); those with no trained token in the window likewise.
class InstructionDataset final : public Dataset {
 public:
  InstructionDataset(std::vector<RenderedExample> examples, int64_t seq, int32_t pad_id);
  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }
  // inputs [b, seq] int64 (padding: pad_id), targets [b, seq] int64 (kIgnoredTarget where untrained).
  Batch get(const std::vector<int64_t>& indices) const override;
  int64_t target_count(int64_t index) const override;
  int64_t held_bytes() const override;
  int64_t dropped() const { return dropped_; }
  int64_t trained_tokens() const { return trained_tokens_; }
  int64_t seq() const { return seq_; }
  int32_t pad_id() const { return pad_id_; }
  const RenderedExample& example(int64_t index) const { return examples_.at(static_cast<size_t>(index)); }
  // The places example `index` takes in a row: its tokens but the last (which is only a target).
  int64_t places(int64_t index) const { return static_cast<int64_t>(example(index).tokens.size()) - 1; }

 private:
  std::vector<RenderedExample> examples_;
  std::vector<int64_t> counts_;  // trained targets per example
  int64_t seq_;
  int32_t pad_id_;
  int64_t dropped_ = 0;
  int64_t trained_tokens_ = 0;
};

}  // namespace fsdp::data
