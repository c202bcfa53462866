#include "fsdp/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <atomic>
#include <thread>

#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/launch.h"
#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/runtime/device_memory.h"
#include "fsdp/shard/storage.h"
#include "fsdp/data/datasets.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/optim/sharded_optimizer.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/train/reporting.h"

namespace fsdp::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
}  // namespace

void request_stop() { g_stop_requested.store(true); }
bool stop_requested() { return g_stop_requested.load(); }

namespace {

// Everything read from disk before the model is built.
struct LoadedData {
  std::unique_ptr<data::Tokenizer> tokenizer;  // language models from text
  std::unique_ptr<data::Dataset> train, validation;
  int64_t vocab = 0;
  std::string description;
};

LoadedData load_data(const TrainConfig& c) {
  LoadedData loaded;
  const auto& d = c.data;
  if (d.source == "fashion_mnist") {
    const std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
    loaded.train = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "train"));
    loaded.validation = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "test"));
    loaded.description = "Fashion-MNIST (" + dir + "): " + std::to_string(loaded.train->size()) + " training, " +
                         std::to_string(loaded.validation->size()) + " test images";
    return loaded;
  }
  std::shared_ptr<const data::TokenSource> train_tokens, validation_tokens;
  if (d.source == "fortunes") {
    const std::string dir = d.dir.empty() ? data::kFortunesDir : d.dir;
    loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt);
    auto split = data::split_documents(data::read_fortunes(dir), d.validation_percent);
    const int64_t vocab = loaded.tokenizer->vocab_size();
    train_tokens = std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.train, *loaded.tokenizer), vocab);
    validation_tokens =
        std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.validation, *loaded.tokenizer), vocab);
    loaded.description = "fortunes (" + dir + "), " + loaded.tokenizer->name() + " tokenizer: " +
                         std::to_string(split.train.size()) + " + " + std::to_string(split.validation.size()) +
                         " documents, ";
  } else {
    train_tokens = std::make_shared<data::TokenFile>(d.train_tokens);
    validation_tokens = std::make_shared<data::TokenFile>(d.validation_tokens);
    if (train_tokens->vocab_size() != validation_tokens->vocab_size()) {
      throw std::runtime_error("token files '" + d.train_tokens + "' and '" + d.validation_tokens +
                               "' have different vocabularies (" + std::to_string(train_tokens->vocab_size()) + " and " +
                               std::to_string(validation_tokens->vocab_size()) + ")");
    }
    if (d.tokenizer == "byte" && train_tokens->vocab_size() == 256) loaded.tokenizer = data::make_tokenizer("byte");
    if (d.tokenizer == "gpt2") loaded.tokenizer = data::make_tokenizer("gpt2", d.vocab_json, d.merges_txt);
    loaded.description = "token files " + d.train_tokens + ", " + d.validation_tokens + ": ";
  }
  loaded.vocab = train_tokens->vocab_size();
  loaded.description += format_count(static_cast<double>(train_tokens->size())) + " training and " +
                        format_count(static_cast<double>(validation_tokens->size())) + " validation tokens";
  loaded.train = std::make_unique<data::TokenWindows>(train_tokens, c.seq_len);
  loaded.validation = std::make_unique<data::TokenWindows>(validation_tokens, c.seq_len);
  return loaded;
}

// The model's vocabulary follows the data.
models::ModelConfig resolve_model(const TrainConfig& c, int64_t vocab) {
  if (c.model_vocab > 0 && c.model_vocab != vocab) {
    throw std::runtime_error(c.source + ": model.vocab " + std::to_string(c.model_vocab) + " differs from the data's vocabulary of " +
                             std::to_string(vocab) + " (leave model.vocab out to take the data's)");
  }
  models::ModelConfig model = c.model;
  if (auto* g = std::get_if<models::GptConfig>(&model)) g->vocab = vocab;
  if (auto* l = std::get_if<models::LlamaConfig>(&model)) l->vocab = vocab;
  return model;
}

