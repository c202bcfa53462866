// fsdp-plan: will it fit, and how long will a step take? Per-rank memory (parameters, gradients,
// optimizer state, gathered buffers, activations), bytes communicated per step by each
// collective, and a step-time estimate, for a model from the zoo or a training config, before
// anything is allocated. The formulas are in include/fsdp/plan/memory_plan.h.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fsdp/comm/nccl_process_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/plan/memory_plan.h"
#include "fsdp/plan/plan_fit.h"
#include "fsdp/plan/workload_settings.h"
#include "fsdp/runtime/cpu_features.h"
#include "fsdp/runtime/sharding_settings.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/train/config.h"
#include "fsdp/train/planning.h"
#include "fsdp/train/reporting.h"

namespace {

using fsdp::plan::FitSetting;
using fsdp::plan::Plan;
using fsdp::plan::PlanInput;
using fsdp::train::format_bytes;

// Matmul FLOP/s in `dtype` on square 1024 matrices for about `seconds`, with this process's threads.
double matmul_rate(at::ScalarType dtype, double seconds) {
  torch::NoGradGuard no_grad;
  const int64_t n = 1024;
  auto a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype), c = at::empty({n, n}, a.options());
  at::mm_out(c, a, b);
  int64_t products = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    at::mm_out(c, a, b);
    ++products;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * n * n * n * products / elapsed;
}

// All-gather algorithm bandwidth per rank (bytes each rank sends / second), median of 5, 32 MiB.
double all_gather_bandwidth(const fsdp::comm::ProcessGroupPtr& world) {
  const int n = world->size();
  const int64_t total = (32LL << 20) / 4 / n * n;
  at::Tensor input = at::ones({total / n}), output = at::empty({total});
  world->all_gather(output, input)->wait();
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    world->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    world->all_gather(output, input)->wait();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  at::Tensor slowest = at::tensor(times, at::kDouble);
  world->all_reduce(slowest, fsdp::comm::ReduceOp::Max)->wait();
  std::vector<double> t(slowest.data_ptr<double>(), slowest.data_ptr<double>() + times.size());
  std::sort(t.begin(), t.end());
  return 4.0 * total * (n - 1) / n / t[t.size() / 2];
}

nlohmann::json to_json(const Plan& p) {
  const auto& in = p.input;
  const auto& m = p.memory;
  nlohmann::json out = {{"model", in.model_name},
                        {"parameters", p.parameters},
                        {"adapter_parameters", p.adapter_params},
                        {"layers", p.layers},
                        {"largest_unit_params", p.largest_unit_params},
                        {"root_params", p.root_params},
                        {"embedding_params", p.embedding_params},
                        {"head_params", p.head_params},
                        {"other_unit_params", p.other_unit_params},
                        {"tied_embedding", p.tied_embedding},
                        {"ranks", in.ranks},
                        {"ranks_per_node", in.ranks_per_node},
                        {"strategy", fsdp::enum_name(in.strategy)},
                        {"shard_ranks", p.shard_ranks},
                        {"replicas", p.replicas},
                        {"param_dtype", fsdp::enum_name(in.param_dtype)},
                        {"reduce_dtype", fsdp::enum_name(in.reduce_dtype)},
                        {"activation_checkpointing", in.activation_checkpointing},
                        {"activation_checkpointing_every", in.activation_checkpointing_every},
                        {"cpu_offload", in.cpu_offload},
                        {"fused_attention", in.fused_attention},
                        {"optimizer", fsdp::enum_name(in.optimizer)},
                        {"micro_batch", in.micro_batch},
                        {"micro_batches", in.micro_batches},
                        {"sync_each_micro_batch", in.sync_each_micro_batch},
                        {"seq_len", in.seq_len},
                        {"loss_chunk_tokens", in.loss_chunk_tokens},
                        {"prefetch", in.prefetch},
                        {"max_inflight", in.prefetch_depth()},
                        {"memory_bytes",
                         {{"parameters", m.parameters},
                          {"gradients", m.gradients},
                          {"optimizer", m.optimizer},
                          {"gathered", m.gathered},
                          {"reduced", m.reduced},
                          {"activations", m.activations},
                          {"overhead", m.overhead},
                          {"data", m.data},
                          {"device_total", m.device_total()},
                          {"host_total", m.host_total},
                          {"checkpoint_staging", m.checkpoint_staging}}},
                        {"cpu", in.cpu},
                        {"peak_bytes", p.peak_bytes},
                        {"device_memory_bytes", in.device_memory_bytes},
                        {"fits", p.fits},
                        {"headroom_bytes", p.headroom_bytes},
                        {"comm_bytes_per_step",
                         {{"all_gather", p.comm.all_gather},
                          {"reduce_scatter", p.comm.reduce_scatter},
                          {"all_reduce", p.comm.all_reduce},
                          {"across_nodes", p.comm.across_nodes}}},
                        {"compute_flops_per_second", in.compute_flops},
                        {"bandwidth_bytes_per_second", in.bandwidth_bytes},
                        {"compute_seconds", p.compute_seconds},
                        {"comm_seconds", p.comm_seconds},
                        {"step_seconds_overlapped", p.step_seconds_overlapped},
                        {"step_seconds_serial", p.step_seconds_serial},
                        {"tokens_per_second_per_rank", p.tokens_per_second}};
  const int nodes = std::max(1, in.ranks / in.ranks_per_node);
  const int per_node = std::min(in.ranks, in.ranks_per_node);
  for (const auto& d : fsdp::plan::deepspeed_zero3_estimate(p.parameters, fsdp::plan::largest_module_params(in.model),
                                                            per_node, nodes)) {
    out["deepspeed_zero3"][d.offload] = {{"gpu_bytes_per_rank", d.gpu_bytes_per_rank},
                                         {"cpu_bytes_per_node", d.cpu_bytes_per_node}};
  }
  return out;
}

