// Activations of a float32 value, defined once for the elementwise ops (ew_unary's codes 3, 4 and 5) and
// the warpgroup matrix products' epilogue (gpud_protocol.ops.matmul.ACTIVATIONS: the epilogue scalar's
// bits 8..15, applied where their tiles are stored).

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// v through a matrix product's activation: epilogue >> 8 (0: v itself)
__device__ __forceinline__ float activate(float v, unsigned int epilogue) {
    switch (epilogue >> 8) {
        case 3: return silu(v);
        case 4: return gelu(v);
        case 5: return gelu_tanh(v);
        default: return v;
    }
}
