// Matrix products on Hopper (sm_90a), CUDA only: a persistent, warp-specialized wgmma GEMM whose operands
// come in by TMA (cp.async.bulk.tensor). The interface is matmul_wg's (gpud_protocol/ops/matmul_tma.py:
// matmul's tensors, scalars and rule for w as (N, K), wt = 1) except that x and w are passed as tensor
// maps, which the daemon encodes from the tensors it binds.
// out = x @ w^T (+ bias) for float16 or bfloat16 x and w, float32 accumulators, out rounded once.
//
// Tensor maps (CUtensorMap, 128 bytes, `const __grid_constant__`): x's is a rank-2 K-major map of the
// (rows_x, K) matrix at x's address, rows_x = (batch - 1) x_stride / K + m, boxes of 64 (K) x BM rows;
// w's likewise, rows_w = (batch - 1) w_stride / K + n, boxes of 64 x BN; both with the 128-byte swizzle,
// L2 promotion 256 B, out-of-bounds elements filled with zeros, of out's element type. The kernel needs
// K % 8 == 0 (rows of 16-byte multiples), x_stride and w_stride multiples of K (batch b's rows start
// b x_stride / K rows in) and x and w 16-byte aligned: the daemon checks these. Rows past m of a batch
// are the next batch's (or zeros) and reach only out's rows past m, which are never stored; so for n.
//
// Grid: x = min(tiles, 132), y = 1, z = batch. Block i of batch z computes tiles i, i + gridDim.x, ...
// of out (BM x BN each) in matmul_wg's grouped order (blocks past the last tile, or of y > 0, do
// nothing). 128 + 2 BM threads: warpgroup 0 is the producer (one thread issues every copy), warpgroups 1
// to BM / 64 the consumers (64 rows x BN each, one m64nBNk16 wgmma per 16 of K: two of them for BM = 128,
// three for BM = 192, 512 threads a block). The K-slices of 64 elements of
// both tiles (128-byte rows, swizzled as wgmma's descriptors name) go through a ring of S stages that
// runs on from tile to tile; the consumers stage the tile of out in a buffer of their own, so that the
// producer fills the next tile's first stages meanwhile.
// Dynamic shared memory: the stages (S (BM + BN) 128 bytes), the staging buffer (BM (BN + 8) halves, in
// whole KB), 16 S bytes of barriers, and 1 KB to align the stages.
//
// Barriers: each stage has two mbarriers.
//   full[s]:  the stage is in: 1 arrival (the producer's arrive.expect_tx of the stage's bytes), which
//             the two bulk copies complete (complete_tx). Zero-filled boxes past the edges count too.
//   empty[s]: the consumers are done with it: 4 BM / 64 arrivals, lane 0 of each consumer warp after the
//             wgmma.wait_group that retires the stage's products (wait_group 1 at the next stage, or
//             wait_group 0 after a tile's last).
// Use u of slot s is phase u of both barriers: the consumers wait for full[s] with parity u & 1, the
// producer for empty[s] with parity (u & 1) ^ 1, the phase before the first, which passes at once while
// u = 0 (the ring starts empty). Producer and consumers count the same stages, so their (slot, phase)
// stay in step across tiles. No block-wide barrier after the barriers' initialization.
// The mbarrier, TMA and loop helpers are tma.cu's, put before this source.
// Registers: 168 a thread at entry (384 threads, one block); setmaxnreg gives the producer 40 and the
// consumers 232 (128 x 40 + 256 x 232 = 64,512 of 65,536). With three consumers (BM = 192, 512 threads)
// 128 at entry, and 152 for the consumers (128 x 40 + 384 x 152 = 63,488): 64 accumulators a thread, as
// with two (tma_consumer_regs).
//
// 192 x 128 (matmul_tma192x128, cuBLAS's choice for MiniLM's products of K = 384: a 192 x 128 tile with
// 64-deep stages): each stage brings 40 KB for 192 x 128 x 64 products, 77 flops a byte against 64 for
// 128 x 128 (the multiprocessors' TMA traffic from L2 a fifth lower), and a tile's epilogue (the same
// per thread, by 3 warpgroups) is spread over 1.5x the products. 4 stages of 40 KB and the staging
// buffer (192 x 136 halves, 51 KB) fill 217,152 bytes; a fifth stage would not fit.
//
// Ping-pong (matmul_tma_pp, CUTLASS's KernelTmaWarpSpecializedPingpong): the same producer, maps, grid and
// tile order, but the block's j-th tile goes to consumer j % 2 alone (both 64-row halves: two m64nBNk16
// wgmma per 16 of K, 2 x BN / 2 accumulators a thread, in the 232 registers without spills), so that one
// consumer's epilogue runs beside the other's products. Differences:
//   empty[s]: 4 arrivals, lane 0 of each warp of the consumer whose tile the stage is of.
//   turn[c]:  1 arrival: the other consumer's thread 0 once every stage of its tile has passed its full
//             wait (its products issued, before their wgmma.wait_group 0); consumer c waits for the
//             other's tile j - 1 before tile j's products. Each consumer steps its (slot, phase) over
//             the other's stages without waiting for them; without the turn, a full[s] of its tile
//             could still be a phase behind (the other's use of the slot not yet in), which the wait's
//             parity does not tell from the phase it waits for. Neither consumer gets a phase ahead:
//             the producer refills a stage only once its owner released it, and a consumer arrives on
//             the other's turn once per tile, after waiting for its own. The products of the block's
//             tiles so run in tile order (the tensor cores taken in turn); the epilogues overlap them.
//   Each consumer has its own staging buffer and named barrier (1 + c, 128 threads); none the producer
//   or the other consumer joins. A block of one tile leaves consumer 1 idle: it waits for nothing,
//   arrives on nothing, and leaves.
//   Shared memory: S (BM + BN) 128 bytes of stages, two staging buffers, 16 S + 16 bytes of barriers
//   (full[S], empty[S], turn[2]), 1 KB to align: S = 4 for 128 x 128 (201,808 bytes; 5 would not fit).