runtime::FsdpOptions fsdp_options(const TrainConfig& c) {
  runtime::FsdpOptions options;
  options.strategy = runtime::sharding_strategy_from_string(c.fsdp.strategy);
  if (c.fsdp.wrap == "block") options.wrap_policy.module_types = {models::block_type_name(c.model)};
  if (c.fsdp.wrap == "min_params") options.wrap_policy.min_params = c.fsdp.min_params;
  if (c.fsdp.wrap != "root" && c.fsdp.embedding_units) {
    options.wrap_policy.module_paths = models::embedding_and_head_paths(c.model);
  }
  options.forward_prefetch = options.backward_prefetch = c.fsdp.prefetch;
  options.max_inflight = static_cast<int>(c.fsdp.max_inflight);
  auto dtype = [](const std::string& name) { return name == "bfloat16" ? at::kBFloat16 : at::kFloat; };
  options.mixed_precision.param_dtype = dtype(c.fsdp.param_dtype);
  options.mixed_precision.reduce_dtype = dtype(c.fsdp.reduce_dtype);
  options.activation_checkpointing = c.fsdp.activation_checkpointing;
  options.shard_group_size = static_cast<int>(c.fsdp.shard_group_size);
  options.cpu_offload = c.fsdp.cpu_offload;
  return options;
}

at::Tensor loss_of(const at::Tensor& model_output, const at::Tensor& targets, torch::nn::functional::CrossEntropyFuncOptions::reduction_t reduction) {
  const at::Tensor logits = model_output.to(at::kFloat);  // bf16 compute: the loss in fp32
  if (logits.dim() == 3) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1),
                                                torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
  }
  return torch::nn::functional::cross_entropy(logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(reduction));
}

}  // namespace

ShardedModel build_sharded_model(const TrainConfig& config, int64_t vocab, const comm::ProcessGroupPtr& group) {
  ShardedModel sharded;
  sharded.config = config.model;
  if (auto* g = std::get_if<models::GptConfig>(&sharded.config)) g->vocab = vocab;
  if (auto* l = std::get_if<models::LlamaConfig>(&sharded.config)) l->vocab = vocab;
  TrainConfig resolved = config;
  resolved.model = sharded.config;
  runtime::FsdpOptions options = fsdp_options(resolved);
  comm::ProcessGroupPtr fsdp_group = group;
  if (config.device == "cuda") {
    // One GPU per rank; NCCL over the same ranks, bootstrapped through `group` (host tensors still go there).
    const int device_index = comm::local_device_index();
    fsdp_group = comm::make_nccl_group(group, device_index);
    options.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  }
  torch::manual_seed(config.seed);  // the model is built on the CPU, the same on every rank, whatever the device
  runtime::BuildListener listener(fsdp_group, options);
  sharded.model = models::build_model(sharded.config);
  sharded.state = runtime::make_fsdp_state(sharded.model.module, fsdp_group, options, listener.take_units());
  return sharded;
}

namespace {

class Trainer {
 public:
  Trainer(const TrainConfig& config, comm::ProcessGroupPtr world, TrainerOptions options)
      : config_(config), world_(std::move(world)), options_(options), rank_(world_->rank()), n_(world_->size()) {}

  TrainSummary run() {
    prepare();
    TrainSummary summary = train_loop();
    return summary;
  }

 private:
  bool leader() const { return rank_ == 0; }

