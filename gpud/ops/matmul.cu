// Matrix products (see gpud_protocol/ops/matmul.py for the interface): out = x @ w (+ bias), float32
// accumulation. Float16 is unsigned short storage, converted with PTX cvt. Blocks of 256 threads.
//
// matvec_<x>_<w> (at most 8 rows of x per weight matrix: decode), w as (N, K): threads_per_row(k)
// threads (32..256, a power of two) share a row of w; each thread reads 16 bytes of the row at a time
// (8 float16, or 8 float32 as two loads) with coalesced, streaming (evict-first) loads, 4 of them in
// flight before the first use (2 past 2 rows of x), and multiplies them by the same elements of every
// row of x (read through the read-only cache: x is small and every row of w reads it); warp shuffles,
// then shared memory, sum the row. The rows of x are a template parameter (1, 2, 4 or 8: the
// accumulators stay in registers; surplus rows repeat the last one and are not written). Where K is
// not a multiple of 8 or a pointer not 16-byte aligned, the same threads read one element at a time.
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

// one element as float32
__device__ __forceinline__ float ld1(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld1(const half_t* p, u64 i) { return h2f(p[i]); }
__device__ __forceinline__ float ldg1(const float* p, u64 i) { return __ldg(p + i); }
__device__ __forceinline__ float ldg1(const half_t* p, u64 i) { return h2f(__ldg(p + i)); }

__device__ __forceinline__ void st1(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st1(half_t* p, u64 i, float v) { p[i] = f2h(v); }

// 8 consecutive elements, 16-byte aligned, as raw bits: a streaming load (weights are read once)
struct Raw8 { uint4 a, b; };  // float32: 8 words in a and b; float16: 8 halves in a
__device__ __forceinline__ uint4 ld_cs(const void* p) {
    uint4 v;
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ Raw8 ld8_stream(const float* p) { Raw8 r; r.a = ld_cs(p); r.b = ld_cs(p + 4); return r; }
__device__ __forceinline__ Raw8 ld8_stream(const half_t* p) { Raw8 r; r.a = ld_cs(p); r.b = make_uint4(0, 0, 0, 0); return r; }
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
__device__ __forceinline__ void unpack8(const Raw8& r, const float*, float* f) {
    f[0] = __uint_as_float(r.a.x); f[1] = __uint_as_float(r.a.y); f[2] = __uint_as_float(r.a.z); f[3] = __uint_as_float(r.a.w);
    f[4] = __uint_as_float(r.b.x); f[5] = __uint_as_float(r.b.y); f[6] = __uint_as_float(r.b.z); f[7] = __uint_as_float(r.b.w);
}
__device__ __forceinline__ void unpack8(const Raw8& r, const half_t*, float* f) {
    f[0] = lo(r.a.x); f[1] = hi(r.a.x); f[2] = lo(r.a.y); f[3] = hi(r.a.y);
    f[4] = lo(r.a.z); f[5] = hi(r.a.z); f[6] = lo(r.a.w); f[7] = hi(r.a.w);
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15u) == 0; }

__device__ __forceinline__ float bias_at(const void* bias, unsigned int kind, unsigned int j) {
    if (kind == 1) return static_cast<const float*>(bias)[j];
    if (kind == 2) return h2f(static_cast<const half_t*>(bias)[j]);
    return 0.0f;
}

// the same rule as threads_per_row in gpud_protocol/ops/matmul.py
__device__ __forceinline__ unsigned int threads_per_row(unsigned int k) {
    unsigned int t = 32;
    while (t < BLOCK && t * 32 < k) t <<= 1;
    return t;
}

// ---------------------------------------------------------------- matvec, w as (N, K)

template <typename XT, typename WT, typename OT, int R, int U>
__device__ __forceinline__ void matvec_nk(const XT* __restrict__ x, const WT* __restrict__ w, const void* __restrict__ bias,
                                          OT* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int bias_kind, float* red) {
    const unsigned int t = threads_per_row(k);
    const unsigned int lane = threadIdx.x & (t - 1);
    const unsigned int slot = threadIdx.x / t;
    const u64 j = (u64)(blockIdx.x + (u64)blockIdx.y * gridDim.x) * (BLOCK / t) + slot;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if (j < n) {
        const WT* wr = w + j * k;
        const XT* xr[R];
#pragma unroll
        for (int r = 0; r < R; r++) xr[r] = x + (u64)min((unsigned int)r, m - 1) * k;
        if (k % 8 == 0 && aligned16(w) && aligned16(x)) {
            // 16-byte vectors of w (two of x when it is float32): U of them per thread in flight at once
            const unsigned int nv = k / 8;
            for (unsigned int v0 = lane; v0 < nv; v0 += U * t) {
                Raw8 wv[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const unsigned int v = v0 + u * t;
                    if (v < nv) wv[u] = ld8_stream(wr + (u64)v * 8);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const unsigned int v = v0 + u * t;
                    if (v >= nv) break;
                    float wf[8];
                    unpack8(wv[u], wr, wf);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float xf[8];
                        unpack8(ld8_cached(xr[r] + (u64)v * 8), xr[r], xf);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r] = fmaf(xf[e], wf[e], acc[r]);
                    }
                }
            }
        } else {
            for (unsigned int i = lane; i < k; i += t) {
                const float wf = ld1(wr, i);
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] = fmaf(ldg1(xr[r], i), wf, acc[r]);
            }
        }
    }
    // a warp belongs to one row (t >= 32): shuffle-sum it, then the row's warps through shared memory
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
    }
    if (t > 32) {  // uniform: every thread of the block takes the same branch
        const unsigned int warp = threadIdx.x / 32;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) red[r * (BLOCK / 32) + warp] = acc[r];
        }
        __syncthreads();
        if (lane == 0) {
            const unsigned int first = slot * (t / 32), count = t / 32;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = 0.0f;
                for (unsigned int i = 0; i < count; i++) s += red[r * (BLOCK / 32) + first + i];
                acc[r] = s;
            }
        }
    }
    if (lane == 0 && j < n) {
        const float b = bias_at(bias, bias_kind, (unsigned int)j);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if ((unsigned int)r < m) st1(out, (u64)r * n + j, acc[r] + b);
        }
    }
}

