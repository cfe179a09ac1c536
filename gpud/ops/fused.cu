// Fused decode kernels (see gpud_protocol/ops/fused.py for the interface): add_rmsnorm, silu_and_mul
// and rotary_kv_append, the same arithmetic as reduce.cu's rmsnorm, elementwise.cu's silu_mul and
// attention.cu's rotary and kv_append, in one launch each. A thread of silu_and_mul and
// rotary_kv_append takes the elements of whole 4-byte words, as fused.wgsl's do (one grid serves
// both). Float16 and bfloat16: halves.cu and load_store.cu; the rotary angle: rotary.cu; the block
// sum: block_sum.cu (gpud.ops.source adds them first).

template <typename T> struct Words { static constexpr unsigned int per = 2; };  // elements per 4-byte word
template <> struct Words<float> { static constexpr unsigned int per = 1; };

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

// ------------------------------------------------------------------------------------------------
// add_rmsnorm_<x>_<w>: one block per row; sum = x + r as stored, then rmsnorm of the stored sum.

template <typename X, typename W>
__device__ void add_rmsnorm_row(const X* x, const X* r, const W* weight, X* sum, X* out, unsigned int rows,
                                unsigned int length, float eps) {
    const unsigned int row = blockIdx.x + blockIdx.y * gridDim.x;
    if (row >= rows) return;  // the whole block
    const size_t base = (size_t)row * length;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) {
        const float s = rounded(sum, load(x, base + j) + load(r, base + j));
        store(sum, base + j, s);
        acc += s * s;
    }
    const float scale = 1.0f / sqrtf(block_sum(acc) / (float)length + eps);
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) {
        const float s = rounded(sum, load(x, base + j) + load(r, base + j));
        store(out, base + j, s * scale * load(weight, j));
    }
}

#define ADD_RMSNORM(NAME, X, W)                                                                                   \
    extern "C" __global__ void NAME(const X* x, const X* r, const W* weight, X* sum, X* out, unsigned int rows, \
                                    unsigned int length, float eps) {                                            \
        gpud_wait_prior();                                                                                       \
        add_rmsnorm_row(x, r, weight, sum, out, rows, length, eps);                                               \
    }

ADD_RMSNORM(add_rmsnorm_f32_f32, float, float)
ADD_RMSNORM(add_rmsnorm_f32_f16, float, unsigned short)
ADD_RMSNORM(add_rmsnorm_f32_bf16, float, bf16)
ADD_RMSNORM(add_rmsnorm_f16_f32, unsigned short, float)
ADD_RMSNORM(add_rmsnorm_f16_f16, unsigned short, unsigned short)
ADD_RMSNORM(add_rmsnorm_f16_bf16, unsigned short, bf16)
ADD_RMSNORM(add_rmsnorm_bf16_f32, bf16, float)
ADD_RMSNORM(add_rmsnorm_bf16_f16, bf16, unsigned short)
ADD_RMSNORM(add_rmsnorm_bf16_bf16, bf16, bf16)

// ------------------------------------------------------------------------------------------------
// silu_and_mul_<x>: a thread per word of out (one float32, two 16-bit elements; width is even then).

template <typename X>
__device__ void silu_and_mul_words(const X* x, X* out, unsigned int n, unsigned int width) {
    const unsigned int per = Words<X>::per;
    const unsigned int first = linear_index() * per;
    if (first >= n) return;
    for (unsigned int e = first; e < first + per; ++e) {
        const size_t row = e / width, c = e % width;
        const float a = load(x, row * 2u * width + c), b = load(x, row * 2u * width + width + c);
        store(out, e, a / (1.0f + expf(-a)) * b);
    }
}

#define SILU_AND_MUL(NAME, X)                                                                                     \
    extern "C" __global__ void NAME(const X* x, X* out, unsigned int n, unsigned int width) {                    \
        gpud_wait_prior();                                                                                       \
        silu_and_mul_words(x, out, n, width);                                                                     \
    }

SILU_AND_MUL(silu_and_mul_f32, float)
SILU_AND_MUL(silu_and_mul_f16, unsigned short)
SILU_AND_MUL(silu_and_mul_bf16, bf16)

