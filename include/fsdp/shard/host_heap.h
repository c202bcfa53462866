// fsdp/shard/host_heap.h: the process's malloc, whichever serves it (glibc's, or tcmalloc where
// the program links it, as fsdp.cpp's apps do), seen through one interface: its settings for
// training, handing free pages back to the OS, and its bytes in use for the memory trace.
//
// Why the apps link tcmalloc: on a CPU run, activations, gradients and optimizer temporaries are
// host allocations of a few hundred sizes, freed and made again every step. glibc's heap strands
// freed blocks between longer-lived ones, so its resident peak stood 39-81 MiB above the live
// bytes that fsdp-plan counts; tcmalloc's size classes reuse them (docs/planning.md, "How close it
// comes"; docs/benchmarks.md has the step times and peaks side by side).
#pragma once

#include <cstdint>

namespace fsdp::shard {

enum class HostHeap { Glibc, Tcmalloc };

// Which malloc serves this process: tcmalloc where its extension interface is linked in (looked
// up once, by name, in the loaded libraries), glibc's otherwise.
HostHeap host_heap();
const char* host_heap_name();  // "glibc" | "tcmalloc"

// For the whole process (training programs call it first). glibc: freed blocks up to 32 MiB (its
// largest mmap threshold) stay in its heap instead of being unmapped, and the heap is not trimmed,
// so activations and gradients reuse resident pages instead of faulting fresh ones in. tcmalloc
// keeps freed blocks in its size classes and hands free pages back gradually (its
// TCMALLOC_RELEASE_RATE); left at its defaults, its steps measured 0.97x glibc's with these
// settings (docs/benchmarks.md). Returns false if glibc refused a setting.
bool keep_freed_host_memory_mapped();

// Returns the heap's free pages to the OS (glibc's malloc_trim, holes in the middle included;
// tcmalloc's ReleaseFreeMemory). For the moment between building a model and training it:
// construction frees whole blocks' parameters (each block is built in full, then sharded), leaving
// holes that training's smaller allocations would not fill, and that would otherwise stay resident.
void release_free_host_memory();

// The heap's bytes now: `in_use` by the program's live allocations, `mapped` the heap holds from
// the OS (in use, free and cached; released pages not counted).
struct HostHeapBytes {
  int64_t in_use = 0;
  int64_t mapped = 0;
};
HostHeapBytes host_heap_bytes();

// This process's resident memory now, in bytes (/proc/self/statm; -1 where it cannot be read).
int64_t resident_host_bytes();

// Hands the heap's free pages back (release_free_host_memory) whenever resident memory has grown
// `allowance` bytes past where it stood when the guard was made or last released. For loops of
// small, varied allocations that glibc's heap strands instead of reusing (evaluation: a ViT's 79
// test chunks grew the resident set 90 MiB with its live bytes flat, 2026-12-05): the resident
// peak stays within the allowance, and the page faults a release costs come once per `allowance`
// of growth, not once per iteration.
class HeapGrowthGuard {
 public:
  explicit HeapGrowthGuard(int64_t allowance);
  void check();  // cheap: one read of /proc/self/statm

 private:
  int64_t allowance_, base_;
};

}  // namespace fsdp::shard