// "fits, headroom 4.0 GiB", "DOES NOT FIT, short by 2.2 GiB", or that no memory was given.
std::string fit_verdict(const Plan& p) {
  if (p.input.device_memory_bytes <= 0) return "no device memory given";
  return p.fits ? "fits, headroom " + format_bytes(static_cast<double>(p.headroom_bytes))
                : "DOES NOT FIT, short by " + format_bytes(static_cast<double>(-p.headroom_bytes));
}

// What is planned: the model and its units, the ranks and sharding, dtypes, the micro-batch.
void print_setup(const Plan& p) {
  const auto& in = p.input;
  if (p.adapter_params > 0) {
    std::printf(
        "LoRA: %.1f M adapter parameters (trainable, fp32, AdamW) over a frozen %s base (no gradients, no optimizer "
        "state)\n",
        p.adapter_params / 1e6, fsdp::enum_name(in.lora_base_dtype));
  }
  char others[96] = "";
  if (p.other_units > 0) {
    std::snprintf(others, sizeof(others), ", %lld more unit%s of %.1f M", static_cast<long long>(p.other_units),
                  p.other_units == 1 ? "" : "s", p.other_unit_params / 1e6);
  }
  std::printf(
      "fsdp-plan: %s, %.3f B parameters (%lld blocks, largest unit %.1f M, embedding %.1f M and head %.1f M "
      "as units%s%s, %.1f M in the root)\n",
      in.model_name.c_str(), p.parameters / 1e9, static_cast<long long>(p.layers), p.largest_unit_params / 1e6,
      p.embedding_params / 1e6, p.head_params / 1e6, p.tied_embedding ? " (tied: one unit)" : "", others,
      p.root_params / 1e6);
  // "2 ranks (one node)", "16 ranks (8 per node)": a node count only where there are several.
  const std::string layout =
      in.ranks <= in.ranks_per_node ? "one node" : std::to_string(in.ranks_per_node) + " per node";
  std::printf(
      "  %d ranks (%s), %s: %d shard ranks x %d replicas; %s compute, %s reduce; "
      "activation checkpointing %s; CPU offload %s; %s\n",
      in.ranks, layout.c_str(), fsdp::enum_name(in.strategy), p.shard_ranks, p.replicas,
      fsdp::enum_name(in.param_dtype), fsdp::enum_name(in.reduce_dtype),
      !in.activation_checkpointing ? "off"
      : in.activation_checkpointing_every == 1
          ? "on"
          : ("every " + std::to_string(in.activation_checkpointing_every) + " blocks").c_str(),
      in.cpu_offload ? "on" : "off", fsdp::enum_name(in.optimizer));
  // Image models' samples are counted as samples; text in tokens.
  const bool text = fsdp::models::is_language_model(in.model) && !fsdp::models::reads_image_and_text(in.model);
  const std::string sample = text ? std::to_string(in.micro_batch) + " x " + std::to_string(in.seq_len) + " tokens"
                                  : std::to_string(in.micro_batch) + " samples";
  std::printf("  micro-batch %s, %lld micro-batch(es) per step, max_inflight %lld, %s attention\n", sample.c_str(),
              static_cast<long long>(in.micro_batches), static_cast<long long>(in.prefetch_depth()),
              in.fused_attention ? (in.attention_fp32 ? "fused (in fp32)" : "fused") : "composed");
}