// ------------------------------------------------------------------------------------------------
// rotary_kv_append_<cache>_<x>: a thread per four elements of qkv: two pairs of one head (neox: j and
// j + 1 with their partners j + D/2 and j + 1 + D/2; gptj: (4u, 4u+1) and (4u+2, 4u+3)). Query heads
// are rotated into q, key heads rotated into k_cache, value heads copied into v_cache. The angle is
// rotary.cu's `turn`, as attention.cu's rotary takes it.

template <typename C, typename X>
__device__ void rotary_kv(const X* qkv, const int* pos, X* q, C* kc, C* vc, unsigned int n, unsigned int nt,
                          unsigned int hq, unsigned int hkv, unsigned int d, unsigned int l, unsigned int style,
                          float freq_hi, float freq_lo) {
    const unsigned int i = linear_index();
    if (i >= n) return;
    const unsigned int quads = d / 4u;  // threads per head
    const unsigned int heads = hq + 2u * hkv;
    const unsigned int u = i % quads;
    const unsigned int head = (i / quads) % heads;
    const unsigned int bt = i / (quads * heads);  // b * T + t
    const unsigned int b = bt / nt, t = bt % nt;
    const size_t src = ((size_t)bt * heads + head) * d;
    const int position = pos[b] + (int)t;
    unsigned int e[4];  // the four elements: pairs (e[0], e[1]) and (e[2], e[3])
    unsigned int j0;    // the first pair's index j (the second's is j0 + 1)
    if (style == 0u) {
        j0 = 2u * u;
        e[0] = j0; e[1] = j0 + d / 2u; e[2] = j0 + 1u; e[3] = j0 + 1u + d / 2u;
    } else {
        j0 = 2u * u;
        e[0] = 4u * u; e[1] = 4u * u + 1u; e[2] = 4u * u + 2u; e[3] = 4u * u + 3u;
    }
    float v[4];
    for (int k = 0; k < 4; ++k) v[k] = load(qkv, src + e[k]);
    if (head < hq + hkv) {  // rotated: query or key
        for (int p = 0; p < 2; ++p) {
            float c, s;
            turn(j0 + (unsigned int)p, (float)position, freq_hi, freq_lo, c, s);
            const float a = v[2 * p], bb = v[2 * p + 1];
            v[2 * p] = a * c - bb * s;
            v[2 * p + 1] = bb * c + a * s;
        }
    }
    if (head < hq) {
        const size_t dst = ((size_t)bt * hq + head) * d;
        for (int k = 0; k < 4; ++k) store(q, dst + e[k], v[k]);
        return;
    }
    if (position < 0 || (unsigned int)position >= l) return;
    const bool key = head < hq + hkv;
    const unsigned int h = key ? head - hq : head - hq - hkv;
    const size_t dst = (((size_t)b * l + (unsigned int)position) * hkv + h) * d;
    C* cache = key ? kc : vc;
    for (int k = 0; k < 4; ++k) store(cache, dst + e[k], v[k]);
}

#define ROTARY_KV_APPEND(NAME, C, X)                                                                              \
    extern "C" __global__ void NAME(const X* qkv, const int* pos, X* q, C* k_cache, C* v_cache, unsigned int n, \
                                    unsigned int nt, unsigned int hq, unsigned int hkv, unsigned int d,          \
                                    unsigned int l, unsigned int style, float freq_hi, float freq_lo) {          \
        gpud_wait_prior();                                                                                       \
        rotary_kv(qkv, pos, q, k_cache, v_cache, n, nt, hq, hkv, d, l, style, freq_hi, freq_lo);                  \
    }

ROTARY_KV_APPEND(rotary_kv_append_f32_f32, float, float)
ROTARY_KV_APPEND(rotary_kv_append_f32_f16, float, unsigned short)
ROTARY_KV_APPEND(rotary_kv_append_f32_bf16, float, bf16)
ROTARY_KV_APPEND(rotary_kv_append_f16_f32, unsigned short, float)
ROTARY_KV_APPEND(rotary_kv_append_f16_f16, unsigned short, unsigned short)
ROTARY_KV_APPEND(rotary_kv_append_f16_bf16, unsigned short, bf16)
ROTARY_KV_APPEND(rotary_kv_append_bf16_f32, bf16, float)
ROTARY_KV_APPEND(rotary_kv_append_bf16_f16, bf16, unsigned short)
ROTARY_KV_APPEND(rotary_kv_append_bf16_bf16, bf16, bf16)