  void prepare() {
    // 1. Everything that can be wrong with the config or the data, checked on every rank first.
    std::string error;
    try {
      validate_for_world(config_, n_);
      data_ = load_data(config_);
      check_data_sizes();
      if (models::is_language_model(config_.model)) model_config_ = resolve_model(config_, data_.vocab);
      else model_config_ = config_.model;
    } catch (const std::exception& e) {
      error = e.what();
    }
    comm::agree_on_failure(world_, error, "loading the data");

    const comm::LaunchInfo launch = comm::launch_info_from_env();
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads_ = config_.threads > 0 ? static_cast<int>(config_.threads) : std::max(1, cores / std::max(1, launch.local_world_size));
    torch::set_num_threads(threads_);

    // 2. The model, sharded block by block as it is built (same seed on every rank).
    {
      ShardedModel sharded = build_sharded_model(config_, data_.vocab, world_);
      model_ = sharded.model;
      state_ = sharded.state;
      device_ = state_->flat_params().empty() ? at::Device(at::kCPU) : state_->flat_params().front()->device();
    }
    if (config_.device_memory_fraction > 0.0) runtime::set_device_memory_fraction(device_, config_.device_memory_fraction);
    parameters_ = models::parameter_count(model_config_);
    if (!config_.init_from.empty() && options_.resume.empty()) {
      // Fine-tuning: published weights (Hugging Face names) or our own checkpoint's.
      if (checkpoint::is_checkpoint_dir(config_.init_from)) {
        checkpoint::load_checkpoint(config_.init_from, *state_, nullptr);
      } else {
        checkpoint::import_weights(*state_, model_config_, config_.init_from);
      }
    }

    const auto& o = config_.optimizer;
    if (o.name == "adamw") {
      optimizer_ = std::make_unique<optim::ShardedAdamW>(*state_, optim::AdamWOptions{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay});
    } else {
      optimizer_ = std::make_unique<optim::ShardedSgd>(*state_, optim::SgdOptions{o.lr, o.momentum, o.weight_decay});
    }
    schedule_ = optim::WarmupCosineSchedule{o.lr, o.min_lr, o.warmup_steps, config_.steps};

    // Resuming: parameters, optimizer state and RNG from the checkpoint; the sampler and the
    // schedule need nothing but the step.
    if (!options_.resume.empty()) {
      std::string path = options_.resume;
      comm::on_every_rank(world_, "finding the checkpoint to resume from", [&] {
        if (path == "latest") {
          path = checkpoint::find_latest_checkpoint(checkpoints_dir(config_));
          if (path.empty()) {
            throw std::runtime_error("--resume latest: no checkpoint under '" + checkpoints_dir(config_) + "'");
          }
        }
      });
      const checkpoint::CheckpointInfo info = checkpoint::load_checkpoint(path, *state_, optimizer_.get());
      comm::on_every_rank(world_, "checking the checkpoint's step", [&] {
        if (info.step >= config_.steps) {
          throw std::runtime_error("checkpoint '" + path + "' is at step " + std::to_string(info.step) +
                                   ", and train.steps is " + std::to_string(config_.steps) + ": nothing left to train");
        }
      });
      start_step_ = info.step;
      resumed_from_ = path;
    }

    // 3. The matmul rate MFU is measured against: every rank at once, as during training.
    world_->barrier()->wait();
    // On a GPU against the compute dtype's peak (bf16: tensor cores); on the CPU against fp32's, as before.
    const at::ScalarType peak_dtype = device_.is_cpu() ? at::kFloat : fsdp_options(config_).mixed_precision.param_dtype;
    at::Tensor rate = at::tensor({measure_matmul_flops(0.3, device_, peak_dtype)}, at::kDouble);
    if (n_ > 1) world_->all_reduce(rate, comm::ReduceOp::Sum)->wait();
    peak_flops_ = rate.item<double>();

    // Construction's freed blocks go back to the OS before training (see release_free_host_memory).
    shard::release_free_host_memory();

    // 4. Output files, now that nothing is left to reject.
    if (leader() && options_.write_files) {
      fs::create_directories(config_.output_dir);
      TrainConfig resolved = config_;
      resolved.model = model_config_;
      std::ofstream(fs::path(config_.output_dir) / "config.toml") << to_toml(resolved);
      metrics_ = MetricsLog((fs::path(config_.output_dir) / "metrics.jsonl").string(), /*append=*/start_step_ > 0);
    }
    progress_ = std::make_unique<Progress>(config_.steps, config_.log_every, leader() && options_.print, options_.progress);
    print_header();
  }

