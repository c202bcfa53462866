#!/usr/bin/env bash
# LoRA against a full fine-tune: peak resident memory per rank at N = 2 (fsdp-train's own
# measurement, metrics.jsonl), for the same Llama, batch and sequence, side by side in one run;
# fsdp-plan's prediction for each beside it. Prints a table and writes JSON.
#   bash bench/lora_memory.sh [OUT.json]      (build/ made by scripts/setup.sh)
# The model: a 302 M-parameter Llama (12 layers, width 1536, 12 heads over 4 key/value heads, SwiGLU
# 4096, byte vocabulary), random weights, 3 steps of 4 x 128 tokens per rank; LoRA rank 16 on every
# linear layer of the blocks, the base stored in bf16, and QLoRA: the same with the base's linear
# weights in NF4 (lora.base_dtype = "nf4"); all compute in bf16 (fsdp.param_dtype), as LoRA runs do.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/lora_memory.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
# Another Llama shape: DIM, LAYERS, HEADS, KV_HEADS, FFN in the environment (e.g. the largest that fits
# the full fine-tune here: DIM=2048 LAYERS=22 HEADS=16 KV_HEADS=4 FFN=5632, 1.0 B parameters).
# AC=1: activation checkpointing on every block in all three runs (the activations LoRA keeps shrink
# to the blocks' inputs, so the base's storage is more of what is left).
ac=${AC:-0}
# BF16_MATMUL: train.bf16_matmul, "native" unless given. "auto" may take fp32 GEMMs on the bf16
# operands on a CPU where they are faster (docs/training.md); their fp32 copies of the operands
# add to every run's peak alike and would make the rows depend on which GEMM a start-up timing chose.
# RUNS: which of full, lora and qlora to run (all three unless given).
bf16_matmul=${BF16_MATMUL:-native}
runs=${RUNS:-full lora qlora}
for mode in $runs; do
  case $mode in full | lora | qlora) ;; *) echo "lora_memory: RUNS holds '$mode' (expected full, lora or qlora)" >&2; exit 1 ;; esac
done
shape="dim = ${DIM:-1536}\nlayers = ${LAYERS:-12}\nheads = ${HEADS:-12}\nkv_heads = ${KV_HEADS:-4}\nffn_hidden = ${FFN:-4096}"
common=$'[model]\nname = "llama-small"\n'"$(printf "$shape")"$'\ncontext = 128
[data]\nsource = "fortunes"\n[train]\nsteps = 3\nglobal_batch = 8\nseq_len = 128\nthreads = 1\nreport_every = 0\nbf16_matmul = "'"$bf16_matmul"$'"
[eval]\nevery = 0\nbatches = 1\nsample_tokens = 0\n[optimizer]\nwarmup_steps = 0\n[fsdp]\nparam_dtype = "bfloat16"'
[ "$ac" = 1 ] && common+=$'\nactivation_checkpointing = true'
lora=$'\n[lora]\nrank = 16\nalpha = 32\ntargets = "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"\nbase_dtype = "bfloat16"'
for mode in $runs; do
  body=$common
  [ "$mode" = lora ] && body+=$lora
  [ "$mode" = qlora ] && body+=${lora/base_dtype = \"bfloat16\"/base_dtype = \"nf4\"}
  printf 'name = "%s"\noutput_dir = "%s"\n%s\n' "$mode" "$work/$mode" "$body" > "$work/$mode.toml"
  mpirun --oversubscribe --bind-to none -np 2 "$root_dir/build/apps/fsdp-train" "$work/$mode.toml" --progress lines > "$work/$mode.log" 2>&1 \
    || { cat "$work/$mode.log"; exit 1; }
  "$root_dir/build/apps/fsdp-plan" "$work/$mode.toml" --ranks 2 --json "$work/$mode.plan.json" --compact > /dev/null
done
python3 - "$work" "$out_json" "$ac" "$bf16_matmul" $runs <<'PY'
import json, sys, datetime
work, out = sys.argv[1], sys.argv[2]
rows = {}
for mode in sys.argv[5:]:
    records = [json.loads(l) for l in open(f"{work}/{mode}/metrics.jsonl")]
    steps = [r for r in records if "peak_resident_bytes_per_rank" in r]
    start = next(r for r in records if "run_start" in r)
    plan = json.load(open(f"{work}/{mode}.plan.json"))
    rows[mode] = {"peak_resident_bytes_per_rank": max(max(r["peak_resident_bytes_per_rank"]) for r in steps),
                  "predicted_bytes_per_rank": start.get("predicted_peak_bytes_per_rank"),
                  "plan_parameters": plan["parameters"], "plan_adapter_parameters": plan.get("adapter_parameters", 0),
                  "median_step_seconds": sorted(r["step_seconds"] for r in steps)[len(steps) // 2],
                  "last_loss": steps[-1]["loss"]}
def ratio_of(a, b):
    return rows[a]["peak_resident_bytes_per_rank"] / rows[b]["peak_resident_bytes_per_rank"] if a in rows and b in rows else None
ratio, qratio = ratio_of("lora", "full"), ratio_of("qlora", "lora")
gib = 2 ** 30
print(f"{'':6} {'parameters':>12} {'trainable':>12} {'peak per rank':>14} {'fsdp-plan':>10} {'step s':>7}")
for mode, r in rows.items():
    trainable = r["plan_adapter_parameters"] or r["plan_parameters"]
    print(f"{mode:6} {r['plan_parameters'] / 1e6:10.1f} M {trainable / 1e6:10.1f} M {r['peak_resident_bytes_per_rank'] / gib:11.2f} GiB "
          f"{(r['predicted_bytes_per_rank'] or 0) / gib:7.2f} GiB {r['median_step_seconds']:7.2f}")
if ratio is not None:
    print(f"LoRA / full peak resident memory per rank: {ratio:.2f}x (aim <= 0.4x)")
if qratio is not None:
    print(f"QLoRA / LoRA (bf16 base) peak resident memory per rank: {qratio:.2f}x (aim <= 0.6x)")
json.dump({"date": datetime.date.today().isoformat(), "ranks": 2, "activation_checkpointing": sys.argv[3] == "1",
           "bf16_matmul": sys.argv[4], "rows": rows, "lora_over_full": ratio,
           "qlora_over_lora": qratio}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
