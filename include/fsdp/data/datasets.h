// fsdp/data/datasets.h: datasets as lists of samples that a GlobalBatchSampler indexes.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "fsdp/data/fashion_mnist.h"
#include "fsdp/data/image_augment.h"
#include "fsdp/data/token_file.h"

namespace fsdp::data {

struct Batch {
  at::Tensor inputs;   // token ids [b, seq] int64, or images [b, 1, 28, 28] fp32
  at::Tensor targets;  // next tokens [b, seq] int64 (-100: not trained), or labels [b] int64
  // Packed rows only (undefined otherwise): [b, seq] int64, each token's position in its own
  // example or document, 0 where one starts; the model attends within examples (models/attention.h).
  at::Tensor positions;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
  // Targets of sample `index` the loss counts (those not -100): the loss of a global batch is the
  // mean over its counted targets, whatever rank or micro-batch holds them.
  virtual int64_t target_count(int64_t index) const = 0;
  // Bytes this dataset keeps in the process's memory for the run's life (what fsdp-plan counts as
  // data): tokens, pixels and labels held in memory; a memory-mapped file counts 0 (the kernel's
  // page cache holds it, and may drop it).
  virtual int64_t held_bytes() const = 0;
};

// Sample i: tokens [i * seq, i * seq + seq] of the source (seq + 1 tokens: inputs are the first
// seq, targets the last seq). Windows do not overlap; the last partial one is dropped.
// document_end >= 0 (data.document_masking): batches carry positions restarting at 0 after each
// `document_end` token (and at the window's start), so a window's documents attend only to
// themselves; the end token stays in its document and its target, the next one's first token, is
// still trained.
class TokenWindows final : public Dataset {
 public:
  TokenWindows(std::shared_ptr<const TokenSource> tokens, int64_t seq, int32_t document_end = -1);
  int64_t size() const override;
  Batch get(const std::vector<int64_t>& indices) const override;
  int64_t target_count(int64_t) const override { return seq_; }
  int64_t held_bytes() const override { return tokens_->held_bytes(); }
  const TokenSource& tokens() const { return *tokens_; }

 private:
  std::shared_ptr<const TokenSource> tokens_;
  int64_t seq_;
  int32_t document_end_;
};

class ImageDataset final : public Dataset {
 public:
  explicit ImageDataset(ImageSet set) : set_(std::move(set)) {}
  int64_t size() const override { return set_.pixels.size(0); }
  Batch get(const std::vector<int64_t>& indices) const override;
  // 1 per image, or (set_targets_per_label) the trained tokens of its label's text: LLaVA's
  // answers differ in length by class, and the loss is the mean over the global batch's tokens.
  int64_t target_count(int64_t index) const override;
  int64_t held_bytes() const override { return set_.held_bytes(); }
  void set_targets_per_label(std::vector<int64_t> targets) { targets_per_label_ = std::move(targets); }

 private:
  ImageSet set_;
  std::vector<int64_t> targets_per_label_;  // [classes], or empty: 1 per image
};

// Training augmentation for images (image_augment.h says which): mirrors each image left-right with probability 1/2,
// decided by a hash of (seed, step, sample index) alone, so a global batch is augmented the same whatever the number of
// ranks, and a resumed run repeats it exactly. images [b, c, h, w], indices [b].
void random_horizontal_flip(at::Tensor& images, const std::vector<int64_t>& indices, int64_t step, uint64_t seed);
// Moves each image by up to max_shift pixels in each direction (padding with `background`), by the
// same kind of hash: the "random crop with padding" of image classification recipes.
void random_shift(at::Tensor& images, const std::vector<int64_t>& indices, int64_t step, uint64_t seed,
                  int64_t max_shift, double background);

}  // namespace fsdp::data
