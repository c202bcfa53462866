#!/usr/bin/env bash
# The GPU path, checked in one go on a machine with a CUDA GPU (one `device` call of about 9 minutes):
#
#   bash scripts/gpu-check.sh [OUT_DIR]        # default: $OUT if set, else out/gpu-check
#
#  1. builds fsdp.cpp with -DFSDP_CUDA=ON against the machine's PyTorch (its CUDA libtorch 2.x,
#     torch.utils.cmake_prefix_path) and NCCL (NCCL_ROOT, the nvidia-nccl wheel, or CUDA's own),
#     with fsdp.cpp's fused kernels where nvcc is found;
#  2. runs the parity tests on the GPU (FSDP_TEST_DEVICE=cuda: NCCL, TF32 off, fp32 against the
#     single-process CPU reference; CPU offload too), the NCCL group's own calls in a stage of
#     their own (NcclGroup.*: a split made by ncclCommSplit; the stream's stand-still at a wait,
#     timed by events), and the fused operations' tests (FusedOps.*:
#     each kernel against its composed reference, forward and backward, fp32 and bf16; the NF4
#     decode kernel against the host's decode, to the bit), the step's edge (StepEdge.*: no host
#     read between backward and the fused AdamW, a NaN step skipped by its kernel), the NF4 decode's GB/s
#     (bench/nf4_decode_bench: one 1B Llama block against the composed decode and a copy), the
#     fused kernels' GB/s (bench/fused_ops_bench: a 1B Llama micro-batch, fused and composed), then
#     the parity tests at N = 2 and 4 on one GPU through the staged test backend
#     (FSDP_DEVICE_COMM=staged), compute-sanitizer's racecheck on the add + RMSNorm kernels, two
#     ranks on one GPU refused by NCCL's path, and fsdp-train at N = 2 on one GPU, staged;
#  3. trains GPT-2 124M (vocab 50257, 1024 tokens) and Llama 3.2 1B (16 x 2048, vocab 128256,
#     2048 tokens) in bf16 with fsdp-train for a fixed number of steps on random-token files:
#     tokens/s, MFU against the bf16 matmul peak it measures first, peak GPU memory reserved;
#  4. the same models, batch and sequence under PyTorch's FSDP2 (bench/torch_fsdp2.py): Hugging Face
#     transformers' models compiled per block and eager, and the script's own models;
#  5. the 1B Llama with activation checkpointing at 8 x 2048, against transformers' with it;
#  6. the 1B Llama with LoRA on a bf16 base and on an NF4 base (QLoRA), step time and memory;
#     the 1B Llama in fp16 (dynamic loss scaling), and again with CPU offload and the GPU capped
#     (caching-allocator fraction) below its sharded state: it must still train; then the peers
#     least needed (the GPT-2 eager ones);
#  7. a table and OUT_DIR/gpu-check.json (bench/gpu_check_report.py), with the ratios.
# Profiles: fsdp-train --profile-steps and torch_fsdp2.py --profile-steps record steps 6-7 of the
# 1B Llama, ours and the compiled peer's, as Chrome traces (OUT_DIR/traces.tar.gz), compared op
# class by op class (bench/compare_traces.py: OUT_DIR/trace-comparison.txt).
# Each stage has its own time limit inside one overall budget (FSDP_GPU_CHECK_BUDGET seconds,
# default 450; 530 in a 580 s device call); stages run most important first (the build, the
# kernels' and parity tests, then the 1B Llama against compiled FSDP2 with both profiles, whose
# report is copied to OUT_DIR at once, then the rest), a failed or skipped stage is reported and
# the rest still run. FSDP_GPU_CHECK_ONLY="build kernels ..."
# runs the stages named alone (a rerun of what a call's budget did not reach). The report is written on any exit.
# Working files (logs, token files, metrics) go to /tmp/fsdp-gpu-check; OUT_DIR receives six:
# gpu-check.json, report.txt, stages.tsv (after every stage), trace-comparison.txt,
# gpu-check-logs.tar.gz (logs and metrics, no data) and traces.tar.gz, because a device call
# brings back only a few files.
# Needs: nvidia-smi, python3 with a CUDA torch >= 2.7 (the first wheels built with the C++11 ABI)
# and transformers (for the Hugging Face peers), cmake >= 3.18,
# g++, and Open MPI, nlohmann-json, toml++, CLI11, GoogleTest and zlib's headers: installed
# (scripts/setup.sh on Debian), or as .deb files in .gpu-deps/ (scripts/gpu-deps.sh, run where
# apt works; carried to the machine), unpacked under /tmp here.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-${OUT:-out/gpu-check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=${FSDP_GPU_CHECK_WORK:-/tmp/fsdp-gpu-check}
rm -rf "$WORK" && mkdir -p "$WORK"
BUILD=${FSDP_GPU_BUILD_DIR:-build-cuda}
STEPS=${FSDP_GPU_CHECK_STEPS:-12}
DEADLINE=$((SECONDS + ${FSDP_GPU_CHECK_BUDGET:-450}))
STATUS="$WORK/stages.tsv"
FRACTION=0
: > "$STATUS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The Hugging Face peers build their models from configs: nothing to download, and no network.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Open MPI's launcher refuses to start (even one local rank) without ssh or rsh to find; on one
# machine it never uses them. CUDA images often have neither.
command -v ssh > /dev/null 2>&1 || command -v rsh > /dev/null 2>&1 || export OMPI_MCA_plm_rsh_agent=false
CHECKPOINTS=/tmp/fsdp-gpu-check-checkpoints  # a stage stopped by its limit saves one (SIGTERM): kept out of WORK

