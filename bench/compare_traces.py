#!/usr/bin/env python3
"""Two Chrome traces side by side, op by op: where one step's time goes in fsdp.cpp and in a peer.

    python3 bench/compare_traces.py OURS.json THEIRS.json [--top 25] [--json out.json]

OURS: fsdp-train --profile-steps (<output_dir>/profile/trace-rank0.json); THEIRS: bench/torch_fsdp2.py
--profile-steps (or any torch.profiler Chrome trace). Times are per profiled step (the traces'
ProfilerStep# marks are counted). On a GPU trace the GPU kernels are summed (category "kernel": they
do not nest, so the sums are the device's busy time); on a CPU-only trace the operators' self time
(an operator's time less that of the operators inside it, per thread). Kernels are also grouped
into classes (matmul, attention, communication, norm, elementwise, copy, optimizer, other) by name,
for the compact comparison the fusions aim at. scripts/gpu-check.sh runs it on the 1B Llama's pair.
"""
import argparse
import collections
import json
import sys

CLASSES = (  # first match wins; names lowercased
    ("communication", ("nccl", "all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "c10d::")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "matmul")),
    ("optimizer", ("adam", "foreach")),
    ("norm", ("rms", "layer_norm", "layernorm")),
    ("copy", ("copy", "memcpy", "memset", "cat", "contiguous", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "silu", "swiglu", "rotary", "triton", "aten::")),
)


def classify(name):
    low = name.lower()
    for label, keys in CLASSES:
        if any(k in low for k in keys):
            return label
    return "other"


def load(path):
    """-> ({name: microseconds per step}, steps, 'gpu kernels' | 'cpu self time')"""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = len({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}) or 1
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in complete if e.get("cat") == "kernel"]
    times = collections.Counter()
    if kernels:
        for e in kernels:
            times[e["name"]] += e["dur"]
        return {n: t / steps for n, t in times.items()}, steps, "gpu kernels"
    # CPU: self time of each operator, per thread, by nesting (events sorted by start, longest first).
    by_thread = collections.defaultdict(list)
    for e in complete:
        if e.get("cat") == "cpu_op":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, event, children's time]
        for e in ops:
            while stack and e["ts"] >= stack[-1][0]:
                end, top, inner = stack.pop()
                times[top["name"]] += top["dur"] - inner
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e, 0.0])
        while stack:
            end, top, inner = stack.pop()
            times[top["name"]] += top["dur"] - inner
    return {n: t / steps for n, t in times.items()}, steps, "cpu self time"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ours")
    p.add_argument("theirs")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default="")
    a = p.parse_args()
    try:
        ours, our_steps, our_kind = load(a.ours)
        theirs, their_steps, their_kind = load(a.theirs)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"compare_traces: cannot read a trace: {e}")
    ms = lambda us: us / 1000.0  # noqa: E731
    print(f"per step: fsdp.cpp {our_kind} over {our_steps} steps ({a.ours}); peer {their_kind} over {their_steps} ({a.theirs})")
    classes = collections.defaultdict(lambda: [0.0, 0.0])
    for name, t in ours.items():
        classes[classify(name)][0] += t
    for name, t in theirs.items():
        classes[classify(name)][1] += t
    print(f"{'class':<14} {'fsdp.cpp ms':>12} {'peer ms':>9} {'ratio':>6}")
    for label, (x, y) in sorted(classes.items(), key=lambda kv: -max(kv[1])):
        print(f"{label:<14} {ms(x):12.2f} {ms(y):9.2f} {x / y if y else float('inf'):6.2f}")
    total_ours, total_theirs = sum(ours.values()), sum(theirs.values())
    print(f"{'total':<14} {ms(total_ours):12.2f} {ms(total_theirs):9.2f} {total_ours / total_theirs if total_theirs else float('inf'):6.2f}")
    print(f"\ntop {a.top} of each (ms per step):")
    for title, table in (("fsdp.cpp", ours), ("peer", theirs)):
        print(f"  {title}:")
        for name, t in sorted(table.items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"    {ms(t):9.3f}  {classify(name):<13} {name[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ours": {"kind": our_kind, "steps": our_steps, "ms_per_step": {n: ms(t) for n, t in ours.items()}},
                       "peer": {"kind": their_kind, "steps": their_steps, "ms_per_step": {n: ms(t) for n, t in theirs.items()}},
                       "classes_ms_per_step": {k: [ms(v[0]), ms(v[1])] for k, v in classes.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