// Memory per rank by kind, the device total against the memory given, and the host's share.
void print_memory(const Plan& p) {
  const auto& in = p.input;
  const auto& m = p.memory;
  const char* where = in.cpu_offload ? "host" : "device";
  std::printf("per rank\n");
  const std::string parameters_label =
      p.adapter_params > 0
          ? "parameters (" + std::string(fsdp::enum_name(in.lora_base_dtype)).substr(0, 4) + " base, fp32 adapters)"
          : "parameters (fp32 shards)";
  std::printf("  %-28s %12s  (%s)\n", parameters_label.c_str(), format_bytes(static_cast<double>(m.parameters)).c_str(),
              where);
  std::printf("  %-28s %12s  (%s)\n", p.adapter_params > 0 ? "gradients (adapters only)" : "gradients (fp32 shards)",
              format_bytes(static_cast<double>(m.gradients)).c_str(), where);
  std::printf("  %-28s %12s  (%s)\n", "optimizer state", format_bytes(static_cast<double>(m.optimizer)).c_str(), where);
  std::printf("  %-28s %12s\n", "gathered buffers (peak)", format_bytes(static_cast<double>(m.gathered)).c_str());
  std::printf("  %-28s %12s\n", "reduced gradients in flight", format_bytes(static_cast<double>(m.reduced)).c_str());
  std::printf("  %-28s %12s\n", "activations", format_bytes(static_cast<double>(m.activations)).c_str());
  std::printf("  %-28s %12s\n", "process overhead", format_bytes(static_cast<double>(m.overhead)).c_str());
  std::printf("  %-28s %12s  of %s: %s\n", "device total", format_bytes(static_cast<double>(m.device_total())).c_str(),
              in.device_memory_bytes > 0 ? format_bytes(static_cast<double>(in.device_memory_bytes)).c_str() : "-",
              fit_verdict(p).c_str());
  if (m.host_total > 0)
    std::printf("  %-28s %12s\n", "host (offloaded shards)", format_bytes(static_cast<double>(m.host_total)).c_str());
  if (m.data > 0) std::printf("  %-28s %12s\n", "host (data held)", format_bytes(static_cast<double>(m.data)).c_str());
  if (m.checkpoint_staging > 0) {
    std::printf("  %-28s %12s\n", "host (async save staging)",
                format_bytes(static_cast<double>(m.checkpoint_staging)).c_str());
  }
  if (in.cpu) {
    std::printf(
        "  %-28s %12s  (train.device = cpu: one process holds all of the above; the run's report\n"
        "  %-28s %12s   compares its measured resident peak with this)\n",
        "process peak", format_bytes(static_cast<double>(p.peak_bytes)).c_str(), "", "");
  }
}

// Bytes per collective, the step-time estimate, and DeepSpeed ZeRO-3's model-state estimate beside ours.
void print_communication_and_peers(const Plan& p) {
  const auto& in = p.input;
  const auto& m = p.memory;
  std::printf("communication per step per rank: all-gather %s, reduce-scatter %s, all-reduce %s (across nodes %s)\n",
              format_bytes(static_cast<double>(p.comm.all_gather)).c_str(),
              format_bytes(static_cast<double>(p.comm.reduce_scatter)).c_str(),
              format_bytes(static_cast<double>(p.comm.all_reduce)).c_str(),
              format_bytes(static_cast<double>(p.comm.across_nodes)).c_str());
  if (in.compute_flops > 0 || in.bandwidth_bytes > 0) {
    std::printf(
        "step estimate: compute %.3f s (%.1f TFLOP/s per rank), communication %.3f s (%.1f GB/s per rank): "
        "%.3f s overlapped, %.3f s serial; %.0f tokens/s per rank\n",
        p.compute_seconds, in.compute_flops / 1e12, p.comm_seconds, in.bandwidth_bytes / 1e9, p.step_seconds_overlapped,
        p.step_seconds_serial, p.tokens_per_second);
  } else {
    std::printf("step estimate: give --tflops and --bandwidth, or --calibrate\n");
  }
  const int nodes = std::max(1, in.ranks / in.ranks_per_node);
  const int per_node = std::min(in.ranks, in.ranks_per_node);
  std::printf(
      "DeepSpeed ZeRO-3 model states (estimate_zero3_model_states_mem_needs, %d GPUs x %d node(s), "
      "largest layer %.1f M):\n",
      per_node, nodes, fsdp::plan::largest_module_params(in.model) / 1e6);
  for (const auto& d : fsdp::plan::deepspeed_zero3_estimate(p.parameters, fsdp::plan::largest_module_params(in.model),
                                                            per_node, nodes)) {
    std::printf("  offload %-17s GPU %12s per rank, CPU %12s per node\n", d.offload.c_str(),
                format_bytes(static_cast<double>(d.gpu_bytes_per_rank)).c_str(),
                format_bytes(static_cast<double>(d.cpu_bytes_per_node)).c_str());
  }
  std::printf("  fsdp.cpp model states on the device (shards, gathered and reduced buffers): %s\n",
              format_bytes(static_cast<double>(m.device_total() - m.activations - m.overhead)).c_str());
}

void print_plan(const Plan& p, bool compact) {
  const auto& in = p.input;
  if (compact) {
    const std::string mode =
        p.adapter_params > 0 ? "LoRA(" + std::to_string(p.adapter_params / 1000000) + "M)" : "full";
    std::printf("%-13s %-10s N=%-4d %-13s S=%-3d %-8s AC=%d off=%d mb=%lld  device %10s  %s\n", in.model_name.c_str(),
                mode.c_str(), in.ranks, fsdp::enum_name(in.strategy), p.shard_ranks, fsdp::enum_name(in.param_dtype),
                in.activation_checkpointing, in.cpu_offload, static_cast<long long>(in.micro_batch),
                format_bytes(static_cast<double>(p.memory.device_total())).c_str(), fit_verdict(p).c_str());
    return;
  }
  print_setup(p);
  print_memory(p);
  print_communication_and_peers(p);
}

