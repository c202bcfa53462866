#include "training_data.h"

#include <stdexcept>

#include "fsdp/data/fashion_mnist.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/train/reporting.h"

namespace fsdp::train {

namespace {

// Instruction JSONL, rendered in the chat format: one padded row per example (data/instructions.h).
LoadedData load_instructions(const TrainConfig& c) {
  const auto& d = c.data;
  LoadedData loaded;
  loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
  loaded.chat_format = data::chat_format_from_name(d.chat_format, *loaded.tokenizer);
  std::vector<data::InstructionExample> train = data::read_instruction_jsonl(d.train_jsonl), validation;
  if (!d.validation_jsonl.empty()) {
    validation = data::read_instruction_jsonl(d.validation_jsonl);
  } else {
    // Held out by a hash of the example's text, as split_documents does for documents.
    std::vector<data::InstructionExample> kept;
    for (auto& example : train) {
      std::string text;
      for (const auto& message : example.messages) text += message.role + '\0' + message.content + '\0';
      (data::fnv1a64(text) % 100 < static_cast<uint64_t>(d.validation_percent) ? validation : kept).push_back(std::move(example));
    }
    train = std::move(kept);
  }
  const int32_t end = data::end_of_turn(loaded.chat_format, *loaded.tokenizer);
  const int32_t pad = end >= 0 ? end : 0;  // padding is never attended to by a real token, nor trained
  auto render = [&](const std::vector<data::InstructionExample>& examples) {
    std::vector<data::RenderedExample> rendered;
    for (const auto& example : examples) rendered.push_back(data::render_chat(example, loaded.chat_format, *loaded.tokenizer));
    return rendered;
  };
  auto train_set = std::make_unique<data::InstructionDataset>(render(train), c.seq_len, pad);
  auto validation_set = std::make_unique<data::InstructionDataset>(render(validation), c.seq_len, pad);
  loaded.dropped_examples = train_set->dropped() + validation_set->dropped();
  loaded.vocab = loaded.tokenizer->vocab_size();
  loaded.description = "instructions " + d.train_jsonl + (d.validation_jsonl.empty() ? "" : ", " + d.validation_jsonl) + " (" +
                       loaded.tokenizer->name() + " tokenizer, " + data::chat_format_name(loaded.chat_format) + " format): " +
                       std::to_string(train_set->size()) + " training and " + std::to_string(validation_set->size()) +
                       " validation examples, " + format_count(static_cast<double>(train_set->trained_tokens())) +
                       " trained tokens";
  if (loaded.dropped_examples > 0) {
    loaded.description += "; " + std::to_string(loaded.dropped_examples) + " dropped (longer than train.seq_len + 1 = " +
                          std::to_string(c.seq_len + 1) + " tokens, or nothing to train in the window)";
  }
  loaded.train = std::move(train_set);
  loaded.validation = std::move(validation_set);
  return loaded;
}

}  // namespace

LoadedData load_data(const TrainConfig& c) {
  LoadedData loaded;
  const auto& d = c.data;
  if (d.source == "fashion_mnist") {
    const std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
    loaded.train = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "train"));
    loaded.validation = std::make_unique<data::ImageDataset>(data::load_fashion_mnist(dir, "test"));
    loaded.description = "Fashion-MNIST (" + dir + "): " + std::to_string(loaded.train->size()) + " training, " +
                         std::to_string(loaded.validation->size()) + " test images";
    return loaded;
  }
  if (d.source == "instructions") return load_instructions(c);
  std::shared_ptr<const data::TokenSource> train_tokens, validation_tokens;
  if (d.source == "fortunes") {
    const std::string dir = d.dir.empty() ? data::kFortunesDir : d.dir;
    loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
    auto split = data::split_documents(data::read_fortunes(dir), d.validation_percent);
    const int64_t vocab = loaded.tokenizer->vocab_size();
    train_tokens = std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.train, *loaded.tokenizer), vocab);
    validation_tokens =
        std::make_shared<data::TokenBuffer>(data::tokenize_documents(split.validation, *loaded.tokenizer), vocab);
    loaded.description = "fortunes (" + dir + "), " + loaded.tokenizer->name() + " tokenizer: " +
                         std::to_string(split.train.size()) + " + " + std::to_string(split.validation.size()) +
                         " documents, ";
  } else {
    train_tokens = std::make_shared<data::TokenFile>(d.train_tokens);
    validation_tokens = std::make_shared<data::TokenFile>(d.validation_tokens);
    if (train_tokens->vocab_size() != validation_tokens->vocab_size()) {
      throw std::runtime_error("token files '" + d.train_tokens + "' and '" + d.validation_tokens +
                               "' have different vocabularies (" + std::to_string(train_tokens->vocab_size()) + " and " +
                               std::to_string(validation_tokens->vocab_size()) + ")");
    }
    if (d.tokenizer == "byte" && train_tokens->vocab_size() == 256) loaded.tokenizer = data::make_tokenizer("byte");
    if (d.tokenizer == "gpt2" || d.tokenizer == "hf") {
      loaded.tokenizer = data::make_tokenizer(d.tokenizer, d.vocab_json, d.merges_txt, d.tokenizer_json);
    }
    loaded.description = "token files " + d.train_tokens + ", " + d.validation_tokens + ": ";
  }
  loaded.vocab = train_tokens->vocab_size();
  loaded.description += format_count(static_cast<double>(train_tokens->size())) + " training and " +
                        format_count(static_cast<double>(validation_tokens->size())) + " validation tokens";
  loaded.train = std::make_unique<data::TokenWindows>(train_tokens, c.seq_len);
  loaded.validation = std::make_unique<data::TokenWindows>(validation_tokens, c.seq_len);
  return loaded;
}

void check_data_sizes(const LoadedData& data, const TrainConfig& config, int world_size) {
  if (data.train->size() < config.global_batch) {
    throw std::runtime_error("the training data holds " + std::to_string(data.train->size()) +
                             " samples, fewer than one global batch of " + std::to_string(config.global_batch));
  }
  if (data.validation->size() < world_size) {
    throw std::runtime_error("the validation data holds " + std::to_string(data.validation->size()) +
                             " samples, fewer than the " + std::to_string(world_size) + " ranks");
  }
}

models::ModelConfig resolve_model(const TrainConfig& c, int64_t vocab) {
  if (c.model_vocab > 0 && c.model_vocab < vocab) {
    throw std::runtime_error(c.source + ": model.vocab " + std::to_string(c.model_vocab) + " is smaller than the data's vocabulary of " +
                             std::to_string(vocab) + " (leave model.vocab out to take the data's)");
  }
  // The model's own vocabulary where it has one (a Hugging Face model's embedding may have rows its
  // tokenizer never produces); else the data's.
  const int64_t rows = c.model_vocab > 0 ? c.model_vocab : vocab;
  models::ModelConfig model = c.model;
  if (auto* g = std::get_if<models::GptConfig>(&model)) g->vocab = rows;
  if (auto* l = std::get_if<models::LlamaConfig>(&model)) l->vocab = rows;
  return model;
}

}  // namespace fsdp::train
