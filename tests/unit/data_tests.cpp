// Data pipeline: token files, tokenizers, corpus split, IDX images, the global batch sampler,
// instruction data.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "fsdp/data/captions.h"
#include "fsdp/data/datasets.h"
#include "fsdp/data/fashion_mnist.h"
#include "fsdp/data/image_chat.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/packed_instructions.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/text_corpus.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/registry.h"
#include "temp_dir.h"

namespace data_tests {

namespace fs = std::filesystem;
using namespace fsdp::data;

using fsdp_tests::TempDir;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string expect_throw_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(TokenFile, RoundTripsSmallAndLargeVocabularies) {
  TempDir dir;
  for (int64_t vocab : {256, 70000}) {  // uint16 and uint32 tokens
    std::vector<int32_t> tokens;
    for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<int32_t>((i * 7919) % vocab));
    const std::string path = dir.file("t" + std::to_string(vocab) + ".tok");
    write_token_file(path, tokens, vocab);
    TokenFile file(path);
    EXPECT_EQ(file.size(), 1000);
    EXPECT_EQ(file.vocab_size(), vocab);
    EXPECT_EQ(file.bytes_per_token(), vocab <= 65536 ? 2 : 4);
    EXPECT_EQ(fs::file_size(path), 32u + 1000u * file.bytes_per_token());
    auto read = file.read(10, 20);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(read[i].item<int64_t>(), tokens[10 + i]);
    EXPECT_THROW(file.read(990, 20), std::out_of_range);
  }
}

TEST(TokenFile, RejectsBadFilesWithTheirName) {
  TempDir dir;
  write_text(dir.file("junk.tok"), std::string(64, 'x'));
  EXPECT_NE(expect_throw_message([&] { TokenFile f(dir.file("junk.tok")); }).find("bad magic"), std::string::npos);
  write_token_file(dir.file("good.tok"), {1, 2, 3, 4}, 256);
  fs::resize_file(dir.file("good.tok"), 32 + 5);  // truncated mid-token
  auto message = expect_throw_message([&] { TokenFile f(dir.file("good.tok")); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("good.tok"), std::string::npos) << message;
  EXPECT_NE(expect_throw_message([&] { TokenFile f(dir.file("missing.tok")); }).find("cannot open"), std::string::npos);
  EXPECT_THROW(write_token_file(dir.file("bad.tok"), {1, 300}, 256), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir.file("bad.tok")));
}

// A crafted header whose token count times the token size wraps around 64 bits to the file's
// size (issue 21's review: a 40-byte file then passed the size check, and reads ran past the
// mapping): refused naming the count.
TEST(TokenFile, RefusesACountThatWrapsAround) {
  TempDir dir;
  write_token_file(dir.file("small.tok"), {1, 2}, 70000);  // 4-byte tokens: 32 + 8 bytes
  std::string bytes = read_text(dir.file("small.tok"));
  ASSERT_EQ(bytes.size(), 40u);
  const uint64_t count = (uint64_t{1} << 62) + 2;  // x 4 bytes = 2^64 + 8 = 8 (mod 2^64)
  std::memcpy(&bytes[24], &count, 8);
  write_text(dir.file("crafted.tok"), bytes);
  auto message = expect_throw_message([&] { TokenFile f(dir.file("crafted.tok")); });
  EXPECT_NE(message.find("4611686018427387906 tokens"), std::string::npos) << message;
}

TEST(Tokenizer, ByteRoundTrip) {
  ByteTokenizer bytes;
  const std::string text = "fortune\n%\n\xc3\xa9t\xc3\xa9";
  EXPECT_EQ(bytes.decode(bytes.encode(text)), text);
  EXPECT_EQ(bytes.encode("A")[0], 65);
}

TEST(Tokenizer, Gpt2PreTokenisationFollowsThePattern) {
  auto words = Gpt2BpeTokenizer::split_words("Hello world's  end 123!!\n\nok");
  const std::vector<std::string> expected = {"Hello", " world", "'s", " ", " end", " 123", "!!", "\n", "\n", "ok"};
  EXPECT_EQ(words, expected);
}

// Unicode classes (PCRE2): a no-break space is a space, é a letter, Arabic-Indic digits numbers,
// the ideographic full stop punctuation. Expected pieces from Python's `regex` module on the
// same pattern. The old hand-written split counted every non-ASCII character as a letter.
TEST(Tokenizer, Gpt2PreTokenisationUsesUnicodeClasses) {
  auto words = Gpt2BpeTokenizer::split_words("He said \u00a0yes caf\u00e9 \u0661\u0662 \u3002!");
  const std::vector<std::string> expected = {"He",         " said",         " ",       "\u00a0", "yes",
                                             " caf\u00e9", " \u0661\u0662", " \u3002!"};
  EXPECT_EQ(words, expected);
  EXPECT_THROW(Gpt2BpeTokenizer::split_words("bad \xff byte"), std::invalid_argument);
}

// A tiny byte-level BPE written by the test: 256 byte symbols, three merges and <|endoftext|>.
// GPT-2 writes a space as "Ġ" (U+0120) in its vocabulary.
struct TinyBpe {
  TempDir dir;
  TinyBpe() {
    // Byte symbols in GPT-2's order: printable Latin-1 as themselves, the rest as U+0100 onwards.
    std::vector<std::string> symbols(256);
    int extra = 0;
    auto utf8 = [](int cp) {
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    };
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      symbols[b] = utf8(printable ? b : 256 + extra++);
    }
    auto escape = [](const std::string& s) {
      std::string out;
      for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      return out;
    };
    std::string json = "{";
    for (int b = 0; b < 256; ++b) json += "\"" + escape(symbols[b]) + "\": " + std::to_string(b) + ", ";
    json += "\"th\": 256, \"\xc4\xa0th\": 257, \"\xc4\xa0the\": 258, \"<|endoftext|>\": 259}";
    write_text(dir.file("vocab.json"), json);
    write_text(dir.file("merges.txt"), "#version: 0.2\nt h\n\xc4\xa0 th\n\xc4\xa0th e\n");
  }
};

