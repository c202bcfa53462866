#include "fsdp/checkpoint/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <system_error>
#include <functional>
#include <thread>

#include "fsdp/checkpoint/published_files.h"
#include "fsdp/checkpoint/safetensors.h"
#include "flat_ranges.h"
#include "manifest.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/comm/text_gather.h"
#include "shape_text.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Version 1 recorded one crc32 per rank file only: its files are checked whole when opened.
// Rank 0's file stores module buffers under this prefix: "buffer.bn.running_mean".
constexpr const char* kBufferPrefix = "buffer.";

// The rank file's entry for a device's generator state: "rng.cuda".
std::string device_rng_name(at::Device device) {
  return "rng." + c10::DeviceTypeName(device.type(), /*lower_case=*/true);
}

std::string rank_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", rank, world);
  return name;
}

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

json layout_json(const std::vector<shard::FlatParam*>& flats, int files) {
  json out = json::array();
  for (const shard::FlatParam* flat : flats) {
    json entries = json::array();
    for (const auto& e : flat->layout().entries) {
      entries.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}, {"numel", e.numel}});
    }
    json unit = {{"unit", flat->unit_name()},
                 {"trainable", flat->trainable()},
                 {"numel", flat->layout().numel},
                 {"entries", entries}};
    // A QLoRA base's files hold the bytes of its NF4 encoding (shard/nf4_storage.h), not values.
    if (flat->nf4_storage() != nullptr) unit["nf4_bytes"] = flat->nf4_storage()->bytes;
    unit["stored_per_file"] = stored_per_file(*flat, files);
    out.push_back(unit);
  }
  return out;
}

// The model's module buffers (BatchNorm's running statistics, ...), by their full names. Replicated:
// every rank holds the same values, so a checkpoint stores them once.
std::vector<std::pair<std::string, at::Tensor>> module_buffers(torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) buffers.emplace_back(item.key(), item.value());
  }
  return buffers;
}

json buffers_json(const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  json out = json::array();
  for (const auto& [name, tensor] : buffers) {
    out.push_back(
        {{"name", name}, {"shape", tensor.sizes().vec()}, {"dtype", safetensors_dtype_name(tensor.scalar_type())}});
  }
  return out;
}

json read_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / "manifest.json";
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("checkpoint '" + dir +
                             "': no manifest.json (not a checkpoint, or one whose save never finished)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_manifest(text.str(), dir);
}

// The description a manifest gives of its checkpoint (step, model, config, trainer state, run id).
CheckpointInfo info_of(const json& manifest) {
  CheckpointInfo info;
  info.step = manifest.at("step").get<int64_t>();
  info.model_name = manifest.value("model", "");
  info.config_toml = manifest.value("config_toml", "");
  info.trainer_state = manifest.value("trainer_state", "");
  info.run_id = manifest.value("run_id", "");
  return info;
}

// The checkpoint's layout must be the model's: same FlatParams, same parameters, shapes, offsets.
void check_layout(const std::string& dir, const json& saved, const std::vector<shard::FlatParam*>& flats) {
  if (saved.size() != flats.size()) {
    throw std::runtime_error("checkpoint '" + dir + "' holds " + std::to_string(saved.size()) +
                             " flat parameter groups but this model has " + std::to_string(flats.size()) +
                             " (a checkpoint of another model, or another wrap policy)");
  }
  for (size_t i = 0; i < flats.size(); ++i) {
    const auto& entries = flats[i]->layout().entries;
    const int64_t saved_nf4 = saved.at(i).value("nf4_bytes", int64_t{0});
    const int64_t nf4 = flats[i]->nf4_storage() != nullptr ? flats[i]->nf4_storage()->bytes : 0;
    if (saved_nf4 != nf4) {
      auto form = [](int64_t bytes) {
        return bytes > 0 ? "as NF4 (" + std::to_string(bytes) + " bytes)" : std::string("as values");
      };
      throw std::runtime_error("checkpoint '" + dir + "': unit '" + flats[i]->unit_name() + "' is stored " +
                               form(saved_nf4) + ", this run keeps it " + form(nf4) +
                               " (lora.base_dtype must be the one the checkpoint was written with)");
    }
    // The saved numel sizes the files' slices (stored_per_file is checked against it), so it must
    // be this unit's: entries alike but a numel not (a manifest edited by hand) would leave holes.
    if (saved.at(i).at("numel").get<int64_t>() != flats[i]->layout().numel) {
      throw std::runtime_error("checkpoint '" + dir + "': manifest.json gives unit '" + flats[i]->unit_name() +
                               "' numel " + saved.at(i).at("numel").dump() + ", its entries and this model " +
                               std::to_string(flats[i]->layout().numel));
    }
    const json& s = saved.at(i).at("entries");
    if (s.size() != entries.size()) {
      throw std::runtime_error("checkpoint '" + dir + "': unit '" + flats[i]->unit_name() + "' holds " +
                               std::to_string(s.size()) + " parameters in the checkpoint but " +
                               std::to_string(entries.size()) + " in this model (a checkpoint of another model)");
    }
    for (size_t j = 0; j < entries.size(); ++j) {
      const auto shape = s.at(j).at("shape").get<std::vector<int64_t>>();
      const auto name = s.at(j).at("name").get<std::string>();
      if (name != entries[j].name || shape != entries[j].shape ||
          s.at(j).at("offset").get<int64_t>() != entries[j].offset) {
        throw std::runtime_error("checkpoint '" + dir + "' was saved from another model: it holds " + name + " " +
                                 shape_text(shape) + " where this model has " + entries[j].name + " " +
                                 shape_text(entries[j].shape));
      }
    }
  }
}

