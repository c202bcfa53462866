// HfTokenizer (fsdp/data/tokenizer.h): a tokenizer.json read into its pipeline and run as Hugging
// Face's `tokenizers` runs it (tokenizers/src/tokenizer/mod.rs, added_vocabulary.rs):
//   1. added tokens with normalized: false are cut out of the text first (leftmost, longest);
//   2. each stretch between them is normalized, then cut again at added tokens with normalized:
//      true (matched as normalized);
//   3. each remaining stretch is pre-tokenized into words and the words encoded by the model.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "byte_level_bpe.h"
#include "character_bpe.h"
#include "fsdp/data/tokenizer.h"
#include "hf_tokenizer_pipeline.h"
#include "tokenizer_files.h"
#include "utf8_repair.h"

namespace fsdp::data {

// Added tokens found in text: the leftmost occurrence of any, the longest at that position.
class AddedTokenMatcher {
 public:
  void add(const std::string& content, int32_t id) {
    if (content.empty()) return;
    by_content_[content] = id;
    starts_[static_cast<unsigned char>(content[0])] = true;
  }
  bool empty() const { return by_content_.empty(); }
  // Calls on_text(begin, end) for each stretch between tokens and on_token(id) for each token; a
  // token is matched only where allowed(begin, end) says so.
  template <typename OnText, typename OnToken, typename Allowed>
  void cut(const std::string& text, OnText&& on_text, OnToken&& on_token, Allowed&& allowed) const {
    size_t plain_start = 0, i = 0;
    while (i < text.size()) {
      int32_t found = -1;
      size_t found_length = 0;
      if (starts_[static_cast<unsigned char>(text[i])]) {
        // Candidates share the first byte: the map's range of keys that start with it.
        for (auto it = by_content_.lower_bound(std::string(1, text[i]));
             it != by_content_.end() && it->first[0] == text[i]; ++it) {
          if (it->first.size() > found_length && text.compare(i, it->first.size(), it->first) == 0 &&
              allowed(i, i + it->first.size())) {
            found = it->second;
            found_length = it->first.size();
          }
        }
      }
      if (found < 0) {
        ++i;
        continue;
      }
      if (i > plain_start) on_text(plain_start, i);
      on_token(found);
      i += found_length;
      plain_start = i;
    }
    if (plain_start < text.size()) on_text(plain_start, text.size());
  }

