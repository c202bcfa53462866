#include "fsdp/train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fsdp/checkpoint/published_files.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/text_gather.h"

namespace fsdp::train {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const* run_file_names() {
  static const char* const names[] = {"run.json",   "metrics.jsonl",        "config.toml", "report.html",
                                      "sample.txt", "skipped_batches.json", "profile",     nullptr};
  return names;
}

namespace {

constexpr const char* kRunRecord = "run.json";

// How long a claim waits for another job's lock: FSDP_RUN_LOCK_WAIT_S, default 120 s (a failed
// job's last rank may take that long to end; capped below the collective timeout, in which the
// other ranks wait meanwhile).
double lock_wait_seconds() {
  const char* text = std::getenv("FSDP_RUN_LOCK_WAIT_S");
  if (text == nullptr || *text == '\0') return 120.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds >= 0)) {
    throw std::runtime_error(std::string("FSDP_RUN_LOCK_WAIT_S='") + text + "': expected seconds, e.g. 30");
  }
  return seconds;
}
constexpr const char* kLockFile = "run.lock";

std::string utc_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[40];
  std::strftime(text, sizeof(text), format, &utc);
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// "20261205T040651Z-3f9a2c1d": sortable by start, unique across jobs started in the same second.
std::string new_run_id() {
  std::random_device device;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", static_cast<unsigned>(device()));
  return utc_now("%Y%m%dT%H%M%SZ") + "-" + suffix;
}

// run.json's fields, or an empty object when there is none; a run.json that is not ours throws.
json read_run_record(const fs::path& output_dir) {
  const fs::path path = output_dir / kRunRecord;
  std::error_code error;
  if (!fs::exists(path, error)) return json::object();
  std::ifstream in(path);
  json record;
  try {
    record = json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path.string() + "' is not a run record fsdp-train wrote (" + e.what() +
                             "); move it away if it is yours");
  }
  if (!record.is_object() || !record.contains("run_id") || !record.at("run_id").is_string() ||
      record.at("run_id").get<std::string>().empty()) {
    throw std::runtime_error("'" + path.string() +
                             "' is not a run record fsdp-train wrote (no \"run_id\"); move it "
                             "away if it is yours");
  }
  return record;
}

void write_run_record(const fs::path& output_dir, const json& record) {
  const fs::path path = output_dir / kRunRecord, partial = output_dir / (std::string(kRunRecord) + ".partial");
  {
    std::ofstream out(partial);
    out << record.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
    out.flush();
    if (!out) throw std::runtime_error("cannot write '" + partial.string() + "'");
  }
  checkpoint::fsync_path(partial);
  fs::rename(partial, path);
  checkpoint::fsync_path(output_dir);
}

// What in `output_dir` (and the checkpoints directory) says a run was there; empty when nothing.
std::string traces_of_a_run(const fs::path& output_dir, const std::string& checkpoints_dir) {
  std::string found;
  std::error_code error;
  const json record = fs::exists(output_dir / kRunRecord, error) ? read_run_record(output_dir) : json::object();
  if (record.contains("run_id")) {
    found = "run " + record.at("run_id").get<std::string>();
    if (record.contains("started")) found += ", started " + record.at("started").get<std::string>();
  } else {
    for (const char* const* name = run_file_names(); *name != nullptr; ++name) {
      if (fs::exists(output_dir / *name, error)) found += (found.empty() ? "" : ", ") + std::string(*name);
    }
  }
  const std::string latest = checkpoint::find_latest_checkpoint(checkpoints_dir);
  if (!latest.empty()) found += (found.empty() ? "" : "; ") + std::string("checkpoints up to ") + latest;
  return found;
}

// The first of DIR-2, DIR-3, ... that does not exist.
std::string free_sibling(const std::string& dir) {
  std::error_code error;
  for (int i = 2;; ++i) {
    const std::string candidate = dir + "-" + std::to_string(i);
    if (!fs::exists(candidate, error)) return candidate;
  }
}

bool same_place(const fs::path& a, const fs::path& b) {
  std::error_code error_a, error_b;
  const fs::path ca = fs::weakly_canonical(a, error_a), cb = fs::weakly_canonical(b, error_b);
  return !error_a && !error_b && ca == cb;
}

}  // namespace

RunDirectory::~RunDirectory() {
  if (lock_fd_ < 0) return;
  // A start that failed before writing anything leaves nothing behind: the lock file and the
  // directory, if this claim made them (bad input writes nothing).
  std::error_code error;
  if (!committed_ && created_dir_ && created_lock_) fs::remove(fs::path(output_dir_) / kLockFile, error);
  ::close(lock_fd_);                                                // releases the flock
  if (!committed_ && created_dir_) fs::remove(output_dir_, error);  // only if empty
}