// ---------------------------------------------------------------- matvec, w as (K, N)

template <typename XT, typename WT, typename OT, int R>
__device__ __forceinline__ void matvec_kn(const XT* __restrict__ x, const WT* __restrict__ w, const void* __restrict__ bias,
                                          OT* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int bias_kind, float* red) {
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
        const float b = bias_at(bias, bias_kind, (unsigned int)j);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float s = b;
#pragma unroll
            for (int i = 0; i < SLICES; i++) s += red[(i * R + r) * COLS + col];
            if ((unsigned int)r < m) st1(out, (u64)r * n + j, s);
        }
    }
}

template <typename XT, typename WT, typename OT>
__device__ __forceinline__ void matvec(const XT* x, const WT* w, const void* bias, OT* out, unsigned int batch,
                                       unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
                                       unsigned int w_stride, unsigned int wt, unsigned int bias_kind) {
    __shared__ float red[SLICES * ROWS * COLS];  // the larger of the two layouts' partial sums
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || m > ROWS || k == 0) return;  // uniform over the block
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    if (wt) {
        if (m == 1) matvec_nk<XT, WT, OT, 1, 4>(x, w, bias, out, m, n, k, bias_kind, red);
        else if (m <= 2) matvec_nk<XT, WT, OT, 2, 4>(x, w, bias, out, m, n, k, bias_kind, red);
        else if (m <= 4) matvec_nk<XT, WT, OT, 4, 2>(x, w, bias, out, m, n, k, bias_kind, red);
        else matvec_nk<XT, WT, OT, 8, 2>(x, w, bias, out, m, n, k, bias_kind, red);
    } else {
        if (m == 1) matvec_kn<XT, WT, OT, 1>(x, w, bias, out, m, n, k, bias_kind, red);
        else if (m <= 2) matvec_kn<XT, WT, OT, 2>(x, w, bias, out, m, n, k, bias_kind, red);
        else if (m <= 4) matvec_kn<XT, WT, OT, 4>(x, w, bias, out, m, n, k, bias_kind, red);
        else matvec_kn<XT, WT, OT, 8>(x, w, bias, out, m, n, k, bias_kind, red);
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

template <typename XT, typename WT, typename OT>
__device__ __forceinline__ void matmul(const XT* __restrict__ x, const WT* __restrict__ w, const void* __restrict__ bias,
                                       OT* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                       unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt,
                                       unsigned int bias_kind) {
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
        const float bj = bias_at(bias, bias_kind, c);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned int r = row0 + ty * 4 + i;
            if (r < m) st1(out, (u64)r * n + c, acc[i][j] + bj);
        }
    }
}

