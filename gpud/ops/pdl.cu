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


// Starts bringing bytes [p, p + bytes) into L2 (sm_90 and later; elsewhere nothing): one bulk request,
// made by the one thread that calls it. A hint with no effect on any value (L2 is the memory's own
// cache: it holds what the kernel before wrote), so a kernel may make it for data it reads only after
// gpud_wait_prior(), while the kernel before it still runs. The request goes through its
// multiprocessor's copy engine, which a block does not outrun: each block asks for its own share, a few
// hundred KiB at most. Only the 16-byte aligned inside of the range is fetched.
__device__ __forceinline__ void gpud_prefetch_l2(const void* p, unsigned long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long start = ((unsigned long long)p + 15ull) & ~15ull;
    const unsigned long long end = ((unsigned long long)p + bytes) & ~15ull;
    if (p == 0 || end <= start || end - start >= (1ull << 32)) return;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(start), "r"((unsigned int)(end - start)) : "memory");
#endif
}
