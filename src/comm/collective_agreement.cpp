#include "fsdp/comm/collective_agreement.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fsdp/comm/agreement.h"
#include "fsdp/comm/collective_log.h"

namespace fsdp::comm {

// A description travels in a fixed slot of int64 words (longer ones are cut: the unit's label and
// the operation come first).
constexpr int64_t kSlotWords = 32;

class PendingAgreement {
 public:
  ProcessGroup* host = nullptr;
  std::string channel, description, place;
  at::Tensor gathered;  // int64 [size * kSlotWords], rank r's slot at r * kSlotWords
  WorkPtr exchange;
  std::once_flag checked;
};

namespace {

std::mutex& mode_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::optional<CollectiveAgreementMode>& override_mode() {
  static std::optional<CollectiveAgreementMode> mode;
  return mode;
}

std::optional<CollectiveAgreementMode> mode_from_env() {
  const char* text = std::getenv("FSDP_AGREE_COLLECTIVES");
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string value = text;
  if (value == "off") return CollectiveAgreementMode::kOff;
  if (value == "first_step") return CollectiveAgreementMode::kFirstStep;
  if (value == "every_step") return CollectiveAgreementMode::kEveryStep;
  throw std::runtime_error("FSDP_AGREE_COLLECTIVES='" + value + "' (expected off, first_step or every_step)");
}

std::string slot_text(const at::Tensor& gathered, int rank) {
  const char* bytes = reinterpret_cast<const char*>(gathered.data_ptr<int64_t>() + rank * kSlotWords);
  return std::string(bytes, strnlen(bytes, kSlotWords * sizeof(int64_t)));
}

}  // namespace

const char* to_string(CollectiveAgreementMode mode) {
  switch (mode) {
    case CollectiveAgreementMode::kOff: return "off";
    case CollectiveAgreementMode::kFirstStep: return "first_step";
    case CollectiveAgreementMode::kEveryStep: return "every_step";
  }
  return "?";
}

CollectiveAgreementMode collective_agreement_mode(CollectiveAgreementMode backend_default) {
  {
    std::lock_guard<std::mutex> lock(mode_mutex());
    if (override_mode()) return *override_mode();
  }
  static const std::optional<CollectiveAgreementMode> from_env = mode_from_env();
  return from_env.value_or(backend_default);
}

void set_collective_agreement(std::optional<CollectiveAgreementMode> mode) {
  std::lock_guard<std::mutex> lock(mode_mutex());
  override_mode() = mode;
}

bool collective_agreement_due(CollectiveAgreementMode mode) {
  switch (mode) {
    case CollectiveAgreementMode::kOff: return false;
    case CollectiveAgreementMode::kEveryStep: return true;
    case CollectiveAgreementMode::kFirstStep: return in_first_collective_step();
  }
  return false;
}

std::shared_ptr<PendingAgreement> post_collective_agreement(ProcessGroup& host, const std::string& channel,
                                                            const std::string& description, const std::string& place) {
  auto pending = std::make_shared<PendingAgreement>();
  pending->host = &host;
  pending->channel = channel;
  pending->description = description;
  pending->place = place;
  at::Tensor mine = at::zeros({kSlotWords}, at::kLong);
  std::memcpy(mine.data_ptr<int64_t>(), description.data(),
              std::min(description.size(), static_cast<size_t>(kSlotWords * sizeof(int64_t)) - 1));
  pending->gathered = at::empty({host.size() * kSlotWords}, at::kLong);
  CarriedCollectives carried("the agreement on " + place);  // the exchange is neither recorded nor agreed on
  pending->exchange = host.all_gather(pending->gathered, mine);
  return pending;
}

void check_collective_agreement(PendingAgreement& pending) {
  std::call_once(pending.checked, [&] {
    pending.exchange->wait();
    const int size = pending.host->size(), rank = pending.host->rank();
    std::vector<std::string> texts;
    for (int r = 0; r < size; ++r) texts.push_back(slot_text(pending.gathered, r));
    bool agree = true;
    for (const auto& text : texts) agree = agree && text == texts.front();
    if (agree) return;
    // Each distinct description with the ranks that issued it, in rank order.
    std::vector<std::pair<std::string, std::vector<int>>> sides;
    for (int r = 0; r < size; ++r) {
      auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& s) { return s.first == texts[r]; });
      if (side == sides.end()) {
        sides.push_back({texts[r], {r}});
      } else {
        side->second.push_back(r);
      }
    }
    std::string message = "ranks issued different collectives on group " + pending.channel +
                          " (agreed before use, FSDP_AGREE_COLLECTIVES): at " + pending.place + ", it was";
    for (size_t s = 0; s < sides.size(); ++s) {
      std::string ranks;
      for (int r : sides[s].second) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      message += std::string(s ? ";" : "") + " on rank" + (sides[s].second.size() > 1 ? "s " : " ") + ranks + ": " +
                 sides[s].first;
    }
    message += " (a code path that differs between ranks; ranks are the group's)";
    if (pending.host->channel() == "world") throw AgreedStop(message, rank == 0);
    // A subgroup's ranks alone know: the rest of the job may wait elsewhere, so it is ended. The
    // group's first rank reports; the others give its message a moment to get out.
    if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    pending.host->abort(message);
  });
}

}  // namespace fsdp::comm
