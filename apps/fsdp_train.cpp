// fsdp-train: trains a model from the zoo with FSDP, from a TOML config. Launch under mpirun (or
// srun); the same command runs at any number of ranks, on one machine or many.
//
//   mpirun -np 2 build/apps/fsdp-train configs/gpt-fortunes-tiny.toml
//   mpirun -np 4 build/apps/fsdp-train configs/llama-fortunes-small.toml --set train.steps=50
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/registry.h"
#include "fsdp/shard/host_heap.h"
#include "fsdp/train/construction_check.h"
#include "fsdp/train/config.h"
#include "fsdp/train/run_directory.h"
#include "fsdp/train/trainer.h"

namespace {

// SIGTERM (a scheduler preempting the job), SIGINT (Ctrl-C) or SIGUSR1 (which mpirun relays to its
// ranks at once, where it answers SIGINT and SIGTERM with SIGTERM 1 s later and SIGKILL 1 s after:
// scripts/launch-ranks.sh, fsdp-run and Slurm's --signal=USR1@T send it): save a checkpoint at
// the end of the step and exit. Every later signal asks the same: one stop may reach a rank more
// than once, and none of them may kill it mid-save. To stop at once: SIGKILL.
void on_stop_signal(int) { fsdp::train::request_stop(); }

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

void list_models() {
  std::printf("%-14s %-6s %16s  %s\n", "model", "family", "parameters", "FLOPs per token or image (seq 1024)");
  for (const auto& name : fsdp::models::model_names()) {
    auto config = fsdp::models::model_config(name);
    std::printf("%-14s %-6s %16lld  %.3g\n", name.c_str(), fsdp::models::family_name(config),
                static_cast<long long>(fsdp::models::parameter_count(config)),
                fsdp::models::flops_per_sample(config, 1024));
  }
}

// fsdp-train's command line.
struct Command {
  std::string config_path;
  std::vector<std::string> overrides;  // --set KEY=VALUE, then --steps and --output-dir as overrides
  int64_t steps = 0;
  std::string output_dir;
  bool print_config = false, show_models = false, show_keys = false, check = false;
  std::string progress = "auto";
  std::string resume, profile_steps;

  void add_to(CLI::App& app) {
    app.add_option("config", config_path, "TOML training configuration (see configs/)");
    app.add_option("--set", overrides, "override a config key, e.g. --set train.steps=50 (repeatable)");
    app.add_option("--steps", steps, "shorthand for --set train.steps=N")->check(CLI::PositiveNumber);
    app.add_option("--output-dir", output_dir, "shorthand for --set output_dir=DIR");
    app.add_option("--progress", progress,
                   "bar (redrawn in place), lines (one every train.log_every steps, for logs), or auto: a bar on a\n"
                   "terminal. Under mpirun every rank sees a terminal, so pass lines when redirecting output")
        ->check(CLI::IsMember({"auto", "bar", "lines"}));
    app.add_option("--resume", resume,
                   "continue from a checkpoint: its directory, or 'latest' (newest under checkpoint.dir); the\n"
                   "checkpoint may come from another number of ranks");
    app.add_option("--profile-steps", profile_steps,
                   "A:B: record steps A to B (1-based) with libtorch's profiler into a Chrome trace per rank,\n"
                   "<output_dir>/profile/trace-rank<R>.json (open in ui.perfetto.dev); A alone: one step");
    app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
    app.add_flag("--check", check,
                 "check the config at this job's rank count without training: read it as a run does, construct\n"
                 "and shard its model on the meta device (no memory, no values), compare it with the plan, and\n"
                 "exit (0: accepted and as planned; 1: refused or counted otherwise). Writes nothing");
    app.add_flag("--list-models", show_models, "list the model zoo with parameter counts and exit");
    app.add_flag("--list-keys", show_keys, "list every config key with its type, help and default, and exit");
  }

