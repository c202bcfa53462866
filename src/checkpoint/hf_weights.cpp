#include "fsdp/checkpoint/hf_weights.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "bnb_4bit_weight.h"
#include "fsdp/checkpoint/hf_model_dir.h"
#include "fsdp/checkpoint/published_files.h"
#include "fsdp/checkpoint/safetensors.h"
#include "flat_ranges.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/shard/nf4_storage.h"
#include "fsdp/shard/host_heap.h"
#include "shape_text.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The weights a file set offers: tensor name -> file.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& path) : source_(path) {
    std::error_code error;
    if (fs::is_directory(path, error)) {
      const fs::path index = fs::path(path) / "model.safetensors.index.json";
      if (fs::exists(index)) {
        nlohmann::json json;
        std::ifstream in(index);
        try {
          in >> json;
        } catch (const std::exception& e) {
          throw std::runtime_error("weights index '" + index.string() + "' is not valid JSON: " + e.what());
        }
        for (const auto& [name, file] : json.at("weight_map").items()) {
          add(name, path_inside(path, file.get<std::string>(),
                                "weights index '" + index.string() + "' (tensor '" + name + "')"));
        }
        return;
      }
      const fs::path single = fs::path(path) / "model.safetensors";
      if (!fs::exists(single)) {
        throw std::runtime_error("weights directory '" + path +
                                 "' holds neither model.safetensors.index.json nor model.safetensors");
      }
      add_file(single.string());
      return;
    }
    add_file(path);
  }

  bool contains(const std::string& tensor) const { return where_.count(tensor) > 0; }
  // Every tensor's declaration, across the files.
  std::vector<TensorInfo> tensors() const {
    std::vector<TensorInfo> out;
    for (const auto& [name, file] : where_) out.push_back(files_.at(file)->info(name));
    return out;
  }

  const SafetensorsFile& file_of(const std::string& tensor) const {
    auto it = where_.find(tensor);
    if (it == where_.end()) throw std::runtime_error("weights '" + source_ + "' have no tensor '" + tensor + "'");
    return *files_.at(it->second);
  }

 private:
  void add_file(const std::string& file) {
    auto& opened = open(file);
    for (const auto& info : opened.tensors()) where_[info.name] = file;
  }
  void add(const std::string& tensor, const std::string& file) {
    open(file);
    where_[tensor] = file;
  }
  SafetensorsFile& open(const std::string& file) {
    auto it = files_.find(file);
    if (it == files_.end()) it = files_.emplace(file, std::make_unique<SafetensorsFile>(file)).first;
    return *it->second;
  }
  std::string source_;  // the file or directory named
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::string> where_;
};

std::vector<int64_t> stored_shape(const std::vector<int64_t>& shape, bool transposed) {
  if (!transposed) return shape;
  return {shape[1], shape[0]};
}

}  // namespace

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::string hf_name(const models::ModelConfig& model, const std::string& name) {
  return models::family_of(model).hf_name(model, name);
}

std::vector<std::string> hf_other_names(const models::ModelConfig& model, const std::string& hf) {
  return models::family_of(model).hf_other_names(model, hf);
}

bool hf_transposed(const models::ModelConfig& model, const std::string& name) {
  return models::family_of(model).hf_transposed(model, name);
}

