// fsdp/data/captions.h: captions for labelled images, for contrastive (CLIP) training: a class's
// name set in one of several templates ("a photo of a {}.", "a {} on a plain background.", ...),
// as bytes followed by an end-of-text token, padded with it to the text context.
//
// The template of a sample changes from step to step, drawn from a hash of (seed, step, sample
// index): the same on every rank and every run, whatever rank holds the sample.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::data {

// Fashion-MNIST's ten classes in label order, as a caption says them.
const std::vector<std::string>& fashion_mnist_class_names();
// The training templates ("{}" is the class name); the first one is the zero-shot prompt.
const std::vector<std::string>& caption_templates();

class CaptionWriter {
 public:
  // Bytes are token ids 0-255; end_of_text (>= 256) ends a caption and pads it to `context`.
  // Throws std::invalid_argument naming the value when context < 2 or end_of_text < 256.
  CaptionWriter(std::vector<std::string> class_names, std::vector<std::string> templates, int64_t context,
                int64_t end_of_text);

  // labels [b] int64 (0 <= label < classes) of samples `indices` at 0-based `step` ->
  // token ids [b, context] int64.
  at::Tensor captions(const at::Tensor& labels, const std::vector<int64_t>& indices, int64_t step, uint64_t seed) const;
  // One caption per class in the first template: [classes, context] int64 (zero-shot prompts).
  at::Tensor class_prompts() const;

  // Captions that do not fit the context with their end-of-text token are cut (the token kept as
  // the last); how many of the (class, template) pairs are, and the longest caption in bytes.
  int64_t truncated_pairs() const { return truncated_pairs_; }
  int64_t longest_bytes() const { return longest_bytes_; }
  int64_t classes() const { return static_cast<int64_t>(class_names_.size()); }
  int64_t context() const { return context_; }

 private:
  std::vector<int64_t> encode(const std::string& text) const;  // [context] ids

  std::vector<std::string> class_names_, templates_;
  int64_t context_, end_of_text_;
  std::vector<std::vector<int64_t>> encoded_;  // [class * templates + template] -> ids
  int64_t truncated_pairs_ = 0, longest_bytes_ = 0;
};

}  // namespace fsdp::data
