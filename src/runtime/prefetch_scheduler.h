// src/runtime/prefetch_scheduler.h (private): when each unit's gathers and reductions are issued
// and waited for, under one memory budget.
//
//   forward prefetch   a unit's pre-forward also issues the gathers of the K units that follow it
//                      in the order recorded on the previous forward (re-recorded when it changes;
//                      a unit called twice appears twice, and the position, not the name, is followed)
//   backward prefetch  a unit's pre-backward issues the gather of the unit that follows it in the
//                      previous backward's order (the first backward guesses reverse forward order)
//   async reductions   a reduce-scatter is waited for only when the budget is full, or at the end
//                      of backward. HybridShard: its all-reduce across replicas is issued with it,
//                      to run once it completes (ProcessGroup::all_reduce_after), and waited for
//                      with it.
// Budget K = max_inflight: besides the unit computing (and the root), at most K unit buffers are
// alive: prefetched gathers plus reductions in flight. make_room is the one place that enforces
// it: it finishes the oldest reductions until the new buffers fit. Gathered memory is therefore at
// most root + (K + 1) units in forward, and root (params and gradient) + (K + 3) units in
// backward, where the computing unit holds its parameters and its gradient, the gradient twice
// while it is packed into its reduction's input (autograd's tensors beside it, as in FSDP2).
// Every rank follows the same recorded orders, so every rank issues the same collectives.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "fsdp/runtime/options.h"

namespace fsdp::runtime {

class Unit;

class PrefetchScheduler {
 public:
  explicit PrefetchScheduler(const FsdpOptions& options) : options_(options) {}
  // The units whose prefetched buffers count against the budget (every unit, the root included).
  void set_units(std::vector<Unit*> units) { units_ = std::move(units); }

  // Forward. record_forward returns the position of this call in this forward's recording.
  void begin_forward() { forward_running_.clear(); }
  size_t record_forward(Unit* unit);
  void end_forward();
  // Prefetches the K units at positions [first, first + K) of the previous forward's order.
  void prefetch_forward_from(size_t first);
  // After the call at `position`: prefetches what followed it, if this forward has matched the
  // previous one at that position (otherwise the order changed, and guessing would waste gathers).
  void prefetch_forward_after(Unit* unit, size_t position);

  // Backward.
  void begin_backward() { backward_running_.clear(); }
  void record_backward(Unit* unit) { backward_running_.push_back(unit); }
  void end_backward();
  void prefetch_backward_after(Unit* unit);

  // Reductions.
  void reduction_issued(Unit* unit);
  void finish_reductions();  // waits for every pending one, oldest first

  const std::vector<Unit*>& forward_order() const { return forward_order_; }
  const std::vector<Unit*>& backward_order() const { return backward_order_; }

 private:
  int inflight() const;  // prefetched units not yet used + reductions in flight
  // Finishes the oldest reductions until `more` new buffers fit in the budget; false if they
  // still do not (the budget is full of prefetched gathers).
  bool make_room(int more);
  void prefetch_units(const std::vector<Unit*>& order, size_t first, size_t count);

  FsdpOptions options_;
  std::vector<Unit*> units_;
  std::vector<Unit*> forward_order_, backward_order_;      // recorded on the previous step
  std::vector<Unit*> forward_running_, backward_running_;  // being recorded in this step
  std::deque<Unit*> pending_reduces_;                      // reductions in flight, oldest first
};

}  // namespace fsdp::runtime