// The checkpoint's buffers must be the model's: same names, shapes and dtypes (all or nothing).
void check_buffers(const std::string& dir, const json& saved,
                   const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  std::map<std::string, const json*> saved_by_name;
  for (const json& entry : saved) saved_by_name[entry.at("name").get<std::string>()] = &entry;
  for (const auto& [name, tensor] : buffers) {
    const std::string dtype = safetensors_dtype_name(tensor.scalar_type());
    const std::vector<int64_t> shape = tensor.sizes().vec();
    auto it = saved_by_name.find(name);
    if (it == saved_by_name.end()) {
      throw std::runtime_error("checkpoint '" + dir + "' holds no buffer '" + name + "' " + shape_text(shape) + " " +
                               dtype + " that this model has (a checkpoint of another model, or of one without it)");
    }
    const auto saved_shape = it->second->at("shape").get<std::vector<int64_t>>();
    const auto saved_dtype = it->second->at("dtype").get<std::string>();
    if (saved_shape != shape || saved_dtype != dtype) {
      throw std::runtime_error("checkpoint '" + dir + "' holds buffer '" + name + "' " + shape_text(saved_shape) + " " +
                               saved_dtype + " where this model has " + shape_text(shape) + " " + dtype);
    }
    saved_by_name.erase(it);
  }
  if (!saved_by_name.empty()) {
    throw std::runtime_error("checkpoint '" + dir + "' holds buffer '" + saved_by_name.begin()->first +
                             "' that this model does not have (a checkpoint of another model)");
  }
}

void pause_for_tests(int rank, int64_t step) {
  const char* ms = std::getenv("FSDP_TEST_PAUSE_IN_SAVE_MS");
  if (ms == nullptr) return;
  const char* which = std::getenv("FSDP_TEST_PAUSE_RANK");
  const char* at_step = std::getenv("FSDP_TEST_PAUSE_AT_STEP");
  if (rank != (which ? std::atoi(which) : 0) || (at_step != nullptr && std::atoll(at_step) != step)) return;
  std::fprintf(stderr, "[checkpoint test hook] rank %d (pid %d) pausing %s ms inside the save of step %lld\n", rank,
               static_cast<int>(::getpid()), ms, static_cast<long long>(step));
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(ms)));
}

// What rank `rank` of the `world` file writers saves: its slice of every FlatParam and of the
// optimizer state, rank 0 the module buffers too, and the RNG states (the CPU's; on a GPU the
// device's too, which dropout draws from).
std::vector<std::pair<std::string, at::Tensor>> saved_tensors(runtime::FsdpState& state,
                                                              optim::ShardedOptimizer* optimizer, int rank, int world) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const std::vector<shard::FlatParam*> flats = state.flat_params();
  for (size_t i = 0; i < flats.size(); ++i) {
    const auto [begin, end] = saved_range(stored_numel(*flats[i]), stored_per_file(*flats[i], world), rank);
    // What this rank stores is inside what it holds: replicated holds all; sharded holds exactly it.
    const auto [held_begin, held_end] = held_range(*flats[i]);
    if (begin < held_begin || end > held_end) {
      throw std::logic_error("checkpoint: rank file " + std::to_string(rank) + " of " + std::to_string(world) +
                             " stores [" + std::to_string(begin) + ", " + std::to_string(end) + ") of unit '" +
                             flats[i]->unit_name() + "', and its writer holds [" + std::to_string(held_begin) + ", " +
                             std::to_string(held_end) + ")");
    }
    const int64_t offset = begin - held_begin;
    tensors.emplace_back("p" + std::to_string(i) + ".param", flats[i]->shard().narrow(0, offset, end - begin));
    if (optimizer == nullptr) continue;
    for (size_t slot = 0; slot < optimizer->slot_count(); ++slot) {
      if (optimizer->flat_of_slot(slot) != flats[i]) continue;
      const auto names = optimizer->state_names();
      for (size_t w = 0; w < names.size(); ++w) {
        tensors.emplace_back("p" + std::to_string(i) + "." + names[w],
                             optimizer->state_tensor(slot, w).narrow(0, offset, end - begin));
      }
    }
  }
  if (rank == 0) {
    for (const auto& [name, buffer] : module_buffers(state.root_module()))
      tensors.emplace_back(kBufferPrefix + name, buffer.detach());
  }
  tensors.emplace_back("rng", at::detail::getDefaultCPUGenerator().get_state());
  const at::Device device = state.options().device;
  if (!device.is_cpu())
    tensors.emplace_back(device_rng_name(device), at::globalContext().defaultGenerator(device).get_state());
  return tensors;
}

