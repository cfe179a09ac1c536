// Matrix products on Hopper's warpgroup tensor cores (wgmma, sm_90a), CUDA only. The interface is
// matmul's (gpud_protocol/ops/matmul.py: the tensors, scalars and rule of matmul_f16_f16, grids from
// wg_grid in gpud_protocol/ops/matmul_wg.py), for w as (N, K) (wt = 1, a Linear's weight); the
// client sends other products to matmul_tc.
// out = x @ w^T (+ bias) for float16 or bfloat16 x and w, float32 accumulators, out rounded once.
//
// A block of WG warpgroups computes a (64 WG) x BN tile of out, each warpgroup 64 rows of it with one
// m64nBNk16 wgmma per 16 of K. Both operands are K-major tiles of 64 elements (128 bytes) a row in
// shared memory, 16-byte chunks XOR-swizzled by the row (the 128-byte swizzle that wgmma's matrix
// descriptors name), filled by cp.async (one element at a time where K is not a multiple of 8 or an
// operand not 16-byte aligned) through a pipeline of S stages in dynamic shared memory.
// Blocks walk the tiles in groups of WG_GROUP_M tiles of M so that a wave of blocks shares its tiles
// of w and x in L2. Every index is bounded by the scalars, which the daemon checked against the tensors.
// The wgmma fences, desc() and the wgmma_<N>_<t> wrappers are wgmma.cu's (a prelude, shared with matmul_tma).

typedef unsigned short u16;

#define WG_GROUP_M 8
#define WG_BK 64  // elements of K per stage: one 128-byte swizzled row

// shared memory written by cp.async is read next by wgmma (the async proxy)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// One operand's NR x 64 tile, loaded by NT threads: thread t copies chunk t % 8 of rows t / 8 + i NT / 8
// (i < NR 8 / NT), so its chunk's swizzled column is the same in every row it copies and its addresses
// are computed once; each stage adds 64 elements of K to them.
template <int NR, int NT>
struct Loader {
    static constexpr int LOADS = NR * 8 / NT, ROWS = NT / 8;
    static_assert(LOADS >= 1 && NR * 8 % NT == 0 && ROWS % 8 == 0, "tile shape");
    const u16* g;      // the operand (a safe address for loads of nothing)
    const u16* p;      // this thread's first row, at its chunk
    u64 step;          // ROWS rows of g
    unsigned int off;  // its first chunk in the shared tile
    unsigned int col;  // the chunk's first column
    unsigned int ok;   // bit i: row i is below `rows`

    __device__ __forceinline__ Loader(const u16* g_, unsigned int ld, unsigned int row0, unsigned int rows) {
        const unsigned int r = threadIdx.x >> 3, c = threadIdx.x & 7u;
        g = g_;
        p = g_ + (u64)(row0 + r) * ld + c * 8;
        step = (u64)ROWS * ld;
        off = r * 128 + ((c ^ (r & 7u)) << 4);
        col = c * 8;
        ok = 0;
#pragma unroll
        for (int i = 0; i < LOADS; i++) ok |= (row0 + r + i * ROWS < rows ? 1u : 0u) << i;
    }
    // stage kt into the tile at shared address sa: cp.async, 16 bytes a chunk (k a multiple of 8, g aligned)
    __device__ __forceinline__ void fast(unsigned int sa, unsigned int kt, unsigned int k) const {
        const unsigned int k0 = kt * WG_BK;
        const bool in = k0 + col < k;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const bool go = in && ((ok >> i) & 1u);
            cp_async16(sa + off + i * ROWS * 128, go ? p + i * step + k0 : g, go ? 16u : 0u);
        }
    }
    // the same one element at a time, zeros past k (any k, any alignment)
    __device__ __forceinline__ void slow(unsigned int sa, unsigned int kt, unsigned int k) const {
        const unsigned int k0 = kt * WG_BK + col;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const bool row = (ok >> i) & 1u;
            const u16* src = p + i * step + kt * WG_BK;
            unsigned int v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int lo = row && k0 + 2 * e < k ? src[2 * e] : 0u;
                const unsigned int hi = row && k0 + 2 * e + 1 < k ? src[2 * e + 1] : 0u;
                v[e] = lo | (hi << 16);
            }
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(sa + off + i * ROWS * 128), "r"(v[0]),
                         "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
        }
    }
};