 private:
  std::map<std::string, int32_t> by_content_;
  bool starts_[256] = {};  // bytes a token begins with
};

namespace {

// An id is a JSON integer in [0, limit): anything else (5.5, 1e122, "7", 2^64 - 1) is refused before
// a conversion, which would truncate it or, out of range, be undefined behaviour.
int32_t id_below(const nlohmann::json& id, int64_t limit, const std::string& source, const std::string& what,
                 const std::string& expected) {
  const bool fits = id.is_number_unsigned()  ? id.get<uint64_t>() < static_cast<uint64_t>(limit)
                    : id.is_number_integer() ? id.get<int64_t>() >= 0 && id.get<int64_t>() < limit
                                             : false;
  if (!fits) {
    throw std::runtime_error("hf tokenizer: " + source + ": " + what + " has id " + id.dump() +
                             ", expected an id in [0, " + std::to_string(limit) + ")" + expected);
  }
  return static_cast<int32_t>(id.get<int64_t>());
}

bool null_or_empty(const nlohmann::json& object, const char* key) {
  if (!object.contains(key) || object[key].is_null()) return true;
  return object[key].is_string() && object[key].get<std::string>().empty();
}

}  // namespace

struct HfTokenizer::Pipeline {
  HfNormalizer normalizer;
  HfPreTokenizer pre_tokenizer;
  HfDecoder decoder;                         // when not byte-level
  std::unique_ptr<BpeModel> model;           // ByteLevelBpe or CharacterBpe
  const ByteLevelBpe* byte_level = nullptr;  // the model, when byte-level (its decoder is its own)
  AddedTokenMatcher raw_added;               // normalized: false, matched in the text as given
  AddedTokenMatcher normalized_added;        // normalized: true, matched in normalized text
  std::map<std::string, int32_t> added;      // content -> id
  std::unordered_map<int32_t, std::string> added_by_id;
};

namespace {

std::unique_ptr<BpeModel> read_model(const nlohmann::json& model, bool byte_level, const std::string& source,
                                     const Refuse& refuse) {
  if (model.value("type", std::string("BPE")) != "BPE") refuse("model " + model.value("type", std::string("?")));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!null_or_empty(model, key)) refuse(std::string("BPE ") + key);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0) {
    refuse("BPE dropout");
  }
  std::unordered_map<std::string, int32_t> vocab;
  const int64_t entries = static_cast<int64_t>(model.at("vocab").size());
  for (const auto& [token, id] : model.at("vocab").items())
    vocab[token] = id_below(id, entries, source, "token '" + token + "'", "");
  std::vector<std::string> merges;
  merges.reserve(model.at("merges").size());
  for (const auto& merge : model.at("merges")) {
    // "left right" (older files) or ["left", "right"] (newer ones).
    merges.push_back(merge.is_string() ? merge.get<std::string>()
                                       : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
  }
  const bool ignore_merges = model.value("ignore_merges", false);
  if (byte_level) {
    if (model.value("byte_fallback", false)) refuse("BPE byte_fallback with a ByteLevel pre-tokenizer");
    return std::make_unique<ByteLevelBpe>(std::move(vocab), merges, ignore_merges, "hf tokenizer: " + source);
  }
  CharacterBpeOptions options;
  options.byte_fallback = model.value("byte_fallback", false);
  options.fuse_unk = model.value("fuse_unk", false);
  options.ignore_merges = ignore_merges;
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    options.unk_token = model["unk_token"].get<std::string>();
  return std::make_unique<CharacterBpe>(std::move(vocab), merges, options, "hf tokenizer: " + source);
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path)
    : source_("tokenizer.json '" + path + "'"),
      pipeline_(std::make_unique<Pipeline>()),
      checksum_(files_checksum({path})) {
  const nlohmann::json root = read_json(path, "hf tokenizer");
  const Refuse refuse = [&](const std::string& what) {
    throw std::runtime_error("hf tokenizer: " + source_ + ": " + what +
                             " is not supported (BPE tokenizers: byte-level as Llama 3's, GPT-2's and Qwen's;"
                             " SentencePiece-style as Llama 2's, Mistral's and Gemma's)");
  };
  Pipeline& p = *pipeline_;
  try {
    if (!root.is_object() || !root.contains("model")) throw std::runtime_error("no \"model\"");
    const std::string where = "hf tokenizer: " + source_;
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
      p.normalizer = HfNormalizer(root["normalizer"], where, refuse);
    }
    if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
      p.pre_tokenizer = HfPreTokenizer(root["pre_tokenizer"], where, refuse);
    }
    const nlohmann::json decoder = root.value("decoder", nlohmann::json());
    const bool byte_level_decoder = decoder.is_object() && decoder.value("type", std::string()) == "ByteLevel";
    if (byte_level_decoder != p.pre_tokenizer.byte_level()) {
      refuse(byte_level_decoder ? "a ByteLevel decoder without a ByteLevel pre-tokenizer"
                                : "a ByteLevel pre-tokenizer without a ByteLevel decoder");
    }
    if (!byte_level_decoder && !decoder.is_null()) p.decoder = HfDecoder(decoder, where, refuse);
    p.model = read_model(root.at("model"), byte_level_decoder, source_, refuse);
    if (byte_level_decoder) p.byte_level = static_cast<const ByteLevelBpe*>(p.model.get());
    vocab_size_ = p.model->id_limit();