TEST(Tokenizer, Gpt2BpeAppliesMergesByPriority) {
  TinyBpe bpe;
  Gpt2BpeTokenizer tokenizer(bpe.dir.file("vocab.json"), bpe.dir.file("merges.txt"));
  EXPECT_EQ(tokenizer.vocab_size(), 260);
  EXPECT_EQ(tokenizer.end_of_text(), 259);
  // "the the": "the" -> t h e -> th e (no merge "th e") ; " the" -> Ġ t h e -> Ġ th e -> Ġth e -> Ġthe
  EXPECT_EQ(tokenizer.encode("the the"), (std::vector<int32_t>{256, 'e', 258}));
  const std::string text = "Then, the\tend: \xc3\xa9l\xc3\xa8ve 42!\n";
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
  EXPECT_EQ(tokenizer.decode({258, 259}), " the<|endoftext|>");
}

TEST(Tokenizer, Gpt2BpeRejectsBadFiles) {
  TinyBpe bpe;
  write_text(bpe.dir.file("bad.json"), "{\"a\": 0,");
  EXPECT_NE(expect_throw_message([&] {
              Gpt2BpeTokenizer t(bpe.dir.file("bad.json"), bpe.dir.file("merges.txt"));
            }).find("not valid JSON"),
            std::string::npos);
  write_text(bpe.dir.file("bad_merges.txt"), "t h\nonlyone\n");
  auto message =
      expect_throw_message([&] { Gpt2BpeTokenizer t(bpe.dir.file("vocab.json"), bpe.dir.file("bad_merges.txt")); });
  EXPECT_NE(message.find("bad_merges.txt:2"), std::string::npos) << message;
  EXPECT_THROW(make_tokenizer("sentencepiece"), std::invalid_argument);
}

// The same tiny BPE as a tokenizer.json: Llama 3's layout (a Split then ByteLevel without its
// own regex), one special token, merges in the newer [left, right] form.
std::string tiny_tokenizer_json(const std::string& vocab_json, const std::string& extra = "") {
  return R"({"version": "1.0", "added_tokens": [{"id": 260, "content": "<|eot|>", "single_word": false,
    "lstrip": false, "rstrip": false, "normalized": false, "special": true}],)" +
         extra + R"(
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
    "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
      "vocab": )" +
         vocab_json + R"(, "merges": [["t", "h"], ["Ġ", "th"], ["Ġth", "e"]]}})";
}

TEST(Tokenizer, HfTokenizerJsonWithSpecialTokens) {
  TinyBpe bpe;
  write_text(bpe.dir.file("tokenizer.json"), tiny_tokenizer_json(read_text(bpe.dir.file("vocab.json"))));
  HfTokenizer tokenizer(bpe.dir.file("tokenizer.json"));
  EXPECT_EQ(tokenizer.vocab_size(), 261);
  EXPECT_EQ(tokenizer.token_id("<|eot|>"), 260);
  // The special token is matched before the split; " the" is one vocabulary token (ignore_merges).
  EXPECT_EQ(tokenizer.encode("the<|eot|> the"), (std::vector<int32_t>{256, 'e', 260, 258}));
  // Llama 3's pattern (digits in threes; a space before digits is a piece of its own), as Python's
  // `regex` module and Hugging Face's pre_tokenize_str cut it.
  const std::vector<std::string> pieces = {"The", " ", "123", "4", " caf\u00e9", "!\n"};
  EXPECT_EQ(tokenizer.pre_tokenize("The 1234 caf\u00e9!\n"), pieces);
  const std::string text = "Then, <|eot|>the\tend: \xc3\xa9l\xc3\xa8ve 42!\n";
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
  EXPECT_THROW(tokenizer.encode("bad \xff byte"), std::invalid_argument);
}

// A sampled sequence may cut a character's bytes: decoding gives valid UTF-8, each maximal invalid
// stretch one U+FFFD, as Hugging Face's ByteLevel decoder (Rust's from_utf8_lossy) and Python's
// bytes.decode("utf-8", "replace") give. Expected strings are Python's (and tokenizers' decode of
// the same Llama 3 ids: [64, 158, 224, 65] -> 'a\ufffdb', [172, 224, 224] -> three U+FFFD).
TEST(Tokenizer, DecodingCutCharactersGivesReplacementCharacters) {
  TinyBpe bpe;  // ids 0..255 are the bytes themselves, in all three tokenizers
  write_text(bpe.dir.file("tokenizer.json"), tiny_tokenizer_json(read_text(bpe.dir.file("vocab.json"))));
  const Gpt2BpeTokenizer gpt2(bpe.dir.file("vocab.json"), bpe.dir.file("merges.txt"));
  const HfTokenizer hf(bpe.dir.file("tokenizer.json"));
  const std::string replacement = "\xef\xbf\xbd";
  const ByteTokenizer bytes;
  for (const Tokenizer* tokenizer : {static_cast<const Tokenizer*>(&gpt2), static_cast<const Tokenizer*>(&hf),
                                     static_cast<const Tokenizer*>(&bytes)}) {
    SCOPED_TRACE(tokenizer->name());
    EXPECT_EQ(tokenizer->decode({'a', 0xE2, 0x82, 'b'}), "a" + replacement + "b");
    EXPECT_EQ(tokenizer->decode({0xF0, 0x80, 0x80}), replacement + replacement + replacement);
    EXPECT_EQ(tokenizer->decode({0xED, 0xA0, 0x80}), replacement + replacement + replacement);  // a surrogate
    EXPECT_EQ(tokenizer->decode({0xC3}), replacement);
    EXPECT_EQ(tokenizer->decode({0xFF, 'x'}), replacement + "x");
    EXPECT_EQ(tokenizer->decode({0xC3, 0xA9, 0xE2, 0x82, 0xAC}), "\xc3\xa9\xe2\x82\xac");  // whole: unchanged
  }
}