template <int BM, int BN, int S, bool BF>
__device__ __forceinline__ void matmul_tma(const TmaMap* tx, const TmaMap* tw, const void* __restrict__ bias,
                                           u16* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                           unsigned int k, unsigned int x_stride, unsigned int w_stride,
                                           unsigned int epilogue) {
    static_assert(BM == 128 || BM == 192, "a consumer warpgroup per 64 rows: 2 or 3 of them");
    constexpr int CONSUMERS = BM / 64;
    constexpr unsigned int STAGING = (BM * (BN + 8) * 2 + 1023) / 1024 * 1024;
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;  // the launch asks 1 KB more for this
    const unsigned int staging = base + S * (BM + BN) * 128, bars = staging + STAGING;  // full[S], empty[S]

    const unsigned int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const unsigned int ktiles = (k + TMA_BK - 1) / TMA_BK, b = blockIdx.z;
    // uniform over the block; blocks past y = 0 would repeat its tiles
    if (b >= batch || blockIdx.y != 0 || m == 0 || n == 0 || k == 0 || blockIdx.x >= tiles) return;
    out += (u64)b * m * n;
    tma_init<S, 4 * CONSUMERS>(bars);  // empty[s]: every consumer warp

    unsigned int slot = 0, phase = 0;  // the ring's, in step between the producer and the consumers
    if (threadIdx.x < 128) {
        tma_producer<BM, BN, S>(tx, tw, b, k, x_stride, w_stride, tiles_m, tiles_n, tiles, ktiles, base, bars, slot,
                                phase);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(tma_consumer_regs<CONSUMERS>()) : "memory");
        float d[BN / 2];
        for (unsigned int id = blockIdx.x; id < tiles; id += gridDim.x) {
            unsigned int m0, n0;
            tma_tile<BM, BN>(id, tiles_m, tiles_n, m0, n0);
            tma_mainloop<BM, BN, S, BF>(d, base, bars, 0, ktiles, slot, phase);
            tma_epilogue<BM, BN, BF>(d, staging, bias, out, m0, n0, m, n, epilogue);
        }
    }
}

