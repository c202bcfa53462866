"""fsdp.cpp's NF4 (shard/nf4.h, through the fsdp_nf4 tool) against bitsandbytes on the CPU.

    python check_nf4.py PATH/TO/fsdp_nf4

For each case (real-shaped weights and sizes that are not a multiple of 64; fp32, bf16 and fp16;
block sizes 64 and 128; with and without double quantization):
  - quantize: fsdp.cpp's packed bytes, absmax (fp32, or the 8-bit codes), offset, nested absmax and
    nested map equal bitsandbytes' quantize_4bit bit for bit;
  - dequantize: fsdp.cpp's dequantization of its own bytes, and of bitsandbytes' bytes, equal
    bitsandbytes' dequantize_4bit bit for bit.
Exits non-zero naming the cases and fields that differ. bitsandbytes >= 0.47 runs on the CPU.
bitsandbytes 0.50's CPU dequantize_4bit takes each block's absmax per row, which is wrong where a
row is shorter than a block (a [400, 64] weight in blocks of 128): there the comparison is with
bitsandbytes' own pure-PyTorch definition of the format (backends/default/ops.py), and a note says
so. Elsewhere the two agree, and both are checked.
"""
import logging
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch
from safetensors.torch import load_file, save_file
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from bitsandbytes.backends.utils import _get_4bit_code

TOOL = sys.argv[1]


def weights():
    g = torch.Generator().manual_seed(0)
    cases = {
        # Llama-shaped linears (a 1B's dims scaled down) and odd sizes.
        "q_proj": torch.randn(256, 256, generator=g) * 0.02,
        "gate_proj": torch.randn(688, 256, generator=g) * 0.02,
        "odd_rows": torch.randn(33, 45, generator=g),        # 1485: not a multiple of 64, odd
        "short": torch.randn(7, generator=g),                # less than one block
        "wide_range": torch.randn(64, 130, generator=g) * torch.logspace(-4, 2, 130),
        "zeros_block": torch.cat([torch.zeros(64), torch.randn(200, generator=g)]),
        "one_hot": torch.cat([torch.zeros(127), torch.ones(1)]),
    }
    # Centred absmax values placed where the 8-bit map's first value (-0.993 or -1.0 in the search)
    # changes the nearest code: blocks whose absmax is 1 + d, so that after the mean is taken away
    # some land in (-0.9894, -0.9860) of the nested block's absmax.
    scales = torch.linspace(0.2, 3.0, 400)
    scales[::7] = 0.2 + (3.0 - 0.2) * (1 - 0.9875) / 2  # near the low end
    cases["nested_edges"] = (torch.randn(400, 64, generator=g).sign() * scales.view(-1, 1)).contiguous()
    return cases


def bnb_quantize(w, blocksize, double_quant, label):
    packed, state = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=double_quant, quant_type="nf4")
    state.dtype = w.dtype
    out = {"packed": packed.reshape(-1), "absmax": state.absmax.reshape(-1)}
    if double_quant:
        out["offset"] = state.offset.reshape(1).float()
        out["nested_absmax"] = state.state2.absmax.reshape(-1)
        out["nested_map"] = state.state2.code.reshape(-1)
    out["dequantized"] = reference_dequantize(packed, state, w.dtype, label)
    out["dequantized_fp32"] = reference_dequantize(packed, state, torch.float32)
    return out


KERNEL_DISAGREES = []  # (case, elements): where bitsandbytes' CPU kernel differs from its reference


