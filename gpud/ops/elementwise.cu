// Elementwise ops (see gpud_protocol/ops/elementwise.py for the interface). One thread per element;
// the grid may fold into y past 65,535 blocks. Float16 is unsigned short storage, computed in float32.

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

__device__ __forceinline__ float binary_op(float a, float b, unsigned int op) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 4: return a / (1.0f + expf(-a)) * b;
        default: return a / b;
    }
}

__device__ __forceinline__ float unary_op(float x, unsigned int op, float a) {
    switch (op) {
        case 0: return a * x;
        case 1: return expf(x);
        case 2: return rsqrtf(x);
        case 3: return x / (1.0f + expf(-x));
        case 4: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
        case 5: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        default: return tanhf(x);
    }
}

extern "C" __global__ void binary_f32(const float* x, const float* y, float* out, unsigned int n, unsigned int nx,
                                      unsigned int ny, unsigned int op) {
    unsigned int i = linear_index();
    if (i < n) out[i] = binary_op(x[i % nx], y[i % ny], op);
}

extern "C" __global__ void binary_f16(const unsigned short* x, const unsigned short* y, unsigned short* out,
                                      unsigned int n, unsigned int nx, unsigned int ny, unsigned int op) {
    unsigned int i = linear_index();
    if (i < n) out[i] = f2h(binary_op(h2f(x[i % nx]), h2f(y[i % ny]), op));
}

extern "C" __global__ void unary_f32(const float* x, float* out, unsigned int n, unsigned int op, float a) {
    unsigned int i = linear_index();
    if (i < n) out[i] = unary_op(x[i], op, a);
}

extern "C" __global__ void unary_f16(const unsigned short* x, unsigned short* out, unsigned int n, unsigned int op,
                                     float a) {
    unsigned int i = linear_index();
    if (i < n) out[i] = f2h(unary_op(h2f(x[i]), op, a));
}

extern "C" __global__ void cast_f32_f16(const float* x, unsigned short* out, unsigned int n) {
    unsigned int i = linear_index();
    if (i < n) out[i] = f2h(x[i]);
}

extern "C" __global__ void cast_f16_f32(const unsigned short* x, float* out, unsigned int n) {
    unsigned int i = linear_index();
    if (i < n) out[i] = h2f(x[i]);
}