// Replaces each tensor by a copy in host memory (pinned beside a GPU; `staging`'s reused buffers
// where given), which a background writer reads while the step changes the originals. Returns the
// copies' bytes.
int64_t stage_copies(std::vector<std::pair<std::string, at::Tensor>>& tensors, at::Device device,
                     StagingBuffers* staging) {
  at::NoGradGuard no_grad;  // the copies are data, not part of any graph
  const bool pinned = !device.is_cpu();
  int64_t bytes = 0;
  for (auto& [name, tensor] : tensors) {
    at::Tensor copy = staging != nullptr
                          ? staging->buffer_for(name, tensor, pinned)
                          : at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(pinned));
    copy.copy_(tensor);
    bytes += static_cast<int64_t>(copy.nbytes());
    tensor = copy;
  }
  return bytes;
}

// Runs `write` on `thread`, or here when no thread can be had (resource limits: this rank then
// writes in the step; the others need not know, as publication agrees on having written alike).
// At the training's own priority: on this 2-core VM, where two ranks keep both cores busy, a writer
// at SCHED_IDLE or nice 10 hardly ran (15-18 s for 1 GB, so the next save waited for it); at nice 0
// it takes 7 s and slows the steps beside it (docs/benchmarks.md). Beside a GPU the cores are free
// for it. SIGTERM/SIGINT stay with the training threads (their handler asks the step loop to stop
// and save): the writer is started with them blocked, and a thread inherits its creator's mask.
void start_writer(std::thread& thread, const std::function<void()>& write) {
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  try {
    thread = std::thread(write);
  } catch (const std::system_error&) {
    write();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

}  // namespace

CheckpointSave::CheckpointSave(const std::string& checkpoints_dir, runtime::FsdpState& state,
                               optim::ShardedOptimizer* optimizer, const CheckpointInfo& info, bool in_background,
                               StagingBuffers* staging)
    : group_(state.group()),
      writers_(state.shard_group()),
      checkpoints_dir_(checkpoints_dir),
      info_(info),
      flats_layout_(layout_json(state.flat_params(), state.shard_group()->size()).dump()),
      buffers_(buffers_json(module_buffers(state.root_module())).dump()),
      optimizer_name_(optimizer ? optimizer->name() : ""),
      optimizer_state_(optimizer ? optimizer->state_names() : std::vector<std::string>{}),
      optimizer_steps_(optimizer ? optimizer->step_count() : 0),
      directory_((fs::path(checkpoints_dir) / step_dir_name(info.step)).string()) {
  // Every rank agrees on success; one copy of the model writes the files: the shard group of
  // replica group 0 (the whole job unless hybrid_shard, whose replicas hold the same shards).
  // `rank` and `world` below number the files: ranks of that shard group.
  const bool writes_files = state.replica_index() == 0;
  const int rank = writers_->rank(), world = writers_->size();
  const fs::path partial_dir = fs::path(checkpoints_dir) / (step_dir_name(info.step) + ".partial");

  comm::on_every_rank(group_, "preparing the checkpoint directory", [&] {
    if (group_->rank() == 0) {
      fs::create_directories(checkpoints_dir);
      fs::remove_all(partial_dir);
      fs::create_directories(partial_dir);
    }
  });

  // Each rank: its slice of every FlatParam and of the optimizer state, and its RNG state; rank 0
  // also the module buffers. In the background, copies of them: the step goes on changing the
  // originals while the file is written.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  comm::on_every_rank(group_, "staging checkpoint shards", [&] {
    if (!writes_files) return;
    tensors = saved_tensors(state, optimizer, rank, world);
    if (in_background) staged_bytes_ = stage_copies(tensors, state.options().device, staging);
  });

  // Writing the rank file: {"bytes", "crc32", "tensors": {name: crc32}} for the manifest.
  auto write = [this, tensors = std::move(tensors), writes_files, partial_dir, rank, world] {
    try {
      if (writes_files) {
        pause_for_tests(group_->rank(), info_.step);
        SafetensorsWriter writer((partial_dir / rank_file_name(rank, world)).string(), layout_tensors(tensors),
                                 {{"rank", std::to_string(rank)}, {"world_size", std::to_string(world)}});
        for (const auto& [name, tensor] : tensors) writer.write(name, tensor);
        writer.finish();
        file_facts_ =
            json{{"bytes", writer.bytes_written()}, {"crc32", writer.crc32()}, {"tensors", writer.tensor_crc32s()}}
                .dump();
      }
    } catch (const std::exception& e) {
      write_error_ = e.what()[0] != '\0' ? e.what() : "unknown error";
    }
    written_.store(true);
  };
  if (in_background) {
    start_writer(writer_, write);
  } else {
    write();
  }
}