std::shared_ptr<RunDirectory> RunDirectory::claim(const TrainConfig& config, const std::string& resume,
                                                  const comm::ProcessGroupPtr& world) {
  std::shared_ptr<RunDirectory> run(new RunDirectory());
  const std::string output = checkpoint::without_trailing_slashes(config.output_dir);
  const fs::path output_dir(output);
  const std::string checkpoints = checkpoints_dir(config);
  json verdict = {{"status", "ok"}};
  if (world->rank() == 0) {
    try {
      // 1. One job per directory: the lock first, so that the checks below see no other job's writes.
      std::error_code error;
      run->created_dir_ = !fs::exists(output_dir, error);
      fs::create_directories(output_dir);
      const fs::path lock_path = output_dir / kLockFile;
      run->output_dir_ = output;
      // Who made the lock file (O_EXCL): only that claim may remove it, and only with the directory it made.
      auto open_lock = [&] {
        run->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        run->created_lock_ = run->lock_fd_ >= 0;
        if (run->lock_fd_ < 0 && errno == EEXIST) run->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
        if (run->lock_fd_ < 0) {
          throw std::runtime_error("cannot open '" + lock_path.string() + "': " + std::strerror(errno));
        }
      };
      open_lock();
      // A job that just failed may take a while to end (a rank stopping in a collective whose peer
      // died, then its comm timeout), and fsdp-run or a user restarts at once: wait for it a while.
      // The other ranks wait for the verdict inside a collective: stay well inside its timeout.
      const double comm_timeout_s =
          std::chrono::duration<double>(comm::comm_timeout_from_env(std::chrono::minutes(5))).count();
      const double wait_seconds = std::min(lock_wait_seconds(), 0.8 * comm_timeout_s);
      const auto waited_from = std::chrono::steady_clock::now();
      bool said = false;
      while (true) {
        if (::flock(run->lock_fd_, LOCK_EX | LOCK_NB) == 0) {
          // Locked: but is it still the file the path names? (One that failed to start may have
          // removed the file it made meanwhile: then lock the one there now.)
          struct stat held {
          }, named{};
          if (::fstat(run->lock_fd_, &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 &&
              held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
            break;
          }
          ::close(run->lock_fd_);
          open_lock();
          continue;
        }
        std::ifstream in(lock_path);
        std::string holder;
        std::getline(in, holder);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
        if (waited < wait_seconds) {
          if (!said) {
            std::fprintf(stderr,
                         "fsdp-train: output_dir '%s' is in use (%s): waiting up to %.0f s for that job to end\n",
                         output.c_str(), holder.c_str(), wait_seconds);
            said = true;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          continue;
        }
        throw RunDirectoryRefused("output_dir '" + output + "' is in use by another job (" +
                                  (holder.empty() ? std::string("its lock is held") : holder) + ", waited " +
                                  std::to_string(static_cast<int>(wait_seconds)) +
                                  " s): two jobs in one directory would prune and publish over each other's "
                                  "checkpoints; give this one another --output-dir");
      }
      const std::string holder = "fsdp-train pid " + std::to_string(::getpid()) + " on host " + host_name() +
                                 ", since " + utc_now("%Y-%m-%d %H:%M:%S UTC") + "\n";
      if (::ftruncate(run->lock_fd_, 0) != 0 || ::pwrite(run->lock_fd_, holder.data(), holder.size(), 0) < 0) {
        throw std::runtime_error("cannot write '" + lock_path.string() + "': " + std::strerror(errno));
      }

      // 2. Which run this is, and where it starts.
      const json record = read_run_record(output_dir);
      const std::string existing_id = record.value("run_id", "");
      auto refuse_if_occupied = [&](const std::string& why) {
        const std::string traces = traces_of_a_run(output_dir, checkpoints);
        if (traces.empty()) return;
        throw RunDirectoryRefused(why + " into output_dir '" + output + "', which holds another run (" + traces +
                                  "): fsdp-train never writes over a run. Continue that one with --resume latest, or "
                                  "start this one elsewhere, e.g. --output-dir " +
                                  free_sibling(output) + " (or move '" + output + "' away yourself)");
      };
      std::string run_id, resume_from, note;
      int64_t resume_step = 0;
      bool finished = false;
      if (resume.empty()) {
        refuse_if_occupied("a new run");
        run_id = new_run_id();
      } else if (resume == "latest") {
        run_id = existing_id;
        if (run_id.empty()) {
          // No run.json (moved away, or a run from before run ids): the newest checkpoint's run.
          const std::string newest = checkpoint::find_latest_checkpoint(checkpoints);
          if (!newest.empty()) run_id = checkpoint::read_checkpoint_info(newest).run_id;
        }
        resume_from = checkpoint::find_latest_checkpoint(checkpoints, -1, run_id);
        if (resume_from.empty()) {
          if (existing_id.empty()) {
            throw std::runtime_error("--resume latest: no checkpoint under '" + checkpoints + "' and no run in '" +
                                     output + "' to continue");
          }
          // No checkpoint of its own yet: where the run started (a checkpoint it branched from, or step 0).
          resume_from = record.value("resumed_from", "");
          note = "run " + run_id + " has no checkpoint of its own yet: it starts again from " +
                 (resume_from.empty() ? std::string("step 0") : resume_from);
        }
      } else {
        const std::string dir = checkpoint::without_trailing_slashes(resume);
        const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(dir);
        const bool inside = same_place(fs::path(dir).parent_path(), checkpoints);
        const bool this_run = inside && (info.run_id.empty() || existing_id.empty() || info.run_id == existing_id);
        if (this_run) {
          run_id = existing_id.empty() ? info.run_id : existing_id;
          const std::string latest = checkpoint::find_latest_checkpoint(checkpoints, -1, run_id);
          const checkpoint::CheckpointInfo newest = checkpoint::read_checkpoint_info(latest);
          if (newest.step > info.step) {
            throw RunDirectoryRefused("--resume " + dir + ": this run's newest checkpoint is " + latest + " (step " +
                                      std::to_string(newest.step) + "); continuing from step " +
                                      std::to_string(info.step) +
                                      " would leave the later ones as the newest, "
                                      "which pruning would keep and --resume latest would take. Continue with --resume "
                                      "latest, or branch from "
                                      "step " +
                                      std::to_string(info.step) + " into another directory: --output-dir " +
                                      free_sibling(output) + " --resume " + dir);
          }
        } else {
          refuse_if_occupied("--resume " + dir + " starts a new run from another run's checkpoint, and a new run goes");
        }
        resume_from = dir;
      }
      if (!resume_from.empty()) {
        resume_step = checkpoint::read_checkpoint_info(resume_from).step;
        finished = resume == "latest" && resume_step == config.steps;
        if (resume_step > config.steps || (resume != "latest" && resume_step == config.steps)) {
          // Not a failure a restart mends: a usage error (exit 2).
          throw RunDirectoryRefused("checkpoint '" + resume_from + "' is at step " + std::to_string(resume_step) +
                                    ", and train.steps is " + std::to_string(config.steps) +
                                    ": nothing left to train (raise train.steps to go on)");
        }
      }
      if (run_id.empty()) {
        run_id = new_run_id();
        if (!resume_from.empty() && resume == "latest")
          note = "checkpoints from before run ids: continued as run " + run_id;
      }
      if (existing_id != run_id) {
        // Written by commit(), with the run's other files: a start that fails before then leaves no
        // run behind to refuse the next try.
        json written = {{"run_id", run_id},
                        {"name", config.name},
                        {"started", utc_now("%Y-%m-%d %H:%M:%S UTC")},
                        {"host", host_name()}};
        if (!resume_from.empty()) written["resumed_from"] = resume_from;
        run->pending_record_ = written.dump(-1, ' ', false, json::error_handler_t::replace);
      }
      verdict = {{"status", "ok"},      {"run_id", run_id},     {"resume_from", resume_from},
                 {"step", resume_step}, {"finished", finished}, {"note", note}};
    } catch (const RunDirectoryRefused& e) {
      verdict = {{"status", "refused"}, {"message", e.what()}};
    } catch (const std::exception& e) {
      verdict = {{"status", "error"}, {"message", e.what()}};
    }
  }
  const std::string text = verdict.dump(-1, ' ', false, json::error_handler_t::replace);
  const json decided = world->size() > 1 ? json::parse(comm::all_gather_text(world, text).front()) : verdict;
  const std::string status = decided.at("status").get<std::string>();
  if (status == "refused") throw RunDirectoryRefused(decided.at("message").get<std::string>());
  if (status == "error") throw std::runtime_error(decided.at("message").get<std::string>());
  run->run_id_ = decided.at("run_id").get<std::string>();
  run->resume_from_ = decided.at("resume_from").get<std::string>();
  run->resume_step_ = decided.at("step").get<int64_t>();
  run->finished_ = decided.at("finished").get<bool>();
  run->note_ = decided.at("note").get<std::string>();
  return run;
}

void RunDirectory::commit() {
  committed_ = true;
  if (pending_record_.empty()) return;
  write_run_record(fs::path(output_dir_), json::parse(pending_record_));
  pending_record_.clear();
}

std::string read_run_id(const std::string& output_dir) {
  return read_run_record(fs::path(checkpoint::without_trailing_slashes(output_dir))).value("run_id", "");
}

}  // namespace fsdp::train
