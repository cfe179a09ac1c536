// NaN as numpy sees it, shared by the CUDA families that compare floats (no includes: gpud.ops.source
// puts this before each such family's source). fmaxf drops NaN and every comparison with it is false,
// so NaN is found on the bits.

__device__ __forceinline__ bool is_nan(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }

// numpy's max of two (np.maximum): NaN if either is.
__device__ __forceinline__ float max_nan(float a, float b) { return is_nan(a) ? a : is_nan(b) ? b : fmaxf(a, b); }

// v, met after best in one scan, takes its place for argmax: larger, or the first NaN.
__device__ __forceinline__ bool above(float v, float best) { return v > best || (is_nan(v) && !is_nan(best)); }

// (w, j) wins over (v, i) for argmax: a NaN over a number, else the larger number; on ties (two NaNs
// too) the smaller index.
__device__ __forceinline__ bool wins(float w, unsigned int j, float v, unsigned int i) {
    const bool wn = is_nan(w);
    if (wn != is_nan(v)) return wn;
    return (!wn && w > v) || ((wn || w == v) && j < i);
}
