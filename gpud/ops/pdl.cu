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

