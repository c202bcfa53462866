#include "fsdp/comm/process_group.h"

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace fsdp::comm {

std::chrono::milliseconds comm_timeout_from_env(std::chrono::milliseconds fallback) {
  const char* env = std::getenv("FSDP_COMM_TIMEOUT_MS");
  if (env == nullptr) return fallback;
  char* end = nullptr;
  const long ms = std::strtol(env, &end, 10);
  if (*end != '\0' || ms <= 0) {
    throw std::runtime_error(std::string("FSDP_COMM_TIMEOUT_MS='") + env +
                             "' is not a positive number of milliseconds");
  }
  return std::chrono::milliseconds(ms);
}

CommWait comm_wait_from_env(CommWait fallback) {
  const char* env = std::getenv("FSDP_COMM_WAIT");
  if (env == nullptr) return fallback;
  const std::string value(env);
  if (value == "spin") return CommWait::kSpin;
  if (value == "backoff") return CommWait::kBackoff;
  throw std::runtime_error("FSDP_COMM_WAIT='" + value + "' is neither 'spin' nor 'backoff'");
}

const char* to_string(CommWait wait) { return wait == CommWait::kSpin ? "spin" : "backoff"; }

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
  double busy_seconds() const override { return 0.0; }
};
}  // namespace

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Average: return "average";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

namespace {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type() << " on " << t.device();
  if (!t.is_contiguous()) out << " (non-contiguous)";
  return out.str();
}

[[noreturn]] void fail(const ProcessGroup& group, const char* op, const std::string& what) {
  std::ostringstream out;
  out << "[rank " << group.rank() << "/" << group.size() << " group " << group.name() << "] " << op << ": " << what;
  throw std::invalid_argument(out.str());
}

void check_tensor(const ProcessGroup& group, const char* op, const char* role, const at::Tensor& t) {
  if (!t.defined()) fail(group, op, std::string(role) + " is an undefined tensor");
  if (!t.is_contiguous()) fail(group, op, std::string(role) + " must be contiguous, got " + describe(t));
  if (t.device().type() != group.device_type()) {
    fail(group, op,
         std::string(role) + " is on " + t.device().str() +
             (group.device_type() == at::kCPU
                  ? ": the MPI backend takes CPU tensors (CUDA tensors need the NCCL backend)"
                  : ": the NCCL backend takes CUDA tensors (CPU tensors need the MPI backend)"));
  }
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kLong:
    case at::kBFloat16:
    case at::kHalf:
    case at::kByte: break;
    default:
      fail(group, op,
           std::string(role) + " has unsupported dtype " + describe(t) +
               " (supported: float32, float64, int64, bfloat16, float16, uint8)");
  }
}

void check_reduce_op(const ProcessGroup& group, const char* op_name, const at::Tensor& t, ReduceOp op) {
  if (t.scalar_type() == at::kByte) {
    fail(group, op_name, "uint8 tensors carry packed bytes (an NF4 base): gathered and broadcast, not reduced");
  }
  if (op == ReduceOp::Average && t.scalar_type() == at::kLong) {
    fail(group, op_name, "average of int64 is not defined (it would truncate); use sum and divide");
  }
}

}  // namespace

void check_all_gather_args(const ProcessGroup& group, const at::Tensor& output, const at::Tensor& input) {
  check_tensor(group, "all_gather", "input", input);
  check_tensor(group, "all_gather", "output", output);
  if (output.scalar_type() != input.scalar_type()) {
    fail(group, "all_gather", "dtypes differ: output " + describe(output) + ", input " + describe(input));
  }
  if (output.numel() != input.numel() * group.size()) {
    fail(group, "all_gather",
         "output must hold " + std::to_string(group.size()) + " x " + std::to_string(input.numel()) +
             " elements, got output " + describe(output) + ", input " + describe(input));
  }
}

void check_reduce_scatter_args(const ProcessGroup& group, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op) {
  check_tensor(group, "reduce_scatter", "input", input);
  check_tensor(group, "reduce_scatter", "output", output);
  check_reduce_op(group, "reduce_scatter", input, op);
  if (output.scalar_type() != input.scalar_type()) {
    fail(group, "reduce_scatter", "dtypes differ: output " + describe(output) + ", input " + describe(input));
  }
  if (input.numel() != output.numel() * group.size()) {
    fail(group, "reduce_scatter",
         "input must hold " + std::to_string(group.size()) + " x " + std::to_string(output.numel()) +
             " elements, got input " + describe(input) + ", output " + describe(output));
  }
}

void check_all_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, ReduceOp op) {
  check_tensor(group, "all_reduce", "tensor", tensor);
  check_reduce_op(group, "all_reduce", tensor, op);
}

void check_broadcast_args(const ProcessGroup& group, const at::Tensor& tensor, int root) {
  check_tensor(group, "broadcast", "tensor", tensor);
  if (root < 0 || root >= group.size()) {
    fail(group, "broadcast",
         "root " + std::to_string(root) + " is not a rank of a group of size " + std::to_string(group.size()));
  }
}

}  // namespace fsdp::comm