// ---------------------------------------------------------------- ping-pong (matmul_tma_pp)
// The interface, maps, grid and tile order of matmul_tma<128, BN, ...>, but the block's j-th tile goes to
// consumer j % 2 alone (two m64nBNk16 wgmma per 16 of K, 128 accumulators a thread for BN = 128): one
// consumer's epilogue, through its own staging buffer, overlaps the other's products. The producer is
// matmul_tma's (tma_producer); each consumer steps its (slot, phase) over every tile's stages, the other's
// skipped.
template <int BM, int BN, int S, bool BF>
__device__ __forceinline__ void matmul_tma_pp(const TmaMap* tx, const TmaMap* tw, const void* __restrict__ bias,
                                              u16* __restrict__ out, unsigned int batch, unsigned int m,
                                              unsigned int n, unsigned int k, unsigned int x_stride,
                                              unsigned int w_stride, unsigned int epilogue) {
    static_assert(BM == TMA_BM, "each consumer warpgroup takes a whole tile of 128 rows");
    constexpr unsigned int STAGING = (TMA_BM * (BN + 8) * 2 + 1023) / 1024 * 1024;
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;  // the launch asks 1 KB more for this
    // staging[2], then full[S], empty[S], turn[2]
    const unsigned int staging = base + S * (TMA_BM + BN) * 128, bars = staging + 2 * STAGING;

    const unsigned int tiles_m = (m + TMA_BM - 1) / TMA_BM, tiles_n = (n + BN - 1) / BN, tiles = tiles_m * tiles_n;
    const unsigned int ktiles = (k + TMA_BK - 1) / TMA_BK, b = blockIdx.z;
    // uniform over the block; blocks past y = 0 would repeat its tiles
    if (b >= batch || blockIdx.y != 0 || m == 0 || n == 0 || k == 0 || blockIdx.x >= tiles) return;
    out += (u64)b * m * n;
    tma_init<S, 4, 2>(bars);  // empty[s]: the 4 warps of the stage's consumer

    unsigned int slot = 0, phase = 0;  // the ring's, over every tile's stages
    if (threadIdx.x < 128) {
        tma_producer<TMA_BM, BN, S>(tx, tw, b, k, x_stride, w_stride, tiles_m, tiles_n, tiles, ktiles, base, bars,
                                    slot, phase);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(tma_consumer_regs<2>()) : "memory");
        const unsigned int c = (threadIdx.x >> 7) - 1u, turn = bars + 16 * S;  // turn[c]: 8 c bytes in
        float d0[BN / 2], d1[BN / 2];
        for (unsigned int id = blockIdx.x, j = 0; id < tiles; id += gridDim.x, j++) {
            if ((j & 1u) != c) {  // the other consumer's tile: step over its stages
                const unsigned int next = slot + ktiles;
                slot = next % S, phase ^= (next / S) & 1u;
                continue;
            }
            unsigned int m0, n0;
            tma_tile<TMA_BM, BN>(id, tiles_m, tiles_n, m0, n0);
            // tile j - 1 (the other consumer's (j - 1) / 2-th) has every stage in: no full[s] of this tile
            // can be a phase behind, which its parity alone would not tell
            if (j > 0) mbar_wait(turn + 8 * c, ((j - 1) >> 1) & 1u);
            tma_mainloop_pp<BN, S, BF>(d0, d1, base, bars, ktiles, turn + 8 * (c ^ 1u), slot, phase);
            tma_epilogue_pp<BN, BF>(d0, d1, staging + c * STAGING, bias, out, m0, n0, m, n, epilogue);
        }
    }
}

// ---------------------------------------------------------------- split-K over a cluster (matmul_tmak)
// A cluster of SPLITS blocks per tile (grid x = tiles x SPLITS, __cluster_dims__(SPLITS, 1, 1)): the block
// of rank s sums the tile's products over K's slices s ktiles / SPLITS to (s + 1) ktiles / SPLITS - 1
// (none where ktiles < SPLITS) as matmul_tma does, puts its float32 sums in its shared memory (the drained
// ring: rows of BN + 8 floats), and after a cluster barrier sums rows s BM / SPLITS to (s + 1) BM / SPLITS - 1
// of every block's, in rank order (distributed shared memory), for out: bias added, rounded once, the
// activation applied (the bits of stage_tile and store_tile's arithmetic). A second cluster barrier keeps
// each block's shared memory until its peers have read it. The cluster's blocks run at once (the
// hardware schedules a cluster whole): no block waits for one that is not running.

