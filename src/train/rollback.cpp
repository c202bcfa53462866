#include "rollback.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "fsdp/checkpoint/hf_model_dir.h"

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
      throw std::runtime_error(std::string("FSDP_TEST_LOSS_FAULTS='") + text + "': expected step:factor[,step:factor...], e.g. 10:1e4,11:nan");
    }
  }
  return faults;
}

}  // namespace fsdp::train
