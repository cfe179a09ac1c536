// The matrix-product families' element conversions, put before their source (gpud.ops.source): float16
// by cvt, bfloat16 on the bits (nearest even; NaN the quiet NaN of its sign, as every bfloat16 kernel
// rounds), and a bias element of any float kind as float32.

typedef unsigned long long u64;

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((x >> 16) & 0x8000u) | 0x7fc0u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
// out's element from a float32: float16 (BF false) or bfloat16 bits
template <bool BF>
__device__ __forceinline__ unsigned short to_out(float f) { return BF ? f2bf(f) : f2h(f); }

// the bias kind, epilogue's low byte: 0 none (not read), 1 float32, 2 float16, 3 bfloat16
__device__ __forceinline__ float bias_at(const void* bias, unsigned int epilogue, unsigned int j) {
    const unsigned int kind = epilogue & 255u;
    if (kind == 1) return static_cast<const float*>(bias)[j];
    if (kind >= 2) {
        const unsigned short h = static_cast<const unsigned short*>(bias)[j];
        return kind == 2 ? h2f(h) : bf2f(h);
    }
    return 0.0f;
}

