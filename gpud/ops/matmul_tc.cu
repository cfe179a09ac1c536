// Matrix products on the tensor cores, CUDA only (see gpud_protocol/ops/matmul.py for the interface:
// the tensors, scalars and rule of matmul_<t>_<t> in matmul.cu, grids from tc_grid): out = x @ w (+ bias)
// for x and w both float16 or both bfloat16 (the body's template parameter BF: mma.sync's .f16 or .bf16
// form, the same fragments), float32 accumulators, out rounded to x's dtype once (bfloat16 on the bits:
// nearest even, NaN the quiet NaN of its sign, as every bfloat16 kernel rounds). A family of its own so
// that the daemon's builds of matmul.cu's kernels (one NVRTC run per entry point) stay as quick as they were.
//
// Every index is bounded by the scalars, which the daemon checked against the tensors; blocks past the
// last tile return at once.

typedef unsigned short half_t;

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15u) == 0; }


// mma.sync m16n8k16 (float16 or bfloat16 in, float32 accumulators), fragments through ldmatrix, tiles through a
// cp.async pipeline of S stages in static shared memory (48 KB at most). A block of WM x WN x WK warps
// computes a BM x BN tile of out; each warp a (BM / WM) x (BN / WN) part of it over 1 / WK of every
// stage's K (WK > 1 splits K inside the block: the partial sums meet in shared memory at the end).
// Shared tiles are rows of 16-byte chunks, the chunk index XOR-swizzled by the row so that ldmatrix
// and cp.async hit 8 distinct bank groups. x and w as (N, K) are K-major (ldmatrix); w as (K, N) is
// N-major (ldmatrix.trans). Where K (or N for w as (K, N)) is not a multiple of 8, or an operand not
// 16-byte aligned, the same loaders read one element at a time (correct, slower). Blocks walk the
// tiles in groups of TC_GROUP_M tiles of M so that a wave of blocks shares its tiles of w and x in L2.

#define TC_GROUP_M 8


__device__ __forceinline__ void ldsm4(unsigned int addr, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm4t(unsigned int addr, unsigned int* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
template <bool BF>
__device__ __forceinline__ void mma16816(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
    if (BF) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
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

template <int BM, int BN, int BK, int WM, int WN, int WK, int S, bool WT, bool BF>
__device__ __forceinline__ void matmul_tc_body(unsigned short* smem, const half_t* __restrict__ x,
                                               const half_t* __restrict__ w, const void* __restrict__ bias,
                                               half_t* __restrict__ out, unsigned int m, unsigned int n, unsigned int k,
                                               unsigned int epilogue, unsigned int m0, unsigned int n0) {
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
                    mma16816<BF>(acc[i][2 * j], af[i], bf[j][0], bf[j][1]);
                    mma16816<BF>(acc[i][2 * j + 1], af[i], bf[j][2], bf[j][3]);
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
        const float b0 = bias_at(bias, epilogue, c);
        const float b1 = c + 1 < n ? bias_at(bias, epilogue, c + 1) : 0.0f;
#pragma unroll
        for (int i = 0; i < MI; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const unsigned int r = m0 + wm * TM + i * 16 + (lane >> 2) + h * 8;
                if (r >= m) continue;
                const half_t lo16 = to_out<BF>(acc[i][j][2 * h] + b0), hi16 = to_out<BF>(acc[i][j][2 * h + 1] + b1);
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
template <int BM, int BN, int BK, int WM, int WN, int WK, int S, bool BF>
__device__ __forceinline__ void matmul_tc(const half_t* x, const half_t* w, const void* bias, half_t* out,
                                          unsigned int batch, unsigned int m, unsigned int n, unsigned int k,
                                          unsigned int x_stride, unsigned int w_stride, unsigned int wt,
                                          unsigned int epilogue) {
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
        matmul_tc_body<BM, BN, BK, WM, WN, WK, S, true, BF>(smem, x, w, bias, out, m, n, k, epilogue, m0, n0);
    } else {
        matmul_tc_body<BM, BN, BK, WM, WN, WK, S, false, BF>(smem, x, w, bias, out, m, n, k, epilogue, m0, n0);
    }
}

// ---------------------------------------------------------------- entry points
// matmul_tc<BM>x<BN>_<t>_<t> as matmul_tc<BM, BN, BK, WM, WN, WK, S, BF>: 32 WM WN WK threads (TC_TILES in
// gpud_protocol/ops/matmul.py), chosen by a sweep of tile variants on an H100 (benchmarks/gemm_harness.py,
// float16); the bfloat16 variants (BF) share each tile's shape. Operands are unsigned short bits either way.

extern "C" __global__ void __launch_bounds__(256) matmul_tc16x16_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<16, 16, 128, 1, 1, 8, 5, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc16x32_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<16, 32, 128, 1, 1, 4, 3, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc32x32_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<32, 32, 128, 1, 1, 4, 3, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc64x64_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<64, 64, 64, 2, 2, 1, 3, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc128x128_f16_f16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<128, 128, 32, 2, 4, 1, 3, false>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc16x16_bf16_bf16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<16, 16, 128, 1, 1, 8, 5, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc16x32_bf16_bf16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<16, 32, 128, 1, 1, 4, 3, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc32x32_bf16_bf16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<32, 32, 128, 1, 1, 4, 3, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(128) matmul_tc64x64_bf16_bf16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<64, 64, 64, 2, 2, 1, 3, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc128x128_bf16_bf16(const half_t* x, const half_t* w, const void* bias, half_t* out,
    unsigned int batch, unsigned int m, unsigned int n, unsigned int k, unsigned int x_stride, unsigned int w_stride,
    unsigned int wt, unsigned int epilogue) {
    gpud_wait_prior();
    matmul_tc<128, 128, 32, 2, 4, 1, 3, true>(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);
}
