#include "prefetch_scheduler.h"

#include <algorithm>

#include "unit.h"

namespace fsdp::runtime {

size_t PrefetchScheduler::record_forward(Unit* unit) {
  forward_running_.push_back(unit);
  return forward_running_.size() - 1;
}

void PrefetchScheduler::end_forward() {
  // Re-recorded whenever it changes (a model whose control flow varies between steps).
  if (forward_running_ != forward_order_) forward_order_ = forward_running_;
}

void PrefetchScheduler::end_backward() {
  if (!backward_running_.empty() && backward_running_ != backward_order_) backward_order_ = backward_running_;
}

int PrefetchScheduler::inflight() const {
  int count = static_cast<int>(pending_reduces_.size());
  for (const Unit* unit : units_) count += unit->is_prefetched() ? 1 : 0;
  return count;
}

bool PrefetchScheduler::make_room(int more) {
  while (inflight() + more > options_.max_inflight && !pending_reduces_.empty()) {
    Unit* oldest = pending_reduces_.front();
    pending_reduces_.pop_front();
    oldest->finish_reduce();
  }
  return inflight() + more <= options_.max_inflight;
}

void PrefetchScheduler::prefetch_units(const std::vector<Unit*>& order, size_t first, size_t count) {
  if (options_.max_inflight <= 0 || options_.strategy == ShardingStrategy::NoShard) return;
  for (size_t i = first; i < order.size() && i < first + count; ++i) {
    // Reductions give way to gathers: the unit that runs next matters more than an early wait.
    if (!make_room(1)) return;
    order[i]->prefetch();
  }
}

void PrefetchScheduler::prefetch_forward_from(size_t first) {
  // Forward: up to K units ahead (no reductions compete for the budget).
  if (options_.prefetch)
    prefetch_units(forward_order_, first, static_cast<size_t>(std::max<int64_t>(0, options_.max_inflight)));
}

void PrefetchScheduler::prefetch_forward_after(Unit* unit, size_t position) {
  if (position < forward_order_.size() && forward_order_[position] == unit) prefetch_forward_from(position + 1);
}

void PrefetchScheduler::prefetch_backward_after(Unit* unit) {
  if (!options_.prefetch) return;
  std::vector<Unit*> order = backward_order_;
  if (order.empty()) order.assign(forward_order_.rbegin(), forward_order_.rend());  // first step: a guess
  // Only units this forward ran can run in this backward, and only those whose backward reads
  // their parameters need them; the rest would be gathered for nothing. A unit called twice in
  // forward appears once.
  std::vector<Unit*> candidates;
  for (Unit* u : order) {
    const bool candidate = u == unit || (u->ran_forward() && !u->ran_pre_backward() && u->gathers_for_backward());
    if (candidate && std::find(candidates.begin(), candidates.end(), u) == candidates.end()) candidates.push_back(u);
  }
  size_t next = 0;
  if (!unit->is_root()) {
    auto found = std::find(candidates.begin(), candidates.end(), unit);
    if (found == candidates.end()) return;
    next = static_cast<size_t>(found - candidates.begin()) + 1;
  }
  // Backward: one unit ahead; the rest of the budget lets reductions finish in the background
  // instead of being waited for as soon as they are issued.
  prefetch_units(candidates, next, 1);
}

void PrefetchScheduler::reduction_issued(Unit* unit) {
  pending_reduces_.push_back(unit);
  make_room(0);
}

void PrefetchScheduler::finish_reductions() {
  while (!pending_reduces_.empty()) {
    Unit* oldest = pending_reduces_.front();
    pending_reduces_.pop_front();
    oldest->finish_reduce();
  }
}

}  // namespace fsdp::runtime
