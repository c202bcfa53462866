#include "fsdp/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <optional>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <atomic>
#include <thread>

#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/collective_log.h"
#include "fsdp/comm/device_group.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/comm/text_gather.h"
#include "fsdp/models/bf16_matmul.h"
#include "fsdp/runtime/cpu_features.h"
#include "fsdp/runtime/device_memory.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/shard/storage.h"
#include "fsdp/data/datasets.h"
#include "fsdp/data/sampler.h"
#include "fsdp/models/fused_ops.h"
#include "fsdp/optim/loss_scaler.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/nonfinite_guard.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/train/planning.h"
#include "fsdp/train/reporting.h"
#include "checkpoint_writer.h"
#include "fsdp/train/attention_kernel_choice.h"
#include "bf16_matmul_choice.h"
#include "evaluation.h"
#include "live_report.h"
#include "loss_spike.h"
#include "rollback.h"
#include "step_metrics.h"
#include "step_guard.h"
#include "step_profiler.h"
#include "targets.h"
#include "training_data.h"
#include "training_loop.h"
#include "training_task.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
}  // namespace

void request_stop() { g_stop_requested.store(true); }
bool stop_requested() { return g_stop_requested.load(); }

namespace {

class Trainer {
 public:
  Trainer(const TrainConfig& config, comm::ProcessGroupPtr world, TrainerOptions options)
      : config_(config), world_(std::move(world)), options_(options), rank_(world_->rank()), n_(world_->size()) {}
  ~Trainer() = default;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainSummary run() {
    prepare();
    TrainSummary summary = train_loop();
    return summary;
  }

 private:
  bool leader() const { return rank_ == 0; }

  void prepare() {
    baseline_resident_bytes_ = peak_resident_bytes();
    trace_memory(rank_, 0, "launched");  // libtorch and MPI loaded: the process's own memory
    load_and_check_data();
    // The output directory: this run's, and no other job's (run_directory.h). Collective.
    claim_run_directory();
    set_threads();
    build_model();
    make_optimizer();
    resume_run();
    measure_peak_flops();
    open_output();
  }