// "a | b | c": an enum flag's values, for its help (the names fsdp-train's config takes).
template <class E>
std::string alternatives() {
  return fsdp::enum_names_listed<E>(" | ");
}

// An enum flag's value by its name; std::invalid_argument "WHAT 'NAME' (expected a, b or c)".
template <class E>
E flag_value(const std::string& what, const std::string& name) {
  try {
    return fsdp::enum_from_name<E>(name);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(what + " " + e.what());
  }
}

// --lora-base-dtype: a stored dtype (auto, the weights' own, is a config's: there are no weights here).
fsdp::models::LoraBaseDtype lora_base_dtype_flag(const std::string& name) {
  std::vector<std::string> stored;
  for (const std::string& known : fsdp::enum_names<fsdp::models::LoraBaseDtype>()) {
    if (known == name && known != "auto") return fsdp::enum_from_name<fsdp::models::LoraBaseDtype>(name);
    if (known != "auto") stored.push_back(known);
  }
  throw std::invalid_argument("lora base dtype '" + name + "' (expected " + fsdp::names_listed(stored) + ")");
}

// One flag per setting of the plan's input: each sharding setting (runtime/sharding_settings.h),
// named after its config key (fsdp.max_inflight: --max-inflight), and each workload setting
// (plan/workload_settings.h: --micro-batch, --seq-len, ...). A boolean one is a flag; one that is
// on by default is turned off with --NAME=false.
struct SettingFlag {
  std::string key;  // the config key that gives it in a run: "fsdp.max_inflight"; "" where none does
  CLI::Option* option = nullptr;
  std::function<void(PlanInput&)> apply;  // sets the given value
};

// The names some flags had before they were generated from the settings (2026-12-06), still taken:
// an alias, or with "!" the flag that sets the boolean setting false.
const std::map<std::string, std::string>& former_flag_names() {
  static const std::map<std::string, std::string> names = {{"seq_len", "--seq"},
                                                           {"loss_chunk_tokens", "--loss-chunk"},
                                                           {"embedding_units", "!--embeddings-in-root"},
                                                           {"fused_attention", "!--composed-attention"}};
  return names;
}

// The command line: every flag, and the PlanInput fields a flag sets directly.
struct PlanFlags {
  std::string config_path, model_name, memory, overhead, json_path;
  std::vector<std::string> overrides;
  int ranks = 0, ranks_per_node = 8;
  double tflops = 0, bandwidth_gbps = 0, inter_node_gbps = 0;
  bool calibrate = false, compact = false;
  // What the setting flags read into: the two kinds of setting, an enum's name as given.
  fsdp::runtime::ShardingSettings settings;
  fsdp::plan::WorkloadSettings workload;
  std::map<std::string, std::string> enum_text;
  std::vector<SettingFlag> setting_flags;
  int64_t lora_rank = 0;  // the model's adapters (models::LoraSpec)
  std::string lora_targets;
  std::string fit;                    // --fit MEMORY
  double host_link_gbps = 25;         // --fit: CPU offload's copies
  std::set<FitSetting> config_fixed;  // --fit: the settings the config file gives
};

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// The flag of the setting `name` (a member of `values`, of type T), reading into `values`. A number
// is at least 0, or with `positive` at least 1.
template <class Settings, class T>
SettingFlag setting_flag(CLI::App& app, PlanFlags& f, Settings& values, const std::string& name, T Settings::*member,
                         const std::string& key, const std::string& help, bool positive = false) {
  SettingFlag flag;
  flag.key = key;
  std::string option = "--" + dashed(name);
  std::string former;
  if (const auto it = former_flag_names().find(name); it != former_flag_names().end()) {
    former = it->second;
    option += "," + former;
  }
  const std::string text = help + (key.empty() ? "" : " (" + key + ")");
  if constexpr (std::is_same_v<T, fsdp::models::LoraBaseDtype>) {
    // A stored dtype: "auto", the weights' own, is a config's (there are no weights here).
    flag.option = app.add_option(option, f.enum_text[name], "bfloat16 | float32 | nf4: " + text);
    flag.apply = [&f, member, name](PlanInput& in) { in.*member = lora_base_dtype_flag(f.enum_text.at(name)); };
  } else if constexpr (fsdp::has_enum_names<T>::value) {
    flag.option = app.add_option(option, f.enum_text[name], alternatives<T>() + ": " + text);
    flag.apply = [&f, member, name](PlanInput& in) { in.*member = flag_value<T>(name, f.enum_text.at(name)); };
  } else {
    if constexpr (std::is_same_v<T, bool>) {
      const bool on = Settings{}.*member;
      const std::string off = on ? "; on unless --" + dashed(name) + "=false" +
                                       (former.rfind("!", 0) == 0 ? " (or " + former.substr(1) + ")" : "")
                                 : "";
      flag.option = app.add_flag(option, values.*member, text + off);
    } else {
      flag.option =
          app.add_option(option, values.*member, text)->check(positive ? CLI::PositiveNumber : CLI::NonNegativeNumber);
    }
    flag.apply = [&values, member](PlanInput& in) { in.*member = values.*member; };
  }
  return flag;
}

