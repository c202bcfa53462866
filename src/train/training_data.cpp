#include "training_data.h"

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "fsdp/data/fashion_mnist.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/packed_instructions.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/token_shards.h"
#include "fsdp/train/reporting.h"

namespace fsdp::train {

namespace {

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Instruction JSONL, rendered in the chat format: one padded row per example (data/instructions.h).
// Token files that say which tokenizer made them (fsdp-data since 2026-12-05) are trained with that
// one: data.tokenizer (and its files) must name it, else the run is refused, saying which: the model
// would be sized to the files' vocabulary and no sample could be written, silently.
void check_tokenizer_of(const data::TokenShards& shards, const DataConfig& d, const data::Tokenizer* tokenizer) {
  const data::TokenizerStamp made_by = shards.tokenizer_stamp();
  if (!made_by.known()) return;  // files from before the stamp: as before, the config is trusted
  const data::TokenizerStamp configured = tokenizer ? tokenizer->stamp() : data::TokenizerStamp{};
  if (configured == made_by) return;
  const std::string wanted = data::tokenizer_kind_name(made_by.kind);
  std::string how = "set data.tokenizer = \"" + wanted + "\"";
  if (made_by.kind == data::TokenizerKind::Hf) how += " and data.tokenizer_json to that tokenizer.json";
  if (made_by.kind == data::TokenizerKind::Gpt2) how += " and data.vocab_json, data.merges_txt to those files";
  throw std::runtime_error(
      "token files '" + shards.spec() + "' were made with " + made_by.describe() + ", and this run's is " +
      (tokenizer ? configured.describe() : "data.tokenizer = \"" + std::string(enum_name(d.tokenizer)) + "\"") + ": " +
      how);
}

LoadedData load_instructions(const TrainConfig& c) {
  const auto& d = c.data;
  LoadedData loaded;
  loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
  loaded.chat_format = data::resolve_chat_format(d.chat_format, *loaded.tokenizer);
  std::vector<data::InstructionExample> train = data::read_instruction_jsonl(d.train_jsonl), validation;
  if (!d.validation_jsonl.empty()) {
    validation = data::read_instruction_jsonl(d.validation_jsonl);
  } else {
    // Held out by a hash of the example's text, as split_documents does for documents.
    std::vector<data::InstructionExample> kept;
    for (auto& example : train) {
      std::string text;
      for (const auto& message : example.messages) text += message.role + '\0' + message.content + '\0';
      (data::fnv1a64(text) % 100 < static_cast<uint64_t>(d.validation_percent) ? validation : kept)
          .push_back(std::move(example));
    }
    train = std::move(kept);
  }
  const int32_t end = data::end_of_turn(loaded.chat_format, *loaded.tokenizer);
  if (d.packing && end < 0) {
    throw std::runtime_error(c.source +
                             ": data.packing needs a token that ends each answer, so that a packed example's "
                             "end is learnt; chat format " +
                             std::string(enum_name(loaded.chat_format)) + " with the " + loaded.tokenizer->name() +
                             " tokenizer has none (no end-of-text token): use an hf or gpt2 tokenizer");
  }
  const int32_t pad = end >= 0 ? end : 0;  // padding is never attended to by a real token, nor trained
  auto render = [&](const std::vector<data::InstructionExample>& examples) {
    std::vector<data::RenderedExample> rendered;
    const data::ContentSpecialTokens content =
        d.split_special_tokens ? data::ContentSpecialTokens::Text : data::ContentSpecialTokens::Control;
    for (const auto& example : examples)
      rendered.push_back(data::render_chat(example, loaded.chat_format, *loaded.tokenizer, content));
    return rendered;
  };
  std::vector<data::RenderedExample> rendered_train = render(train);
  int64_t shortest = std::numeric_limits<int64_t>::max();  // of the training examples (the ones refused below)
  for (const auto& example : rendered_train)
    shortest = std::min<int64_t>(shortest, static_cast<int64_t>(example.tokens.size()));
  auto train_set = std::make_shared<data::InstructionDataset>(std::move(rendered_train), c.seq_len, pad);
  auto validation_set = std::make_shared<data::InstructionDataset>(render(validation), c.seq_len, pad);
  if (train_set->size() == 0 && shortest > c.seq_len + 1) {
    throw std::runtime_error(c.source + ": train.seq_len " + std::to_string(c.seq_len) +
                             " is shorter than every example (the "
                             "shortest renders to " +
                             std::to_string(shortest) +
                             " tokens, which need train.seq_len >= " + std::to_string(shortest - 1) + ")");
  }
  loaded.dropped_examples = train_set->dropped() + validation_set->dropped();
  loaded.vocab = loaded.tokenizer->vocab_size();
  loaded.description = "instructions " + d.train_jsonl + (d.validation_jsonl.empty() ? "" : ", " + d.validation_jsonl) +
                       " (" + loaded.tokenizer->name() + " tokenizer, " + enum_name(loaded.chat_format) +
                       " format): " + std::to_string(train_set->size()) + " training and " +
                       std::to_string(validation_set->size()) + " validation examples, " +
                       format_count(static_cast<double>(train_set->trained_tokens())) + " trained tokens";
  if (loaded.dropped_examples > 0) {
    loaded.description += "; " + std::to_string(loaded.dropped_examples) +
                          " dropped (longer than train.seq_len + 1 = " + std::to_string(c.seq_len + 1) +
                          " tokens, or nothing to train in the window)";
  }
  if (d.packing) {
    auto packed_train = std::make_unique<data::PackedInstructionDataset>(train_set, c.seed);
    auto packed_validation = std::make_unique<data::PackedInstructionDataset>(validation_set, c.seed);
    loaded.packing = "packed " + std::to_string(packed_train->examples()) + " examples into " +
                     std::to_string(packed_train->size()) + " rows of " + std::to_string(c.seq_len) +
                     " tokens: " + fixed(100 * packed_train->window_use(), 1) + "%" + " of each row used (" +
                     fixed(100 * packed_train->padded_window_use(), 1) + "%" + " one example to a row); a step of " +
                     std::to_string(c.global_batch) + " rows holds about " +
                     fixed(static_cast<double>(c.global_batch) * static_cast<double>(packed_train->examples()) /
                               static_cast<double>(packed_train->size()),
                           1) +
                     " examples, an epoch is " +
                     fixed(static_cast<double>(packed_train->size()) / static_cast<double>(c.global_batch), 1) +
                     " steps";
    loaded.train = std::move(packed_train);
    loaded.validation = std::move(packed_validation);
    return loaded;
  }
  loaded.train = std::make_unique<data::InstructionDataset>(std::move(*train_set));
  loaded.validation = std::make_unique<data::InstructionDataset>(std::move(*validation_set));
  return loaded;
}

}  // namespace

LoadedData load_data(const TrainConfig& c) {
  LoadedData loaded;
  const auto& d = c.data;
  if (d.source == DataSource::FashionMnist) {
    const std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
    loaded.train = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "train"));
    loaded.validation = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "test"));
    loaded.description = "Fashion-MNIST (" + dir + "): " + std::to_string(loaded.train->size()) + " training, " +
                         std::to_string(loaded.validation->size()) + " test images";
    return loaded;
  }
  if (d.source == DataSource::Instructions) return load_instructions(c);
  std::shared_ptr<const data::TokenSource> train_tokens, validation_tokens;
  if (d.source == DataSource::Fortunes) {
    const std::string dir = d.dir.empty() ? data::kFortunesDir : d.dir;
    loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
    auto split = data::split_documents(data::read_fortunes(dir), d.validation_percent);
    const int64_t vocab = loaded.tokenizer->vocab_size();
    train_tokens = std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.train, *loaded.tokenizer), vocab);
    validation_tokens =
        std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.validation, *loaded.tokenizer), vocab);
    loaded.description = "fortunes (" + dir + "), " + loaded.tokenizer->name() +
                         " tokenizer: " + std::to_string(split.train.size()) + " + " +
                         std::to_string(split.validation.size()) + " documents, ";
  } else {
    // A token file, a directory of shards or a glob (fsdp-data corpus): memory-mapped, never read whole.
    auto train_shards = std::make_shared<data::TokenShards>(d.train_tokens);
    auto validation_shards = std::make_shared<data::TokenShards>(d.validation_tokens);
    train_tokens = train_shards;
    validation_tokens = validation_shards;
    if (train_tokens->vocab_size() != validation_tokens->vocab_size()) {
      throw std::runtime_error("token files '" + d.train_tokens + "' and '" + d.validation_tokens +
                               "' have different vocabularies (" + std::to_string(train_tokens->vocab_size()) +
                               " and " + std::to_string(validation_tokens->vocab_size()) + ")");
    }
    if (d.tokenizer == data::TokenizerKind::Byte && train_tokens->vocab_size() == 256) {
      loaded.tokenizer = data::make_tokenizer(data::TokenizerKind::Byte);
    }
    if (d.tokenizer == data::TokenizerKind::Gpt2 || d.tokenizer == data::TokenizerKind::Hf) {
      loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
    }
    check_tokenizer_of(*train_shards, d, loaded.tokenizer.get());
    check_tokenizer_of(*validation_shards, d, loaded.tokenizer.get());
    auto shards_of = [](const data::TokenShards& shards) {
      return shards.shard_count() == 1 ? shards.spec()
                                       : shards.spec() + " (" + std::to_string(shards.shard_count()) + " shards)";
    };
    loaded.description = "token files " + shards_of(*train_shards) + ", " + shards_of(*validation_shards) + ": ";
    loaded.fingerprint = "train " + train_shards->fingerprint() + "; validation " + validation_shards->fingerprint();
  }
  loaded.vocab = train_tokens->vocab_size();
  loaded.description += format_count(static_cast<double>(train_tokens->size())) + " training and " +
                        format_count(static_cast<double>(validation_tokens->size())) + " validation tokens";
  int32_t document_end = -1;
  if (d.document_masking) {
    document_end = loaded.tokenizer ? loaded.tokenizer->end_of_text() : -1;
    if (document_end < 0) {
      throw std::runtime_error(
          c.source + ": data.document_masking splits windows at the end-of-text token, and the " +
          (loaded.tokenizer ? loaded.tokenizer->name() + " tokenizer's" : std::string("token files'")) +
          " vocabulary has none (data.tokenizer names the tokenizer the tokens were made with: gpt2 or hf)");
    }
    loaded.description += "; documents masked apart at token " + std::to_string(document_end);
  }
  loaded.train = std::make_unique<data::TokenWindows>(train_tokens, c.seq_len, document_end);
  loaded.validation = std::make_unique<data::TokenWindows>(validation_tokens, c.seq_len, document_end);
  return loaded;
}