snapshot() {  # the table, JSON and trace comparison so far, copied to OUT_DIR: a later hang or a cut call keeps them
  timeout 60 python3 "$ROOT/bench/gpu_check_report.py" --dir "$WORK" --cap-fraction "${FRACTION:-0}" > "$WORK/report.txt" 2>&1
  cp "$WORK/report.txt" "$WORK/stages.tsv" "$OUT_DIR/" 2> /dev/null
  [ -e "$WORK/gpu-check.json" ] && cp "$WORK/gpu-check.json" "$OUT_DIR/"
  # The 1B Llama's two profiles, op class by op class (bench/compare_traces.py); once (they do not change).
  local ours="$WORK/fsdp_llama1b/profile/trace-rank0.json" theirs
  for theirs in "$WORK/torch_hf_llama1b_compiled.trace.json" "$WORK/torch_hf_llama1b_compiled-rank0.trace.json" ""; do
    [ -f "$theirs" ] && break
  done
  if [ -f "$ours" ] && [ -n "$theirs" ] && ! [ -s "$WORK/trace-comparison.txt" ]; then
    # Two profiled 1B steps are tens to hundreds of MB of JSON each: bounded, not left to the budget.
    timeout 120 python3 "$ROOT/bench/compare_traces.py" "$ours" "$theirs" --json "$WORK/trace-comparison.json" > "$WORK/trace-comparison.txt" 2>&1
    cp "$WORK/trace-comparison.txt" "$OUT_DIR/" 2> /dev/null
  fi
}

finish() {  # on any exit: the table and JSON, then the few files OUT_DIR takes back
  rm -rf "$CHECKPOINTS"
  snapshot
  cat "$WORK/report.txt"
  [ -s "$WORK/trace-comparison.txt" ] && head -n 15 "$WORK/trace-comparison.txt"
  tar -C "$WORK" --exclude=./data --exclude='*.trace.json' --exclude='./*/profile' --exclude='*/checkpoints' \
    --exclude='*.partial' -czf "$OUT_DIR/gpu-check-logs.tar.gz" . 2> /dev/null
  (cd "$WORK" && find . -name '*.trace.json' -o -name 'trace-rank*.json' | tar -czf "$OUT_DIR/traces.tar.gz" -T -) 2> /dev/null
}
trap finish EXIT