  void check_data_sizes() {
    const int64_t local = config_.global_batch / n_;
    if (data_.train->size() < config_.global_batch) {
      throw std::runtime_error("the training data holds " + std::to_string(data_.train->size()) +
                               " samples, fewer than one global batch of " + std::to_string(config_.global_batch));
    }
    if (data_.validation->size() < n_) {
      throw std::runtime_error("the validation data holds " + std::to_string(data_.validation->size()) +
                               " samples, fewer than the " + std::to_string(n_) + " ranks");
    }
    (void)local;
  }

  void print_header() {
    if (!leader() || !options_.print) return;
    const auto stats = state_->memory_stats();
    char line[512];
    std::string strategy = config_.fsdp.strategy;
    if (state_->replicate_group()) {  // hybrid: R replica groups x S shard ranks
      strategy += " (" + std::to_string(state_->replicate_group()->size()) + " replicas x " +
                  std::to_string(state_->shard_group()->size()) + " shards)";
    }
    std::snprintf(line, sizeof(line), "fsdp-train: %s (%s, %s parameters) on %d rank%s, %s, %zu units, %d thread%s per rank",
                  config_.model_name.c_str(), models::family_name(model_config_),
                  format_count(static_cast<double>(parameters_)).c_str(), n_, n_ == 1 ? "" : "s",
                  strategy.c_str(), state_->unit_names().size(), threads_, threads_ == 1 ? "" : "s");
    progress_->message(line);
    progress_->message("  data: " + data_.description);
    std::snprintf(line, sizeof(line),
                  "  per rank: %s of parameter shards, %s of optimizer state; matmul peak %.1f GFLOP/s (all ranks, measured)",
                  format_bytes(static_cast<double>(stats.sharded_param_bytes)).c_str(),
                  format_bytes(static_cast<double>(optimizer_->state_bytes())).c_str(), peak_flops_ / 1e9);
    progress_->message(line);
    std::snprintf(line, sizeof(line), "  %lld steps of %lld %s (%lld per rank in %lld micro-batch%s), output in %s",
                  static_cast<long long>(config_.steps), static_cast<long long>(config_.global_batch),
                  language() ? ("windows of " + std::to_string(config_.seq_len) + " tokens").c_str() : "images",
                  static_cast<long long>(config_.global_batch / n_), static_cast<long long>(config_.micro_batches),
                  config_.micro_batches == 1 ? "" : "es", options_.write_files ? config_.output_dir.c_str() : "(nothing written)");
    progress_->message(line);
    if (!resumed_from_.empty()) progress_->message("  resumed from " + resumed_from_ + " at step " + std::to_string(start_step_));
  }

  bool language() const { return models::is_language_model(model_config_); }