    const nlohmann::json added = root.value("added_tokens", nlohmann::json::array());
    for (const auto& token : added) {
      const std::string content = token.at("content").get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
        if (token.value(flag, false)) refuse("added token " + content + " with " + flag);
      }
      // Added tokens extend the vocabulary (Llama 3's 256 after 128000) or name some of its tokens
      // (GPT-2's <|endoftext|>): at most one new id per added token.
      const int64_t limit = p.model->id_limit() + static_cast<int64_t>(added.size());
      const int32_t id = id_below(token.at("id"), limit, source_, "added token '" + content + "'",
                                  " (the vocabulary plus the added tokens)");
      p.added[content] = id;
      p.added_by_id[id] = content;
      const bool normalized = token.value("normalized", !token.value("special", false));
      if (normalized && !p.normalizer.empty()) {
        p.normalized_added.add(p.normalizer.normalize(content), id);
      } else {
        p.raw_added.add(content, id);
      }
      vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("hf tokenizer: " + source_ + ": unexpected layout: " + e.what());
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"}) {
    if (auto it = p.added.find(name); it != p.added.end()) {
      end_of_text_ = it->second;
      break;
    }
  }
}

HfTokenizer::~HfTokenizer() = default;

int32_t HfTokenizer::token_id(const std::string& token) const {
  if (auto it = pipeline_->added.find(token); it != pipeline_->added.end()) return it->second;
  return pipeline_->model->id_of(token);
}

std::vector<std::string> HfTokenizer::pre_tokenize(const std::string& text) const {
  return pipeline_->pre_tokenizer.split(pipeline_->normalizer.normalize(text), /*at_text_start=*/true);
}

void HfTokenizer::encode_stretch(const std::string& stretch, bool at_text_start, std::vector<int32_t>& ids) const {
  const Pipeline& p = *pipeline_;
  const std::string normalized = p.normalizer.normalize(stretch);
  p.normalized_added.cut(
      normalized,
      [&](size_t begin, size_t end) {
        p.model->encode_words(p.pre_tokenizer.split(normalized.substr(begin, end - begin), at_text_start && begin == 0),
                              ids);
      },
      [&](int32_t id) { ids.push_back(id); }, [](size_t, size_t) { return true; });
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const { return encode_with_literal(text, {}); }

std::vector<int32_t> HfTokenizer::encode_with_literal(const std::string& text, const ByteRanges& literal) const {
  std::vector<int32_t> ids;
  pipeline_->raw_added.cut(
      text, [&](size_t begin, size_t end) { encode_stretch(text.substr(begin, end - begin), begin == 0, ids); },
      [&](int32_t id) { ids.push_back(id); },
      [&](size_t begin, size_t end) {
        for (const auto& [first, last] : literal) {
          if (begin < last && first < end) return false;
        }
        return true;
      });
  return ids;
}

std::vector<int32_t> HfTokenizer::encode_plain(const std::string& text) const {
  std::vector<int32_t> ids;
  if (!text.empty()) {
    pipeline_->model->encode_words(
        pipeline_->pre_tokenizer.split(pipeline_->normalizer.normalize(text), /*at_text_start=*/true), ids);
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Pipeline& p = *pipeline_;
  auto no_token = [&](int32_t id) {
    return std::out_of_range("hf tokenizer: " + source_ + ": id " + std::to_string(id) + " is no token of it");
  };
  if (p.byte_level) {
    std::string text;
    for (int32_t id : ids) {
      if (auto it = p.added_by_id.find(id); it != p.added_by_id.end()) {
        text += it->second;
      } else if (!p.byte_level->token_bytes(id, text)) {
        throw no_token(id);
      }
    }
    return replace_invalid_utf8(text);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = p.added_by_id.find(id); it != p.added_by_id.end()) {
      tokens.push_back(it->second);
    } else if (id >= 0 && id < p.model->id_limit() && !p.model->token(id).empty()) {
      tokens.push_back(p.model->token(id));
    } else {
      throw no_token(id);
    }
  }
  return replace_invalid_utf8(p.decoder.decode(std::move(tokens)));
}

}  // namespace fsdp::data