stage() {  # stage NAME SECONDS COMMAND...: runs it with a limit, logs to WORK/NAME.log, records the outcome
  local name=$1 limit=$2; shift 2
  if [ -n "${FSDP_GPU_CHECK_ONLY:-}" ] && [[ " $FSDP_GPU_CHECK_ONLY " != *" $name "* ]]; then
    return 0  # not asked for: a rerun of some stages (FSDP_GPU_CHECK_ONLY="build kernels ...")
  fi
  local start=$SECONDS left=$((DEADLINE - SECONDS - 20))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 30 ]; then  # not enough of the budget left to be worth starting
    echo "== $name: SKIPPED (budget spent)"
    printf '%s\t%s\t%s\n' "$name" "skipped" 0 >> "$STATUS"
    return 1
  fi
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$STATUS"
  cp "$STATUS" "$OUT_DIR/" 2> /dev/null  # what ran so far comes back even if the call is cut
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    # Timed out: a rank that ignored the TERM (a hang) can outlive mpirun's KILL and keep its GPU
    # memory, and the next 1B stage would run out of it.
    # Anchored to the command's start: a rank's, never a shell or tool that names the path.
    pkill -KILL -f "^([^ ]*/)?$BUILD/(apps|tests|bench)/" 2> /dev/null
    pkill -KILL -f "^([^ ]*/)?python3 bench/torch_fsdp2.py" 2> /dev/null
  fi
  if [ "$rc" -ne 0 ]; then echo "   FAILED (exit $rc); last lines of $name.log:"; tail -n 15 "$WORK/$name.log" | sed 's/^/   /'; fi
  return "$rc"
}

# Carried packages (scripts/gpu-deps.sh), unpacked under /tmp. The image may have Open MPI (then
# only the libraries it lacks are used: toml++, CLI11, GoogleTest, PCRE2, utf8proc, tcmalloc) or
# not (then all of them).
CMAKE_EXTRA=()
if ls .gpu-deps/*.deb > /dev/null 2>&1; then
  DEPS=/tmp/fsdp-gpu-deps
  rm -rf "$DEPS" && mkdir -p "$DEPS/bin"
  for deb in .gpu-deps/*.deb; do
    if command -v mpicxx > /dev/null; then
      case $(basename "$deb") in libtomlplusplus*|libcli11-dev*|libgtest-dev*|libpcre2*|libutf8proc*|libtcmalloc*) ;; *) continue ;; esac
    fi
    dpkg-deb -x "$deb" "$DEPS" || echo "gpu-check: could not unpack $deb"
  done
  find "$DEPS" -lname '/*' | while read -r link; do
    target=$(readlink "$link")
    [ -e "$DEPS$target" ] && ln -sfn "$DEPS$target" "$link"
  done
  L="$DEPS/usr/lib/x86_64-linux-gnu"
  CMAKE_EXTRA=(-Dtomlplusplus_DIR="$L/cmake/tomlplusplus" -DGTest_DIR="$L/cmake/GTest" -DCLI11_DIR="$DEPS/usr/share/cmake/CLI11")
  [ -e "$L/libtcmalloc_minimal.so.4" ] && CMAKE_EXTRA+=(-DFSDP_TCMALLOC_LIBRARY="$L/libtcmalloc_minimal.so.4")
  export LD_LIBRARY_PATH="$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$L${LIBRARY_PATH:+:$LIBRARY_PATH}"
  if ! command -v mpicxx > /dev/null; then
    ln -sf "$DEPS/usr/bin/mpicxx.openmpi" "$DEPS/bin/mpicxx"
    ln -sf "$DEPS/usr/bin/mpirun.openmpi" "$DEPS/bin/mpirun"
    export OPAL_PREFIX="$DEPS/usr"
    export PATH="$DEPS/bin:$DEPS/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$L/openmpi/lib:$LD_LIBRARY_PATH"
    CMAKE_EXTRA+=(-DMPI_CXX_COMPILER="$DEPS/usr/bin/mpicxx.openmpi" -DZLIB_ROOT="$DEPS/usr")
  fi
  DEPS_PREFIX="$DEPS/usr"
  echo "gpu-check: carried packages unpacked in $DEPS; mpicxx: $(command -v mpicxx)"
fi

missing=()
command -v nvidia-smi > /dev/null || missing+=("nvidia-smi (no NVIDIA driver?)")
command -v cmake > /dev/null || missing+=("cmake")
command -v mpicxx > /dev/null || missing+=("mpicxx (Open MPI; or carry .gpu-deps from scripts/gpu-deps.sh)")
# One import of torch for all it tells (each costs seconds): CUDA usable, the C++11 ABI (Debian's
# C++ libraries, toml++ and GoogleTest, use it; a torch built without it cannot link them), the
# GPUs (torch's count, not nvidia-smi -L: that lists MIG slices too), the first one's
# architecture (the only one the kernels are built for), its version and CMake prefix.
read -r TORCH_CUDA TORCH_ABI GPUS ARCH TORCH_VERSION TORCH_PREFIX < <(python3 -c '
import torch
cuda = torch.cuda.is_available()
major, minor = torch.cuda.get_device_capability(0) if cuda else (0, 0)
print(int(cuda), int(torch.compiled_with_cxx11_abi()), torch.cuda.device_count(), f"{major}{minor}",
      f"{torch.__version__}/cuda-{torch.version.cuda}", torch.utils.cmake_prefix_path)' 2> /dev/null)
[ "${TORCH_CUDA:-0}" = 1 ] || missing+=("python3 with a CUDA PyTorch")
[ "${TORCH_ABI:-0}" = 1 ] ||
  missing+=("a PyTorch built with the C++11 ABI (torch.compiled_with_cxx11_abi(); pip wheels from 2.7 on)")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'gpu-check: missing: %s\n' "${missing[@]}" | tee "$WORK/missing.txt"
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
echo "torch $TORCH_VERSION, $GPUS GPU(s), sm_$ARCH" | tee -a "$WORK/gpu.txt"

# 1. Build (CUDA libtorch from the Python install; NCCL from NCCL_ROOT, the nvidia-nccl wheel, or CUDA's).
if [ -z "${NCCL_ROOT:-}" ]; then
  # The wheel's nvidia.nccl may be a namespace package (no __file__): look for the library itself.
  NCCL_LIB=$(python3 -c 'import site, glob; print(next(iter(sorted(p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/**/libnccl.so.2", recursive=True))), ""))' 2> /dev/null)
  if [ -n "$NCCL_LIB" ]; then
    NCCL_ROOT=$(dirname "$(dirname "$NCCL_LIB")")
    export NCCL_ROOT
    echo "gpu-check: NCCL from $NCCL_ROOT"
  fi