  TrainSummary train_loop() {
    TrainSummary summary;
    summary.parameters = parameters_;
    data::GlobalBatchSampler sampler(data_.train->size(), config_.global_batch, config_.seed);
    const int64_t local = config_.global_batch / n_;
    const int64_t micro = local / config_.micro_batches;
    const double samples_per_step =
        static_cast<double>(config_.global_batch) * (language() ? static_cast<double>(config_.seq_len) : 1.0);
    const double flops_per_step = samples_per_step * models::flops_per_sample(model_config_, config_.seq_len);
    const char* rate_unit = language() ? "tok/s" : "img/s";

    summary.start_step = start_step_;
    summary.evals.push_back(evaluate(start_step_));
    std::vector<double> step_seconds;
    double communication_before = state_->communication_seconds();  // every sharding group
    double exposed_before = state_->comm_stats().exposed_seconds;
    double training_seconds = 0.0;
    for (int64_t step = start_step_; step < config_.steps; ++step) {
      const auto start = Clock::now();
      const double lr = schedule_.lr_at(step);
      optimizer_->set_lr(lr);
      optimizer_->zero_grad();
      trace_memory(rank_, step, "start");
      const std::vector<int64_t> indices = sampler.indices(step, rank_, n_);
      // Summed on the model's device and read once after the optimizer: an .item() per micro-batch
      // would make the host wait for each backward on a GPU.
      at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
      for (int64_t m = 0; m < config_.micro_batches; ++m) {
        std::vector<int64_t> part(indices.begin() + m * micro, indices.begin() + (m + 1) * micro);
        data::Batch batch = data_.train->get(part);
        const std::string& augment = config_.data.augment;
        if (augment == "shift" || augment == "shift+hflip") {
          // Background: a black pixel after normalisation.
          data::random_shift(batch.inputs, part, step, config_.seed, 2, -data::kFashionMnistMean / data::kFashionMnistStd);
        }
        if (augment == "hflip" || augment == "shift+hflip") data::random_horizontal_flip(batch.inputs, part, step, config_.seed);
        state_->set_requires_gradient_sync(config_.sync_each_micro_batch || m + 1 == config_.micro_batches);
        at::Tensor loss = loss_of(model_.forward(batch.inputs.to(device_)), batch.targets.to(device_), torch::kMean) /
                          static_cast<double>(config_.micro_batches);
        trace_memory(rank_, step, "forward");
        loss.backward();
        trace_memory(rank_, step, "backward");
        loss_sum += loss.detach();
      }
      const double norm = config_.grad_clip > 0 ? optim::clip_grad_norm(*state_, config_.grad_clip) : optim::grad_norm(*state_);
      trace_memory(rank_, step, "clip");
      optimizer_->step();
      trace_memory(rank_, step, "optimizer");
      shard::synchronize_current_stream(device_);  // a GPU step's time includes its queued kernels

      // One small all-gather per step: every rank's loss, peak memory, communication time (busy,
      // and exposed: the time this thread waited for it), and whether it was asked to stop (so
      // every rank stops at the same step).
      const double communication_now = state_->communication_seconds();
      const double exposed_now = state_->comm_stats().exposed_seconds;
      const double local_loss = loss_sum.item<double>();
      at::Tensor mine = at::tensor({local_loss, static_cast<double>(peak_resident_bytes()),
                                    communication_now - communication_before, stop_requested() ? 1.0 : 0.0,
                                    exposed_now - exposed_before,
                                    static_cast<double>(runtime::device_peak_reserved_bytes(device_))},
                                   at::kDouble);
      communication_before = communication_now;
      exposed_before = exposed_now;
      constexpr int64_t kFields = 6;
      at::Tensor all = at::empty({kFields * n_}, at::kDouble);
      world_->all_gather(all, mine)->wait();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      training_seconds += seconds;

      auto per_rank = all.view({n_, kFields});
      const bool stop = per_rank.select(1, 3).max().item<double>() > 0.0;
      const double loss = per_rank.select(1, 0).mean().item<double>();
      // On a GPU, the caching allocator's peak reservation (the memory that bounds the model);
      // on the CPU, the process's peak resident memory.
      const double peak_memory = per_rank.select(1, device_.is_cpu() ? 1 : 5).max().item<double>();
      const double communication = per_rank.select(1, 2).max().item<double>();
      const double exposed = per_rank.select(1, 4).max().item<double>();
      summary.losses.push_back(loss);
      summary.grad_norms.push_back(norm);
      const double rate = samples_per_step / seconds;
      step_seconds.push_back(seconds);
      const double mfu = flops_per_step / seconds / peak_flops_;
      if (!std::isfinite(loss)) {
        throw std::runtime_error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                                 " (lower optimizer.lr or set train.grad_clip)");
      }

      // Communication the compute thread waited for is exposed; the rest of its busy time ran
      // while this thread computed (overlapped). On a GPU a wait queues a stream wait and returns
      // at once, so the host's clock cannot see exposure: it is not reported there.
      const bool exposure_measured = device_.is_cpu();
      char exposure[64] = "";
      if (exposure_measured) std::snprintf(exposure, sizeof(exposure), " (exposed %.3f s)", exposed);
      char line[320];
      std::snprintf(line, sizeof(line), "| loss %.4f | lr %.2e | gnorm %.3f | %s %s | MFU %.1f%% | peak mem %s | comm %.3f s%s",
                    loss, lr, norm, format_count(rate).c_str(), rate_unit, 100.0 * mfu, format_bytes(peak_memory).c_str(),
                    communication, exposure);
      progress_->step(step, line, training_seconds);
      if (leader() && metrics_.is_open()) {
        nlohmann::json record = {{"step", step + 1},
                                 {"loss", loss},
                                 {"lr", lr},
                                 {"grad_norm", norm},
                                 {"step_seconds", seconds},
                                 {language() ? "tokens_per_second" : "images_per_second", rate},
                                 {"mfu", mfu},
                                 {"peak_flops", peak_flops_},
                                 {"peak_resident_bytes_per_rank", std::vector<double>()},
                                 {"communication_seconds_per_rank", std::vector<double>()},
                                 {"peak_gathered_bytes", state_->memory_stats().peak_gathered_bytes}};
        if (!device_.is_cpu()) record["peak_device_reserved_bytes_per_rank"] = std::vector<double>();
        for (int r = 0; r < n_; ++r) {
          record["peak_resident_bytes_per_rank"].push_back(per_rank[r][1].item<double>());
          if (!device_.is_cpu()) record["peak_device_reserved_bytes_per_rank"].push_back(per_rank[r][5].item<double>());
          const double busy = per_rank[r][2].item<double>(), waited = per_rank[r][4].item<double>();
          record["communication_seconds_per_rank"].push_back(busy);
          if (!exposure_measured) continue;  // (arrays made by their first push_back)
          record["exposed_communication_seconds_per_rank"].push_back(waited);
          record["overlapped_communication_seconds_per_rank"].push_back(std::max(0.0, busy - waited));
          record["compute_seconds_per_rank"].push_back(seconds - waited);
        }
        metrics_.write(record.dump());
      }
      const bool last = step + 1 == config_.steps;
      if (stop) {
        g_stop_requested.store(false);  // handled: a later train() in this process starts afresh
        summary.last_checkpoint = save(step + 1);
        summary.preempted = true;
        progress_->message("stopped on request after step " + std::to_string(step + 1) + "; checkpoint " +
                           summary.last_checkpoint + " (continue with --resume latest)");
        break;
      }
      if (config_.checkpoint.every > 0 && ((step + 1) % config_.checkpoint.every == 0 || last)) {
        summary.last_checkpoint = save(step + 1);
      }
      if (last || (config_.eval.every > 0 && (step + 1) % config_.eval.every == 0)) summary.evals.push_back(evaluate(step + 1));
    }
    summary.seconds = training_seconds;
    if (summary.preempted) return summary;
    if (step_seconds.size() > 1) {
      std::vector<double> rest(step_seconds.begin() + 1, step_seconds.end());
      std::nth_element(rest.begin(), rest.begin() + rest.size() / 2, rest.end());
      summary.samples_per_second = samples_per_step / rest[rest.size() / 2];
    } else {
      summary.samples_per_second = samples_per_step / step_seconds.front();
    }
    if (language() && config_.eval.sample_tokens > 0 && data_.tokenizer) summary.sample = generate();
    print_footer(summary);
    return summary;
  }