CheckpointSave::~CheckpointSave() {
  // Not published (an error stopped the run): the write is waited for and its .partial left,
  // which no load takes and the next save removes.
  if (writer_.joinable()) writer_.join();
}

bool CheckpointSave::try_publish() {
  if (!published_.empty()) return true;
  // Every rank's view, agreed: the most unfinished (any rank still writing holds every rank back).
  at::Tensor unfinished = at::tensor({written_.load() ? 0.0f : 1.0f}, at::kFloat);
  if (group_->size() > 1) group_->all_reduce(unfinished, comm::ReduceOp::Max)->wait();
  if (unfinished.item<float>() > 0) return false;
  publish();
  return true;
}

std::string CheckpointSave::wait_and_publish() {
  if (!published_.empty()) return published_;
  if (writer_.joinable()) writer_.join();
  publish();
  return published_;
}

void CheckpointSave::publish() {
  if (writer_.joinable()) writer_.join();  // written_: the thread is ending, if not ended
  comm::on_every_rank(group_, "writing checkpoint shards", [&] {
    if (!write_error_.empty()) throw std::runtime_error(write_error_);
  });
  // Every replica group gathers its own; replica group 0's (the writers') are kept.
  const std::vector<std::string> all_facts = comm::all_gather_text(writers_, file_facts_);
  const int world = writers_->size();
  const fs::path final_dir = fs::path(checkpoints_dir_) / step_dir_name(info_.step);
  const fs::path partial_dir = fs::path(checkpoints_dir_) / (step_dir_name(info_.step) + ".partial");

  // Rank 0 (a writer) publishes: the manifest (file checksums), then the rename that makes it visible.
  comm::on_every_rank(group_, "publishing the checkpoint", [&] {
    if (group_->rank() != 0) return;
    json files = json::array();
    for (int r = 0; r < world; ++r) {
      const json facts = json::parse(all_facts[r]);
      files.push_back({{"rank", r},
                       {"file", rank_file_name(r, world)},
                       {"bytes", facts.at("bytes")},
                       {"crc32", facts.at("crc32")},
                       {"tensors", facts.at("tensors")}});
    }
    json manifest = {{"format", kManifestFormat},
                     {"version", kCheckpointFormatVersion},
                     {"step", info_.step},
                     {"world_size", world},
                     {"model", info_.model_name},
                     {"config_toml", info_.config_toml},
                     {"trainer_state", info_.trainer_state},
                     {"run_id", info_.run_id},
                     {"optimizer", optimizer_name_},
                     {"optimizer_state", optimizer_state_},
                     {"optimizer_steps", optimizer_steps_},
                     {"flat_params", json::parse(flats_layout_)},
                     {"buffers", json::parse(buffers_)},
                     {"files", files}};
    const fs::path manifest_path = partial_dir / "manifest.json";
    {
      std::ofstream out(manifest_path);
      out << manifest.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
      out.flush();
      if (!out) throw std::runtime_error("cannot write '" + manifest_path.string() + "'");
    }
    fsync_path(manifest_path);
    fsync_path(partial_dir);
    // An older save of the same step (a rollback's or a resume's) is swapped out atomically: at no
    // moment is there no checkpoint of this step. Another run's (a checkpoint.dir two runs share)
    // is never replaced.
    std::error_code exists_error;
    if (!info_.run_id.empty() && fs::exists(final_dir / "manifest.json", exists_error)) {
      std::string owner;
      try {
        std::ifstream in(final_dir / "manifest.json");
        owner = json::parse(in).value("run_id", "");
      } catch (const std::exception&) {
      }
      if (!owner.empty() && owner != info_.run_id) {
        throw std::runtime_error("'" + final_dir.string() + "' is a checkpoint of another run (" + owner +
                                 "): not replaced; give this run a checkpoint.dir of its own (this save is left at '" +
                                 partial_dir.string() + "')");
      }
    }
    checkpoint::publish(partial_dir, final_dir, /*replace=*/true);
  });
  published_ = final_dir.string();
}

