// The files of a run directory, which a user may edit, copy or damage: the first byte of the input
// picks the reader, the rest is the file.
//   0: metrics.jsonl, read for the report and rendered
//   1: skipped_batches.json (a rollback's record)
//   2: --set overrides, one a line, applied to a small config
//   3: a checkpoint's manifest.json, through its consumers: inspect's summary, the info a resume
//      reads, --resume latest's and the pruner's view of the checkpoints directory
//   4: run.json (read_run_id)
// Malformed input must throw, never crash.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/report/run_report.h"
#include "fsdp/train/config.h"
#include "fsdp/train/run_directory.h"
#include "train/rollback.h"

namespace {

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const std::string d = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/fsdp_fuzz_run_" +
                          std::to_string(::getpid());
    std::filesystem::create_directories(d + "/checkpoints");
    return d;
  }();
  return dir;
}

std::string put(const std::string& name, const std::string& text) {
  const std::string path = scratch_dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string dir = scratch_dir();
  try {
    switch (data[0] % 5) {
      case 0:
        put("metrics.jsonl", text);
        (void)fsdp::report::render_html({fsdp::report::read_run(dir)});
        break;
      case 1: (void)fsdp::train::read_skipped_batches(put("skipped_batches.json", text)); break;
      case 2: {
        const std::string config =
            put("fuzz.toml", "name = \"fuzz\"\n[model]\nname = \"gpt-test\"\n[train]\nsteps = 2\n");
        std::vector<std::string> overrides;
        std::istringstream lines(text);
        for (std::string line; std::getline(lines, line);) overrides.push_back(line);
        (void)fsdp::train::load_train_config(config, overrides);
        break;
      }
      case 3: {
        const std::string checkpoints = dir + "/checkpoints";
        std::filesystem::create_directories(checkpoints + "/step-00000001");
        put("checkpoints/step-00000001/manifest.json", text);
        (void)fsdp::checkpoint::find_latest_checkpoint(checkpoints, -1, "fuzz-run");
        fsdp::checkpoint::prune_checkpoints(checkpoints, 1, -1, "fuzz-run");
        (void)fsdp::checkpoint::describe_checkpoint(checkpoints + "/step-00000001");
        (void)fsdp::checkpoint::read_checkpoint_info(checkpoints + "/step-00000001");
        break;
      }
      case 4:
        put("run.json", text);
        (void)fsdp::train::read_run_id(dir);
        break;
    }
  } catch (const std::exception&) {
  }
  return 0;
}