  // Everything that can be wrong with the config or the data, checked on every rank first.
  void load_and_check_data() {
    std::string error;
    try {
      validate_for_world(config_, n_);
      config_.lora_base_dtype = resolved_lora_base_dtype(config_);  // "auto": the weights' own dtype
      data_ = load_data(config_);
      check_data_sizes(data_, config_, n_);
      if (models::is_language_model(config_.model)) model_config_ = resolve_model(config_, data_.vocab);
      else model_config_ = config_.model;
      task_ = make_training_task(config_, model_config_, data_, world_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::agree_on_failure(world_, error, "loading the data");
    check_same_data_everywhere();
  }

  // Intra-op threads: train.threads, or the cores shared among this node's ranks.
  void set_threads() {
    const comm::LaunchInfo launch = comm::launch_info_from_env();
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads_ = config_.threads > 0 ? static_cast<int>(config_.threads)
                                   : std::max(1, cores / std::max(1, launch.local_world_size));
    torch::set_num_threads(threads_);
  }

  // The model, sharded block by block as it is built (same seed on every rank), and the weights a
  // fine-tune starts from.
  void build_model() {
    {
      // Weights loaded below (init_from, or the checkpoint resumed) replace the random init: an NF4
      // base is then laid out, not quantized from it.
      const bool weights_follow = !config_.init_from.empty() || !resume_.empty();
      ShardedModel sharded =
          build_sharded_model(config_, language() ? models::vocab_size(model_config_) : 0, world_, weights_follow);
      model_ = sharded.model;
      state_ = sharded.state;
      device_ = state_->flat_params().empty() ? at::Device(at::kCPU) : state_->flat_params().front()->device();
    }
    trace_memory(rank_, 0, "built");
    if (config_.device_memory_fraction > 0.0)
      runtime::set_device_memory_fraction(device_, config_.device_memory_fraction);
    parameters_ = models::parameter_count(model_config_);
    if (!config_.init_from.empty() && resume_.empty()) {
      // Fine-tuning: published weights (Hugging Face names) or our own checkpoint's.
      if (checkpoint::is_checkpoint_dir(config_.init_from)) {
        checkpoint::load_checkpoint(config_.init_from, *state_, nullptr);
      } else {
        checkpoint::import_weights(*state_, model_config_, config_.init_from);
      }
      trace_memory(rank_, 0, "loaded");
    }
    if (!config_.lora_init_adapter.empty() && resume_.empty()) {
      // Continuing a LoRA fine-tune: the adapters from PEFT's directory (the base is init_from's).
      checkpoint::import_peft_adapter(*state_, model_config_, config_.lora_init_adapter);
    }
  }

  void make_optimizer() {
    const auto& o = config_.optimizer;
    if (o.name == optim::OptimizerKind::AdamW) {
      optim::AdamWOptions options{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
      options.kernel = o.kernel;
      optimizer_ = std::make_unique<optim::ShardedAdamW>(*state_, options);
    } else {
      optimizer_ = std::make_unique<optim::ShardedSgd>(*state_, optim::SgdOptions{o.lr, o.momentum, o.weight_decay});
    }
    schedule_ = optim::WarmupCosineSchedule{o.lr, o.min_lr, o.warmup_steps, config_.steps};
  }

  // Resuming: parameters, optimizer state and RNG from the checkpoint; the sampler and the
  // schedule need nothing but the step.
  void resume_run() {
    if (!resume_.empty()) {
      const std::string& path = resume_;
      const checkpoint::CheckpointInfo info = checkpoint::load_checkpoint(path, *state_, optimizer_.get());
      comm::on_every_rank(world_, "restoring the loss-spike window and loss scale",
                          [&] { guard_.restore(info.trainer_state); });
      comm::on_every_rank(world_, "checking the checkpoint's step", [&] {
        if (info.step >= config_.steps) {
          throw std::runtime_error("checkpoint '" + path + "' is at step " + std::to_string(info.step) +
                                   ", and train.steps is " + std::to_string(config_.steps) + ": nothing left to train");
        }
      });
      start_step_ = info.step;
      resumed_from_ = path;
      // Batches an earlier rollback skipped stay skipped.
      comm::on_every_rank(world_, "reading the batches a rollback skipped",
                          [&] { skipped_batches_ = read_skipped_batches(skipped_batches_path()); });
    }
  }

  // How bf16 matmuls compute, then the matmul rate MFU is measured against (every rank at once, as
  // during training), and the heap trimmed before the first step.
  void measure_peak_flops() {
    // On a GPU against the compute dtype's peak (bf16: tensor cores). On the CPU against fp32's,
    // except where bf16 products run as bf16 (bf16 compute on a CPU whose bf16 GEMM
    // choose_bf16_matmul found faster: AMX, AVX512-BF16): fp32's rate is lower there, and MFU read
    // 167% for the 8 B QLoRA run on such a CPU (2026-12-06).
    choose_bf16_matmul();
    choose_attention_kernel();
    world_->barrier()->wait();
    const at::ScalarType compute_dtype = config_.fsdp.param_dtype;
    const bool native_bf16 = compute_dtype == at::kBFloat16 && models::bf16_matmul() == models::Bf16Matmul::Native;
    const at::ScalarType peak_dtype = !device_.is_cpu() || native_bf16 ? compute_dtype : at::kFloat;
    at::Tensor rate = at::tensor({measure_matmul_flops(0.3, device_, peak_dtype)}, at::kDouble);
    if (n_ > 1) world_->all_reduce(rate, comm::ReduceOp::Sum)->wait();
    peak_flops_ = rate.item<double>();

    // Construction's freed blocks go back to the OS before training (see release_free_host_memory).
    shard::release_free_host_memory();
  }

  // Output files, now that nothing is left to reject; the header and the run's first record.
  void open_output() {
    if (leader() && options_.write_files) {
      fs::create_directories(config_.output_dir);
      run_->commit();
      TrainConfig resolved = config_;
      resolved.model = model_config_;
      std::ofstream(fs::path(config_.output_dir) / "config.toml") << to_toml(resolved);
      metrics_ = MetricsLog((fs::path(config_.output_dir) / "metrics.jsonl").string(), /*append=*/start_step_ > 0);
      if (resumed_from_.empty()) fs::remove(skipped_batches_path());  // a new run trains every batch
    }
    progress_ =
        std::make_unique<Progress>(config_.steps, config_.log_every, leader() && options_.print, options_.progress);
    if (metrics_.is_open()) live_report_ = std::make_unique<LiveReport>(config_.output_dir, *progress_);
    checkpoints_ = std::make_unique<CheckpointWriter>(
        CheckpointWriter::Where{checkpoints_dir(config_), config_.checkpoint.keep, run_id(), leader()}, *state_,
        optimizer_.get(), *progress_, metrics_);
    print_header();
    record_run_start();
  }

  void print_header() {
    if (!leader() || !options_.print) return;
    const auto stats = state_->memory_stats();
    char line[512];
    std::string strategy = enum_name(config_.fsdp.strategy);
    if (state_->replicate_group()) {  // hybrid: R replica groups x S shard ranks
      strategy += " (" + std::to_string(state_->replicate_group()->size()) + " replicas x " +
                  std::to_string(state_->shard_group()->size()) + " shards)";
    }
    std::snprintf(line, sizeof(line),
                  "fsdp-train: %s (%s, %s parameters) on %d rank%s, %s, %zu units, %d thread%s per rank",
                  config_.model_name.c_str(), models::family_name(model_config_),
                  format_count(static_cast<double>(parameters_)).c_str(), n_, n_ == 1 ? "" : "s", strategy.c_str(),
                  state_->unit_names().size(), threads_, threads_ == 1 ? "" : "s");
    progress_->message(line);
    progress_->message("  data: " + data_.description);
    progress_->message(std::string("  collectives: ") +
                       (comm::device_comm_from_env() == comm::DeviceComm::kStaged
                            ? "staged, a test backend (FSDP_DEVICE_COMM=staged: device copies around MPI)"
                        : config_.device == c10::DeviceType::CUDA ? "NCCL, host tensors over MPI"
                                                                  : "MPI"));
    if (!data_.packing.empty()) progress_->message("  packing: " + data_.packing);
    if (const std::string line = task_->header_line(); !line.empty()) progress_->message(line);
    std::snprintf(
        line, sizeof(line),
        "  per rank: %s of parameter shards, %s of optimizer state; matmul peak %.1f GFLOP/s (all ranks, measured)",
        format_bytes(static_cast<double>(stats.sharded_param_bytes)).c_str(),
        format_bytes(static_cast<double>(optimizer_->state_bytes())).c_str(), peak_flops_ / 1e9);
    progress_->message(line);
    std::snprintf(line, sizeof(line), "  %lld steps of %lld %s (%lld per rank in %lld micro-batch%s), output in %s",
                  static_cast<long long>(config_.steps), static_cast<long long>(config_.global_batch),
                  language() ? ((data_.packing.empty() ? "windows of " : "packed rows of ") +
                                std::to_string(config_.seq_len) + " tokens")
                                   .c_str()
                             : "images",
                  static_cast<long long>(config_.global_batch / n_), static_cast<long long>(config_.micro_batches),
                  config_.micro_batches == 1 ? "" : "es",
                  options_.write_files ? config_.output_dir.c_str() : "(nothing written)");
    progress_->message(line);
    if (!resumed_from_.empty())
      progress_->message("  resumed from " + resumed_from_ + " at step " + std::to_string(start_step_));
    if (run_ && !run_->note().empty()) progress_->message("  " + run_->note());
    if (config_.fsdp.activation_checkpointing) {
      const std::vector<std::string> recomputed = state_->recomputed_unit_names();
      std::string names;
      for (const auto& name : recomputed) names += (names.empty() ? "" : ", ") + name;
      progress_->message(
          "  activation checkpointing: " + std::to_string(recomputed.size()) + " of " +
          std::to_string(state_->checkpointable_units()) + " blocks recomputed in backward (" +
          (recomputed.size() <= 8 ? names
                                  : "one block in " + std::to_string(config_.fsdp.activation_checkpointing_every)) +
          "; fsdp.activation_checkpointing_every = " + std::to_string(config_.fsdp.activation_checkpointing_every) +
          ")");
    }
    print_compute_lines();
  }

  // How the step computes: attention, bf16 matmuls, loss scaling, a warm-up longer than the run.
  void print_compute_lines() {
    char line[512];
    const at::ScalarType compute = config_.fsdp.param_dtype;
    progress_->message(std::string("  attention: ") + enum_name(models::attention_path(compute)) + " for " +
                       c10::toString(compute) + " compute (train.attention = " + enum_name(config_.attention) + ")");
    if (device_.is_cuda()) progress_->message(attention_kernel_line());
    if (compute == at::kBFloat16) {
      const bool without_instructions = config_.device == c10::DeviceType::CPU && !runtime::cpu_has_bf16_instructions();
      const bool native = models::bf16_matmul() == models::Bf16Matmul::Native;
      std::string why = without_instructions ? " (this CPU has no bf16 instructions: AVX512-BF16, AMX)" : "";
      if (bf16_matmul_times_) {
        std::snprintf(line, sizeof(line),
                      ", the faster here as measured at start (the model's linear layers, forward and backward: native "
                      "%.1f ms, fp32 GEMMs %.1f ms; rank 0's measurement)",
                      bf16_matmul_times_->native_seconds * 1e3, bf16_matmul_times_->fp32_seconds * 1e3);
        why = line;
      }
      progress_->message(std::string("  bf16 matmuls: ") +
                         (native ? "native bf16 GEMMs" : "fp32 GEMMs on bf16 operands") + why +
                         " (train.bf16_matmul = " + enum_name(config_.bf16_matmul) + ")");
      if (native && without_instructions) {
        progress_->message(
            "  note: without bf16 instructions libtorch's bf16 GEMM widens element by element: 6-14x slower "
            "than fp32 GEMMs on the AVX2 VM measured (docs/benchmarks.md); train.bf16_matmul = \"auto\" avoids it");
      }
    }
    if (const optim::DynamicLossScaler* scaler = guard_.scaler()) {
      const LossScaleConfig& l = config_.loss_scale;
      std::snprintf(
          line, sizeof(line),
          "  loss scaling: dynamic, scale %g (x%g after %lld clean steps, x%g on an overflow, floor %g; [loss_scale])",
          static_cast<double>(scaler->scale()), l.growth_factor, static_cast<long long>(l.growth_interval),
          l.backoff_factor, l.min);
      progress_->message(line);
    }
    if (config_.optimizer.warmup_steps > config_.steps) {
      // Accepted, as PyTorch schedulers and torchtitan accept it (a quick --set train.steps=2 trial).
      std::snprintf(line, sizeof(line),
                    "  note: optimizer.warmup_steps %lld exceeds train.steps %lld: the run ends still warming "
                    "up, at %.3g of its peak learning rate",
                    static_cast<long long>(config_.optimizer.warmup_steps), static_cast<long long>(config_.steps),
                    schedule_.lr_at(config_.steps - 1) / config_.optimizer.lr);
      progress_->message(line);
    }
  }

  bool language() const { return models::is_language_model(model_config_); }

  // The story of a run: evaluate, then step after step (run_step), every rank's figures agreed on
  // (agree_on_step) and recorded (record_step), and what follows a step (after_step): a rollback,
  // a stop, a checkpoint, targets, an evaluation, the live report.
  TrainSummary train_loop() {
    LoopState loop = start_loop();
    for (int64_t step = start_step_; step < config_.steps; ++step) {
      const StepResult result = run_step(step, loop);
      const AgreedStep agreed = agree_on_step(result, loop);
      record_step(result, agreed, loop);
      const AfterStep next = after_step(result, agreed, loop);
      if (next.end) break;
      if (next.resume_at >= 0)
        step = next.resume_at - 1;  // rolled back: the loop's ++step continues at the checkpoint's step
    }
    return finish_loop(loop);
  }

  LoopState start_loop() {
    // Non-finite steps, loss spikes and set-aside batches are skipped (step_guard.h); a streak of
    // them rolls the run back (guard.rollback_after). Counts start afresh on resume; the spike
    // window comes from the checkpoint.
    LoopState loop(data::GlobalBatchSampler(data_.train->size(), config_.global_batch, config_.seed),
                   TargetMonitor(config_.targets, n_, language()));
    loop.summary.parameters = parameters_;
    loop.summary.dropped_examples = data_.dropped_examples;
    loop.micro = config_.global_batch / n_ / config_.micro_batches;
    loop.samples_per_step =
        static_cast<double>(config_.global_batch) * (language() ? static_cast<double>(config_.seq_len) : 1.0);
    loop.flops_per_step = loop.samples_per_step * models::flops_per_sample(model_config_, task_->flops_sequence());
    loop.summary.start_step = start_step_;
    loop.summary.evals.push_back(evaluate(start_step_));
    loop.communication_before = state_->communication_seconds();
    loop.exposed_before = state_->exposed_seconds();
    loop.loss_faults = loss_faults_from_env();
    // A resumed run profiles what is left of the range (none of it: said, not an error).
    loop.profile_first = options_.profile_first;
    if (loop.profile_first > 0 && loop.profile_first <= start_step_) {
      loop.profile_first = options_.profile_last > start_step_ ? start_step_ + 1 : 0;
      if (loop.profile_first == 0) {
        progress_->message("  --profile-steps " + std::to_string(options_.profile_first) + ":" +
                           std::to_string(options_.profile_last) + ": the run resumes after step " +
                           std::to_string(start_step_) + ", so nothing is profiled");
      }
    }
    loop.profiler = std::make_unique<StepProfiler>(
        loop.profile_first, options_.profile_last,
        config_.output_dir + "/profile/trace-rank" + std::to_string(rank_) + ".json", device_);
    return loop;
  }

  // One step on this rank: its micro-batches forward and backward, the gradient norm (clipped),
  // the guard's verdict (every rank judges the same all-reduced figures) and the optimizer.
  StepResult run_step(int64_t step, LoopState& loop) {
    StepResult r;
    r.step = step;
    r.start = Clock::now();
    comm::begin_collective_step(step + 1);  // the step's collectives are fingerprinted from here
    r.gathered_bytes_before = state_->comm_stats().gathered_bytes;
    loop.profiler->begin_step(step + 1);
    r.profiled = loop.profiler->active();
    r.lr = schedule_.lr_at(step);
    optimizer_->set_lr(r.lr);
    optimizer_->zero_grad();
    trace_memory(rank_, step, "start");
    r.save_in_flight = checkpoints_->in_flight();
    const std::vector<int64_t> indices = loop.sampler.indices(step, rank_, n_);
    // The loss is the mean over the global batch's counted targets (instruction examples count
    // only their trained tokens, so ranks and micro-batches hold different counts). Every rank
    // counts the whole global batch itself (no communication), and scales its sum by N / count:
    // the gradients' average over the N ranks is then the global mean's gradient.
    for (int64_t index : loop.sampler.indices(step, 0, 1)) r.global_targets += data_.train->target_count(index);
    double loss_scale = static_cast<double>(n_) / static_cast<double>(std::max<int64_t>(1, r.global_targets));
    if (const auto fault = loop.loss_faults.find(step + 1); fault != loop.loss_faults.end())
      loss_scale *= fault->second;
    // A batch a rollback skips is not trained: the step moves the schedule and nothing else.
    const bool batch_skipped = skipped_batches_.count(step) > 0;
    // Summed on the model's device and read once after the optimizer: an .item() per micro-batch
    // would make the host wait for each backward on a GPU.
    r.loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
    // float16 compute: backward runs on the loss times the scale (optim/loss_scaler.h); the
    // gradient shards are divided by it before the norm. The recorded loss is unscaled.
    optim::DynamicLossScaler* const scaler = guard_.scaler();
    r.loss_scaled = scaler != nullptr;
    r.loss_scale = scaler != nullptr ? scaler->scale() : 1.0f;
    for (int64_t m = 0; m < (batch_skipped ? 0 : config_.micro_batches); ++m) {
      const std::vector<int64_t> part(indices.begin() + m * loop.micro, indices.begin() + (m + 1) * loop.micro);
      state_->set_requires_gradient_sync(config_.sync_each_micro_batch || m + 1 == config_.micro_batches);
      // What backward brings to the micro-batch's sum, rounded as autograd's fp32 products round it.
      const float loss_gradient = static_cast<float>(loss_scale) * (scaler != nullptr ? r.loss_scale : 1.0f);
      const at::Tensor loss = micro_batch_loss(part, step, loss_gradient) * loss_scale;
      trace_memory(rank_, step, "forward");
      (scaler != nullptr ? loss * r.loss_scale : loss).backward();
      trace_memory(rank_, step, "backward");
      r.loss_sum += loss.detach();
    }
    const at::Tensor unread_norm = clip_and_step(step, batch_skipped, r);
    trace_memory(rank_, step, "optimizer");
    shard::synchronize_current_stream(device_);  // a GPU step's time includes its queued kernels
    if (unread_norm.defined()) judge_after_the_update(step, unread_norm, r);
    const std::string trace = loop.profiler->end_step(step + 1);
    if (!trace.empty())
      progress_->message("  profile of steps " + std::to_string(loop.profile_first) + "-" +
                         std::to_string(options_.profile_last) + " written: " + trace + " (and the other ranks')");
    return r;
  }

  // The step's edge: the gradient norm (clipped), the guard's verdict and the optimizer. Every rank
  // judges the same all-reduced norm (and loss): the same verdict everywhere. Without the spike
  // guard the verdict is "the norm is finite", which the optimizer applies on the device
  // (step_unless): the host issues the update without waiting for backward and the norm's
  // all-reduce, and returns the norm unread for judge_after_the_update. The spike guard judges the
  // step's loss before its update: the host waits for the norm and the loss here (undefined return).
  at::Tensor clip_and_step(int64_t step, bool batch_skipped, StepResult& r) {
    RECORD_USER_SCOPE("fsdp::clip_and_step");  // tests/dist/step_edge_test.cpp counts host reads inside
    if (batch_skipped) {
      r.verdict = guard_.judge(step, /*batch_skipped=*/true, 0.0, 0.0);
      return at::Tensor();
    }
    if (const optim::DynamicLossScaler* scaler = guard_.scaler()) optim::unscale_grad_shards(*state_, *scaler);
    const at::Tensor norm = config_.grad_clip > 0 ? optim::clip_grad_norm_tensor(*state_, config_.grad_clip)
                                                  : optim::grad_norm_tensor(*state_);
    trace_memory(rank_, step, "clip");
    if (guard_.judges_before_the_update()) {
      judge(step, norm, r);
      if (r.verdict.apply) optimizer_->step();
      return at::Tensor();
    }
    optimizer_->step_unless(optim::nonfinite_flag(norm));
    return norm;
  }

  // Once the step's device work is done: the norm read and the guard's verdict recorded. It is the
  // device's (applied exactly when the norm is finite); a skipped step is uncounted, as one never
  // taken.
  void judge_after_the_update(int64_t step, const at::Tensor& unread_norm, StepResult& r) {
    judge(step, unread_norm, r);
    if (r.verdict.apply != std::isfinite(r.norm)) {
      throw std::logic_error("step " + std::to_string(step + 1) + ": the guard's verdict (" +
                             (r.verdict.apply ? "apply" : r.verdict.reason) + ") is not the device's (norm " +
                             std::to_string(r.norm) + ")");
    }
    if (!r.verdict.apply) optimizer_->uncount_step();
  }

  // The guard's verdict on a trained batch: the norm read (a wait on a GPU), and the loss agreed over
  // the ranks where the guard needs it.
  void judge(int64_t step, const at::Tensor& norm, StepResult& r) {
    r.norm = norm.item<double>();
    const double agreed_loss = guard_.needs_loss(r.norm) ? all_ranks_loss(r.loss_sum) : 0.0;
    r.verdict = guard_.judge(step, /*batch_skipped=*/false, r.norm, agreed_loss);
  }

  // A batch's host tensor on the training device. On a GPU through pinned memory, a copy the host
  // does not wait for: CUDA synchronises the stream before a copy from pageable memory, so a later
  // micro-batch's inputs would hold the host until the previous micro-batch's backward had run. The
  // pinned block is libtorch's caching host allocator's, not reused before the copy is done.
  at::Tensor to_training_device(const at::Tensor& host) const {
    if (!device_.is_cuda()) return host.to(device_);
    return host.pin_memory().to(device_, /*non_blocking=*/true);
  }

  // One micro-batch's summed loss (before the step's scale), forward only: the examples `part`,
  // augmented as data.augment says, through the family's loss; `loss_gradient` is what backward will
  // bring to that sum (MicroBatch::loss_gradient).
  at::Tensor micro_batch_loss(const std::vector<int64_t>& part, int64_t step, double loss_gradient) {
    data::Batch batch = data_.train->get(part);
    const data::ImageAugment augment = config_.data.augment;
    if (data::shifts(augment)) {
      // Background: a black pixel after normalisation.
      data::random_shift(batch.inputs, part, step, config_.seed, 2, -data::kFashionMnistMean / data::kFashionMnistStd);
    }
    if (data::flips(augment)) data::random_horizontal_flip(batch.inputs, part, step, config_.seed);
    MicroBatch micro;
    micro.inputs = to_training_device(batch.inputs);
    micro.targets = to_training_device(batch.targets);
    if (batch.positions.defined()) micro.positions = to_training_device(batch.positions);  // packed rows
    micro.labels = batch.targets;
    micro.indices = &part;
    micro.step = step;
    micro.loss_gradient = loss_gradient;
    return task_->loss_sum(model_, micro);
  }

  // One small all-gather per step: every rank's loss, peak memory, communication time (busy, and
  // exposed: the time this thread, or on a GPU its stream, waited for it), and whether it was
  // asked to stop (so every rank stops at the same step). Ranks whose collectives differed stop
  // here.
  AgreedStep agree_on_step(const StepResult& r, LoopState& loop) {
    RankStepFacts mine;
    // First: reading the loss waits for the step's device work, the stream waits among it (their
    // events read by exposed_seconds()).
    mine.loss = r.loss_sum.item<double>();
    const double communication_now = state_->communication_seconds();
    const double exposed_now = state_->exposed_seconds();
    mine.peak_resident_bytes = static_cast<double>(peak_resident_bytes());
    mine.communication_seconds = communication_now - loop.communication_before;
    mine.stop_requested = stop_requested();
    mine.exposed_seconds = exposed_now - loop.exposed_before;
    mine.device_peak_reserved_bytes = static_cast<double>(runtime::device_peak_reserved_bytes(device_));
    mine.step_seconds = std::chrono::duration<double>(Clock::now() - r.start).count();
    mine.collectives = comm::collective_fingerprint();
    loop.communication_before = communication_now;
    loop.exposed_before = exposed_now;
    AgreedStep agreed;
    agreed.metrics = gather_step_metrics(world_, mine, device_.is_cpu());
    // A silent wrong pairing, or one about to hang, stops every rank before a checkpoint could keep
    // the damage, naming the first collective that differed.
    comm::check_collectives_agree(world_, agreed.metrics.collectives, state_->group()->needs_one_issue_order());
    agreed.seconds = std::chrono::duration<double>(Clock::now() - r.start).count();
    loop.training_seconds += agreed.seconds;
    return agreed;
  }

  // The step in the summary, the progress line and metrics.jsonl.
  void record_step(const StepResult& r, const AgreedStep& agreed, LoopState& loop) {
    const double loss = agreed.metrics.loss;
    loop.summary.losses.push_back(loss);
    loop.summary.grad_norms.push_back(r.norm);
    loop.step_seconds.push_back(agreed.seconds);
    if (r.verdict.apply &&
        !std::isfinite(loss)) {  // a non-finite loss whose gradients were finite (a skipped step is the guard's)
      throw std::runtime_error("training diverged: loss is " + std::to_string(loss) + " at step " +
                               std::to_string(r.step) + " (lower optimizer.lr or set train.grad_clip)");
    }
    loop.summary.skipped_steps = guard_.skipped_steps();
    loop.summary.overflow_steps = guard_.overflow_steps();
    if (r.loss_scaled) loop.summary.loss_scales.push_back(r.loss_scale);

    StepFigures figures;
    figures.step = r.step;
    figures.lr = r.lr;
    figures.grad_norm = r.norm;
    figures.seconds = agreed.seconds;
    figures.samples_per_step = loop.samples_per_step;
    figures.trained_tokens = r.global_targets;
    figures.save_in_flight = r.save_in_flight;
    figures.flops_per_step = loop.flops_per_step;
    figures.peak_flops = peak_flops_;
    figures.language = language();
    figures.on_cpu = device_.is_cpu();
    figures.peak_gathered_bytes = state_->memory_stats().peak_gathered_bytes;
    figures.gathered_wire_bytes = state_->comm_stats().gathered_bytes - r.gathered_bytes_before;
    figures.skipped = !r.verdict.apply;
    figures.skipped_steps = guard_.skipped_steps();
    figures.skip_reason = r.verdict.reason;
    figures.loss_zscore = r.verdict.zscore;
    figures.loss_scale = r.loss_scaled ? r.loss_scale : 0.0;
    figures.overflow_steps = guard_.overflow_steps();
    figures.profiled = r.profiled;
    progress_->step(r.step, step_line(agreed.metrics, figures), loop.training_seconds);
    if (leader() && metrics_.is_open()) metrics_.write(step_record(agreed.metrics, figures).dump());
  }

  // What follows a step, in order: a rollback the guard asks for, a stop it decided, the async save
  // published, a stop request (checkpoint and end), the checkpoint cadence, targets and the
  // evaluation they may judge, the live report. Every rank decides alike from agreed figures.
  AfterStep after_step(const StepResult& r, const AgreedStep& agreed, LoopState& loop) {
    const int64_t step = r.step;
    TrainSummary& summary = loop.summary;
    if (guard_.rollback_due()) {
      // Back to the last checkpoint before the skipped steps; their batches are skipped from now on.
      finish_save(/*wait=*/true);  // the checkpoint to return to may be the one in flight
      const int64_t to = roll_back(guard_.streak_start(), step, ++loop.rollbacks, summary, loop.step_seconds);
      guard_.rolled_back();
      return {false, to};
    }
    // Every rank reached the same decision from the same norm: they stop together, rank 0 says why.
    if (!r.verdict.stop.empty()) {
      finish_save(/*wait=*/true);  // a checkpoint in flight is published first: the one to resume from
      throw comm::AgreedStop(r.verdict.stop, leader());
    }
    const bool last = step + 1 == config_.steps;
    finish_save(/*wait=*/false);  // checkpoint.async: published once every rank has written it
    if (agreed.metrics.stop) {
      g_stop_requested.store(false);  // handled: a later train() in this process starts afresh
      summary.last_checkpoint = save(step + 1, /*in_background=*/false);  // the run ends on it: nothing to overlap
      summary.preempted = true;
      progress_->message("stopped on request after step " + std::to_string(step + 1) + "; checkpoint " +
                         summary.last_checkpoint + " (continue with --resume latest)");
      write_live_report();
      return {true, -1};
    }
    if (config_.checkpoint.every > 0 && ((step + 1) % config_.checkpoint.every == 0 || last)) {
      summary.last_checkpoint = save(step + 1);
      loop.last_saved_step = step + 1;
    }
    if (judge_targets(step, last, agreed.metrics, loop)) return {true, -1};
    if (config_.report_every > 0 && (step + 1) % config_.report_every == 0 && !last)
      write_live_report(/*in_background=*/true);
    return {};
  }

  // Targets judge figures every rank holds alike (all-gathered, or all-reduced evaluations), so
  // every rank reaches the same verdict at the same step: the agreed step time (the slowest rank's,
  // up to the gather), the largest rank's peak memory, the training time so far. Evaluates where
  // eval.every (or the last step) says. Returns true where targets.stop ends the run here.
  bool judge_targets(int64_t step, bool last, const StepMetrics& metrics, LoopState& loop) {
    TrainSummary& summary = loop.summary;
    loop.agreed_training_seconds += metrics.step_seconds;
    std::vector<TargetMiss> misses =
        loop.targets.after_step(step + 1, loop.samples_per_step / metrics.step_seconds, metrics.step_seconds,
                                metrics.peak_memory, loop.agreed_training_seconds);
    if (last || (config_.eval.every > 0 && (step + 1) % config_.eval.every == 0)) {
      summary.evals.push_back(evaluate(step + 1));
      for (auto& miss : loop.targets.after_evaluation(step + 1, summary.evals.back().loss, last))
        misses.push_back(std::move(miss));
    }
    for (const auto& miss : misses) record_missed_target(miss, summary);
    if (misses.empty() || !config_.targets.stop) return false;
    // Every rank saw the same figures: all stop here, with a checkpoint (exit status 3).
    summary.stopped_by_target = true;
    if (last) return false;  // the run ends here anyway: finish it (sample, footer, report)
    if (loop.last_saved_step != step + 1) summary.last_checkpoint = save(step + 1, /*in_background=*/false);
    progress_->message("stopping after step " + std::to_string(step + 1) + " (targets.stop = true); checkpoint " +
                       summary.last_checkpoint);
    loop.stopped_early = true;
    write_live_report();
    return true;
  }

  // The end of the loop: the save in flight waited for; a run that ran to its end gets its rate,
  // a sample, the footer and the report.
  TrainSummary finish_loop(LoopState& loop) {
    TrainSummary& summary = loop.summary;
    finish_save(/*wait=*/true);  // the end of the run (a stop request's and a target's included) waits for it
    summary.seconds = loop.training_seconds;
    if (summary.preempted || loop.stopped_early) return summary;
    if (loop.step_seconds.size() > 1) {
      std::vector<double> rest(loop.step_seconds.begin() + 1, loop.step_seconds.end());
      std::nth_element(rest.begin(), rest.begin() + rest.size() / 2, rest.end());
      summary.samples_per_second = loop.samples_per_step / rest[rest.size() / 2];
    } else {
      summary.samples_per_second = loop.samples_per_step / loop.step_seconds.front();
    }
    if (language() && config_.eval.sample_tokens > 0 && data_.tokenizer) summary.sample = generate();
    print_footer(summary);
    write_live_report();
    return summary;
  }

  // Every rank must read the same token files: a different copy on another host would give its
  // ranks other tokens (and another order), silently. Collective; every rank stops alike.
  void check_same_data_everywhere() {
    if (n_ == 1) return;
    const std::vector<std::string> all = comm::all_gather_text(world_, data_.fingerprint);
    std::string mismatch;
    for (int r = 1; r < n_ && mismatch.empty(); ++r) {
      if (all[r] != all[0]) {
        mismatch = "the ranks read different data: rank 0 has " + all[0] + ", rank " + std::to_string(r) + " has " +
                   all[r] + " (another copy of the token files on another host?)";
      }
    }
    comm::agree_on_failure(world_, mismatch, "checking that every rank reads the same data");
  }

  // This run's id ("" when it writes nothing): its checkpoints carry it, pruning and rollbacks take
  // only its own.
  std::string run_id() const { return run_ ? run_->run_id() : std::string(); }

  // Sets run_ and resume_: the directory claimed (or given claimed), or without files, `resume` as
  // given ("latest": the newest checkpoint under checkpoint.dir).
  void claim_run_directory() {
    if (options_.write_files) {
      run_ = options_.run ? options_.run : RunDirectory::claim(config_, options_.resume, world_);
      if (run_->finished()) {
        throw std::runtime_error("checkpoint '" + run_->resume_from() + "' is at step " +
                                 std::to_string(run_->resume_step()) + ", and train.steps is " +
                                 std::to_string(config_.steps) + ": the run is done, nothing left to train");
      }
      resume_ = run_->resume_from();
      return;
    }
    resume_ = options_.resume;
    if (resume_ != "latest") return;
    comm::on_every_rank(world_, "finding the checkpoint to resume from", [&] {
      resume_ = checkpoint::find_latest_checkpoint(checkpoints_dir(config_));
      if (resume_.empty())
        throw std::runtime_error("--resume latest: no checkpoint under '" + checkpoints_dir(config_) + "'");
    });
  }

  // Where a rollback keeps the steps whose batches are skipped (rollback.h).
  std::string skipped_batches_path() const { return (fs::path(config_.output_dir) / "skipped_batches.json").string(); }

  // The global batch's mean loss, all ranks' shares summed (loss_sum: this rank's share, a scalar on
  // the model's device). Every rank gets the same value.
  double all_ranks_loss(const at::Tensor& loss_sum) {
    at::Tensor total = loss_sum.to(at::kCPU).reshape({1}).clone();
    if (n_ > 1) world_->all_reduce(total, comm::ReduceOp::Sum)->wait();
    return total.item<double>() / static_cast<double>(n_);
  }

  // Rolls back after the skipped steps [first_skipped, last_skipped] (0-based) (rollback.h) and
  // records it. Returns the checkpoint's step. Collective.
  int64_t roll_back(int64_t first_skipped, int64_t last_skipped, int64_t rollback, TrainSummary& summary,
                    std::vector<double>& step_seconds) {
    const RolledBack back =
        roll_back_to_checkpoint({config_, world_, *state_, optimizer_.get(), guard_, skipped_batches_,
                                 skipped_batches_path(), leader() && options_.write_files, run_id()},
                                first_skipped, last_skipped, rollback);
    const checkpoint::CheckpointInfo& info = back.info;
    const std::string& path = back.path;
    const std::string steps = "steps " + std::to_string(first_skipped + 1) + "-" + std::to_string(last_skipped + 1);
    // The discarded steps leave the summary, as a resume from that checkpoint would.
    const size_t kept = static_cast<size_t>(std::max<int64_t>(0, info.step - start_step_));
    if (summary.losses.size() > kept) summary.losses.resize(kept);
    if (summary.grad_norms.size() > kept) summary.grad_norms.resize(kept);
    if (summary.loss_scales.size() > kept) summary.loss_scales.resize(kept);
    if (step_seconds.size() > kept) step_seconds.resize(kept);
    ++summary.rollbacks;
    const std::string message = "guard: " + steps + " skipped in a row; rolled back to " + path + " (step " +
                                std::to_string(info.step) + "), their batches skipped from now on (rollback " +
                                std::to_string(rollback) + " of at most " +
                                std::to_string(config_.guard.max_rollbacks) + ")";
    progress_->message(message);
    if (leader() && metrics_.is_open()) {
      std::vector<int64_t> skipped;
      for (int64_t s = first_skipped; s <= last_skipped; ++s) skipped.push_back(s + 1);
      metrics_.write(nlohmann::json{
          {"rollback_to", info.step},
          {"from_step", last_skipped + 1},
          {"checkpoint", path},
          {"skipped_batch_steps", skipped},
          {"message",
           message}}.dump());
    }
    return info.step;
  }

  // One line, a metrics.jsonl record (the report marks it), and the summary's list.
  void record_missed_target(const TargetMiss& miss, TrainSummary& summary) {
    progress_->message(miss.message);
    summary.missed_targets.push_back(miss.message);
    if (leader() && metrics_.is_open()) {
      metrics_.write(nlohmann::json{
          {"target_missed", miss.key},
          {"step", miss.step},
          {"value", miss.value},
          {"limit", miss.limit},
          {"message",
           miss.message}}.dump());
    }
  }

  // report.html from the metrics so far (live_report.h); in_background: off the step.
  void write_live_report(bool in_background = false) {
    if (live_report_) live_report_->write(in_background);
  }

  // train.bf16_matmul = "auto" for bf16 compute on a CPU: measured at start (bf16_matmul_choice.h).
  void choose_bf16_matmul() {
    const bool bf16 = config_.fsdp.param_dtype == at::kBFloat16;
    if (config_.bf16_matmul || !bf16 || !device_.is_cpu()) return;  // the same on every rank
    // GEMM rows per example: a language model's window, a chat's row, an image's patches and class token.
    const int64_t tokens = task_->gemm_rows_per_sample();
    const int64_t examples =
        std::max<int64_t>(1, config_.global_batch / n_ / std::max<int64_t>(1, config_.micro_batches));
    bf16_matmul_times_ = choose_bf16_matmul_by_timing(*model_.module, examples * std::max<int64_t>(1, tokens), world_);
  }

  // train.attention_kernel on a GPU: the kernel named, or the fastest for the model's attention on a
  // micro-batch, measured at start (attention_kernel_choice.h). The CPU's kernel ignores the order.
  void choose_attention_kernel() {
    if (!device_.is_cuda()) return;  // the same on every rank
    const at::ScalarType compute = config_.fsdp.param_dtype;
    const models::AttentionPath path = models::attention_path(compute);
    if (path == models::AttentionPath::Math) return;  // no fused kernel runs: the header says so
    models::settle_attention_kernel_order(device_);   // libtorch's own order on this GPU, before any preference
    std::optional<models::AttentionCall> call;
    if (language()) call = models::attention_call(model_config_, config_.seq_len);
    if (call) {
      call->batch = std::max<int64_t>(1, config_.global_batch / n_ / std::max<int64_t>(1, config_.micro_batches));
      call->masked = call->masked || config_.data.packing || config_.data.document_masking;
    }
    const at::ScalarType dtype = path == models::AttentionPath::FusedFp32 ? at::kFloat : compute;
    attention_kernel_choice_ = choose_attention_kernel_for(config_.attention_kernel, call, dtype, device_, world_);
  }

  std::string attention_kernel_line() const {
    const std::string setting = std::string(" (train.attention_kernel = ") + enum_name(config_.attention_kernel) + ")";
    // libtorch's own order: flash first, or cuDNN on Hopper and later (attention_kernel.h).
    const std::optional<models::AttentionKernel> first = models::preferred_attention_kernel();
    const std::string own_order =
        std::string("  attention kernel: libtorch's own order (") + (first ? enum_name(*first) : "math") + " first)";
    if (models::attention_path(config_.fsdp.param_dtype) == models::AttentionPath::Math) {
      return "  attention kernel: none (train.attention = math)" + setting;
    }
    if (!attention_kernel_choice_) return own_order + setting;
    const AttentionKernelChoice& c = *attention_kernel_choice_;
    std::string line =
        c.kernel_preferred ? std::string("  attention kernel: ") + enum_name(c.kernel) + " first" : own_order;
    if (c.measured) {
      line += std::string(c.kernel_preferred ? ", the fastest here" : ", none right here") +
              " as measured at start ([" + std::to_string(c.call.batch) + ", " + std::to_string(c.call.heads) +
              " heads, " + std::to_string(c.call.tokens) + " tokens, " + std::to_string(c.call.head_dim) + "]" +
              (c.call.masked ? " masked" : " causal") + ", forward and backward:";
      char figure[64];
      for (const models::AttentionKernelTiming& t : c.timings) {
        if (std::isfinite(t.seconds)) {
          std::snprintf(figure, sizeof(figure), " %s %.2f ms", enum_name(t.kernel), t.seconds * 1e3);
        } else {
          std::snprintf(figure, sizeof(figure), " %s wrong, left out", enum_name(t.kernel));
        }
        line += figure;
      }
      line += "; rank 0's measurement)";
    } else if (!c.taken) {
      line += " (libtorch does not take it for this model's attention: it runs the next kernel in its order)";
    }
    return line + setting;
  }

  // The first record of every start (and resume): what the report needs besides the steps.
  void record_run_start() {
    if (!leader() || !metrics_.is_open()) return;
    TrainConfig resolved = config_;
    resolved.model = model_config_;
    nlohmann::json record = {
        {"run_start", start_step_}, {"name", config_.name},          {"world_size", n_},
        {"language", language()},   {"resumed_from", resumed_from_}, {"config", to_toml(resolved)}};
    if (config_.fsdp.param_dtype == at::kBFloat16) record["bf16_matmul"] = enum_name(models::bf16_matmul());
    if (attention_kernel_choice_ && attention_kernel_choice_->kernel_preferred) {
      record["attention_kernel"] = enum_name(attention_kernel_choice_->kernel);
    }
    if (attention_kernel_choice_) {
      for (const models::AttentionKernelTiming& t : attention_kernel_choice_->timings)
        record["attention_kernel_seconds"][enum_name(t.kernel)] = t.seconds;
    }
    if (bf16_matmul_times_) {
      record["bf16_matmul_seconds"] = {{"native", bf16_matmul_times_->native_seconds},
                                       {"fp32", bf16_matmul_times_->fp32_seconds}};
    }
    try {
      // fsdp-plan's prediction for this config (fsdp-plan CONFIG --ranks N says the same), with the
      // data this run holds.
      plan::PlanInput input = plan_input(resolved, n_);
      input.data_bytes = held_bytes(data_);
      record["predicted_peak_bytes_per_rank"] = static_cast<double>(plan::make_plan(input).peak_bytes);
      if (device_.is_cpu()) {
        record["process_baseline_bytes"] =
            baseline_resident_bytes_;                   // rank 0's, against plan::kCpuProcessOverheadBytes
        record["host_heap"] = shard::host_heap_name();  // whose cache plan::kCpuHeapCacheBytes stands for
      }
    } catch (const std::exception&) {
      // No prediction for this configuration: the report says so.
    }
    const TargetsConfig& t = config_.targets;
    nlohmann::json targets = nlohmann::json::object();
    if (t.min_tokens_per_second > 0) targets["min_tokens_per_second"] = t.min_tokens_per_second;
    if (t.max_step_seconds > 0) targets["max_step_seconds"] = t.max_step_seconds;
    if (t.max_memory_per_rank > 0) targets["max_memory_per_rank"] = t.max_memory_per_rank;
    if (t.max_validation_loss > 0) targets["max_validation_loss"] = t.max_validation_loss;
    if (t.max_cost > 0) targets["max_cost"] = t.max_cost;
    record["targets"] = targets;
    metrics_.write(record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));  // paths need not be UTF-8
  }

  // A checkpoint of the state after `steps` steps (checkpoint_writer.h); rank 0 then keeps only
  // the newest ones. checkpoint.async: started, and published by finish_save at a later step
  // boundary. A save the run ends on (stop request, targets.stop) is written in the step: nothing
  // would overlap it, and its message names a published checkpoint.
  std::string save(int64_t steps) { return save(steps, config_.checkpoint.async); }
  std::string save(int64_t steps, bool in_background) {
    TrainConfig resolved = config_;
    resolved.model = model_config_;
    const checkpoint::CheckpointInfo info{steps, config_.model_name, to_toml(resolved), guard_.state(), run_id()};
    return checkpoints_->save(info, in_background, guard_.streak_start());
  }
  // Collective: every rank calls it at the same step boundaries.
  void finish_save(bool wait) { checkpoints_->finish(wait, guard_.streak_start()); }

  ModelInUse model_in_use() {
    return {model_, config_, world_, device_, language(), task_->class_prompts(), task_->chats()};
  }

  // Validation loss (and accuracy for images), shown and recorded (evaluation.h).
  EvalResult evaluate(int64_t step) {
    const EvalResult result = run_evaluation(model_in_use(), *data_.validation, step);
    const AccuracyKind kind = task_->accuracy_kind();
    progress_->message(
        evaluation_line(result, evaluation_items(config_, data_.validation->size(), language()), language(), kind));
    if (leader() && metrics_.is_open()) metrics_.write(evaluation_record(result, language(), kind).dump());
    return result;
  }

  // Sampled text (evaluation.h), written to sample.txt.
  std::string generate() {
    const bool chat = config_.data.source == DataSource::Instructions;
    const std::string text = generate_sample(model_in_use(), *data_.tokenizer, chat ? &data_.chat_format : nullptr);
    if (leader() && options_.write_files) std::ofstream(fs::path(config_.output_dir) / "sample.txt") << text;
    return text;
  }

  void print_footer(const TrainSummary& summary) {
    if (!leader() || !options_.print) return;
    const EvalResult& first = summary.evals.front();
    const EvalResult& last = summary.evals.back();
    char line[320];
    // A resumed run ran only the steps after its checkpoint, and its time is theirs.
    const std::string steps = std::to_string(config_.steps) + " steps" +
                              (start_step_ > 0 ? " (" + std::to_string(config_.steps - start_step_) +
                                                     " run here, resumed at step " + std::to_string(start_step_) + ")"
                                               : "");
    if (language()) {
      std::snprintf(line, sizeof(line), "done: %s in %s, %s tok/s (median); validation loss %.4f -> %.4f",
                    steps.c_str(), format_duration(summary.seconds).c_str(),
                    format_count(summary.samples_per_second).c_str(), first.loss, last.loss);
    } else {
      std::snprintf(line, sizeof(line), "done: %s in %s, %s img/s (median); %s accuracy %.2f%% -> %.2f%%",
                    steps.c_str(), format_duration(summary.seconds).c_str(),
                    format_count(summary.samples_per_second).c_str(), accuracy_name(task_->accuracy_kind()),
                    100.0 * first.accuracy, 100.0 * last.accuracy);
    }
    progress_->message(line);
    if (!summary.sample.empty()) progress_->message("sample:\n" + summary.sample);
  }

  TrainConfig config_;
  comm::ProcessGroupPtr world_;
  TrainerOptions options_;
  int rank_;
  int n_;
  int threads_ = 1;
  at::Device device_ = at::kCPU;  // where the shards live: batches go there, logits come back for the loss sums
  LoadedData data_;
  std::unique_ptr<TrainingTask> task_;  // what the model's task does (training_task.h), made with the data
  models::ModelConfig model_config_;
  models::BuiltModel model_;
  std::shared_ptr<runtime::FsdpState> state_;
  std::unique_ptr<optim::ShardedOptimizer> optimizer_;
  optim::WarmupCosineSchedule schedule_{1e-3, 1e-4, 0, 1};
  int64_t parameters_ = 0;
  int64_t baseline_resident_bytes_ =
      0;  // this process before data and model (what plan::kCpuProcessOverheadBytes stands for)
  int64_t start_step_ = 0;
  std::shared_ptr<RunDirectory> run_;  // the output directory's claim (null when nothing is written)
  std::string resume_;                 // the checkpoint to start from ("" : step 0)
  std::string resumed_from_;
  std::set<int64_t> skipped_batches_;  // 0-based steps whose batches a rollback skips (rollback.h)
  StepGuard guard_{config_};           // which steps apply; its spike window is saved in checkpoints
  double peak_flops_ = 1.0;
  std::optional<models::Bf16MatmulTimes> bf16_matmul_times_;      // measured by choose_bf16_matmul
  std::optional<AttentionKernelChoice> attention_kernel_choice_;  // by choose_attention_kernel (a GPU run)
  MetricsLog metrics_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<LiveReport> live_report_;        // rank 0 writing files (after progress_: it says failures there)
  std::unique_ptr<CheckpointWriter> checkpoints_;  // made with progress_ (it says each checkpoint there)
};

}  // namespace

TrainSummary train(const TrainConfig& config, const comm::ProcessGroupPtr& world, const TrainerOptions& options) {
  check_this_build_runs(config);  // fsdp-train refuses it before claiming the output directory too
  models::set_fused_ops(config.fused_ops);
  models::set_attention_path(config.fsdp.param_dtype, attention_path_for(config));
  // The attention kernel's preference (a GPU run's) is this run's: libtorch's order before and after.
  struct LibtorchOrder {
    LibtorchOrder() { models::restore_attention_kernel_order(); }
    ~LibtorchOrder() { models::restore_attention_kernel_order(); }
  } libtorch_order;
  models::set_bf16_matmul(bf16_matmul_for(config));
  Trainer trainer(config, world, options);
  return trainer.run();
}

}  // namespace fsdp::train