void check_data_sizes(const LoadedData& data, const TrainConfig& config, int world_size) {
  if (data.train->size() < config.global_batch) {
    throw std::runtime_error("the training data holds " + std::to_string(data.train->size()) +
                             " samples (rows, when packed), fewer than one global batch of " +
                             std::to_string(config.global_batch));
  }
  if (data.validation->size() < world_size) {
    throw std::runtime_error("the validation data holds " + std::to_string(data.validation->size()) +
                             " samples (rows, when packed), fewer than the " + std::to_string(world_size) + " ranks");
  }
  // Image models: the images must be the model's (a mismatch would otherwise stop the first forward).
  const models::ImageInput image = models::family_of(config.model).image_input(config.model);
  const int64_t image_size = image.side, channels = image.channels;
  if (image_size > 0) {
    const at::Tensor first = data.train->get({0}).inputs;  // [1, channels, side, side]
    if (first.dim() != 4 || first.size(1) != channels || first.size(2) != image_size || first.size(3) != image_size) {
      throw std::runtime_error(std::string("data.source '") + enum_name(config.data.source) + "' gives images of " +
                               std::to_string(first.size(1)) + " x " + std::to_string(first.size(2)) + " x " +
                               std::to_string(first.size(3)) + " (channels x height x width); the " +
                               models::family_name(config.model) + " model '" + config.model_name + "' takes " +
                               std::to_string(channels) + " x " + std::to_string(image_size) + " x " +
                               std::to_string(image_size) + " (model.channels, model.image_size)");
    }
  }
}