  // A checkpoint of the state after `steps` steps; rank 0 then keeps only the newest ones.
  std::string save(int64_t steps) {
    const auto start = Clock::now();
    TrainConfig resolved = config_;
    resolved.model = model_config_;
    const std::string dir = checkpoint::save_checkpoint(checkpoints_dir(config_), *state_, optimizer_.get(),
                                                        {steps, config_.model_name, to_toml(resolved)});
    if (leader()) checkpoint::prune_checkpoints(checkpoints_dir(config_), static_cast<int>(config_.checkpoint.keep));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    char line[512];
    std::snprintf(line, sizeof(line), "checkpoint step %lld | %s | %.2f s", static_cast<long long>(steps), dir.c_str(), seconds);
    progress_->message(line);
    if (leader() && metrics_.is_open()) {
      metrics_.write(nlohmann::json{{"checkpoint_step", steps}, {"path", dir}, {"seconds", seconds}}.dump());
    }
    return dir;
  }

  // Validation loss (and accuracy for images) over the same samples every time. Every rank runs
  // the same number of forwards (the runtime's collectives must match); ranks with fewer real
  // samples pad with weight-0 copies.
  EvalResult evaluate(int64_t step) {
    torch::NoGradGuard no_grad;
    model_.module->eval();
    const int64_t available = data_.validation->size();
    int64_t count = language() ? std::min(available, config_.eval.batches * config_.global_batch) : available;
    if (!language() && config_.eval.max_items > 0) count = std::min(count, config_.eval.max_items);
    const int64_t chunk = std::max<int64_t>(1, config_.global_batch / n_ / config_.micro_batches);
    std::vector<int64_t> mine;  // evenly spaced over the validation set, dealt round-robin
    for (int64_t i = rank_; i < count; i += n_) mine.push_back(i * available / count);
    const int64_t per_rank = (count + n_ - 1) / n_;
    const int64_t chunks = (per_rank + chunk - 1) / chunk;
    double totals[3] = {0.0, 0.0, 0.0};  // loss sum, correct, weight
    for (int64_t k = 0; k < chunks; ++k) {
      std::vector<int64_t> part;
      std::vector<float> weights;
      for (int64_t j = k * chunk; j < (k + 1) * chunk && j < per_rank; ++j) {
        const bool real = j < static_cast<int64_t>(mine.size());
        part.push_back(real ? mine[j] : 0);
        weights.push_back(real ? 1.0f : 0.0f);
      }
      data::Batch batch = data_.validation->get(part);
      // Losses are reduced on the model's device: only three numbers per chunk reach the host,
      // not the [b, seq, vocab] logits.
      at::Tensor logits = model_.forward(batch.inputs.to(device_));
      at::Tensor targets = batch.targets.to(device_);
      at::Tensor w = at::tensor(weights).to(device_);
      const double real = std::accumulate(weights.begin(), weights.end(), 0.0);  // padding samples weigh 0
      at::Tensor losses = loss_of(logits, targets, torch::kNone);  // [b * seq] or [b]
      if (language()) {
        losses = losses.view({static_cast<int64_t>(part.size()), -1});
        totals[0] += (losses.sum(1) * w).sum().item<double>();
        totals[2] += real * static_cast<double>(losses.size(1));
      } else {
        totals[0] += (losses * w).sum().item<double>();
        totals[1] += (logits.argmax(1).eq(targets).to(at::kFloat) * w).sum().item<double>();
        totals[2] += real;
      }
    }
    model_.module->train();
    at::Tensor sums = at::tensor({totals[0], totals[1], totals[2]}, at::kDouble);
    if (n_ > 1) world_->all_reduce(sums, comm::ReduceOp::Sum)->wait();
    EvalResult result;
    result.step = step;
    result.loss = sums[0].item<double>() / sums[2].item<double>();
    char line[160];
    if (language()) {
      result.perplexity = std::exp(result.loss);
      std::snprintf(line, sizeof(line), "eval  step %lld | validation loss %.4f | perplexity %.2f | %lld windows",
                    static_cast<long long>(step), result.loss, result.perplexity, static_cast<long long>(count));
    } else {
      result.accuracy = sums[1].item<double>() / sums[2].item<double>();
      std::snprintf(line, sizeof(line), "eval  step %lld | test loss %.4f | test accuracy %.2f%% | %lld images",
                    static_cast<long long>(step), result.loss, 100.0 * result.accuracy, static_cast<long long>(count));
    }
    progress_->message(line);
    if (leader() && metrics_.is_open()) {
      nlohmann::json record = {{"eval_step", step}, {"validation_loss", result.loss}};
      if (language()) record["perplexity"] = result.perplexity;
      if (!language()) record["test_accuracy"] = result.accuracy;
      metrics_.write(record.dump());
    }
    return result;
  }

