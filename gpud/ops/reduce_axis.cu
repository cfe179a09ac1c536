// Reductions over any axis of x, and of any view (see gpud_protocol/ops/reduce_axis.py for the
// interface). x points at its tensor's start and is read through an element offset and strides: the
// reduced axis's, and those of x's other axes merged into 6 (padded in front with size 1). Outputs are
// dense. One thread per output, walking the reduced axis. Everything accumulates in float32; float16
// is unsigned short storage, bfloat16 a struct of one (rounded on the bits, as elementwise.cu does),
// both read into float32 and rounded once when stored (halves.cu). The grid folds into y.

__device__ __forceinline__ float load(const float* p, unsigned int i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, unsigned int i) { return h2f(p[i]); }
__device__ __forceinline__ float load(const bf16* p, unsigned int i) { return __uint_as_float((unsigned int)p[i].bits << 16); }
__device__ __forceinline__ void store(float* p, unsigned int i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, unsigned int i, float v) { p[i] = f2h(v); }
__device__ __forceinline__ void store(bf16* p, unsigned int i, float v) { p[i].bits = f2bf(v); }

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

constexpr float LOWEST = -3.40282347e38f;  // the most negative finite float: only -inf is below it

struct Axis {
    unsigned int n, length, inner, offset, s_length;
    unsigned int size[6];
    unsigned int stride[6];
};

// The element of x's tensor where output k's walk starts (k unravelled over the other axes).
__device__ __forceinline__ unsigned int start_of(unsigned int k, const Axis& p) {
    unsigned int at = p.offset;
#pragma unroll
    for (int d = 5; d > 0; --d) {
        at += (k % p.size[d]) * p.stride[d];
        k /= p.size[d];
    }
    return at + k * p.stride[0];
}

template <typename T>
__device__ __forceinline__ void reduce_axis(const T* x, float* out, unsigned int op, const Axis& p) {
    unsigned int k = linear_index();
    if (k >= p.n) return;
    unsigned int base = start_of(k, p);
    float total;
    if (op == 2) {
        total = load(x, base);
        for (unsigned int r = 1; r < p.length; ++r) total = max_nan(total, load(x, base + r * p.s_length));
    } else {
        total = 0.0f;
        for (unsigned int r = 0; r < p.length; ++r) total += load(x, base + r * p.s_length);
        if (op == 1) total /= (float)p.length;
    }
    out[k] = total;
}

template <typename T>
__device__ __forceinline__ void argmax_axis(const T* x, int* out, const Axis& p) {
    unsigned int k = linear_index();
    if (k >= p.n) return;
    unsigned int base = start_of(k, p);
    float best = load(x, base);
    unsigned int at = 0;
    for (unsigned int r = 1; r < p.length; ++r) {
        float v = load(x, base + r * p.s_length);
        if (above(v, best)) {  // strictly: ties keep the first index (and the first NaN wins)
            best = v;
            at = r;
        }
    }
    out[k] = (int)at;
}

template <typename T>
__device__ __forceinline__ void softmax_axis(const T* x, T* out, const Axis& p) {
    unsigned int k = linear_index();
    if (k >= p.n) return;
    unsigned int base = start_of(k, p);
    float m = LOWEST, s = 0.0f;  // online: a -inf element adds exp(-inf) = 0
    for (unsigned int r = 0; r < p.length; ++r) {
        float v = load(x, base + r * p.s_length);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    float scale = s > 0.0f || is_nan(s) ? 1.0f / s : 0.0f;  // only -inf: zeros, not NaN; NaN: all NaN
    unsigned int first = (k / p.inner) * p.length * p.inner + k % p.inner;
    for (unsigned int r = 0; r < p.length; ++r)
        store(out, first + r * p.inner, expf(load(x, base + r * p.s_length) - m) * scale);
}

#define VIEW_PARAMS                                                                                                \
    unsigned int offset, unsigned int s_length, unsigned int s0, unsigned int s1, unsigned int s2,               \
        unsigned int s3, unsigned int s4, unsigned int s5, unsigned int t0, unsigned int t1, unsigned int t2,   \
        unsigned int t3, unsigned int t4, unsigned int t5
#define AXIS_OF {n, length, inner, offset, s_length, {s0, s1, s2, s3, s4, s5}, {t0, t1, t2, t3, t4, t5}}

extern "C" __global__ void reduce_axis_f32(const float* x, float* out, unsigned int n, unsigned int length,
                                           unsigned int inner, unsigned int op, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    reduce_axis(x, out, op, p);
}

extern "C" __global__ void reduce_axis_f16(const unsigned short* x, float* out, unsigned int n, unsigned int length,
                                           unsigned int inner, unsigned int op, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    reduce_axis(x, out, op, p);
}

extern "C" __global__ void argmax_axis_f32(const float* x, int* out, unsigned int n, unsigned int length,
                                           unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    argmax_axis(x, out, p);
}

extern "C" __global__ void argmax_axis_f16(const unsigned short* x, int* out, unsigned int n, unsigned int length,
                                           unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    argmax_axis(x, out, p);
}

extern "C" __global__ void softmax_axis_f32(const float* x, float* out, unsigned int n, unsigned int length,
                                            unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    softmax_axis(x, out, p);
}

extern "C" __global__ void softmax_axis_f16(const unsigned short* x, unsigned short* out, unsigned int n,
                                            unsigned int length, unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    softmax_axis(x, out, p);
}

extern "C" __global__ void reduce_axis_bf16(const bf16* x, float* out, unsigned int n, unsigned int length,
                                            unsigned int inner, unsigned int op, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    reduce_axis(x, out, op, p);
}

extern "C" __global__ void argmax_axis_bf16(const bf16* x, int* out, unsigned int n, unsigned int length,
                                            unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    argmax_axis(x, out, p);
}

extern "C" __global__ void softmax_axis_bf16(const bf16* x, bf16* out, unsigned int n, unsigned int length,
                                             unsigned int inner, VIEW_PARAMS) {
    gpud_wait_prior();
    Axis p = AXIS_OF;
    softmax_axis(x, out, p);
}