std::string save_checkpoint(const std::string& checkpoints_dir, runtime::FsdpState& state,
                            optim::ShardedOptimizer* optimizer, const CheckpointInfo& info) {
  return CheckpointSave(checkpoints_dir, state, optimizer, info, /*in_background=*/false).wait_and_publish();
}

namespace {

// A checkpoint's rank files, opened as they are needed, and its tensors read from them, each
// checked before it is used: every file against the manifest's size (version 1: its crc32 whole),
// every tensor against its crc32 (version 2).
class CheckpointFiles {
 public:
  CheckpointFiles(const std::string& dir, const json& manifest)
      : dir_(dir),
        files_(manifest.at("files")),
        version_(manifest.at("version").get<int>()),
        saved_world_(manifest.at("world_size").get<int>()) {
    if (static_cast<int>(files_.size()) != saved_world_) {
      throw std::runtime_error("checkpoint '" + dir_ + "': manifest lists " + std::to_string(files_.size()) +
                               " files for " + std::to_string(saved_world_) + " ranks");
    }
    for (const json& unit : manifest.at("flat_params")) per_file_.push_back(stored_per_file_of(unit, manifest));
  }
  int saved_world() const { return saved_world_; }

  SafetensorsFile& file(int r) {
    auto it = open_.find(r);
    if (it != open_.end()) return *it->second;
    const json& entry = files_.at(r);
    const std::string path =
        path_inside(dir_, entry.at("file").get<std::string>(), "checkpoint '" + dir_ + "': manifest.json");
    auto file = std::make_unique<SafetensorsFile>(path);
    if (file->file_bytes() != entry.at("bytes").get<int64_t>()) {
      throw std::runtime_error("checkpoint file '" + path + "' holds " + std::to_string(file->file_bytes()) +
                               " bytes, the manifest says " + std::to_string(entry.at("bytes").get<int64_t>()) +
                               ": truncated or replaced");
    }
    if (version_ == 1) {
      const uint32_t crc = file->file_crc32();
      if (crc != entry.at("crc32").get<uint32_t>()) {
        throw std::runtime_error("checkpoint file '" + path + "' fails its checksum (crc32 " + std::to_string(crc) +
                                 ", manifest says " + std::to_string(entry.at("crc32").get<uint32_t>()) +
                                 "): corrupt or replaced");
      }
    }
    return *open_.emplace(r, std::move(file)).first->second;
  }

  // Saved tensor `name` of rank r's file, whole, checked against its crc32.
  at::Tensor read_checked(int r, const std::string& name) {
    SafetensorsFile& f = file(r);
    at::Tensor tensor = f.read(name);
    if (version_ == 1) return tensor;  // the whole file was checked when opened
    const json& crcs = files_.at(r).at("tensors");
    if (!crcs.contains(name)) {
      throw std::runtime_error("checkpoint file '" + f.path() + "': the manifest holds no checksum for tensor '" +
                               name + "'");
    }
    const uint32_t crc = crc32_of_bytes(tensor), expected = crcs.at(name).get<uint32_t>();
    if (crc != expected) {
      throw std::runtime_error("checkpoint file '" + f.path() + "': tensor '" + name + "' fails its checksum (crc32 " +
                               std::to_string(crc) + ", manifest says " + std::to_string(expected) +
                               "): corrupt or replaced");
    }
    return tensor;
  }

