// The sum of every thread's v over the block (blockDim.x a multiple of 32, at most 1024): warp shuffles,
// one value per warp through shared memory, shuffles again (reduce.cu's block_reduce for Sum, in the same
// order); every thread gets it. Ends with a barrier so that it can be called again at once.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    return v;
}
