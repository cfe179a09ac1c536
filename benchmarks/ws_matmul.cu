// Warp-specialized Hopper GEMMs, an experiment beside gpud/ops/matmul_wg.cu (benchmarks/wg_harness.py --ws).
// Not a family of the library: benchmarks/ws_launch.py appends this file to matmul_wg.cu's source up to
// its entry points (after the preludes pdl.cu, cp_async.cu and products.cu), so desc(), the wgmma_*_f16
// wrappers, Loader and the fences are matmul_wg's, and adds the entry points of ws_launch.VARIANTS
// (the persistent TMA variant, measured here first as ws_tmap, is the library's: gpud/ops/matmul_tma.cu).
//
// out = x @ w^T (+ bias), float16 x, w (N, K) and out, float32 accumulators rounded once. A block of
// 384 threads computes a 128 x BN tile of out: warpgroup 0 is the producer, warpgroups 1 and 2 the
// consumers (64 rows x BN each, one m64nBNk16 wgmma per 16 of K). The operands' K-slices of 64 elements
// (128-byte rows, 128-byte swizzle, as matmul_wg lays them) go through a ring of S stages in dynamic
// shared memory, each stage with two mbarriers:
//   full[s]:  the stage is in. ws_cpasync: 128 arrivals, one per producer thread
//             (cp.async.mbarrier.arrive.noinc: fires once the thread's earlier cp.async are done).
//             ws_tma: 1 arrival (the producer's arrive.expect_tx) and the stage's bytes, which the
//             bulk tensor copies complete (complete_tx).
//   empty[s]: the consumers are done with it: 8 arrivals, lane 0 of each consumer warp after the
//             wgmma.wait_group that retires the stage's products (wait_group 1 at the next stage, or
//             wait_group 0 after a tile's last).
// Use u of slot s (stage kt = u S + s) is phase u of both barriers: the consumers wait for full[s] with
// parity u & 1, the producer for empty[s] with parity (u & 1) ^ 1, which is the phase before the first
// and so passes at once while u = 0 (the ring starts empty). No block-wide barrier in the main loop.
// Registers: setmaxnreg gives the producer 40 and the consumers 232 (128 x 40 + 256 x 232 = 64,512;
// ws_cpasync128x256: 48 and 224).
// Every wait gives up with a trap after about WS_WATCHDOG cycles (a deadlock fails the launch rather
// than hanging the benchmark).

#define WS_BM 128
#ifndef WS_WATCHDOG
#define WS_WATCHDOG (1ll << 33)  // about 4 s at 1.98 GHz; a stage never takes a millisecond
#endif

