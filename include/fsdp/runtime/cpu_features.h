// fsdp/runtime/cpu_features.h: what this machine's CPU computes natively, where that decides speed.
#pragma once

namespace fsdp::runtime {

// True when the CPU has bf16 dot-product instructions (x86: AVX512-BF16 or AMX-BF16, read from
// /proc/cpuinfo's flags; true where that cannot be read, so that nothing is claimed). Without
// them libtorch computes bf16 matmuls by widening to fp32 in software: on the 2-core AVX2 VM
// (AMD EPYC, 2026-12-02) bf16 training ran 6-10x slower than fp32 (docs/benchmarks.md).
bool cpu_has_bf16_instructions();

}  // namespace fsdp::runtime