  // Sampling with temperature and top-k. Every rank runs the forwards (they are collective);
  // rank 0 draws each token and broadcasts it, so all ranks extend the same text.
  std::string generate() {
    torch::NoGradGuard no_grad;
    model_.module->eval();
    const auto& e = config_.eval;
    std::vector<int32_t> prompt = data_.tokenizer->encode(e.prompt);
    if (prompt.empty()) {
      // Start where a document would: after the end-of-document marker.
      const int32_t end = data_.tokenizer->end_of_text();
      prompt = end >= 0 ? std::vector<int32_t>{end} : data_.tokenizer->encode("%\n");
    }
    std::vector<int64_t> context(prompt.begin(), prompt.end());
    std::vector<int32_t> generated;
    auto generator = at::detail::createCPUGenerator(config_.seed + 1);
    for (int64_t i = 0; i < e.sample_tokens; ++i) {
      const int64_t t = std::min<int64_t>(static_cast<int64_t>(context.size()), config_.seq_len);
      at::Tensor ids = at::tensor(std::vector<int64_t>(context.end() - t, context.end()), at::kLong).unsqueeze(0);
      at::Tensor logits = model_.forward(ids.to(device_)).select(1, t - 1).squeeze(0).to(at::kFloat).cpu() / e.temperature;  // [vocab]
      at::Tensor next = at::zeros({1}, at::kLong);
      if (leader()) {
        const int64_t k = std::min<int64_t>(e.top_k, logits.size(0));
        auto top = logits.topk(k);
        at::Tensor probabilities = at::softmax(std::get<0>(top), 0);
        at::Tensor choice = at::multinomial(probabilities, 1, false, generator);
        next[0] = std::get<1>(top)[choice.item<int64_t>()].item<int64_t>();
      }
      if (n_ > 1) world_->broadcast(next, 0)->wait();
      context.push_back(next.item<int64_t>());
      generated.push_back(static_cast<int32_t>(next.item<int64_t>()));
    }
    model_.module->train();
    std::string text = e.prompt + data_.tokenizer->decode(generated);
    if (leader() && options_.write_files) std::ofstream(fs::path(config_.output_dir) / "sample.txt") << text;
    return text;
  }