namespace {

// The adapters' full tensors by name ("layers.0.self_attn.q_proj.lora_A.weight" -> [r, in] fp32)
// on the writing rank (empty elsewhere): small, rank x (in + out) per layer. Collective.
std::map<std::string, at::Tensor> gathered_adapters(runtime::FsdpState& state, bool writer_rank) {
  std::map<std::string, at::Tensor> adapters;
  for (auto* flat : state.flat_params()) {
    if (!flat->trainable()) continue;
    std::vector<at::Tensor> full = flat->gather_full_params();  // collective
    for (size_t e = 0; e < full.size(); ++e) {
      if (is_adapter(flat->layout().entries[e].name) && writer_rank) {
        adapters[flat->layout().entries[e].name] = full[e].to(at::kFloat);
      }
    }
  }
  return adapters;
}

// Where each exported tensor goes: its flat parameter and entry, its declaration, and its file.
struct PlannedTensor {
  size_t flat, entry;
  TensorInfo info;
  int file;
};
struct ExportPlan {
  std::vector<PlannedTensor> tensors;
  std::vector<int64_t> file_bytes;  // [files]
};

// Declarations from the layouts alone, so every file's header is known before any gather: the
// tensors under Hugging Face names in `dtype`, a new file whenever max_file_bytes would be passed.
ExportPlan plan_export(runtime::FsdpState& state, const models::ModelConfig& model, const ExportOptions& options) {
  const auto element = static_cast<int64_t>(c10::elementSize(options.dtype));
  ExportPlan plan;
  plan.file_bytes.push_back(0);
  const auto flats = state.flat_params();
  for (size_t f = 0; f < flats.size(); ++f) {
    for (size_t e = 0; e < flats[f]->layout().entries.size(); ++e) {
      const auto& entry = flats[f]->layout().entries[e];
      if (is_adapter(entry.name)) continue;  // merged into their layers' weights
      PlannedTensor p{f, e, {}, 0};
      p.info.name = hf_name(model, entry.name);
      p.info.dtype = options.dtype;
      p.info.shape = stored_shape(entry.shape, hf_transposed(model, entry.name));
      const int64_t bytes = entry.numel * element;
      const int64_t current = plan.file_bytes.back();
      if (options.max_file_bytes > 0 && current > 0 && current + bytes > options.max_file_bytes) {
        plan.file_bytes.push_back(0);
      }
      p.file = static_cast<int>(plan.file_bytes.size()) - 1;
      p.info.begin = plan.file_bytes.back();
      p.info.end = p.info.begin + bytes;
      plan.file_bytes.back() += bytes;
      plan.tensors.push_back(std::move(p));
    }
  }
  return plan;
}

}  // namespace

