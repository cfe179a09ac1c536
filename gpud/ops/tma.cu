// The pieces of the TMA matmuls (family matmul_tma, gpud/ops/matmul_tma.cu), put before its source after
// wgmma.cu (gpud.ops.preludes): mbarriers, TMA copies of tensor maps, the tile order, the producer's and
// the consumers' loops over a range of K-slices, and the consumers' store of a tile of out. The
// barriers' protocol, the roles and the shared memory are described in matmul_tma.cu.

typedef unsigned short u16;

#define TMA_BM 128  // a tile's rows: ping-pong's and split-K's; matmul_tma takes BM (128 or 192) as a parameter
#define TMA_BK 64   // elements of K per stage: one 128-byte swizzled row, the box's width
#define TMA_PRODUCER_REGS 40  // the producer warpgroup's registers (setmaxnreg.dec)
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

// the S stages' barriers (full[s]: the producer's arrival, empty[s]: EMPTY, one per consumer warp that
// reads a stage) and TURNS more of one arrival after them (matmul_tma_pp's turns), by thread 0, then the
// block's last barrier: the roles part after it
template <int S, unsigned int EMPTY = 8, int TURNS = 0>
__device__ __forceinline__ void tma_init(unsigned int bars) {
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < S; s++) {
            mbar_init(bars + 8 * s, 1u);
            mbar_init(bars + 8 * (S + s), EMPTY);
        }
#pragma unroll
        for (int i = 0; i < TURNS; i++) mbar_init(bars + 8 * (2 * S + i), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// the registers a thread of CONSUMERS consumer warpgroups gets (setmaxnreg.inc) beside the producer's
// TMA_PRODUCER_REGS, a multiple of 8 within the 65,536 of a multiprocessor: 232 for 2, 152 for 3
template <int CONSUMERS>
__device__ __forceinline__ constexpr int tma_consumer_regs() {
    return (65536 - 128 * TMA_PRODUCER_REGS) / (128 * CONSUMERS) / 8 * 8;
}

// the origin of tile `id` (BM x BN) in matmul_wg's grouped order: groups of TMA_GROUP_M tiles of M walk N
template <int BM, int BN>
__device__ __forceinline__ void tma_tile(unsigned int id, unsigned int tiles_m, unsigned int tiles_n,
                                         unsigned int& m0, unsigned int& n0) {
    const unsigned int per_group = TMA_GROUP_M * tiles_n, first = id / per_group * TMA_GROUP_M;
    const unsigned int group_rows = min(tiles_m - first, (unsigned int)TMA_GROUP_M), local = id % per_group;
    m0 = (first + local % group_rows) * BM;
    n0 = local / group_rows * BN;
}

// the producer (one thread): the stages of K-slices kt0 .. kt1 - 1 of one BM x BN tile, x's box (BM rows)
// at row xrow and w's (BN rows) at wrow
template <int BM, int BN, int S>
__device__ __forceinline__ void tma_produce(const TmaMap* tx, const TmaMap* tw, int xrow, int wrow,
                                            unsigned int base, unsigned int bars, unsigned int kt0, unsigned int kt1,
                                            unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = BM * 128, STAGE = (BM + BN) * 128;
    for (unsigned int kt = kt0; kt < kt1; kt++) {
        mbar_wait(bars + 8 * (S + slot), phase ^ 1u);  // empty
        const unsigned int sa = base + slot * STAGE, full = bars + 8 * slot;
        mbar_expect_tx(full, STAGE);
        tma_load(sa, tx, full, (int)(kt * TMA_BK), xrow);
        tma_load(sa + A_BYTES, tw, full, (int)(kt * TMA_BK), wrow);
        if (++slot == S) slot = 0, phase ^= 1u;
    }
}

// the producer warpgroup of matmul_tma and matmul_tma_pp: registers down to TMA_PRODUCER_REGS, then thread
// 0 alone issues every stage of the block's BM x BN tiles (i, i + gridDim.x, ... below `tiles`) of batch b
// in order
template <int BM, int BN, int S>
__device__ __forceinline__ void tma_producer(const TmaMap* tx, const TmaMap* tw, unsigned int b, unsigned int k,
                                             unsigned int x_stride, unsigned int w_stride, unsigned int tiles_m,
                                             unsigned int tiles_n, unsigned int tiles, unsigned int ktiles,
                                             unsigned int base, unsigned int bars, unsigned int& slot,
                                             unsigned int& phase) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(TMA_PRODUCER_REGS) : "memory");
    if (threadIdx.x == 0) {
        tma_prefetch(tx);
        tma_prefetch(tw);
        for (unsigned int id = blockIdx.x; id < tiles; id += gridDim.x) {
            unsigned int m0, n0;
            tma_tile<BM, BN>(id, tiles_m, tiles_n, m0, n0);
            const int xrow = (int)(b * (x_stride / k) + m0), wrow = (int)(b * (w_stride / k) + n0);
            tma_produce<BM, BN, S>(tx, tw, xrow, wrow, base, bars, 0, ktiles, slot, phase);
        }
    }
}