TEST(Tokenizer, HfTokenizerRefusesWhatItDoesNotSupportByName) {
  TinyBpe bpe;
  const std::string vocab = read_text(bpe.dir.file("vocab.json"));
  std::string lowercase = tiny_tokenizer_json(vocab);
  lowercase.replace(lowercase.find("\"normalizer\": null"), std::string("\"normalizer\": null").size(),
                    R"("normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})");
  write_text(bpe.dir.file("lowercase.json"), lowercase);
  auto message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("lowercase.json")); });
  EXPECT_NE(message.find("normalizer Lowercase is not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("lowercase.json"), std::string::npos) << message;
  write_text(bpe.dir.file("broken.json"), "{\"model\": {}}");
  message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("broken.json")); });
  EXPECT_NE(message.find("broken.json"), std::string::npos) << message;
  EXPECT_THROW(make_tokenizer("hf"), std::invalid_argument);  // no tokenizer.json given
}

// A SentencePiece-style tokenizer.json (Llama 2, Mistral, Gemma): characters, a "\u2581" for each
// space and one before the text (Metaspace, prefix "first"), byte fallback, the decoders that undo
// them. Expected ids and strings are Hugging Face tokenizers' own (0.23.3) for this file, made with
// Tokenizer(BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>")) and the steps below.
std::string tiny_sentencepiece_json(const std::string& pre_tokenizer) {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const char* token : {"\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "bc"}) vocab[token] = next++;
  nlohmann::json root = nlohmann::json::parse(R"({"version": "1.0", "added_tokens": [
    {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
      "merges": [["\u2581", "a"], ["a", "b"], ["\u2581a", "b"], ["b", "c"]]}})");
  root["pre_tokenizer"] = nlohmann::json::parse(pre_tokenizer);
  root["model"]["vocab"] = vocab;
  return root.dump();
}

TEST(Tokenizer, SentencePieceStyleBpeAsHuggingFaceEncodesAndDecodes) {
  TempDir dir;
  write_text(dir.file("tokenizer.json"),
             tiny_sentencepiece_json(
                 R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})"));
  const HfTokenizer tokenizer(dir.file("tokenizer.json"));
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(tokenizer.encode("ab abc"), (Ids{265, 265, 262}));
  EXPECT_EQ(tokenizer.encode(" ab"), (Ids{265}));                      // already starts with a space: no second prefix
  EXPECT_EQ(tokenizer.encode("\u00e9 a"), (Ids{259, 198, 172, 263}));  // é: no piece, its two bytes
  // The prefix goes only where the text starts: not after an added token.
  EXPECT_EQ(tokenizer.encode("<s>ab</s> ab"), (Ids{1, 264, 2, 265}));
  EXPECT_EQ(tokenizer.encode("abc<s>"), (Ids{265, 262, 1}));
  // Byte tokens that make no character: one U+FFFD per byte token (ByteFallback), not one per
  // stretch as the byte-level decoder gives; the first space dropped (Strip); added tokens as text.
  const std::string replacement = "\xef\xbf\xbd";
  EXPECT_EQ(tokenizer.decode({229, 260}), replacement + "a");
  EXPECT_EQ(tokenizer.decode({229, 133, 260}), replacement + replacement + "a");
  EXPECT_EQ(tokenizer.decode({263, 1, 265}), "a<s> ab");
  EXPECT_EQ(tokenizer.decode({198, 172}), "\u00e9");
  EXPECT_EQ(tokenizer.decode({259, 259, 260}), " a");
  EXPECT_THROW(tokenizer.decode({9999}), std::out_of_range);
}

// The Hub's Llama 2 form of the same: no pre-tokenizer, normalizers Prepend and Replace, which
// prefix every stretch between added tokens (the ids Hugging Face gives for it).
TEST(Tokenizer, SentencePieceLegacyFormPrefixesEveryStretch) {
  TempDir dir;
  std::string json = tiny_sentencepiece_json("null");
  nlohmann::json root = nlohmann::json::parse(json);
  root["normalizer"] = nlohmann::json::parse(R"({"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
  write_text(dir.file("tokenizer.json"), root.dump());
  const HfTokenizer tokenizer(dir.file("tokenizer.json"));
  EXPECT_EQ(tokenizer.encode("<s>ab</s> ab"), (std::vector<int32_t>{1, 265, 2, 259, 265}));
  EXPECT_EQ(tokenizer.pre_tokenize("a b"), (std::vector<std::string>{"\u2581a\u2581b"}));
}

// Found by fuzzing (tests/fuzz/regressions/fuzz_tokenizer_json/): a vocabulary id below 0 or past
// the vocabulary indexed a vector out of its bounds; an added token's id of 2^31 - 1 made a
// vocabulary of 2^31 rows. Each is refused naming the token and the id.
TEST(Tokenizer, HfTokenizerRefusesIdsOutsideTheVocabulary) {
  TinyBpe bpe;
  nlohmann::json vocab = nlohmann::json::parse(read_text(bpe.dir.file("vocab.json")));
  const std::string token = vocab.begin().key();
  const size_t size = vocab.size();
  for (int64_t id : {int64_t{-5}, static_cast<int64_t>(size), int64_t{1000000000}}) {
    nlohmann::json bad = vocab;
    bad[token] = id;
    write_text(bpe.dir.file("bad_id.json"), tiny_tokenizer_json(bad.dump()));
    const auto message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("bad_id.json")); });
    EXPECT_NE(message.find("has id " + std::to_string(id)), std::string::npos) << message;
    EXPECT_NE(message.find("bad_id.json"), std::string::npos) << message;
  }
  std::string added = tiny_tokenizer_json(vocab.dump());
  added.replace(added.find("\"id\": 260"), std::string("\"id\": 260").size(), "\"id\": 2147483647");
  write_text(bpe.dir.file("bad_added.json"), added);
  const auto message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("bad_added.json")); });
  EXPECT_NE(message.find("added token '<|eot|>' has id 2147483647"), std::string::npos) << message;
}

