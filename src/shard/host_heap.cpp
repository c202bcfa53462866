#include "fsdp/shard/host_heap.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>

namespace fsdp::shard {
namespace {

// tcmalloc's C interface (gperftools' malloc_extension_c.h), found at run time so that a program
// without tcmalloc (the tests, a user's own) runs on glibc's heap with the same library.
struct Tcmalloc {
  int (*get_numeric_property)(const char* property, size_t* value) = nullptr;
  void (*release_free_memory)() = nullptr;
  bool present() const { return get_numeric_property != nullptr && release_free_memory != nullptr; }
  int64_t property(const char* name) const {
    size_t value = 0;
    return get_numeric_property(name, &value) ? static_cast<int64_t>(value) : 0;
  }
};

const Tcmalloc& tcmalloc() {
  static const Tcmalloc found = [] {
    Tcmalloc t;
    t.get_numeric_property =
        reinterpret_cast<int (*)(const char*, size_t*)>(dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"));
    t.release_free_memory = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"));
    return t;
  }();
  return found;
}

}  // namespace

HostHeap host_heap() { return tcmalloc().present() ? HostHeap::Tcmalloc : HostHeap::Glibc; }

const char* host_heap_name() { return host_heap() == HostHeap::Tcmalloc ? "tcmalloc" : "glibc"; }

bool keep_freed_host_memory_mapped() {
  if (host_heap() == HostHeap::Tcmalloc) return true;
  const bool threshold = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;  // glibc's maximum on 64-bit
  const bool trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return threshold && trim;
}

void release_free_host_memory() {
  if (host_heap() == HostHeap::Tcmalloc) {
    tcmalloc().release_free_memory();
  } else {
    malloc_trim(0);
  }
}

HostHeapBytes host_heap_bytes() {
  HostHeapBytes bytes;
  if (host_heap() == HostHeap::Tcmalloc) {
    const Tcmalloc& t = tcmalloc();
    bytes.in_use = t.property("generic.current_allocated_bytes");
    bytes.mapped = t.property("generic.heap_size") - t.property("tcmalloc.pageheap_unmapped_bytes");
  } else {
    const struct mallinfo2 heap = mallinfo2();
    bytes.in_use = static_cast<int64_t>(heap.uordblks + heap.hblkhd);
    bytes.mapped = static_cast<int64_t>(heap.arena + heap.hblkhd);
  }
  return bytes;
}

int64_t resident_host_bytes() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return -1;
  long long pages = 0, resident = -1;
  const bool read = std::fscanf(statm, "%lld %lld", &pages, &resident) == 2;
  std::fclose(statm);
  return read ? resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) : -1;
}

HeapGrowthGuard::HeapGrowthGuard(int64_t allowance) : allowance_(allowance), base_(resident_host_bytes()) {}

void HeapGrowthGuard::check() {
  const int64_t now = resident_host_bytes();
  if (now < 0 || base_ < 0 || now <= base_ + allowance_) return;
  release_free_host_memory();
  base_ = resident_host_bytes();  // lower after a release; `now` where the growth was live memory
}

}  // namespace fsdp::shard
