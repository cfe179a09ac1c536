// Layout: `contiguous`, any view copied into dense memory (see gpud_protocol/ops/layout.py for the
// interface). x points at its tensor's start and is read through the view's offset, sizes and strides
// (coalesced, padded in front with size 1 to 6 dimensions); out is dense. The kernels move bits:
// one element per thread (CUDA addresses bytes, so the 8- and 16-bit kernels need no word packing),
// the grid folded into y past 65,535 blocks. The grid of the 8- and 16-bit kernels is sized for the
// WGSL kernels' 4 and 2 elements per thread: each thread here walks that many.

struct View {
    unsigned int n, offset;
    unsigned int size[6];
    unsigned int stride[6];
};

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

// The element of x's tensor that element e (row-major) of the view is.
__device__ __forceinline__ unsigned int source_of(unsigned int e, const View& p) {
    unsigned int at = p.offset;
#pragma unroll
    for (int d = 5; d > 0; --d) {
        at += (e % p.size[d]) * p.stride[d];
        e /= p.size[d];
    }
    return at + e * p.stride[0];
}

template <typename T, int PER>
__device__ __forceinline__ void contiguous(const T* x, T* out, const View& p) {
    unsigned int first = linear_index() * PER;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        unsigned int e = first + k;
        if (e < p.n) out[e] = x[source_of(e, p)];
    }
}

#define VIEW_PARAMS                                                                                                \
    unsigned int n, unsigned int offset, unsigned int s0, unsigned int s1, unsigned int s2, unsigned int s3,     \
        unsigned int s4, unsigned int s5, unsigned int t0, unsigned int t1, unsigned int t2, unsigned int t3,   \
        unsigned int t4, unsigned int t5
#define VIEW_OF {n, offset, {s0, s1, s2, s3, s4, s5}, {t0, t1, t2, t3, t4, t5}}

extern "C" __global__ void contiguous_b8(const unsigned char* x, unsigned char* out, VIEW_PARAMS) {
    gpud_wait_prior();
    View p = VIEW_OF;
    contiguous<unsigned char, 4>(x, out, p);
}

extern "C" __global__ void contiguous_b16(const unsigned short* x, unsigned short* out, VIEW_PARAMS) {
    gpud_wait_prior();
    View p = VIEW_OF;
    contiguous<unsigned short, 2>(x, out, p);
}

extern "C" __global__ void contiguous_b32(const unsigned int* x, unsigned int* out, VIEW_PARAMS) {
    gpud_wait_prior();
    View p = VIEW_OF;
    contiguous<unsigned int, 1>(x, out, p);
}

extern "C" __global__ void contiguous_b64(const unsigned long long* x, unsigned long long* out, VIEW_PARAMS) {
    gpud_wait_prior();
    View p = VIEW_OF;
    contiguous<unsigned long long, 1>(x, out, p);
}