// Found by fuzzing in CI (2026-12-03): an id of 1.11111e+122 was converted to a 64-bit integer,
// undefined behaviour; an id of 5.5 was read as 5. An id that is not an integer is refused, naming
// the token, as tokenizers (serde's u32) refuses it.
TEST(Tokenizer, HfTokenizerRefusesIdsThatAreNotIntegers) {
  TinyBpe bpe;
  nlohmann::json vocab = nlohmann::json::parse(read_text(bpe.dir.file("vocab.json")));
  const std::string token = vocab.begin().key();
  for (const char* id : {"5.5", "1.11111e+122", "\"7\"", "18446744073709551615", "true"}) {
    std::string text = vocab.dump();
    const std::string key = nlohmann::json(token).dump() + ":";
    const size_t at = text.find(key) + key.size();
    text.replace(at, text.find_first_of(",}", at) - at, id);
    write_text(bpe.dir.file("bad_id.json"), tiny_tokenizer_json(text));
    const auto message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("bad_id.json")); });
    EXPECT_NE(message.find("token '" + token + "' has id " + nlohmann::json::parse(id).dump()), std::string::npos)
        << id << ": " << message;
  }
  for (const char* id : {"260.5", "1e300"}) {
    std::string added = tiny_tokenizer_json(vocab.dump());
    added.replace(added.find("\"id\": 260"), std::string("\"id\": 260").size(), std::string("\"id\": ") + id);
    write_text(bpe.dir.file("bad_added.json"), added);
    const auto message = expect_throw_message([&] { HfTokenizer t(bpe.dir.file("bad_added.json")); });
    EXPECT_NE(message.find("added token '<|eot|>' has id " + nlohmann::json::parse(id).dump()), std::string::npos)
        << id << ": " << message;
  }
}

// Best fit over a seeded order: every example in exactly one row, no row over capacity, the same
// rows for the same seed, another arrangement for another; lengths near a third of a row fill
// rows to 90% and more (the fine-tune job's case: 36% of a window used one to a row).
TEST(Packing, BestFitPlacesEveryExampleOnceAndFillsRows) {
  std::mt19937_64 draw(7);
  std::vector<int64_t> lengths;
  int64_t total = 0;
  for (int i = 0; i < 2000; ++i) {
    lengths.push_back(20 + static_cast<int64_t>(draw() % 150));  // 20..169 of 256: 37% on average
    total += lengths.back();
  }
  const auto rows = pack_best_fit(lengths, 256, 1);
  std::vector<int> seen(lengths.size(), 0);
  for (const auto& row : rows) {
    int64_t used = 0;
    for (int64_t index : row) ++seen[index], used += lengths[index];
    EXPECT_LE(used, 256);
  }
  for (int count : seen) ASSERT_EQ(count, 1);
  const double use = static_cast<double>(total) / static_cast<double>(rows.size() * 256);
  EXPECT_GE(use, 0.9) << rows.size() << " rows";
  EXPECT_EQ(pack_best_fit(lengths, 256, 1), rows);
  EXPECT_NE(pack_best_fit(lengths, 256, 2), rows);
  EXPECT_THROW(pack_best_fit({10, 300}, 256, 1), std::invalid_argument);
}

// A packed row holds each example's padded-row inputs and targets back to back, positions
// restarting at 0 for each and for the padding tail; its target count is its examples'.
TEST(Packing, PackedRowsHoldThePaddedRowsBackToBack) {
  std::vector<RenderedExample> examples = {{{10, 11, 12, 13}, {0, 0, 1, 1}},  // 3 places, 2 trained targets
                                           {{20, 21, 22}, {0, 1, 1}},         // 2 places, 2 trained
                                           {{30, 31, 32, 33, 34}, {0, 0, 0, 1, 1}}};
  auto padded = std::make_shared<InstructionDataset>(examples, 8, 99);
  const PackedInstructionDataset packed(padded, 5);
  ASSERT_EQ(packed.examples(), 3);
  int64_t places = 0;
  for (int64_t r = 0; r < packed.size(); ++r) {
    const Batch batch = packed.get({r});
    const Batch alone = padded->get(packed.row(r));
    int64_t place = 0, targets = 0;
    for (size_t e = 0; e < packed.row(r).size(); ++e) {
      const int64_t example = packed.row(r)[e];
      const int64_t n = padded->places(example);
      EXPECT_TRUE(batch.inputs[0].narrow(0, place, n).equal(alone.inputs[static_cast<int64_t>(e)].narrow(0, 0, n)));
      EXPECT_TRUE(batch.targets[0].narrow(0, place, n).equal(alone.targets[static_cast<int64_t>(e)].narrow(0, 0, n)));
      EXPECT_TRUE(batch.positions[0].narrow(0, place, n).equal(torch::arange(n, at::kLong)));
      targets += padded->target_count(example);
      place += n;
    }
    places += place;
    EXPECT_EQ(packed.target_count(r), targets);
    EXPECT_TRUE(batch.inputs[0].narrow(0, place, 8 - place).eq(99).all().item<bool>());
    EXPECT_TRUE(batch.targets[0].narrow(0, place, 8 - place).eq(kIgnoredTarget).all().item<bool>());
    EXPECT_TRUE(batch.positions[0].narrow(0, place, 8 - place).equal(torch::arange(8 - place, at::kLong)));
  }
  EXPECT_EQ(places, 3 + 2 + 4);
  EXPECT_EQ(packed.size(), 2);  // 9 places in rows of 8
  EXPECT_NEAR(packed.window_use(), 9.0 / 16.0, 1e-12);
  EXPECT_NEAR(packed.padded_window_use(), 9.0 / 24.0, 1e-12);
}

