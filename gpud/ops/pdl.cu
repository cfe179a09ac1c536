// Programmatic dependent launch (sm_90 and later). In a CUDA graph whose edges between the library's
// kernels are programmatic, a kernel's blocks are launched while the kernel before it still runs: each
// entry point calls gpud_wait_prior() first, which waits until that kernel has completed and its
// writes are visible (griddepcontrol.wait), then lets the next kernel be launched
// (griddepcontrol.launch_dependents). After the wait, never before: a kernel launched early waits at
// the start, so at most one kernel waits ahead of the one running. Launched without that edge (one
// by one, or on older GPUs), both instructions do nothing.
__device__ __forceinline__ void gpud_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}


// Starts bringing bytes [p, p + bytes) into L2 (sm_90 and later; elsewhere nothing): the threads of the
// calling block split the range and each issues cp.async.bulk.prefetch.L2 for its part. A hint with no
// completion and no effect on any value (L2 is the memory's own cache), so a kernel may issue it for
// data it reads only after gpud_wait_prior(), while the kernel before it still runs. Only the 16-byte
// aligned inside of the range is fetched, and at most GPUD_PREFETCH_MAX bytes of it.
#define GPUD_PREFETCH_MAX (24ull << 20)
__device__ __forceinline__ void gpud_prefetch_l2(const void* p, unsigned long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long start = ((unsigned long long)p + 15ull) & ~15ull;
    const unsigned long long end = ((unsigned long long)p + bytes) & ~15ull;
    if (p == 0 || end <= start) return;
    const unsigned long long total = min(end - start, GPUD_PREFETCH_MAX);
    const unsigned long long part = (total / blockDim.x + 15ull) & ~15ull;
    const unsigned long long first = start + (unsigned long long)threadIdx.x * part;
    if (part == 0 || first >= start + total) return;
    const unsigned int size = (unsigned int)min(part, start + total - first);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"(size) : "memory");
#endif
}
