#!/usr/bin/env python3
"""fsdp-plan's flags reach the plan, with a config file and with --model.

    python3 tests/cli/plan_flags.py FSDP_PLAN

Each flag that sets a plan input is given alone, once on top of configs/gpt-fortunes-tiny.toml
and once on top of --model gpt-tiny, and the plan's JSON must show it: the field it sets, or the
memory term it adds. A flag dropped on one of the two paths (as --async-checkpoint was with a
config until 2026-12-05: the config's input replaced the command line's) fails here, naming the
flag and the path. A config with adapters and lora.base_dtype "auto" is planned too.

Every flag fsdp-plan's --help lists must be checked here or named in NOT_PLAN_INPUTS: a setting
added to runtime/sharding_settings.h or plan/workload_settings.h (each gets a flag) without a
check fails, named.
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# flag arguments -> a check of the plan's JSON (and what it shows, for the message)
FLAGS = [
    (["--async-checkpoint"], lambda p: p["memory_bytes"]["checkpoint_staging"] > 0, "checkpoint staging counted"),
    (["--cpu-offload"], lambda p: p["cpu_offload"] and p["memory_bytes"]["host_total"] > 0, "cpu_offload"),
    (["--strategy", "shard_grad_op"], lambda p: p["strategy"] == "shard_grad_op", "strategy"),
    (["--param-dtype", "bfloat16"], lambda p: p["param_dtype"] == "bfloat16", "param_dtype"),
    (["--reduce-dtype", "bfloat16"], lambda p: p["reduce_dtype"] == "bfloat16", "reduce_dtype"),
    (["--activation-checkpointing", "--activation-checkpointing-every", "2"],
     lambda p: p["activation_checkpointing"] and p["activation_checkpointing_every"] == 2, "activation checkpointing every 2"),
    (["--optimizer", "sgd"], lambda p: p["optimizer"] == "sgd", "optimizer"),
    (["--micro-batch", "3"], lambda p: p["micro_batch"] == 3, "micro_batch"),
    (["--micro-batches", "5"], lambda p: p["micro_batches"] == 5, "micro_batches"),
    # every unit's gradients kept across the micro-batches: the whole model's in fp32 among the gathered
    (["--micro-batches", "2", "--sync-each-micro-batch=false"],
     lambda p: not p["sync_each_micro_batch"] and p["memory_bytes"]["gathered"] >= 4 * p["parameters"],
     "every unit's gradients held"),
    (["--seq-len", "96"], lambda p: p["seq_len"] == 96, "seq_len"),
    (["--seq", "96"], lambda p: p["seq_len"] == 96, "seq_len (the former name)"),
    (["--loss-chunk-tokens", "0"], lambda p: p["loss_chunk_tokens"] == 0, "loss_chunk_tokens"),
    (["--loss-chunk", "0"], lambda p: p["loss_chunk_tokens"] == 0, "loss_chunk_tokens (the former name)"),
    (["--max-inflight", "0"], lambda p: p["max_inflight"] == 0, "max_inflight"),
    (["--prefetch=false"], lambda p: not p["prefetch"] and p["max_inflight"] == 0, "no prefetch"),
    (["--strategy", "hybrid_shard", "--shard-group-size", "1"],
     lambda p: p["strategy"] == "hybrid_shard" and p["shard_ranks"] == 1, "shard group of 1"),
    (["--fused-attention=false"], lambda p: not p["fused_attention"], "fused_attention off"),
    (["--composed-attention"], lambda p: not p["fused_attention"], "fused_attention off (the former flag)"),
    (["--embedding-units=false"], lambda p: p["embedding_params"] == 0, "no embedding unit"),
    (["--embeddings-in-root"], lambda p: p["embedding_params"] == 0, "no embedding unit (the former flag)"),
    (["--ranks-per-node", "1"], lambda p: p["ranks_per_node"] == 1, "ranks_per_node"),
    (["--memory", "5GiB"], lambda p: p["device_memory_bytes"] == 5 << 30, "device memory"),
    (["--overhead", "1GiB"], lambda p: p["memory_bytes"]["overhead"] == 1 << 30, "overhead"),
    (["--tflops", "2"], lambda p: p["compute_flops_per_second"] == 2e12, "compute rate"),
    (["--lora-rank", "4"], lambda p: p["adapter_parameters"] > 0, "adapters"),
    (["--lora-rank", "4", "--lora-targets", "c_attn"],  # a quarter of the adapters on every linear layer
     lambda p: 0 < p["adapter_parameters"] <= 8192, "adapters on c_attn only"),
    # 1.7 MB of fp32 shards, 0.9 MB with a bf16 base, 0.34 MB with an NF4 base
    (["--lora-rank", "4", "--lora-base-dtype", "nf4"],
     lambda p: p["adapter_parameters"] > 0 and p["memory_bytes"]["parameters"] < 1 << 19, "an NF4 base"),
    # 1 MB/s inside the node: the step's communication takes seconds (1000 GB/s: microseconds).
    (["--tflops", "1", "--bandwidth", "0.001"], lambda p: p["comm_seconds"] > 1, "the bandwidth"),
    # Two nodes of one rank: all of it crosses nodes, at 1 MB/s, where the node's link is 1000 GB/s.
    (["--tflops", "1", "--bandwidth", "1000", "--ranks-per-node", "1", "--inter-node-bandwidth", "0.001"],
     lambda p: p["comm_seconds"] > 1, "the bandwidth across nodes"),
]

# The flags not checked here: the model or config and the rank count (every plan here has them),
# what is printed and how, --fit and its --host-link-bandwidth (a search, not a plan input:
# tests/unit/plan_tests.cpp PlanFit, cli_fit_configs), and --calibrate (it measures this machine).
NOT_PLAN_INPUTS = {"--help", "--set", "--model", "--ranks", "--calibrate", "--compact", "--json", "--fit",
                   "--host-link-bandwidth"}


def unchecked_flags(executable):
    """The flags --help lists that neither FLAGS nor NOT_PLAN_INPUTS name."""
    listed = subprocess.run([executable, "--help"], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in listed.splitlines():
        if line.startswith("  -"):
            names.update(re.findall(r"--[a-z][a-z-]*", line.split()[0]))
    checked = {arg.split("=")[0] for flag, _, _ in FLAGS for arg in flag if arg.startswith("--")}
    return sorted(names - checked - NOT_PLAN_INPUTS)


def plan(executable, args, out):
    done = subprocess.run([executable, *args, "--json", out], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"plan_flags: fsdp-plan {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return json.loads(Path(out).read_text())


def main():
    executable = sys.argv[1]
    failures, checked = [], 0
    for flag in unchecked_flags(executable):
        failures.append(f"{flag}: fsdp-plan has this flag and nothing here checks that it reaches the plan")
    with tempfile.TemporaryDirectory() as work:
        out = str(Path(work) / "plan.json")
        for base_name, base in [("config", ["configs/gpt-fortunes-tiny.toml", "--ranks", "2"]),
                                ("--model", ["--model", "gpt-tiny", "--ranks", "2"])]:
            for flag, shows, what in FLAGS:
                before = plan(executable, base, out)
                if shows(before):
                    failures.append(f"{base_name}: {' '.join(flag)}: the plan shows {what} without the flag; the check cannot see it")
                    continue
                if not shows(plan(executable, base + flag, out)):
                    failures.append(f"{base_name}: {' '.join(flag)}: the plan does not show {what}")
                checked += 1
        # A config with adapters and lora.base_dtype left "auto" (the default): planned with the
        # dtype the run resolves (a random base: float32), not refused as "lora base dtype 'auto'"
        # (fsdp-plan before 2026-12-05).
        lora = plan(executable, ["configs/llama-fortunes-small.toml", "--ranks", "2", "--set", "lora.rank=8",
                                 "--set", 'lora.targets="all-linear"'], out)
        if lora["adapter_parameters"] <= 0:
            failures.append("config with [lora]: the plan shows no adapters")
        checked += 1
        # --max-inflight is the depth planned even where the config turns prefetch off.
        depth = plan(executable, ["configs/gpt-fortunes-tiny.toml", "--ranks", "2", "--set", "fsdp.prefetch=false",
                                  "--max-inflight", "3"], out)
        if depth["max_inflight"] != 3:
            failures.append(f"--max-inflight 3 on a config with fsdp.prefetch = false: planned depth {depth['max_inflight']}")
        checked += 1
    if failures:
        print("\n".join(["plan_flags: FAILED"] + failures))
        return 1
    print(f"plan_flags: {checked} flag checks passed ({len(FLAGS)} flags, with a config and with --model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
