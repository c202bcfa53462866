#include "fsdp/comm/text_gather.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace fsdp::comm {

std::vector<std::string> all_gather_text(const ProcessGroupPtr& group, const std::string& text) {
  const int world = group->size();
  if (world == 1) return {text};
  at::Tensor length = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  at::Tensor lengths = at::empty({world}, at::kLong);
  group->all_gather(lengths, length)->wait();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  at::Tensor mine = at::zeros({longest}, at::kLong);
  int64_t* mine_bytes = mine.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) mine_bytes[i] = static_cast<int64_t>(static_cast<unsigned char>(text[i]));
  at::Tensor all = at::empty({world * longest}, at::kLong);
  group->all_gather(all, mine)->wait();
  std::vector<std::string> texts(static_cast<size_t>(world));
  const int64_t* bytes = all.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    const int64_t n = lengths[r].item<int64_t>();
    for (int64_t i = 0; i < n; ++i) texts[static_cast<size_t>(r)].push_back(static_cast<char>(bytes[r * longest + i]));
  }
  return texts;
}

}  // namespace fsdp::comm
