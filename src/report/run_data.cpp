// Reading a run directory into RunData (run_report.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "fsdp/report/run_report.h"

namespace fsdp::report {

namespace fs = std::filesystem;

namespace {

double number_or(const nlohmann::json& record, const char* key, double fallback) {
  auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : fallback;
}

double max_of(const nlohmann::json& record, const char* key, double fallback) {
  auto it = record.find(key);
  if (it == record.end() || !it->is_array() || it->empty()) return fallback;
  double best = -1e300;
  for (const auto& v : *it) best = std::max(best, v.is_number() ? v.get<double>() : fallback);
  return best;
}

void add_step(RunData& run, const nlohmann::json& r) {
  StepPoint p;
  p.step = r.at("step").get<int64_t>();
  p.loss = number_or(r, "loss", 0);
  p.lr = number_or(r, "lr", 0);
  p.grad_norm = number_or(r, "grad_norm", 0);
  p.rate = number_or(r, run.language ? "tokens_per_second" : "images_per_second", 0);
  if (r.contains("images_per_second")) {
    run.language = false;
    p.rate = number_or(r, "images_per_second", 0);
  }
  p.mfu = number_or(r, "mfu", 0);
  p.loss_scale = number_or(r, "loss_scale", 0);
  p.step_seconds = number_or(r, "step_seconds", 0);
  p.communication = max_of(r, "communication_seconds_per_rank", 0);
  p.exposed = max_of(r, "exposed_communication_seconds_per_rank", -1);
  const char* memory_key = r.contains("peak_device_reserved_bytes_per_rank") ? "peak_device_reserved_bytes_per_rank"
                                                                             : "peak_resident_bytes_per_rank";
  if (r.contains(memory_key) && r.at(memory_key).is_array()) {
    for (const auto& v : r.at(memory_key)) p.peak_memory_per_rank.push_back(v.is_number() ? v.get<double>() : 0);
  }
  p.skipped = r.value("skipped", false);
  if (p.skipped) {
    run.events.push_back(
        {RunEvent::Kind::Skipped, p.step,
         "step " + std::to_string(p.step) + " skipped (" + r.value("skip_reason", std::string("non-finite")) + ")"});
  }
  // A resumed run appends: its steps replace any the first run recorded past its checkpoint.
  while (!run.steps.empty() && run.steps.back().step >= p.step) run.steps.pop_back();
  run.steps.push_back(std::move(p));
}

// Whether the file's last byte is a newline (an empty file counts as ended).
bool ends_with_newline(const fs::path& file) {
  std::ifstream raw(file, std::ios::binary | std::ios::ate);
  const auto size = static_cast<std::streamoff>(raw.tellg());
  if (size <= 0) return true;
  raw.seekg(size - 1);
  char last = 0;
  raw.get(last);
  return last == '\n';
}

// The records of one metrics.jsonl, each added to the run as its kind says.
class RecordReader {
 public:
  explicit RecordReader(RunData& run) : run_(run) {}

  void add(const nlohmann::json& r) {
    if (r.contains("run_start")) run_start(r);
    else if (r.contains("rollback_to")) rollback(r);
    else if (r.contains("eval_step")) evaluation(r);
    else if (r.contains("checkpoint_step")) checkpoint(r);
    else if (r.contains("target_missed")) target_missed(r);
    else if (r.contains("step")) add_step(run_, r);
  }

 private:
  void run_start(const nlohmann::json& r) {
    const int64_t start = r.at("run_start").get<int64_t>();
    run_.world_size = r.value("world_size", run_.world_size);
    run_.language = r.value("language", run_.language);
    run_.name = r.value("name", run_.name);
    run_.predicted_peak_bytes = number_or(r, "predicted_peak_bytes_per_rank", run_.predicted_peak_bytes);
    if (r.contains("config") && r.at("config").is_string()) run_.config_toml = r.at("config").get<std::string>();
    // A resume discards what the first run did after its checkpoint: so do its markers.
    if (start > 0) {
      auto& events = run_.events;
      events.erase(
          std::remove_if(events.begin(), events.end(),
                         [&](const RunEvent& e) { return e.step > start && e.kind != RunEvent::Kind::Restart; }),
          events.end());
      for (auto& t : run_.targets) {
        if (t.missed && t.step > start) t = {t.key, t.limit, false, 0, ""};
      }
    }
    const std::string resumed = r.value("resumed_from", std::string());
    if (!resumed.empty()) {
      run_.events.push_back(
          {RunEvent::Kind::Restart, start, "resumed at step " + std::to_string(start) + " from " + resumed});
    }
    if (r.contains("targets") && r.at("targets").is_object()) {
      for (const auto& [key, limit] : r.at("targets").items()) {
        if (limit.is_number() && !target_index_.count(key)) target(key, limit.get<double>());
      }
    }
  }

