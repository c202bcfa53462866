#include "fsdp/data/instructions.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

#include "chat_text.h"
#include "fsdp/enum_names.h"

namespace fsdp::data {

namespace {

int32_t token_of(const Tokenizer& tokenizer, const std::string& token) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  return hf ? hf->token_id(token) : -1;
}

// Each format: the tokens its template writes (all of which the tokenizer must have as tokens; the
// one that tells the format first, for the error), and the one that ends an answer. Plain needs none
// and ends with end-of-text. "auto" tries them in this order.
struct ChatFormatSpec {
  ChatFormat format;
  std::vector<std::string> tokens;
  const char* end_of_turn;
  const char* name() const { return enum_name(format); }
};
const std::vector<ChatFormatSpec>& chat_format_specs() {
  static const std::vector<ChatFormatSpec> specs = {
      {ChatFormat::Llama3,
       {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"},
       "<|eot_id|>"},
      {ChatFormat::ChatMl, {"<|im_start|>", "<|im_end|>"}, "<|im_end|>"},
      {ChatFormat::Mistral, {"[INST]", "[/INST]", "<s>", "</s>"}, "</s>"},
      {ChatFormat::Gemma, {"<start_of_turn>", "<end_of_turn>", "<bos>"}, "<end_of_turn>"},
      {ChatFormat::Plain, {}, ""},
  };
  return specs;
}
const ChatFormatSpec& spec_of(ChatFormat format) {
  for (const auto& spec : chat_format_specs()) {
    if (spec.format == format) return spec;
  }
  throw std::logic_error("chat format without a spec");
}
// The first of the format's tokens the tokenizer lacks; "" when it has them all.
std::string missing_token(const ChatFormatSpec& spec, const Tokenizer& tokenizer) {
  for (const auto& token : spec.tokens) {
    if (token_of(tokenizer, token) < 0) return token;
  }
  return "";
}

int32_t required_token(const Tokenizer& tokenizer, const std::string& token, const char* format) {
  const int32_t id = token_of(tokenizer, token);
  if (id < 0)
    throw std::invalid_argument(std::string("chat format ") + format + ": the tokenizer has no " + token + " token");
  return id;
}

void append(RenderedExample& out, const std::vector<int32_t>& tokens, bool trained) {
  out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
  out.trained.insert(out.trained.end(), tokens.size(), trained ? 1 : 0);
}

// Llama 3: [<|begin_of_text|>] <|start_header_id|>role<|end_header_id|>\n\n
std::vector<int32_t> llama3_header(const std::string& role, bool first, const Tokenizer& tokenizer) {
  std::string text = "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
  if (first) text = "<|begin_of_text|>" + text;
  return tokenizer.encode(text);
}

}  // namespace

InstructionExample parse_instruction_line(const std::string& text, const std::string& where) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!json.is_object())
    throw std::runtime_error(where + ": expected a JSON object, got " + std::string(json.type_name()));
  auto string_field = [&](const nlohmann::json& object, const char* key, const std::string& what) {
    if (!object.contains(key)) throw std::runtime_error(where + ": " + what + " has no \"" + key + "\"");
    if (!object.at(key).is_string()) {
      throw std::runtime_error(where + ": " + what + "'s \"" + key + "\" must be a string, got " +
                               object.at(key).type_name());
    }
    return object.at(key).get<std::string>();
  };
  InstructionExample example;
  if (json.contains("messages")) {
    const auto& messages = json.at("messages");
    if (!messages.is_array() || messages.empty())
      throw std::runtime_error(where + ": \"messages\" must be a non-empty array");
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string what = "message " + std::to_string(i + 1);
      if (!messages[i].is_object()) throw std::runtime_error(where + ": " + what + " is not an object");
      ChatMessage message{string_field(messages[i], "role", what), string_field(messages[i], "content", what)};
      if (message.role != "system" && message.role != "user" && message.role != "assistant") {
        throw std::runtime_error(where + ": " + what + " has unknown role '" + message.role +
                                 "' (expected system, user or assistant)");
      }
      example.messages.push_back(std::move(message));
    }
  } else if (json.contains("prompt") || json.contains("completion")) {
    example.messages.push_back({"user", string_field(json, "prompt", "the example")});
    example.messages.push_back({"assistant", string_field(json, "completion", "the example")});
  } else {
    throw std::runtime_error(where + ": expected {\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...}");
  }
  bool answered = false;
  for (const auto& message : example.messages) answered = answered || message.role == "assistant";
  if (!answered) throw std::runtime_error(where + ": no assistant message, so nothing to train on");
  return example;
}

std::vector<InstructionExample> read_instruction_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read instruction data '" + path + "'");
  std::vector<InstructionExample> examples;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    InstructionExample example = parse_instruction_line(line, path + ":" + std::to_string(number));
    example.line = number;
    examples.push_back(std::move(example));
  }
  if (examples.empty()) throw std::runtime_error("instruction data '" + path + "' holds no examples");
  return examples;
}

ChatFormat resolve_chat_format(std::optional<ChatFormat> requested, const Tokenizer& tokenizer) {
  if (!requested) {
    // The first format whose tokens the tokenizer has all of (the plain one has none).
    for (const auto& spec : chat_format_specs()) {
      if (missing_token(spec, tokenizer).empty()) return spec.format;
    }
    throw std::logic_error("the plain chat format needs no tokens, yet was not chosen");
  }
  const ChatFormatSpec& spec = spec_of(*requested);
  if (const std::string missing = missing_token(spec, tokenizer); !missing.empty()) {
    throw std::invalid_argument("chat format " + std::string(spec.name()) + " needs a tokenizer with " + missing +
                                " as a token of its own; the " + tokenizer.name() + " tokenizer has none");
  }
  return spec.format;
}

