// What the pruner, --resume latest and publication may touch: only published checkpoints of this
// run, by step number; an output replaced atomically; a refused output left as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <unistd.h>
#include <algorithm>
#include <map>
#include <thread>
#include <chrono>

#include "checkpoint/bnb_4bit_weight.h"
#include "data/unicode_regex.h"
#include "fsdp/checkpoint/published_files.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/shard/nf4.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/token_file.h"
#include "fsdp/data/token_shards.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/train/config.h"

namespace user_files_tests {

namespace fs = std::filesystem;

// A scratch directory, removed at the end of the test.
struct Scratch {
  fs::path dir;
  Scratch() {
    char pattern[] = "/tmp/fsdp-user-files-XXXXXX";
    dir = ::mkdtemp(pattern);
  }
  ~Scratch() { fs::remove_all(dir); }
};

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A published checkpoint as far as the pruner looks: a step-<digits> directory with a manifest
// naming its run ("" : a manifest from before run ids).
void fake_checkpoint(const fs::path& dir, const std::string& run_id) {
  write(dir / "manifest.json", run_id.empty() ? "{}" : "{\"run_id\": \"" + run_id + "\"}");
}

TEST(UserFiles, PruningKeepsTheNewestByStepAndNeverAUsersCopy) {
  Scratch s;
  const fs::path c = s.dir / "checkpoints";
  for (const char* name : {"step-00000100", "step-00000200", "step-00000300"}) fake_checkpoint(c / name, "run-a");
  fake_checkpoint(c / "step-00000300-best", "run-a");  // a user's copy, manifest and all
  fake_checkpoint(c / "step-00000300.bak", "run-a");
  fake_checkpoint(c / "step-100000000", "run-a");  // 9 digits: after every 8-digit step, by number
  write(c / "step-00000400" / "notes.txt", "no manifest: not a checkpoint");
  fake_checkpoint(c / "step-00000150.partial", "run-a");  // an interrupted save of ours
  fake_checkpoint(c / "my.partial.copy", "run-a");        // a user's directory with ".partial" in its name

  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(c.string(), -1, "run-a"), (c / "step-100000000").string());
  fsdp::checkpoint::prune_checkpoints(c.string(), 2, -1, "run-a");
  EXPECT_FALSE(fs::exists(c / "step-00000100"));
  EXPECT_FALSE(fs::exists(c / "step-00000200"));
  EXPECT_TRUE(fs::exists(c / "step-00000300"));
  EXPECT_TRUE(fs::exists(c / "step-100000000"));
  EXPECT_TRUE(fs::exists(c / "step-00000300-best"));
  EXPECT_TRUE(fs::exists(c / "step-00000300.bak"));
  EXPECT_TRUE(fs::exists(c / "step-00000400" / "notes.txt"));
  EXPECT_TRUE(fs::exists(c / "my.partial.copy"));
  EXPECT_FALSE(fs::exists(c / "step-00000150.partial"));
}

TEST(UserFiles, PruningAndLatestTakeOnlyThisRunsCheckpoints) {
  Scratch s;
  const fs::path c = s.dir / "checkpoints";
  fake_checkpoint(c / "step-00001000", "old-run");  // another run's, newer by step
  fake_checkpoint(c / "step-00000050", "");         // from before run ids: anyone's
  fake_checkpoint(c / "step-00000100", "new-run");
  fake_checkpoint(c / "step-00000200", "new-run");
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(c.string(), -1, "new-run"), (c / "step-00000200").string());
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(c.string(), 150, "new-run"), (c / "step-00000100").string());
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(c.string()), (c / "step-00001000").string());
  fsdp::checkpoint::prune_checkpoints(c.string(), 1, -1, "new-run");
  EXPECT_TRUE(fs::exists(c / "step-00001000"));  // not this run's: never pruned by it
  EXPECT_TRUE(fs::exists(c / "step-00000200"));
  EXPECT_FALSE(fs::exists(c / "step-00000100"));
  EXPECT_FALSE(fs::exists(c / "step-00000050"));
  fsdp::checkpoint::remove_checkpoints_after(c.string(), 0, "new-run");
  EXPECT_TRUE(fs::exists(c / "step-00001000"));
  EXPECT_FALSE(fs::exists(c / "step-00000200"));
}

