// Products of float32 x and float16 or bfloat16 w as (N, K) (a Linear's weight) for up to 64 rows of x
// per weight matrix, on the tensor cores, CUDA sm_80 and later (see gpud_protocol/ops/matvec_tc.py for the
// interface: matmul's tensors, scalars and rule). Decode and merged decode steps: the weights are read
// once for every row, where matvec reads x through L1 once per weight vector and each group of 8 rows
// reads w again. (The op does not pick them yet: gpud_protocol/ops/matvec_tc.py says why.)
//
// x is split into two tf32 parts, hi (its top 11 significant bits: a mask, exact) and lo (the rest,
// rounded to tf32), and each part goes through mma.sync m16n8k8 tf32 with w (a float16 or bfloat16
// element is exact in tf32), float32 accumulators: about 22 of x's 24 bits enter every product. inf
// and NaN in x pass as they are (lo 0). The block's 8 warps split K in chunks of 32 (chunk c to warp
// c % 8); their sums meet in shared memory in warp order. Neither depends on how many rows there are:
// a row's sum is the same sequence of instructions wherever it sits in the block, so each row of x
// gets the bits it gets alone, in a kernel of any row count (a merged replay's rows equal solo ones).
//
// The product is taken as out^T = w x^T: w is mma's A (16 rows of out's columns, exact in tf32), x^T its B
// (8 rows of x a tile), so that a lane splits only the x elements of its own row of x and one row of
// x fills a tile's first column (decode's single row wastes no loads of w). In a k-step the lane
// (g, t) = (lane / 4, lane % 4) holds A's (row g, k t), (g + 8, t), (g, t + 4), (g + 8, t + 4) and B's
// (k t, col g), (k t + 4, g); K is permuted so that those are the neighbours 8t + 2s and 8t + 2s + 1 of
// a chunk (k-step s of 4): per lane and chunk one 16-byte load of each of two rows of w and two of its
// row of x per tile. Where K is not a multiple of 8 or an operand not 16-byte aligned, the same lanes
// read the same elements one at a time (the same bits, slower). The hi and lo parts add into
// accumulators of their own (two chains, not one twice as long), summed when the warp is done.

typedef unsigned short half_t;

#define TF_WARPS 8  // the library's kernels' warps; W below (variants for measurements only)
#define TF_CHUNK 32

__device__ __forceinline__ void mma_tf32(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void split_tf32(float v, unsigned int& hi, unsigned int& lo) {
    const unsigned int u = __float_as_uint(v);
    const bool special = (u & 0x7f800000u) == 0x7f800000u;  // inf, or NaN made quiet in the bits tf32 keeps
    hi = special ? u | ((u & 0x007fffffu) ? 0x00400000u : 0u) : u & 0xffffe000u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(special ? 0.0f : v - __uint_as_float(hi)));
}

__device__ __forceinline__ uint4 ld_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// a weight's 16 bits as tf32 bits (exact)
template <bool BF>
__device__ __forceinline__ unsigned int w_tf32(unsigned int h) {
    return BF ? (h << 16) : __float_as_uint(h2f((unsigned short)h));
}

// the 8 elements [e0, e0 + 8) of a row of w (N, K) as 4 words of halves (zeros past k); vec: one load
__device__ __forceinline__ uint4 w_chunk(const half_t* row, unsigned int e0, unsigned int k, bool vec) {
    if (vec) return e0 < k ? ld_stream16(row + e0) : make_uint4(0, 0, 0, 0);
    unsigned int h[8];
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = e0 + i < k ? (unsigned int)row[e0 + i] : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}

// ... and of a row of x (zeros past k, or where the row is none)
__device__ __forceinline__ void x_chunk(const float* row, bool live, unsigned int e0, unsigned int k, bool vec, float* v) {
    if (live && vec && e0 < k) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(row + e0));
        const float4 b = __ldg(reinterpret_cast<const float4*>(row + e0 + 4));
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = live && e0 + i < k ? __ldg(row + e0 + i) : 0.0f;
    }
}

