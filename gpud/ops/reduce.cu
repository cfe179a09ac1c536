// Reductions over the last axis of x (see gpud_protocol/ops/reduce.py for the interface).
// One block of 256 threads per row, the grid folded into y past 65,535 rows. The threads stride over
// the row, then combine their partial results: warp shuffles, one value per warp through shared
// memory, shuffles again; every thread gets the result. Everything accumulates in float32; float16
// is unsigned short storage, bfloat16 a struct of one (a type of its own for the overloads), both
// read into float32 and rounded once when stored (bfloat16 on the bits, as elementwise.cu does).


__device__ __forceinline__ unsigned int row_index() { return blockIdx.x + blockIdx.y * gridDim.x; }

constexpr unsigned int FULL_MASK = 0xffffffffu;
constexpr float LOWEST = -3.40282347e38f;  // the most negative finite float: only -inf is below it

// The combining rules, each a functor so one block-wide routine serves them all.
struct Sum {
    __device__ float identity() const { return 0.0f; }
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
    __device__ float identity() const { return __int_as_float(0xff800000); }  // -inf
    __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};

// Every thread's v combined over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. Ends with a barrier so that it can be called again at once.
template <typename Op>
__device__ float block_reduce(float v, Op op) {
    __shared__ float partial[32];
    unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : op.identity();
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    return v;
}

// The (value, index) pair with the larger value (NaN first), the smaller index on ties.
__device__ __forceinline__ void argmax_merge(float& v, unsigned int& i, float w, unsigned int j) {
    if (wins(w, j, v, i)) {
        v = w;
        i = j;
    }
}

__device__ unsigned int block_argmax(float v, unsigned int i) {
    __shared__ float values[32];
    __shared__ unsigned int indices[32];
    unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
    if (lane == 0) {
        values[warp] = v;
        indices[warp] = i;
    }
    __syncthreads();
    v = values[lane < warps ? lane : 0];  // warp 0's pair again: a duplicate changes nothing
    i = indices[lane < warps ? lane : 0];
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
    __syncthreads();
    return i;
}

// Softmax's running (max m, sum s of exp(v - m)). Starting from (LOWEST, 0), a -inf v adds
// exp(-inf) = 0, so a row of only -inf ends with s = 0.
__device__ __forceinline__ void online(float& m, float& s, float v) {
    if (v > m) {
        s = s * expf(m - v) + 1.0f;
        m = v;
    } else {
        s += expf(v - m);
    }
}

__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float top = fmaxf(m, m2);
    s = s * expf(m - top) + s2 * expf(m2 - top);
    m = top;
}

__device__ void block_online(float& m, float& s) {
    __shared__ float maxima[32];
    __shared__ float sums[32];
    unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, s, o));
    if (lane == 0) {
        maxima[warp] = m;
        sums[warp] = s;
    }
    __syncthreads();
    m = lane < warps ? maxima[lane] : LOWEST;
    s = lane < warps ? sums[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, s, __shfl_xor_sync(FULL_MASK, m, o), __shfl_xor_sync(FULL_MASK, s, o));
    __syncthreads();
}

template <typename X>
__device__ void reduce_row(const X* x, float* out, unsigned int rows, unsigned int length, unsigned int op) {
    unsigned int row = row_index();
    if (row >= rows) return;  // the whole block: no barrier is skipped by some threads only
    size_t base = (size_t)row * length;
    float total;
    if (op == 2) {
        float m = load(x, base);  // element 0 is every thread's: the max needs no -inf to start from
        for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) m = max_nan(m, load(x, base + j));
        total = block_reduce(m, Max());
    } else {
        float acc = 0.0f;
        for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) acc += load(x, base + j);
        total = block_reduce(acc, Sum());
        if (op == 1) total /= (float)length;
    }
    if (threadIdx.x == 0) out[row] = total;
}

// argmax's loads in flight per thread before it compares any: one block reads a whole row, and a long one
// (an LM head's 151,936 logits) goes at the latency of a load over the bytes in flight (1024 threads of
// the spec's block, 64 KB of float32 at once; one load at a time took 51 us for that row on an H200).
constexpr unsigned int ARGMAX_UNROLL = 16;