  // Elements [begin, end) of FlatParam `flat_index`'s tensor (param or optimizer state), from the
  // saved pieces that overlap them: each such piece is read whole (its checksum covers all of it).
  at::Tensor gather(const shard::FlatParam& flat, size_t flat_index, const std::string& tensor_suffix, int64_t begin,
                    int64_t end) {
    // An NF4 base is stored as its bytes, anything else as values (read as fp32, kept in the shard's dtype).
    const bool nf4 = flat.nf4_storage() != nullptr;
    at::Tensor out = at::empty({end - begin}, nf4 ? at::kByte : at::kFloat);
    const int64_t numel = stored_numel(flat);
    const std::string name = "p" + std::to_string(flat_index) + "." + tensor_suffix;
    for (int r = 0; r < saved_world_; ++r) {
      const auto [b, e] = saved_range(numel, per_file_.at(flat_index), r);
      const int64_t lo = std::max(b, begin), hi = std::min(e, end);
      if (lo >= hi) continue;
      const at::Tensor piece = read_checked(r, name);
      if ((piece.scalar_type() == at::kByte) != nf4) {
        throw std::runtime_error("checkpoint file '" + file(r).path() + "': unit '" + flat.unit_name() +
                                 "' is stored " +
                                 (nf4 ? "as values (" + std::string(c10::toString(piece.scalar_type())) + ")"
                                      : std::string("as NF4 bytes")) +
                                 ", and this run keeps that unit's frozen base " + (nf4 ? "in NF4" : "as values") +
                                 " (lora.base_dtype must be the one the checkpoint was written with)");
      }
      if (piece.numel() != e - b) {
        throw std::runtime_error("checkpoint file '" + file(r).path() + "': tensor '" + name + "' holds " +
                                 std::to_string(piece.numel()) + " elements, the layout says " + std::to_string(e - b));
      }
      out.narrow(0, lo - begin, hi - lo).copy_(piece.narrow(0, lo - b, hi - lo));
    }
    return out;
  }

 private:
  std::string dir_;
  const json& files_;
  int version_ = 0, saved_world_ = 0;
  std::vector<int64_t> per_file_;  // per unit: elements (NF4: bytes) each rank file holds
  std::map<int, std::unique_ptr<SafetensorsFile>> open_;
};

// What a rank reads from a checkpoint before any of it is copied in.
struct LoadedState {
  std::vector<at::Tensor> params;                        // per FlatParam: the elements this rank holds
  std::vector<std::vector<at::Tensor>> optimizer_state;  // per optimizer slot: each state tensor's held elements
  int64_t optimizer_steps = 0;
  std::vector<at::Tensor> buffer_values;  // module buffers, replicated (rank 0's file)
  at::Tensor rng, device_rng;             // this rank's generators, at the same world size only
};

// The manifest's description, checked against this run's layout, buffers and optimizer.
CheckpointInfo checked_manifest_info(const std::string& dir, const json& manifest,
                                     const std::vector<shard::FlatParam*>& flats,
                                     const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                                     const optim::ShardedOptimizer* optimizer) {
  CheckpointInfo info = info_of(manifest);
  check_layout(dir, manifest.at("flat_params"), flats);
  check_buffers(dir, manifest.value("buffers", json::array()), buffers);  // version 1: none
  if (optimizer != nullptr) {
    const auto saved_names = manifest.value("optimizer_state", std::vector<std::string>{});
    if (manifest.value("optimizer", "") != optimizer->name() || saved_names != optimizer->state_names()) {
      throw std::runtime_error("checkpoint '" + dir + "' holds " + manifest.value("optimizer", "no") +
                               " optimizer state; this run uses " + optimizer->name());
    }
  }
  return info;
}

// Reads what this rank needs (its shards' elements, the optimizer state, buffers, generators).
// Only the files that hold part of it are opened, and from them only the tensors it needs.
LoadedState read_rank_state(CheckpointFiles& files, const json& manifest, const std::vector<shard::FlatParam*>& flats,
                            const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                            optim::ShardedOptimizer* optimizer, int rank, int world, at::Device device) {
  LoadedState loaded;
  loaded.params.resize(flats.size());
  for (size_t i = 0; i < flats.size(); ++i) {
    const auto [begin, end] = held_range(*flats[i]);
    loaded.params[i] = files.gather(*flats[i], i, "param", begin, end);
  }
  if (optimizer != nullptr) {
    loaded.optimizer_steps = manifest.value("optimizer_steps", int64_t{0});
    loaded.optimizer_state.resize(optimizer->slot_count());
    const auto names = optimizer->state_names();
    for (size_t slot = 0; slot < optimizer->slot_count(); ++slot) {
      const size_t i = std::find(flats.begin(), flats.end(), optimizer->flat_of_slot(slot)) - flats.begin();
      const auto [begin, end] = held_range(*flats[i]);
      for (const auto& name : names)
        loaded.optimizer_state[slot].push_back(files.gather(*flats[i], i, name, begin, end));
    }
  }
  // Buffers are replicated: every rank reads them from rank 0's file.
  loaded.buffer_values.resize(buffers.size());
  for (size_t k = 0; k < buffers.size(); ++k) {
    loaded.buffer_values[k] = files.read_checked(0, kBufferPrefix + buffers[k].first);
    if (loaded.buffer_values[k].sizes() != buffers[k].second.sizes() ||
        loaded.buffer_values[k].scalar_type() != buffers[k].second.scalar_type()) {
      throw std::runtime_error("checkpoint file '" + files.file(0).path() + "': tensor '" + kBufferPrefix +
                               buffers[k].first + "' differs in shape or dtype from what the manifest lists");
    }
  }
  if (files.saved_world() == world) {
    loaded.rng = files.read_checked(rank, "rng");
    // A checkpoint saved on the CPU, resumed on a GPU, leaves the device's generator as seeded.
    if (!device.is_cpu() && files.file(rank).contains(device_rng_name(device))) {
      loaded.device_rng = files.read_checked(rank, device_rng_name(device));
    }
  }
  return loaded;
}

// Every rank read its pieces: now they are copied in (padding stays as it is: zeros).
void install(const LoadedState& loaded, const std::vector<shard::FlatParam*>& flats,
             const std::vector<std::pair<std::string, at::Tensor>>& buffers, optim::ShardedOptimizer* optimizer,
             at::Device device) {
  for (size_t i = 0; i < flats.size(); ++i)
    flats[i]->shard().narrow(0, 0, loaded.params[i].numel()).copy_(loaded.params[i]);
  if (optimizer != nullptr) {
    for (size_t slot = 0; slot < optimizer->slot_count(); ++slot) {
      for (size_t w = 0; w < loaded.optimizer_state[slot].size(); ++w) {
        at::Tensor& target = optimizer->state_tensor(slot, w);
        target.zero_();
        target.narrow(0, 0, loaded.optimizer_state[slot][w].numel()).copy_(loaded.optimizer_state[slot][w]);
      }
    }
    optimizer->set_step_count(loaded.optimizer_steps);
  }
  {
    at::NoGradGuard no_grad;  // a buffer that requires grad (none usually does) is still restored in place
    for (size_t k = 0; k < buffers.size(); ++k) buffers[k].second.copy_(loaded.buffer_values[k]);
  }
  if (loaded.rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle on the global generator
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(loaded.rng);
  }
  if (loaded.device_rng.defined()) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(loaded.device_rng);
  }
}

}  // namespace