  // A rollback ([guard]) discards the steps after its checkpoint, as a resume does.
  void rollback(const nlohmann::json& r) {
    const int64_t to = r.at("rollback_to").get<int64_t>();
    auto& events = run_.events;
    events.erase(std::remove_if(events.begin(), events.end(),
                                [&](const RunEvent& e) { return e.step > to && e.kind == RunEvent::Kind::Checkpoint; }),
                 events.end());
    events.push_back({RunEvent::Kind::Restart, to, r.value("message", "rolled back to step " + std::to_string(to))});
  }

  void evaluation(const nlohmann::json& r) {
    EvalPoint e{r.at("eval_step").get<int64_t>(), number_or(r, "validation_loss", 0),
                number_or(r, "test_accuracy", -1)};
    while (!run_.evals.empty() && run_.evals.back().step >= e.step) run_.evals.pop_back();
    run_.evals.push_back(e);
  }

  void checkpoint(const nlohmann::json& r) {
    const int64_t step = r.at("checkpoint_step").get<int64_t>();
    run_.events.push_back({RunEvent::Kind::Checkpoint, step, "checkpoint at step " + std::to_string(step)});
  }

  void target_missed(const nlohmann::json& r) {
    const std::string key = r.at("target_missed").get<std::string>();
    const int64_t step = r.value("step", int64_t{0});
    const std::string message = r.value("message", key + " missed");
    run_.events.push_back({RunEvent::Kind::TargetMissed, step, message});
    TargetOutcome& t = target(key, number_or(r, "limit", 0));
    if (!t.missed) t = {key, number_or(r, "limit", t.limit), true, step, message};
  }

  // The target `key`, added (met so far, at `limit`) the first time it is named.
  TargetOutcome& target(const std::string& key, double limit) {
    if (!target_index_.count(key)) {
      target_index_[key] = run_.targets.size();
      run_.targets.push_back({key, limit, false, 0, ""});
    }
    return run_.targets[target_index_[key]];
  }

  RunData& run_;
  std::map<std::string, size_t> target_index_;  // key -> its place in run_.targets
};

}  // namespace

RunData read_run(const std::string& dir) {
  RunData run;
  run.dir = dir;
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  run.name = fs::path(trimmed).filename().string();
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in) {
    throw std::runtime_error("run directory '" + dir + "' has no readable metrics.jsonl (is it a run's output_dir?)");
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const bool ended = ends_with_newline(metrics);  // as read, before a writer adds more
  RecordReader records(run);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(lines[i]);
      if (!r.is_object()) throw std::runtime_error("not an object");
    } catch (const std::exception& e) {
      if (i + 1 == lines.size()) {
        // The last line: a run writing it now, or one that died mid-line.
        run.warnings.push_back(metrics.string() + ": line " + std::to_string(i + 1) + " is " +
                               (ended ? "not valid JSON" : "truncated") + "; left out");
        continue;
      }
      throw std::runtime_error(metrics.string() + ": line " + std::to_string(i + 1) + " is not a JSON object (" +
                               e.what() + ")");
    }
    try {
      records.add(r);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(metrics.string() + ": line " + std::to_string(i + 1) + ": " + e.what());
    }
  }
  if (run.steps.empty()) throw std::runtime_error(metrics.string() + " holds no step records yet");
  if (run.config_toml.empty()) {
    std::ifstream config(fs::path(dir) / "config.toml");
    std::stringstream text;
    text << config.rdbuf();
    run.config_toml = text.str();
  }
  if (run.world_size == 0) run.world_size = static_cast<int>(run.steps.back().peak_memory_per_rank.size());
  return run;
}

}  // namespace fsdp::report
