// Matrix products on Hopper (sm_90a), CUDA only: a persistent, warp-specialized wgmma GEMM whose operands
// come in by TMA (cp.async.bulk.tensor). The interface is matmul_wg's (gpud_protocol/ops/matmul_tma.py:
// matmul's tensors, scalars and rule for w as (N, K), wt = 1) except that x and w are passed as tensor
// maps, which the daemon encodes from the tensors it binds.
// out = x @ w^T (+ bias) for float16 or bfloat16 x and w, float32 accumulators, out rounded once.
//
// Tensor maps (CUtensorMap, 128 bytes, `const __grid_constant__`): x's is a rank-2 K-major map of the
// (rows_x, K) matrix at x's address, rows_x = (batch - 1) x_stride / K + m, boxes of 64 (K) x 128 rows;
// w's likewise, rows_w = (batch - 1) w_stride / K + n, boxes of 64 x BN; both with the 128-byte swizzle,
// L2 promotion 256 B, out-of-bounds elements filled with zeros, of out's element type. The kernel needs
// K % 8 == 0 (rows of 16-byte multiples), x_stride and w_stride multiples of K (batch b's rows start
// b x_stride / K rows in) and x and w 16-byte aligned: the daemon checks these. Rows past m of a batch
// are the next batch's (or zeros) and reach only out's rows past m, which are never stored; so for n.
//
// Grid: x = min(tiles, 132), y = 1, z = batch. Block i of batch z computes tiles i, i + gridDim.x, ...
// of out (BM x BN each) in matmul_wg's grouped order (blocks past the last tile, or of y > 0, do
// nothing). 384 threads: warpgroup 0 is the producer (one thread issues every copy), warpgroups 1 and 2
// the consumers (64 rows x BN each, one m64nBNk16 wgmma per 16 of K). The K-slices of 64 elements of
// both tiles (128-byte rows, swizzled as wgmma's descriptors name) go through a ring of S stages that
// runs on from tile to tile; the consumers stage the tile of out in a buffer of their own, so that the
// producer fills the next tile's first stages meanwhile.
// Dynamic shared memory: the stages (S (BM + BN) 128 bytes), the staging buffer (BM (BN + 8) halves, in
// whole KB), 16 S bytes of barriers, and 1 KB to align the stages.
//
// Barriers: each stage has two mbarriers.
//   full[s]:  the stage is in: 1 arrival (the producer's arrive.expect_tx of the stage's bytes), which
//             the two bulk copies complete (complete_tx). Zero-filled boxes past the edges count too.
//   empty[s]: the consumers are done with it: 8 arrivals, lane 0 of each consumer warp after the
//             wgmma.wait_group that retires the stage's products (wait_group 1 at the next stage, or
//             wait_group 0 after a tile's last).
// Use u of slot s is phase u of both barriers: the consumers wait for full[s] with parity u & 1, the
// producer for empty[s] with parity (u & 1) ^ 1, the phase before the first, which passes at once while
// u = 0 (the ring starts empty). Producer and consumers count the same stages, so their (slot, phase)
// stay in step across tiles. No block-wide barrier after the barriers' initialization.
// Registers: 168 a thread at entry (384 threads, one block); setmaxnreg gives the producer 40 and the
// consumers 232 (128 x 40 + 256 x 232 = 64,512 of 65,536).

typedef unsigned short u16;

#define TMA_BM 128
#define TMA_BK 64  // elements of K per stage: one 128-byte swizzled row, the box's width
#define TMA_GROUP_M 8
// a wait traps after this many cycles (~4 s; a stage takes microseconds): a broken ring fails the launch, not hangs
#define TMA_WATCHDOG (1ll << 33)

struct alignas(64) TmaMap {  // CUtensorMap: 128 opaque bytes, made by cuTensorMapEncodeTiled on the host
    unsigned long long v[16];
};