int64_t export_weights(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& path,
                       const ExportOptions& options) {
  const comm::ProcessGroupPtr& group = state.group();
  const bool writer_rank = group->rank() == 0;
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16) {
    throw std::invalid_argument("export_weights: dtype must be fp32 or bf16");
  }
  const models::LoraSpec* lora = models::lora_spec(model);
  if (lora != nullptr && lora->enabled() && !options.merge_lora) {
    throw std::invalid_argument(
        "export_weights: the model has LoRA adapters: merge them into the weights (--merge), "
        "or export the adapters alone (--peft-dir)");
  }
  // Merging: the adapters first, by name. Each layer's full-size delta scale B A is computed on the
  // writing rank just before its weight is written, so no rank ever holds more than one (Llama 3
  // 8B's seven projections x 32 layers would be 28 GB).
  const std::map<std::string, at::Tensor> adapters =
      lora != nullptr && lora->enabled() ? gathered_adapters(state, writer_rank) : std::map<std::string, at::Tensor>{};
  // W + scale B A for an adapted weight `name` ("layers.0.self_attn.q_proj.weight"), else W as it is.
  auto merged = [&](const std::string& name, const at::Tensor& weight) {
    const std::string layer = name.substr(0, name.size() - std::string(".weight").size());
    auto a = adapters.find(layer + ".lora_A.weight");
    if (!ends_with(name, ".weight") || a == adapters.end()) return weight;
    const at::Tensor& b = adapters.at(layer + ".lora_B.weight");
    return weight.to(at::kFloat) + at::matmul(b, a->second) * lora->scale();  // [out, in] fp32, this layer's only
  };
  const ExportPlan planned = plan_export(state, model, options);
  const std::vector<PlannedTensor>& plan = planned.tensors;
  const std::vector<int64_t>& file_bytes = planned.file_bytes;
  const auto flats = state.flat_params();
  const bool sharded_set = options.max_file_bytes > 0;
  const int files = static_cast<int>(file_bytes.size());
  auto file_name = [&](int i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", i + 1, files);
    return sharded_set ? (fs::path(path) / name).string() : path;
  };
  std::vector<std::unique_ptr<SafetensorsWriter>> writers;
  comm::on_every_rank(group, "opening the export files", [&] {
    if (!writer_rank) return;
    if (sharded_set) fs::create_directories(path);
    for (int i = 0; i < files; ++i) {
      std::vector<TensorInfo> declared;
      for (const auto& p : plan) {
        if (p.file == i) declared.push_back(p.info);
      }
      writers.push_back(std::make_unique<SafetensorsWriter>(file_name(i), declared,
                                                            std::map<std::string, std::string>{{"format", "pt"}}));
    }
  });
  int64_t written = 0;
  for (size_t f = 0; f < flats.size(); ++f) {
    bool holds_exported = false;
    for (const auto& p : plan) holds_exported = holds_exported || p.flat == f;
    if (!holds_exported) continue;  // adapters only: already merged (every rank skips it alike)
    std::vector<at::Tensor> full = flats[f]->gather_full_params();  // collective; one unit at a time
    comm::on_every_rank(group, "writing exported weights", [&] {
      if (!writer_rank) return;
      for (const auto& p : plan) {
        if (p.flat != f) continue;
        const std::string& name = flats[f]->layout().entries[p.entry].name;
        at::Tensor tensor = merged(name, full[p.entry]);
        if (hf_transposed(model, name)) tensor = tensor.t().contiguous();
        writers[p.file]->write(p.info.name, tensor.to(options.dtype));
        written += p.info.end - p.info.begin;
      }
    });
  }
  comm::on_every_rank(group, "finishing the export", [&] {
    if (!writer_rank) return;
    for (auto& writer : writers) writer->finish();
    if (sharded_set) {
      nlohmann::json index = {{"metadata", {{"total_size", written}}}, {"weight_map", nlohmann::json::object()}};
      for (const auto& p : plan) index["weight_map"][p.info.name] = fs::path(file_name(p.file)).filename().string();
      const std::string index_path = (fs::path(path) / "model.safetensors.index.json").string();
      std::ofstream(index_path + ".tmp") << index.dump(2) << "\n";
      fs::rename(index_path + ".tmp", index_path);
    }
  });
  return written;
}

at::ScalarType stored_weights_dtype(const std::string& path) {
  const WeightFiles weights(path);
  bool any_float = false, all_bf16 = true;
  for (const auto& info : weights.tensors()) {
    if (!at::isFloatingType(info.dtype)) continue;
    any_float = true;
    all_bf16 = all_bf16 && info.dtype == at::kBFloat16;
  }
  return any_float && all_bf16 ? at::kBFloat16 : at::kFloat;
}

bool stored_as_bnb_nf4(const std::string& path) {
  const WeightFiles weights(path);
  const std::string state = ".quant_state.bitsandbytes__nf4";
  for (const auto& info : weights.tensors()) {
    if (info.name.size() > state.size() && info.name.compare(info.name.size() - state.size(), state.size(), state) == 0)
      return true;
  }
  return false;
}

namespace {

// One import_weights call: the files, the model's flat parameters, and the steps of reading them
// in. Every rank checks all it reads before any value is written (a refused file changes nothing),
// then reads its own ranges straight into its shards.
class WeightImport {
 public:
  WeightImport(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& path)
      : group_(state.group()), flats_(state.flat_params()), model_(model), path_(path) {
    comm::on_every_rank(group_, "opening the weights in '" + path + "'", [&] { files_.emplace(path); });
    heap_.emplace(256LL << 20);
  }

  // The names the files hold against the model's, then each tensor's shape, dtype or 4-bit state.
  void check() {
    comm::on_every_rank(group_, "checking the weights in '" + path_ + "'", [&] {
      check_names();
      for (const auto* flat : flats_) {
        for (size_t i = 0; i < flat->layout().entries.size(); ++i) {
          if (!is_adapter(flat->layout().entries[i].name)) check_stored(*flat, i);
        }
      }
    });
  }

