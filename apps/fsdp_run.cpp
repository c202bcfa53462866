// fsdp-run: supervises a training job and restarts it from its latest complete checkpoint when it
// fails, as torchrun's elastic agent does for PyTorch.
//
//   fsdp-run --ranks 4 --max-restarts 3 -- configs/gpt-fortunes-tiny.toml --set checkpoint.every=50
//   fsdp-run --ranks 4 --min-ranks 2 --launcher "srun --ntasks" -- CONFIG
//
// Each attempt runs `LAUNCHER RANKS fsdp-train CONFIG ARGS [--resume latest]` (the launcher's last
// word takes the rank count: mpirun's -np, srun's --ntasks). The first attempt starts a new run (it
// is refused if the output directory holds another: fsdp/train/run_directory.h), or continues the
// directory's run when fsdp-run itself is given --resume latest; every later attempt continues the
// run with --resume latest (from step 0 if it has no checkpoint yet). A run already done exits 0. A failed attempt (a
// non-zero exit other than 2, a bad command line, or 3, a missed target; or a signal) is restarted up to --max-restarts
// times. With --min-ranks M below
// --ranks N, each restart runs one rank fewer, down to M: the failed rank's host is taken as lost,
// and the checkpoint reshards to the new count. Every attempt and restart is logged on stderr and
// appended to <output_dir>/restarts.jsonl. SIGTERM and SIGINT (Ctrl-C) end the supervision: the
// running attempt is asked to save a checkpoint and exit (SIGUSR1 to its launcher, which relays it
// to the ranks); a second one stops the launcher, a third kills it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/train/config.h"
#include "fsdp/train/run_directory.h"

namespace {

volatile sig_atomic_t forwarded_signal = 0;
volatile pid_t running_child = 0;

volatile sig_atomic_t stop_signals_received = 0;

// SIGINT or SIGTERM to fsdp-run (Ctrl-C reaches fsdp-run alone: the attempt runs in a process group
// of its own). The first is relayed to the attempt as SIGUSR1, which mpirun (and srun) pass to the
// ranks at once and which fsdp-train takes as a stop request: every rank saves and exits. (SIGINT or
// SIGTERM to mpirun would have it send SIGTERM 1 s later and SIGKILL 1 s after that, killing a rank
// mid-save.) A second is relayed as SIGTERM (the launcher's own stop); any later one kills the
// launcher.
void forward_signal(int signal) {
  forwarded_signal = signal;
  const int received = ++stop_signals_received;
  if (running_child <= 0) return;
  if (received == 1) {
    kill(running_child, SIGUSR1);
  } else if (received == 2) {
    kill(running_child, SIGTERM);
  } else {
    kill(running_child, SIGKILL);  // its ranks, each in a process group of mpirun's making, lose their daemon and end
  }
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

// fsdp-train beside this program (an installed or built tree), else from PATH.
std::string default_trainer() {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const auto beside = self.parent_path() / "fsdp-train";
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return "fsdp-train";
}

// The run's resolved config, as fsdp-train itself resolves CONFIG and ARGS (--print-config).
std::string resolved_config(const std::string& trainer, const std::vector<std::string>& train_args) {
  std::string command = "'" + trainer + "'";
  for (const auto& a : train_args) command += " '" + a + "'";  // arguments hold no quotes (checked)
  // Standard output alone: an MPI or hwloc warning on standard error must not become TOML.
  command += " --print-config";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + trainer);
  std::string text;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) text.append(buffer.data(), n);
  if (pclose(pipe) != 0) throw std::runtime_error(trainer + " refused the job's arguments (its message is above)");
  return text;
}