fi
# Unity batches of 4 sources, not 16: 16 cores compile many small batches at once, not a few large
# ones one after another. Its limit is generous (the 2026-12-04 build took 291 s): a build cut
# short loses the whole call, one that runs long only the stages the budget then cannot reach.
# The kernels for this GPU's architecture alone (FSDP_CUDA_ARCHITECTURES defaults to 80 and 90):
# half of nvcc's work, which comes first in the build's order. A GPU newer than the image's nvcc
# knows keeps the default (its driver compiles sm_90's PTX at load).
NVCC=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
"$NVCC" --list-gpu-arch 2> /dev/null | grep -qx "compute_$ARCH" || ARCH="80;90"
stage build 400 bash -c "cmake -S . -B '$BUILD' -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DFSDP_BUILD_BENCH=ON -DFSDP_UNITY_BATCH=4 \
    -DFSDP_CUDA_ARCHITECTURES='$ARCH' \
    -DCMAKE_PREFIX_PATH='$TORCH_PREFIX${DEPS_PREFIX:+;$DEPS_PREFIX}' ${CMAKE_EXTRA[*]} && \
    cmake --build '$BUILD' -j\$(nproc) --target fsdp-train fsdp_dist_tests fsdp_unit_tests fsdp_train_tests nf4_decode_bench fused_ops_bench" || exit 1
grep -h "fused CUDA kernels\|no CUDA compiler" "$WORK/build.log" | head -2

# 2. The fused kernels against their composed references (a GPU that libtorch cannot see fails
# here): the 1B runs below use them. Where nvcc built the kernels, FusedOps and the NF4 test fail
# if the composed path ran instead.
EXPECT_KERNELS=$(grep -q "fused CUDA kernels ON" "$WORK/build.log" 2> /dev/null && echo 1 || echo 0)
stage kernels 60 env FSDP_TEST_DEVICE=cuda FSDP_EXPECT_CUDA_KERNELS="$EXPECT_KERNELS" "$BUILD/tests/fsdp_unit_tests" \
  --gtest_filter='FusedOps.*:Nf4Storage.*:AttentionKernel.*:StackedLinear.*'