// XT tiles of 8 rows of x, a block's 16 columns of out from n0, U chunks in flight per warp
template <int XT, int U, bool BF, int W = TF_WARPS>
__device__ __forceinline__ void matvec_tc(const float* __restrict__ x, const half_t* __restrict__ w,
                                          const void* __restrict__ bias, float* __restrict__ out, unsigned int batch,
                                          unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride,
                                          unsigned int w_stride, unsigned int epilogue) {
    constexpr int ROWS = XT * 8, COLS = 16;
    // the warps' sums meet in shared memory a part of the rows at a time where all would pass 48 KiB
    constexpr int PARTS = W * ROWS * COLS * 4 > 49152 ? 2 : 1, PART = ROWS / PARTS;
    __shared__ float red[W * PART * COLS];
    const unsigned int n0 = (blockIdx.x + blockIdx.y * gridDim.x) * COLS, b = blockIdx.z;
    if (b >= batch || n0 >= n || m == 0 || m > ROWS) return;  // uniform over the block
    x += (u64)b * x_stride;
    w += (u64)b * w_stride;
    out += (u64)b * m * n;
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool vec = k % 8 == 0 && (reinterpret_cast<u64>(x) & 15u) == 0 && (reinterpret_cast<u64>(w) & 15u) == 0;
    const bool live0 = n0 + g < n, live1 = n0 + g + 8 < n;
    const half_t* w0 = w + (u64)(live0 ? n0 + g : n0) * k;
    const half_t* w1 = w + (u64)(live1 ? n0 + g + 8 : n0) * k;
    float hi_acc[XT][4], lo_acc[XT][4];
#pragma unroll
    for (int j = 0; j < XT; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) hi_acc[j][c] = lo_acc[j][c] = 0.0f;
    const unsigned int chunks = (k + TF_CHUNK - 1) / TF_CHUNK;
    for (unsigned int c0 = warp; c0 < chunks; c0 += W * U) {
        uint4 wa[U], wb[U];
        float xv[U][XT][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const unsigned int e0 = (c0 + u * W) * TF_CHUNK + 8 * t;
            wa[u] = live0 ? w_chunk(w0, e0, k, vec) : make_uint4(0, 0, 0, 0);
            wb[u] = live1 ? w_chunk(w1, e0, k, vec) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < XT; j++) {
                const unsigned int r = j * 8 + g;
                x_chunk(x + (u64)r * k, r < m && j * 8 < (int)m, e0, k, vec, xv[u][j]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + u * W >= chunks) break;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const unsigned int pa = s == 0 ? wa[u].x : s == 1 ? wa[u].y : s == 2 ? wa[u].z : wa[u].w;
                const unsigned int pb = s == 0 ? wb[u].x : s == 1 ? wb[u].y : s == 2 ? wb[u].z : wb[u].w;
                const unsigned int a[4] = {w_tf32<BF>(pa & 0xffffu), w_tf32<BF>(pb & 0xffffu), w_tf32<BF>(pa >> 16),
                                           w_tf32<BF>(pb >> 16)};
#pragma unroll
                for (int j = 0; j < XT; j++) {
                    if (j * 8 >= (int)m) break;  // uniform: tiles past m's rows add nothing
                    unsigned int h0, l0, h1, l1;
                    split_tf32(xv[u][j][2 * s], h0, l0);
                    split_tf32(xv[u][j][2 * s + 1], h1, l1);
                    mma_tf32(hi_acc[j], a, h0, h1);
                    mma_tf32(lo_acc[j], a, l0, l1);
                }
            }
        }
    }
    // D's (column g of out, row 2t of x), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): red[warp][row of x][column]