  void print_footer(const TrainSummary& summary) {
    if (!leader() || !options_.print) return;
    const EvalResult& first = summary.evals.front();
    const EvalResult& last = summary.evals.back();
    char line[256];
    if (language()) {
      std::snprintf(line, sizeof(line), "done: %lld steps in %s, %s tok/s (median); validation loss %.4f -> %.4f",
                    static_cast<long long>(config_.steps), format_duration(summary.seconds).c_str(),
                    format_count(summary.samples_per_second).c_str(), first.loss, last.loss);
    } else {
      std::snprintf(line, sizeof(line), "done: %lld steps in %s, %s img/s (median); test accuracy %.2f%% -> %.2f%%",
                    static_cast<long long>(config_.steps), format_duration(summary.seconds).c_str(),
                    format_count(summary.samples_per_second).c_str(), 100.0 * first.accuracy, 100.0 * last.accuracy);
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
  models::ModelConfig model_config_;
  models::BuiltModel model_;
  std::shared_ptr<runtime::FsdpState> state_;
  std::unique_ptr<optim::ShardedOptimizer> optimizer_;
  optim::WarmupCosineSchedule schedule_{1e-3, 1e-4, 0, 1};
  int64_t parameters_ = 0;
  int64_t start_step_ = 0;
  std::string resumed_from_;
  double peak_flops_ = 1.0;
  MetricsLog metrics_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace

TrainSummary train(const TrainConfig& config, const comm::ProcessGroupPtr& world, const TrainerOptions& options) {
  Trainer trainer(config, world, options);
  return trainer.run();
}

}  // namespace fsdp::train