template <typename X>
__device__ void argmax_row(const X* x, int* out, unsigned int rows, unsigned int length) {
    unsigned int row = row_index();
    if (row >= rows) return;
    size_t base = (size_t)row * length;
    float best = load(x, base);  // element 0 first: ties keep the smaller index
    unsigned int at = 0;
    const unsigned int step = blockDim.x;
    unsigned int j = threadIdx.x;
    for (; j + (ARGMAX_UNROLL - 1u) * step < length; j += ARGMAX_UNROLL * step) {
        float v[ARGMAX_UNROLL];
#pragma unroll
        for (unsigned int u = 0; u < ARGMAX_UNROLL; ++u) v[u] = load(x, base + j + u * step);
#pragma unroll
        for (unsigned int u = 0; u < ARGMAX_UNROLL; ++u) {  // this thread's elements in increasing order
            if (above(v[u], best)) {
                best = v[u];
                at = j + u * step;
            }
        }
    }
    for (; j < length; j += step) {
        float v = load(x, base + j);
        if (above(v, best)) {
            best = v;
            at = j;
        }
    }
    unsigned int i = block_argmax(best, at);
    if (threadIdx.x == 0) out[row] = (int)i;
}

// softmax of x + mask (mask null: none), the mask's row `row % mask_rows` added to row `row`.
template <typename X>
__device__ void softmax_row(const X* x, const float* mask, X* out, unsigned int rows, unsigned int length,
                            unsigned int mask_rows) {
    unsigned int row = row_index();
    if (row >= rows) return;
    size_t base = (size_t)row * length;
    size_t mbase = mask ? (size_t)(row % mask_rows) * length : 0;
    float m = LOWEST, s = 0.0f;
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x)
        online(m, s, load(x, base + j) + (mask ? mask[mbase + j] : 0.0f));
    block_online(m, s);
    float scale = s > 0.0f || is_nan(s) ? 1.0f / s : 0.0f;  // only -inf: zeros, not NaN; NaN: all NaN
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x)
        store(out, base + j, expf(load(x, base + j) + (mask ? mask[mbase + j] : 0.0f) - m) * scale);
}

template <typename X, typename W>
__device__ void rmsnorm_row(const X* x, const W* weight, X* out, unsigned int rows, unsigned int length, float eps) {
    unsigned int row = row_index();
    if (row >= rows) return;
    size_t base = (size_t)row * length;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) {
        float v = load(x, base + j);
        acc += v * v;
    }
    float r = 1.0f / sqrtf(block_reduce(acc, Sum()) / (float)length + eps);
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x)
        store(out, base + j, load(x, base + j) * r * load(weight, j));
}

template <typename X, typename W>
__device__ void layernorm_row(const X* x, const W* weight, const W* bias, X* out, unsigned int rows,
                              unsigned int length, float eps) {
    unsigned int row = row_index();
    if (row >= rows) return;
    size_t base = (size_t)row * length;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) acc += load(x, base + j);
    float mean = block_reduce(acc, Sum()) / (float)length;
    float acc2 = 0.0f;  // the variance from a second pass over x - mean: no cancellation
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) {
        float c = load(x, base + j) - mean;
        acc2 += c * c;
    }
    float r = 1.0f / sqrtf(block_reduce(acc2, Sum()) / (float)length + eps);
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x)
        store(out, base + j, (load(x, base + j) - mean) * r * load(weight, j) + load(bias, j));
}

extern "C" __global__ void reduce_f32(const float* x, float* out, unsigned int rows, unsigned int length,
                                      unsigned int op) {
    gpud_wait_prior();
    reduce_row(x, out, rows, length, op);
}

extern "C" __global__ void reduce_f16(const unsigned short* x, float* out, unsigned int rows, unsigned int length,
                                      unsigned int op) {
    gpud_wait_prior();
    reduce_row(x, out, rows, length, op);
}