# Parity on the GPU (one rank per GPU; a single GPU runs N = 1).
stage parity 120 mpirun --oversubscribe --bind-to none -np "$GPUS" -x FSDP_TEST_DEVICE=cuda \
  "$BUILD/tests/fsdp_dist_tests" --gtest_filter='AllStrategies/StrategyParity.*:Parity.CpuOffload:Parity.SgdWithMomentum'

# Random-token files for the real vocabularies (fsdp-train's token-file format, uint32 tokens).
python3 - "$WORK/data" << 'EOF'
import os, struct, sys, random
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for vocab in (50257, 128256):
    for split, count in (("train", 1 << 20), ("validation", 1 << 16)):
        rng = random.Random(vocab + len(split))
        tokens = [rng.randrange(vocab) for _ in range(count)]
        with open(f"{out}/{split}-{vocab}.tok", "wb") as f:
            f.write(b"FSDPTOK\0" + struct.pack("<IIIIQ", 1, 4, vocab, 0, count))
            f.write(struct.pack(f"<{count}I", *tokens))
EOF

# 3. The models: name, vocab, global batch, sequence (the same shapes go to bench/torch_fsdp2.py).
train() {  # train LABEL MODEL VOCAB BATCH SEQ [extra fsdp-train arguments]
  local label=$1 model=$2 vocab=$3 batch=$4 seq=$5; shift 5
  stage "fsdp_$label" 150 mpirun --oversubscribe --bind-to none -np "$GPUS" "$BUILD/apps/fsdp-train" \
    configs/gpt-fortunes-tiny.toml --progress lines \
    --set "name=\"$label\"" --set "output_dir=\"$WORK/fsdp_$label\"" --set "checkpoint.dir=\"$CHECKPOINTS/$label\"" --set "model.name=\"$model\"" \
    --set 'data.source="token_files"' --set "data.train_tokens=\"$WORK/data/train-$vocab.tok\"" \
    --set "data.validation_tokens=\"$WORK/data/validation-$vocab.tok\"" \
    --set "train.global_batch=$((batch * GPUS))" --set "train.seq_len=$seq" --set "train.steps=$STEPS" \
    --set 'train.device="cuda"' --set 'fsdp.param_dtype="bfloat16"' --set 'optimizer.warmup_steps=2' \
    --set 'optimizer.lr=3e-4' --set 'optimizer.min_lr=3e-5' \
    --set 'eval.every=0' --set 'eval.batches=1' --set 'eval.sample_tokens=0' --set 'checkpoint.every=0' "$@"
}
PORT=29533
torch_fsdp2() {  # torch_fsdp2 LABEL BATCH SEQ MODEL-ARGS... (3 warm-up steps + STEPS - 3 timed: fsdp-train's count)
  local label=$1 batch=$2 seq=$3; shift 3
  PORT=$((PORT + 1))  # a fresh rendezvous port per stage: a killed stage may hold the last one
  stage "torch_$label" 150 mpirun --oversubscribe --bind-to none -np "$GPUS" python3 bench/torch_fsdp2.py \
    --batch $((batch * GPUS)) --seq "$seq" --steps $((STEPS - 3)) --warmup 3 --port "$PORT" --json "$WORK/torch_$label.json" "$@"
}
GPT2=(--layers 12 --dim 768 --heads 12 --vocab 50257)
LLAMA1B=(--layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tie)
PROFILE=6:7  # steps 6 and 7 of 12: past the warm-up and compilation, before the end

# The headline first (issue 54: the 1B Llama against FSDP2 compiled, both profiled for the trace
# comparison), its report and trace comparison copied to OUT_DIR at once; then the rest, most
# important first (the budget may not reach the last: they are then reported as skipped).
train llama1b llama3-1b 128256 4 2048 --profile-steps "$PROFILE"
torch_fsdp2 hf_llama1b_compiled 4 2048 --model hf-llama "${LLAMA1B[@]}" --compile --profile-steps "$PROFILE" \
  --trace "$WORK/torch_hf_llama1b_compiled.trace.json"
snapshot