// a consumer warpgroup's products over K-slices kt0 .. kt1 - 1 (kt1 > kt0) of one BM x BN tile (c = 0 ..
// BM / 64 - 1: rows 64 c of the tile); every stage it waited for is released, the last one after
// wgmma.wait_group 0
template <int BM, int BN, int S, bool BF>
__device__ __forceinline__ void tma_mainloop(float* d, unsigned int base, unsigned int bars, unsigned int kt0,
                                             unsigned int kt1, unsigned int& slot, unsigned int& phase) {
    constexpr unsigned int A_BYTES = BM * 128, STAGE = (BM + BN) * 128;
    const unsigned int c = (threadIdx.x - 128) >> 7, lane = threadIdx.x & 31u;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;  // so every product accumulates (scale-d 1)
    unsigned int prev = 0;
    for (unsigned int kt = kt0; kt < kt1; kt++) {
        mbar_wait(bars + 8 * slot, phase);  // full; the bulk copies write by the async proxy, as wgmma reads
        __syncwarp();                       // the warp converged for the .aligned instructions
        const unsigned int sa = base + slot * STAGE;
        const u64 da = desc(sa + c * 64 * 128), db = desc(sa + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < TMA_BK / 16; j++) {  // 16 elements of K = 32 bytes along the swizzled row
            wgmma_k16<BN, BF>(d, da + 2 * j, db + 2 * j);
        }
        wgmma_commit();
        wgmma_wait1();  // stage kt - 1's products are done: its slot goes back to the producer
        if (kt > kt0 && lane == 0) mbar_arrive(bars + 8 * (S + prev));
        prev = slot;
        if (++slot == S) slot = 0, phase ^= 1u;
    }
    wgmma_wait0();
    if (lane == 0) mbar_arrive(bars + 8 * (S + prev));
}

// every consumer (BM / 64 warpgroups, 2 BM threads): out from d through the staging buffer (wgmma.cu's
// stage_tile and store_tile): warp q of consumer c holds rows 64 c + 16 q + lane / 4 (+ 8). The first
// barrier: every consumer is done reading the last tile's staged values.
template <int BM, int BN, bool BF>
__device__ __forceinline__ void tma_epilogue(const float* d, unsigned int staging, const void* __restrict__ bias,
                                             u16* __restrict__ out, unsigned int m0, unsigned int n0, unsigned int m,
                                             unsigned int n, unsigned int epilogue) {
    const unsigned int t = threadIdx.x - 128, c = t >> 7, lane = t & 31u, q = (t >> 5) & 3u;
    // the consumers' own barrier (0 would wait for the producer)
    asm volatile("bar.sync 1, %0;" ::"n"(2 * BM) : "memory");
    stage_tile<BN, BF>(d, staging, c * 64 + q * 16 + (lane >> 2), lane, bias, epilogue, n0, n);
    asm volatile("bar.sync 1, %0;" ::"n"(2 * BM) : "memory");
    store_tile<BM, BN, 2 * BM, BF>(staging, out, t, m0, n0, m, n, epilogue);
}