CheckpointInfo load_checkpoint(const std::string& checkpoint_dir, runtime::FsdpState& state,
                               optim::ShardedOptimizer* optimizer) {
  const comm::ProcessGroupPtr& group = state.group();
  const std::vector<shard::FlatParam*> flats = state.flat_params();
  const std::vector<std::pair<std::string, at::Tensor>> buffers = module_buffers(state.root_module());
  const at::Device device = state.options().device;
  CheckpointInfo info;
  LoadedState loaded;
  // Read everything into new tensors first; only when every rank succeeded are they copied in.
  comm::on_every_rank(group, "loading checkpoint '" + checkpoint_dir + "'", [&] {
    const json manifest = read_manifest(checkpoint_dir);
    info = checked_manifest_info(checkpoint_dir, manifest, flats, buffers, optimizer);
    CheckpointFiles files(checkpoint_dir, manifest);
    loaded = read_rank_state(files, manifest, flats, buffers, optimizer, group->rank(), group->size(), device);
  });
  install(loaded, flats, buffers, optimizer, device);
  return info;
}

namespace {
// "step-00000012" -> 12; -1 for any other name (a user's "step-00000500-best" or ".bak" copy, a
// ".partial", more digits than an int64 holds).
int64_t step_of_name(const std::string& name) {
  if (name.size() <= 5 || name.size() > 5 + 18 || name.rfind("step-", 0) != 0) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  return std::stoll(name.substr(5));
}

// The run id a published checkpoint's manifest names ("" for checkpoints before run ids, or an
// unreadable manifest: then it belongs to no run in particular).
std::string manifest_run_id(const fs::path& dir) {
  try {
    std::ifstream in(dir / "manifest.json");
    const json manifest = json::parse(in);
    return manifest.value("run_id", "");
  } catch (const std::exception&) {
    return "";
  }
}

struct PublishedCheckpoint {
  int64_t step;
  fs::path path;
};

// The published checkpoints under `dir` (named step-<digits>, holding a manifest) of run `run_id`
// ("" : of any run; a checkpoint saved before run ids counts as every run's), by step.
std::vector<PublishedCheckpoint> published_checkpoints(const std::string& dir, const std::string& run_id) {
  std::vector<PublishedCheckpoint> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return found;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step < 0 || !entry.is_directory(error) || entry.is_symlink(error)) continue;
    if (!fs::is_regular_file(entry.path() / "manifest.json", error)) continue;
    if (!run_id.empty()) {
      const std::string owner = manifest_run_id(entry.path());
      if (!owner.empty() && owner != run_id) continue;
    }
    found.push_back({step, entry.path()});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}
}  // namespace

