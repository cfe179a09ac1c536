// Matrix products (see gpud_protocol/ops/matmul.py for the interface): out = x @ w (+ bias), float32
// accumulation. Float16 is unsigned short storage, converted with PTX cvt; bfloat16 is a struct of one
// unsigned short (a type of its own for the overloads), converted on the bits (out rounded to nearest
// even; NaN: the quiet NaN of its sign, as every bfloat16 kernel rounds). Blocks of 256 threads.
//
// matvec_<x>_<w> (at most 8 rows of x per weight matrix: decode), w as (N, K): threads_per_row(k)
// threads (32..256, a power of two) share a row of w; each thread reads 16 bytes of the row at a time
// (8 float16, or 8 float32 as two loads) with coalesced, streaming (evict-first) loads, 4 of them in
// flight before the first use (2 past 2 rows of x), and multiplies them by the same elements of every
// row of x (read through the read-only cache: x is small and every row of w reads it); warp shuffles,
// then shared memory, sum the row. The rows of x are a template parameter (1, 2, 4 or 8: the
// accumulators stay in registers; surplus rows repeat the last one and are not written).
// matvec_sx_<x>_<w> (CUDA only; gpud_protocol/ops/matvec_sx.py): the same with each thread taking 4 rows
// of w (up to 4 rows of x) or 2 (up to 8), reading each element of x once for all of them: x through L1
// bounds matvec with several rows of x by a wide w. A row's products are summed in the same order, so
// its bits are matvec's. A kernel of its own: its registers would cost matvec's one-row occupancy. Where K
// is not a multiple of 8 or a pointer not 16-byte aligned, the same threads read one element at a time.
// w as (K, N): 64 columns per block, 4 slices of K each, coalesced along the rows of w.
//
// matmul_<x>_<w>: 64 x 64 blocks of out, 4 x 4 per thread, K in steps of 16 through shared memory
// (float32, converted once when stored), double-buffered with the next step's global loads in
// registers while this step multiplies; 4-element vector loads where K (or N) allow it.
//
// No loop trusts the grid: every index is bounded by the scalars, which the daemon checked against
// the tensors.

#define BLOCK 256
#define ROWS 8     // matvec: most rows of x per weight matrix
#define COLS 64    // matvec, w as (K, N): columns per block
#define SLICES 4   // ... and slices of K
#define TILE 64    // matmul: out block per thread block
#define TK 16      // matmul: K step

typedef unsigned short half_t;
typedef unsigned long long u64;