  // --steps and --output-dir as the --set overrides they stand for (after the user's own).
  void fold_shorthands() {
    if (steps > 0) overrides.push_back("train.steps=" + std::to_string(steps));
    // A TOML string whatever the directory's name holds (backslashes, quotes).
    if (!output_dir.empty()) overrides.push_back("output_dir=" + fsdp::train::toml_string(output_dir));
  }
};

// Every rank reads the config (and --profile-steps into `options`); they agree on success before
// anything else happens.
fsdp::train::TrainConfig read_config(const Command& command, const fsdp::comm::ProcessGroupPtr& world,
                                     fsdp::train::TrainerOptions& options) {
  fsdp::train::TrainConfig config;
  std::string error;
  try {
    config = fsdp::train::load_train_config(command.config_path, command.overrides);
    fsdp::train::validate_for_world(config, world->size());
    if (!command.check) fsdp::train::check_this_build_runs(config);  // --check says it instead
    if (!command.profile_steps.empty()) {
      std::tie(options.profile_first, options.profile_last) = fsdp::train::parse_profile_steps(command.profile_steps);
      if (options.profile_last > config.steps) {
        throw std::invalid_argument("--profile-steps " + command.profile_steps + ": the run has " +
                                    std::to_string(config.steps) + " steps (train.steps)");
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  fsdp::comm::agree_on_failure(world, error, "reading the config");
  return config;
}

// The run itself, on every rank: its exit status (0 done, 2 the output directory refused, 3
// stopped by a missed target). Throws on a failure.
int run(const Command& command, const fsdp::comm::ProcessGroupPtr& world) {
  const int rank = world->rank();
  fsdp::train::TrainerOptions options;
  const fsdp::train::TrainConfig config = read_config(command, world, options);
  if (command.print_config) {
    if (rank == 0) std::printf("%s", fsdp::train::to_toml(config).c_str());
    return 0;
  }
  if (command.check) {
    const fsdp::train::ConstructionCheck check = fsdp::train::check_construction(config, world);
    if (rank == 0) std::printf("%s", fsdp::train::describe(check, config).c_str());
    return check.agrees() ? 0 : 1;
  }
  options.resume = command.resume;
  install_stop_handlers();
  // The output directory: this run's alone (run_directory.h). A refusal is a usage error (exit 2,
  // which fsdp-run does not retry); a finished run is done (exit 0).
  try {
    options.run = fsdp::train::RunDirectory::claim(config, command.resume, world);
  } catch (const fsdp::train::RunDirectoryRefused& e) {
    if (rank == 0) std::fprintf(stderr, "fsdp-train: error: %s\n", e.what());
    return 2;
  }
  if (options.run->finished()) {
    if (rank == 0) {
      std::printf(
          "fsdp-train: the run in %s is done: its newest checkpoint, %s, is at train.steps (%lld); nothing left "
          "to train\n",
          config.output_dir.c_str(), options.run->resume_from().c_str(), static_cast<long long>(config.steps));
    }
    return 0;
  }
  options.progress = command.progress == "bar"     ? fsdp::train::ProgressStyle::Bar
                     : command.progress == "lines" ? fsdp::train::ProgressStyle::Lines
                                                   : fsdp::train::ProgressStyle::Auto;
  const fsdp::train::TrainSummary summary = fsdp::train::train(config, world, options);
  if (summary.stopped_by_target) {
    // A run that ended early on purpose: distinguishable from success (0) and failure (1).
    if (rank == 0)
      std::fprintf(stderr, "fsdp-train: stopped: %s (targets.stop = true)\n", summary.missed_targets.front().c_str());
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fsdp-train: Fully Sharded Data Parallel training from a TOML config.\n"
      "Each of the N ranks holds 1/N of the parameters, gradients and optimizer state.\n"
      "Launch with mpirun -np N (or srun); without a launcher it runs as one rank.\n\n"
      "  mpirun -np 2 fsdp-train configs/gpt-fortunes-tiny.toml\n"
      "  mpirun -np 2 fsdp-train configs/gpt-fortunes-tiny.toml --set train.steps=50 --set optimizer.lr=1e-3\n\n"
      "Writes config.toml, metrics.jsonl (one JSON object per step and evaluation), report.html\n"
      "(rewritten every train.report_every steps) and sample.txt into output_dir (default runs/<name>),\n"
      "and checkpoints every checkpoint.every steps. SIGTERM, SIGINT or SIGUSR1: every rank saves a checkpoint at\n"
      "the end of the step and exits; --resume latest continues. Exit status: 0 done, 1 error, 2 bad\n"
      "command line, 3 stopped by a missed target (targets.stop = true)."};
  Command command;
  command.add_to(app);
  CLI11_PARSE(app, argc, argv);
  // First-touch page faults cost more than the arithmetic they precede on small VMs: reuse memory.
  fsdp::shard::keep_freed_host_memory_mapped();
  if (command.show_models) {
    list_models();
    return 0;
  }
  if (command.show_keys) {
    std::printf("%s", fsdp::train::list_config_keys().c_str());
    return 0;
  }
  if (command.config_path.empty()) {
    std::fprintf(stderr,
                 "fsdp-train: error: give a config file, e.g. configs/gpt-fortunes-tiny.toml (--help for more)\n");
    return 2;
  }
  command.fold_shorthands();

  fsdp::comm::ProcessGroupPtr world;
  try {
    world = fsdp::comm::init_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-train: error: %s\n", e.what());
    return 1;
  }
  try {
    return run(command, world);
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) std::fprintf(stderr, "fsdp-train: error: %s\n", e.what());
    return 1;  // every rank stops by agreement: nobody waits
  } catch (const std::exception& e) {
    // libtorch's errors carry a C++ backtrace after the message: print the message only.
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    std::fprintf(stderr, "fsdp-train: error: %s\n", torch_error ? torch_error->what_without_backtrace() : e.what());
    std::fflush(stderr);
    // Past the agreed checks a failure is this rank's alone, and the others may be inside a
    // collective waiting for it: end the whole job now rather than let them hang.
    if (world->size() > 1) world->abort(e.what());
    return 1;
  }
}
