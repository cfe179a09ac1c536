// Attention ops (see gpud_protocol/ops/attention.py for the interface): embedding lookup, rotary
// position embedding, KV-cache append, and attention (split over the keys, then combined). The same
// algorithms as attention.wgsl. Float16 is unsigned short storage, computed in float32; one template
// body serves every dtype combination, instantiated by the extern "C" entry points.

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

__device__ __forceinline__ float load(const float* p, unsigned int i) { return p[i]; }
__device__ __forceinline__ float load(const unsigned short* p, unsigned int i) { return h2f(p[i]); }
__device__ __forceinline__ void store(float* p, unsigned int i, float v) { p[i] = v; }
__device__ __forceinline__ void store(unsigned short* p, unsigned int i, float v) { p[i] = f2h(v); }

// q . k over a row of D: 16-byte loads where the row is aligned (a warp's threads read 32 rows: fewer,
// wider loads), else one element at a time.
__device__ __forceinline__ float dot_row(const float* sq, const float* k, unsigned int k0, unsigned int d) {
    float dot = 0.0f;
    unsigned int i = 0;
    if ((k0 & 3u) == 0u && (reinterpret_cast<unsigned long long>(k) & 15u) == 0u) {
        const float4* row = reinterpret_cast<const float4*>(k + k0);
#pragma unroll 4
        for (; i + 4u <= d; i += 4u) {
            const float4 w = row[i / 4u];
            dot += sq[i] * w.x + sq[i + 1u] * w.y + sq[i + 2u] * w.z + sq[i + 3u] * w.w;
        }
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
        const uint4* row = reinterpret_cast<const uint4*>(k + k0);
#pragma unroll 4
        for (; i + 8u <= d; i += 8u) {
            const uint4 w = row[i / 8u];
            dot += dot_pair(sq, i, w.x) + dot_pair(sq, i + 2u, w.y) + dot_pair(sq, i + 4u, w.z) + dot_pair(sq, i + 6u, w.w);
        }
    }
    for (; i < d; ++i) dot += sq[i] * h2f(k[k0 + i]);
    return dot;
}

#define BLOCK 256u
#define NONE (-3.0e38f)   // the running maximum before any key, and the score of a hidden key
#define HIDDEN (-1.0e30f) // a mask value at or below this hides its key

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

// ------------------------------------------------------------------------------------------------
// attention_<q>_<kv>: one block of 256 threads per (query row, split of the keys); see attention.wgsl.

template <typename Q, typename KV>
__device__ void attend(const Q* q, const KV* k, const KV* v, const int* pos, const float* mask, float* part,
                       unsigned int nb, unsigned int nt, unsigned int ns, unsigned int hq, unsigned int hkv,
                       unsigned int d, unsigned int splits, unsigned int causal, unsigned int mask_mode,
                       unsigned int use_pos, float scale) {
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
            if (mask_mode != 0u) {
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
#pragma unroll 8
            for (unsigned int j = g; j < n; j += ngroups) {  // unrolled: loads in flight together
                const float pj = sp[j];
                const float x = load(v, kv0 + (key0 + j) * stride + dd);  // key0 + j < keys: inside the cache
                acc += pj != 0.0f ? pj * x : 0.0f;  // a hidden key's value is never used (it may be NaN)
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
    const unsigned int out = work * (d + 2u);
    if (tid == 0u) {
        float total = 0.0f;
        for (unsigned int i = 0; i < 16u; ++i) total += sm[i];
        part[out] = m;
        part[out + 1u] = total;
    }
    if (tid < d) {
        float total = 0.0f;
        for (unsigned int gi = 0; gi < ngroups; ++gi) total += sr[gi * d + tid];
        part[out + 2u + tid] = total;
    }
}

#define ATTENTION(NAME, Q, KV)                                                                                    \
    extern "C" __global__ void NAME(const Q* q, const KV* k, const KV* v, const int* pos, const float* mask,      \
                                    float* part, unsigned int nb, unsigned int nt, unsigned int ns,                \
                                    unsigned int hq, unsigned int hkv, unsigned int d, unsigned int splits,        \
                                    unsigned int causal, unsigned int mask_mode, unsigned int use_pos, float scale) { \
        attend(q, k, v, pos, mask, part, nb, nt, ns, hq, hkv, d, splits, causal, mask_mode, use_pos, scale);      \
    }

ATTENTION(attention_f32_f32, float, float)
ATTENTION(attention_f32_f16, float, unsigned short)
ATTENTION(attention_f16_f32, unsigned short, float)
ATTENTION(attention_f16_f16, unsigned short, unsigned short)

extern "C" __global__ void attention_combine(const float* part, float* out, unsigned int n, unsigned int d,
                                             unsigned int splits) {
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
    out[i] = den > 0.0f ? num / den : 0.0f;
}

// ------------------------------------------------------------------------------------------------
// embedding_<table>_<out>: out[i, c] = table[ids[i], c], zeros for an id outside 0 .. V-1.

template <typename T, typename O>
__device__ void embed(const int* ids, const T* table, O* out, unsigned int n, unsigned int d, unsigned int v) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const int id = ids[i / d];
    store(out, i, (id < 0 || (unsigned int)id >= v) ? 0.0f : load(table, (unsigned int)id * d + i % d));
}

#define EMBEDDING(NAME, T, O)                                                                                     \
    extern "C" __global__ void NAME(const int* ids, const T* table, O* out, unsigned int n, unsigned int d,      \
                                    unsigned int v) {                                                            \
        embed(ids, table, out, n, d, v);                                                                          \
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
    const float position = (float)(pos[b] + (int)t);
    const float e = __fmul_rn((float)j, freq_hi);  // exact
    const float whole = floorf(e);
    const float frac = __fadd_rn(__fsub_rn(e, whole), __fmul_rn((float)j, freq_lo));
    const float angle = __fmul_rn(position, ldexpf(exp2f(-frac), -(int)whole));
    const float k = rintf(__fmul_rn(angle, 0.15915494309189535f));
    const float r = __fsub_rn(__fsub_rn(__fsub_rn(angle, __fmul_rn(k, 6.28125f)), __fmul_rn(k, 0.0019378662109375f)),
                              __fmul_rn(k, -2.559031372584286e-06f));
    Pair out;
    sincosf(r, &out.s, &out.c);
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
        rotate(x, pos, out, n, nt, nh, d, style, freq_hi, freq_lo);                                               \
    }

#define ROTARY_INPLACE(NAME, T)                                                                                   \
    extern "C" __global__ void NAME(T* x, const int* pos, unsigned int n, unsigned int nt, unsigned int nh,      \
                                    unsigned int d, unsigned int style, float freq_hi, float freq_lo) {          \
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
        append(x, pos, cache, n, nt, l, hd);                                                                      \
    }

KV_APPEND(kv_append_f32_f32, float, float)
KV_APPEND(kv_append_f32_f16, float, unsigned short)
KV_APPEND(kv_append_f16_f32, unsigned short, float)
KV_APPEND(kv_append_f16_f16, unsigned short, unsigned short)