__device__ __forceinline__ float h2f(half_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ half_t f2h(float f) { half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ float lo(unsigned int v) { return h2f((half_t)(v & 0xffffu)); }
__device__ __forceinline__ float hi(unsigned int v) { return h2f((half_t)(v >> 16)); }

struct bf16_t { unsigned short bits; };
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((x >> 16) & 0x8000u) | 0x7fc0u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float blo(unsigned int v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bhi(unsigned int v) { return __uint_as_float(v & 0xffff0000u); }

// one element as float32
__device__ __forceinline__ float ld1(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld1(const half_t* p, u64 i) { return h2f(p[i]); }
__device__ __forceinline__ float ldg1(const float* p, u64 i) { return __ldg(p + i); }
__device__ __forceinline__ float ldg1(const half_t* p, u64 i) { return h2f(__ldg(p + i)); }
__device__ __forceinline__ float ld1(const bf16_t* p, u64 i) { return bf2f(p[i].bits); }
__device__ __forceinline__ float ldg1(const bf16_t* p, u64 i) { return bf2f(__ldg(&p[i].bits)); }

__device__ __forceinline__ void st1(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st1(half_t* p, u64 i, float v) { p[i] = f2h(v); }
__device__ __forceinline__ void st1(bf16_t* p, u64 i, float v) { p[i].bits = f2bf(v); }

// 8 consecutive elements, 16-byte aligned, as raw bits: a streaming load (weights are read once)
struct Raw8 { uint4 a, b; };  // float32: 8 words in a and b; float16, bfloat16: 8 halves in a
__device__ __forceinline__ uint4 ld_cs(const void* p) {
    uint4 v;
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ Raw8 ld8_stream(const float* p) { Raw8 r; r.a = ld_cs(p); r.b = ld_cs(p + 4); return r; }
__device__ __forceinline__ Raw8 ld8_stream(const half_t* p) { Raw8 r; r.a = ld_cs(p); r.b = make_uint4(0, 0, 0, 0); return r; }
__device__ __forceinline__ Raw8 ld8_stream(const bf16_t* p) { Raw8 r; r.a = ld_cs(p); r.b = make_uint4(0, 0, 0, 0); return r; }
// ... and through the read-only cache (x: read by every row of w)
__device__ __forceinline__ Raw8 ld8_cached(const float* p) {
    Raw8 r;
    r.a = __ldg(reinterpret_cast<const uint4*>(p));
    r.b = __ldg(reinterpret_cast<const uint4*>(p + 4));
    return r;
}
__device__ __forceinline__ Raw8 ld8_cached(const half_t* p) {
    Raw8 r;
    r.a = __ldg(reinterpret_cast<const uint4*>(p));
    r.b = make_uint4(0, 0, 0, 0);
    return r;
}
__device__ __forceinline__ Raw8 ld8_cached(const bf16_t* p) {
    Raw8 r;
    r.a = __ldg(reinterpret_cast<const uint4*>(p));
    r.b = make_uint4(0, 0, 0, 0);
    return r;
}
__device__ __forceinline__ void unpack8(const Raw8& r, const float*, float* f) {
    f[0] = __uint_as_float(r.a.x); f[1] = __uint_as_float(r.a.y); f[2] = __uint_as_float(r.a.z); f[3] = __uint_as_float(r.a.w);
    f[4] = __uint_as_float(r.b.x); f[5] = __uint_as_float(r.b.y); f[6] = __uint_as_float(r.b.z); f[7] = __uint_as_float(r.b.w);
}
__device__ __forceinline__ void unpack8(const Raw8& r, const half_t*, float* f) {
    f[0] = lo(r.a.x); f[1] = hi(r.a.x); f[2] = lo(r.a.y); f[3] = hi(r.a.y);
    f[4] = lo(r.a.z); f[5] = hi(r.a.z); f[6] = lo(r.a.w); f[7] = hi(r.a.w);
}
__device__ __forceinline__ void unpack8(const Raw8& r, const bf16_t*, float* f) {
    f[0] = blo(r.a.x); f[1] = bhi(r.a.x); f[2] = blo(r.a.y); f[3] = bhi(r.a.y);
    f[4] = blo(r.a.z); f[5] = bhi(r.a.z); f[6] = blo(r.a.w); f[7] = bhi(r.a.w);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15u) == 0; }

__device__ __forceinline__ float bias_at(const void* bias, unsigned int kind, unsigned int j) {
    if (kind == 1) return static_cast<const float*>(bias)[j];
    if (kind >= 2) {  // 16 bits: float16 (2) or bfloat16 (3)
        const unsigned short h = static_cast<const unsigned short*>(bias)[j];
        return kind == 2 ? h2f(h) : bf2f(h);
    }
    return 0.0f;
}

// the same rule as threads_per_row in gpud_protocol/ops/matmul.py
__device__ __forceinline__ unsigned int threads_per_row(unsigned int k) {
    unsigned int t = 32;
    while (t < BLOCK && t * 32 < k) t <<= 1;
    return t;
}

// ---------------------------------------------------------------- matvec, w as (N, K)

// How matvec_nk reads x: rows of XT as they are. `prologue` runs once on every thread of the block (a
// norm's scales: NormX below), with the first weights already in flight where `early`; `vec` says
// whether x may be read 8 elements (16 bytes) at a time.
template <typename XT>
struct PlainX {
    static constexpr bool early = false;  // no prologue: the weights are loaded in the loop only
    typedef const XT* Row;
    const XT* x;
    unsigned int k;
    __device__ __forceinline__ bool vec() const { return aligned16(x); }
    __device__ __forceinline__ void prologue(unsigned int) const {}
    __device__ __forceinline__ Row row(unsigned int r) const { return x + (u64)r * k; }
    __device__ __forceinline__ void load8(Row p, unsigned int v, float* f) const { unpack8(ld8_cached(p + (u64)v * 8), p, f); }
    __device__ __forceinline__ float load1(Row p, unsigned int i) const { return ldg1(p, i); }
};

// matvec_norm's x: rmsnorm(x + res) * nw, made as it is read. The prologue computes each row's scale as
// add_rmsnorm_row (fused.cu) does, the block's 256 threads summing the same elements in the same order
// (block_sum.cu), and each element is (s * scale) * nw as it stores it: the product has the bits of the
// two ops. Block 0 stores x + res into sum.
template <typename NT>
struct NormX {
    static constexpr bool early = true;  // the first weights in flight during the prologue
    typedef unsigned int Row;  // the row's index
    const float* x;
    const float* res;
    const NT* nw;
    float* sum;
    unsigned int k;
    float eps;
    float* scales;  // shared memory, a row each
    bool wide;  // x, res and nw 16-byte aligned: read 16 bytes at a time
    // matvec's choice of order depends on w alone here: its x (the norm, stored apart) is always aligned
    __device__ __forceinline__ bool vec() const { return true; }
    __device__ __forceinline__ float at(unsigned int r, unsigned int j) const {
        const u64 i = (u64)r * k + j;
        return x[i] + res[i];
    }
    __device__ __forceinline__ void prologue(unsigned int m) const {
        for (unsigned int r = 0; r < m; r++) {
            float acc = 0.0f;
            for (unsigned int j = threadIdx.x; j < k; j += BLOCK) {
                const float s = at(r, j);
                if (blockIdx.x == 0 && blockIdx.y == 0) sum[(u64)r * k + j] = s;
                acc += s * s;
            }
            const float total = block_sum(acc);
            if (threadIdx.x == 0) scales[r] = 1.0f / sqrtf(total / (float)k + eps);
        }
        __syncthreads();
    }
    __device__ __forceinline__ Row row(unsigned int r) const { return r; }
    __device__ __forceinline__ void load8(Row r, unsigned int v, float* f) const {
        const u64 i = (u64)r * k + (u64)v * 8;
        float s[8], a[8], n8[8];
        if (wide) {
            unpack8(ld8_cached(x + i), x, s);
            unpack8(ld8_cached(res + i), res, a);
            unpack8(ld8_cached(nw + (u64)v * 8), nw, n8);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                s[e] = x[i + e];
                a[e] = res[i + e];
                n8[e] = ld1(nw, (u64)v * 8 + e);
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) s[e] = s[e] + a[e];
        const float scale = scales[r];
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = s[e] * scale * n8[e];
    }
    __device__ __forceinline__ float load1(Row r, unsigned int i) const { return at(r, i) * scales[r] * ld1(nw, i); }
};

// WR rows of w per thread, each multiplied by the same elements of x (read once for all of them); a
// row's products are summed in the same order whatever WR is (its bits do not depend on it). EARLY (the
// _ro kernels, w read-only): the first weights are loaded before waiting for the kernel before
// (gpud_wait_prior, which this then calls), so they stream while that kernel finishes.
template <typename WT, typename OT, int R, int U, int WR, bool EARLY = false, typename XL>
__device__ __forceinline__ void matvec_nk(const XL& xl, const WT* __restrict__ w, const void* __restrict__ bias,
                                          OT* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int epilogue, float* red) {
    const unsigned int t = threads_per_row(k);
    const unsigned int lane = threadIdx.x & (t - 1);
    const unsigned int slot = threadIdx.x / t;
    const u64 j0 = ((u64)(blockIdx.x + (u64)blockIdx.y * gridDim.x) * (BLOCK / t) + slot) * WR;
    float acc[WR][R];
#pragma unroll
    for (int q = 0; q < WR; q++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[q][r] = 0.0f;
    const bool live = j0 < n;
    const WT* w0 = w + j0 * k;  // (read only where live)
    const unsigned int wlast = live ? (unsigned int)min((u64)WR - 1, n - 1 - j0) : 0;  // rows past n repeat the last
#define WR_ROW(q) (w0 + (u64)min((unsigned int)(q), wlast) * k)
    typename XL::Row xr[R];
#pragma unroll
    for (int r = 0; r < R; r++) xr[r] = xl.row(min((unsigned int)r, m - 1));
    const bool vec = k % 8 == 0 && aligned16(w) && xl.vec();
    const unsigned int nv = k / 8;
    // 16-byte vectors of w (two of x when it is float32): U of them per row per thread in flight at once,
    // the first U issued before the prologue where the loader has one
    Raw8 wv[U][WR];
#define LOAD_W(V0)                                                           \
    for (int u = 0; u < U; u++) {                                            \
        const unsigned int v = (V0) + u * t;                                 \
        for (int q = 0; q < WR; q++)                                         \
            if (v < nv) wv[u][q] = ld8_stream(WR_ROW(q) + (u64)v * 8);       \
    }
    constexpr bool first = XL::early || EARLY;  // the first weights issued before the loop
    if (first && vec && live) {
#pragma unroll
        LOAD_W(lane)
    }
    if (EARLY) gpud_wait_prior();
    xl.prologue(m);
    if (live) {
        if (vec) {
            for (unsigned int v0 = lane; v0 < nv; v0 += U * t) {
                if (!first || v0 != lane) {
#pragma unroll
                    LOAD_W(v0)
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const unsigned int v = v0 + u * t;
                    if (v >= nv) break;
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float xf[8];
                        xl.load8(xr[r], v, xf);
#pragma unroll
                        for (int q = 0; q < WR; q++) {
                            float wf[8];
                            unpack8(wv[u][q], w, wf);
#pragma unroll
                            for (int e = 0; e < 8; e++) acc[q][r] = fmaf(xf[e], wf[e], acc[q][r]);
                        }
                    }
                }
            }
        } else {
            for (unsigned int i = lane; i < k; i += t) {
#pragma unroll
                for (int q = 0; q < WR; q++) {
                    const float wf = ld1(WR_ROW(q), i);
#pragma unroll
                    for (int r = 0; r < R; r++) acc[q][r] = fmaf(xl.load1(xr[r], i), wf, acc[q][r]);
                }
            }
        }
    }
#undef LOAD_W
#undef WR_ROW
    // a warp belongs to one slot (t >= 32): shuffle-sum its rows, then the slot's warps through shared memory
#pragma unroll
    for (int q = 0; q < WR; q++)
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) acc[q][r] += __shfl_xor_sync(0xffffffffu, acc[q][r], offset);
        }
    if (t > 32) {  // uniform: every thread of the block takes the same branch
        const unsigned int warp = threadIdx.x / 32;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int q = 0; q < WR; q++)
#pragma unroll
                for (int r = 0; r < R; r++) red[(q * R + r) * (BLOCK / 32) + warp] = acc[q][r];
        }
        __syncthreads();
        if (lane == 0) {
            const unsigned int first = slot * (t / 32), count = t / 32;
#pragma unroll
            for (int q = 0; q < WR; q++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = 0.0f;
                    for (unsigned int i = 0; i < count; i++) s += red[(q * R + r) * (BLOCK / 32) + first + i];
                    acc[q][r] = s;
                }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int q = 0; q < WR; q++) {
            const u64 j = j0 + q;
            if (j >= n) break;
            const float b = bias_at(bias, epilogue, (unsigned int)j);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if ((unsigned int)r < m) st1(out, (u64)r * n + j, acc[q][r] + b);
            }
        }
    }
}