// the pipeline and the products; VEC: both operands through Loader::fast
template <int WG, int BN, int S, bool BF, bool VEC>
__device__ __forceinline__ void wg_main(float* d, unsigned int base, const Loader<64 * WG, 128 * WG>& la,
                                        const Loader<BN, 128 * WG>& lb, unsigned int k) {
    constexpr int A_BYTES = 64 * WG * 128, STAGE = (64 * WG + BN) * 128;
    static_assert(S >= 3, "two stages in flight and one loading");
    const unsigned int wg = threadIdx.x >> 7;
    const unsigned int ktiles = (k + WG_BK - 1) / WG_BK;
    auto load = [&](unsigned int slot, unsigned int stage) {
        if (VEC) {
            la.fast(slot, stage, k);
            lb.fast(slot + A_BYTES, stage, k);
        } else {
            la.slow(slot, stage, k);
            lb.slow(slot + A_BYTES, stage, k);
        }
    };
    // Stage kt + S - 2 is loaded while the products of stage kt run, into the slot of stage kt - 2: each
    // warpgroup keeps one group of products in flight (wait_group 1), so stage kt - 1's may still run.
#pragma unroll
    for (int s = 0; s < S - 2; s++) {
        if ((unsigned int)s < ktiles) load(base + s * STAGE, s);
        cp_async_commit();
    }
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<S - 3>();
        fence_proxy_async();
        __syncthreads();  // stage kt is in, and every warpgroup's products of stage kt - 2 are done
        const unsigned int sa = base + (kt % S) * STAGE;
        const u64 da = desc(sa + wg * 64 * 128), db = desc(sa + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < WG_BK / 16; j++) {  // 16 elements of K = 32 bytes along the swizzled row
            wgmma_k16<BN, BF>(d, da + 2 * j, db + 2 * j);
        }
        wgmma_commit();
        const unsigned int next = kt + S - 2;
        if (next < ktiles) load(base + (next % S) * STAGE, next);
        cp_async_commit();
        wgmma_wait1();
    }
    wgmma_wait0();
    cp_async_wait<0>();
}

template <int WG, int BN, int S, bool BF>
__device__ __forceinline__ void matmul_wg(const u16* __restrict__ x, const u16* __restrict__ w,
                                          const void* __restrict__ bias, u16* __restrict__ out, unsigned int batch,
                                          unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
                                          unsigned int w_stride, unsigned int epilogue) {
    constexpr int BM = 64 * WG, NT = 128 * WG;
    static_assert(BM * (BN + 8) * 2 <= S * (BM + BN) * 128, "the staged tile of out fits the pipeline's buffers");
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;  // the launch asks 1 KB more for this

    const unsigned int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    const unsigned int id = blockIdx.x + blockIdx.y * gridDim.x;
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || n == 0 || k == 0 || id >= tiles_m * tiles_n) return;  // uniform over the block
    const unsigned int per_group = WG_GROUP_M * tiles_n, first = id / per_group * WG_GROUP_M;
    const unsigned int group_rows = min(tiles_m - first, (unsigned int)WG_GROUP_M), local = id % per_group;
    const unsigned int m0 = (first + local % group_rows) * BM, n0 = local / group_rows * BN;
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;

    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    const Loader<BM, NT> la(x, k, m0, m);
    const Loader<BN, NT> lb(w, k, n0, n);
    const bool vec = k % 8 == 0 && ((reinterpret_cast<u64>(x) | reinterpret_cast<u64>(w)) & 15u) == 0;
    if (vec) {
        wg_main<WG, BN, S, BF, true>(d, base, la, lb, k);
    } else {
        wg_main<WG, BN, S, BF, false>(d, base, la, lb, k);
    }

    // Out through shared memory (wgmma.cu): warp q of warpgroup wg holds rows 64 wg + 16 q + lane / 4 (+ 8).
    __syncthreads();  // every warpgroup is done with the pipeline's buffers
    const unsigned int wg = threadIdx.x >> 7, lane = threadIdx.x & 31u, q = (threadIdx.x >> 5) & 3u;
    stage_tile<BN, BF>(d, base, wg * 64 + q * 16 + (lane >> 2), lane, bias, epilogue, n0, n);
    __syncthreads();
    store_tile<BM, BN, NT, BF>(base, out, threadIdx.x, m0, n0, m, n, epilogue);
}

// ---------------------------------------------------------------- entry points
// matmul_wg<size>_<t>_<t> as matmul_wg<WG, BN, S, BF> (BM = 64 WG), built for `blocks` blocks per
// multiprocessor (WG_TILES in gpud_protocol/ops/matmul_wg.py: 128 WG threads, dynamic shared memory
// S (BM + BN) 128 bytes + 1 KB), chosen by a sweep of variants on an H100 (benchmarks/wg_harness.py)

extern "C" __global__ void __launch_bounds__(256, 1) matmul_wg128x256_f16_f16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<2, 256, 4, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(256, 2) matmul_wg128x64_f16_f16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<2, 64, 4, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(128, 3) matmul_wg64x64_f16_f16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<1, 64, 4, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(128, 2) matmul_wg64x64d_f16_f16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<1, 64, 6, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(256, 1) matmul_wg128x256_bf16_bf16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<2, 256, 4, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(256, 2) matmul_wg128x64_bf16_bf16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<2, 64, 4, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(128, 3) matmul_wg64x64_bf16_bf16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<1, 64, 4, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(128, 2) matmul_wg64x64d_bf16_bf16(const u16* x, const u16* w, const void* bias,
    u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
    unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_wg<1, 64, 6, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}
