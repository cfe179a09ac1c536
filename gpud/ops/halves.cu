// float16 and bfloat16 on CUDA, shared by the families that take them (added before their source by
// gpud.ops.source: NVRTC takes no includes): float16 is unsigned short storage, bfloat16 a struct of one
// (a type of its own for the overloads), both read into float32 and rounded once when stored.

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

struct bf16 { unsigned short bits; };
__device__ __forceinline__ unsigned short f2bf(float f) {  // nearest even; NaN: the quiet NaN of its sign
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((x >> 16) & 0x8000u) | 0x7fc0u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