template <bool C, class X, class Y>
struct Pick {
    typedef X T;
};
template <class X, class Y>
struct Pick<false, X, Y> {
    typedef Y T;
};

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
        if (clock64() - t0 > WS_WATCHDOG) __trap();
    }
}
__device__ __forceinline__ void mbar_arrive(unsigned int bar) {  // release, CTA scope
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned int bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned int bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// a box of the tensor map at (c0 along K, c1 rows) into shared memory, completing on `bar`
__device__ __forceinline__ void tma_load(unsigned int dst, const TmaMap* map, unsigned int bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

// ws_cpasync's 16-byte copies of one operand's NR x 64 slice (K a multiple of 8, the operand 16-byte
// aligned), by the producer's 128 threads: thread t copies chunk t % 8 of rows t / 8 + 16 i, to the
// 128-byte-swizzled place that matmul_wg's Loader gives it, zeros past the edges. Loader::fast keeps a
// 64-bit pointer per row that the compiler hoists out of the K loop (spills under the producer's
// register cap); this keeps one pointer and the rows' bits, and adds i 16 rows in 32 bits per copy.
template <int NR>
struct LeanLoader {
    static constexpr int LOADS = NR / 16;
    const unsigned char* p;  // row row0 + t / 8, chunk t % 8, K 0 (formed, not read, past the last row)
    const void* safe;        // the operand: the address of loads of nothing
    unsigned int step;       // 16 rows in bytes (K < 2^23 keeps 15 of them in 32 bits)
    unsigned int ok;         // bit i: row row0 + t / 8 + 16 i is below `rows`

    __device__ __forceinline__ LeanLoader(const u16* g, unsigned int k, unsigned int row0, unsigned int rows) {
        const unsigned int r = threadIdx.x >> 3, c = threadIdx.x & 7u;
        p = reinterpret_cast<const unsigned char*>(g + (u64)(row0 + r) * k + c * 8);
        safe = g;
        step = 32u * k;
        ok = 0;
#pragma unroll
        for (int i = 0; i < LOADS; i++) ok |= (row0 + r + 16u * i < rows ? 1u : 0u) << i;
    }
    __device__ __forceinline__ void load(unsigned int sa, unsigned int kt, unsigned int k) const {
        const unsigned int r = threadIdx.x >> 3, c = threadIdx.x & 7u;
        const unsigned int dst = sa + r * 128 + ((c ^ (r & 7u)) << 4);
        const bool in = kt * WG_BK + c * 8 < k;
        const unsigned char* q = p + (u64)kt * (WG_BK * 2);
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const bool go = in && ((ok >> i) & 1u);
            cp_async16(dst + i * 16 * 128, go ? static_cast<const void*>(q + i * step) : safe, go ? 16u : 0u);
        }
    }
};

// the producer of ws_cpasync: warpgroup 0's 128 threads. VEC: LeanLoader's 16-byte cp.async, each
// thread arriving on full[slot] once its copies land; else matmul_wg's Loader::slow, element by element
// (K not a multiple of 8, or an operand off 16 bytes), then a proxy fence and a plain arrival.
template <int BN, int S, bool VEC>
__device__ __forceinline__ void ws_produce_cp(const u16* x, const u16* w, unsigned int m0, unsigned int n0,
                                              unsigned int m, unsigned int n, unsigned int base, unsigned int bars,
                                              unsigned int k) {
    constexpr unsigned int A_BYTES = WS_BM * 128, STAGE = (WS_BM + BN) * 128;
    const unsigned int ktiles = (k + WG_BK - 1) / WG_BK;
    using A = typename Pick<VEC, LeanLoader<WS_BM>, Loader<WS_BM, 128>>::T;
    using B = typename Pick<VEC, LeanLoader<BN>, Loader<BN, 128>>::T;
    const A la(x, k, m0, m);
    const B lb(w, k, n0, n);
    unsigned int slot = 0, phase = 0;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * (S + slot), phase ^ 1u);  // empty
        const unsigned int sa = base + slot * STAGE;
        if constexpr (VEC) {
            la.load(sa, kt, k);
            lb.load(sa + A_BYTES, kt, k);
            mbar_arrive_cp_async(bars + 8 * slot);  // full, once these copies land
        } else {
            la.slow(sa, kt, k);
            lb.slow(sa + A_BYTES, kt, k);
            fence_proxy_async();  // plain stores, read next by wgmma
            mbar_arrive(bars + 8 * slot);
        }
        if (++slot == S) slot = 0, phase ^= 1u;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // leave no copy in flight behind an exiting thread
}

