#include "step_metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "fsdp/train/reporting.h"

namespace fsdp::train {

namespace {
constexpr int64_t kFingerprintAt = 7;  // the first of the fingerprint's doubles, after the facts
constexpr int64_t kFields = kFingerprintAt + comm::kFingerprintDoubles;  // RankStepFacts, in order
}  // namespace

StepMetrics gather_step_metrics(const comm::ProcessGroupPtr& world, const RankStepFacts& mine, bool on_cpu) {
  const int n = world->size();
  double fingerprint[comm::kFingerprintDoubles];
  comm::fingerprint_to_doubles(mine.collectives, fingerprint);
  std::vector<double> facts = {mine.loss,
                               mine.peak_resident_bytes,
                               mine.communication_seconds,
                               mine.stop_requested ? 1.0 : 0.0,
                               mine.exposed_seconds,
                               mine.device_peak_reserved_bytes,
                               mine.step_seconds};
  facts.insert(facts.end(), fingerprint, fingerprint + comm::kFingerprintDoubles);
  at::Tensor local = at::tensor(facts, at::kDouble);
  at::Tensor all = at::empty({kFields * n}, at::kDouble);
  world->all_gather(all, local)->wait();
  StepMetrics metrics;
  metrics.per_rank = all.view({n, kFields});
  metrics.stop = metrics.per_rank.select(1, 3).max().item<double>() > 0.0;
  metrics.loss = metrics.per_rank.select(1, 0).mean().item<double>();
  // On a GPU, the caching allocator's peak reservation (the memory that bounds the model);
  // on the CPU, the process's peak resident memory.
  metrics.peak_memory = metrics.per_rank.select(1, on_cpu ? 1 : 5).max().item<double>();
  metrics.communication = metrics.per_rank.select(1, 2).max().item<double>();
  metrics.exposed = metrics.per_rank.select(1, 4).max().item<double>();
  metrics.step_seconds = metrics.per_rank.select(1, 6).max().item<double>();
  const double* rows = all.data_ptr<double>();
  for (int r = 0; r < n; ++r)
    metrics.collectives.push_back(comm::fingerprint_from_doubles(rows + r * kFields + kFingerprintAt));
  return metrics;
}

// Communication the compute thread waited for is exposed (on a GPU: the time its stream stood still
// at the waits, FsdpState::exposed_seconds); the rest of its busy time ran while this thread
// computed (overlapped).
std::string step_line(const StepMetrics& metrics, const StepFigures& figures) {
  char exposure[64] = "";
  std::snprintf(exposure, sizeof(exposure), " (exposed %.3f s)", metrics.exposed);
  char skips[96] = "";
  if (figures.skipped) {
    std::snprintf(skips, sizeof(skips), " | skipped: %s (%lld in all)", figures.skip_reason.c_str(),
                  static_cast<long long>(figures.skipped_steps));
  } else if (figures.skipped_steps > 0) {
    std::snprintf(skips, sizeof(skips), " | %lld skipped", static_cast<long long>(figures.skipped_steps));
  }
  char scale[48] = "";
  if (figures.loss_scale > 0) std::snprintf(scale, sizeof(scale), " | scale %g", figures.loss_scale);
  char line[464];
  std::snprintf(line, sizeof(line),
                "| loss %.4f | lr %.2e | gnorm %.3f | %s %s | MFU %.1f%% | peak mem %s | comm %.3f s%s%s%s",
                metrics.loss, figures.lr, figures.grad_norm, format_count(figures.rate()).c_str(),
                figures.language ? "tok/s" : "img/s", 100.0 * figures.mfu(), format_bytes(metrics.peak_memory).c_str(),
                metrics.communication, exposure, scale, skips);
  return line;
}

nlohmann::json step_record(const StepMetrics& metrics, const StepFigures& figures) {
  nlohmann::json record = {{"step", figures.step + 1},
                           {"loss", metrics.loss},
                           {"lr", figures.lr},
                           {"grad_norm", figures.grad_norm},
                           {"step_seconds", figures.seconds},
                           {figures.language ? "tokens_per_second" : "images_per_second", figures.rate()},
                           {"mfu", figures.mfu()},
                           {"peak_flops", figures.peak_flops},
                           {"peak_resident_bytes_per_rank", std::vector<double>()},
                           {"communication_seconds_per_rank", std::vector<double>()},
                           {"peak_gathered_bytes", figures.peak_gathered_bytes},
                           {"gathered_wire_bytes", figures.gathered_wire_bytes},
                           {"skipped", figures.skipped},
                           {"skipped_steps", figures.skipped_steps}};
  if (figures.language) {
    // What padding and prompts do not inflate: the rate data.packing is judged by.
    record["trained_tokens"] = figures.trained_tokens;
    record["trained_tokens_per_second"] = static_cast<double>(figures.trained_tokens) / figures.seconds;
  }
  if (figures.save_in_flight) record["save_in_flight"] = true;
  if (figures.skipped) record["skip_reason"] = figures.skip_reason;
  if (figures.loss_zscore != 0.0) record["loss_zscore"] = figures.loss_zscore;
  if (figures.loss_scale > 0) {
    record["loss_scale"] = figures.loss_scale;
    record["overflow_steps"] = figures.overflow_steps;
  }
  if (figures.profiled) record["profiled"] = true;
  if (!figures.on_cpu) record["peak_device_reserved_bytes_per_rank"] = std::vector<double>();
  const at::Tensor& per_rank = metrics.per_rank;
  for (int64_t r = 0; r < per_rank.size(0); ++r) {
    record["peak_resident_bytes_per_rank"].push_back(per_rank[r][1].item<double>());
    if (!figures.on_cpu) record["peak_device_reserved_bytes_per_rank"].push_back(per_rank[r][5].item<double>());
    const double busy = per_rank[r][2].item<double>(), waited = per_rank[r][4].item<double>();
    record["communication_seconds_per_rank"].push_back(busy);
    record["exposed_communication_seconds_per_rank"].push_back(waited);
    record["overlapped_communication_seconds_per_rank"].push_back(std::max(0.0, busy - waited));
    record["compute_seconds_per_rank"].push_back(figures.seconds - waited);
  }
  return record;
}

}  // namespace fsdp::train
