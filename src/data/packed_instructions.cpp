#include "fsdp/data/packed_instructions.h"

#include <ATen/ATen.h>

#include <map>
#include <random>
#include <stdexcept>
#include <string>

namespace fsdp::data {

std::vector<std::vector<int64_t>> pack_best_fit(const std::vector<int64_t>& lengths, int64_t capacity, uint64_t seed) {
  const int64_t count = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> order(lengths.size());
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  // mt19937_64 and a hand-written Fisher-Yates, as the sampler draws its epochs: the same order on
  // every platform. Salted so the packing order is not the first epoch's.
  std::mt19937_64 generator(seed * 0x9E3779B97F4A7C15ull ^ 0x5041434bull);
  for (int64_t i = count - 1; i > 0; --i) {
    std::swap(order[i], order[static_cast<int64_t>(generator() % static_cast<uint64_t>(i + 1))]);
  }
  std::vector<std::vector<int64_t>> rows;
  std::multimap<int64_t, size_t> room;  // free places -> row, the fullest rows first
  for (int64_t index : order) {
    const int64_t length = lengths[index];
    if (length < 1 || length > capacity) {
      throw std::invalid_argument("pack_best_fit: example " + std::to_string(index) + " takes " +
                                  std::to_string(length) + " places, expected 1 to " + std::to_string(capacity));
    }
    auto best = room.lower_bound(length);  // the row with the least room that still holds it
    size_t row;
    int64_t free_places;
    if (best == room.end()) {
      row = rows.size();
      rows.emplace_back();
      free_places = capacity;
    } else {
      row = best->second;
      free_places = best->first;
      room.erase(best);
    }
    rows[row].push_back(index);
    if (free_places - length > 0) room.emplace(free_places - length, row);
  }
  return rows;
}

PackedInstructionDataset::PackedInstructionDataset(std::shared_ptr<const InstructionDataset> examples, uint64_t seed)
    : examples_(std::move(examples)) {
  std::vector<int64_t> lengths(static_cast<size_t>(examples_->size()));
  for (int64_t i = 0; i < examples_->size(); ++i) lengths[i] = examples_->places(i);
  rows_ = pack_best_fit(lengths, examples_->seq(), seed);
  for (const auto& row : rows_) {
    int64_t count = 0;
    for (int64_t index : row) {
      count += examples_->target_count(index);
      used_places_ += lengths[index];
    }
    counts_.push_back(count);
  }
}

Batch PackedInstructionDataset::get(const std::vector<int64_t>& indices) const {
  const int64_t rows = static_cast<int64_t>(indices.size()), seq = examples_->seq();
  at::Tensor inputs = at::full({rows, seq}, static_cast<int64_t>(examples_->pad_id()), at::kLong);
  at::Tensor targets = at::full({rows, seq}, kIgnoredTarget, at::kLong);
  at::Tensor positions = at::empty({rows, seq}, at::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = targets.accessor<int64_t, 2>();
  auto at = positions.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t place = 0;
    for (int64_t index : rows_.at(static_cast<size_t>(indices[r]))) {
      const RenderedExample& example = examples_->example(index);
      const int64_t length = static_cast<int64_t>(example.tokens.size());
      for (int64_t i = 0; i + 1 < length; ++i, ++place) {
        in[r][place] = example.tokens[i];
        if (example.trained[i + 1]) out[r][place] = example.tokens[i + 1];
        at[r][place] = i;
      }
    }
    for (int64_t i = 0; place < seq; ++i, ++place) at[r][place] = i;  // the padding tail: an example of its own
  }
  return {inputs, targets, positions};
}

int64_t PackedInstructionDataset::held_bytes() const {
  size_t bytes = rows_.capacity() * sizeof(rows_.front()) + counts_.capacity() * sizeof(int64_t);
  for (const auto& row : rows_) bytes += row.capacity() * sizeof(int64_t);
  return examples_->held_bytes() + static_cast<int64_t>(bytes);
}

double PackedInstructionDataset::window_use() const {
  return rows_.empty() ? 0.0 : static_cast<double>(used_places_) / static_cast<double>(size() * examples_->seq());
}

double PackedInstructionDataset::padded_window_use() const {
  return examples_->size() == 0
             ? 0.0
             : static_cast<double>(used_places_) / static_cast<double>(examples_->size() * examples_->seq());
}

}  // namespace fsdp::data
