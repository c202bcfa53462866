// fsdp/data/packed_instructions.h: instruction examples packed several to a row (data.packing).
//
// Padded, each example is one row of `seq` tokens and most of the row is padding (the fine-tune
// job's examples fill about a third of theirs). Packed, examples sit back to back in a row:
//
//   inputs     [ a0 a1 a2 a3 | b0 b1 | c0 c1 c2 | pad pad ]
//   positions  [ 0  1  2  3  | 0  1  | 0  1  2  | 0   1   ]   restart where an example starts
//   targets    [ a1 a2 a3 a4 | b1 b2 | c1 c2 c3 | -100 ... ]  as in its padded row (-100: untrained)
//
// An example of L tokens takes L - 1 places, exactly the inputs and targets of its padded row; the
// model restarts positions at 0 for each and attends only within it (models/attention.h's
// document_causal_mask), so each example's loss is its loss alone in a padded row.
//
// Which examples share a row: the examples in an order drawn from the seed, each put in the fullest
// row that still has room for it (best fit), a new row when none has. Deterministic from the seed
// and the data; the rows are fixed for the run and the sampler shuffles them per epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/data/instructions.h"

namespace fsdp::data {

// Rows of example indices: each row's examples' lengths sum to at most `capacity`. lengths[i] >= 1
// and <= capacity (throws std::invalid_argument otherwise).
std::vector<std::vector<int64_t>> pack_best_fit(const std::vector<int64_t>& lengths, int64_t capacity, uint64_t seed);

class PackedInstructionDataset final : public Dataset {
 public:
  PackedInstructionDataset(std::shared_ptr<const InstructionDataset> examples, uint64_t seed);
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  // inputs, targets, positions [b, seq] int64 (padding: pad_id, kIgnoredTarget, positions from 0).
  Batch get(const std::vector<int64_t>& indices) const override;
  int64_t target_count(int64_t index) const override { return counts_.at(static_cast<size_t>(index)); }
  int64_t held_bytes() const override;  // the examples and the rows

  int64_t examples() const { return examples_->size(); }
  // The share of the rows' places holding an example's token, packed and padded one to a row.
  double window_use() const;
  double padded_window_use() const;
  const std::vector<int64_t>& row(int64_t index) const { return rows_.at(static_cast<size_t>(index)); }

 private:
  std::shared_ptr<const InstructionDataset> examples_;
  std::vector<std::vector<int64_t>> rows_;  // example indices per row
  std::vector<int64_t> counts_;             // trained targets per row
  int64_t used_places_ = 0;                 // example tokens placed in all rows
};

}  // namespace fsdp::data