# The step's edge on the device (issue 54, item 5), never run on a GPU: no host read between
# backward and the fused update, and a NaN batch's step skipped by the CUDA kernel's found_inf as
# the host-judged path skips it, to the bit. (A step wrongly skipped in the 1B run above shows in
# the report: each run's skipped steps.)
stage step_edge 90 mpirun --oversubscribe --bind-to none -np "$GPUS" -x FSDP_TEST_DEVICE=cuda \
  "$BUILD/tests/fsdp_train_tests" --gtest_filter='StepEdge.*'
# The NCCL group's own calls that have never run (ncclCommSplit; the stream-wait timing), a stage of
# their own: a failed split ends its process (abort), which would take other tests with it. At
# N = 1 full_shard splits nothing: the 1B run above does not need them.
stage nccl_group 45 mpirun --oversubscribe --bind-to none -np "$GPUS" -x FSDP_TEST_DEVICE=cuda \
  "$BUILD/tests/fsdp_dist_tests" --gtest_filter='NcclGroup.*'
# The decoder's fused kernels in GB/s against their composed references and a copy (issue 54, item
# 4: 16-byte loads, rotary without 64-bit division, the norm's partials in registers; never run).
stage fused_ops 45 "$BUILD/bench/fused_ops_bench" --device cuda --json "$WORK/fused_ops.json"
# The NF4 decode (QLoRA's per-unit dequantize) in GB/s: fsdp.cpp's kernel, the composed ops, a copy.
stage nf4_decode 60 "$BUILD/bench/nf4_decode_bench" --device cuda --json "$WORK/nf4_decode.json"
train llama1b_composed llama3-1b 128256 4 2048 --set 'train.fused_ops=false'  # what the fused ops and stacked GEMMs buy
# The GPU path at N = 2 and 4 on this one GPU (issue 40): NCCL refuses two ranks on a device, the
# staged test backend (comm/staged_process_group.h) does not: device tensors, CUDA streams and
# events, host copies around MPI. Every strategy's parity (hybrid included) and CPU offload.
staged_parity() {
  local n
  for n in 2 4; do
    echo "-- N = $n"
    mpirun --oversubscribe --bind-to none -np "$n" -x FSDP_TEST_DEVICE="${STAGED_DEVICE:-cuda}" -x FSDP_DEVICE_COMM=staged \
      "$BUILD/tests/fsdp_dist_tests" --gtest_filter='AllStrategies/StrategyParity.*:Parity.CpuOffload' || return 1
  done
}
export -f staged_parity
export BUILD
stage staged_parity 150 bash -c staged_parity
# A race in the norms' block-wide sums (fused_kernels.cu) would show in
# the kernel tests only by chance; racecheck looks for one directly, on the smallest add + RMSNorm
# test (forward and backward kernels), where the image has the CUDA toolkit's compute-sanitizer.
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
if [ -n "$SANITIZER" ]; then
  stage kernels_racecheck 60 env FSDP_TEST_DEVICE=cuda "$SANITIZER" --tool racecheck --error-exitcode 1 \
    "$BUILD/tests/fsdp_unit_tests" --gtest_filter='FusedOps.AddRmsNormTakesStridedInputsAndAnFp32Weight'
else
  echo "== kernels_racecheck: no compute-sanitizer on this machine (not run)"
fi