// data.document_masking: positions restart after each end-of-text token (and at each window's
// start); without an end token the windows carry no positions.
TEST(Packing, TokenWindowsRestartPositionsAfterEndOfText) {
  auto tokens = std::make_shared<TokenBuffer>(std::vector<int32_t>{5, 6, 9, 7, 9, 8, 8, 8, 9, 1}, 10);
  EXPECT_EQ(tokens->held_bytes(), 10 * 4);  // int32 tokens in memory
  const TokenWindows masked(tokens, 4, /*document_end=*/9);
  const Batch batch = masked.get({0, 1});
  EXPECT_TRUE(batch.positions.equal(at::tensor({0, 1, 2, 0, 0, 0, 1, 2}, at::kLong).view({2, 4}))) << batch.positions;
  EXPECT_FALSE(TokenWindows(tokens, 4).get({0}).positions.defined());
}

TEST(Corpus, ReadsFortunesAndSplitsStably) {
  TempDir dir;
  write_text(dir.file("wisdom"), "First fortune.\n%\nSecond\n  -- someone\n%\n\n%\nThird.\n");
  write_text(dir.file("wisdom.dat"), std::string("\x00\x01binary", 8));
  write_text(dir.file("wisdom.u8"), "First fortune.\n");
  auto docs = read_fortunes(dir.file(""));
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "First fortune.\n");
  EXPECT_EQ(docs[1].text, "Second\n  -- someone\n");
  EXPECT_EQ(docs[2].text, "Third.\n");
  // The split depends on each document's text alone.
  std::vector<Document> many;
  for (int i = 0; i < 400; ++i) many.push_back({"f", "fortune number " + std::to_string(i) + "\n"});
  auto split = split_documents(many, 10);
  EXPECT_EQ(split.train.size() + split.validation.size(), 400u);
  EXPECT_GT(split.validation.size(), 20u);
  EXPECT_LT(split.validation.size(), 60u);
  std::vector<Document> reversed(many.rbegin(), many.rend());
  auto split2 = split_documents(reversed, 10);
  std::set<std::string> a, b;
  for (auto& d : split.validation) a.insert(d.text);
  for (auto& d : split2.validation) b.insert(d.text);
  EXPECT_EQ(a, b);
  ByteTokenizer bytes;
  EXPECT_EQ(bytes.decode(tokenize_documents({docs[0], docs[2]}, bytes)), "First fortune.\n%\nThird.\n%\n");
  EXPECT_NE(expect_throw_message([] { read_fortunes("/nonexistent/fortunes"); }).find("apt-get install fortunes"),
            std::string::npos);
}

TEST(Corpus, DebianFortunesArePresent) {
  auto docs = read_fortunes(kFortunesDir);
  EXPECT_GT(docs.size(), 10000u);  // the fortunes package holds ~15k
}

void write_idx_gz(const std::string& path, const std::vector<unsigned char>& header,
                  const std::vector<unsigned char>& data) {
  gzFile file = gzopen(path.c_str(), "wb");
  gzwrite(file, header.data(), static_cast<unsigned>(header.size()));
  if (!data.empty()) gzwrite(file, data.data(), static_cast<unsigned>(data.size()));
  gzclose(file);
}

TEST(Images, ReadsGzippedIdxAndRejectsTruncated) {
  TempDir dir;
  std::vector<unsigned char> pixels(2 * 3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 10);
  write_idx_gz(dir.file("x.gz"), {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4}, pixels);
  auto t = read_idx(dir.file("x.gz"));
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(t[1][2][3].item<int>(), 230);
  write_idx_gz(dir.file("short.gz"), {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4}, {1, 2, 3});
  EXPECT_NE(expect_throw_message([&] { read_idx(dir.file("short.gz")); }).find("truncated"), std::string::npos);
  EXPECT_NE(expect_throw_message([&] { load_fashion_mnist(dir.file("none"), "train"); }).find("dataset-fashion-mnist"),
            std::string::npos);
}

TEST(Images, FashionMnistHasThePublishedSplit) {
  auto test = load_fashion_mnist(kFashionMnistDir, "test");
  EXPECT_EQ(test.pixels.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(test.pixels.scalar_type(), at::kByte);  // held as stored: a quarter of fp32's memory
  const at::Tensor images = test.images(0, 10000);
  EXPECT_EQ(test.labels.bincount().min().item<int64_t>(), 1000);  // 1,000 test images per class
  // Normalised with the training set's statistics: the test set's mean is near 0, std near 1.
  EXPECT_NEAR(images.mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(images.std().item<double>(), 1.0, 0.05);
  // What the set keeps in memory: one byte a pixel and the labels (int64), not fp32 images.
  EXPECT_EQ(test.held_bytes(), 10000 * 784 + 10000 * 8);
  EXPECT_EQ(ImageDataset(test).held_bytes(), test.held_bytes());
  // A batch's images do not depend on how the set is cut.
  EXPECT_TRUE(at::equal(test.images(37, 5), images.narrow(0, 37, 5)));
}

TEST(Sampler, RanksTakeDisjointSharesOfTheSameGlobalBatch) {
  GlobalBatchSampler sampler(100, 12, 42);
  for (int64_t step : {0, 7, 8, 9, 123}) {  // 100 / 12: steps 8 and 9 cross an epoch boundary
    std::vector<int64_t> whole = sampler.indices(step, 0, 1);
    for (int world : {2, 3, 4}) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; ++r) {
        auto part = sampler.indices(step, r, world);
        EXPECT_EQ(part.size(), 12u / world);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, whole) << "step " << step << " world " << world;
    }
  }
  // Each epoch visits every item once; a fresh sampler (a resumed run) gives the same indices.
  std::vector<int64_t> epoch;
  for (int64_t step = 0; step < 25; ++step) {
    for (int64_t i : GlobalBatchSampler(100, 4, 42).indices(step, 0, 1)) epoch.push_back(i);
  }
  std::set<int64_t> distinct(epoch.begin(), epoch.end());
  EXPECT_EQ(distinct.size(), 100u);
  EXPECT_NE(GlobalBatchSampler(100, 4, 43).indices(0, 0, 1), GlobalBatchSampler(100, 4, 42).indices(0, 0, 1));
  EXPECT_THROW(sampler.indices(0, 0, 5), std::invalid_argument);
}