extern "C" __global__ void reduce_bf16(const bf16* x, float* out, unsigned int rows, unsigned int length,
                                       unsigned int op) {
    gpud_wait_prior();
    reduce_row(x, out, rows, length, op);
}

extern "C" __global__ void argmax_f32(const float* x, int* out, unsigned int rows, unsigned int length) {
    gpud_wait_prior();
    argmax_row(x, out, rows, length);
}

extern "C" __global__ void argmax_f16(const unsigned short* x, int* out, unsigned int rows, unsigned int length) {
    gpud_wait_prior();
    argmax_row(x, out, rows, length);
}

extern "C" __global__ void argmax_bf16(const bf16* x, int* out, unsigned int rows, unsigned int length) {
    gpud_wait_prior();
    argmax_row(x, out, rows, length);
}

extern "C" __global__ void softmax_f32(const float* x, float* out, unsigned int rows, unsigned int length) {
    gpud_wait_prior();
    softmax_row(x, (const float*)0, out, rows, length, 1u);
}

extern "C" __global__ void softmax_f16(const unsigned short* x, unsigned short* out, unsigned int rows,
                                       unsigned int length) {
    gpud_wait_prior();
    softmax_row(x, (const float*)0, out, rows, length, 1u);
}

extern "C" __global__ void softmax_bf16(const bf16* x, bf16* out, unsigned int rows, unsigned int length) {
    gpud_wait_prior();
    softmax_row(x, (const float*)0, out, rows, length, 1u);
}

extern "C" __global__ void softmax_mask_f32(const float* x, const float* mask, float* out, unsigned int rows,
                                            unsigned int length, unsigned int mask_rows) {
    gpud_wait_prior();
    softmax_row(x, mask, out, rows, length, mask_rows);
}

extern "C" __global__ void softmax_mask_f16(const unsigned short* x, const float* mask, unsigned short* out,
                                            unsigned int rows, unsigned int length, unsigned int mask_rows) {
    gpud_wait_prior();
    softmax_row(x, mask, out, rows, length, mask_rows);
}

extern "C" __global__ void softmax_mask_bf16(const bf16* x, const float* mask, bf16* out, unsigned int rows,
                                             unsigned int length, unsigned int mask_rows) {
    gpud_wait_prior();
    softmax_row(x, mask, out, rows, length, mask_rows);
}

extern "C" __global__ void rmsnorm_f32_f32(const float* x, const float* weight, float* out, unsigned int rows,
                                           unsigned int length, float eps) {
    gpud_wait_prior();
    rmsnorm_row(x, weight, out, rows, length, eps);
}

extern "C" __global__ void rmsnorm_f32_f16(const float* x, const unsigned short* weight, float* out,
                                           unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    rmsnorm_row(x, weight, out, rows, length, eps);
}

extern "C" __global__ void rmsnorm_f16_f32(const unsigned short* x, const float* weight, unsigned short* out,
                                           unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    rmsnorm_row(x, weight, out, rows, length, eps);
}

extern "C" __global__ void rmsnorm_f16_f16(const unsigned short* x, const unsigned short* weight,
                                           unsigned short* out, unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    rmsnorm_row(x, weight, out, rows, length, eps);
}

extern "C" __global__ void layernorm_f32_f32(const float* x, const float* weight, const float* bias, float* out,
                                             unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    layernorm_row(x, weight, bias, out, rows, length, eps);
}

extern "C" __global__ void layernorm_f32_f16(const float* x, const unsigned short* weight, const unsigned short* bias,
                                             float* out, unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    layernorm_row(x, weight, bias, out, rows, length, eps);
}

extern "C" __global__ void layernorm_f16_f32(const unsigned short* x, const float* weight, const float* bias,
                                             unsigned short* out, unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    layernorm_row(x, weight, bias, out, rows, length, eps);
}

extern "C" __global__ void layernorm_f16_f16(const unsigned short* x, const unsigned short* weight,
                                             const unsigned short* bias, unsigned short* out, unsigned int rows,
                                             unsigned int length, float eps) {
    gpud_wait_prior();
    layernorm_row(x, weight, bias, out, rows, length, eps);
}

