#include "fsdp/data/image_chat.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace fsdp::data {

namespace {

// "sneaker" -> "A sneaker."; "ankle boot" -> "An ankle boot."
std::string answer_for(const std::string& name) {
  const bool vowel =
      !name.empty() && std::string("aeiou").find(static_cast<char>(std::tolower(name.front()))) != std::string::npos;
  return (vowel ? "An " : "A ") + name + ".";
}

}  // namespace

ImageChatWriter::ImageChatWriter(const std::vector<std::string>& class_names, int64_t image_tokens, int64_t image_token,
                                 int64_t end_of_text)
    : question_("USER: What is in this picture?\nASSISTANT: "), end_of_text_(end_of_text) {
  if (image_tokens < 1)
    throw std::invalid_argument("image chat: image_tokens must be at least 1, got " + std::to_string(image_tokens));
  if (end_of_text < 256 || image_token < 256 || end_of_text == image_token) {
    throw std::invalid_argument("image chat: end-of-text " + std::to_string(end_of_text) + " and the image token " +
                                std::to_string(image_token) + " must be two different ids above the bytes (>= 256)");
  }
  prompt_.assign(static_cast<size_t>(image_tokens), image_token);
  for (unsigned char byte : question_) prompt_.push_back(byte);
  for (const std::string& name : class_names) {
    answers_.push_back(answer_for(name));
    longest_answer_tokens_ =
        std::max<int64_t>(longest_answer_tokens_, static_cast<int64_t>(answers_.back().size()) + 1);
  }
}

const std::string& ImageChatWriter::answer(int64_t label) const {
  if (label < 0 || label >= classes()) {
    throw std::out_of_range("image chat: label " + std::to_string(label) + " outside [0, " + std::to_string(classes()) +
                            ")");
  }
  return answers_[static_cast<size_t>(label)];
}

int64_t ImageChatWriter::answer_tokens(int64_t label) const { return static_cast<int64_t>(answer(label).size()) + 1; }

ImageChatWriter::Rows ImageChatWriter::examples(const at::Tensor& labels) const {
  const at::Tensor cpu_labels = labels.to(at::kCPU, at::kLong).contiguous();
  const int64_t b = cpu_labels.numel(), t = row_length(), p = prompt_length();
  at::Tensor ids = at::full({b, t}, end_of_text_, at::kLong);
  at::Tensor targets = at::full({b, t}, -100, at::kLong);
  auto id = ids.accessor<int64_t, 2>();
  auto target = targets.accessor<int64_t, 2>();
  const int64_t* label = cpu_labels.data_ptr<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < p; ++j) id[r][j] = prompt_[static_cast<size_t>(j)];
    const std::string& text = answer(label[r]);
    for (size_t j = 0; j < text.size(); ++j) id[r][p + static_cast<int64_t>(j)] = static_cast<unsigned char>(text[j]);
    // ids[p + len] is end-of-text already (the padding). Position q predicts ids[q + 1]: the
    // answer's tokens and its end-of-text are predicted from positions p - 1 .. p + len - 1.
    const int64_t trained = static_cast<int64_t>(text.size()) + 1;
    for (int64_t q = p - 1; q < p - 1 + trained; ++q) target[r][q] = id[r][q + 1];
  }
  return {ids, targets};
}

at::Tensor ImageChatWriter::prompts(int64_t rows) const {
  return at::tensor(prompt_, at::kLong).unsqueeze(0).expand({rows, prompt_length()}).contiguous();
}

int64_t ImageChatWriter::class_of(const std::vector<int64_t>& generated) const {
  for (int64_t c = 0; c < classes(); ++c) {
    const std::string& text = answers_[static_cast<size_t>(c)];
    if (generated.size() < text.size() + 1) continue;
    bool same = generated[text.size()] == end_of_text_;
    for (size_t j = 0; same && j < text.size(); ++j) same = generated[j] == static_cast<unsigned char>(text[j]);
    if (same) return c;
  }
  return -1;
}

}  // namespace fsdp::data
