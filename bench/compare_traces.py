#!/usr/bin/env python3
"""Two Chrome traces side by side, op by op: where one step's time goes in fsdp.cpp and in a peer.

    python3 bench/compare_traces.py OURS.json THEIRS.json [--top 25] [--json out.json]

OURS: fsdp-train --profile-steps (<output_dir>/profile/trace-rank0.json); THEIRS: bench/torch_fsdp2.py
--profile-steps (or any torch.profiler Chrome trace). Times are per profiled step (the traces'
ProfilerStep# marks are counted). On a GPU trace the GPU kernels are summed (category "kernel": they
do not nest, so the sums are the device's busy time); on a CPU-only trace the operators' self time
(an operator's time less that of the operators inside it, per thread). Kernels are also grouped
into classes (matmul, attention, loss, communication, norm, elementwise, copy, optimizer, other) by
name, for the compact comparison the fusions aim at; torch.compile's Triton kernels by what they
fused (an rsqrt: norm; a softmax: loss; else elementwise), not by the "_to_copy" in their names.
On GPU traces also the device's timeline: busy and idle time per step, and the idle time at the step's edge (between one step's last device work and
the next one's first), which the host's end-of-step work (reading the loss, the metrics' exchange,
the next batch) leaves. On fsdp.cpp's traces, CPU or GPU, that host work itself: from the end of a
step's update (the trainer's fsdp::clip_and_step scope) to the next step's first operator. scripts/gpu-check.sh runs it on the 1B Llama's pair.
"""
import argparse
import collections
import json
import sys

CLASSES = (  # first match wins; names lowercased
    ("communication", ("nccl", "all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "c10d::")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("loss", ("cross_entropy", "softmax", "nll_loss")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "matmul")),
    ("optimizer", ("adam", "foreach")),
    ("norm", ("rms", "layer_norm", "layernorm")),
    ("copy", ("copy", "memcpy", "memset", "cat", "contiguous", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "silu", "swiglu", "rotary", "triton", "aten::")),
)


def classify(name):
    low = name.lower()
    # torch.compile's generated kernels are named by what they fused ("triton_red_fused__to_copy_add_
    # mean_mul_pow_rsqrt_0": an RMSNorm), and "_to_copy" or "cat" in a name would make them copies.
    if low.startswith("triton_"):
        if "rsqrt" in low:
            return "norm"
        return "loss" if any(k in low for k in ("softmax", "nll_loss", "cross_entropy")) else "elementwise"
    for label, keys in CLASSES:
        if any(k in low for k in keys):
            return label
    return "other"


def read_events(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def load(events):
    """-> ({name: microseconds per step}, steps, 'gpu kernels' | 'cpu self time')"""
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


DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # the device's own work in a Kineto trace
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # the host calls that queued it


def union_length(intervals):
    """Total length covered by [start, end) intervals (streams overlap: counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def host_step_windows(events):
    """The host's profiled steps as sorted [start, end) microseconds (ProfilerStep#N; not the
    device's copies of those marks, which would split a step's launches)."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and "dur" in e and str(e.get("name", "")).startswith("ProfilerStep#")
                  and e.get("cat") != "gpu_user_annotation")


def device_timeline(events):
    """Where a GPU trace's device stood still, per profiled step, or None for a CPU-only trace.

    A step's device work is the kernels, copies and memsets whose launch (the host call with the same
    correlation id) lies inside the host's ProfilerStep#N: a kernel runs after the host call that
    queued it, so the device's step is found through the launch, not its own time. -> {steps,
    busy_ms (the union of the device's intervals over all streams), span_ms (the first work's start
    to the last one's end), idle_ms (span - busy), edge_ms: between one step's last device work and
    the next step's first (0 where they overlap), the mean over the boundaries}, each per step."""
    windows = host_step_windows(events)
    launch_step = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {}):
            for index, (start, end) in enumerate(windows):
                if start <= e["ts"] < end:
                    launch_step[e["args"]["correlation"]] = index
                    break
    per_step = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES and "dur" in e:
            index = launch_step.get(e.get("args", {}).get("correlation"))
            if index is not None:
                per_step[index].append((e["ts"], e["ts"] + e["dur"]))
    if not per_step:
        return None
    steps = sorted(per_step)
    everything = [i for index in steps for i in per_step[index]]
    busy = union_length(everything)
    span = max(end for _, end in everything) - min(start for start, _ in everything)
    edges = [max(0.0, min(s for s, _ in per_step[b]) - max(e for _, e in per_step[a]))
             for a, b in zip(steps, steps[1:])]
    n = len(steps)
    return {"steps": n, "busy_ms": busy / n / 1000.0, "span_ms": span / n / 1000.0,
            "idle_ms": (span - busy) / n / 1000.0,
            "edge_ms": sum(edges) / len(edges) / 1000.0 if edges else None}


