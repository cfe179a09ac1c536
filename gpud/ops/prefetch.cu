// prefetch_l2 (CUDA only; gpud_protocol/ops/prefetch.py): the first na, nb, nc, nd bytes of four tensors
// requested into L2 before the wait for the kernel before, so they stream in while it runs. Block
// (x, y) asks for slice x (PREFETCH_SLICE bytes) of tensor y: a multiprocessor's copy engine serves a
// block's request, so the slices spread the bytes over the GPU.
#define PREFETCH_SLICE (128ull << 10)

extern "C" __global__ void __launch_bounds__(32) prefetch_l2(const unsigned char* a, const unsigned char* b,
    const unsigned char* c, const unsigned char* d, unsigned int na, unsigned int nb, unsigned int nc,
    unsigned int nd) {
    if (threadIdx.x == 0 && blockIdx.y < 4) {
        const unsigned char* p = blockIdx.y == 0 ? a : blockIdx.y == 1 ? b : blockIdx.y == 2 ? c : d;
        const unsigned long long n = blockIdx.y == 0 ? na : blockIdx.y == 1 ? nb : blockIdx.y == 2 ? nc : nd;
        const unsigned long long first = (unsigned long long)blockIdx.x * PREFETCH_SLICE;
        if (first < n) gpud_prefetch_l2(p + first, min(PREFETCH_SLICE, n - first));
    }
    gpud_wait_prior();  // the next kernel waits for this one: it must not end before the one before it
}