# Two ranks on one GPU are refused before NCCL starts, naming the device (issue 40; before: NCCL's
# bare "invalid usage" from ncclCommInitRank). Needs exactly one visible GPU.
two_ranks_on_one_gpu() {
  local out
  # Random-token files, not fortunes: a GPU image need not have Debian's fortunes (2026-12-04).
  out=$(mpirun --oversubscribe --bind-to none -np 2 "$BUILD/apps/fsdp-train" "$ROOT/configs/gpt-fortunes-tiny.toml" \
    --set 'data.source="token_files"' --set "data.train_tokens=\"$WORK/data/train-50257.tok\"" \
    --set "data.validation_tokens=\"$WORK/data/validation-50257.tok\"" --set 'model.name="gpt2"' \
    --set train.seq_len=128 --set train.global_batch=2 --set "checkpoint.dir=\"$CHECKPOINTS/two-on-one\"" \
    --set 'train.device="cuda"' --set train.steps=1 --set "output_dir=\"$WORK/two-on-one\"" 2>&1)
  echo "$out"
  grep -q "both took CUDA device 0" <<< "$out"
}
export -f two_ranks_on_one_gpu
export BUILD WORK ROOT CHECKPOINTS
[ "$GPUS" -eq 1 ] && stage one_rank_per_device 60 bash -c two_ranks_on_one_gpu
# fsdp-train at N = 2 on one GPU through the staged backend, hybrid 1 x 2 would need 4: full_shard.
# (A stage stopped by its limit saves a checkpoint on SIGTERM: into CHECKPOINTS, not the logs.)
stage staged_train 90 mpirun --oversubscribe --bind-to none -np 2 -x FSDP_DEVICE_COMM=staged "$BUILD/apps/fsdp-train" \
  "$ROOT/configs/gpt-fortunes-tiny.toml" --progress lines \
  --set 'data.source="token_files"' --set "data.train_tokens=\"$WORK/data/train-50257.tok\"" \
  --set "data.validation_tokens=\"$WORK/data/validation-50257.tok\"" --set 'model.name="gpt2"' \
  --set train.seq_len=256 --set train.global_batch=8 --set train.steps=10 --set 'train.device="cuda"' \
  --set 'eval.every=0' --set 'eval.sample_tokens=0' --set 'checkpoint.every=0' \
  --set "checkpoint.dir=\"$CHECKPOINTS/staged_train\"" --set "output_dir=\"$WORK/staged_train\""

# LoRA (rank 16 on every linear layer of the blocks) on an NF4 base, then on a bf16 base (issue 35).
LORA=(--set lora.rank=16 --set lora.alpha=32 --set 'lora.targets="q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"')
train llama1b_qlora llama3-1b 128256 4 2048 "${LORA[@]}" --set 'lora.base_dtype="nf4"'
train llama1b_lora llama3-1b 128256 4 2048 "${LORA[@]}" --set 'lora.base_dtype="bfloat16"'
train gpt2 gpt2 50257 8 1024
torch_fsdp2 hf_gpt2_compiled 8 1024 --model hf-gpt2 "${GPT2[@]}" --compile
torch_fsdp2 hf_llama1b 4 2048 --model hf-llama "${LLAMA1B[@]}"
torch_fsdp2 llama1b 4 2048 --model llama "${LLAMA1B[@]}"
train llama1b_ac llama3-1b 128256 8 2048 --set 'fsdp.activation_checkpointing=true'
torch_fsdp2 hf_llama1b_ac 8 2048 --model hf-llama "${LLAMA1B[@]}" --checkpointing
# fp16 with dynamic loss scaling beside the bf16 run above (issue 38; the later --set wins).
train llama1b_fp16 llama3-1b 128256 4 2048 --set 'fsdp.param_dtype="float16"'
# fp32 compute (TF32 off) beside bf16: issue 39's dtype table, on the GPU.
train llama1b_fp32 llama3-1b 128256 4 2048 --set 'fsdp.param_dtype="float32"'
# CPU offload under a cap: 1.24 B parameters x 16 bytes of fp32 shard state = 19.8 GB per GPU
# at N = 1; the cap (a fraction of total memory, computed here) leaves the device 16 GiB, less
# than that. One 2048-token sequence per step: its logits (2048 x 128256) fit beside the units.
FRACTION=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
  awk -v gpus="$GPUS" '$1 + 0 > 0 { f = 16.0 * 1024 / $1; if (f > 1) f = 1; printf "%.3f", f }')
FRACTION=${FRACTION:-0}  # nvidia-smi's "[N/A]": no total known, so no cap (0 would mean none): not run
if [ "$FRACTION" != 0 ]; then
  STEPS=4 train llama1b_offload llama3-1b 128256 1 2048 --set 'fsdp.cpu_offload=true' \
    --set "train.device_memory_fraction=$FRACTION"
else
  echo "== fsdp_llama1b_offload: nvidia-smi gave no memory total, so no cap to train under (not run)"
fi
# Peers least needed last (the 2026-12-04 run spent its budget before fp16 and offload).
torch_fsdp2 gpt2 8 1024 --model gpt "${GPT2[@]}"
torch_fsdp2 hf_gpt2 8 1024 --model hf-gpt2 "${GPT2[@]}"
# (the report is written by finish, on exit)