void declare_setting_flags(CLI::App& app, PlanFlags& f) {
  fsdp::runtime::for_each_sharding_setting([&](const char* name, auto member, const char* help) {
    f.setting_flags.push_back(setting_flag(app, f, f.settings, name, member, std::string("fsdp.") + name, help));
  });
  fsdp::plan::for_each_workload_setting([&](const char* name, auto member, const char* key, const char* help) {
    const bool positive = fsdp::plan::takes_no_zero(member);
    f.setting_flags.push_back(setting_flag(app, f, f.workload, name, member, key, help, positive));
  });
}

void declare_flags(CLI::App& app, PlanFlags& f) {
  app.add_option("config", f.config_path, "TOML training configuration (optional)");
  app.add_option("--set", f.overrides, "override a config key, as fsdp-train --set");
  app.add_option("--model", f.model_name, "a model of the zoo (fsdp-train --list-models)");
  app.add_option("--ranks", f.ranks, "N, ranks in all (default: the config's launch, else 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-node", f.ranks_per_node, "GPUs per node (hybrid_shard's default S)")
      ->check(CLI::PositiveNumber);
  app.add_option("--memory", f.memory, "device memory per rank with a unit, e.g. 80GB, 141GB, 5GiB");
  declare_setting_flags(app, f);
  app.add_option("--lora-rank", f.lora_rank, "LoRA: adapters of this rank over a frozen base")
      ->check(CLI::PositiveNumber);
  app.add_option("--lora-targets", f.lora_targets,
                 "LoRA: the adapted layers, e.g. \"q_proj v_proj\" (default: every linear layer of the blocks)");
  app.add_option("--overhead", f.overhead,
                 "the process's own memory per rank, e.g. 2GiB (default 512MiB on a GPU, 152MiB for a config "
                 "with train.device = cpu; --calibrate measures)");
  app.add_option("--tflops", f.tflops, "compute rate per rank, TFLOP/s (e.g. 700 for bf16 on an H100 at ~70%)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bandwidth", f.bandwidth_gbps, "per-rank collective bandwidth inside a shard group, GB/s")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--inter-node-bandwidth", f.inter_node_gbps, "per-rank bandwidth across nodes, GB/s")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--calibrate", f.calibrate,
               "measure compute rate (matmuls in the compute dtype), all-gather bandwidth (under mpirun, >= 2 "
               "ranks) and the process overhead on this machine, with the project's own kernels and collectives");
  app.add_flag("--compact", f.compact, "one line per plan");
  app.add_option("--json", f.json_path, "write the plan here as JSON");
  app.add_option(
      "--fit", f.fit,
      "MEMORY per rank (e.g. 24GiB): search strategy, activation checkpointing, micro-batches, CPU offload, "
      "LoRA base dtype, prefetch depth and loss chunk (those the flags and the config do not set) and print "
      "the fastest plan that fits, with the config keys that make it (--micro-batch B without --micro-batches: B "
      "samples per rank per step, split into micro-batches where that fits)");
  app.add_option("--host-link-bandwidth", f.host_link_gbps,
                 "--fit: host-device bandwidth per rank for CPU offload's copies, GB/s (default 25, PCIe 4 x16)")
      ->check(CLI::PositiveNumber);
}

// The plan's input from a config file, as fsdp-train reads it: with its data (the vocabulary it
// gives the model, the bytes it holds), the same prediction as the run's report. Where the data is
// not on this machine (planning a run for elsewhere), the config alone, saying so.
PlanInput input_from_config(PlanFlags& f, const fsdp::comm::ProcessGroupPtr& world) {
  std::vector<std::string> overrides = f.overrides;
  if (!f.model_name.empty()) overrides.push_back("model.name=\"" + f.model_name + "\"");
  const fsdp::train::TrainConfig c = fsdp::train::load_train_config(f.config_path, overrides);
  f.config_fixed = fsdp::train::fit_settings_given(c);
  const int n = f.ranks > 0 ? f.ranks : (world ? world->size() : 1);
  std::string missing;
  PlanInput in = fsdp::train::plan_input_here(c, n, missing);
  if (!missing.empty() && (!world || world->rank() == 0)) {
    std::fprintf(stderr,
                 "fsdp-plan: note: '%s' is not on this machine: the data is not counted, nor the model's vocabulary "
                 "taken from it\n",
                 missing.c_str());
  }
  // --lora-rank on a config without adapters: its lora.base_dtype "auto" as the run would resolve it.
  if (f.lora_rank > 0 && in.lora_base_dtype == fsdp::models::LoraBaseDtype::Auto) {
    in.lora_base_dtype = fsdp::train::resolved_lora_base_dtype(c);
  }
  in.ranks_per_node = f.ranks_per_node;
  return in;
}