TEST(UserFiles, AStepNumberPastInt64IsNotACheckpoint) {
  Scratch s;
  const fs::path c = s.dir / "checkpoints";
  fake_checkpoint(c / "step-99999999999999999999", "run");  // 20 digits: std::stoll would throw
  fake_checkpoint(c / "step-00000007", "run");
  EXPECT_EQ(fsdp::checkpoint::find_latest_checkpoint(c.string(), -1, "run"), (c / "step-00000007").string());
  EXPECT_NO_THROW(fsdp::checkpoint::prune_checkpoints(c.string(), 1, -1, "run"));
  EXPECT_TRUE(fs::exists(c / "step-99999999999999999999"));
}

TEST(UserFiles, PublishReplacesAtomicallyOnlyWhenAsked) {
  Scratch s;
  const fs::path target = s.dir / "step-00000010", ready = s.dir / "step-00000010.partial";
  write(target / "manifest.json", "old");
  write(ready / "manifest.json", "new");
  EXPECT_THROW(fsdp::checkpoint::publish(ready, target, /*replace=*/false), std::runtime_error);
  EXPECT_EQ(read(target / "manifest.json"), "old");
  EXPECT_EQ(read(ready / "manifest.json"), "new");
  fsdp::checkpoint::publish(ready, target, /*replace=*/true);
  EXPECT_EQ(read(target / "manifest.json"), "new");
  EXPECT_FALSE(fs::exists(ready));
  EXPECT_FALSE(fs::exists(s.dir / "step-00000010.replaced"));
  // A file the same way; and an absent or empty target needs no permission.
  write(s.dir / "a.safetensors", "old");
  write(s.dir / "a.safetensors.partial", "new");
  fsdp::checkpoint::publish(s.dir / "a.safetensors.partial", s.dir / "a.safetensors", true);
  EXPECT_EQ(read(s.dir / "a.safetensors"), "new");
  // A file never replaces a directory (nor the other way): with --overwrite a file export aimed at
  // a directory would otherwise have removed it.
  write(s.dir / "models" / "keep.txt", "keep");
  write(s.dir / "models.partial", "a file");
  EXPECT_THROW(fsdp::checkpoint::publish(s.dir / "models.partial", s.dir / "models", true), std::runtime_error);
  EXPECT_EQ(read(s.dir / "models" / "keep.txt"), "keep");
  fs::create_directories(s.dir / "empty");
  write(s.dir / "empty.partial" / "x", "x");
  fsdp::checkpoint::publish(s.dir / "empty.partial", s.dir / "empty", false);
  EXPECT_EQ(read(s.dir / "empty" / "x"), "x");
}

