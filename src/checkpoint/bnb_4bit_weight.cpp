#include "bnb_4bit_weight.h"

#include <cmath>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "shape_text.h"

namespace fsdp::checkpoint {

namespace {
const char* kNf4State = ".quant_state.bitsandbytes__nf4";
const char* kFp4State = ".quant_state.bitsandbytes__fp4";

at::ScalarType dtype_named(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float32") return at::kFloat;
  throw std::invalid_argument("dtype '" + name + "'");
}
}  // namespace

bool is_bnb_4bit(const std::function<bool(const std::string&)>& contains, const std::string& name) {
  return contains(name + kNf4State) || contains(name + kFp4State) || contains(name + ".absmax");
}

std::optional<Bnb4bitWeight> read_bnb_4bit(const std::string& where, const std::string& name,
                                           const std::vector<int64_t>& expected_shape,
                                           const std::function<bool(const std::string&)>& contains,
                                           const std::function<at::Tensor(const std::string&)>& read) {
  if (!is_bnb_4bit(contains, name)) return std::nullopt;
  const std::string prefix = "weights '" + where + "': tensor '" + name + "' is stored 4-bit by bitsandbytes";
  auto fail = [&](const std::string& why) -> std::runtime_error { return std::runtime_error(prefix + ": " + why); };
  if (contains(name + kFp4State)) {
    throw fail(
        "as fp4 (bnb_4bit_quant_type \"fp4\"); fsdp.cpp reads NF4 only: save the model with "
        "bnb_4bit_quant_type=\"nf4\", or point model.init_from at its bf16 weights");
  }
  if (!contains(name + kNf4State)) throw fail("but its quant_state (" + name + kNf4State + ") is missing");
  auto part = [&](const std::string& suffix, at::ScalarType dtype, int64_t numel) {
    const std::string tensor = name + suffix;
    if (!contains(tensor)) throw fail("its part '" + tensor + "' is missing");
    at::Tensor t = read(tensor);
    if (t.scalar_type() != dtype || (numel >= 0 && t.numel() != numel)) {
      throw fail("its part '" + tensor + "' holds " + std::to_string(t.numel()) + " " + c10::toString(t.scalar_type()) +
                 (numel >= 0 ? ", expected " + std::to_string(numel) + " " + c10::toString(dtype)
                             : ", expected " + std::string(c10::toString(dtype))) +
                 " (truncated or of another format)");
    }
    return t.reshape(-1).contiguous();
  };
  const at::Tensor state_bytes = part(kNf4State, at::kByte, -1);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(state_bytes.data_ptr<uint8_t>()),
                                              static_cast<size_t>(state_bytes.numel())));
  } catch (const std::exception& e) {
    throw fail(std::string("its quant_state is not JSON: ") + e.what());
  }
  Bnb4bitWeight out;
  shard::Nf4Weight& w = out.weight;
  try {
    if (state.at("quant_type").get<std::string>() != "nf4")
      throw fail("its quant_state says quant_type " + state.at("quant_type").dump());
    w.blocksize = state.at("blocksize").get<int64_t>();
    w.shape = state.at("shape").get<std::vector<int64_t>>();
    out.dtype = dtype_named(state.at("dtype").get<std::string>());
    w.double_quant = state.contains("nested_blocksize");
    if (w.double_quant) {
      w.nested_blocksize = state.at("nested_blocksize").get<int64_t>();
      w.offset = static_cast<float>(state.at("nested_offset").get<double>());
      if (state.value("nested_dtype", std::string("float32")) != "float32")
        throw fail("its nested absmax are not float32");
    }
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw fail(std::string("its quant_state cannot be read: ") + e.what());
  }
  if (w.shape != expected_shape) {
    throw fail("its quant_state gives shape " + shape_text(w.shape) + ", the model expects " +
               shape_text(expected_shape));
  }
  // Every field is checked before it is used: a size is divided by, a count allocated.
  if (w.blocksize <= 0) throw fail("its quant_state gives block size " + std::to_string(w.blocksize));
  if (w.double_quant && w.nested_blocksize <= 0) {
    throw fail("its quant_state gives nested_blocksize " + std::to_string(w.nested_blocksize) + " (must be positive)");
  }
  if (w.double_quant && !std::isfinite(w.offset))
    throw fail("its quant_state gives a nested_offset that is not finite");
  const int64_t n = w.numel(), blocks = w.blocks();
  w.packed = part("", at::kByte, (n + 1) / 2);
  w.absmax = part(".absmax", w.double_quant ? at::kByte : at::kFloat, blocks);
  const at::Tensor code = part(".quant_map", at::kFloat, 16);
  const auto& nf4 = shard::nf4_code();
  for (int i = 0; i < 16; ++i) {
    if (code[i].item<float>() != nf4[i])
      throw fail("its quant_map is not NF4's code values (value " + std::to_string(i) + ")");
  }
  if (w.double_quant) {
    w.nested_absmax = part(".nested_absmax", at::kFloat, (blocks + w.nested_blocksize - 1) / w.nested_blocksize);
    w.nested_map = part(".nested_quant_map", at::kFloat, 256);
    if (!w.nested_map.equal(shard::dynamic_map_signed()))
      throw fail("its nested_quant_map is not bitsandbytes' signed dynamic map");
  }
  return out;
}

}  // namespace fsdp::checkpoint