// The plan's input for a model of the zoo, with fsdp-train's defaults.
PlanInput input_from_model(const PlanFlags& f, const fsdp::comm::ProcessGroupPtr& world) {
  if (f.model_name.empty()) throw std::invalid_argument("give --model NAME or a config file (--help)");
  if (!f.overrides.empty()) throw std::invalid_argument("--set needs a config file");
  PlanInput in;
  in.ranks_per_node = f.ranks_per_node;
  in.model = fsdp::models::model_config(f.model_name);
  in.model_name = f.model_name;
  in.ranks = f.ranks > 0 ? f.ranks : (world ? world->size() : 1);
  if (const int64_t seq = fsdp::models::family_of(in.model).plan_sequence(in.model); seq > 0) in.seq_len = seq;
  in.loss_chunk_tokens = fsdp::train::TrainConfig{}.loss_chunk_tokens;  // as fsdp-train by default
  return in;
}

// --lora-rank: adapters on every linear layer of the blocks, or --lora-targets'.
void apply_lora_flags(const PlanFlags& f, PlanInput& in) {
  if (f.lora_rank > 0) {
    fsdp::models::LoraSpec spec;
    spec.rank = f.lora_rank;
    spec.targets = fsdp::models::LoraSpec::parse_targets(f.lora_targets);
    if (spec.targets.empty()) spec.targets = fsdp::models::linear_layers(in.model);
    fsdp::models::LoraSpec* lora = fsdp::models::mutable_lora_spec(in.model);
    if (lora == nullptr || !fsdp::models::is_language_model(in.model)) {
      throw std::invalid_argument(std::string("--lora-rank applies to language models, not ") +
                                  fsdp::models::family_name(in.model));
    }
    *lora = spec;
    fsdp::models::validate(in.model);
  }
}

// Whether the command line gives the setting whose config key is `key` ("fsdp.prefetch").
bool setting_given(const PlanFlags& f, const std::string& key) {
  for (const SettingFlag& flag : f.setting_flags) {
    if (flag.key == key) return flag.option->count() > 0;
  }
  return false;
}

// The flags that override the config's (or the defaults') settings.
void apply_flags(const PlanFlags& f, PlanInput& in) {
  for (const SettingFlag& flag : f.setting_flags) {
    if (flag.option->count() > 0) flag.apply(in);
  }
  // --max-inflight K is the prefetch depth planned, whatever the config's fsdp.prefetch (unless
  // --prefetch is given too).
  if (setting_given(f, "fsdp.max_inflight") && !setting_given(f, "fsdp.prefetch")) in.prefetch = in.max_inflight > 0;
  if (setting_given(f, "fsdp.activation_checkpointing_every") && !in.activation_checkpointing)
    throw std::invalid_argument("--activation-checkpointing-every needs --activation-checkpointing");
  if (!in.fused_attention) in.attention_fp32 = false;  // composed attention computes in the compute dtype
  apply_lora_flags(f, in);
  if (!f.memory.empty()) in.device_memory_bytes = fsdp::plan::parse_bytes(f.memory);
  if (!f.overhead.empty()) in.overhead_bytes = fsdp::plan::parse_bytes(f.overhead);
  in.compute_flops = f.tflops * 1e12;
  in.bandwidth_bytes = f.bandwidth_gbps * 1e9;
  in.inter_node_bandwidth_bytes = f.inter_node_gbps * 1e9;
}

// --calibrate: the process overhead, the slowest rank's matmul rate and the all-gather bandwidth,
// measured here (collective: every rank of `world`).
void calibrate(PlanInput& in, const fsdp::comm::ProcessGroupPtr& world, bool leader) {
  if (!in.cpu && !fsdp::comm::nccl_backend_built()) {
    throw std::invalid_argument(
        "--calibrate measures this machine's device, and this CPU build has none for train.device 'cuda' (plan "
        "it with --tflops and --bandwidth, or calibrate with a CUDA build on the GPU machine)");
  }
  // bf16 compute multiplies in bf16, except on a CPU without bf16 instructions, where fsdp-train
  // widens the operands to fp32 GEMMs (train.bf16_matmul = auto): libtorch's own bf16 GEMM there
  // measured 1.0 GFLOP/s against 72 in fp32 (2026-12-05), a 70x wrong step estimate.
  const bool widened = in.cpu && !fsdp::runtime::cpu_has_bf16_instructions();
  const at::ScalarType dtype = in.param_dtype == at::kBFloat16 && !widened ? at::kBFloat16 : at::kFloat;
  // libtorch and MPI loaded, nothing trained; on the CPU training's heap cache comes on top.
  in.overhead_bytes =
      std::max<int64_t>(0, fsdp::shard::resident_host_bytes()) + (in.cpu ? fsdp::plan::kCpuHeapCacheBytes : 0);
  world->barrier()->wait();
  double rate = matmul_rate(dtype, 0.5);  // every rank at once, as in training
  at::Tensor slowest = at::tensor({rate}, at::kDouble);
  world->all_reduce(slowest, fsdp::comm::ReduceOp::Sum)->wait();
  in.compute_flops = slowest.item<double>() / world->size();
  if (world->size() > 1) in.bandwidth_bytes = all_gather_bandwidth(world);
  if (leader) {
    char bandwidth[64] = "not measured (run under mpirun -np 2 or more)";
    if (world->size() > 1) std::snprintf(bandwidth, sizeof(bandwidth), "%.2f GB/s", in.bandwidth_bytes / 1e9);
    std::printf(
        "calibrated on %d rank(s): %.1f GFLOP/s per rank (%s matmul%s), all-gather %s per rank, "
        "process overhead %s\n",
        world->size(), in.compute_flops / 1e9, fsdp::enum_name(dtype),
        dtype != in.param_dtype ? ", as fsdp-train multiplies bf16 on this CPU" : "", bandwidth,
        format_bytes(static_cast<double>(in.overhead_bytes)).c_str());
  }
}