TEST(UserFiles, RefuseExistingNamesThePathAndATrailingSlashIsTheDirectory) {
  Scratch s;
  write(s.dir / "run" / "notes.txt", "mine");
  EXPECT_EQ(fsdp::checkpoint::without_trailing_slashes((s.dir / "run").string() + "//"), (s.dir / "run").string());
  EXPECT_EQ(fsdp::checkpoint::without_trailing_slashes("/"), "/");
  try {
    fsdp::checkpoint::refuse_existing(s.dir / "run", "--output-dir", "name another");
    FAIL() << "an existing directory with a file was not refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((s.dir / "run").string()), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(fsdp::checkpoint::refuse_existing(s.dir / "absent", "--output-dir", ""));
}

TEST(UserFiles, ANonUtf8ConfigStringIsRefusedNamingItsKey) {
  for (const std::string bad :
       {std::string("/data/caf\xe9"), std::string("runs/\xc0\xaf"), std::string("x\xed\xa0\x80")}) {
    try {
      fsdp::train::load_train_config(FSDP_SOURCE_DIR "/configs/gpt-fortunes-tiny.toml", {"data.dir=" + bad});
      FAIL() << "a non-UTF-8 data.dir was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("data.dir is not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(
      fsdp::train::load_train_config(FSDP_SOURCE_DIR "/configs/gpt-fortunes-tiny.toml", {"data.dir=/données/ü"}));
}

TEST(UserFiles, TomlStringKeepsBackslashesAndQuotes) {
  const std::string name = "runs\\new\"q";
  const fsdp::train::TrainConfig config = fsdp::train::load_train_config(
      FSDP_SOURCE_DIR "/configs/gpt-fortunes-tiny.toml", {"output_dir=" + fsdp::train::toml_string(name)});
  EXPECT_EQ(config.output_dir, name);
}

// A bitsandbytes quant_state whose nested_blocksize is 0 (or negative) is refused by name; before,
// it was divided by (SIGFPE, every rank) or skipped the size check.
TEST(UserFiles, ABnbQuantStateIsCheckedBeforeUse) {
  for (const int64_t nested : {int64_t{0}, int64_t{-256}}) {
    const std::string name = "w";
    const std::vector<int64_t> shape{4, 64};  // 256 values in 4 blocks of 64
    nlohmann::json state = {
        {"quant_type", "nf4"},        {"blocksize", 64},      {"dtype", "bfloat16"},      {"shape", shape},
        {"nested_blocksize", nested}, {"nested_offset", 0.0}, {"nested_dtype", "float32"}};
    const std::string text = state.dump();
    std::map<std::string, at::Tensor> tensors;
    tensors[name] = at::zeros({128, 1}, at::kByte);
    tensors[name + ".absmax"] = at::zeros({4}, at::kByte);
    tensors[name + ".quant_map"] =
        at::tensor(std::vector<float>(fsdp::shard::nf4_code().begin(), fsdp::shard::nf4_code().end()));
    tensors[name + ".nested_absmax"] = at::ones({1}, at::kFloat);
    tensors[name + ".nested_quant_map"] = fsdp::shard::dynamic_map_signed();
    at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
    std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
    tensors[name + ".quant_state.bitsandbytes__nf4"] = bytes;
    try {
      fsdp::checkpoint::read_bnb_4bit(
          "model.safetensors", name, shape, [&](const std::string& t) { return tensors.count(t) > 0; },
          [&](const std::string& t) { return tensors.at(t); });
      FAIL() << "nested_blocksize " << nested << " was taken";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("nested_blocksize " + std::to_string(nested)), std::string::npos)
          << e.what();
    }
  }
}

// A zero-length tensor at the offset where the next tensor starts overlaps nothing: a rank's empty
// slice of a small flat is saved so. The header lists "a" (bytes [0, 16)) before "b" (empty, at 0).
TEST(UserFiles, AnEmptyTensorAtTheNextOnesOffsetIsNoOverlap) {
  Scratch s;
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  std::string file(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(&file[0], &length, 8);
  file += header + std::string(16, '\0');
  write(s.dir / "x.safetensors", file);
  std::unique_ptr<fsdp::checkpoint::SafetensorsFile> opened;
  ASSERT_NO_THROW(opened = std::make_unique<fsdp::checkpoint::SafetensorsFile>((s.dir / "x.safetensors").string()));
  EXPECT_EQ(opened->read("b").numel(), 0);
  EXPECT_EQ(opened->read("a").numel(), 4);
}

// A manifest's or an index's file names stay inside their directory.
TEST(UserFiles, FileNamesFromManifestsAndIndexesStayInTheirDirectory) {
  EXPECT_EQ(fsdp::checkpoint::path_inside("/m", "model-00001-of-00002.safetensors", "index"),
            "/m/model-00001-of-00002.safetensors");
  EXPECT_EQ(fsdp::checkpoint::path_inside("/m", "sub/w.safetensors", "index"), "/m/sub/w.safetensors");
  for (const char* bad : {"/etc/passwd", "../secret.safetensors", "sub/../../x", ""}) {
    EXPECT_THROW(fsdp::checkpoint::path_inside("/m", bad, "index"), std::runtime_error) << bad;
  }
}

// A split pattern that backtracks without end (a hostile tokenizer.json) stops with a named error
// instead of stalling: (a+)+$ on 40 a's and a '!' needs about 2^40 steps.
TEST(UserFiles, ARunawayTokenizerPatternIsStoppedNamingIt) {
  const fsdp::data::UnicodeRegex regex("(a+)+$", "tokenizer.json");
  try {
    regex.find_all(std::string(40, 'a') + "!");
    FAIL() << "the runaway pattern finished";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("(a+)+$ took more than"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fsdp::data::UnicodeRegex("\\s+(?!\\S)|\\s+", "t").find_all(std::string(100000, ' ')).size(), 1u);
}

// A token file rewritten in place or shortened under a running job is a named error, not other
// tokens or SIGBUS; one replaced by rename (as fsdp-data writes) keeps the tokens the run opened.
TEST(UserFiles, ATokenFileChangedUnderTheRunIsANamedError) {
  Scratch s;
  const std::string path = (s.dir / "train.tok").string();
  fsdp::data::write_token_file(path, std::vector<int32_t>(5000, 7), 256);
  {
    const fsdp::data::TokenFile file(path);
    EXPECT_NE(file.fingerprint().find("10032 bytes, crc32 "), std::string::npos) << file.fingerprint();
    fsdp::data::write_token_file(path, std::vector<int32_t>(5000, 9), 256);  // beside, then renamed over
    EXPECT_EQ(file.read(0, 4).max().item<int64_t>(), 7);
  }
  const fsdp::data::TokenFile file(path);
  EXPECT_EQ(file.read(0, 4).max().item<int64_t>(), 9);
  ::truncate(path.c_str(), 5000);  // shortened in place
  try {
    file.read(0, 4);
    FAIL() << "a shortened token file was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("shrank from 10032 to 5000 bytes"), std::string::npos) << e.what();
  }
  // Rewritten in place, the same size: its modification time tells (the kernel's clock ticks in
  // milliseconds, so the rewrite waits for the next tick).
  fsdp::data::write_token_file(path, std::vector<int32_t>(5000, 7), 256);
  const fsdp::data::TokenFile reopened(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(40);
    out.put(static_cast<char>(3));
  }
  EXPECT_THROW(reopened.read(0, 4), std::runtime_error);
}

// "<|eot_id|>" written inside a message: the control token by default (as transformers'
// apply_chat_template then encode), its characters with data.split_special_tokens.
TEST(UserFiles, SpecialTokenTextInAMessageIsAControlTokenOnlyByDefault) {
  const std::string path = FSDP_SOURCE_DIR "/../shared/data/tokenizers/llama3/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "needs " << path;
  const fsdp::data::HfTokenizer tokenizer(path);
  const int32_t eot = tokenizer.token_id("<|eot_id|>");
  const fsdp::data::InstructionExample example{{{"user", "say <|eot_id|> please"}, {"assistant", "ok"}}, 0};
  auto count_eot = [&](fsdp::data::ContentSpecialTokens content) {
    const auto rendered = fsdp::data::render_chat(example, fsdp::data::ChatFormat::Llama3, tokenizer, content);
    return std::count(rendered.tokens.begin(), rendered.tokens.end(), eot);
  };
  EXPECT_EQ(count_eot(fsdp::data::ContentSpecialTokens::Control), 3);  // the user's, and the two turns' ends
  EXPECT_EQ(count_eot(fsdp::data::ContentSpecialTokens::Text), 2);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode_plain("say <|eot_id|> please")), "say <|eot_id|> please");
}

// A token file says which tokenizer made it; a corpus whose shards disagree is refused.
TEST(UserFiles, TokenFilesSayWhichTokenizerMadeThem) {
  Scratch s;
  const fsdp::data::TokenizerStamp hf{fsdp::data::TokenizerKind::Hf, 0xabc123};
  fs::create_directories(s.dir / "c");
  fsdp::data::write_token_file((s.dir / "c" / "shard-00000.tok").string(), {1, 2, 3}, 300, hf);
  EXPECT_EQ(fsdp::data::TokenFile((s.dir / "c" / "shard-00000.tok").string()).tokenizer_stamp(), hf);
  fsdp::data::write_token_file((s.dir / "old.tok").string(), {1, 2, 3}, 300);  // says nothing, as before
  EXPECT_FALSE(fsdp::data::TokenFile((s.dir / "old.tok").string()).tokenizer_stamp().known());
  fsdp::data::write_token_file((s.dir / "c" / "shard-00001.tok").string(), {1, 2, 3}, 300,
                               {fsdp::data::TokenizerKind::Hf, 0x123456});
  try {
    fsdp::data::TokenShards shards((s.dir / "c").string());
    FAIL() << "shards of two tokenizers were taken";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("crc32 ...abc123"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fsdp::data::ByteTokenizer().stamp(), (fsdp::data::TokenizerStamp{fsdp::data::TokenizerKind::Byte, 0}));
}

}  // namespace user_files_tests