// the consumers (t of 256): rows of the tile from every block's sums, into out (m x n, the tile at m0, n0)
template <int BN, bool BF, int SPLITS>
__device__ __forceinline__ void tmak_reduce(unsigned int sums, unsigned int rank, const void* __restrict__ bias,
                                            u16* __restrict__ out, unsigned int t, unsigned int m0, unsigned int n0,
                                            unsigned int m, unsigned int n, unsigned int epilogue) {
    constexpr unsigned int LD = BN + 8, ROWS = TMA_BM / SPLITS, QUADS = BN / 4;  // float4s a row
    unsigned int peer[SPLITS];
#pragma unroll
    for (int s = 0; s < SPLITS; s++) peer[s] = cluster_map(sums, s);
    const bool vec_out = n % 4 == 0 && (reinterpret_cast<u64>(out) & 7u) == 0;
#pragma unroll 2
    for (unsigned int idx = t; idx < ROWS * QUADS; idx += 256) {
        const unsigned int r = rank * ROWS + idx / QUADS, c = idx % QUADS * 4, gr = m0 + r, gc = n0 + c;
        if (gr >= m || gc >= n) continue;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < SPLITS; s++) {
            const float4 p = ld_cluster4(peer[s] + (r * LD + c) * 4);
            v[0] += p.x, v[1] += p.y, v[2] += p.z, v[3] += p.w;
        }
        unsigned short h[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            h[e] = to_out<BF>(v[e] + (gc + e < n ? bias_at(bias, epilogue, gc + e) : 0.0f));
            if (epilogue >> 8) h[e] = to_out<BF>(activate(BF ? bf2f(h[e]) : h2f(h[e]), epilogue));
        }
        unsigned short* dst = out + (u64)gr * n + gc;
        if (vec_out) {
            const unsigned int lo = h[0] | (unsigned int)h[1] << 16, hi = h[2] | (unsigned int)h[3] << 16;
            *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (gc + e < n) dst[e] = h[e];
            }
        }
    }
}

template <int BN, int S, bool BF, int SPLITS>
__device__ __forceinline__ void matmul_tmak(const TmaMap* tx, const TmaMap* tw, const void* __restrict__ bias,
                                            u16* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                            unsigned int k, unsigned int x_stride, unsigned int w_stride,
                                            unsigned int epilogue) {
    constexpr unsigned int STAGING = (TMA_BM * (BN + 8) * 2 + 1023) / 1024 * 1024;
    static_assert(TMA_BM * (BN + 8) * 4 <= S * (TMA_BM + BN) * 128, "the sums fit in the ring");
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;  // the launch asks 1 KB more for this
    const unsigned int bars = base + S * (TMA_BM + BN) * 128 + STAGING;  // full[S], empty[S]

    const unsigned int tiles_n = (n + BN - 1) / BN, tiles = (m + TMA_BM - 1) / TMA_BM * tiles_n;
    const unsigned int ktiles = (k + TMA_BK - 1) / TMA_BK, b = blockIdx.z;
    // uniform over the cluster (whole clusters lie past tiles x SPLITS): none waits at its barriers alone
    if (b >= batch || blockIdx.y != 0 || m == 0 || n == 0 || k == 0 || blockIdx.x >= tiles * SPLITS) return;
    const unsigned int rank = cluster_rank(), kt0 = rank * ktiles / SPLITS, kt1 = (rank + 1) * ktiles / SPLITS;
    unsigned int m0, n0;
    tma_tile<TMA_BM, BN>(blockIdx.x / SPLITS, (m + TMA_BM - 1) / TMA_BM, tiles_n, m0, n0);
    out += (u64)b * m * n;
    tma_init<S>(bars);

    unsigned int slot = 0, phase = 0;
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(TMA_PRODUCER_REGS) : "memory");
        if (threadIdx.x == 0) {
            tma_prefetch(tx);
            tma_prefetch(tw);
            const int xrow = (int)(b * (x_stride / k) + m0), wrow = (int)(b * (w_stride / k) + n0);
            tma_produce<TMA_BM, BN, S>(tx, tw, xrow, wrow, base, bars, kt0, kt1, slot, phase);
        }
        __syncwarp();  // converged for the cluster barriers
        cluster_sync();
        cluster_sync();
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(tma_consumer_regs<2>()) : "memory");
        const unsigned int t = threadIdx.x - 128, c = t >> 7, lane = t & 31u, q = (t >> 5) & 3u;
        float d[BN / 2];
        if (kt1 > kt0) {
            tma_mainloop<TMA_BM, BN, S, BF>(d, base, bars, kt0, kt1, slot, phase);
        } else {
#pragma unroll
            for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");  // both consumers' products are done: the ring is free
        const unsigned int r0 = c * 64 + q * 16 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {  // d's layout: stage_tile's
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const unsigned int at = base + ((r0 + 8 * h) * (BN + 8) + j * 8 + 2 * (lane & 3u)) * 4;
                const float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(v0), "f"(v1) : "memory");
            }
        }
        cluster_sync();
        tmak_reduce<BN, BF, SPLITS>(base, rank, bias, out, t, m0, n0, m, n, epilogue);
        cluster_sync();
    }
}

