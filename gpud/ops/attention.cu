// Attention ops (see gpud_protocol/ops/attention.py for the interface): embedding lookup, rotary
// position embedding, KV-cache append, and attention (split over the keys, then combined). The same
// algorithms as attention.wgsl. Float16 is unsigned short storage and bfloat16 a struct of one (below),
// computed in float32; one template body serves every dtype combination, instantiated by the extern "C"
// entry points. CUDA only: attention_flash_*, full attention of float16 or bfloat16 in one pass on the
// tensor cores (inline PTX).

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ float load(const float* p, unsigned int i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, unsigned int i) { return h2f(p[i]); }
__device__ __forceinline__ void store(float* p, unsigned int i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, unsigned int i, float v) { p[i] = f2h(v); }

// bfloat16: a struct of one unsigned short, rounded on the bits as
// elementwise.cu does (nearest even; NaN: the quiet NaN of its sign, as ml_dtypes gives).
struct bf16 { unsigned short bits; };
__device__ __forceinline__ float load(const bf16* p, unsigned int i) { return __uint_as_float((unsigned int)p[i].bits << 16); }
__device__ __forceinline__ unsigned short bf16_bits(float v) {
    const unsigned int x = __float_as_uint(v);
    return (x & 0x7fffffffu) > 0x7f800000u ? (unsigned short)(((x >> 16) & 0x8000u) | 0x7fc0u)
                                           : (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ void store(bf16* p, unsigned int i, float v) { p[i].bits = bf16_bits(v); }

// Whether key mask element i lets its key take part (mask_mode 3 uint8, 4 int32, 5 float32, 6 int64).
__device__ __forceinline__ bool key_on(const unsigned char* mask, unsigned int mode, unsigned long long i) {
    switch (mode) {
        case 3u: return mask[i] != 0u;
        case 4u: return reinterpret_cast<const int*>(mask)[i] != 0;
        case 5u: return reinterpret_cast<const float*>(mask)[i] != 0.0f;
        default: return reinterpret_cast<const long long*>(mask)[i] != 0ll;
    }
}

// q . k over a row of D: 16-byte loads where the row is aligned (a warp's threads read 32 rows: fewer,
// wider loads), else one element at a time. The vectors go in batches of BATCH, a batch's loads all
// issued before the first is used (one at a time, each load's latency was paid in turn); the products
// are summed in the elements' order all the same.
#define BATCH 8u

// The row's nv 16-byte vectors of PER elements each: `part(w, e)` is the products of vector w, whose
// first element is e, summed.
template <unsigned int PER, typename V, typename Part>
__device__ __forceinline__ float dot_vectors(const V* row, unsigned int nv, V zero, Part part) {
    float dot = 0.0f;
    for (unsigned int v0 = 0; v0 < nv; v0 += BATCH) {
        V w[BATCH];
#pragma unroll
        for (unsigned int u = 0; u < BATCH; ++u) w[u] = v0 + u < nv ? row[v0 + u] : zero;
#pragma unroll
        for (unsigned int u = 0; u < BATCH; ++u)
            if (v0 + u < nv) dot += part(w[u], (v0 + u) * PER);
    }
    return dot;
}

__device__ __forceinline__ float dot_row(const float* sq, const float* k, unsigned int k0, unsigned int d) {
    float dot = 0.0f;
    unsigned int i = 0;
    if ((k0 & 3u) == 0u && (reinterpret_cast<unsigned long long>(k) & 15u) == 0u) {
        dot = dot_vectors<4u>(reinterpret_cast<const float4*>(k + k0), d / 4u, make_float4(0.f, 0.f, 0.f, 0.f),
                              [&](float4 w, unsigned int e) {
                                  return sq[e] * w.x + sq[e + 1u] * w.y + sq[e + 2u] * w.z + sq[e + 3u] * w.w;
                              });
        i = d / 4u * 4u;
    }
    for (; i < d; ++i) dot += sq[i] * k[k0 + i];
    return dot;
}

__device__ __forceinline__ float dot_pair(const float* sq, unsigned int i, unsigned int w) {
    return sq[i] * h2f((unsigned short)(w & 0xffffu)) + sq[i + 1u] * h2f((unsigned short)(w >> 16));
}

__device__ __forceinline__ float dot_row(const float* sq, const unsigned short* k, unsigned int k0, unsigned int d) {
    float dot = 0.0f;
    unsigned int i = 0;
    if ((k0 & 7u) == 0u && (reinterpret_cast<unsigned long long>(k) & 15u) == 0u) {
        dot = dot_vectors<8u>(reinterpret_cast<const uint4*>(k + k0), d / 8u, make_uint4(0u, 0u, 0u, 0u),
                              [&](uint4 w, unsigned int e) {
                                  return dot_pair(sq, e, w.x) + dot_pair(sq, e + 2u, w.y) + dot_pair(sq, e + 4u, w.z) +
                                         dot_pair(sq, e + 6u, w.w);
                              });
        i = d / 8u * 8u;
    }
    for (; i < d; ++i) dot += sq[i] * h2f(k[k0 + i]);
    return dot;
}

__device__ __forceinline__ float dot_pair_bf16(const float* sq, unsigned int i, unsigned int w) {
    return sq[i] * __uint_as_float(w << 16) + sq[i + 1u] * __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float dot_row(const float* sq, const bf16* k, unsigned int k0, unsigned int d) {
    float dot = 0.0f;
    unsigned int i = 0;
    if ((k0 & 7u) == 0u && (reinterpret_cast<unsigned long long>(k) & 15u) == 0u) {
        dot = dot_vectors<8u>(reinterpret_cast<const uint4*>(k + k0), d / 8u, make_uint4(0u, 0u, 0u, 0u),
                              [&](uint4 w, unsigned int e) {
                                  return dot_pair_bf16(sq, e, w.x) + dot_pair_bf16(sq, e + 2u, w.y) +
                                         dot_pair_bf16(sq, e + 4u, w.z) + dot_pair_bf16(sq, e + 6u, w.w);
                              });
        i = d / 8u * 8u;
    }
    for (; i < d; ++i) dot += sq[i] * load(k, k0 + i);
    return dot;
}

#define BLOCK 256u
#define PV_BATCH 16u  // values per thread in flight at once
#define NONE (-3.0e38f)   // the running maximum before any key, and the score of a hidden key
#define HIDDEN (-1.0e30f) // a mask value at or below this hides its key

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

// The S splits of a row, each block's (max, sum, weighted sums) in `own`, merged by the block of rank 0
// as combine() below merges them from part, into row `row` of out (S 1: no cluster, the block's own).
template <int S>
__device__ __forceinline__ float split_value(const float* own, unsigned int s, unsigned int i) {
    if (S == 1) return own[i];
    return ld_cluster(cluster_map(smem_u32(own + i), s));
}

template <int S, typename O>
__device__ __forceinline__ void merge_splits(const float* own, O* out, unsigned int row, unsigned int d) {
    const unsigned int tid = threadIdx.x;
    if (S == 1) __syncthreads();  // the block's results written
    else cluster_sync();  // every split's
    if ((S == 1 || cluster_rank() == 0u) && tid < d) {
        float top = NONE;
#pragma unroll
        for (unsigned int s = 0; s < S; ++s) top = fmaxf(top, split_value<S>(own, s, 0u));
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (unsigned int s = 0; s < S; ++s) {
            const float w = expf(split_value<S>(own, s, 0u) - top);
            den += w * split_value<S>(own, s, 1u);
            num += w * split_value<S>(own, s, 2u + tid);
        }
        store(out, row * d + tid, den > 0.0f ? num / den : 0.0f);
    }
    if (S > 1) cluster_sync();  // no block's shared memory goes before rank 0 has read it
}

// ------------------------------------------------------------------------------------------------
// attention_<q>_<kv>: one block of 256 threads per (query row, split of the keys); see attention.wgsl.
// attention_s<S>_<q>_<kv> (gpud_protocol/ops/attention_cluster.py): the same with splits = S and a row's S
// blocks one cluster (S 1: none), each split's (max, sum, weighted sums) kept in its shared memory and
// merged by the cluster's block of rank 0 as attention_combine merges them (the same sums in the same
// order) into out, q's dtype: the bits of attention then attention_combine in one launch. S 0: the split
// kernel, its partial results into part.

template <int S, typename Q, typename KV>
__device__ void attend(const Q* q, const KV* k, const KV* v, const int* pos, const float* mask, float* part, Q* out,
                       unsigned int nb, unsigned int nt, unsigned int ns, unsigned int hq, unsigned int hkv,
                       unsigned int d, unsigned int splits, unsigned int causal, unsigned int mask_mode,
                       unsigned int use_pos, float scale) {
    __shared__ float own[S ? 256 + 2 : 1];  // this split's max, sum and weighted sums (S > 0)
    __shared__ float sq[256];
    __shared__ float sp[256];
    __shared__ float sr[256];
    __shared__ float sm[16];
    const unsigned int tid = threadIdx.x;
    const unsigned int work = blockIdx.x + blockIdx.y * gridDim.x;
    if (work >= nb * nt * hq * splits) return;  // the whole block
    const unsigned int split = work % splits;
    const unsigned int row = work / splits;
    const unsigned int h = row % hq;
    const unsigned int bt = row / hq;
    const unsigned int t = bt % nt;
    const unsigned int b = bt / nt;

    int count = (int)ns;
    if (use_pos) count = min(count, pos[b] + (int)t + 1);
    if (causal) count = min(count, (int)t + (int)ns - (int)nt + 1);
    const unsigned int keys = (unsigned int)max(count, 0);
    if (tid < d) sq[tid] = load(q, row * d + tid) * scale;
    __syncthreads();
    const unsigned int per = ((ns + BLOCK - 1u) / BLOCK + splits - 1u) / splits;
    const unsigned int first = split * per;
    const unsigned int end = min(first + per, (keys + BLOCK - 1u) / BLOCK);

    const unsigned int stride = hkv * d;
    const unsigned int kv0 = b * ns * stride + (h / (hq / hkv)) * d;
    const unsigned int ngroups = BLOCK / d;
    const unsigned int g = tid / d;
    const unsigned int dd = tid % d;
    const unsigned int mask0 = (mask_mode == 2u ? b * nt * ns : 0u) + t * ns;
    float m = NONE, l = 0.0f, acc = 0.0f;
    for (unsigned int tile = first; tile < end; ++tile) {
        const unsigned int key0 = tile * BLOCK;
        const unsigned int key = key0 + tid;
        float score = NONE;
        if (key < keys) {
            const float dot = dot_row(sq, k, kv0 + key * stride, d);
            score = dot;
            if (mask_mode >= 3u) {  // a key mask (B, S)
                score = key_on(reinterpret_cast<const unsigned char*>(mask), mask_mode, b * ns + key) ? dot : NONE;
            } else if (mask_mode != 0u) {
                const float hide = mask[mask0 + key];
                score = hide <= HIDDEN ? NONE : dot + hide;
            }
        }
        sp[tid] = score;
        __syncthreads();
        if (tid < 16u) {
            float mx = NONE;
            for (unsigned int i = 0; i < 16u; ++i) mx = fmaxf(mx, sp[tid * 16u + i]);
            sm[tid] = mx;
        }
        __syncthreads();
        float top = m;
        for (unsigned int i = 0; i < 16u; ++i) top = fmaxf(top, sm[i]);
        const float correction = expf(m - top);
        m = top;
        const float p = score > NONE ? expf(score - top) : 0.0f;
        sp[tid] = p;  // every read of the scores was before the barrier above
        l = l * correction + p;
        __syncthreads();
        if (g < ngroups) {
            acc *= correction;
            const unsigned int n = min(BLOCK, keys - key0);
            // the keys in batches of PV_BATCH, a batch's values loaded before the first is used
            for (unsigned int j0 = g; j0 < n; j0 += PV_BATCH * ngroups) {
                float x[PV_BATCH];
#pragma unroll
                for (unsigned int u = 0; u < PV_BATCH; ++u) {
                    const unsigned int j = j0 + u * ngroups;  // key0 + j < keys: inside the cache
                    x[u] = j < n ? load(v, kv0 + (key0 + j) * stride + dd) : 0.0f;
                }
#pragma unroll
                for (unsigned int u = 0; u < PV_BATCH; ++u) {
                    const unsigned int j = j0 + u * ngroups;
                    if (j < n) {
                        const float pj = sp[j];
                        acc += pj != 0.0f ? pj * x[u] : 0.0f;  // a hidden key's value is never used (it may be NaN)
                    }
                }
            }
        }
        __syncthreads();  // the next tile overwrites sp
    }

    sp[tid] = l;
    sr[tid] = g < ngroups ? acc : 0.0f;
    __syncthreads();
    if (tid < 16u) {
        float total = 0.0f;
        for (unsigned int i = 0; i < 16u; ++i) total += sp[tid * 16u + i];
        sm[tid] = total;
    }
    __syncthreads();
    float* const into = S ? own : part + work * (d + 2u);
    if (tid == 0u) {
        float total = 0.0f;
        for (unsigned int i = 0; i < 16u; ++i) total += sm[i];
        into[0] = m;
        into[1] = total;
    }
    if (tid < d) {
        float total = 0.0f;
        for (unsigned int gi = 0; gi < ngroups; ++gi) total += sr[gi * d + tid];
        into[2u + tid] = total;
    }
    if (S) merge_splits<S>(own, out, row, d);
}

#define ATTENTION(NAME, Q, KV)                                                                                    \
    extern "C" __global__ void NAME(const Q* q, const KV* k, const KV* v, const int* pos, const float* mask,      \
                                    float* part, unsigned int nb, unsigned int nt, unsigned int ns,                \
                                    unsigned int hq, unsigned int hkv, unsigned int d, unsigned int splits,        \
                                    unsigned int causal, unsigned int mask_mode, unsigned int use_pos, float scale) { \
        gpud_wait_prior();                                                                                            \
        attend<0>(q, k, v, pos, mask, part, (Q*)nullptr, nb, nt, ns, hq, hkv, d, splits, causal, mask_mode, use_pos, \
                  scale);                                                                                             \
    }

#define ATTENTION_S(NAME, S, DIMS, Q, KV)                                                                        \
    extern "C" __global__ void DIMS NAME(const Q* q, const KV* k, const KV* v, const int* pos, const float* mask,   \
                                         Q* out, unsigned int nb, unsigned int nt, unsigned int ns, unsigned int hq, \
                                         unsigned int hkv, unsigned int d, unsigned int splits, unsigned int causal, \
                                         unsigned int mask_mode, unsigned int use_pos, float scale) {              \
        gpud_wait_prior();                                                                                          \
        attend<S>(q, k, v, pos, mask, nullptr, out, nb, nt, ns, hq, hkv, d, splits, causal, mask_mode, use_pos, scale); \
    }
#define ATTENTION_ALL_S(SUFFIX, Q, KV)                                                                            \
    ATTENTION_S(attention_s1_##SUFFIX, 1, , Q, KV)                                                                \
    ATTENTION_S(attention_s2_##SUFFIX, 2, __cluster_dims__(2, 1, 1), Q, KV)                                       \
    ATTENTION_S(attention_s4_##SUFFIX, 4, __cluster_dims__(4, 1, 1), Q, KV)                                       \
    ATTENTION_S(attention_s8_##SUFFIX, 8, __cluster_dims__(8, 1, 1), Q, KV)

// every (q, kv) pair of PAIRS in gpud_protocol/ops/attention.py: the split kernel and the clustered ones
#define ATTENTION_PAIR(SUFFIX, Q, KV) ATTENTION(attention_##SUFFIX, Q, KV) ATTENTION_ALL_S(SUFFIX, Q, KV)
ATTENTION_PAIR(f32_f32, float, float)
ATTENTION_PAIR(f32_f16, float, unsigned short)
ATTENTION_PAIR(f16_f32, unsigned short, float)
ATTENTION_PAIR(f16_f16, unsigned short, unsigned short)
ATTENTION_PAIR(f32_bf16, float, bf16)
ATTENTION_PAIR(bf16_f32, bf16, float)
ATTENTION_PAIR(bf16_bf16, bf16, bf16)

// attention_combine_<out>: the splits of each row merged and normalised, stored as O.
template <typename O>
__device__ void combine(const float* part, O* out, unsigned int n, unsigned int d, unsigned int splits) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const unsigned int width = d + 2u;
    const unsigned int base = (i / d) * splits * width;
    float top = NONE;
#pragma unroll 8
    for (unsigned int s = 0; s < splits; ++s) top = fmaxf(top, part[base + s * width]);
    float num = 0.0f, den = 0.0f;
#pragma unroll 8
    for (unsigned int s = 0; s < splits; ++s) {
        const unsigned int at = base + s * width;
        const float w = expf(part[at] - top);
        den += w * part[at + 1u];
        num += w * part[at + 2u + i % d];
    }
    store(out, i, den > 0.0f ? num / den : 0.0f);
}

#define COMBINE(NAME, O)                                                                                          \
    extern "C" __global__ void NAME(const float* part, O* out, unsigned int n, unsigned int d,                   \
                                    unsigned int splits) {                                                       \
        gpud_wait_prior();                                                                                       \
        combine(part, out, n, d, splits);                                                                         \
    }

COMBINE(attention_combine_f32, float)
COMBINE(attention_combine_f16, unsigned short)
COMBINE(attention_combine_bf16, bf16)

// ------------------------------------------------------------------------------------------------
// attention_flash_d<D>[_bf16]_<out>(q, k, v, key_mask, out): full attention of float16 (or bfloat16: the
// template parameter BF, mma.sync's .bf16 form) q, k, v on the tensor cores, one pass (FlashAttention-2's scheme). A block of 4 warps takes 64 query rows of one (batch,
// head), 16 rows a warp; it walks the keys in tiles of BN (64, or 32 for D = 128), double-buffered
// in shared memory by cp.async. Per tile: S = Q K^T (mma.sync m16n8k16, float32 accumulators; Q's
// fragments stay in registers), hidden keys set to -inf, the online softmax in base 2, then O += P V
// with P rounded to the inputs' dtype straight from S's registers. Scores never leave the registers. Keys the
// key mask hides (and keys past S) are never loaded: their rows of K and V are zero-filled. The
// key mask becomes one bit per key in shared memory first (at most FLASH_MASK_WORDS * 32 keys), and
// the tiles before its first and after its last visible key are skipped. Shared memory rows are
// XOR-swizzled in 16-byte chunks, so that ldmatrix reads 8 rows without bank conflicts.

#define FLASH_BM 64u
#define FLASH_THREADS 128u
#define FLASH_MASK_WORDS 512u  // key-mask bits kept in shared memory: 16,384 keys

__device__ __forceinline__ void ldsm_x4(unsigned int (&r)[4], unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned int (&r)[4], unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a b: a 16x16 (row), b 16x8 (col) float16 (bfloat16 if BF), d 16x8 float32.
template <bool BF>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1) {
    if (BF) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

__device__ __forceinline__ unsigned int pack_half2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// P's pairs for P V, in the inputs' dtype (the weights are finite, in [0, 1]: cvt's NaN rule does not matter)
template <bool BF>
__device__ __forceinline__ unsigned int pack_p(float lo, float hi) {
    if (!BF) return pack_half2(lo, hi);
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; 2^-inf = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of 16-byte chunk c of row r in a tile of rows of D halves: chunks XOR-swizzled by row,
// so that the 8 rows one ldmatrix reads (same chunk, consecutive rows) fall in distinct banks.
template <int D>
__device__ __forceinline__ unsigned int swz(unsigned int r, unsigned int c) {
    const unsigned int x = D == 32 ? ((r >> 1) & 3u) : (r & 7u);
    return r * (unsigned int)(D * 2) + ((c ^ x) << 4);
}

// ROWS rows from row0 of src (row stride `stride` halves) into the tile at shared address `tile`; a
// row at or past `limit`, or whose bit is clear in `bits` (when given), is zero-filled, not read.
template <int D, int ROWS>
__device__ __forceinline__ void flash_load(unsigned int tile, const unsigned short* src, unsigned int stride,
                                           unsigned int row0, unsigned int limit, const unsigned int* bits,
                                           unsigned int tid) {
    constexpr unsigned int CH = D / 8;
#pragma unroll
    for (unsigned int i = 0; i < ROWS * CH / FLASH_THREADS; ++i) {
        const unsigned int idx = tid + i * FLASH_THREADS;
        const unsigned int r = idx / CH, c = idx % CH;
        const unsigned int row = row0 + r;
        bool ok = row < limit;
        if (bits != nullptr && ok) ok = (bits[row >> 5] >> (row & 31u)) & 1u;
        const unsigned short* from = src + (unsigned long long)(ok ? row : 0u) * stride + c * 8u;
        cp_async16(tile + swz<D>(r, c), from, ok ? 16u : 0u);
    }
}

__device__ __forceinline__ void store_pair(float* out, unsigned long long i, float a, float b) {
    *reinterpret_cast<float2*>(out + i) = make_float2(a, b);
}

__device__ __forceinline__ void store_pair(unsigned short* out, unsigned long long i, float a, float b) {
    *reinterpret_cast<unsigned int*>(out + i) = pack_half2(a, b);
}

__device__ __forceinline__ void store_pair(bf16* out, unsigned long long i, float a, float b) {
    *reinterpret_cast<unsigned int*>(out + i) = (unsigned int)bf16_bits(a) | ((unsigned int)bf16_bits(b) << 16);
}

template <int D, typename O, bool BF>
__device__ __forceinline__ void flash(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                                      const unsigned char* key_mask, O* out, unsigned int nb, unsigned int nt,
                                      unsigned int ns, unsigned int hq, unsigned int hkv, unsigned int causal,
                                      unsigned int mode, float scale) {
    constexpr unsigned int BN = D == 128 ? 32u : 64u;  // keys per tile
    constexpr unsigned int TILE_BYTES = BN * D * 2u;
    constexpr unsigned int STAGE_BYTES = 2u * TILE_BYTES;  // K then V
    // two stages; Q's 64 rows go to the second stage first (BM * D * 2 <= STAGE_BYTES), which the
    // first tile's loads overwrite only after every warp holds its Q fragments in registers
    __shared__ __align__(128) unsigned char smem[2u * STAGE_BYTES];
    __shared__ unsigned int bits[FLASH_MASK_WORDS];
    __shared__ int range[2];
    const float NEG_INF = __int_as_float(0xff800000);

    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned int q0 = (gridDim.x - 1u - blockIdx.x) * FLASH_BM;  // the longest causal rows first
    const unsigned int h = blockIdx.y, b = blockIdx.z;
    if (q0 >= nt || h >= hq || b >= nb) return;  // the whole block (a grid larger than flash_grid's)
    const unsigned int qrows = min(FLASH_BM, nt - q0);
    const int shift = (int)ns - (int)nt;  // causal: query t sees the keys s <= t + shift
    int kbeg = 0, kend = (int)ns;         // the keys any row of this block sees are in [kbeg, kend)
    if (causal) kend = min(kend, (int)(q0 + qrows) + shift);
    const unsigned int base = smem_u32(smem);
    flash_load<D, FLASH_BM>(base + STAGE_BYTES, q + ((unsigned long long)b * nt * hq + h) * D, hq * D, q0, nt, nullptr,
                            tid);  // Q first: it needs no key mask
    cp_async_commit();
    if (mode != 0u && kend > 0) {
        if (tid == 0u) {
            range[0] = kend;
            range[1] = 0;
        }
        __syncthreads();
        const unsigned int words = ((unsigned int)kend + 31u) / 32u;
#pragma unroll 4
        for (unsigned int w = warp; w < words; w += FLASH_THREADS / 32u) {
            const unsigned int key = w * 32u + lane;
            const bool on = key < (unsigned int)kend && key_on(key_mask, mode, (unsigned long long)b * ns + key);
            const unsigned int word = __ballot_sync(0xffffffffu, on);
            if (lane == 0u) {
                bits[w] = word;
                if (word != 0u) {
                    atomicMin(&range[0], (int)(w * 32u) + __ffs((int)word) - 1);
                    atomicMax(&range[1], (int)(w * 32u) + 32 - __clz((int)word));
                }
            }
        }
        __syncthreads();
        kbeg = range[0];
        kend = range[1];
    }
    if (kbeg >= kend) {  // no row of this block sees a key: zeros
        cp_async_wait<0>();  // Q's copies land before the block's shared memory goes to another block
        for (unsigned int i = tid; i < qrows * (D / 2u); i += FLASH_THREADS) {
            const unsigned int r = i / (D / 2u), c = i % (D / 2u);
            store_pair(out, (((unsigned long long)b * nt + q0 + r) * hq + h) * D + 2u * c, 0.0f, 0.0f);
        }
        return;
    }

    const unsigned int first = (unsigned int)kbeg / BN, last = ((unsigned int)kend + BN - 1u) / BN;
    const unsigned int kstride = hkv * D;
    const unsigned long long kv0 = ((unsigned long long)b * ns * hkv + h / (hq / hkv)) * D;
    const unsigned short* ksrc = k + kv0;
    const unsigned short* vsrc = v + kv0;
    const unsigned int* kbits = mode != 0u ? bits : nullptr;
    flash_load<D, BN>(base, ksrc, kstride, first * BN, (unsigned int)kend, kbits, tid);
    flash_load<D, BN>(base + TILE_BYTES, vsrc, kstride, first * BN, (unsigned int)kend, kbits, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned int qf[D / 16][4];
#pragma unroll
    for (unsigned int kc = 0; kc < D / 16u; ++kc) {
        const unsigned int row = warp * 16u + (lane & 7u) + ((lane >> 3) & 1u) * 8u;
        ldsm_x4(qf[kc], base + STAGE_BYTES + swz<D>(row, kc * 2u + (lane >> 4)));
    }

    float o[D / 8][4];
#pragma unroll
    for (unsigned int i = 0; i < D / 8u; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 of the warp's 16
    const float scale2 = scale * 1.4426950408889634f;       // scores in base 2
    const unsigned int row0 = q0 + warp * 16u + (lane >> 2);
    const int see0 = (int)row0 + shift, see1 = see0 + 8;    // causal: the last key each row sees

    for (unsigned int tile = first; tile < last; ++tile) {
        const unsigned int stage = (tile - first) & 1u;
        cp_async_wait<0>();
        __syncthreads();  // this tile is in; every warp is done with the other stage (and Q)
        if (tile + 1u < last) {
            const unsigned int next = base + (stage ^ 1u) * STAGE_BYTES;
            flash_load<D, BN>(next, ksrc, kstride, (tile + 1u) * BN, (unsigned int)kend, kbits, tid);
            flash_load<D, BN>(next + TILE_BYTES, vsrc, kstride, (tile + 1u) * BN, (unsigned int)kend, kbits, tid);
            cp_async_commit();
        }
        const unsigned int sk = base + stage * STAGE_BYTES, sv = sk + TILE_BYTES;

        float s[BN / 8][4];
#pragma unroll
        for (unsigned int i = 0; i < BN / 8u; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (unsigned int kc = 0; kc < D / 16u; ++kc) {
#pragma unroll
            for (unsigned int np = 0; np < BN / 16u; ++np) {
                unsigned int kf[4];
                ldsm_x4(kf, sk + swz<D>(np * 16u + (lane & 7u) + (lane >> 4) * 8u, kc * 2u + ((lane >> 3) & 1u)));
                mma16816<BF>(s[2u * np], qf[kc], kf[0], kf[1]);
                mma16816<BF>(s[2u * np + 1u], qf[kc], kf[2], kf[3]);
            }
        }

        const unsigned int key0 = tile * BN;
        const bool whole = mode == 0u && key0 + BN <= (unsigned int)kend &&
                           (!causal || (int)(key0 + BN - 1u) <= (int)q0 + shift);  // no key to hide
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (unsigned int j = 0; j < BN / 8u; ++j) {
#pragma unroll
            for (unsigned int e = 0; e < 4u; ++e) {
                float x = s[j][e] * scale2;
                if (!whole) {
                    const unsigned int key = key0 + j * 8u + (lane & 3u) * 2u + (e & 1u);
                    bool seen = key < (unsigned int)kend;
                    if (mode != 0u) seen = seen && ((bits[key >> 5] >> (key & 31u)) & 1u);
                    if (causal) seen = seen && (int)key <= (e < 2u ? see0 : see1);
                    x = seen ? x : NEG_INF;
                }
                s[j][e] = x;
                if (e < 2u) mx0 = fmaxf(mx0, x);
                else mx1 = fmaxf(mx1, x);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float top0 = fmaxf(m0, mx0), top1 = fmaxf(m1, mx1);
        const float use0 = top0 == NEG_INF ? 0.0f : top0, use1 = top1 == NEG_INF ? 0.0f : top1;  // no key yet
        const float c0 = exp2_approx(m0 - use0), c1 = exp2_approx(m1 - use1);
        m0 = top0;
        m1 = top1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (unsigned int j = 0; j < BN / 8u; ++j) {
            s[j][0] = exp2_approx(s[j][0] - use0);
            s[j][1] = exp2_approx(s[j][1] - use0);
            s[j][2] = exp2_approx(s[j][2] - use1);
            s[j][3] = exp2_approx(s[j][3] - use1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
#pragma unroll
        for (unsigned int i = 0; i < D / 8u; ++i) {
            o[i][0] *= c0;
            o[i][1] *= c0;
            o[i][2] *= c1;
            o[i][3] *= c1;
        }
#pragma unroll
        for (unsigned int kc = 0; kc < BN / 16u; ++kc) {
            const unsigned int pa[4] = {
                pack_p<BF>(s[2u * kc][0], s[2u * kc][1]), pack_p<BF>(s[2u * kc][2], s[2u * kc][3]),
                pack_p<BF>(s[2u * kc + 1u][0], s[2u * kc + 1u][1]), pack_p<BF>(s[2u * kc + 1u][2], s[2u * kc + 1u][3])};
#pragma unroll
            for (unsigned int dp = 0; dp < D / 16u; ++dp) {
                unsigned int vf[4];
                ldsm_x4_trans(vf, sv + swz<D>(kc * 16u + (lane & 7u) + ((lane >> 3) & 1u) * 8u, dp * 2u + (lane >> 4)));
                mma16816<BF>(o[2u * dp], pa, vf[0], vf[1]);
                mma16816<BF>(o[2u * dp + 1u], pa, vf[2], vf[3]);
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;  // no key seen: zeros
    const unsigned long long at0 = (((unsigned long long)b * nt + row0) * hq + h) * D + (lane & 3u) * 2u;
    const unsigned long long at1 = at0 + 8ull * hq * D;
#pragma unroll
    for (unsigned int i = 0; i < D / 8u; ++i) {
        if (row0 < nt) store_pair(out, at0 + i * 8u, o[i][0] * inv0, o[i][1] * inv0);
        if (row0 + 8u < nt) store_pair(out, at1 + i * 8u, o[i][2] * inv1, o[i][3] * inv1);
    }
}

// q, k and v as their bits (unsigned short) whatever their dtype: BF says which
#define FLASH(NAME, D, O, BF)                                                                                     \
    extern "C" __global__ void __launch_bounds__(FLASH_THREADS)                                                   \
        NAME(const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned char* key_mask, \
             O* out, unsigned int nb, unsigned int nt, unsigned int ns, unsigned int hq, unsigned int hkv,        \
             unsigned int d, unsigned int causal, unsigned int mask_mode, float scale) {                          \
        gpud_wait_prior();                                                                                        \
        flash<D, O, BF>(q, k, v, key_mask, out, nb, nt, ns, hq, hkv, causal, mask_mode, scale);                   \
    }

// float16 q, k, v; out float32 or float16 (the client's default: q's dtype, float16 here)
FLASH(attention_flash_d32_f32, 32, float, false)
FLASH(attention_flash_d64_f32, 64, float, false)
FLASH(attention_flash_d128_f32, 128, float, false)
FLASH(attention_flash_d32_f16, 32, unsigned short, false)
FLASH(attention_flash_d64_f16, 64, unsigned short, false)
FLASH(attention_flash_d128_f16, 128, unsigned short, false)
// bfloat16 q, k, v; out float32 or bfloat16
FLASH(attention_flash_d32_bf16_f32, 32, float, true)
FLASH(attention_flash_d64_bf16_f32, 64, float, true)
FLASH(attention_flash_d128_bf16_f32, 128, float, true)
FLASH(attention_flash_d32_bf16_bf16, 32, bf16, true)
FLASH(attention_flash_d64_bf16_bf16, 64, bf16, true)
FLASH(attention_flash_d128_bf16_bf16, 128, bf16, true)

// ------------------------------------------------------------------------------------------------
// embedding_<table>_<out>: out[i, c] = table[ids[i], c], zeros for an id outside 0 .. V-1. ids_mode:
// 0 int32, 1 uint32, 2 int64, 3 uint64; read as 32-bit words as attention.wgsl does (a 64-bit id: the low
// word, and a high word other than 0 is outside).

template <typename T, typename O>
__device__ void embed(const unsigned int* ids, const T* table, O* out, unsigned int n, unsigned int d,
                      unsigned int v, unsigned int ids_mode) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const unsigned long long j = i / d;
    const bool wide = ids_mode >= 2u;
    const unsigned int id = ids[wide ? 2ull * j : j];
    const bool outside = id >= v || (wide ? ids[2ull * j + 1ull] != 0u : ids_mode == 0u && (int)id < 0);
    store(out, i, outside ? 0.0f : load(table, id * d + i % d));
}

#define EMBEDDING(NAME, T, O)                                                                                     \
    extern "C" __global__ void NAME(const unsigned int* ids, const T* table, O* out, unsigned int n,             \
                                    unsigned int d, unsigned int v, unsigned int ids_mode) {                     \
        gpud_wait_prior();                                                                                       \
        embed(ids, table, out, n, d, v, ids_mode);                                                                \
    }

EMBEDDING(embedding_f32_f32, float, float)
EMBEDDING(embedding_f16_f32, unsigned short, float)
EMBEDDING(embedding_f32_f16, float, unsigned short)
EMBEDDING(embedding_f16_f16, unsigned short, unsigned short)

// ------------------------------------------------------------------------------------------------
// rotary_<dtype>(x, pos, out) and rotary_inplace_<dtype>(x, pos): one thread per rotated pair; see
// attention.wgsl for the frequency (2^-(j * (freq_hi + freq_lo))) and the reduction of the angle.

struct Pair { unsigned int i0, i1; float c, s; };

__device__ __forceinline__ Pair rot_pair(unsigned int pair, const int* pos, unsigned int nt, unsigned int nh,
                                         unsigned int d, unsigned int style, float freq_hi, float freq_lo) {
    const unsigned int half = d / 2u;
    const unsigned int j = pair % half;
    const unsigned int row = pair / half;
    const unsigned int bt = row / nh;
    const unsigned int t = bt % nt;
    const unsigned int b = bt / nt;
    Pair out;
    turn(j, (float)(pos[b] + (int)t), freq_hi, freq_lo, out.c, out.s);
    const unsigned int base = row * d;
    if (style == 0u) {
        out.i0 = base + j;
        out.i1 = base + j + half;
    } else {
        out.i0 = base + 2u * j;
        out.i1 = out.i0 + 1u;
    }
    return out;
}

template <typename T>
__device__ void rotate(const T* x, const int* pos, T* out, unsigned int n, unsigned int nt, unsigned int nh,
                       unsigned int d, unsigned int style, float freq_hi, float freq_lo) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const Pair p = rot_pair(i, pos, nt, nh, d, style, freq_hi, freq_lo);
    const float a = load(x, p.i0), b = load(x, p.i1);
    store(out, p.i0, a * p.c - b * p.s);
    store(out, p.i1, b * p.c + a * p.s);
}

#define ROTARY(NAME, T)                                                                                           \
    extern "C" __global__ void NAME(const T* x, const int* pos, T* out, unsigned int n, unsigned int nt,         \
                                    unsigned int nh, unsigned int d, unsigned int style, float freq_hi,          \
                                    float freq_lo) {                                                             \
        gpud_wait_prior();                                                                                       \
        rotate(x, pos, out, n, nt, nh, d, style, freq_hi, freq_lo);                                               \
    }

#define ROTARY_INPLACE(NAME, T)                                                                                   \
    extern "C" __global__ void NAME(T* x, const int* pos, unsigned int n, unsigned int nt, unsigned int nh,      \
                                    unsigned int d, unsigned int style, float freq_hi, float freq_lo) {          \
        gpud_wait_prior();                                                                                       \
        rotate(x, pos, x, n, nt, nh, d, style, freq_hi, freq_lo);                                                 \
    }

ROTARY(rotary_f32, float)
ROTARY(rotary_f16, unsigned short)
ROTARY_INPLACE(rotary_inplace_f32, float)
ROTARY_INPLACE(rotary_inplace_f16, unsigned short)

// ------------------------------------------------------------------------------------------------
// kv_append_<cache>_<x>(x, pos, cache): cache[b, pos[b] + t] = x[b, t]; positions outside 0 .. L-1
// are dropped.

template <typename C, typename X>
__device__ void append(const X* x, const int* pos, C* cache, unsigned int n, unsigned int nt, unsigned int l,
                       unsigned int hd) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const unsigned int bt = i / hd;
    const unsigned int t = bt % nt;
    const unsigned int b = bt / nt;
    const int position = pos[b] + (int)t;
    if (position < 0 || (unsigned int)position >= l) return;
    store(cache, (b * l + (unsigned int)position) * hd + i % hd, load(x, i));
}

#define KV_APPEND(NAME, C, X)                                                                                     \
    extern "C" __global__ void NAME(const X* x, const int* pos, C* cache, unsigned int n, unsigned int nt,       \
                                    unsigned int l, unsigned int hd) {                                           \
        gpud_wait_prior();                                                                                       \
        append(x, pos, cache, n, nt, l, hd);                                                                      \
    }

KV_APPEND(kv_append_f32_f32, float, float)
KV_APPEND(kv_append_f32_f16, float, unsigned short)
KV_APPEND(kv_append_f16_f32, unsigned short, float)
KV_APPEND(kv_append_f16_f16, unsigned short, unsigned short)

// ------------------------------------------------------------------------------------------------
// bfloat16: embedding tables and outputs, rotary, kv_append's x and cache (attention's are above).

EMBEDDING(embedding_bf16_f32, bf16, float)
EMBEDDING(embedding_bf16_f16, bf16, unsigned short)
EMBEDDING(embedding_bf16_bf16, bf16, bf16)
EMBEDDING(embedding_f32_bf16, float, bf16)
EMBEDDING(embedding_f16_bf16, unsigned short, bf16)
ROTARY(rotary_bf16, bf16)
ROTARY_INPLACE(rotary_inplace_bf16, bf16)
KV_APPEND(kv_append_bf16_f32, bf16, float)
KV_APPEND(kv_append_bf16_f16, bf16, unsigned short)
KV_APPEND(kv_append_bf16_bf16, bf16, bf16)
KV_APPEND(kv_append_f32_bf16, float, bf16)
KV_APPEND(kv_append_f16_bf16, unsigned short, bf16)