// ---------------------------------------------------------------- matvec, w as (K, N)

template <typename XT, typename WT, typename OT, int R>
__device__ __forceinline__ void matvec_kn(const XT* __restrict__ x, const WT* __restrict__ w, const void* __restrict__ bias,
                                          OT* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int epilogue, float* red) {
    const unsigned int col = threadIdx.x % COLS;
    const unsigned int slice = threadIdx.x / COLS;
    const u64 j = (u64)(blockIdx.x + (u64)blockIdx.y * gridDim.x) * COLS + col;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if (j < n) {
        const XT* xr[R];
#pragma unroll
        for (int r = 0; r < R; r++) xr[r] = x + (u64)min((unsigned int)r, m - 1) * k;
#pragma unroll 4
        for (unsigned int i = slice; i < k; i += SLICES) {
            const float wf = ld1(w, (u64)i * n + j);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fmaf(ldg1(xr[r], i), wf, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) red[(slice * R + r) * COLS + col] = acc[r];
    __syncthreads();
    if (slice == 0 && j < n) {
        const float b = bias_at(bias, epilogue, (unsigned int)j);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = b;
#pragma unroll
            for (int i = 0; i < SLICES; i++) s += red[(i * R + r) * COLS + col];
            if ((unsigned int)r < m) st1(out, (u64)r * n + j, s);
        }
    }
}

template <bool EARLY = false, typename XT, typename WT, typename OT>
__device__ __forceinline__ void matvec(const XT* x, const WT* w, const void* bias, OT* out, unsigned int batch,
                                       unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
                                       unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    __shared__ float red[SLICES * ROWS * COLS];  // the larger of the two layouts' partial sums
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || m > ROWS || k == 0) return;  // uniform over the block
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    if (wt) {
        const PlainX<XT> xl{x, k};
        if (m == 1) matvec_nk<WT, OT, 1, 4, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
        else if (m <= 2) matvec_nk<WT, OT, 2, 4, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
        else if (m <= 4) matvec_nk<WT, OT, 4, 2, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
        else matvec_nk<WT, OT, 8, 2, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
    } else {
        if (EARLY) gpud_wait_prior();
        if (m == 1) matvec_kn<XT, WT, OT, 1>(x, w, bias, out, m, n, k, epilogue, red);
        else if (m <= 2) matvec_kn<XT, WT, OT, 2>(x, w, bias, out, m, n, k, epilogue, red);
        else if (m <= 4) matvec_kn<XT, WT, OT, 4>(x, w, bias, out, m, n, k, epilogue, red);
        else matvec_kn<XT, WT, OT, 8>(x, w, bias, out, m, n, k, epilogue, red);
    }
}