// ---------------------------------------------------------------- ping-pong (matmul_tma_pp)
// One consumer warpgroup's products of a whole 128 x BN tile over its K-slices 0 .. ktiles - 1: rows 0-63
// into d0, rows 64-127 (the stage's x + 64 x 128 bytes) into d1, two m64nBNk16 wgmma per 16 of K. Each
// stage goes back to the producer as in tma_mainloop, by lane 0 of this warpgroup's 4 warps (empty[s]
// counts 4); once every stage of the tile has passed its full wait and its products are issued, thread 0
// arrives on `next`, the other consumer's turn barrier (matmul_tma.cu says why).
template <int BN, int S, bool BF>
__device__ __forceinline__ void tma_mainloop_pp(float* d0, float* d1, unsigned int base, unsigned int bars,
                                                unsigned int ktiles, unsigned int next, unsigned int& slot,
                                                unsigned int& phase) {
    constexpr unsigned int A_BYTES = TMA_BM * 128, STAGE = (TMA_BM + BN) * 128;
    const unsigned int lane = threadIdx.x & 31u;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d0[i] = 0.0f, d1[i] = 0.0f;  // so every product accumulates (scale-d 1)
    unsigned int prev = 0;
    for (unsigned int kt = 0; kt < ktiles; kt++) {
        mbar_wait(bars + 8 * slot, phase);  // full
        __syncwarp();                       // the warp converged for the .aligned instructions
        const unsigned int sa = base + slot * STAGE;
        const u64 da0 = desc(sa), da1 = desc(sa + 64 * 128), db = desc(sa + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < TMA_BK / 16; j++) {  // 16 elements of K = 32 bytes along the swizzled row
            wgmma_k16<BN, BF>(d0, da0 + 2 * j, db + 2 * j);
            wgmma_k16<BN, BF>(d1, da1 + 2 * j, db + 2 * j);
        }
        wgmma_commit();
        wgmma_wait1();  // stage kt - 1's products are done: its slot goes back to the producer
        if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (S + prev));
        prev = slot;
        if (++slot == S) slot = 0, phase ^= 1u;
    }
    if ((threadIdx.x & 127u) == 0) mbar_arrive(next);
    wgmma_wait0();
    if (lane == 0) mbar_arrive(bars + 8 * (S + prev));
}

// named barrier 1 + c of consumer c's 128 threads (constant ids: ptxas reserves all 16 for a register's)
__device__ __forceinline__ void consumer_sync(unsigned int c) {
    if (c == 0) {
        asm volatile("bar.sync 1, 128;" ::: "memory");
    } else {
        asm volatile("bar.sync 2, 128;" ::: "memory");
    }
}

// consumer c alone: its tile of out from d0 (rows 0-63) and d1 (rows 64-127) through its own staging
// buffer, with its own named barrier (1 + c, its 128 threads). The first barrier: its threads are done
// reading its last tile's staged values.
template <int BN, bool BF>
__device__ __forceinline__ void tma_epilogue_pp(const float* d0, const float* d1, unsigned int staging,
                                                const void* __restrict__ bias, u16* __restrict__ out,
                                                unsigned int m0, unsigned int n0, unsigned int m, unsigned int n,
                                                unsigned int epilogue) {
    const unsigned int t = threadIdx.x & 127u, c = (threadIdx.x >> 7) - 1u, lane = t & 31u, q = t >> 5;
    consumer_sync(c);
    stage_tile<BN, BF>(d0, staging, q * 16 + (lane >> 2), lane, bias, epilogue, n0, n);
    stage_tile<BN, BF>(d1, staging, 64 + q * 16 + (lane >> 2), lane, bias, epilogue, n0, n);
    consumer_sync(c);
    store_tile<TMA_BM, BN, 128, BF>(staging, out, t, m0, n0, m, n, epilogue);
}
