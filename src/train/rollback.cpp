#include "rollback.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/comm/agreement.h"

namespace fsdp::train {

std::set<int64_t> read_skipped_batches(const std::string& path) {
  std::set<int64_t> steps;
  std::ifstream in(path);
  if (!in) return steps;
  try {
    const nlohmann::json document = nlohmann::json::parse(in);
    for (const auto& step : document.at("skipped_batch_steps")) steps.insert(step.get<int64_t>() - 1);
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path + "' is not a skipped-batches file written by a rollback (" + e.what() +
                             "); remove it to train every batch");
  }
  return steps;
}

void save_skipped_batches(const std::string& path, const std::set<int64_t>& steps) {
  nlohmann::json printed = nlohmann::json::array();
  for (int64_t step : steps) printed.push_back(step + 1);
  checkpoint::write_text_file(path, nlohmann::json{{"skipped_batch_steps", printed}}.dump() + "\n");
}

std::map<int64_t, double> loss_faults_from_env() {
  std::map<int64_t, double> faults;
  const char* text = std::getenv("FSDP_TEST_LOSS_FAULTS");
  if (text == nullptr) return faults;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no ':'");
      const std::string factor = item.substr(colon + 1);
      faults[std::stoll(item.substr(0, colon))] = factor == "nan" ? std::nan("") : std::stod(factor);
    } catch (const std::exception&) {
      throw std::runtime_error(std::string("FSDP_TEST_LOSS_FAULTS='") + text +
                               "': expected step:factor[,step:factor...], e.g. 10:1e4,11:nan");
    }
  }
  return faults;
}

RolledBack roll_back_to_checkpoint(const RollbackTarget& target, int64_t first_skipped, int64_t last_skipped,
                                   int64_t rollback) {
  const TrainConfig& config = target.config;
  const std::string dir = checkpoints_dir(config);
  const std::string steps = "steps " + std::to_string(first_skipped + 1) + "-" + std::to_string(last_skipped + 1);
  RolledBack back;
  comm::on_every_rank(target.world, "finding a checkpoint to roll back to", [&] {
    if (rollback > config.guard.max_rollbacks) {
      throw std::runtime_error("guard: " + steps + " were skipped in a row again after " +
                               std::to_string(config.guard.max_rollbacks) +
                               " rollbacks (guard.max_rollbacks); the run does not recover by rolling back "
                               "(a lower optimizer.lr or another data mix may help)");
    }
    back.path = checkpoint::find_latest_checkpoint(dir, first_skipped, target.run_id);
    if (back.path.empty()) {
      throw std::runtime_error("guard: " + steps + " were skipped in a row (guard.rollback_after = " +
                               std::to_string(config.guard.rollback_after) + "), and no checkpoint at or before step " +
                               std::to_string(first_skipped) + " is under '" + dir + "' to roll back to");
    }
  });
  back.info = checkpoint::load_checkpoint(back.path, target.state, target.optimizer);
  comm::on_every_rank(target.world, "restoring the loss-spike window and loss scale",
                      [&] { target.guard.restore(back.info.trainer_state); });
  for (int64_t s = first_skipped; s <= last_skipped; ++s) target.skipped_batches.insert(s);
  comm::on_every_rank(target.world, "recording the rollback", [&] {
    if (!target.writes_files) return;
    checkpoint::remove_checkpoints_after(dir, back.info.step, target.run_id);
    save_skipped_batches(target.skipped_batches_path, target.skipped_batches);
  });
  return back;
}

}  // namespace fsdp::train