// ---------------------------------------------------------------- matmul: 64 x 64 tiles

// 4 consecutive elements from i (of which `valid` exist) as float32: one vector load when allowed
__device__ __forceinline__ void ld4(const float* p, u64 i, unsigned int valid, bool vec, float* f) {
    if (vec && valid >= 4) {
        const float4 v = *reinterpret_cast<const float4*>(p + i);
        f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = (unsigned int)e < valid ? p[i + e] : 0.0f;
}
__device__ __forceinline__ void ld4(const half_t* p, u64 i, unsigned int valid, bool vec, float* f) {
    if (vec && valid >= 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p + i);
        f[0] = lo(v.x); f[1] = hi(v.x); f[2] = lo(v.y); f[3] = hi(v.y);
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = (unsigned int)e < valid ? h2f(p[i + e]) : 0.0f;
}
__device__ __forceinline__ void ld4(const bf16_t* p, u64 i, unsigned int valid, bool vec, float* f) {
    if (vec && valid >= 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p + i);
        f[0] = blo(v.x); f[1] = bhi(v.x); f[2] = blo(v.y); f[3] = bhi(v.y);
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) f[e] = (unsigned int)e < valid ? bf2f(p[i + e].bits) : 0.0f;
}

template <typename XT, typename WT, typename OT>
__device__ __forceinline__ void matmul(const XT* __restrict__ x, const WT* __restrict__ w, const void* __restrict__ bias,
                                       OT* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                       unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt,
                                       unsigned int epilogue) {
    __shared__ __align__(16) float ta[2][TK][TILE];  // x tile, K-major
    __shared__ __align__(16) float tb[2][TK][TILE];  // w tile, K-major
    const unsigned int b = blockIdx.z;
    const unsigned int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    if (b >= batch || row0 >= m || col0 >= n || k == 0) return;  // uniform over the block
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    const unsigned int tid = threadIdx.x;
    const unsigned int tx = tid % 16, ty = tid / 16;
    // loaders: x (and w with wt) rows lr, K offsets lk..lk+3; w without wt: K offset nk, columns nc..nc+3
    const unsigned int lr = tid / 4, lk = (tid % 4) * 4;
    const unsigned int nk = tid / 16, nc = (tid % 16) * 4;
    const bool vx = k % 4 == 0 && aligned16(x);
    const bool vw = (wt ? k % 4 == 0 : n % 4 == 0) && aligned16(w);
    const unsigned int xrow = row0 + lr, wrow = col0 + lr;
    float ra[4], rb[4];

    // the step at k0 into registers
#define LOAD_STEP(k0)                                                                                      \
    {                                                                                                      \
        const unsigned int kx = (k0) + lk;                                                                 \
        ld4(x, (u64)xrow * k + kx, xrow < m && kx < k ? min(4u, k - kx) : 0u, vx, ra);                     \
        if (wt) {                                                                                          \
            ld4(w, (u64)wrow * k + kx, wrow < n && kx < k ? min(4u, k - kx) : 0u, vw, rb);                 \
        } else {                                                                                           \
            const unsigned int kw = (k0) + nk, c = col0 + nc;                                              \
            ld4(w, (u64)kw * n + c, kw < k && c < n ? min(4u, n - c) : 0u, vw, rb);                        \
        }                                                                                                  \
    }
    // ... and from registers into shared buffer s
#define STORE_STEP(s)                                                                                      \
    {                                                                                                      \
        _Pragma("unroll") for (int e = 0; e < 4; e++) ta[s][lk + e][lr] = ra[e];                           \
        if (wt) {                                                                                          \
            _Pragma("unroll") for (int e = 0; e < 4; e++) tb[s][lk + e][lr] = rb[e];                       \
        } else {                                                                                           \
            *reinterpret_cast<float4*>(&tb[s][nk][nc]) = make_float4(rb[0], rb[1], rb[2], rb[3]);          \
        }                                                                                                  \
    }

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    }
    const unsigned int steps = (k + TK - 1) / TK;
    LOAD_STEP(0u)
    STORE_STEP(0)
    __syncthreads();
    for (unsigned int s = 0; s < steps; s++) {
        const int cur = s & 1;
        const bool more = s + 1 < steps;
        if (more) LOAD_STEP((s + 1) * TK)
#pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            const float4 a = *reinterpret_cast<const float4*>(&ta[cur][kk][ty * 4]);
            const float4 bv = *reinterpret_cast<const float4*>(&tb[cur][kk][tx * 4]);
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bw[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bw[j], acc[i][j]);
            }
        }
        if (more) STORE_STEP(cur ^ 1)
        __syncthreads();
    }
