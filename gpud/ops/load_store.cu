// Elements of float32, float16 and bfloat16 (halves.cu) read as float32 and stored rounded once, at a
// 64-bit index: shared by the families that take them so (added before their source by gpud.ops.source).

__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, size_t i) { return h2f(p[i]); }
__device__ __forceinline__ float load(const bf16* p, size_t i) { return __uint_as_float((unsigned int)p[i].bits << 16); }
__device__ __forceinline__ void store(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, size_t i, float v) { p[i] = f2h(v); }
__device__ __forceinline__ void store(bf16* p, size_t i, float v) { p[i].bits = f2bf(v); }
// v as an element of the pointer's type would hold it: the rounding of a store.
__device__ __forceinline__ float rounded(const float*, float v) { return v; }
__device__ __forceinline__ float rounded(const unsigned short*, float v) { return h2f(f2h(v)); }
__device__ __forceinline__ float rounded(const bf16*, float v) { return __uint_as_float((unsigned int)f2bf(v) << 16); }