// The norms with a bfloat16 x or weight, one line each (the float32 and float16 pairs are above).
#define RMSNORM(name, X, W)                                                                                        \
    extern "C" __global__ void name(const X* x, const W* weight, X* out, unsigned int rows, unsigned int length,   \
                                    float eps) {                                                                 \
        gpud_wait_prior();                                                                                       \
        rmsnorm_row(x, weight, out, rows, length, eps);                                                          \
    }
#define LAYERNORM(name, X, W)                                                                                      \
    extern "C" __global__ void name(const X* x, const W* weight, const W* bias, X* out, unsigned int rows,        \
                                    unsigned int length, float eps) {                                            \
        gpud_wait_prior();                                                                                       \
        layernorm_row(x, weight, bias, out, rows, length, eps);                                                  \
    }
RMSNORM(rmsnorm_bf16_f32, bf16, float)
RMSNORM(rmsnorm_bf16_f16, bf16, unsigned short)
RMSNORM(rmsnorm_bf16_bf16, bf16, bf16)
RMSNORM(rmsnorm_f32_bf16, float, bf16)
RMSNORM(rmsnorm_f16_bf16, unsigned short, bf16)
LAYERNORM(layernorm_bf16_f32, bf16, float)
LAYERNORM(layernorm_bf16_f16, bf16, unsigned short)
LAYERNORM(layernorm_bf16_bf16, bf16, bf16)
LAYERNORM(layernorm_f32_bf16, float, bf16)
LAYERNORM(layernorm_f16_bf16, unsigned short, bf16)

// x / max(||x||, eps) over each row (torch.nn.functional.normalize, p=2).
template <typename X>
__device__ void normalize_row(const X* x, X* out, unsigned int rows, unsigned int length, float eps) {
    unsigned int row = row_index();
    if (row >= rows) return;
    size_t base = (size_t)row * length;
    float acc = 0.0f;
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) {
        float v = load(x, base + j);
        acc += v * v;
    }
    float norm = fmaxf(sqrtf(block_reduce(acc, Sum())), eps);
    for (unsigned int j = threadIdx.x; j < length; j += blockDim.x) store(out, base + j, load(x, base + j) / norm);
}

extern "C" __global__ void normalize_f32(const float* x, float* out, unsigned int rows, unsigned int length,
                                         float eps) {
    gpud_wait_prior();
    normalize_row(x, out, rows, length, eps);
}

extern "C" __global__ void normalize_f16(const unsigned short* x, unsigned short* out, unsigned int rows,
                                         unsigned int length, float eps) {
    gpud_wait_prior();
    normalize_row(x, out, rows, length, eps);
}

extern "C" __global__ void normalize_bf16(const bf16* x, bf16* out, unsigned int rows, unsigned int length, float eps) {
    gpud_wait_prior();
    normalize_row(x, out, rows, length, eps);
}

// ---------------------------------------------------------------- layernorm_warp: a warp a row (CUDA)
// layernorm's arithmetic for rows of at most WARP_ROW_MAX elements, one warp a row and 8 rows a block of 256
// threads (gpud_protocol/ops/reduce_warp.py: the client picks it where a row fits). A row is read once into
// registers, lane j holding elements j, j + 32, ...; its sums are warp shuffles, no barrier. One block of 256
// threads per row of 384 elements (MiniLM's) spent most of its time in the block-wide combines.
// add_layernorm_warp: the same over x + r (a post-LN transformer's residual add and norm, one launch).
constexpr unsigned int WARP_ROW_MAX = 1024;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// A row's elements as layernorm_warp reads them: x's, or x + r as `add` stores the sum (float32, rounded
// once to X: elementwise.cu's arithmetic), so add_layernorm_warp's bits are add's then layernorm_warp's.
template <typename X>
struct Stored {
    const X* x;
    __device__ __forceinline__ float operator()(size_t i) const { return load(x, i); }
};
template <typename X>
struct Added {
    const X* x;
    const X* r;
    __device__ __forceinline__ float operator()(size_t i) const { return rounded(x, load(x, i) + load(r, i)); }
};