#undef LOAD_STEP
#undef STORE_STEP

#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned int c = col0 + tx * 4 + j;
        if (c >= n) continue;
        const float bj = bias_at(bias, epilogue, c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned int r = row0 + ty * 4 + i;
            if (r < m) st1(out, (u64)r * n + c, acc[i][j] + bj);
        }
    }
}

// ---------------------------------------------------------------- entry points
// matvec_<x>_<w> and matmul_<x>_<w> for the pairs of PAIRS in gpud_protocol/ops/matmul.py (every pair of
// float32, float16 and bfloat16 but float16 with bfloat16); out is x's type when w shares it, else float.

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f32_f32(const float* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f32_f16(const float* x, const half_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f32_bf16(const float* x, const bf16_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f16_f32(const half_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_bf16_f32(const bf16_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_bf16_bf16(const bf16_t* x, const bf16_t* w, const void* bias, bf16_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

// matvec_norm_f32_<w>_<nw> (gpud_protocol/ops/matvec_norm.py): matvec_f32_<w> (w as (N, K)) of
// rmsnorm(x + res, nw) for 1 or 2 rows (matvec's 80 registers: 4 rows take 104), x + res stored into sum.
template <bool EARLY, typename WT, typename NT>
__device__ __forceinline__ void matvec_norm(const float* x, const float* res, const NT* nw, const WT* w, const void* bias,
                                            float* sum, float* out, unsigned int m, unsigned int n, unsigned int k,
                                            float eps, unsigned int epilogue) {
    __shared__ float red[2 * (BLOCK / 32)];
    __shared__ float scales[2];
    if (m == 0 || m > 2 || k == 0) return;  // uniform over the block
    const NormX<NT> xl{x, res, nw, sum, k, eps, scales, aligned16(x) && aligned16(res) && aligned16(nw)};
    if (m == 1) matvec_nk<WT, float, 1, 4, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
    else matvec_nk<WT, float, 2, 4, 1, EARLY>(xl, w, bias, out, m, n, k, epilogue, red);
}

// EARLY: the _ro kernel (gpud_protocol/ops/matvec_ro.py), which waits after loading its first weights
#define MATVEC_NORM(NAME, EARLY, WT, NT)                                                                         \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const float* x, const float* res, const NT* nw,      \
        const WT* w, const void* bias, float* sum, float* out, unsigned int m, unsigned int n, unsigned int k,   \
        float eps, unsigned int epilogue) {                                                                      \
        if (!EARLY) gpud_wait_prior();                                                                           \
        matvec_norm<EARLY>(x, res, nw, w, bias, sum, out, m, n, k, eps, epilogue);                               \
    }
#define MATVEC_NORMS(W, NW, WT, NT)                                                                              \
    MATVEC_NORM(matvec_norm_f32_##W##_##NW, false, WT, NT)                                                       \
    MATVEC_NORM(matvec_norm_ro_f32_##W##_##NW, true, WT, NT)
MATVEC_NORMS(f32, f32, float, float)
MATVEC_NORMS(f32, f16, float, half_t)
MATVEC_NORMS(f32, bf16, float, bf16_t)
MATVEC_NORMS(f16, f32, half_t, float)
MATVEC_NORMS(f16, f16, half_t, half_t)
MATVEC_NORMS(bf16, f32, bf16_t, float)
MATVEC_NORMS(bf16, bf16, bf16_t, bf16_t)

// matvec_ro_f32_<w> (gpud_protocol/ops/matvec_ro.py): matvec_f32_<w> of a read-only w, whose first weights
// are loaded before waiting for the kernel before (matvec_nk's EARLY)
#define MATVEC_RO(NAME, WT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const float* x, const WT* w, const void* bias,      \
        float* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,   \
        unsigned int w_stride, unsigned int wt, unsigned int epilogue) {                                       \
        matvec<true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);                       \
    }
MATVEC_RO(matvec_ro_f32_f32, float)
MATVEC_RO(matvec_ro_f32_f16, half_t)
MATVEC_RO(matvec_ro_f32_bf16, bf16_t)

// matvec_sx_<x>_<w>: up to 4 rows of x with 4 rows of w a thread, up to 8 with 2 (sx_rows in
// gpud_protocol/ops/matvec_sx.py; its grids count on them), w as (N, K) only
template <typename XT, typename WT>
__device__ __forceinline__ void matvec_sx(const XT* x, const WT* w, const void* bias, float* out, unsigned int batch,
                                          unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
                                          unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    __shared__ float red[4 * ROWS * (BLOCK / 32)];
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || m > ROWS || k == 0 || !wt) return;  // uniform over the block
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    const PlainX<XT> xl{x, k};
    if (m <= 4) matvec_nk<WT, float, 4, 2, 4>(xl, w, bias, out, m, n, k, epilogue, red);
    else matvec_nk<WT, float, 8, 1, 2>(xl, w, bias, out, m, n, k, epilogue, red);
}

#define MATVEC_SX(NAME, XT, WT)                                                                                 \
    extern "C" __global__ void __launch_bounds__(BLOCK) NAME(const XT* x, const WT* w, const void* bias, float* out, \
        unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,              \
        unsigned int w_stride, unsigned int wt, unsigned int epilogue) {                                       \
        gpud_wait_prior();                                                                                     \
        matvec_sx(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);                          \
    }
MATVEC_SX(matvec_sx_f32_f32, float, float)
MATVEC_SX(matvec_sx_f32_f16, float, half_t)
MATVEC_SX(matvec_sx_f32_bf16, float, bf16_t)

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f32_f32(const float* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f32_f16(const float* x, const half_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f32_bf16(const float* x, const bf16_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f16_f32(const half_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_bf16_f32(const bf16_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_bf16_bf16(const bf16_t* x, const bf16_t* w, const void* bias, bf16_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}