  // Every rank's files passed: the values go straight into the shards, one unit at a time (not into
  // a copy of them all, kept until every rank had read its own: a second copy of the rank's shards
  // while loading, 2026-12-05). A read failing from here on (a file truncated or changed since, an
  // unreadable disk) leaves the model partly loaded, and the error says so.
  void load() {
    comm::on_every_rank(group_, "loading weights from '" + path_ + "'", [&] {
      try {
        for (shard::FlatParam* flat : flats_) {
          if (flat->nf4_storage() != nullptr) load_nf4_unit(*flat);
          else load_unit(*flat);
        }
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string(e.what()) + " (the model is left partly loaded)");
      }
    });
  }

 private:
  const WeightFiles& weights() const { return *files_; }
  bool contains(const std::string& tensor) const { return weights().contains(tensor); }
  std::function<bool(const std::string&)> contains_fn() const {
    return [this](const std::string& tensor) { return contains(tensor); };
  }

  // The files' name of `entry`: its Hugging Face name, or one older files give it.
  std::string stored_name(const shard::FlatEntry& entry) const {
    std::string name = hf_name(model_, entry.name);
    for (const std::string& other : hf_other_names(model_, name)) {
      if (!contains(name) && contains(other)) name = other;
    }
    return name;
  }

  // A weight saved 4-bit by transformers through bitsandbytes (bnb_4bit_weight.h), or nullopt.
  std::optional<Bnb4bitWeight> four_bit(const shard::FlatEntry& entry) const {
    const std::string name = stored_name(entry);
    if (!is_bnb_4bit(contains_fn(), name)) return std::nullopt;
    return read_bnb_4bit(weights().file_of(name).path(), name, entry.shape, contains_fn(),
                         [this](const std::string& tensor) { return weights().file_of(tensor).read(tensor); });
  }

  // A tensor for the checks: its values when small (or a 4-bit weight's JSON state), else a meta
  // tensor of its shape and dtype.
  at::Tensor read_small(const std::string& tensor) const {
    const SafetensorsFile& file = weights().file_of(tensor);
    const TensorInfo& info = file.info(tensor);
    const bool quant_state = tensor.find(".quant_state.") != std::string::npos;  // JSON, parsed whole
    if (quant_state || info.end - info.begin <= (1 << 20)) return file.read(tensor);
    return at::empty(info.shape, at::TensorOptions().dtype(info.dtype).device(at::kMeta));  // shape and dtype
  }

  // The checks of a tensor the model reads that need no values: it is there, with the shape and
  // dtype the model needs, or (4-bit) a complete quantization state of that shape, NF4's code, and
  // (into an NF4 base) quantized from the dtype the base decodes to.
  void check_stored(const shard::FlatParam& flat, size_t i) const {
    const shard::FlatEntry& entry = flat.layout().entries[i];
    const std::string name = stored_name(entry);
    if (is_bnb_4bit(contains_fn(), name)) {
      check_four_bit(flat, i, name);
      return;
    }
    const SafetensorsFile& file = weights().file_of(name);
    const TensorInfo& info = file.info(name);
    const auto expected = stored_shape(entry.shape, hf_transposed(model_, entry.name));
    if (info.shape != expected) {
      throw std::runtime_error("weights file '" + file.path() + "': tensor '" + name + "' has shape " +
                               shape_text(info.shape) + ", the model expects " + shape_text(expected));
    }
    if (info.dtype != at::kFloat && info.dtype != at::kBFloat16 && info.dtype != at::kHalf) {
      throw std::runtime_error("weights file '" + file.path() + "': tensor '" + name + "' has dtype " +
                               safetensors_dtype_name(info.dtype) + " (expected F32, BF16 or F16)");
    }
  }

