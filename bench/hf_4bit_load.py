#!/usr/bin/env python3
"""transformers + bitsandbytes loading a Hugging Face directory 4-bit (load_in_4bit, NF4 with double
quantization, bf16 compute: QLoRA's recipe) in one process on the CPU, the peer fsdp.cpp's QLoRA
loading is measured against (bench/qlora_8b.sh). Prints one JSON line: the seconds from the start
of from_pretrained to the model in memory, the process's peak resident memory (VmHWM) and its
resident memory after loading.

  .venv/bin/python bench/hf_4bit_load.py runs/models/llama-3.1-8b-random
"""
import json
import sys
import time


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return -1


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    import torch
    import transformers

    torch.set_num_threads(1)  # as one fsdp.cpp rank of two on this 2-core machine
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                   bnb_4bit_use_double_quant=True,
                                                   bnb_4bit_compute_dtype=torch.bfloat16)
    before = status_kib("VmRSS:")
    start = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=quantization,
                                                              device_map="cpu", dtype=torch.bfloat16)
    seconds = time.time() - start
    four_bit = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
    print(json.dumps({"seconds": round(seconds, 1), "peak_resident_mib": round(status_kib("VmHWM:") / 1024, 1),
                      "resident_after_mib": round(status_kib("VmRSS:") / 1024, 1),
                      "resident_before_mib": round(before / 1024, 1), "linear4bit_layers": four_bit,
                      "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