__device__ __forceinline__ void mbar_init(unsigned int bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ bool mbar_test(unsigned int bar, unsigned int parity) {
    unsigned int done;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
// until the phase of parity `parity` has completed (try_wait: acquire, CTA scope)
__device__ __forceinline__ void mbar_wait(unsigned int bar, unsigned int parity) {
    if (mbar_test(bar, parity)) return;
    const long long t0 = clock64();
    while (!mbar_test(bar, parity)) {
        if (clock64() - t0 > TMA_WATCHDOG) __trap();
    }
}
__device__ __forceinline__ void mbar_arrive(unsigned int bar) {  // release, CTA scope
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned int bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// the box of the tensor map at (c0 along K, c1 rows) into shared memory at dst, completing on `bar`
__device__ __forceinline__ void tma_load(unsigned int dst, const TmaMap* map, unsigned int bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}
__device__ __forceinline__ void tma_prefetch(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// the origin of tile `id` in matmul_wg's grouped order: groups of TMA_GROUP_M tiles of M walk N
template <int BN>
__device__ __forceinline__ void tma_tile(unsigned int id, unsigned int tiles_m, unsigned int tiles_n,
                                         unsigned int& m0, unsigned int& n0) {
    const unsigned int per_group = TMA_GROUP_M * tiles_n, first = id / per_group * TMA_GROUP_M;
    const unsigned int group_rows = min(tiles_m - first, (unsigned int)TMA_GROUP_M), local = id % per_group;
    m0 = (first + local % group_rows) * TMA_BM;
    n0 = local / group_rows * BN;
}

// the producer (one thread): one tile's stages, x's box at row xrow and w's at wrow
template <int BN, int S>
__device__ __forceinline__ void tma_produce(const TmaMap* tx, const TmaMap* tw, int xrow, int wrow,
                                            unsigned int base, unsigned int bars, unsigned int k,
                                            unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = TMA_BM * 128, STAGE = (TMA_BM + BN) * 128;
    const unsigned int ktiles = (k + TMA_BK - 1) / TMA_BK;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * (S + slot), phase ^ 1u);  // empty
        const unsigned int sa = base + slot * STAGE, full = bars + 8 * slot;
        mbar_expect_tx(full, STAGE);
        tma_load(sa, tx, full, (int)(kt * TMA_BK), xrow);
        tma_load(sa + A_BYTES, tw, full, (int)(kt * TMA_BK), wrow);
        if (++slot == S) slot = 0, phase ^= 1u;
    }
}

// a consumer warpgroup's products over K for one tile (c = 0, 1: rows 64 c of the tile); every stage it
// waited for is released, the last one after wgmma.wait_group 0
template <int BN, int S, bool BF>
__device__ __forceinline__ void tma_mainloop(float* d, unsigned int base, unsigned int bars, unsigned int k,
                                             unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = TMA_BM * 128, STAGE = (TMA_BM + BN) * 128;
    const unsigned int c = (threadIdx.x - 128) >> 7, lane = threadIdx.x & 31u;
    const unsigned int ktiles = (k + TMA_BK - 1) / TMA_BK;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;  // so every product accumulates (scale-d 1)
    unsigned int prev = 0;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * slot, phase);  // full; the bulk copies write by the async proxy, as wgmma reads
        __syncwarp();                       // the warp converged for the .aligned instructions
        const unsigned int sa = base + slot * STAGE;
        const u64 da = desc(sa + c * 64 * 128), db = desc(sa + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < TMA_BK / 16; j++) {  // 16 elements of K = 32 bytes along the swizzled row
            if (BF) {
                if (BN == 128) wgmma_128_bf16(d, da + 2 * j, db + 2 * j);
                if (BN == 256) wgmma_256_bf16(d, da + 2 * j, db + 2 * j);
            } else {
                if (BN == 128) wgmma_128_f16(d, da + 2 * j, db + 2 * j);
                if (BN == 256) wgmma_256_f16(d, da + 2 * j, db + 2 * j);
            }
        }
        wgmma_commit();
        wgmma_wait1();  // stage kt - 1's products are done: its slot goes back to the producer
        if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (S + prev));
        prev = slot;
        if (++slot == S) slot = 0, phase ^= 1u;
    }
    wgmma_wait0();
    if (lane == 0) mbar_arrive(bars + 8 * (S + prev));
}

