#!/usr/bin/env python3
"""bench/compare_traces.py's device timeline on synthetic Kineto traces whose answers are known.

A GPU trace of two profiled steps (host windows ProfilerStep#2 [0, 1000) and #3 [1000, 2000) us):
step 2 launches two kernels on two streams, [500, 800) and [700, 900), and a copy that runs at
[1050, 1100), inside the host's window of step 3 (the device lags the host); step 3 launches
[1400, 1500) and [1450, 1700). A kernel launched before the profiled steps is left out.
  busy: 400 + 50 + 300 = 750 us over 2 steps = 0.375 ms; span 500..1700 = 0.6 ms a step;
  idle 0.225 ms a step; the step's edge 1100 -> 1400 = 0.3 ms.
A kernel placed by its own start rather than by its launch would put the copy in step 3 and read
an edge of 0.15 ms. A CPU-only trace has no device timeline.
The host's edge in the same trace: step 2's update (fsdp::clip_and_step) ends at 950, the loss
read between the steps (aten::item at 960) is outside any window, step 3's window opens at 1000 and
its first operator on the trainer's thread starts at 1005 (a gather at 1010; a background thread's
copy at 1001 is not the step's): 0.055 ms; step 3's update [1900, 1950) has no profiled step after
it and is left out. Measured to the next operator of any step it would read 0.01 ms, to the
window's opening 0.05, on any thread 0.051.
Usage: compare_traces_check.py bench/compare_traces.py
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

spec = importlib.util.spec_from_file_location("compare_traces", sys.argv[1])
compare_traces = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_traces)


MAIN = {"pid": 1, "tid": 1}  # the trainer's thread; tid 9: a background thread (a checkpoint writer)


def gpu_trace():
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 0, "dur": 1000},
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 1000, "dur": 1000},
              # The device's copy of a step mark: not a host window (were it one, it would split
              # step 2's launches).
              {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#2", "ts": 15, "dur": 1000},
              {"ph": "X", "cat": "user_annotation", "name": "fsdp::gather layers.0", "ts": 300, "dur": 5, **MAIN},
              {"ph": "X", "cat": "user_annotation", "name": "fsdp::clip_and_step", "ts": 800, "dur": 150, **MAIN},
              {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 960, "dur": 5, **MAIN},
              {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 1001, "dur": 2, "pid": 1, "tid": 9},
              {"ph": "X", "cat": "cpu_op", "name": "aten::zeros", "ts": 1005, "dur": 2, **MAIN},
              {"ph": "X", "cat": "user_annotation", "name": "fsdp::gather <root>", "ts": 1010, "dur": 5, **MAIN},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1020, "dur": 5, **MAIN},
              {"ph": "X", "cat": "user_annotation", "name": "fsdp::clip_and_step", "ts": 1900, "dur": 50, **MAIN}]
    work = [  # (host launch ts, category, device start, device end, stream)
        (-50, "kernel", -10, 0, 7),
        (10, "kernel", 500, 800, 7), (20, "kernel", 700, 900, 8), (30, "gpu_memcpy", 1050, 1100, 7),
        (1010, "kernel", 1400, 1500, 7), (1020, "kernel", 1450, 1700, 8)]
    for correlation, (launch, category, start, end, stream) in enumerate(work):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 2,
                       "args": {"correlation": correlation}})
        events.append({"ph": "X", "cat": category, "name": f"work{correlation}", "ts": start, "dur": end - start,
                       "tid": stream, "args": {"correlation": correlation, "stream": stream}})
    return events


def cpu_trace():
    return [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 0, "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 500, "pid": 1, "tid": 1}]


def near(a, b):
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


failures = []
# Kernel names as the two traces hold them (the compiled peer's Triton kernels named by what they
# fused: before 2026-12-07 "_to_copy" and "cat" in them made an RMSNorm and a SwiGLU "copy").
for name, expected in (("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
                       ("triton_poi_fused_cat_mul_silu_1", "elementwise"),
                       ("triton_red_fused__log_softmax_nll_loss_forward_2", "loss"),
                       ("void fsdp::models::cross_entropy_rows_kernel<c10::BFloat16>(...)", "loss"),
                       ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(...)", "loss"),
                       ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
                       ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
                       ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(...)", "attention"),
                       ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>(...)", "copy"),
                       ("void fsdp::models::add_rms_norm_forward_kernel<c10::BFloat16>(...)", "norm")):
    if compare_traces.classify(name) != expected:
        failures.append(f"classify({name!r}) = {compare_traces.classify(name)!r}, expected {expected!r}")
timeline = compare_traces.device_timeline(gpu_trace())
expected = {"steps": 2, "busy_ms": 0.375, "span_ms": 0.6, "idle_ms": 0.225, "edge_ms": 0.3}
for key, value in expected.items():
    if timeline is None or not near(timeline[key], value):
        failures.append(f"{key}: {None if timeline is None else timeline[key]}, expected {value}")
if not near(compare_traces.host_edge_ms(gpu_trace()), 0.055):
    failures.append(f"the host's edge: {compare_traces.host_edge_ms(gpu_trace())}, expected 0.055")
if compare_traces.host_edge_ms(cpu_trace()) is not None:
    failures.append("a trace without fsdp.cpp's scopes was given a host edge")
if compare_traces.device_timeline(cpu_trace()) is not None:
    failures.append("a CPU-only trace was given a device timeline")

# Through the command: the line and the JSON.
with tempfile.TemporaryDirectory() as work:
    paths = []
    for name, events in (("ours", gpu_trace()), ("peer", cpu_trace())):
        paths.append(os.path.join(work, name + ".json"))
        with open(paths[-1], "w") as f:
            json.dump({"traceEvents": events}, f)
    out = os.path.join(work, "out.json")
    run = subprocess.run([sys.executable, sys.argv[1], paths[0], paths[1], "--json", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"compare_traces.py exited {run.returncode}: {run.stderr}")
    else:
        if "busy 0.38 ms of a 0.60 ms span, idle 0.23 ms; at the step's edge" not in run.stdout or \
                "0.30 ms" not in run.stdout:
            failures.append("the printed timeline is not the expected one:\n" + run.stdout)
        if "host at the step's edge (the update's end to the next step's first operator): 0.06 ms" not in run.stdout:
            failures.append("the printed host edge is not the expected one:\n" + run.stdout)
        saved = json.load(open(out))["device_timeline"]
        if not near(saved["ours"]["edge_ms"], 0.3) or saved["peer"] is not None:
            failures.append(f"the JSON's device_timeline: {saved}")
        if not near(json.load(open(out))["host_edge_ms"]["ours"], 0.055):
            failures.append(f"the JSON's host_edge_ms: {json.load(open(out))['host_edge_ms']}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PASS: busy, span, idle and the step's edge of a two-step GPU trace, the host's edge; none for a CPU trace")