def reference_dequantize(packed, state, dtype, label=None):
    """bitsandbytes' dequantize_4bit, checked against its own pure-PyTorch definition of the format
    (backends/default/ops.py), which is what this compares with where the two differ: bitsandbytes
    0.50's CPU kernel takes a block's absmax per row, wrong for rows shorter than a block."""
    kernel = F.dequantize_4bit(packed, state, quant_type="nf4").to(dtype)
    absmax = state.absmax
    if state.nested:
        absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    reference = _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), _get_4bit_code("nf4", packed.device),
                                         state.blocksize, state.shape, dtype)
    differ = (kernel.reshape(-1).float() != reference.reshape(-1).float()).sum().item()
    if differ and label:
        rows_split_blocks = len(state.shape) >= 2 and state.shape[-1] % state.blocksize != 0
        KERNEL_DISAGREES.append((label, differ, rows_split_blocks))
    return reference.reshape(-1)


def run(args):
    result = subprocess.run([TOOL] + args, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"fsdp_nf4 {' '.join(args)} failed: {result.stderr.strip()}")


def bitwise_equal(a, b):
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}"
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = (a.view(view) != b.view(view)).nonzero()
    if len(differ):
        i = differ[0].item()
        return f"{len(differ)} of {a.numel()} differ, first at {i}: {a[i].item()!r} against bitsandbytes' {b[i].item()!r}"
    return None


def main():
    failures, checked = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for blocksize, double_quant in ((64, True), (64, False), (128, True)):
                cases = {name: w.to(dtype) for name, w in weights().items()}
                inputs = os.path.join(tmp, "in.safetensors")
                ours_path = os.path.join(tmp, "ours.safetensors")
                save_file(cases, inputs)
                flags = ["--blocksize", str(blocksize)] + ([] if double_quant else ["--no-double-quant"])
                run(["quantize", inputs, ours_path] + flags)
                ours = load_file(ours_path)
                theirs_bytes = {}
                for name, w in cases.items():
                    label = f"{name} {str(dtype).split('.')[-1]} blocks of {blocksize}{' double-quant' if double_quant else ''}"
                    expected = bnb_quantize(w, blocksize, double_quant, label)
                    for field, value in expected.items():
                        if field == "dequantized_fp32":
                            continue
                        checked += 1
                        problem = bitwise_equal(ours[f"{name}.{field}"], value)
                        if problem:
                            failures.append(f"{label}: quantize's {field}: {problem}")
                    for field in ("packed", "absmax", "offset", "nested_absmax", "nested_map"):
                        if field in expected:
                            theirs_bytes[f"{name}.{field}"] = expected[field].contiguous()
                    theirs_bytes[f"{name}.shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
                    theirs_bytes[f"{name}.expected"] = expected["dequantized_fp32"].contiguous()
                # Our dequantize on bitsandbytes' own bytes.
                theirs_path = os.path.join(tmp, "theirs.safetensors")
                deq_path = os.path.join(tmp, "deq.safetensors")
                save_file({k: v for k, v in theirs_bytes.items() if not k.endswith(".expected")}, theirs_path)
                run(["dequantize", theirs_path, deq_path, "--blocksize", str(blocksize)])
                dequantized = load_file(deq_path)
                for name in cases:
                    checked += 1
                    problem = bitwise_equal(dequantized[f"{name}.dequantized"], theirs_bytes[f"{name}.expected"])
                    if problem:
                        failures.append(f"{name} {dtype} blocks of {blocksize}: dequantize of bitsandbytes' bytes: {problem}")
    import bitsandbytes

    for label, differ, rows_split_blocks in KERNEL_DISAGREES:
        if not rows_split_blocks:
            failures.append(f"{label}: bitsandbytes' CPU dequantize_4bit differs from its reference in {differ} elements, "
                            "though every row is whole blocks")
    if failures:
        print("\n".join(failures[:20]))
        sys.exit(f"nf4: {len(failures)} of {checked} comparisons with bitsandbytes {bitsandbytes.__version__} differ")
    for label, differ, _ in KERNEL_DISAGREES:
        print(f"note: bitsandbytes' CPU dequantize_4bit differs from its own reference on {label} ({differ} elements)")
    print(f"nf4: {checked} comparisons with bitsandbytes {bitsandbytes.__version__}, every one bit for bit")


if __name__ == "__main__":
    main()