std::string missing_data_path(const TrainConfig& config) {
  namespace fs = std::filesystem;
  const DataConfig& d = config.data;
  std::vector<std::string> paths;
  switch (d.source) {
    case DataSource::TokenFiles: paths = {d.train_tokens, d.validation_tokens}; break;
    case DataSource::Instructions: paths = {d.train_jsonl, d.validation_jsonl}; break;
    case DataSource::FashionMnist: paths = {!d.dir.empty() ? d.dir : data::kFashionMnistDir}; break;
    case DataSource::Fortunes: paths = {!d.dir.empty() ? d.dir : data::kFortunesDir}; break;
  }
  for (const std::string& file : {d.vocab_json, d.merges_txt, d.tokenizer_json}) paths.push_back(file);
  for (std::string path : paths) {
    if (path.empty()) continue;
    if (path.find_first_of("*?[") != std::string::npos) path = fs::path(path).parent_path().string();  // a glob
    std::error_code error;
    if (!path.empty() && !fs::exists(path, error)) return path;
  }
  return "";
}

void check_image_chats(const models::ModelConfig& model, const data::ImageChatWriter& chats) {
  const models::ModelFamily& family = models::family_of(model);
  const int64_t vocab = models::vocab_size(model), image_token = family.image_token(model);
  const int64_t end_of_text = chats.end_of_text();
  if (vocab <= std::max(end_of_text, image_token)) {
    throw std::runtime_error("model.vocab " + std::to_string(vocab) +
                             " cannot hold the byte chats (bytes 0-255, end-of-text " + std::to_string(end_of_text) +
                             " and image_token " + std::to_string(image_token) + ")");
  }
  const int64_t context = family.text_context(model);
  if (chats.row_length() > context) {
    throw std::runtime_error("the chats are " + std::to_string(chats.row_length()) + " tokens (" +
                             std::to_string(family.image_input(model).tokens) +
                             " image tokens, the question and the longest answer); model.context is " +
                             std::to_string(context));
  }
}

data::ImageChatWriter image_chat_writer(const models::ModelConfig& model) {
  const models::ModelFamily& family = models::family_of(model);
  const int64_t image_token = family.image_token(model);
  const int64_t end_of_text = image_token == 256 ? 257 : 256;
  return data::ImageChatWriter(data::fashion_mnist_class_names(), family.image_input(model).tokens, image_token,
                               end_of_text);
}

models::ModelConfig resolve_model(const TrainConfig& c, int64_t vocab) {
  if (c.model_vocab > 0 && c.model_vocab < vocab) {
    throw std::runtime_error(c.source + ": model.vocab " + std::to_string(c.model_vocab) +
                             " is smaller than the data's vocabulary of " + std::to_string(vocab) +
                             " (leave model.vocab out to take the data's)");
  }
  // The model's own vocabulary where it has one (a Hugging Face model's embedding may have rows its
  // tokenizer never produces); else the data's.
  const int64_t rows = c.model_vocab > 0 ? c.model_vocab : vocab;
  models::ModelConfig model = c.model;
  models::family_of(model).take_data_vocab(model, rows);
  return model;
}

}  // namespace fsdp::train