TEST(Datasets, TokenWindowsShiftTargetsByOne) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 50; ++i) tokens.push_back(i);
  TokenWindows windows(std::make_shared<TokenBuffer>(tokens, 256), 8);
  EXPECT_EQ(windows.size(), 6);  // (50 - 1) / 8
  auto batch = windows.get({0, 5});
  EXPECT_EQ(batch.inputs[1][0].item<int64_t>(), 40);
  EXPECT_EQ(batch.targets[1][7].item<int64_t>(), 48);
  EXPECT_TRUE(torch::equal(batch.inputs.narrow(1, 1, 7), batch.targets.narrow(1, 0, 7)));
}

}  // namespace data_tests

namespace data_tests {

TEST(Images, HorizontalFlipDependsOnSeedStepAndIndexOnly) {
  auto images = torch::arange(2 * 1 * 2 * 3, torch::kFloat).view({2, 1, 2, 3}).repeat({50, 1, 1, 1});  // [100, 1, 2, 3]
  std::vector<int64_t> indices(100);
  for (int64_t i = 0; i < 100; ++i) indices[i] = 1000 + i;
  auto flipped = images.clone();
  fsdp::data::random_horizontal_flip(flipped, indices, 7, 42);
  int mirrored = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const bool same = torch::equal(flipped[i], images[i]);
    EXPECT_TRUE(same || torch::equal(flipped[i], images[i].flip({-1}))) << i;
    mirrored += same ? 0 : 1;
  }
  EXPECT_GT(mirrored, 30);
  EXPECT_LT(mirrored, 70);
  // The same sample at the same step flips the same way in any batch (any rank's share).
  auto one = images.narrow(0, 37, 1).clone();
  fsdp::data::random_horizontal_flip(one, {1037}, 7, 42);
  EXPECT_TRUE(torch::equal(one[0], flipped[37]));
}

}  // namespace data_tests

namespace data_tests {

TEST(Images, ShiftMovesByAtMostTwoPixelsDeterministically) {
  auto images = torch::zeros({40, 1, 28, 28});
  images.select(2, 14).select(2, 14).fill_(1.0);  // one bright pixel at (14, 14) in every image
  std::vector<int64_t> indices(40);
  for (int64_t i = 0; i < 40; ++i) indices[i] = i;
  auto shifted = images.clone();
  fsdp::data::random_shift(shifted, indices, 3, 9, 2, -0.5);
  int moved = 0;
  for (int64_t i = 0; i < 40; ++i) {
    auto where = (shifted[i][0] == 1.0).nonzero();
    ASSERT_EQ(where.size(0), 1) << i;
    const int64_t y = where[0][0].item<int64_t>(), x = where[0][1].item<int64_t>();
    EXPECT_LE(std::abs(y - 14), 2);
    EXPECT_LE(std::abs(x - 14), 2);
    moved += (y != 14 || x != 14);
  }
  EXPECT_GT(moved, 25);
  auto again = images.clone();
  fsdp::data::random_shift(again, indices, 3, 9, 2, -0.5);
  EXPECT_TRUE(torch::equal(again, shifted));
}

}  // namespace data_tests
using namespace data_tests;  // (helpers above, used below)

// ---- Instruction data (data/instructions.h) ----

namespace instruction_tests {

using namespace fsdp::data;

std::string write_lines(const TempDir& dir, const std::string& name, const std::string& text) {
  write_text(dir.file(name), text);
  return dir.file(name);
}

std::string error_reading(const std::string& path) {
  try {
    read_instruction_jsonl(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error reading " << path;
  return "";
}

TEST(Instructions, ReadsBothFormsAndNamesTheBadLine) {
  TempDir dir;
  const std::string good = write_lines(
      dir, "good.jsonl",
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"},"
      " {\"role\": \"assistant\", \"content\": \"a\"}]}\n\n{\"prompt\": \"p\", \"completion\": \"c\"}\n");
  auto examples = read_instruction_jsonl(good);
  ASSERT_EQ(examples.size(), 2u);
  EXPECT_EQ(examples[0].messages.size(), 3u);
  EXPECT_EQ(examples[1].line, 3);  // the blank line counts
  EXPECT_EQ(examples[1].messages[0].role, "user");
  EXPECT_EQ(examples[1].messages[1].role, "assistant");
  EXPECT_EQ(examples[1].messages[1].content, "c");
  const std::string first = "{\"prompt\": \"p\", \"completion\": \"c\"}\n";
  EXPECT_NE(error_reading(write_lines(dir, "a.jsonl", first + "{\"prompt\": \n")).find("a.jsonl:2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_reading(write_lines(dir, "b.jsonl",
                                      first + first + "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n"))
                .find("b.jsonl:3: message 1 has unknown role 'bot'"),
            std::string::npos);
  EXPECT_NE(error_reading(write_lines(dir, "c.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"))
                .find("c.jsonl:1: no assistant message"),
            std::string::npos);
  EXPECT_NE(error_reading(write_lines(dir, "d.jsonl", "{\"prompt\": \"p\", \"completion\": 3}\n"))
                .find("d.jsonl:1: the example's \"completion\" must be a string"),
            std::string::npos);
  EXPECT_NE(error_reading(write_lines(dir, "e.jsonl", "{\"text\": \"p\"}\n")).find("e.jsonl:1: expected {\"messages\""),
            std::string::npos);
  EXPECT_NE(error_reading(write_lines(dir, "f.jsonl", "\n")).find("holds no examples"), std::string::npos);
}

// Plain format with the byte tokenizer (no end-of-text token): the contents back to back, only
// the assistant's bytes trained.
TEST(Instructions, PlainFormatTrainsOnlyTheAnswer) {
  ByteTokenizer bytes;
  InstructionExample example{{{"user", "ab"}, {"assistant", "cde"}, {"user", "f"}, {"assistant", "g"}}, 0};
  EXPECT_EQ(resolve_chat_format(std::nullopt, bytes), ChatFormat::Plain);
  EXPECT_THROW(resolve_chat_format(ChatFormat::Llama3, bytes), std::invalid_argument);
  auto rendered = render_chat(example, ChatFormat::Plain, bytes);
  EXPECT_EQ(bytes.decode(rendered.tokens), "abcdefg");
  EXPECT_EQ(rendered.trained, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 1}));
}

