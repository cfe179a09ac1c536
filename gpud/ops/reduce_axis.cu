// Reductions over any axis of x, and of strided views (see gpud_protocol/ops/reduce_axis.py for the
// interface). x points at its tensor's start and is seen as (outer, length, inner) through an element
// offset and one stride per part; outputs are dense. One thread per (o, i), walking the reduced axis;
// neighbouring threads read neighbouring i. Everything accumulates in float32; float16 is unsigned
// short storage, read into float32 and rounded once when stored. The grid folds into y.

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ float load(const float* p, unsigned int i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, unsigned int i) { return h2f(p[i]); }
__device__ __forceinline__ void store(float* p, unsigned int i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, unsigned int i, float v) { p[i] = f2h(v); }

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

constexpr float LOWEST = -3.40282347e38f;  // the most negative finite float: only -inf is below it

template <typename T>
__device__ __forceinline__ void reduce_axis(const T* x, float* out, unsigned int outer, unsigned int length,
                                            unsigned int inner, unsigned int op, unsigned int offset,
                                            unsigned int s_outer, unsigned int s_length, unsigned int s_inner) {
    unsigned int k = linear_index();
    if (k >= outer * inner) return;
    unsigned int base = offset + (k / inner) * s_outer + (k % inner) * s_inner;
    float total;
    if (op == 2) {
        total = load(x, base);
        for (unsigned int r = 1; r < length; ++r) total = fmaxf(total, load(x, base + r * s_length));
    } else {
        total = 0.0f;
        for (unsigned int r = 0; r < length; ++r) total += load(x, base + r * s_length);
        if (op == 1) total /= (float)length;
    }
    out[k] = total;
}

template <typename T>
__device__ __forceinline__ void argmax_axis(const T* x, int* out, unsigned int outer, unsigned int length,
                                            unsigned int inner, unsigned int offset, unsigned int s_outer,
                                            unsigned int s_length, unsigned int s_inner) {
    unsigned int k = linear_index();
    if (k >= outer * inner) return;
    unsigned int base = offset + (k / inner) * s_outer + (k % inner) * s_inner;
    float best = load(x, base);
    unsigned int at = 0;
    for (unsigned int r = 1; r < length; ++r) {
        float v = load(x, base + r * s_length);
        if (v > best) {  // strictly: ties keep the first index
            best = v;
            at = r;
        }
    }
    out[k] = (int)at;
}

template <typename T>
__device__ __forceinline__ void softmax_axis(const T* x, T* out, unsigned int outer, unsigned int length,
                                             unsigned int inner, unsigned int offset, unsigned int s_outer,
                                             unsigned int s_length, unsigned int s_inner) {
    unsigned int k = linear_index();
    if (k >= outer * inner) return;
    unsigned int o = k / inner, i = k % inner;
    unsigned int base = offset + o * s_outer + i * s_inner;
    float m = LOWEST, s = 0.0f;  // online: a -inf element adds exp(-inf) = 0
    for (unsigned int r = 0; r < length; ++r) {
        float v = load(x, base + r * s_length);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    float scale = s > 0.0f ? 1.0f / s : 0.0f;  // a row of only -inf: zeros, not NaN
    unsigned int first = o * length * inner + i;
    for (unsigned int r = 0; r < length; ++r)
        store(out, first + r * inner, expf(load(x, base + r * s_length) - m) * scale);
}

#define AXIS_PARAMS                                                                                                 \
    unsigned int outer, unsigned int length, unsigned int inner, unsigned int offset, unsigned int s_outer,      \
        unsigned int s_length, unsigned int s_inner
#define AXIS_ARGS outer, length, inner, offset, s_outer, s_length, s_inner

extern "C" __global__ void reduce_axis_f32(const float* x, float* out, unsigned int outer, unsigned int length,
                                           unsigned int inner, unsigned int op, unsigned int offset,
                                           unsigned int s_outer, unsigned int s_length, unsigned int s_inner) {
    reduce_axis(x, out, outer, length, inner, op, offset, s_outer, s_length, s_inner);
}

extern "C" __global__ void reduce_axis_f16(const unsigned short* x, float* out, unsigned int outer,
                                           unsigned int length, unsigned int inner, unsigned int op,
                                           unsigned int offset, unsigned int s_outer, unsigned int s_length,
                                           unsigned int s_inner) {
    reduce_axis(x, out, outer, length, inner, op, offset, s_outer, s_length, s_inner);
}

extern "C" __global__ void argmax_axis_f32(const float* x, int* out, AXIS_PARAMS) { argmax_axis(x, out, AXIS_ARGS); }
extern "C" __global__ void argmax_axis_f16(const unsigned short* x, int* out, AXIS_PARAMS) {
    argmax_axis(x, out, AXIS_ARGS);
}
extern "C" __global__ void softmax_axis_f32(const float* x, float* out, AXIS_PARAMS) { softmax_axis(x, out, AXIS_ARGS); }
extern "C" __global__ void softmax_axis_f16(const unsigned short* x, unsigned short* out, AXIS_PARAMS) {
    softmax_axis(x, out, AXIS_ARGS);
}
