#include "fsdp/data/datasets.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace fsdp::data {

TokenWindows::TokenWindows(std::shared_ptr<const TokenSource> tokens, int64_t seq, int32_t document_end)
    : tokens_(std::move(tokens)), seq_(seq), document_end_(document_end) {
  if (seq < 1) throw std::invalid_argument("token windows: sequence length must be positive");
}

int64_t TokenWindows::size() const { return tokens_->size() > seq_ ? (tokens_->size() - 1) / seq_ : 0; }

Batch TokenWindows::get(const std::vector<int64_t>& indices) const {
  at::Tensor windows = at::empty({static_cast<int64_t>(indices.size()), seq_ + 1}, at::kLong);
  for (size_t row = 0; row < indices.size(); ++row) {
    windows[static_cast<int64_t>(row)].copy_(tokens_->read(indices[row] * seq_, seq_ + 1));
  }
  Batch batch{windows.narrow(1, 0, seq_).contiguous(), windows.narrow(1, 1, seq_).contiguous(), at::Tensor()};
  if (document_end_ >= 0) {
    batch.positions = at::empty_like(batch.inputs);
    auto in = batch.inputs.accessor<int64_t, 2>();
    auto at = batch.positions.accessor<int64_t, 2>();
    for (int64_t r = 0; r < batch.inputs.size(0); ++r) {
      at[r][0] = 0;
      for (int64_t i = 1; i < seq_; ++i) at[r][i] = in[r][i - 1] == document_end_ ? 0 : at[r][i - 1] + 1;
    }
  }
  return batch;
}

int64_t ImageDataset::target_count(int64_t index) const {
  if (targets_per_label_.empty()) return 1;
  return targets_per_label_.at(static_cast<size_t>(set_.labels.data_ptr<int64_t>()[index]));
}

Batch ImageDataset::get(const std::vector<int64_t>& indices) const {
  at::Tensor index = at::tensor(indices, at::kLong);
  return {normalized_images(set_.pixels.index_select(0, index)), set_.labels.index_select(0, index), at::Tensor()};
}

namespace {
// splitmix64 of (seed, step, index, salt): well mixed, and specified here (not by a library).
uint64_t sample_hash(uint64_t seed, int64_t step, int64_t index, uint64_t salt) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull ^
               static_cast<uint64_t>(index) * 0x94D049BB133111EBull ^ salt;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
}  // namespace

void random_shift(at::Tensor& images, const std::vector<int64_t>& indices, int64_t step, uint64_t seed,
                  int64_t max_shift, double background) {
  const int64_t h = images.size(-2), w = images.size(-1), span = 2 * max_shift + 1;
  for (size_t row = 0; row < indices.size(); ++row) {
    const uint64_t x = sample_hash(seed, step, indices[row], 0x5348494654ull);
    const int64_t dy = static_cast<int64_t>(x % span), dx = static_cast<int64_t>((x / span) % span);
    if (dy == max_shift && dx == max_shift) continue;  // no move
    at::Tensor image = images[static_cast<int64_t>(row)];
    at::Tensor padded = at::constant_pad_nd(image, {max_shift, max_shift, max_shift, max_shift}, background);
    image.copy_(padded.narrow(-2, dy, h).narrow(-1, dx, w));
  }
}

void random_horizontal_flip(at::Tensor& images, const std::vector<int64_t>& indices, int64_t step, uint64_t seed) {
  for (size_t row = 0; row < indices.size(); ++row) {
    const uint64_t x = sample_hash(seed, step, indices[row], 0);
    if (x & 1) {
      at::Tensor image = images[static_cast<int64_t>(row)];
      image.copy_(image.flip({-1}));
    }
  }
}

}  // namespace fsdp::data
