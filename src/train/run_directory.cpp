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

namespace {

// The open lock file: its descriptor, and whether this claim created it (O_EXCL), so that only
// that claim removes it, and only with the directory it made.
struct LockFile {
  int fd = -1;
  bool created = false;
};

LockFile open_lock_file(const fs::path& lock_path) {
  LockFile lock;
  lock.fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  lock.created = lock.fd >= 0;
  if (lock.fd < 0 && errno == EEXIST) lock.fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  if (lock.fd < 0) throw std::runtime_error("cannot open '" + lock_path.string() + "': " + std::strerror(errno));
  return lock;
}

// Takes the exclusive flock of `lock_path` (reopened while another job's failed start removes
// it), waiting a while for a job that holds it, then writes this job as its holder. `lock` is
// updated as files are reopened, so the caller closes what is open whatever happens.
void take_lock(const fs::path& lock_path, const std::string& output, LockFile& lock) {
  // A job that just failed may take a while to end (a rank stopping in a collective whose peer
  // died, then its comm timeout), and fsdp-run or a user restarts at once: wait for it a while.
  // The other ranks wait for the verdict inside a collective: stay well inside its timeout.
  const double comm_timeout_s =
      std::chrono::duration<double>(comm::comm_timeout_from_env(std::chrono::minutes(5))).count();
  const double wait_seconds = std::min(lock_wait_seconds(), 0.8 * comm_timeout_s);
  const auto waited_from = std::chrono::steady_clock::now();
  bool said = false;
  while (true) {
    if (::flock(lock.fd, LOCK_EX | LOCK_NB) == 0) {
      // Locked: but is it still the file the path names? (One that failed to start may have
      // removed the file it made meanwhile: then lock the one there now.)
      struct stat held {
      }, named{};
      if (::fstat(lock.fd, &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
          held.st_dev == named.st_dev) {
        break;
      }
      ::close(lock.fd);
      lock = LockFile{};  // nothing open while the next one opens (it may throw)
      lock = open_lock_file(lock_path);
      continue;
    }
    std::ifstream in(lock_path);
    std::string holder;
    std::getline(in, holder);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - waited_from).count();
    if (waited < wait_seconds) {
      if (!said) {
        std::fprintf(stderr, "fsdp-train: output_dir '%s' is in use (%s): waiting up to %.0f s for that job to end\n",
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
  const std::string holder = "fsdp-train pid " + std::to_string(::getpid()) + " on host " + host_name() + ", since " +
                             utc_now("%Y-%m-%d %H:%M:%S UTC") + "\n";
  if (::ftruncate(lock.fd, 0) != 0 || ::pwrite(lock.fd, holder.data(), holder.size(), 0) < 0) {
    throw std::runtime_error("cannot write '" + lock_path.string() + "': " + std::strerror(errno));
  }
}

// Which run this is and where it starts, as rank 0 decides it for every rank.
struct RunStart {
  std::string run_id, resume_from, note;
  int64_t resume_step = 0;
  bool finished = false;  // --resume latest on a run already at train.steps
};

// The directory, its checkpoints and its run record, as the decision reads them.
struct RunPlace {
  std::string output, checkpoints;
  json record;  // run.json ({} if none)
  std::string existing_id() const { return record.value("run_id", ""); }

  // A new run goes only where no run has left traces.
  void refuse_if_occupied(const std::string& why) const {
    const std::string traces = traces_of_a_run(output, checkpoints);
    if (traces.empty()) return;
    throw RunDirectoryRefused(why + " into output_dir '" + output + "', which holds another run (" + traces +
                              "): fsdp-train never writes over a run. Continue that one with --resume latest, or "
                              "start this one elsewhere, e.g. --output-dir " +
                              free_sibling(output) + " (or move '" + output + "' away yourself)");
  }
};

// --resume latest: the directory's run (or, without run.json, its newest checkpoint's), from its
// newest checkpoint, or from where it started when it has none of its own yet.
RunStart continue_latest(const RunPlace& place) {
  RunStart start;
  start.run_id = place.existing_id();
  if (start.run_id.empty()) {
    // No run.json (moved away, or a run from before run ids): the newest checkpoint's run.
    const std::string newest = checkpoint::find_latest_checkpoint(place.checkpoints);
    if (!newest.empty()) start.run_id = checkpoint::read_checkpoint_info(newest).run_id;
  }
  start.resume_from = checkpoint::find_latest_checkpoint(place.checkpoints, -1, start.run_id);
  if (start.resume_from.empty()) {
    if (place.existing_id().empty()) {
      throw std::runtime_error("--resume latest: no checkpoint under '" + place.checkpoints + "' and no run in '" +
                               place.output + "' to continue");
    }
    // No checkpoint of its own yet: where the run started (a checkpoint it branched from, or step 0).
    start.resume_from = place.record.value("resumed_from", "");
    start.note = "run " + start.run_id + " has no checkpoint of its own yet: it starts again from " +
                 (start.resume_from.empty() ? std::string("step 0") : start.resume_from);
  }
  return start;
}

// --resume DIR: this run's own checkpoint (refused unless it is its newest), or a new run
// branching from another run's checkpoint (refused where a run already is).
RunStart resume_from_checkpoint(const RunPlace& place, const std::string& resume) {
  RunStart start;
  const std::string dir = checkpoint::without_trailing_slashes(resume);
  const checkpoint::CheckpointInfo info = checkpoint::read_checkpoint_info(dir);
  const std::string existing_id = place.existing_id();
  const bool inside = same_place(fs::path(dir).parent_path(), place.checkpoints);
  const bool this_run = inside && (info.run_id.empty() || existing_id.empty() || info.run_id == existing_id);
  if (this_run) {
    start.run_id = existing_id.empty() ? info.run_id : existing_id;
    const std::string latest = checkpoint::find_latest_checkpoint(place.checkpoints, -1, start.run_id);
    const checkpoint::CheckpointInfo newest = checkpoint::read_checkpoint_info(latest);
    if (newest.step > info.step) {
      throw RunDirectoryRefused("--resume " + dir + ": this run's newest checkpoint is " + latest + " (step " +
                                std::to_string(newest.step) + "); continuing from step " + std::to_string(info.step) +
                                " would leave the later ones as the newest, which pruning would keep and --resume "
                                "latest would take. Continue with --resume latest, or branch from step " +
                                std::to_string(info.step) + " into another directory: --output-dir " +
                                free_sibling(place.output) + " --resume " + dir);
    }
  } else {
    place.refuse_if_occupied("--resume " + dir + " starts a new run from another run's checkpoint, and a new run goes");
  }
  start.resume_from = dir;
  return start;
}

RunStart decide_start(const TrainConfig& config, const std::string& resume, const RunPlace& place) {
  RunStart start;
  if (resume.empty()) {
    place.refuse_if_occupied("a new run");
    start.run_id = new_run_id();
  } else if (resume == "latest") {
    start = continue_latest(place);
  } else {
    start = resume_from_checkpoint(place, resume);
  }
  if (!start.resume_from.empty()) {
    start.resume_step = checkpoint::read_checkpoint_info(start.resume_from).step;
    start.finished = resume == "latest" && start.resume_step == config.steps;
    if (start.resume_step > config.steps || (resume != "latest" && start.resume_step == config.steps)) {
      // Not a failure a restart mends: a usage error (exit 2).
      throw RunDirectoryRefused("checkpoint '" + start.resume_from + "' is at step " +
                                std::to_string(start.resume_step) + ", and train.steps is " +
                                std::to_string(config.steps) + ": nothing left to train (raise train.steps to go on)");
    }
  }
  if (start.run_id.empty()) {
    start.run_id = new_run_id();
    if (!start.resume_from.empty() && resume == "latest")
      start.note = "checkpoints from before run ids: continued as run " + start.run_id;
  }
  return start;
}

}  // namespace

std::shared_ptr<RunDirectory> RunDirectory::claim(const TrainConfig& config, const std::string& resume,
                                                  const comm::ProcessGroupPtr& world) {
  std::shared_ptr<RunDirectory> run(new RunDirectory());
  const std::string output = checkpoint::without_trailing_slashes(config.output_dir);
  const fs::path output_dir(output);
  json verdict = {{"status", "ok"}};
  if (world->rank() == 0) {
    try {
      // 1. One job per directory: the lock first, so that the checks below see no other job's writes.
      std::error_code error;
      run->created_dir_ = !fs::exists(output_dir, error);
      fs::create_directories(output_dir);
      run->output_dir_ = output;
      LockFile lock = open_lock_file(output_dir / kLockFile);
      run->lock_fd_ = lock.fd;  // closed (and the file removed, if made here) by the destructor
      run->created_lock_ = lock.created;
      try {
        take_lock(output_dir / kLockFile, output, lock);
      } catch (...) {
        run->lock_fd_ = lock.fd, run->created_lock_ = lock.created;
        throw;
      }
      run->lock_fd_ = lock.fd, run->created_lock_ = lock.created;

      // 2. Which run this is, and where it starts.
      const RunPlace place{output, checkpoints_dir(config), read_run_record(output_dir)};
      const RunStart start = decide_start(config, resume, place);
      if (place.existing_id() != start.run_id) {
        // Written by commit(), with the run's other files: a start that fails before then leaves no
        // run behind to refuse the next try.
        json written = {{"run_id", start.run_id},
                        {"name", config.name},
                        {"started", utc_now("%Y-%m-%d %H:%M:%S UTC")},
                        {"host", host_name()}};
        if (!start.resume_from.empty()) written["resumed_from"] = start.resume_from;
        run->pending_record_ = written.dump(-1, ' ', false, json::error_handler_t::replace);
      }
      verdict = {{"status", "ok"},
                 {"run_id", start.run_id},
                 {"resume_from", start.resume_from},
                 {"step", start.resume_step},
                 {"finished", start.finished},
                 {"note", start.note}};
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
