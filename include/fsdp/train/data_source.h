// fsdp/train/data_source.h: where a run's examples come from (data.source).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::train {
// Fortunes     Debian's fortunes corpus, tokenized at start (data.tokenizer), split into train and
//              validation documents
// TokenFiles   token files fsdp-data wrote (data.train_tokens, data.validation_tokens)
// Instructions JSONL conversations in a chat format, the loss on the answers (data.train_jsonl)
// FashionMnist Debian's Fashion-MNIST images: the image models' source (classifiers, contrastive and image-text)
enum class DataSource { Fortunes, TokenFiles, Instructions, FashionMnist };
}  // namespace fsdp::train

namespace fsdp {
template <>
struct EnumNames<train::DataSource> {
  static constexpr std::pair<train::DataSource, const char*> values[] = {
      {train::DataSource::Fortunes, "fortunes"},
      {train::DataSource::TokenFiles, "token_files"},
      {train::DataSource::Instructions, "instructions"},
      {train::DataSource::FashionMnist, "fashion_mnist"},
  };
};
}  // namespace fsdp