// both consumers: out from d through the staging buffer (wgmma.cu's stage_tile and store_tile): warp q of
// consumer c holds rows 64 c + 16 q + lane / 4 (+ 8). The first barrier: every consumer is done reading
// the last tile's staged values.
template <int BN, bool BF>
__device__ __forceinline__ void tma_epilogue(const float* d, unsigned int staging, const void* __restrict__ bias,
                                             u16* __restrict__ out, unsigned int m0, unsigned int n0, unsigned int m,
                                             unsigned int n, unsigned int epilogue) {
    const unsigned int t = threadIdx.x - 128, c = t >> 7, lane = t & 31u, q = (t >> 5) & 3u;
    asm volatile("bar.sync 1, 256;" ::: "memory");  // the consumers' own barrier (0 would wait for the producer)
    stage_tile<BN, BF>(d, staging, c * 64 + q * 16 + (lane >> 2), lane, bias, epilogue, n0, n);
    asm volatile("bar.sync 1, 256;" ::: "memory");
    store_tile<TMA_BM, BN, 256, BF>(staging, out, t, m0, n0, m, n, epilogue);
}

template <int BN, int S, bool BF>
__device__ __forceinline__ void matmul_tma(const TmaMap* tx, const TmaMap* tw, const void* __restrict__ bias,
                                           u16* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                           unsigned int k, unsigned int x_stride, unsigned int w_stride,
                                           unsigned int epilogue) {
    constexpr unsigned int STAGING = (TMA_BM * (BN + 8) * 2 + 1023) / 1024 * 1024;
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;  // the launch asks 1 KB more for this
    const unsigned int staging = base + S * (TMA_BM + BN) * 128, bars = staging + STAGING;  // full[S], empty[S]

    const unsigned int tiles_m = (m + TMA_BM - 1) / TMA_BM, tiles_n = (n + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const unsigned int b = blockIdx.z;
    // uniform over the block; blocks past y = 0 would repeat its tiles
    if (b >= batch || blockIdx.y != 0 || m == 0 || n == 0 || k == 0 || blockIdx.x >= tiles) return;
    out += (u64)b * m * n;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            mbar_init(bars + 8 * s, 1u);
            mbar_init(bars + 8 * (S + s), 8u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // the last block-wide barrier: the roles part here

    unsigned int slot = 0, phase = 0;  // the ring's, in step between the producer and the consumers
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        if (threadIdx.x == 0) {
            tma_prefetch(tx);
            tma_prefetch(tw);
            for (unsigned int id = blockIdx.x; id < tiles; id += gridDim.x) {
                unsigned int m0, n0;
                tma_tile<BN>(id, tiles_m, tiles_n, m0, n0);
                const int xrow = (int)(b * (x_stride / k) + m0), wrow = (int)(b * (w_stride / k) + n0);
                tma_produce<BN, S>(tx, tw, xrow, wrow, base, bars, k, slot, phase);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
        float d[BN / 2];
        for (unsigned int id = blockIdx.x; id < tiles; id += gridDim.x) {
            unsigned int m0, n0;
            tma_tile<BN>(id, tiles_m, tiles_n, m0, n0);
            tma_mainloop<BN, S, BF>(d, base, bars, k, slot, phase);
            tma_epilogue<BN, BF>(d, staging, bias, out, m0, n0, m, n, epilogue);
        }
    }
}

// ---------------------------------------------------------------- entry points
// matmul_tma128x128_<t>_<t> as matmul_tma<128, 5, BF>, one block of 384 threads per multiprocessor
// (TMA_TILES in gpud_protocol/ops/matmul_tma.py: the stages and dynamic shared memory), as measured on an
// H100 (the experiment of commit 867701f: ws_tmap128x128_s5; 128 x 256 tiles gained nothing past
// noise where they won, and lost up to 0.2x cuBLAS elsewhere). wt is matmul's scalar, always 1 here.

extern "C" __global__ void __launch_bounds__(384, 1) matmul_tma128x128_f16_f16(const __grid_constant__ TmaMap tx,
    const __grid_constant__ TmaMap tw, const void* bias, u16* out, unsigned int batch, unsigned int m, unsigned int n,
    unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tma<128, 5, false>(&tx, &tw, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

extern "C" __global__ void __launch_bounds__(384, 1) matmul_tma128x128_bf16_bf16(const __grid_constant__ TmaMap tx,
    const __grid_constant__ TmaMap tw, const void* bias, u16* out, unsigned int batch, unsigned int m, unsigned int n,
    unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tma<128, 5, true>(&tx, &tw, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);
}