int32_t end_of_turn(ChatFormat format, const Tokenizer& tokenizer) {
  const ChatFormatSpec& spec = spec_of(format);
  return format == ChatFormat::Plain ? tokenizer.end_of_text()
                                     : required_token(tokenizer, spec.end_of_turn, spec.name());
}

namespace {
std::vector<int32_t> encode_content(const std::string& text, const Tokenizer& tokenizer, ContentSpecialTokens content) {
  return content == ContentSpecialTokens::Text ? tokenizer.encode_plain(text) : tokenizer.encode(text);
}
}  // namespace

namespace {
// The formats rendered as one text (chat_text.h): the conversation in the format.
ChatText chat_text(const std::vector<ChatMessage>& messages, ChatFormat format, bool add_generation_prompt) {
  switch (format) {
    case ChatFormat::ChatMl: return chatml_text(messages, add_generation_prompt);
    case ChatFormat::Mistral: return mistral_text(messages, add_generation_prompt);
    case ChatFormat::Gemma: return gemma_text(messages, add_generation_prompt);
    case ChatFormat::Llama3:
    case ChatFormat::Plain: break;
  }
  throw std::logic_error("chat format rendered piece by piece");
}
bool rendered_as_one_text(ChatFormat format) { return format != ChatFormat::Llama3 && format != ChatFormat::Plain; }
}  // namespace

RenderedExample render_chat(const InstructionExample& example, ChatFormat format, const Tokenizer& tokenizer,
                            ContentSpecialTokens content) {
  if (rendered_as_one_text(format)) {
    try {
      return encode_chat_text(chat_text(example.messages, format, false), tokenizer, content);
    } catch (const std::exception& e) {
      if (example.line == 0) throw;
      throw std::invalid_argument("line " + std::to_string(example.line) + ": " + e.what());
    }
  }
  RenderedExample out;
  const int32_t end = end_of_turn(format, tokenizer);
  for (size_t i = 0; i < example.messages.size(); ++i) {
    const ChatMessage& message = example.messages[i];
    const bool trained = message.role == "assistant";
    if (format == ChatFormat::Llama3) {
      // Header and content are encoded apart (so the mask falls between them); the header ends in
      // "\n\n", a pre-token of its own, so this equals encoding the template's whole string
      // (tests/hf/check_hf_models.py compares with transformers' apply_chat_template).
      append(out, llama3_header(message.role, i == 0, tokenizer), false);
      append(out, encode_content(python_strip(message.content), tokenizer, content), trained);
      append(out, {end}, trained);
    } else {
      append(out, encode_content(message.content, tokenizer, content), trained);
    }
  }
  if (format == ChatFormat::Plain && end >= 0) append(out, {end}, example.messages.back().role == "assistant");
  return out;
}

std::vector<int32_t> render_prompt(const std::vector<ChatMessage>& messages, ChatFormat format,
                                   const Tokenizer& tokenizer, ContentSpecialTokens content) {
  if (rendered_as_one_text(format)) {
    return encode_chat_text(chat_text(messages, format, true), tokenizer, content).tokens;
  }
  RenderedExample out;
  if (format == ChatFormat::Llama3) {
    for (size_t i = 0; i < messages.size(); ++i) {
      append(out, llama3_header(messages[i].role, i == 0, tokenizer), false);
      append(out, encode_content(python_strip(messages[i].content), tokenizer, content), false);
      append(out, {end_of_turn(format, tokenizer)}, false);
    }
    append(out, llama3_header("assistant", messages.empty(), tokenizer), false);
  } else {
    for (const auto& message : messages) append(out, encode_content(message.content, tokenizer, content), false);
  }
  return out.tokens;
}

InstructionDataset::InstructionDataset(std::vector<RenderedExample> examples, int64_t seq, int32_t pad_id)
    : seq_(seq), pad_id_(pad_id) {
  for (auto& example : examples) {
    const int64_t length = static_cast<int64_t>(example.tokens.size());
    int64_t count = 0;
    for (int64_t i = 1; i < length; ++i) count += example.trained[i];
    if (length > seq + 1 || count == 0) {
      ++dropped_;
      continue;
    }
    counts_.push_back(count);
    trained_tokens_ += count;
    examples_.push_back(std::move(example));
  }
}

Batch InstructionDataset::get(const std::vector<int64_t>& indices) const {
  const int64_t rows = static_cast<int64_t>(indices.size());
  at::Tensor inputs = at::full({rows, seq_}, static_cast<int64_t>(pad_id_), at::kLong);
  at::Tensor targets = at::full({rows, seq_}, kIgnoredTarget, at::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = targets.accessor<int64_t, 2>();
  for (int64_t row = 0; row < rows; ++row) {
    const RenderedExample& example = examples_.at(static_cast<size_t>(indices[row]));
    const int64_t length = static_cast<int64_t>(example.tokens.size());
    for (int64_t i = 0; i + 1 < length; ++i) {
      in[row][i] = example.tokens[i];
      if (example.trained[i + 1]) out[row][i] = example.tokens[i + 1];
    }
  }
  return {inputs, targets, at::Tensor()};
}

int64_t InstructionDataset::target_count(int64_t index) const { return counts_.at(static_cast<size_t>(index)); }

int64_t InstructionDataset::held_bytes() const {
  size_t bytes = examples_.capacity() * sizeof(RenderedExample) + counts_.capacity() * sizeof(int64_t);
  for (const auto& example : examples_)
    bytes += example.tokens.capacity() * sizeof(int32_t) + example.trained.capacity();
  return static_cast<int64_t>(bytes);
}

}  // namespace fsdp::data