// The plan as JSON at `path` (with `extra` keys), never half a file there.
void write_json(const Plan& plan, const std::string& path, const nlohmann::json& extra = nlohmann::json::object()) {
  const std::string partial = path + ".partial";
  std::ofstream out(partial);
  nlohmann::json j = to_json(plan);
  j.update(extra);
  out << j.dump(2) << "\n";
  out.close();
  if (!out || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    throw std::runtime_error("cannot write '" + path + "'");
  }
}

// The settings the command line gives (fixed for --fit), with those the config file gives.
std::set<FitSetting> fixed_settings(const PlanFlags& f) {
  std::set<FitSetting> fixed = f.config_fixed;
  std::set<std::string> keys_given;
  for (const SettingFlag& flag : f.setting_flags) {
    if (flag.option->count() > 0) keys_given.insert(flag.key);
  }
  // (--micro-batch has no key: alone it gives the samples a rank takes per step, which --fit may
  // split into micro-batches.)
  for (FitSetting setting : fsdp::train::fit_settings_of_keys(keys_given)) fixed.insert(setting);
  return fixed;
}

// --fit ranks plans by time: the rates given or measured, else round figures for the device
// (an H100's bf16 at ~40% and NVLink within a node; two CPU cores), said in the output.
std::string assume_rates(PlanInput& in) {
  std::string assumed;
  if (in.compute_flops <= 0) {
    in.compute_flops = in.cpu ? 0.1e12 : 400e12;
    assumed += "compute";
  }
  if (in.bandwidth_bytes <= 0) {
    in.bandwidth_bytes = in.cpu ? 2e9 : 150e9;
    assumed += assumed.empty() ? "bandwidth" : " and bandwidth";
  }
  return assumed;
}

std::string settings_row(const fsdp::plan::FitCandidate& c) {
  const PlanInput& in = c.plan.input;
  char row[256];
  const std::string checkpointing =
      in.activation_checkpointing ? "every " + std::to_string(in.activation_checkpointing_every) : "off";
  std::snprintf(row, sizeof(row), "%9.3f %10s  %-14s %-13s %5lld %-8s %-9s %4lld %6lld",
                c.step_seconds + c.offload_seconds, format_bytes(static_cast<double>(c.peak_bytes)).c_str(),
                fsdp::enum_name(in.strategy), checkpointing.c_str(), static_cast<long long>(in.micro_batches),
                in.cpu_offload ? "on" : "off",
                fsdp::models::lora_spec(in.model) != nullptr && fsdp::models::lora_spec(in.model)->enabled()
                    ? fsdp::enum_name(in.lora_base_dtype)
                    : "-",
                static_cast<long long>(in.prefetch_depth()), static_cast<long long>(in.loss_chunk_tokens));
  return row;
}

// The settings of `chosen` as config keys: TOML tables to add to a config, and --set arguments.
void print_fit_config(const PlanInput& chosen, const std::set<FitSetting>& fixed) {
  auto values = fsdp::train::fit_config_values(chosen, fixed);
  if (values.empty()) return;
  const auto table_of = [](const std::pair<std::string, std::string>& v) {
    return v.first.substr(0, v.first.find('.'));
  };
  std::stable_sort(values.begin(), values.end(),
                   [&](const auto& a, const auto& b) { return table_of(a) < table_of(b); });
  std::printf("config keys (add them to the config's tables, or pass them to fsdp-train as --set):\n");
  std::string section, set_args;
  for (const auto& [key, value] : values) {
    const std::string table = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
    if (table != section) std::printf("  [%s]\n", table.c_str());
    section = table;
    std::printf("  %s = %s\n", name.c_str(), value.c_str());
    set_args += " --set " + key + "=" + (value[0] == '"' ? "'" + value + "'" : value);
  }
  std::printf("  fsdp-train CONFIG%s\n", set_args.c_str());
}