// the producer of ws_tma: one thread, both boxes of a stage completing on full[slot]; one tile's K,
// the ring's slot and phase running on from the last tile
template <int BN, int S>
__device__ __forceinline__ void ws_produce_tma(const TmaMap* tx, const TmaMap* tw, int xrow, int wrow,
                                               unsigned int base, unsigned int bars, unsigned int k,
                                               unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = WS_BM * 128, STAGE = (WS_BM + BN) * 128;
    const unsigned int ktiles = (k + WG_BK - 1) / WG_BK;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * (S + slot), phase ^ 1u);  // empty
        const unsigned int sa = base + slot * STAGE, full = bars + 8 * slot;
        mbar_expect_tx(full, STAGE);  // (BM + BN) rows of 64 halves: zero-filled rows past the edge count too
        tma_load(sa, tx, full, (int)(kt * WG_BK), xrow);
        tma_load(sa + A_BYTES, tw, full, (int)(kt * WG_BK), wrow);
        if (++slot == S) slot = 0, phase ^= 1u;
    }
}
__device__ __forceinline__ void tma_prefetch(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// a consumer warpgroup's products over K for one tile (c = 0, 1: rows 64 c of the tile), the ring's
// slot and phase running on from the last tile; every stage it waited for is released, the last one
// after wgmma.wait_group 0
template <int BN, int S, bool TMA>
__device__ __forceinline__ void ws_mainloop(float* d, unsigned int base, unsigned int bars, unsigned int k,
                                            unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = WS_BM * 128, STAGE = (WS_BM + BN) * 128;
    const unsigned int c = (threadIdx.x - 128) >> 7, lane = threadIdx.x & 31u;
    const unsigned int ktiles = (k + WG_BK - 1) / WG_BK;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;  // so every product accumulates (scale-d 1)
    unsigned int prev = 0;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * slot, phase);  // full
        __syncwarp();                       // the warp converged for the .aligned instructions
        // ws_cpasync: the stage was written by cp.async (generic proxy) and is read by wgmma (async
        // proxy); the writers cannot fence after their copies land, so each reader fences after the
        // acquire. The bulk tensor copies of ws_tma are async-proxy writes: no fence.
        if (!TMA) fence_proxy_async();
        const unsigned int sa = base + slot * STAGE;
        const u64 da = desc(sa + c * 64 * 128), db = desc(sa + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < WG_BK / 16; j++) {  // 16 elements of K = 32 bytes along the swizzled row
            if (BN == 128) wgmma_128_f16(d, da + 2 * j, db + 2 * j);
            if (BN == 256) wgmma_256_f16(d, da + 2 * j, db + 2 * j);
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

// both consumers: out from d through shared memory at `stage` (BM rows of BN + 8 halves), as
// matmul_wg: the tile rounded to fp16 there, then written in 16-byte pieces of whole rows. The first
// barrier: every consumer is done with `stage` (the pipeline's products, or the last tile's reads)
template <int BN>
__device__ __forceinline__ void ws_epilogue(const float* d, unsigned int stage, const void* __restrict__ bias,
                                            u16* __restrict__ out, unsigned int m0, unsigned int n0, unsigned int m,
                                            unsigned int n, unsigned int bias_kind) {
    constexpr int LD = BN + 8;
    const unsigned int t = threadIdx.x - 128, c = t >> 7, lane = t & 31u, q = (t >> 5) & 3u;
    asm volatile("bar.sync 1, 256;" ::: "memory");
    const unsigned int r0 = c * 64 + q * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const unsigned int col = j * 8 + 2 * (lane & 3u);
        const float b0 = n0 + col < n ? bias_at(bias, bias_kind, n0 + col) : 0.0f;
        const float b1 = n0 + col + 1 < n ? bias_at(bias, bias_kind, n0 + col + 1) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float v0 = d[4 * j + 2 * h] + b0, v1 = d[4 * j + 2 * h + 1] + b1;
            const unsigned int pair = (unsigned int)f2h(v0) | ((unsigned int)f2h(v1) << 16);
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(stage + ((r0 + h * 8) * LD + col) * 2), "r"(pair) : "memory");
        }
    }
    asm volatile("bar.sync 1, 256;" ::: "memory");
    const bool vec_out = n % 8 == 0 && (reinterpret_cast<u64>(out) & 15u) == 0;
#pragma unroll 4
    for (unsigned int idx = t; idx < WS_BM * BN / 8; idx += 256) {
        const unsigned int r = idx / (BN / 8), col = idx % (BN / 8) * 8;
        const unsigned int gr = m0 + r, gc = n0 + col;
        if (gr >= m || gc >= n) continue;
        unsigned int v[4];
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                     : "r"(stage + (r * LD + col) * 2)
                     : "memory");
        u16* dst = out + (u64)gr * n + gc;
        if (vec_out) {
            *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                if (gc + e < n) dst[e] = (u16)(v[e / 2] >> (16 * (e % 2)));
            }
        }
    }
}

// the origin of tile `id` in matmul_wg's grouped order: groups of WG_GROUP_M tiles of M walk N
__device__ __forceinline__ void ws_tile(unsigned int id, unsigned int tiles_m, unsigned int tiles_n, unsigned int bn,
                                        unsigned int& m0, unsigned int& n0) {
    const unsigned int per_group = WG_GROUP_M * tiles_n, first = id / per_group * WG_GROUP_M;
    const unsigned int group_rows = min(tiles_m - first, (unsigned int)WG_GROUP_M), local = id % per_group;
    m0 = (first + local % group_rows) * WS_BM;
    n0 = local / group_rows * bn;
}