  void check_four_bit(const shard::FlatParam& flat, size_t i, const std::string& name) const {
    const shard::FlatEntry& entry = flat.layout().entries[i];
    if (hf_transposed(model_, entry.name)) {
      throw std::runtime_error("weights '" + path_ + "': tensor '" + name +
                               "' is stored 4-bit by bitsandbytes in a layer fsdp.cpp keeps transposed (GPT-2's "
                               "Conv1D): not read; use the model's bf16 weights");
    }
    const auto quantized = read_bnb_4bit(weights().file_of(name).path(), name, entry.shape, contains_fn(),
                                         [this](const std::string& tensor) { return read_small(tensor); });
    const shard::Nf4StorageLayout* storage = flat.nf4_storage();
    if (storage == nullptr || !storage->entries[i].nf4) return;  // dequantized as it is read
    if (quantized->dtype != storage->raw_dtype) {
      throw std::runtime_error(
          "weights '" + path_ + "': tensor '" + name + "' was quantized from " + c10::toString(quantized->dtype) +
          " values; the NF4 base is quantized from and decodes to " + c10::toString(storage->raw_dtype) +
          " (load the model with dtype bfloat16 before quantizing)");
    }
    try {  // block sizes and double quantization as the base's
      shard::check_nf4_entry_quantization(*storage, i, quantized->weight);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("weights '" + path_ + "': tensor '" + name + "': " + e.what());
    }
  }

  // The tensors the model reads under their Hugging Face names (and the other names some hold).
  std::set<std::string> expected_names() const {
    std::set<std::string> expected;
    for (const auto* flat : flats_) {
      for (const auto& entry : flat->layout().entries) {
        if (is_adapter(entry.name)) continue;
        expected.insert(hf_name(model_, entry.name));
        for (const std::string& other : hf_other_names(model_, hf_name(model_, entry.name))) expected.insert(other);
      }
    }
    return expected;
  }

  void check_names() const {
    const models::ModelFamily& family = models::family_of(model_);
    const std::set<std::string> expected = expected_names();
    if (const std::string architecture = family.hf_exact_architecture(); !architecture.empty()) {
      // Files that hold exactly transformers' tensors (hf_exact_architecture): one we would not read is a
      // variant we do not implement (biases on projections, another pooling, another image-text
      // projector of other layers), named.
      for (const auto& info : weights().tensors()) {
        if (expected.count(info.name) == 0 && !family.hf_unread_buffer(info.name)) {
          throw std::runtime_error("weights '" + path_ + "': tensor '" + info.name + "' is not part of the " +
                                   family.display_name() + " model fsdp.cpp implements (transformers' " + architecture +
                                   "): not read");
        }
      }
    } else if (group_->rank() == 0) {
      warn_of_unused(expected, family);
    }
  }