template <typename X, typename W, typename Row>
__device__ void layernorm_warp(Row row_of, const W* weight, const W* bias, X* out, unsigned int rows,
                               unsigned int length, float eps) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int row = row_index() * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows || length > WARP_ROW_MAX) return;  // a whole warp: its shuffles need every lane
    const size_t base = (size_t)row * length;
    float v[WARP_ROW_MAX / 32];
    float acc = 0.0f;
#pragma unroll
    for (unsigned int i = 0; i < WARP_ROW_MAX / 32; i++) {
        const unsigned int j = lane + 32u * i;
        v[i] = j < length ? row_of(base + j) : 0.0f;
        acc += v[i];
    }
    const float mean = warp_sum(acc) / (float)length;
    float acc2 = 0.0f;  // the variance from a second pass over x - mean: no cancellation
#pragma unroll
    for (unsigned int i = 0; i < WARP_ROW_MAX / 32; i++) {
        const float c = lane + 32u * i < length ? v[i] - mean : 0.0f;
        acc2 += c * c;
    }
    const float r = 1.0f / sqrtf(warp_sum(acc2) / (float)length + eps);
#pragma unroll
    for (unsigned int i = 0; i < WARP_ROW_MAX / 32; i++) {
        const unsigned int j = lane + 32u * i;
        if (j < length) store(out, base + j, (v[i] - mean) * r * load(weight, j) + load(bias, j));
    }
}

#define LAYERNORM_WARP(name, X, W)                                                                                 \
    extern "C" __global__ void name(const X* x, const W* weight, const W* bias, X* out, unsigned int rows,        \
                                    unsigned int length, float eps) {                                            \
        gpud_wait_prior();                                                                                       \
        layernorm_warp(Stored<X>{x}, weight, bias, out, rows, length, eps);                                      \
    }
LAYERNORM_WARP(layernorm_warp_f32_f32, float, float)
LAYERNORM_WARP(layernorm_warp_f32_f16, float, unsigned short)
LAYERNORM_WARP(layernorm_warp_f32_bf16, float, bf16)
LAYERNORM_WARP(layernorm_warp_f16_f32, unsigned short, float)
LAYERNORM_WARP(layernorm_warp_f16_f16, unsigned short, unsigned short)
LAYERNORM_WARP(layernorm_warp_f16_bf16, unsigned short, bf16)
LAYERNORM_WARP(layernorm_warp_bf16_f32, bf16, float)
LAYERNORM_WARP(layernorm_warp_bf16_f16, bf16, unsigned short)
LAYERNORM_WARP(layernorm_warp_bf16_bf16, bf16, bf16)

#define ADD_LAYERNORM_WARP(name, X, W)                                                                             \
    extern "C" __global__ void name(const X* x, const X* r, const W* weight, const W* bias, X* out,               \
                                    unsigned int rows, unsigned int length, float eps) {                         \
        gpud_wait_prior();                                                                                       \
        layernorm_warp(Added<X>{x, r}, weight, bias, out, rows, length, eps);                                    \
    }
ADD_LAYERNORM_WARP(add_layernorm_warp_f32_f32, float, float)
ADD_LAYERNORM_WARP(add_layernorm_warp_f32_f16, float, unsigned short)
ADD_LAYERNORM_WARP(add_layernorm_warp_f32_bf16, float, bf16)
ADD_LAYERNORM_WARP(add_layernorm_warp_f16_f32, unsigned short, float)
ADD_LAYERNORM_WARP(add_layernorm_warp_f16_f16, unsigned short, unsigned short)
ADD_LAYERNORM_WARP(add_layernorm_warp_f16_bf16, unsigned short, bf16)
ADD_LAYERNORM_WARP(add_layernorm_warp_bf16_f32, bf16, float)
ADD_LAYERNORM_WARP(add_layernorm_warp_bf16_f16, bf16, unsigned short)
ADD_LAYERNORM_WARP(add_layernorm_warp_bf16_bf16, bf16, bf16)