// ---------------------------------------------------------------- entry points
// matmul_tma128x128_<t>_<t> as matmul_tma<128, 128, 5, BF>, one block of 384 threads per multiprocessor
// (TMA_TILES in gpud_protocol/ops/matmul_tma.py: the stages and dynamic shared memory), as measured on an
// H100 (the experiment of commit 867701f: ws_tmap128x128_s5; 128 x 256 tiles gained nothing past
// noise where they won, and lost up to 0.2x cuBLAS elsewhere). wt is matmul's scalar, always 1 here.
// matmul_tmak<K>_128x128_<t>_<t>: split-K in clusters of K blocks (gpud_protocol/ops/matmul_tmak.py).

// MATMUL_TMA(name, body, BM, BN, S, BF): an entry point running body<BM, BN, S, BF> (matmul_tma or
// matmul_tma_pp), one block of 128 + 2 BM threads per multiprocessor (a producer warpgroup, a consumer
// warpgroup per 64 rows of the tile)
#define MATMUL_TMA(name, body, BM, BN, S, BF)                                                                        \
    extern "C" __global__ void __launch_bounds__(128 + 2 * (BM), 1) name(const __grid_constant__ TmaMap tx,         \
        const __grid_constant__ TmaMap tw, const void* bias, u16* out, unsigned int batch, unsigned int m,           \
        unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt,               \
        unsigned int epilogue) {                                                                                     \
        gpud_wait_prior();                                                                                           \
        body<BM, BN, S, BF>(&tx, &tw, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);                      \
    }
MATMUL_TMA(matmul_tma128x128_f16_f16, matmul_tma, 128, 128, 5, false)
MATMUL_TMA(matmul_tma128x128_bf16_bf16, matmul_tma, 128, 128, 5, true)
// 128 x 64 tiles, 8 stages of 24 KB: twice the tiles, for products of a wave of them or less
MATMUL_TMA(matmul_tma128x64_f16_f16, matmul_tma, 128, 64, 8, false)
MATMUL_TMA(matmul_tma128x64_bf16_bf16, matmul_tma, 128, 64, 8, true)
// ping-pong, 4 stages (two staging buffers leave no room for a fifth)
MATMUL_TMA(matmul_tma128x128pp_f16_f16, matmul_tma_pp, 128, 128, 4, false)
MATMUL_TMA(matmul_tma128x128pp_bf16_bf16, matmul_tma_pp, 128, 128, 4, true)
// 192 x 128 tiles, three consumer warpgroups (512 threads), 4 stages of 40 KB: MiniLM's shapes (K = 384)
MATMUL_TMA(matmul_tma192x128_f16_f16, matmul_tma, 192, 128, 4, false)
MATMUL_TMA(matmul_tma192x128_bf16_bf16, matmul_tma, 192, 128, 4, true)

#define MATMUL_TMAK(name, BF, S)                                                                                    \
    extern "C" __global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(384, 1) name(                               \
        const __grid_constant__ TmaMap tx, const __grid_constant__ TmaMap tw, const void* bias, u16* out,              \
        unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,                     \
        unsigned int w_stride, unsigned int wt, unsigned int epilogue) {                                               \
        gpud_wait_prior();                                                                                             \
        matmul_tmak<128, 5, BF, S>(&tx, &tw, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);                 \
    }
MATMUL_TMAK(matmul_tmak2_128x128_f16_f16, false, 2)
MATMUL_TMAK(matmul_tmak2_128x128_bf16_bf16, true, 2)
MATMUL_TMAK(matmul_tmak4_128x128_f16_f16, false, 4)
MATMUL_TMAK(matmul_tmak4_128x128_bf16_bf16, true, 4)
MATMUL_TMAK(matmul_tmak8_128x128_f16_f16, false, 8)
MATMUL_TMAK(matmul_tmak8_128x128_bf16_bf16, true, 8)