// Mistral's format on the tiny SentencePiece-style tokenizer with [INST] and [/INST] added: one text
// "<s>[INST] ab[/INST] abc</s>", encoded once; " abc</s>" trained. A format whose tokens the
// tokenizer lacks is refused naming the token; roles that do not alternate, naming the message.
TEST(Instructions, MistralFormatRendersOneTextAndTrainsTheAnswer) {
  TempDir dir;
  nlohmann::json root = nlohmann::json::parse(tiny_sentencepiece_json(
      R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})"));
  for (const auto& [content, id] : {std::pair<std::string, int>{"[INST]", 267}, {"[/INST]", 268}}) {
    root["added_tokens"].push_back({{"id", id},
                                    {"content", content},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}});
  }
  write_text(dir.file("tokenizer.json"), root.dump());
  const HfTokenizer tokenizer(dir.file("tokenizer.json"));
  EXPECT_EQ(resolve_chat_format(std::nullopt, tokenizer), ChatFormat::Mistral);
  const auto message = expect_throw_message([&] { resolve_chat_format(ChatFormat::Gemma, tokenizer); });
  EXPECT_NE(message.find("needs a tokenizer with <start_of_turn>"), std::string::npos) << message;
  const InstructionExample example{{{"user", "ab"}, {"assistant", "abc"}}, 0};
  const auto rendered = render_chat(example, ChatFormat::Mistral, tokenizer);
  EXPECT_EQ(rendered.tokens, (std::vector<int32_t>{1, 267, 265, 268, 265, 262, 2}));
  EXPECT_EQ(rendered.trained, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(render_prompt({{"user", "ab"}}, ChatFormat::Mistral, tokenizer), (std::vector<int32_t>{1, 267, 265, 268}));
  const InstructionExample twice{{{"user", "ab"}, {"user", "b"}, {"assistant", "c"}}, 7};
  const auto error = expect_throw_message([&] { render_chat(twice, ChatFormat::Mistral, tokenizer); });
  EXPECT_NE(error.find("line 7: chat format mistral: message 2 is user where assistant was expected"),
            std::string::npos)
      << error;
}

// Rows: inputs are the tokens, targets the next token where it is trained (else -100), padding
// after; examples longer than seq + 1 are dropped and counted.
TEST(Instructions, DatasetShiftsMasksPadsAndDropsLongExamples) {
  ByteTokenizer bytes;
  std::vector<RenderedExample> rendered;
  rendered.push_back(render_chat({{{"user", "ab"}, {"assistant", "cd"}}, 0}, ChatFormat::Plain, bytes));  // 4 tokens
  rendered.push_back(
      render_chat({{{"user", "abcdef"}, {"assistant", "ghij"}}, 0}, ChatFormat::Plain, bytes));  // 10: too long
  rendered.push_back(render_chat({{{"user", "xyz"}, {"assistant", "w"}}, 0}, ChatFormat::Plain, bytes));  // 4 tokens
  InstructionDataset dataset(std::move(rendered), /*seq=*/6, /*pad_id=*/0);
  EXPECT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.dropped(), 1);
  EXPECT_EQ(dataset.target_count(0), 2);  // predicting c and d
  EXPECT_EQ(dataset.target_count(1), 1);  // predicting w
  auto batch = dataset.get({1, 0});
  auto row = [](const at::Tensor& t, int64_t i) {
    auto r = t[i].contiguous();
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  EXPECT_EQ(row(batch.inputs, 0), (std::vector<int64_t>{'x', 'y', 'z', 0, 0, 0}));
  EXPECT_EQ(row(batch.targets, 0), (std::vector<int64_t>{-100, -100, 'w', -100, -100, -100}));
  EXPECT_EQ(row(batch.inputs, 1), (std::vector<int64_t>{'a', 'b', 'c', 0, 0, 0}));
  EXPECT_EQ(row(batch.targets, 1), (std::vector<int64_t>{-100, 'c', 'd', -100, -100, -100}));
}

// An example's loss does not change with its neighbours in the batch: each example is a row of its
// own (causal attention never reaches the padding after it, nor another row). Same model, same
// example, alone and beside two others of different lengths: the same summed loss (1e-6).
TEST(Instructions, AnExamplesLossDoesNotDependOnItsNeighbours) {
  ByteTokenizer bytes;
  std::vector<RenderedExample> rendered;
  for (const auto& [prompt, answer] : std::vector<std::pair<std::string, std::string>>{
           {"What is FSDP?", "Sharding."}, {"Hi", "Hello there, friend"}, {"A long question here?", "Yes"}}) {
    rendered.push_back(render_chat({{{"user", prompt}, {"assistant", answer}}, 0}, ChatFormat::Plain, bytes));
  }
  InstructionDataset dataset(std::move(rendered), /*seq=*/40, /*pad_id=*/0);
  ASSERT_EQ(dataset.size(), 3);
  torch::manual_seed(0);
  auto config = std::get<fsdp::models::LlamaConfig>(fsdp::models::model_config("llama-test"));
  fsdp::models::Llama model(config);
  model->eval();
  torch::NoGradGuard no_grad;
  auto summed_loss_of_first = [&](const std::vector<int64_t>& indices) {
    auto batch = dataset.get(indices);
    auto logits = model->forward(batch.inputs);
    auto losses =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape(-1),
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    return losses.view({static_cast<int64_t>(indices.size()), -1})[0].sum().item<double>();
  };
  const double alone = summed_loss_of_first({0});
  EXPECT_GT(alone, 1.0);
  EXPECT_NEAR(summed_loss_of_first({0, 1, 2}), alone, 1e-6);
  EXPECT_NEAR(summed_loss_of_first({0, 2}), alone, 1e-6);
}

}  // namespace instruction_tests