// One block per tile in matmul_wg's grouped order (WG_GROUP_M), blockIdx.z the batch. x_stride and
// w_stride: elements between batches (0: shared). ws_tma reads x and w through tx and tw (rows of K
// halves; a batch's rows start b * stride / K rows in: the host checks stride % K == 0) and ignores
// x and w; ws_cpasync the reverse. Dynamic shared memory: S (128 + BN) 128 bytes of stages, 16 S of
// barriers after them, 1 KB to align the stages (ws_launch.shared).
template <int BN, int S, bool TMA>
__device__ __forceinline__ void ws_matmul(const TmaMap* tx, const TmaMap* tw, const u16* __restrict__ x,
                                          const u16* __restrict__ w, const void* __restrict__ bias,
                                          u16* __restrict__ out, unsigned int batch, unsigned int m, unsigned int n,
                                          unsigned int k, unsigned int x_stride, unsigned int w_stride,
                                          unsigned int bias_kind) {
    extern __shared__ unsigned char dyn[];
    const unsigned int base = (smem_u32(dyn) + 1023u) & ~1023u;
    const unsigned int bars = base + S * (WS_BM + BN) * 128;  // full[S], then empty[S]

    const unsigned int tiles_m = (m + WS_BM - 1) / WS_BM, tiles_n = (n + BN - 1) / BN;
    const unsigned int id = blockIdx.x + blockIdx.y * gridDim.x;
    const unsigned int b = blockIdx.z;
    if (b >= batch || m == 0 || n == 0 || k == 0 || id >= tiles_m * tiles_n) return;  // uniform over the block
    unsigned int m0, n0;
    ws_tile(id, tiles_m, tiles_n, BN, m0, n0);
    out += (u64)b * m * n;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            mbar_init(bars + 8 * s, TMA ? 1u : 128u);
            mbar_init(bars + 8 * (S + s), 8u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // the last block-wide barrier: the roles part here

    // registers: 168 a thread at entry (384 threads, one block), so the block holds 504 for a producer's
    // thread and two consumers' (2 C + P <= 504). ws_cpasync128x256's producer spills (in the
    // element-by-element path) at 40, not at 48 (ptxas 12.9; then C = 224, ample for 128 accumulators).
    constexpr int P = TMA || BN == 128 ? 40 : 48, C = (504 - P) / 2 / 8 * 8;
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(P) : "memory");
        if (TMA) {
            if (threadIdx.x == 0) {
                const int xrow = (int)(b * (x_stride / k) + m0), wrow = (int)(b * (w_stride / k) + n0);
                unsigned int slot = 0, phase = 0;
                tma_prefetch(tx);
                tma_prefetch(tw);
                ws_produce_tma<BN, S>(tx, tw, xrow, wrow, base, bars, k, slot, phase);
            }
        } else {
            x += (u64)b * x_stride;
            w += (u64)b * w_stride;
            if (k % 8 == 0 && ((reinterpret_cast<u64>(x) | reinterpret_cast<u64>(w)) & 15u) == 0) {
                ws_produce_cp<BN, S, true>(x, w, m0, n0, m, n, base, bars, k);
            } else {
                ws_produce_cp<BN, S, false>(x, w, m0, n0, m, n, base, bars, k);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(C) : "memory");
        static_assert(WS_BM * (BN + 8) * 2 <= S * (WS_BM + BN) * 128, "the staged tile fits the stages");
        float d[BN / 2];
        unsigned int slot = 0, phase = 0;
        ws_mainloop<BN, S, TMA>(d, base, bars, k, slot, phase);
        ws_epilogue<BN>(d, base, bias, out, m0, n0, m, n, bias_kind);  // out staged in the stages
    }
}

// entry points (ws_launch.entry writes them for each variant):
//   ws_cpasync<BM>x<BN>_s<S>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, bias_kind)
//     -> ws_matmul<BN, S, false>(0, 0, x, w, ...)
//   ws_tma<BM>x<BN>_s<S>(const __grid_constant__ TmaMap tx, const __grid_constant__ TmaMap tw, bias, out,
//     batch, m, n, k, x_stride, w_stride, wt, bias_kind) -> ws_matmul<BN, S, true>(&tx, &tw, 0, 0, ...)