#pragma unroll
    for (int part = 0; part < PARTS; part++) {
        if (part > 0) __syncthreads();  // the part before is summed
#pragma unroll
        for (int j = part * (XT / PARTS); j < (part + 1) * (XT / PARTS); j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const unsigned int row = j * 8 + 2 * t + (c & 1) - part * PART, col = g + (c >= 2 ? 8 : 0);
                red[(warp * PART + row) * COLS + col] = hi_acc[j][c] + lo_acc[j][c];
            }
        __syncthreads();
        for (unsigned int o = threadIdx.x; o < (unsigned int)(PART * COLS); o += W * 32) {
            const unsigned int row = part * PART + o / COLS, col = n0 + o % COLS;
            if (row >= m || col >= n) continue;
            float s = red[o];
#pragma unroll
            for (int v = 1; v < W; v++) s += red[v * PART * COLS + o];
            out[(u64)row * n + col] = s + bias_at(bias, epilogue, col);
        }
    }
}

// ---------------------------------------------------------------- entry points
// matvec_tc<R>_f32_<w>: up to R rows of x per weight matrix, as matvec_tc<R / 8, U, BF> (TF_KERNELS in
// gpud_protocol/ops/matvec_tc.py; 16 columns of out per block); w float16 or bfloat16 bits.

#define MATVEC_TC_W(NAME, XT, U, BF, W)                                                                         \
    extern "C" __global__ void __launch_bounds__(W * 32) NAME(                                                  \
        const float* x, const half_t* w, const void* bias, float* out, unsigned int batch, unsigned int m,      \
        unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt,          \
        unsigned int epilogue) {                                                                               \
        gpud_wait_prior();                                                                                     \
        if (wt) matvec_tc<XT, U, BF, W>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);        \
    }
#define MATVEC_TC(NAME, XT, U, BF) MATVEC_TC_W(NAME, XT, U, BF, TF_WARPS)

MATVEC_TC(matvec_tc8_f32_f16, 1, 4, false)
MATVEC_TC(matvec_tc16_f32_f16, 2, 2, false)
MATVEC_TC(matvec_tc32_f32_f16, 4, 1, false)
MATVEC_TC(matvec_tc64_f32_f16, 8, 1, false)
MATVEC_TC(matvec_tc8_f32_bf16, 1, 4, true)
MATVEC_TC(matvec_tc16_f32_bf16, 2, 2, true)
MATVEC_TC(matvec_tc32_f32_bf16, 4, 1, true)
MATVEC_TC(matvec_tc64_f32_bf16, 8, 1, true)
// matvec_tc<R>w<W>_f32_<w>: W warps split K (other bits than 8: a weight's products take one warp count
// for every row count, tf_warps in gpud_protocol/ops/matvec_tc.py): 16 for weights of few columns of
// out, 4 for wide ones
#define MATVEC_TC_WARPS(W)                                                                                    \
    MATVEC_TC_W(matvec_tc8w##W##_f32_f16, 1, 4, false, W)                                                      \
    MATVEC_TC_W(matvec_tc16w##W##_f32_f16, 2, 2, false, W)                                                     \
    MATVEC_TC_W(matvec_tc32w##W##_f32_f16, 4, 1, false, W)                                                     \
    MATVEC_TC_W(matvec_tc64w##W##_f32_f16, 8, 1, false, W)                                                     \
    MATVEC_TC_W(matvec_tc8w##W##_f32_bf16, 1, 4, true, W)                                                      \
    MATVEC_TC_W(matvec_tc16w##W##_f32_bf16, 2, 2, true, W)                                                     \
    MATVEC_TC_W(matvec_tc32w##W##_f32_bf16, 4, 1, true, W)                                                     \
    MATVEC_TC_W(matvec_tc64w##W##_f32_bf16, 8, 1, true, W)
MATVEC_TC_WARPS(4)
MATVEC_TC_WARPS(16)

#ifdef GPUD_MATVEC_TC_VARIANTS  // benchmarks/matvec_tc_harness.py: fewer chunks in flight
MATVEC_TC_W(matvec_tc8w16u2_f32_f16, 1, 2, false, 16)
#endif