// Runs argv, waiting for it; returns the wait status. SIGTERM and SIGINT are blocked from before
// the fork until the child is recorded, so that one arriving in between is forwarded (on unblocking)
// rather than lost; the child starts with them unblocked and at their default actions.
int run_attempt(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigprocmask(SIG_BLOCK, &stop_signals, &previous);
  const pid_t child = fork();
  if (child < 0) {
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (child == 0) {
    // A process group of its own, so that the terminal's Ctrl-C reaches fsdp-run alone (which
    // relays it as above); standard input from /dev/null, as a background group reading the
    // terminal would be stopped.
    setpgid(0, 0);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      dup2(null_fd, STDIN_FILENO);
      close(null_fd);
    }
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "fsdp-run: cannot start '%s': %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(child, child);  // as the child does itself: whichever runs first
  running_child = child;
  sigprocmask(SIG_SETMASK, &previous, nullptr);  // a signal that came meanwhile is forwarded now
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  running_child = 0;
  return status;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

// One supervised run: the launch, the run's place on disk, and what the attempts may do.
struct Supervision {
  int ranks = 1, min_ranks = 0, max_restarts = 3;
  std::string launcher, trainer;
  std::vector<std::string> train_args;  // CONFIG and fsdp-train's options, --resume taken out
  bool continue_run = false;            // --resume latest given: the first attempt continues too
  std::string checkpoints, output_dir;

  // Appends one event to OUTPUT_DIR/restarts.jsonl, with the time.
  void log(nlohmann::json event) const {
    event["time"] = now_text();
    std::ofstream(output_dir + "/restarts.jsonl", std::ios::app)
        << event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
};

// --resume latest: the first attempt continues the directory's run too (after a supervisor that
// gave up, or a lost node). Any other --resume is a new run's start, which fsdp-run does not pass
// on. Takes the flag out of `args`; false (said on stderr) for another --resume.
bool take_resume_flag(std::vector<std::string>& args, bool& continue_run) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--resume" && args[i].rfind("--resume=", 0) != 0) continue;
    const std::string value = args[i] == "--resume" ? (i + 1 < args.size() ? args[i + 1] : "") : args[i].substr(9);
    if (value != "latest") {
      std::fprintf(stderr,
                   "fsdp-run: --resume %s: fsdp-run continues a run with --resume latest only (it resumes "
                   "from the run's newest checkpoint itself); start from another checkpoint with fsdp-train\n",
                   value.c_str());
      return false;
    }
    continue_run = true;
    args.erase(args.begin() + static_cast<long>(i),
               args.begin() + static_cast<long>(i) + (args[i] == "--resume" ? 2 : 1));
    --i;
  }
  return true;
}

// The checkpoints directory and output_dir of the run, from fsdp-train's resolved config; the
// output directory made. False (said on stderr) when the config cannot be read or the directory made.
bool find_run_place(Supervision& s) {
  try {
    const fsdp::train::TrainConfig config = fsdp::train::parse_train_config(
        resolved_config(s.trainer, s.train_args), "the resolved config of " + s.train_args.front());
    s.checkpoints = fsdp::train::checkpoints_dir(config);
    s.output_dir = config.output_dir;
    if (config.checkpoint.every <= 0) {
      std::fprintf(stderr, "fsdp-run: warning: checkpoint.every is 0: a restart starts over from step 0\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-run: error: %s\n", e.what());
    return false;
  }
  try {
    std::filesystem::create_directories(s.output_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-run: error: cannot create output_dir '%s': %s\n", s.output_dir.c_str(), e.what());
    return false;
  }
  return true;
}

// What a finished attempt means: the exit status fsdp-run ends with, or nothing when it restarts.
std::optional<int> verdict(int status, int attempt, double seconds, const Supervision& s) {
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (ok && forwarded_signal != 0) {
    // Saved and stopped, not done: 128 + the signal, as a shell reports it, so that a script does
    // not go on as if the run had finished.
    std::fprintf(stderr,
                 "fsdp-run: stopped by signal %d; the run saved a checkpoint (continue with fsdp-run ... "
                 "--resume latest)\n",
                 static_cast<int>(forwarded_signal));
    return 128 + static_cast<int>(forwarded_signal);
  }
  if (ok) {
    std::fprintf(stderr, "fsdp-run: done after %d attempt(s)\n", attempt + 1);
    return 0;
  }
  std::fprintf(stderr, "fsdp-run: attempt %d failed (%s) after %.1f s\n", attempt + 1, describe(status).c_str(),
               seconds);
  if (forwarded_signal != 0) {
    std::fprintf(stderr, "fsdp-run: stopped by signal %d; not restarting\n", static_cast<int>(forwarded_signal));
    return 1;
  }
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 2 || WEXITSTATUS(status) == 3 || WEXITSTATUS(status) == 127)) {
    std::fprintf(stderr, "fsdp-run: %s is not a failure a restart mends; not restarting\n", describe(status).c_str());
    return WEXITSTATUS(status);
  }
  if (attempt >= s.max_restarts) {
    std::fprintf(stderr, "fsdp-run: giving up after %d restart(s) (--max-restarts)\n", s.max_restarts);
    return 1;
  }
  return std::nullopt;
}

// Attempts until one ends the run (verdict): each on one rank fewer down to --min-ranks.
int supervise(Supervision s) {
  int current = s.ranks;
  for (int attempt = 0;; ++attempt) {
    if (forwarded_signal != 0) {
      std::fprintf(stderr, "fsdp-run: stopped by signal %d; not starting attempt %d\n",
                   static_cast<int>(forwarded_signal), attempt + 1);
      return 1;
    }
    // The first attempt starts the run (or continues it, asked to); each later one continues the
    // run the first one started, from its newest checkpoint (from step 0 if it has none yet).
    std::string latest;
    try {
      const std::string run_id = fsdp::train::read_run_id(s.output_dir);
      if (attempt > 0 && !run_id.empty()) s.continue_run = true;
      if (s.continue_run) latest = fsdp::checkpoint::find_latest_checkpoint(s.checkpoints, -1, run_id);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdp-run: error: %s\n", e.what());
      return 1;
    }
    std::vector<std::string> command = split_words(s.launcher);
    command.push_back(std::to_string(current));
    command.push_back(s.trainer);
    command.insert(command.end(), s.train_args.begin(), s.train_args.end());
    if (s.continue_run) {
      command.push_back("--resume");
      command.push_back("latest");
    }
    std::fprintf(stderr, "fsdp-run: attempt %d on %d rank(s)%s: %s\n", attempt + 1, current,
                 latest.empty() ? "" : (", from " + latest).c_str(), joined(command).c_str());
    s.log({{"event", "start"}, {"attempt", attempt + 1}, {"ranks", current}, {"resume_from", latest}});
    const auto started = std::chrono::steady_clock::now();
    int status = 0;
    try {
      status = run_attempt(command);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdp-run: error: %s\n", e.what());
      return 1;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    s.log({{"event", ok ? "done" : "failed"},
           {"attempt", attempt + 1},
           {"ranks", current},
           {"result", describe(status)},
           {"seconds", seconds}});
    if (const auto exit_status = verdict(status, attempt, seconds, s)) return *exit_status;
    if (current > s.min_ranks) --current;
    s.log({{"event", "restart"}, {"attempt", attempt + 2}, {"ranks", current}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-run: runs fsdp-train under a launcher and restarts it from its latest checkpoint when it fails."};
  Supervision s;
  s.launcher = "mpirun --bind-to none -np";
  s.trainer = default_trainer();
  app.add_option("--ranks,-n", s.ranks, "ranks of the first attempt")->check(CLI::PositiveNumber);
  app.add_option("--min-ranks", s.min_ranks,
                 "restart each time on one rank fewer, down to this many (a failed rank's host is taken as lost; "
                 "the checkpoint reshards). Default: --ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", s.max_restarts, "restarts after failures before giving up")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--launcher", s.launcher,
                 "the launch command, its last word taking the rank count "
                 "(default \"mpirun --bind-to none -np\"; \"srun --ntasks\")");
  app.add_option("--trainer", s.trainer, "the fsdp-train program (default: the one beside fsdp-run)");
  app.add_option("train_args", s.train_args, "after --: CONFIG and fsdp-train's own options")->required();
  app.footer(
      "Example: fsdp-run --ranks 4 --max-restarts 3 -- configs/gpt-fortunes-tiny.toml --set checkpoint.every=50");
  CLI11_PARSE(app, argc, argv);
  if (s.min_ranks == 0) s.min_ranks = s.ranks;
  if (s.min_ranks > s.ranks) {
    std::fprintf(stderr, "fsdp-run: --min-ranks %d exceeds --ranks %d\n", s.min_ranks, s.ranks);
    return 2;
  }
  for (const auto& a : s.train_args) {
    if (a.find('\'') != std::string::npos) {
      std::fprintf(stderr, "fsdp-run: an argument holds a single quote, which fsdp-run does not pass on: %s\n",
                   a.c_str());
      return 2;
    }
  }
  if (!take_resume_flag(s.train_args, s.continue_run)) return 2;
  if (!find_run_place(s)) return 1;

  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  return supervise(std::move(s));
}