// --fit: the fastest plan that fits, the next ones, and its config keys. 1 when none fits.
int fit(const PlanFlags& f, PlanInput in) {
  fsdp::plan::FitRequest request;
  request.memory_bytes = fsdp::plan::parse_bytes(f.fit);
  in.device_memory_bytes = request.memory_bytes;
  const std::string assumed = assume_rates(in);
  request.base = in;
  request.fixed = fixed_settings(f);
  request.host_link_bytes_per_second = f.host_link_gbps * 1e9;
  const fsdp::plan::FitResult result = fsdp::plan::fit_plans(request);
  std::string searched, fixed;
  for (FitSetting s : fsdp::plan::all_fit_settings()) {
    std::string& list = request.fixed.count(s) ? fixed : searched;
    list += (list.empty() ? "" : ", ") + std::string(fsdp::plan::fit_setting_name(s));
  }
  const std::string memory = format_bytes(static_cast<double>(request.memory_bytes));
  if (result.fitting.empty()) {
    std::printf("fsdp-plan --fit %s: none of %lld plans fits; the smallest needs %s per rank:\n", memory.c_str(),
                static_cast<long long>(result.searched),
                format_bytes(static_cast<double>(result.smallest.peak_bytes)).c_str());
    print_plan(result.smallest.plan, false);
    std::printf("searched: %s%s%s; more ranks, a shorter sequence or a smaller micro-batch would take less\n",
                searched.c_str(), fixed.empty() ? "" : "; fixed: ", fixed.c_str());
    return 1;
  }
  std::printf("fsdp-plan --fit %s per rank: %lld plans searched, %zu fit; the fastest:\n", memory.c_str(),
              static_cast<long long>(result.searched), result.fitting.size());
  print_plan(result.fitting.front().plan, false);
  std::printf("searched: %s%s%s\n", searched.c_str(),
              fixed.empty() ? "" : "; fixed by the config or the flags: ", fixed.c_str());
  std::printf("ranked at %.3g TFLOP/s and %.3g GB/s per rank%s, offload's copies at %.3g GB/s\n",
              in.compute_flops / 1e12, in.bandwidth_bytes / 1e9,
              assumed.empty() ? "" : (" (" + assumed + " assumed: --tflops, --bandwidth or --calibrate)").c_str(),
              f.host_link_gbps);
  std::printf(
      "the fastest that fit:\n   step s       peak  strategy       checkpointing micro offload  base   inflight "
      "chunk\n");
  for (size_t i = 0; i < result.fitting.size() && i < 5; ++i)
    std::printf("  %s\n", settings_row(result.fitting[i]).c_str());
  print_fit_config(result.fitting.front().plan.input, request.fixed);
  if (!f.json_path.empty()) {
    // "fit": what was searched, and the chosen plan's config keys with their TOML values (as --set takes them).
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& [key, value] : fsdp::train::fit_config_values(result.fitting.front().plan.input, request.fixed))
      keys[key] = value;
    write_json(result.fitting.front().plan, f.json_path,
               {{"fit",
                 {{"memory_bytes", request.memory_bytes},
                  {"searched", result.searched},
                  {"fitting", result.fitting.size()},
                  {"step_seconds", result.fitting.front().step_seconds},
                  {"config_keys", keys}}}});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fsdp-plan: per-rank memory, communication and step time of an FSDP training run, before it runs.\n\n"
      "  fsdp-plan --model llama3-70b --ranks 8 --memory 80GB --param-dtype bfloat16 --activation-checkpointing\n"
      "  fsdp-plan configs/gpt-fortunes-tiny.toml --ranks 2 --memory 5GiB\n"
      "  mpirun -np 2 fsdp-plan configs/gpt-fortunes-tiny.toml --calibrate   # rates measured here\n\n"
      "A config file gives the model, batch, sequence length and [fsdp] settings; flags override it."};
  PlanFlags flags;
  declare_flags(app, flags);
  CLI11_PARSE(app, argc, argv);

  fsdp::comm::ProcessGroupPtr world;
  try {
    if (flags.calibrate) world = fsdp::comm::init_world();
    const bool leader = !world || world->rank() == 0;
    PlanInput in = flags.config_path.empty() ? input_from_model(flags, world) : input_from_config(flags, world);
    apply_flags(flags, in);
    if (flags.calibrate) calibrate(in, world, leader);
    if (!flags.fit.empty()) {
      if (!flags.memory.empty()) throw std::invalid_argument("--fit takes the memory: leave out --memory");
      return leader ? fit(flags, in) : 0;
    }
    const Plan plan = fsdp::plan::make_plan(in);
    if (leader) {
      print_plan(plan, flags.compact);
      if (!flags.json_path.empty()) write_json(plan, flags.json_path);
    }
    return 0;
  } catch (const std::exception& e) {
    if (!world || world->rank() == 0) std::fprintf(stderr, "fsdp-plan: error: %s\n", e.what());
    return 2;
  }
}
