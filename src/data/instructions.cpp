#include "fsdp/data/instructions.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>

namespace fsdp::data {

namespace {

// Jinja's `trim` (Python's str.strip()): what Llama 3's template does to each message's content.
// Python strips every character str.isspace() accepts: ASCII's whitespace and separators
// (\t \n \v \f \r, 0x1c-0x1f, space) and Unicode's (U+0085, U+00A0, U+1680, U+2000-U+200A,
// U+2028, U+2029, U+202F, U+205F, U+3000).
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point starting at text[i] and its length in bytes (invalid UTF-8: the byte itself).
std::pair<uint32_t, size_t> code_point_at(const std::string& text, size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  const size_t length = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 1;
  if (length == 1 || i + length > text.size()) return {b, 1};
  uint32_t c = b & (0xff >> (length + 1));
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
  return {c, length};
}

std::string trim(const std::string& text) {
  size_t first = 0;
  while (first < text.size()) {
    const auto [c, length] = code_point_at(text, first);
    if (!is_python_space(c)) break;
    first += length;
  }
  size_t last = text.size();  // one past the last kept byte
  while (last > first) {
    size_t start = last - 1;  // back to the start of the last code point
    while (start > first && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
    const auto [c, length] = code_point_at(text, start);
    if (start + length != last || !is_python_space(c)) break;
    last = start;
  }
  return text.substr(first, last - first);
}

int32_t required_token(const Tokenizer& tokenizer, const std::string& token) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  const int32_t id = hf ? hf->token_id(token) : -1;
  if (id < 0) throw std::invalid_argument("chat format llama3: the tokenizer has no " + token + " token");
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

ChatFormat chat_format_from_name(const std::string& name, const Tokenizer& tokenizer) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  const bool has_headers = hf && hf->token_id("<|start_header_id|>") >= 0;
  if (name == "auto") return has_headers ? ChatFormat::Llama3 : ChatFormat::Plain;
  if (name == "plain") return ChatFormat::Plain;
  if (name == "llama3") {
    if (!has_headers) {
      throw std::invalid_argument(
          "chat format llama3 needs a tokenizer with <|start_header_id|> (Llama 3's tokenizer.json); the " +
          tokenizer.name() + " tokenizer has none");
    }
    return ChatFormat::Llama3;
  }
  throw std::invalid_argument("chat format '" + name + "' (expected auto, llama3 or plain)");
}

const char* chat_format_name(ChatFormat format) { return format == ChatFormat::Llama3 ? "llama3" : "plain"; }

int32_t end_of_turn(ChatFormat format, const Tokenizer& tokenizer) {
  return format == ChatFormat::Llama3 ? required_token(tokenizer, "<|eot_id|>") : tokenizer.end_of_text();
}

namespace {
std::vector<int32_t> encode_content(const std::string& text, const Tokenizer& tokenizer, ContentSpecialTokens content) {
  return content == ContentSpecialTokens::Text ? tokenizer.encode_plain(text) : tokenizer.encode(text);
}
}  // namespace

RenderedExample render_chat(const InstructionExample& example, ChatFormat format, const Tokenizer& tokenizer,
                            ContentSpecialTokens content) {
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
      append(out, encode_content(trim(message.content), tokenizer, content), trained);
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
  RenderedExample out;
  if (format == ChatFormat::Llama3) {
    for (size_t i = 0; i < messages.size(); ++i) {
      append(out, llama3_header(messages[i].role, i == 0, tokenizer), false);
      append(out, encode_content(trim(messages[i].content), tokenizer, content), false);
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
