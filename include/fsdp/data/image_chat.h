// fsdp/data/image_chat.h: labelled images as one-turn chats for an image-to-text model (LLaVA):
//
//   <image> x image_tokens | "USER: What is in this picture?\nASSISTANT: " | "A sneaker." | end-of-text
//
// bytes as token ids 0-255, end_of_text and image_token two ids above them. Only the answer and
// its end-of-text are trained (targets -100 elsewhere), as torchtune and LLaVA train an assistant
// turn. Rows are as long as the longest class's chat, padded with end-of-text (not trained).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

class ImageChatWriter {
 public:
  // Throws std::invalid_argument naming the value when end_of_text or image_token is a byte
  // (< 256) or they are equal, or image_tokens < 1.
  ImageChatWriter(const std::vector<std::string>& class_names, int64_t image_tokens, int64_t image_token,
                  int64_t end_of_text);

  struct Rows {
    at::Tensor ids;      // [b, row_length()] int64
    at::Tensor targets;  // [b, row_length()] int64: the next token at the answer's positions, -100 elsewhere
  };
  // labels [b] int64 (0 <= label < classes) -> the chats, answer included.
  Rows examples(const at::Tensor& labels) const;
  // The question alone, for generation: [rows, prompt_length()] int64 (the same for every image).
  at::Tensor prompts(int64_t rows) const;
  // The class whose answer `generated` spells exactly (the answer's bytes, then end-of-text; later
  // tokens ignored), or -1.
  int64_t class_of(const std::vector<int64_t>& generated) const;

  const std::string& question() const { return question_; }
  const std::string& answer(int64_t label) const;
  int64_t answer_tokens(int64_t label) const;  // trained targets of one example: its answer's bytes and end-of-text
  int64_t longest_answer_tokens() const { return longest_answer_tokens_; }
  int64_t prompt_length() const { return static_cast<int64_t>(prompt_.size()); }
  int64_t row_length() const { return prompt_length() + longest_answer_tokens_; }
  int64_t classes() const { return static_cast<int64_t>(answers_.size()); }
  int64_t end_of_text() const { return end_of_text_; }

 private:
  std::vector<int64_t> prompt_;  // image tokens, then the question's bytes
  std::string question_;
  std::vector<std::string> answers_;
  int64_t end_of_text_;
  int64_t longest_answer_tokens_ = 0;
};

}  // namespace fsdp::data