// ---------------------------------------------------------------- matmul_tc: float16 on the tensor cores

// mma.sync m16n8k16 (float16 in, float32 accumulators), fragments through ldmatrix, tiles through a
// cp.async pipeline of S stages in static shared memory (48 KB at most). A block of WM x WN x WK warps
// computes a BM x BN tile of out; each warp a (BM / WM) x (BN / WN) part of it over 1 / WK of every
// stage's K (WK > 1 splits K inside the block: the partial sums meet in shared memory at the end).
// Shared tiles are rows of 16-byte chunks, the chunk index XOR-swizzled by the row so that ldmatrix
// and cp.async hit 8 distinct bank groups. x and w as (N, K) are K-major (ldmatrix); w as (K, N) is
// N-major (ldmatrix.trans). Where K (or N for w as (K, N)) is not a multiple of 8, or an operand not
// 16-byte aligned, the same loaders read one element at a time (correct, slower). Blocks walk the
// tiles in groups of TC_GROUP_M tiles of M so that a wave of blocks shares its tiles of w and x in L2.

#define TC_GROUP_M 8

__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src, unsigned int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm4(unsigned int addr, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm4t(unsigned int addr, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void mma16816(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the physical 16-byte chunk of chunk c in row r of a tile of R chunks a row
template <int R>
__device__ __forceinline__ unsigned int swz(unsigned int r, unsigned int c) {
    return R >= 8 ? c ^ (r & 7u) : c ^ ((r / (8 / R)) & (R - 1));
}

// NR x (8 R) halves of g (row stride ld; rows from row0 below `rows`, columns from col0 below `cols`,
// zeros past them) into the swizzled shared tile at s (its shared address sa), by NT threads
template <int NR, int R, int NT>
__device__ __forceinline__ void tc_load(unsigned short* s, unsigned int sa, const half_t* g, u64 ld, unsigned int row0,
                                        unsigned int rows, unsigned int col0, unsigned int cols, bool vec) {
    constexpr int CHUNKS = NR * R;
#pragma unroll
    for (int i = 0; i < (CHUNKS + NT - 1) / NT; i++) {
        const unsigned int idx = threadIdx.x + i * NT;
        if (CHUNKS % NT != 0 && idx >= CHUNKS) break;
        const unsigned int r = idx / R, c = idx % R;
        const unsigned int gr = row0 + r, gc = col0 + c * 8;
        const unsigned int off = (r * R + swz<R>(r, c)) * 8;  // in halves
        if (vec) {
            const bool ok = gr < rows && gc < cols;
            cp_async16(sa + off * 2, ok ? g + (u64)gr * ld + gc : g, ok ? 16u : 0u);
        } else {
            unsigned int v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int c0 = gc + 2 * e;
                const unsigned int l = gr < rows && c0 < cols ? g[(u64)gr * ld + c0] : 0u;
                const unsigned int h = gr < rows && c0 + 1 < cols ? g[(u64)gr * ld + c0 + 1] : 0u;
                v[e] = l | (h << 16);
            }
            *reinterpret_cast<uint4*>(s + off) = make_uint4(v[0], v[1], v[2], v[3]);
        }
    }
}

template <int BM, int BN, int BK, int WM, int WN, int WK, int S, bool WT>
__device__ __forceinline__ void matmul_tc_body(unsigned short* smem, const half_t* __restrict__ x,
                                               const half_t* __restrict__ w, const void* __restrict__ bias,
                                               half_t* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                               unsigned int bias_kind, unsigned int m0, unsigned int n0) {
    constexpr int NT = WM * WN * WK * 32;
    constexpr int TM = BM / WM, TN = BN / WN;  // a warp's part of the tile
    constexpr int MI = TM / 16, NJ = TN / 16;  // its m16 blocks, and n16 blocks (two n8 mma each)
    constexpr int KS = BK / 16 / WK;           // its k16 steps per stage
    constexpr int RA = BK / 8, RB = WT ? BK / 8 : BN / 8;  // chunks per row of the x tile and the w tile
    constexpr int A_ELEMS = BM * BK, STAGE = (BM + BN) * BK;
    static_assert(TM % 16 == 0 && TN % 16 == 0 && (BK / 16) % WK == 0 && KS >= 1, "tile shape");

    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int wk = warp / (WM * WN), wmn = warp % (WM * WN);
    const unsigned int wm = wmn / WN, wn = wmn % WN;
    const bool vx = k % 8 == 0 && aligned16(x);
    const bool vw = (WT ? k % 8 == 0 : n % 8 == 0) && aligned16(w);
    const unsigned int base = smem_u32(smem);
    const unsigned int ktiles = (k + BK - 1) / BK;

    float acc[MI][2 * NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++) {
#pragma unroll
        for (int j = 0; j < 2 * NJ; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
        }
    }

    auto load_stage = [&](unsigned int slot, unsigned int kt) {
        unsigned short* sa = smem + slot * STAGE;
        const unsigned int k0 = kt * BK;
        tc_load<BM, RA, NT>(sa, base + slot * STAGE * 2, x, k, m0, m, k0, k, vx);
        if (WT) {
            tc_load<BN, RB, NT>(sa + A_ELEMS, base + (slot * STAGE + A_ELEMS) * 2, w, k, n0, n, k0, k, vw);
        } else {
            tc_load<BK, RB, NT>(sa + A_ELEMS, base + (slot * STAGE + A_ELEMS) * 2, w, n, k0, k, n0, n, vw);
        }
    };

#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if ((unsigned int)s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<S - 2>();
        __syncthreads();  // stage kt is in, and every warp is done with the slot refilled next
        const unsigned int next = kt + S - 1;
        if (next < ktiles) load_stage(next % S, next);
        cp_async_commit();
        const unsigned int a_base = base + (kt % S) * STAGE * 2, b_base = a_base + A_ELEMS * 2;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const unsigned int kk = wk + ks * WK;  // this k16 step of the stage
            unsigned int af[MI][4], bf[NJ][4];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                const unsigned int r = wm * TM + i * 16 + (lane & 15u), c = kk * 2 + (lane >> 4);
                ldsm4(a_base + (r * RA + swz<RA>(r, c)) * 16, af[i]);
            }
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                if (WT) {
                    const unsigned int r = wn * TN + j * 16 + (lane & 7u) + ((lane >> 4) << 3);
                    const unsigned int c = kk * 2 + ((lane >> 3) & 1u);
                    ldsm4(b_base + (r * RB + swz<RB>(r, c)) * 16, bf[j]);
                } else {
                    const unsigned int r = kk * 16 + (lane & 7u) + (((lane >> 3) & 1u) << 3);
                    const unsigned int c = (wn * TN + j * 16) / 8 + (lane >> 4);
                    ldsm4t(b_base + (r * RB + swz<RB>(r, c)) * 16, bf[j]);
                }
            }
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    mma16816(acc[i][2 * j], af[i], bf[j][0], bf[j][1]);
                    mma16816(acc[i][2 * j + 1], af[i], bf[j][2], bf[j][3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    cp_async_wait<0>();

    if (WK > 1) {  // the K-split warps add their partial sums into those of the warps with wk == 0
        constexpr int ACC = MI * 2 * NJ * 4;
        float* red = reinterpret_cast<float*>(smem);
        __syncthreads();  // every warp is done with the pipeline's buffers
        if (wk > 0) {
            float* dst = red + ((wk - 1) * (WM * WN) + wmn) * ACC * 32 + lane;
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int j = 0; j < 2 * NJ; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) dst[((i * 2 * NJ + j) * 4 + e) * 32] = acc[i][j][e];
                }
            }
        }
        __syncthreads();
        if (wk > 0) return;
#pragma unroll
        for (int q = 1; q < WK; q++) {
            const float* src = red + ((q - 1) * (WM * WN) + wmn) * ACC * 32 + lane;
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int j = 0; j < 2 * NJ; j++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][j][e] += src[((i * 2 * NJ + j) * 4 + e) * 32];
                }
            }
        }
    }

    // out: thread (g, t) of the warp holds rows g and g + 8, columns 2t and 2t + 1 of each m16 x n8 block
    const bool pairs = n % 2 == 0 && (reinterpret_cast<u64>(out) & 3u) == 0;
