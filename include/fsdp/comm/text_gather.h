// fsdp/comm/text_gather.h: every rank's short text on every rank (checkpoint facts, device claims).
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

// Collective over `group`: rank r's `text` (a few kilobytes at most) at index r, on every rank.
// Two all-gathers on the group: the lengths, then the bytes padded to the longest, one int64 per
// byte (host tensors, which every backend takes).
std::vector<std::string> all_gather_text(const ProcessGroupPtr& group, const std::string& text);

}  // namespace fsdp::comm
