#include "fsdp/data/captions.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace fsdp::data {

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {
      "t-shirt", "pair of trousers", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"};
  return names;
}

const std::vector<std::string>& caption_templates() {
  static const std::vector<std::string> templates = {
      "a photo of a {}.",
      "a {} on a plain background.",
      "a black and white photo of a {}.",
      "a low resolution photo of a {}.",
      "a picture of a {}.",
      "a small photo of the {}.",
      "a grayscale image of a {}.",
      "a cropped photo of the {}.",
  };
  return templates;
}

namespace {

std::string fill(const std::string& text, const std::string& name) {
  const size_t at = text.find("{}");
  return at == std::string::npos ? text : text.substr(0, at) + name + text.substr(at + 2);
}

// SplitMix64: a well-mixed hash of the sample's place, as data::random_shift draws.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

CaptionWriter::CaptionWriter(std::vector<std::string> class_names, std::vector<std::string> templates, int64_t context,
                             int64_t end_of_text)
    : class_names_(std::move(class_names)),
      templates_(std::move(templates)),
      context_(context),
      end_of_text_(end_of_text) {
  if (context_ < 2)
    throw std::invalid_argument("captions: text context " + std::to_string(context_) + " is below 2 tokens");
  if (end_of_text_ < 256) {
    throw std::invalid_argument("captions: end-of-text token " + std::to_string(end_of_text_) +
                                " collides with the bytes 0-255");
  }
  if (class_names_.empty() || templates_.empty())
    throw std::invalid_argument("captions: no class names or no templates");
  for (const std::string& name : class_names_) {
    for (const std::string& text : templates_) {
      const std::string caption = fill(text, name);
      longest_bytes_ = std::max<int64_t>(longest_bytes_, static_cast<int64_t>(caption.size()));
      if (static_cast<int64_t>(caption.size()) + 1 > context_) ++truncated_pairs_;
      encoded_.push_back(encode(caption));
    }
  }
}

std::vector<int64_t> CaptionWriter::encode(const std::string& text) const {
  std::vector<int64_t> ids(static_cast<size_t>(context_), end_of_text_);
  const size_t kept = std::min(text.size(), static_cast<size_t>(context_ - 1));
  for (size_t i = 0; i < kept; ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

at::Tensor CaptionWriter::captions(const at::Tensor& labels, const std::vector<int64_t>& indices, int64_t step,
                                   uint64_t seed) const {
  const at::Tensor cpu_labels = labels.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t b = cpu_labels.numel();
  if (b != static_cast<int64_t>(indices.size())) {
    throw std::invalid_argument("captions: " + std::to_string(b) + " labels for " + std::to_string(indices.size()) +
                                " samples");
  }
  at::Tensor ids = at::empty({b, context_}, at::kLong);
  const int64_t* label = cpu_labels.data_ptr<int64_t>();
  int64_t* out = ids.data_ptr<int64_t>();
  const int64_t templates = static_cast<int64_t>(templates_.size());
  for (int64_t i = 0; i < b; ++i) {
    if (label[i] < 0 || label[i] >= classes()) {
      throw std::invalid_argument("captions: label " + std::to_string(label[i]) + " of sample " +
                                  std::to_string(indices[i]) + " is outside the " + std::to_string(classes()) +
                                  " classes");
    }
    const uint64_t draw =
        mix(seed ^ mix(static_cast<uint64_t>(step) * 0x100000001b3ULL + static_cast<uint64_t>(indices[i])));
    const auto& caption = encoded_[static_cast<size_t>(label[i] * templates + static_cast<int64_t>(draw % templates))];
    std::copy(caption.begin(), caption.end(), out + i * context_);
  }
  return ids;
}

at::Tensor CaptionWriter::class_prompts() const {
  at::Tensor ids = at::empty({classes(), context_}, at::kLong);
  const int64_t templates = static_cast<int64_t>(templates_.size());
  for (int64_t c = 0; c < classes(); ++c) {
    const auto& caption = encoded_[static_cast<size_t>(c * templates)];
    std::copy(caption.begin(), caption.end(), ids.data_ptr<int64_t>() + c * context_);
  }
  return ids;
}

}  // namespace fsdp::data