#pragma unroll
    for (int j = 0; j < 2 * NJ; j++) {
        const unsigned int c = n0 + wn * TN + j * 8 + 2 * (lane & 3u);
        if (c >= n) continue;
        const float b0 = bias_at(bias, bias_kind, c);
        const float b1 = c + 1 < n ? bias_at(bias, bias_kind, c + 1) : 0.0f;
#pragma unroll
        for (int i = 0; i < MI; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const unsigned int r = m0 + wm * TM + i * 16 + (lane >> 2) + h * 8;
                if (r >= m) continue;
                const half_t lo16 = f2h(acc[i][j][2 * h] + b0), hi16 = f2h(acc[i][j][2 * h + 1] + b1);
                const u64 o = (u64)r * n + c;
                if (pairs) {
                    *reinterpret_cast<unsigned int*>(out + o) = (unsigned int)lo16 | ((unsigned int)hi16 << 16);
                } else {
                    out[o] = lo16;
                    if (c + 1 < n) out[o + 1] = hi16;
                }
            }
        }
    }
}

// the block's tile from the grid (see tc_grid in gpud_protocol/ops/matmul.py), then the body for w's layout
template <int BM, int BN, int BK, int WM, int WN, int WK, int S>
__device__ __forceinline__ void matmul_tc(const half_t* x, const half_t* w, const void* bias, half_t* out,
                                          unsigned int batch, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int x_stride, unsigned int w_stride, unsigned int wt,
                                          unsigned int bias_kind) {
    constexpr int PIPE = S * (BM + BN) * BK * 2, RED = (WK - 1) * BM * BN * 4;
    __shared__ __align__(128) unsigned short smem[(PIPE > RED ? PIPE : RED) / 2];
    const unsigned int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    const unsigned int id = blockIdx.x + blockIdx.y * gridDim.x;
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || n == 0 || k == 0 || id >= tiles_m * tiles_n) return;  // uniform over the block
    const unsigned int per_group = TC_GROUP_M * tiles_n, first = id / per_group * TC_GROUP_M;
    const unsigned int rows = min(tiles_m - first, (unsigned int)TC_GROUP_M), local = id % per_group;
    const unsigned int m0 = (first + local % rows) * BM, n0 = local / rows * BN;
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    if (wt) {
        matmul_tc_body<BM, BN, BK, WM, WN, WK, S, true>(smem, x, w, bias, out, m, n, k, bias_kind, m0, n0);
    } else {
        matmul_tc_body<BM, BN, BK, WM, WN, WK, S, false>(smem, x, w, bias, out, m, n, k, bias_kind, m0, n0);
    }
}

// ---------------------------------------------------------------- entry points

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f32_f32(const float* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f32_f16(const float* x, const half_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f16_f32(const half_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matvec_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matvec(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f32_f32(const float* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f32_f16(const float* x, const half_t* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f16_f32(const half_t* x, const float* w, const void* bias, float* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(BLOCK) matmul_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

// matmul_tc<BM>x<BN>_f16_f16 as matmul_tc<BM, BN, BK, WM, WN, WK, S>: 32 WM WN WK threads (TC_TILES in
// gpud_protocol/ops/matmul.py), chosen by a sweep of tile variants on an H100 (benchmarks/gemm_harness.py)

extern "C" __global__ void __launch_bounds__(256) matmul_tc16x16_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul_tc<16, 16, 128, 1, 1, 8, 5>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc16x32_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul_tc<16, 32, 128, 1, 1, 4, 3>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc32x32_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul_tc<32, 32, 128, 1, 1, 4, 3>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc64x64_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul_tc<64, 64, 64, 2, 2, 1, 3>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc128x128_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int bias_kind) {
    matmul_tc<128, 128, 32, 2, 4, 1, 3>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind);
}
