// prefetch_l2 (CUDA only; gpud_protocol/ops/prefetch.py): the first na, nb, nc, nd bytes of four tensors
// requested into L2 before the wait for the kernel before, so they stream in while it runs. One block.

extern "C" __global__ void __launch_bounds__(256) prefetch_l2(const unsigned char* a, const unsigned char* b,
    const unsigned char* c, const unsigned char* d, unsigned int na, unsigned int nb, unsigned int nc,
    unsigned int nd) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
        gpud_prefetch_l2(a, na);
        gpud_prefetch_l2(b, nb);
        gpud_prefetch_l2(c, nc);
        gpud_prefetch_l2(d, nd);
    }
    gpud_wait_prior();  // the next kernel waits for this one: it must not end before the one before it
}
