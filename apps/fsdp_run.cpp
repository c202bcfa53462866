// fsdp-run: supervises a training job and restarts it from its latest complete checkpoint when it
// fails, as torchrun's elastic agent does for PyTorch.
//
//   fsdp-run --ranks 4 --max-restarts 3 -- configs/gpt-fortunes-tiny.toml --set checkpoint.every=50
//   fsdp-run --ranks 4 --min-ranks 2 --launcher "srun --ntasks" -- CONFIG
//
// Each attempt runs `LAUNCHER RANKS fsdp-train CONFIG ARGS [--resume latest]` (the launcher's last
// word takes the rank count: mpirun's -np, srun's --ntasks), adding --resume latest once a
// checkpoint exists. A failed attempt (a non-zero exit other than 2, a bad command line, or 3, a
// missed target; or a signal) is restarted up to --max-restarts times. With --min-ranks M below
// --ranks N, each restart runs one rank fewer, down to M: the failed rank's host is taken as lost,
// and the checkpoint reshards to the new count. Every attempt and restart is logged on stderr and
// appended to <output_dir>/restarts.jsonl. SIGTERM and SIGINT go to the running attempt (which
// saves a checkpoint and exits) and end the supervision.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

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
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/train/config.h"

namespace {

volatile sig_atomic_t forwarded_signal = 0;
volatile pid_t running_child = 0;

void forward_signal(int signal) {
  forwarded_signal = signal;
  if (running_child > 0) kill(running_child, signal);
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
  command += " --print-config 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot run " + trainer);
  std::string text;
  std::array<char, 4096> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) text.append(buffer.data(), n);
  if (pclose(pipe) != 0) throw std::runtime_error(trainer + " refused the job's arguments:\n" + text);
  return text;
}

// Runs argv, waiting for it; returns the wait status.
int run_attempt(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    execvp(args[0], args.data());
    std::fprintf(stderr, "fsdp-run: cannot start '%s': %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  running_child = child;
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-run: runs fsdp-train under a launcher and restarts it from its latest checkpoint when it fails."};
  int ranks = 1, min_ranks = 0, max_restarts = 3;
  std::string launcher = "mpirun --bind-to none -np";
  std::string trainer = default_trainer();
  std::vector<std::string> train_args;
  app.add_option("--ranks,-n", ranks, "ranks of the first attempt")->check(CLI::PositiveNumber);
  app.add_option("--min-ranks", min_ranks,
                 "restart each time on one rank fewer, down to this many (a failed rank's host is taken as lost; "
                 "the checkpoint reshards). Default: --ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-restarts", max_restarts, "restarts after failures before giving up")->check(CLI::NonNegativeNumber);
  app.add_option("--launcher", launcher, "the launch command, its last word taking the rank count "
                                         "(default \"mpirun --bind-to none -np\"; \"srun --ntasks\")");
  app.add_option("--trainer", trainer, "the fsdp-train program (default: the one beside fsdp-run)");
  app.add_option("train_args", train_args, "after --: CONFIG and fsdp-train's own options")->required();
  app.footer("Example: fsdp-run --ranks 4 --max-restarts 3 -- configs/gpt-fortunes-tiny.toml --set checkpoint.every=50");
  CLI11_PARSE(app, argc, argv);
  if (min_ranks == 0) min_ranks = ranks;
  if (min_ranks > ranks) {
    std::fprintf(stderr, "fsdp-run: --min-ranks %d exceeds --ranks %d\n", min_ranks, ranks);
    return 2;
  }
  for (const auto& a : train_args) {
    if (a.find('\'') != std::string::npos) {
      std::fprintf(stderr, "fsdp-run: an argument holds a single quote, which fsdp-run does not pass on: %s\n", a.c_str());
      return 2;
    }
    if (a == "--resume") {
      std::fprintf(stderr, "fsdp-run: leave --resume out: fsdp-run resumes from the latest checkpoint itself\n");
      return 2;
    }
  }

  std::string checkpoints, output_dir;
  try {
    const fsdp::train::TrainConfig config =
        fsdp::train::parse_train_config(resolved_config(trainer, train_args), "the resolved config of " + train_args.front());
    checkpoints = fsdp::train::checkpoints_dir(config);
    output_dir = config.output_dir;
    if (config.checkpoint.every <= 0) {
      std::fprintf(stderr, "fsdp-run: warning: checkpoint.every is 0: a restart starts over from step 0\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-run: error: %s\n", e.what());
    return 1;
  }
  std::filesystem::create_directories(output_dir);
  const std::string log_path = output_dir + "/restarts.jsonl";
  auto log_event = [&](nlohmann::json event) {
    event["time"] = now_text();
    std::ofstream(log_path, std::ios::app) << event.dump() << "\n";
  };

  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  int current = ranks;
  for (int attempt = 0;; ++attempt) {
    const std::string latest = fsdp::checkpoint::find_latest_checkpoint(checkpoints);
    std::vector<std::string> command = split_words(launcher);
    command.push_back(std::to_string(current));
    command.push_back(trainer);
    command.insert(command.end(), train_args.begin(), train_args.end());
    if (!latest.empty()) {
      command.push_back("--resume");
      command.push_back("latest");
    }
    std::fprintf(stderr, "fsdp-run: attempt %d on %d rank(s)%s: %s\n", attempt + 1, current,
                 latest.empty() ? "" : (", from " + latest).c_str(), joined(command).c_str());
    log_event({{"event", "start"}, {"attempt", attempt + 1}, {"ranks", current}, {"resume_from", latest}});
    const auto started = std::chrono::steady_clock::now();
    const int status = run_attempt(command);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    log_event({{"event", ok ? "done" : "failed"}, {"attempt", attempt + 1}, {"ranks", current}, {"result", describe(status)},
               {"seconds", seconds}});
    if (ok) {
      std::fprintf(stderr, "fsdp-run: done after %d attempt(s)\n", attempt + 1);
      return 0;
    }
    std::fprintf(stderr, "fsdp-run: attempt %d failed (%s) after %.1f s\n", attempt + 1, describe(status).c_str(), seconds);
    if (forwarded_signal != 0) {
      std::fprintf(stderr, "fsdp-run: stopped by signal %d; not restarting\n", static_cast<int>(forwarded_signal));
      return 1;
    }
    if (WIFEXITED(status) && (WEXITSTATUS(status) == 2 || WEXITSTATUS(status) == 3 || WEXITSTATUS(status) == 127)) {
      std::fprintf(stderr, "fsdp-run: %s is not a failure a restart mends; not restarting\n", describe(status).c_str());
      return WEXITSTATUS(status);
    }
    if (attempt >= max_restarts) {
      std::fprintf(stderr, "fsdp-run: giving up after %d restart(s) (--max-restarts)\n", max_restarts);
      return 1;
    }
    if (current > min_ranks) --current;
    log_event({{"event", "restart"}, {"attempt", attempt + 2}, {"ranks", current}});
  }
}