std::string find_latest_checkpoint(const std::string& checkpoints_dir, int64_t max_step, const std::string& run_id) {
  std::string best;
  for (const auto& c : published_checkpoints(checkpoints_dir, run_id)) {
    if (max_step < 0 || c.step <= max_step) best = c.path.string();
  }
  return best;
}

void remove_checkpoints_after(const std::string& checkpoints_dir, int64_t step, const std::string& run_id) {
  std::error_code error;
  for (const auto& c : published_checkpoints(checkpoints_dir, run_id)) {
    if (c.step > step) fs::remove_all(c.path, error);
  }
}

void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep, int64_t keep_at_or_before,
                       const std::string& run_id) {
  std::error_code error;
  if (!fs::is_directory(checkpoints_dir, error)) return;
  // Leftovers of this code's own interrupted saves: exactly step-<digits>.partial.
  std::vector<fs::path> leftovers;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, error)) {
    const std::string name = entry.path().filename().string();
    const size_t suffix = name.size() >= 8 ? name.size() - 8 : 0;
    if (suffix > 0 && name.compare(suffix, 8, ".partial") == 0 && step_of_name(name.substr(0, suffix)) >= 0 &&
        entry.is_directory(error) && !entry.is_symlink(error)) {
      leftovers.push_back(entry.path());
    }
  }
  for (const auto& path : leftovers) fs::remove_all(path, error);
  if (keep <= 0) return;
  const std::vector<PublishedCheckpoint> published = published_checkpoints(checkpoints_dir, run_id);
  const std::string kept_for_rollback =
      keep_at_or_before >= 0 ? find_latest_checkpoint(checkpoints_dir, keep_at_or_before, run_id) : std::string();
  for (size_t i = 0; static_cast<int64_t>(i) + keep < static_cast<int64_t>(published.size()); ++i) {
    if (!kept_for_rollback.empty() && fs::path(kept_for_rollback) == published[i].path) continue;
    fs::remove_all(published[i].path, error);
  }
}

CheckpointInfo read_checkpoint_info(const std::string& checkpoint_dir) {
  return info_of(read_manifest(checkpoint_dir));
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(fs::path(path) / "manifest.json", error);
}

namespace {
// A manifest's string as a terminal may show it: control characters (an escape sequence that
// would move the cursor or retitle the window) as \xNN.
std::string shown(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out;
}
std::string shown(const json& value) { return shown(value.is_string() ? value.get<std::string>() : value.dump()); }
}  // namespace

std::string describe_checkpoint(const std::string& checkpoint_dir) {
  const json manifest = read_manifest(checkpoint_dir);
  std::ostringstream out;
  int64_t parameters = 0;  // each numel is validated >= 0; a crafted sum past int64 is refused
  for (const auto& flat : manifest.at("flat_params")) {
    if (__builtin_add_overflow(parameters, flat.at("numel").get<int64_t>(), &parameters))
      throw std::runtime_error("checkpoint '" + checkpoint_dir +
                               "': manifest.json: the units' numel add up past int64");
  }
  out << shown(checkpoint_dir) << ": step " << manifest.at("step") << ", model " << shown(manifest.value("model", "?"))
      << ", " << parameters << " parameters in " << manifest.at("flat_params").size() << " flat groups, saved by "
      << manifest.at("world_size") << " ranks, optimizer " << shown(manifest.value("optimizer", "none")) << " ("
      << manifest.value("optimizer_steps", 0) << " steps)";
  if (!manifest.value("run_id", "").empty()) out << ", run " << shown(manifest.value("run_id", ""));
  out << "\n";
  for (const auto& file : manifest.at("files")) {
    out << "  " << shown(file.at("file")) << "  " << file.at("bytes") << " bytes  crc32 " << file.at("crc32");
    if (file.contains("tensors")) out << "  " << file.at("tensors").size() << " tensors, each with its crc32";
    out << "\n";
  }
  for (const auto& buffer : manifest.value("buffers", json::array())) {
    out << "  buffer " << shown(buffer.at("name")) << " " << shape_text(buffer.at("shape").get<std::vector<int64_t>>())
        << " " << shown(buffer.at("dtype")) << " (in rank 0's file)\n";
  }
  for (const auto& flat : manifest.at("flat_params")) {
    out << "  unit " << shown(flat.at("unit")) << (flat.at("trainable").get<bool>() ? "" : " (frozen)") << ": "
        << flat.at("numel") << " elements\n";
    for (const auto& e : flat.at("entries")) {
      out << "    " << shown(e.at("name")) << " " << shape_text(e.at("shape").get<std::vector<int64_t>>()) << " at "
          << e.at("offset") << "\n";
    }
  }
  return out.str();
}

}  // namespace fsdp::checkpoint
