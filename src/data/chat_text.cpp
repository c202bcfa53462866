#include "chat_text.h"

#include <algorithm>
#include <stdexcept>

namespace fsdp::data {

namespace {

// Python's str.isspace(): ASCII's whitespace and separators (\t \n \v \f \r, 0x1c-0x1f, space) and
// Unicode's (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
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

// Builds a ChatText piece by piece, recording the ranges.
class ChatTextBuilder {
 public:
  void add(const std::string& text) { chat_.text += text; }
  void add_content(const std::string& text) {
    chat_.contents.emplace_back(chat_.text.size(), chat_.text.size() + text.size());
    chat_.text += text;
  }
  void begin_trained() { trained_begin_ = chat_.text.size(); }
  void end_trained() { chat_.trained.emplace_back(trained_begin_, chat_.text.size()); }
  ChatText take() { return std::move(chat_); }

 private:
  ChatText chat_;
  size_t trained_begin_ = 0;
};

// The conversation's messages after a leading system message, which must alternate user,
// assistant, user, ... (as Mistral's and Gemma's templates demand); the system message's text.
std::vector<const ChatMessage*> alternating(const std::vector<ChatMessage>& messages, const std::string& format,
                                            std::string* system) {
  std::vector<const ChatMessage*> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[i].role == "system") {
      *system = messages[i].content;
      continue;
    }
    const char* expected = turns.size() % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != expected) {
      throw std::invalid_argument("chat format " + format + ": message " + std::to_string(i + 1) + " is " +
                                  messages[i].role + " where " + expected +
                                  " was expected (after an optional system message, user and assistant alternate, "
                                  "as its chat template demands)");
    }
    turns.push_back(&messages[i]);
  }
  return turns;
}

}  // namespace

std::string python_strip(const std::string& text) {
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

ChatText chatml_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  ChatTextBuilder chat;
  for (const ChatMessage& message : messages) {
    chat.add("<|im_start|>" + message.role + "\n");
    const bool trained = message.role == "assistant";
    if (trained) chat.begin_trained();
    chat.add_content(message.content);
    chat.add("<|im_end|>");
    if (trained) chat.end_trained();
    chat.add("\n");
  }
  if (add_generation_prompt) chat.add("<|im_start|>assistant\n");
  return chat.take();
}

ChatText mistral_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string system;
  const std::vector<const ChatMessage*> turns = alternating(messages, "mistral", &system);
  size_t last_user = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i]->role == "user") last_user = i;
  }
  ChatTextBuilder chat;
  chat.add("<s>");
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i]->role == "user") {
      chat.add("[INST] ");
      if (i == last_user && !system.empty()) chat.add_content(system + "\n\n");
      chat.add_content(turns[i]->content);
      chat.add("[/INST]");
    } else {
      chat.begin_trained();
      chat.add(" ");
      chat.add_content(python_strip(turns[i]->content));
      chat.add("</s>");
      chat.end_trained();
    }
  }
  (void)add_generation_prompt;  // the prompt ends with [/INST]: the answer follows it directly
  return chat.take();
}

ChatText gemma_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string system;
  const std::vector<const ChatMessage*> turns = alternating(messages, "gemma", &system);
  ChatTextBuilder chat;
  chat.add("<bos>");
  for (size_t i = 0; i < turns.size(); ++i) {
    const bool answer = turns[i]->role == "assistant";
    chat.add(std::string("<start_of_turn>") + (answer ? "model" : "user") + "\n");
    if (i == 0 && !system.empty()) chat.add_content(system + "\n\n");
    if (answer) chat.begin_trained();
    chat.add_content(python_strip(turns[i]->content));
    chat.add("<end_of_turn>");
    if (answer) chat.end_trained();
    chat.add("\n");
  }
  if (add_generation_prompt) chat.add("<start_of_turn>model\n");
  return chat.take();
}

RenderedExample encode_chat_text(const ChatText& chat, const Tokenizer& tokenizer, ContentSpecialTokens content) {
  const bool literal = content == ContentSpecialTokens::Text;
  auto encode_prefix = [&](size_t end) {
    Tokenizer::ByteRanges ranges;
    if (literal) {
      for (const auto& [begin, last] : chat.contents) {
        if (begin < end) ranges.emplace_back(begin, std::min(last, end));
      }
    }
    return tokenizer.encode_with_literal(chat.text.substr(0, end), ranges);
  };
  RenderedExample out;
  out.tokens = encode_prefix(chat.text.size());
  out.trained.assign(out.tokens.size(), 0);
  // A range's tokens, as transformers' return_assistant_tokens_mask finds them (char_to_token): from
  // the token holding its first byte to the token holding its last. The text before a byte encodes
  // to the whole's first tokens up to that byte, and to one more of its own where a token of the
  // whole spans the byte (Qwen's "\n\n\n" across a header and an answer that starts "\n\n").
  auto common_prefix = [&](size_t byte, bool* spans) {
    const std::vector<int32_t> prefix = encode_prefix(byte);
    const size_t common = static_cast<size_t>(
        std::mismatch(prefix.begin(), prefix.end(), out.tokens.begin(), out.tokens.end()).first - prefix.begin());
    *spans = common < prefix.size();
    return common;
  };
  for (const auto& [begin, end] : chat.trained) {
    bool spans_begin = false, spans_end = false;
    const size_t first = common_prefix(begin, &spans_begin);
    const size_t last = std::min(common_prefix(end, &spans_end) + (spans_end ? 1 : 0), out.tokens.size());
    for (size_t i = first; i < last; ++i) out.trained[i] = 1;
  }
  return out;
}

}  // namespace fsdp::data
