// Elementwise ops (see gpud_protocol/ops/elementwise.py for the interface, gpud_protocol/ops/dtypes.py
// for the dtype codes, gpud_protocol/ops/broadcast.py for the broadcast layout). Each tensor's dtype is
// a scalar: one kernel per kind serves every dtype and mix. A thread writes the elements of one 4-byte
// word of the output (4 int8, 2 float16, 1 float32; one 8-byte element), as the WGSL kernels do, so one
// grid serves both. The grid may fold into y past 65,535 blocks. Arithmetic is float32. bfloat16 is
// unsigned short storage converted on the bits, as the WGSL kernels do (not cvt.rn.bf16.f32, whose
// NaN is canonical), so both backends give the same bits.
//
// Adding a dtype: its code below, a case in `dtype_bytes`, `is_float`, `load_f`, `load_i` and `store_f`.

#define F32 0u
#define F16 1u
#define I32 2u
#define U32 3u
#define I8 4u
#define U8 5u
#define I16 6u
#define U16 7u
#define I64 8u
#define U64 9u
#define BF16 10u
#define MAX_RANK 6

// NaN keeps its sign and payload, as numpy and elementwise.wgsl (cvt gives 0x7fffffff for every NaN).
__device__ __forceinline__ float h2f(unsigned short h) {
    if ((h & 0x7fffu) > 0x7c00u) return __uint_as_float(((unsigned int)(h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// NaN keeps its sign and payload with the quiet bit set, as elementwise.wgsl (cvt gives 0x7fff for every NaN).
__device__ __forceinline__ unsigned short f2h(float f) {
    const unsigned int x = __float_as_uint(f), a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(((x >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu));
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }
// Rounded to nearest even; NaN gives the quiet NaN of its sign, as ml_dtypes does (as elementwise.wgsl).
__device__ __forceinline__ unsigned short f2bf(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((x >> 16) & 0x8000u) | 0x7fc0u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ unsigned int linear_index() {
    return blockIdx.x * blockDim.x + threadIdx.x + blockIdx.y * gridDim.x * blockDim.x;
}

__device__ __forceinline__ unsigned int dtype_bytes(unsigned int c) {
    switch (c) {
        case I8: case U8: return 1u;
        case F16: case I16: case U16: case BF16: return 2u;
        case I64: case U64: return 8u;
        default: return 4u;
    }
}

__device__ __forceinline__ bool is_float(unsigned int c) { return c == F32 || c == F16 || c == BF16; }

__device__ __forceinline__ float load_f(const unsigned char* p, unsigned int c, size_t i) {
    switch (c) {
        case F32: return reinterpret_cast<const float*>(p)[i];
        case F16: return h2f(reinterpret_cast<const unsigned short*>(p)[i]);
        case BF16: return bf2f(reinterpret_cast<const unsigned short*>(p)[i]);
        case I32: return (float)reinterpret_cast<const int*>(p)[i];
        case U32: return (float)reinterpret_cast<const unsigned int*>(p)[i];
        case I8: return (float)reinterpret_cast<const signed char*>(p)[i];
        case U8: return (float)p[i];
        case I16: return (float)reinterpret_cast<const short*>(p)[i];
        case U16: return (float)reinterpret_cast<const unsigned short*>(p)[i];
        case I64: return (float)reinterpret_cast<const long long*>(p)[i];
        default: return (float)reinterpret_cast<const unsigned long long*>(p)[i];
    }
}

// An integer element, sign- or zero-extended to 64 bits.
__device__ __forceinline__ unsigned long long load_i(const unsigned char* p, unsigned int c, size_t i) {
    switch (c) {
        case I32: return (unsigned long long)(long long)reinterpret_cast<const int*>(p)[i];
        case U32: return reinterpret_cast<const unsigned int*>(p)[i];
        case I8: return (unsigned long long)(long long)reinterpret_cast<const signed char*>(p)[i];
        case U8: return p[i];
        case I16: return (unsigned long long)(long long)reinterpret_cast<const short*>(p)[i];
        case U16: return reinterpret_cast<const unsigned short*>(p)[i];
        default: return reinterpret_cast<const unsigned long long*>(p)[i];  // int64, uint64
    }
}

// The low bytes of an integer (integer to integer casts wrap, as numpy's astype).
__device__ __forceinline__ void store_i(unsigned char* p, unsigned int c, size_t i, unsigned long long v) {
    switch (dtype_bytes(c)) {
        case 1u: p[i] = (unsigned char)v; break;
        case 2u: reinterpret_cast<unsigned short*>(p)[i] = (unsigned short)v; break;
        case 4u: reinterpret_cast<unsigned int*>(p)[i] = (unsigned int)v; break;
        default: reinterpret_cast<unsigned long long*>(p)[i] = v;
    }
}

__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Floats rounded to nearest even; to integers truncated toward zero and saturated (cvt.rzi saturates,
// NaN gives 0).
__device__ __forceinline__ void store_f(unsigned char* p, unsigned int c, size_t i, float v) {
    switch (c) {
        case F32: reinterpret_cast<float*>(p)[i] = v; break;
        case F16: reinterpret_cast<unsigned short*>(p)[i] = f2h(v); break;
        case BF16: reinterpret_cast<unsigned short*>(p)[i] = f2bf(v); break;
        case I32: reinterpret_cast<int*>(p)[i] = __float2int_rz(v); break;
        case U32: reinterpret_cast<unsigned int*>(p)[i] = __float2uint_rz(v); break;
        case I8: reinterpret_cast<signed char*>(p)[i] = (signed char)clamp_int(__float2int_rz(v), -128, 127); break;
        case U8: p[i] = (unsigned char)clamp_int(__float2int_rz(v), 0, 255); break;
        case I16: reinterpret_cast<short*>(p)[i] = (short)clamp_int(__float2int_rz(v), -32768, 32767); break;
        case U16: reinterpret_cast<unsigned short*>(p)[i] = (unsigned short)clamp_int(__float2int_rz(v), 0, 65535); break;
        // cvt.rzi to 64 bits gives 0x8000... for NaN (the 32-bit forms give 0): NaN is 0 here too.
        case I64: reinterpret_cast<long long*>(p)[i] = v != v ? 0 : __float2ll_rz(v); break;
        default: reinterpret_cast<unsigned long long*>(p)[i] = v != v ? 0 : __float2ull_rz(v);
    }
}


// numpy's comparisons (op 7 to 12), 1.0f or 0.0f, stored as a bool: with NaN only not_equal holds.
__device__ __forceinline__ float compare(float a, float b, unsigned int op) {
    if (is_nan(a) || is_nan(b)) return op == 12 ? 1.0f : 0.0f;
    bool holds;
    switch (op) {
        case 7: holds = a > b; break;
        case 8: holds = a >= b; break;
        case 9: holds = a < b; break;
        case 10: holds = a <= b; break;
        case 11: holds = a == b; break;
        default: holds = a != b;
    }
    return holds ? 1.0f : 0.0f;
}

__device__ __forceinline__ float binary_op(float a, float b, unsigned int op) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 4: return a / (1.0f + expf(-a)) * b;
        case 5: return is_nan(a) || is_nan(b) ? (is_nan(a) ? a : b) : fmaxf(a, b);
        case 6: return is_nan(a) || is_nan(b) ? (is_nan(a) ? a : b) : fminf(a, b);
        case 7: case 8: case 9: case 10: case 11: case 12: return compare(a, b, op);
        case 13: case 14: case 15: {  // numpy's logical ops: nonzero is true, NaN too
            const bool p = is_nan(a) || a != 0.0f, q = is_nan(b) || b != 0.0f;
            return (op == 13 ? p && q : op == 14 ? p || q : p != q) ? 1.0f : 0.0f;
        }
        // C99's powf: numpy's float32 power, its special values included; x ** 2 is x * x rounded once, as
        // numpy's (CUDA's powf may be an ulp off there)
        case 16: return b == 2.0f ? a * a : powf(a, b);
        default: return a / b;
    }
}

__device__ __forceinline__ float unary_op(float x, unsigned int op, float a, float b) {
    switch (op) {
        case 0: return a * x;
        case 1: return expf(x);
        case 2: return rsqrtf(x);
        case 3: return silu(x);
        case 4: return gelu(x);
        case 5: return gelu_tanh(x);
        case 7: return is_nan(x) ? x : fminf(fmaxf(x, a), b);
        case 8: return sqrtf(x);
        case 9: return logf(x);
        case 10: return fabsf(x);
        case 11: return 1.0f / (1.0f + expf(-x));
        default: return tanhf(x);
    }
}

struct Shape {
    unsigned int rank;
    unsigned int d[MAX_RANK];
};

// Each operand's element index for output element e: the output's merged axes walked from the last; an
// operand advances along an axis unless its mask has the axis's bit (it is 1 there).
template <int N>
__device__ __forceinline__ void offsets(unsigned int e, const Shape& s, const unsigned int (&masks)[N],
                                        unsigned int (&off)[N]) {
    if (s.rank == 1u) {
#pragma unroll
        for (int o = 0; o < N; ++o) off[o] = (masks[o] & 1u) ? 0u : e;
        return;
    }
    unsigned int stride[N];
#pragma unroll
    for (int o = 0; o < N; ++o) {
        off[o] = 0u;
        stride[o] = 1u;
    }
    unsigned int rem = e;
#pragma unroll
    for (int k = MAX_RANK - 1; k >= 0; --k) {
        if ((unsigned int)k < s.rank) {
            const unsigned int size = s.d[k];
            const unsigned int coord = rem % size;
            rem /= size;
#pragma unroll
            for (int o = 0; o < N; ++o) {
                if (!((masks[o] >> k) & 1u)) {
                    off[o] += coord * stride[o];
                    stride[o] *= size;
                }
            }
        }
    }
}

// The elements of output word t: [first, first + count).
__device__ __forceinline__ bool word_elements(unsigned int n, unsigned int out_dtype, unsigned int& first,
                                              unsigned int& count) {
    const unsigned int bytes = dtype_bytes(out_dtype);
    const unsigned int per = bytes >= 4u ? 1u : 4u / bytes;
    first = linear_index() * per;
    if (first >= n) return false;
    count = min(per, n - first);
    return true;
}

// The common case without the per-element dtype switches: an output word of two 16-bit floats (F16 or
// BF16) from dense operands of that same dtype. The same conversions as load_f and store_f: the same bits.
template <unsigned int C>
__device__ __forceinline__ float lo_half(unsigned int w) { return C == F16 ? h2f(w & 0xffffu) : bf2f(w & 0xffffu); }
template <unsigned int C>
__device__ __forceinline__ float hi_half(unsigned int w) { return C == F16 ? h2f(w >> 16) : bf2f(w >> 16); }
template <unsigned int C>
__device__ __forceinline__ unsigned int pack2(float a, float b) {
    return C == F16 ? (unsigned int)f2h(a) | ((unsigned int)f2h(b) << 16)
                    : (unsigned int)f2bf(a) | ((unsigned int)f2bf(b) << 16);
}
__device__ __forceinline__ bool half_words(unsigned int count, unsigned int c) {
    return count == 2u && (c == F16 || c == BF16);
}

template <unsigned int C>
__device__ __forceinline__ void binary2(const unsigned char* x, const unsigned char* y, unsigned char* out,
                                        unsigned int word, unsigned int op) {
    const unsigned int a = reinterpret_cast<const unsigned int*>(x)[word];
    const unsigned int b = reinterpret_cast<const unsigned int*>(y)[word];
    reinterpret_cast<unsigned int*>(out)[word] = pack2<C>(binary_op(lo_half<C>(a), lo_half<C>(b), op),
                                                          binary_op(hi_half<C>(a), hi_half<C>(b), op));
}

template <unsigned int C>
__device__ __forceinline__ void unary2(const unsigned char* x, unsigned char* out, unsigned int word,
                                       unsigned int op, float p, float q) {
    const unsigned int a = reinterpret_cast<const unsigned int*>(x)[word];
    reinterpret_cast<unsigned int*>(out)[word] =
        pack2<C>(unary_op(lo_half<C>(a), op, p, q), unary_op(hi_half<C>(a), op, p, q));
}

extern "C" __global__ void ew_binary(const unsigned char* x, const unsigned char* y, unsigned char* out, unsigned int n,
                                     unsigned int op, unsigned int rank, unsigned int d0, unsigned int d1,
                                     unsigned int d2, unsigned int d3, unsigned int d4, unsigned int d5,
                                     unsigned int x_bcast, unsigned int y_bcast, unsigned int x_dtype,
                                     unsigned int y_dtype, unsigned int out_dtype) {
    gpud_wait_prior();
    unsigned int first, count;
    if (!word_elements(n, out_dtype, first, count)) return;
    if (half_words(count, out_dtype) && x_dtype == out_dtype && y_dtype == out_dtype && (x_bcast | y_bcast) == 0u) {
        if (out_dtype == F16) binary2<F16>(x, y, out, first / 2, op);
        else binary2<BF16>(x, y, out, first / 2, op);
        return;
    }
    const Shape s = {rank, {d0, d1, d2, d3, d4, d5}};
    const unsigned int masks[2] = {x_bcast, y_bcast};
    for (unsigned int j = 0; j < count; ++j) {
        unsigned int off[2];
        offsets<2>(first + j, s, masks, off);
        const float v = binary_op(load_f(x, x_dtype, off[0]), load_f(y, y_dtype, off[1]), op);
        store_f(out, out_dtype, first + j, v);
    }
}

extern "C" __global__ void ew_where(const unsigned char* cond, const unsigned char* x, const unsigned char* y,
                                    unsigned char* out, unsigned int n, unsigned int rank, unsigned int d0,
                                    unsigned int d1, unsigned int d2, unsigned int d3, unsigned int d4,
                                    unsigned int d5, unsigned int cond_bcast, unsigned int x_bcast,
                                    unsigned int y_bcast, unsigned int cond_dtype, unsigned int x_dtype,
                                    unsigned int y_dtype, unsigned int out_dtype) {
    gpud_wait_prior();
    unsigned int first, count;
    if (!word_elements(n, out_dtype, first, count)) return;
    const Shape s = {rank, {d0, d1, d2, d3, d4, d5}};
    const unsigned int masks[3] = {cond_bcast, x_bcast, y_bcast};
    for (unsigned int j = 0; j < count; ++j) {
        unsigned int off[3];
        offsets<3>(first + j, s, masks, off);
        // a float by its bits but the sign's (-0.0 is zero, NaN and subnormals are not); an integer by its bits
        const bool take = is_float(cond_dtype) ? (__float_as_uint(load_f(cond, cond_dtype, off[0])) & 0x7fffffffu) != 0u
                                               : load_i(cond, cond_dtype, off[0]) != 0ull;
        const float v = take ? load_f(x, x_dtype, off[1]) : load_f(y, y_dtype, off[2]);
        store_f(out, out_dtype, first + j, v);
    }
}

extern "C" __global__ void ew_unary(const unsigned char* x, unsigned char* out, unsigned int n, unsigned int op,
                                    float a, float b, unsigned int x_dtype, unsigned int out_dtype) {
    gpud_wait_prior();
    unsigned int first, count;
    if (!word_elements(n, out_dtype, first, count)) return;
    if (half_words(count, out_dtype) && x_dtype == out_dtype) {
        if (out_dtype == F16) unary2<F16>(x, out, first / 2, op, a, b);
        else unary2<BF16>(x, out, first / 2, op, a, b);
        return;
    }
    for (unsigned int j = 0; j < count; ++j) {
        store_f(out, out_dtype, first + j, unary_op(load_f(x, x_dtype, first + j), op, a, b));
    }
}

extern "C" __global__ void ew_cast(const unsigned char* x, unsigned char* out, unsigned int n, unsigned int x_dtype,
                                   unsigned int out_dtype) {
    gpud_wait_prior();
    unsigned int first, count;
    if (!word_elements(n, out_dtype, first, count)) return;
    for (unsigned int j = 0; j < count; ++j) {
        const unsigned int i = first + j;
        if (is_float(x_dtype) || is_float(out_dtype)) {
            store_f(out, out_dtype, i, load_f(x, x_dtype, i));
        } else {
            store_i(out, out_dtype, i, load_i(x, x_dtype, i));
        }
    }
}

// ---------------------------------------------------------------- ew_binary16, ew_unary16: 16 bytes a thread
// ew_binary's and ew_unary's arithmetic and conversions (so the same bits) for x, y and out of one float
// dtype, nothing broadcast, each thread one 16-byte word of each: 8 halves or 4 floats. The generic kernels'
// word of 4 bytes a thread left an H100 at ~0.9 TB/s (gpud_protocol/ops/elementwise16.py: when they apply).
template <unsigned int C>
__device__ __forceinline__ unsigned int binary_word(unsigned int a, unsigned int b, unsigned int op) {
    if (C == F32) return __float_as_uint(binary_op(__uint_as_float(a), __uint_as_float(b), op));
    return pack2<C>(binary_op(lo_half<C>(a), lo_half<C>(b), op), binary_op(hi_half<C>(a), hi_half<C>(b), op));
}

template <unsigned int C>
__device__ __forceinline__ unsigned int unary_word(unsigned int a, unsigned int op, float p, float q) {
    if (C == F32) return __float_as_uint(unary_op(__uint_as_float(a), op, p, q));
    return pack2<C>(unary_op(lo_half<C>(a), op, p, q), unary_op(hi_half<C>(a), op, p, q));
}

template <unsigned int C>
__device__ __forceinline__ void binary16(const uint4* x, const uint4* y, uint4* out, unsigned int t, unsigned int op) {
    const uint4 a = x[t], b = y[t];
    out[t] = make_uint4(binary_word<C>(a.x, b.x, op), binary_word<C>(a.y, b.y, op), binary_word<C>(a.z, b.z, op),
                        binary_word<C>(a.w, b.w, op));
}

template <unsigned int C>
__device__ __forceinline__ void unary16(const uint4* x, uint4* out, unsigned int t, unsigned int op, float p, float q) {
    const uint4 a = x[t];
    out[t] = make_uint4(unary_word<C>(a.x, op, p, q), unary_word<C>(a.y, op, p, q), unary_word<C>(a.z, op, p, q),
                        unary_word<C>(a.w, op, p, q));
}

// The model ops with their code known where the elements are computed, so that unary_op's switch folds
// away instead of running once an element (a GELU's erf is most of its time already); the rest as given.
template <unsigned int C>
__device__ __forceinline__ void unary16_of(const uint4* x, uint4* out, unsigned int t, unsigned int op, float p,
                                           float q) {
    switch (op) {
        case 0: unary16<C>(x, out, t, 0u, p, q); break;
        case 1: unary16<C>(x, out, t, 1u, p, q); break;
        case 3: unary16<C>(x, out, t, 3u, p, q); break;
        case 4: unary16<C>(x, out, t, 4u, p, q); break;
        case 5: unary16<C>(x, out, t, 5u, p, q); break;
        default: unary16<C>(x, out, t, op, p, q);
    }
}

extern "C" __global__ void ew_binary16(const unsigned char* x, const unsigned char* y, unsigned char* out,
                                       unsigned int n, unsigned int op, unsigned int rank, unsigned int d0,
                                       unsigned int d1, unsigned int d2, unsigned int d3, unsigned int d4,
                                       unsigned int d5, unsigned int x_bcast, unsigned int y_bcast,
                                       unsigned int x_dtype, unsigned int y_dtype, unsigned int out_dtype) {
    gpud_wait_prior();
    const unsigned int t = linear_index();
    if (t >= n / (16u / dtype_bytes(out_dtype))) return;
    const uint4 *a = reinterpret_cast<const uint4*>(x), *b = reinterpret_cast<const uint4*>(y);
    uint4* o = reinterpret_cast<uint4*>(out);
    if (out_dtype == F16) binary16<F16>(a, b, o, t, op);
    else if (out_dtype == BF16) binary16<BF16>(a, b, o, t, op);
    else binary16<F32>(a, b, o, t, op);
}

extern "C" __global__ void ew_unary16(const unsigned char* x, unsigned char* out, unsigned int n, unsigned int op,
                                      float a, float b, unsigned int x_dtype, unsigned int out_dtype) {
    gpud_wait_prior();
    const unsigned int t = linear_index();
    if (t >= n / (16u / dtype_bytes(out_dtype))) return;
    const uint4* src = reinterpret_cast<const uint4*>(x);
    uint4* o = reinterpret_cast<uint4*>(out);
    if (out_dtype == F16) unary16_of<F16>(src, o, t, op, a, b);
    else if (out_dtype == BF16) unary16_of<BF16>(src, o, t, op, a, b);
    else unary16_of<F32>(src, o, t, op, a, b);
}