namespace data_tests {

// Image chats: the image's tokens, the question, the answer and end-of-text; only the answer and
// its end-of-text are targets, each at the position before it; padding with end-of-text, untrained.
TEST(ImageChat, OnlyTheAnswerIsTrained) {
  const fsdp::data::ImageChatWriter writer(fsdp::data::fashion_mnist_class_names(), 16, 257, 256);
  EXPECT_EQ(writer.answer(7), "A sneaker.");
  EXPECT_EQ(writer.answer(9), "An ankle boot.");
  EXPECT_EQ(writer.longest_answer_tokens(), static_cast<int64_t>(std::string("A pair of trousers.").size()) + 1);
  const auto rows = writer.examples(at::tensor({7, 1}, at::kLong));
  const int64_t p = writer.prompt_length(), t = writer.row_length();
  ASSERT_EQ(rows.ids.sizes(), (std::vector<int64_t>{2, t}));
  EXPECT_TRUE(rows.ids[0].narrow(0, 0, 16).eq(257).all().item<bool>());
  EXPECT_EQ(rows.ids[0][16].item<int64_t>(), 'U');
  const std::string answer = "A sneaker.";
  for (size_t j = 0; j < answer.size(); ++j) {
    EXPECT_EQ(rows.ids[0][p + static_cast<int64_t>(j)].item<int64_t>(), static_cast<unsigned char>(answer[j]));
    EXPECT_EQ(rows.targets[0][p - 1 + static_cast<int64_t>(j)].item<int64_t>(), static_cast<unsigned char>(answer[j]));
  }
  EXPECT_EQ(rows.targets[0][p - 1 + static_cast<int64_t>(answer.size())].item<int64_t>(), 256)
      << "end-of-text is trained";
  EXPECT_EQ(rows.targets[0].ne(-100).sum().item<int64_t>(), writer.answer_tokens(7));
  EXPECT_EQ(rows.targets[1].ne(-100).sum().item<int64_t>(), writer.answer_tokens(1));
  EXPECT_TRUE(rows.targets[0].narrow(0, 0, p - 1).eq(-100).all().item<bool>()) << "the image and question are not";
  EXPECT_TRUE(rows.ids[0].narrow(0, p + 10, t - p - 10).eq(256).all().item<bool>()) << "padded with end-of-text";
  // Generated answers: exact bytes then end-of-text name the class; anything else none.
  std::vector<int64_t> generated(answer.begin(), answer.end());
  generated.push_back(256);
  generated.push_back(65);  // after the end: ignored
  EXPECT_EQ(writer.class_of(generated), 7);
  generated[2] = 'S';
  EXPECT_EQ(writer.class_of(generated), -1);
  EXPECT_EQ(writer.class_of({'A', ' ', 's', 'h', 'i', 'r', 't', '.'}), -1) << "no end-of-text";
  EXPECT_THROW(fsdp::data::ImageChatWriter(fsdp::data::fashion_mnist_class_names(), 16, 256, 256),
               std::invalid_argument);
}

// Captions: bytes of a template filled with the class name, then end-of-text to the context; the
// template drawn per (step, sample), the same for the same draw; cut to fit with eos kept, counted.
TEST(Captions, BytesThenEndOfTextAndTemplatesVaryByStep) {
  fsdp::data::CaptionWriter writer(fsdp::data::fashion_mnist_class_names(), fsdp::data::caption_templates(), 48, 256);
  EXPECT_EQ(writer.truncated_pairs(), 0);
  const at::Tensor prompts = writer.class_prompts();  // "a photo of a {}."
  ASSERT_EQ(prompts.sizes(), (std::vector<int64_t>{10, 48}));
  const std::string sneaker = "a photo of a sneaker.";
  for (size_t i = 0; i < sneaker.size(); ++i)
    EXPECT_EQ(prompts[7][i].item<int64_t>(), static_cast<unsigned char>(sneaker[i]));
  EXPECT_TRUE(prompts[7].narrow(0, sneaker.size(), 48 - sneaker.size()).eq(256).all().item<bool>());
  const at::Tensor labels = at::full({64}, 7, at::kLong);
  std::vector<int64_t> indices(64);
  for (int64_t i = 0; i < 64; ++i) indices[i] = i;
  const at::Tensor a = writer.captions(labels, indices, 3, 1), b = writer.captions(labels, indices, 3, 1);
  EXPECT_TRUE(a.equal(b));
  EXPECT_FALSE(a.equal(writer.captions(labels, indices, 4, 1))) << "another step draws other templates";
  std::set<std::string> seen;
  for (int64_t i = 0; i < 64; ++i) {
    std::string text;
    for (int64_t t = 0; t < 48 && a[i][t].item<int64_t>() != 256; ++t)
      text += static_cast<char>(a[i][t].item<int64_t>());
    EXPECT_NE(text.find("sneaker"), std::string::npos) << text;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 6u) << "64 draws over 8 templates";
  EXPECT_THROW(writer.captions(at::full({1}, 10, at::kLong), {0}, 0, 1), std::invalid_argument);

  fsdp::data::CaptionWriter short_context(fsdp::data::fashion_mnist_class_names(), fsdp::data::caption_templates(), 20,
                                          256);
  EXPECT_GT(short_context.truncated_pairs(), 0);
  EXPECT_EQ(short_context.longest_bytes(), writer.longest_bytes());
  const at::Tensor cut = short_context.class_prompts();
  EXPECT_EQ(cut[9][19].item<int64_t>(), 256) << "a cut caption keeps its end-of-text token last";
}

}  // namespace data_tests