  // As transformers does, a tensor the model has no place for is not read, and said (a checkpoint
  // of another variant, or of a larger model, loads otherwise silently wrong). Buffers
  // transformers itself ignores and a 4-bit weight's parts are not counted.
  void warn_of_unused(const std::set<std::string>& expected, const models::ModelFamily& family) const {
    std::vector<std::string> unused;
    for (const auto& info : weights().tensors()) {
      const std::string& name = info.name;
      if (expected.count(name) != 0 || family.hf_unread_buffer(name)) continue;
      const size_t dot = name.find(".weight.");
      if (dot != std::string::npos && expected.count(name.substr(0, dot + 7)) != 0) continue;  // "x.weight.absmax"
      unused.push_back(name);
    }
    if (unused.empty()) return;
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) names += (i ? ", " : "") + unused[i];
    if (unused.size() > 5) names += ", ...";
    std::fprintf(stderr, "fsdp: warning: weights '%s': %zu tensor(s) the model does not use, not read: %s\n",
                 path_.c_str(), unused.size(), names.c_str());
  }

  // Elements [lo, hi) of the flat buffer, all inside `entry`, from the files, in fp32 (a 4-bit
  // weight dequantized as bitsandbytes does, to the dtype it was quantized from, then widened).
  at::Tensor read_values(const shard::FlatEntry& entry, int64_t lo, int64_t hi) const {
    const std::string name = stored_name(entry);
    if (auto quantized = four_bit(entry)) {
      return shard::dequantize_nf4(quantized->weight, quantized->dtype)
          .to(at::kFloat)
          .reshape(-1)
          .narrow(0, lo - entry.offset, hi - lo);
    }
    const SafetensorsFile& file = weights().file_of(name);
    if (hf_transposed(model_, entry.name)) {
      // Stored transposed: our contiguous range is strided there, so read the whole tensor.
      return file.read(name).to(at::kFloat).t().contiguous().view(-1).narrow(0, lo - entry.offset, hi - lo);
    }
    return file.read_range(name, lo - entry.offset, hi - lo).to(at::kFloat);
  }

  // QLoRA: each whole weight overlapping this rank's bytes, one at a time: a 4-bit weight's bytes
  // as bitsandbytes stored them, any other read and quantized.
  void load_nf4_unit(shard::FlatParam& flat) {
    const auto& layout = flat.layout();
    const shard::Nf4StorageLayout& storage = *flat.nf4_storage();
    const at::Tensor bytes = flat.nf4_shard_from_entries([&](size_t i) {
      const shard::FlatEntry& entry = layout.entries[i];
      if (storage.entries[i].nf4) {
        if (auto quantized = four_bit(entry)) {  // its dtype checked (check_four_bit)
          try {
            return shard::nf4_entry_bytes(storage, i, quantized->weight);
          } catch (const std::invalid_argument& e) {
            throw std::runtime_error("weights '" + path_ + "': tensor '" + stored_name(entry) + "': " + e.what());
          }
        }
      }
      at::Tensor bytes =
          shard::encode_nf4_entry(storage, i, read_values(entry, entry.offset, entry.offset + entry.numel));
      heap_->check();
      return bytes;
    });
    flat.shard().narrow(0, 0, bytes.numel()).copy_(bytes);
  }

  // This rank's range of the unit's values, read (and widened) into its shard. Parameters the
  // weights do not hold (LoRA adapters, which a base model never has) keep theirs.
  void load_unit(shard::FlatParam& flat) {
    const auto [begin, end] = held_range(flat);
    at::Tensor out = flat.shard().narrow(0, 0, end - begin);
    for (const auto& entry : flat.layout().entries) {
      const int64_t lo = std::max(begin, entry.offset), hi = std::min(end, entry.offset + entry.numel);
      if (lo >= hi || is_adapter(entry.name)) continue;
      // A range stored as it lies here is read 16 M values at a time: an 8 B Llama's embedding
      // half (262 M values) was 1.5 GB of bf16 read and its fp32 widening at once (N = 2,
      // 2026-12-06). Others are whole tensors to read anyway (transposed, or 4-bit).
      const bool as_stored = !hf_transposed(model_, entry.name) && !is_bnb_4bit(contains_fn(), stored_name(entry));
      const int64_t step = as_stored ? int64_t{1} << 24 : hi - lo;
      for (int64_t from = lo; from < hi; from += step) {
        const int64_t to = std::min(hi, from + step);
        out.narrow(0, from - begin, to - from).copy_(read_values(entry, from, to));
        heap_->check();
      }
    }
  }

  comm::ProcessGroupPtr group_;
  std::vector<shard::FlatParam*> flats_;
  const models::ModelConfig& model_;
  std::string path_;
  std::optional<WeightFiles> files_;
  // Each weight read (and widened, or quantized) is a temporary: at 8 B glibc's heap stranded
  // about 2.9 GB of them resident beside 4.7 GB live while loading (2026-12-05). Trimmed as the
  // resident set grows past the live bytes by this much (from where it stands once the files are open).
  std::optional<shard::HeapGrowthGuard> heap_;
};

}  // namespace

void import_weights(runtime::FsdpState& state, const models::ModelConfig& model, const std::string& path) {
  WeightImport import(state, model, path);
  import.check();
  import.load();
}

}  // namespace fsdp::checkpoint