UPDATE_SCOPE = "fsdp::clip_and_step"  # fsdp.cpp's trainer: the gradient norm, clipping and the optimizer


def host_edge_ms(events):
    """fsdp.cpp's host work at the step's edge, in ms: from the end of each update (fsdp::clip_and_step)
    to the first operator of the next profiled step on the update's thread (its window's first
    cpu_op there: the loss's zeros,
    the batch's copy, the first gather), the mean over the updates a profiled step follows; None
    where the trace has no such pair (a peer's trace, one profiled step). On a GPU the device waits
    at least this long between steps: the trainer synchronizes after the update, then agrees on the
    step's metrics, records them and loads the next batch before it issues more."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    windows = host_step_windows(events)
    updates = sorted((e["ts"] + e["dur"], e.get("pid"), e.get("tid")) for e in complete if e.get("name") == UPDATE_SCOPE)
    gaps = []
    for end, pid, tid in updates:
        window = next(((start, stop) for start, stop in windows if start >= end), None)
        if window is None:
            continue
        # The trainer's own thread: a background thread's operator (a checkpoint writer's) is not the step's.
        first = min((e["ts"] for e in complete if e.get("cat") == "cpu_op" and e.get("pid") == pid
                     and e.get("tid") == tid and window[0] <= e["ts"] < window[1]), default=None)
        if first is not None:
            gaps.append(first - end)
    return sum(gaps) / len(gaps) / 1000.0 if gaps else None


def describe_device(title, timeline):
    if timeline is None:
        return f"  {title}: no device work in the trace (a CPU trace)"
    edge = "one step profiled" if timeline["edge_ms"] is None else f"{timeline['edge_ms']:.2f} ms"
    return (f"  {title}: busy {timeline['busy_ms']:.2f} ms of a {timeline['span_ms']:.2f} ms span, idle "
            f"{timeline['idle_ms']:.2f} ms; at the step's edge (last work to the next step's first): {edge}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ours")
    p.add_argument("theirs")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default="")
    p.add_argument("--labels", nargs=2, default=["fsdp.cpp", "peer"], metavar=("OURS", "THEIRS"),
                   help="the two columns' names (two fsdp.cpp builds: before after)")
    a = p.parse_args()
    mine, peer = a.labels
    try:
        our_events, their_events = read_events(a.ours), read_events(a.theirs)
        ours, our_steps, our_kind = load(our_events)
        theirs, their_steps, their_kind = load(their_events)
        our_device, their_device = device_timeline(our_events), device_timeline(their_events)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"compare_traces: cannot read a trace: {e}")
    ms = lambda us: us / 1000.0  # noqa: E731
    print(f"per step: {mine} {our_kind} over {our_steps} steps ({a.ours}); {peer} {their_kind} over {their_steps} ({a.theirs})")
    classes = collections.defaultdict(lambda: [0.0, 0.0])
    for name, t in ours.items():
        classes[classify(name)][0] += t
    for name, t in theirs.items():
        classes[classify(name)][1] += t
    print(f"{'class':<14} {mine + ' ms':>12} {peer + ' ms':>12} {'ratio':>6}")
    for label, (x, y) in sorted(classes.items(), key=lambda kv: -max(kv[1])):
        print(f"{label:<14} {ms(x):12.2f} {ms(y):12.2f} {x / y if y else float('inf'):6.2f}")
    total_ours, total_theirs = sum(ours.values()), sum(theirs.values())
    print(f"{'total':<14} {ms(total_ours):12.2f} {ms(total_theirs):12.2f} {total_ours / total_theirs if total_theirs else float('inf'):6.2f}")
    print("\nthe device's timeline per step (kernels, copies and memsets of the steps the host launched):")
    print(describe_device(mine, our_device))
    print(describe_device(peer, their_device))
    our_host_edge = host_edge_ms(our_events)
    if our_host_edge is not None:
        print(f"  {mine}'s host at the step's edge (the update's end to the next step's first operator): {our_host_edge:.2f} ms")
    print(f"\ntop {a.top} of each (ms per step):")
    for title, table in ((mine, ours), (peer, theirs)):
        print(f"  {title}:")
        for name, t in sorted(table.items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"    {ms(t):9.3f}  {classify(name):<13} {name[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ours": {"kind": our_kind, "steps": our_steps, "ms_per_step": {n: ms(t) for n, t in ours.items()}},
                       "peer": {"kind": their_kind, "steps": their_steps, "ms_per_step": {n: ms(t) for n, t in theirs.items()}},
                       "classes_ms_per_step": {k: [ms(v[0]), ms(v[1])] for k, v in classes.items()},
                       "device_timeline": {"ours": our_device, "peer": their_device},
                       "host_edge_ms": {"ours": our_host_edge}}, f, indent=1)


if __name__ == "__main__":
    main()
