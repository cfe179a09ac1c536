// Elementwise ops (see gpud_protocol/ops/elementwise.py for the interface, gpud_protocol/ops/dtypes.py
// for the dtype codes, gpud_protocol/ops/broadcast.py for the broadcast layout). Every tensor is bound
// as 4-byte words whatever its dtype, and each tensor's dtype is a scalar: one kernel per kind serves
// every dtype and mix. A thread writes one word of the output (4 int8, 2 float16, 1 float32; one 8-byte
// element: two words), so narrow outputs need no atomics. bfloat16 (which WGSL lacks) is the top half
// of a float32's bits, stored two to a word like float16. The grid may fold into y past 65,535
// workgroups. Arithmetic is float32; conversions are done on the bits, so they round to nearest even
// and keep infinities, NaN and subnormals on every implementation.
//
// Adding a dtype: its code below, a case in `bytes`, `is_float`, `to_f32` and `encode`.

const BLOCK: u32 = 256u;

const F32: u32 = 0u;
const F16: u32 = 1u;
const I32: u32 = 2u;
const U32: u32 = 3u;
const I8: u32 = 4u;
const U8: u32 = 5u;
const I16: u32 = 6u;
const U16: u32 = 7u;
const I64: u32 = 8u;
const U64: u32 = 9u;
const BF16: u32 = 10u;

fn bytes(c: u32) -> u32 {
    switch c {
        case 4u, 5u: { return 1u; }
        case 1u, 6u, 7u, 10u: { return 2u; }
        case 8u, 9u: { return 8u; }
        default: { return 4u; }
    }
}

fn is_float(c: u32) -> bool {
    return c == F32 || c == F16 || c == BF16;
}

fn is_signed(c: u32) -> bool {
    return c == I32 || c == I8 || c == I16 || c == I64;
}

fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

// ---------------------------------------------------------------- conversions on the bits

fn half_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604644775390625e-8));  // subnormal: m * 2^-24
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

// Rounded to nearest even; past 65504 (by rounding) infinity; NaN stays NaN.
fn f32_to_half(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let s = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return s | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if (a >= 0x477ff000u) {
        return s | 0x7c00u;
    }
    if (a < 0x38800000u) {  // a float16 subnormal (or the smallest normal, by rounding): round() ties to even
        return s | u32(round(bitcast<f32>(a) * 16777216.0));
    }
    let r = a - 0x38000000u;
    return s | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
}

fn negate64(b: vec2<u32>) -> vec2<u32> {
    let lo = ~b.x + 1u;
    return vec2<u32>(lo, ~b.y + select(0u, 1u, lo == 0u));
}

fn u64_to_f32(b: vec2<u32>) -> f32 {
    if (b.y == 0u) {
        return f32(b.x);
    }
    let lz = countLeadingZeros(b.y);
    var top = b.y;
    var rest = b.x;
    if (lz > 0u) {
        top = (b.y << lz) | (b.x >> (32u - lz));
        rest = b.x << lz;
    }
    // the bits below `top` only break ties: folded into its lowest bit, which f32 drops anyway
    return ldexp(f32(top | select(0u, 1u, rest != 0u)), i32(32u - lz));
}

fn i64_to_f32(b: vec2<u32>) -> f32 {
    if (b.y == select(0u, 0xffffffffu, (b.x >> 31u) == 1u)) {  // the high word only extends the sign
        return f32(bitcast<i32>(b.x));
    }
    if ((b.y >> 31u) == 1u) {
        return -u64_to_f32(negate64(b));
    }
    return u64_to_f32(b);
}

// Truncated toward zero, saturated at the range of the 64-bit integer c, NaN to 0.
fn f32_to_64(v: f32, c: u32) -> vec2<u32> {
    if (is_nan(v)) {
        return vec2<u32>(0u, 0u);
    }
    let t = trunc(v);
    if (c == U64) {
        if (t <= 0.0) {
            return vec2<u32>(0u, 0u);
        }
        if (t >= 18446744073709551616.0) {
            return vec2<u32>(0xffffffffu, 0xffffffffu);
        }
    } else {
        if (t >= 9223372036854775808.0) {
            return vec2<u32>(0xffffffffu, 0x7fffffffu);
        }
        if (t <= -9223372036854775808.0) {
            return vec2<u32>(0u, 0x80000000u);
        }
    }
    let m = abs(t);
    let hi = trunc(m * 2.3283064365386963e-10);  // exact: m / 2^32, then the remainder below is exact too
    let b = vec2<u32>(u32(m - hi * 4294967296.0), u32(hi));
    return select(b, negate64(b), t < 0.0);
}

// Truncated toward zero, saturated at the range of the integer c of 4 bytes or fewer, NaN to 0.
fn f32_to_int(v: f32, c: u32) -> u32 {
    if (is_nan(v)) {
        return 0u;
    }
    let t = trunc(v);
    let width = bytes(c) * 8u;
    if (is_signed(c)) {
        let top = exp2(f32(width - 1u));  // 2^(width-1): the first value past the range
        let most = (1u << (width - 1u)) - 1u;
        if (t >= top) {
            return most;
        }
        if (t < -top) {
            return ~most;
        }
        return bitcast<u32>(i32(t));
    }
    if (t <= 0.0) {
        return 0u;
    }
    if (t >= exp2(f32(width))) {
        return select((1u << (width % 32u)) - 1u, 0xffffffffu, width == 32u);
    }
    return u32(t);
}

// Rounded to nearest even on the bits (infinities stay, overflow gives infinity, subnormals round as
// any value); NaN gives the quiet NaN of its sign (0x7fc0, 0xffc0), as ml_dtypes does. gpud_client rounds
// the same way on the host.
fn f32_to_bf16(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return ((x >> 16u) & 0x8000u) | 0x7fc0u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

// ---------------------------------------------------------------- element bits and values

// The bits of element i of a tensor of dtype c, from the word holding it (and the next one, for 8-byte
// dtypes): integers sign- or zero-extended to 64 bits, float16 in the low 16 bits.
fn bits(c: u32, w: u32, w2: u32, i: u32) -> vec2<u32> {
    let size = bytes(c);
    if (size == 8u) {
        return vec2<u32>(w, w2);
    }
    var lo = w;
    if (size < 4u) {
        let width = size * 8u;
        let offset = (i % (4u / size)) * width;
        lo = select(extractBits(w, offset, width), bitcast<u32>(extractBits(bitcast<i32>(w), offset, width)),
                    is_signed(c));
    }
    return vec2<u32>(lo, select(0u, 0xffffffffu, is_signed(c) && (lo >> 31u) == 1u));
}

fn word_of(c: u32, i: u32) -> u32 {
    let size = bytes(c);
    if (size == 8u) {
        return 2u * i;
    }
    return i / (4u / size);
}

fn to_f32(c: u32, b: vec2<u32>) -> f32 {
    switch c {
        case 0u: { return bitcast<f32>(b.x); }
        case 1u: { return half_to_f32(b.x); }
        case 10u: { return bitcast<f32>(b.x << 16u); }
        case 3u, 5u, 7u: { return f32(b.x); }
        case 8u: { return i64_to_f32(b); }
        case 9u: { return u64_to_f32(b); }
        default: { return f32(bitcast<i32>(b.x)); }  // int32, int8, int16: sign-extended
    }
}

// v as dtype c: the bits to store (narrow dtypes in the low bits of x).
fn encode(c: u32, v: f32) -> vec2<u32> {
    switch c {
        case 0u: { return vec2<u32>(bitcast<u32>(v), 0u); }
        case 1u: { return vec2<u32>(f32_to_half(v), 0u); }
        case 10u: { return vec2<u32>(f32_to_bf16(v), 0u); }
        case 8u, 9u: { return f32_to_64(v, c); }
        default: { return vec2<u32>(f32_to_int(v, c), 0u); }
    }
}

// word with element j (of those sharing it) replaced by the low bits of b
fn put(c: u32, word: u32, j: u32, b: u32) -> u32 {
    let size = bytes(c);
    if (size >= 4u) {
        return b;
    }
    return insertBits(word, b, j * size * 8u, size * 8u);
}

fn per_word(c: u32) -> u32 {
    return max(1u, 4u / bytes(c));
}

// ---------------------------------------------------------------- broadcasting

// Each operand's element index for output element e: the output's merged axes walked from the last;
// an operand advances along an axis unless its mask has the axis's bit (it is 1 there).
fn offsets(e: u32, rank: u32, d: array<u32, 6>, masks: vec3<u32>) -> vec3<u32> {
    if (rank == 1u) {
        return select(vec3<u32>(e), vec3<u32>(0u), (masks & vec3<u32>(1u)) != vec3<u32>(0u));
    }
    var dims = d;
    var rem = e;
    var off = vec3<u32>(0u);
    var stride = vec3<u32>(1u);
    for (var k = rank; k > 0u; k--) {
        let size = dims[k - 1u];
        let coord = rem % size;
        rem = rem / size;
        let along = ((masks >> vec3<u32>(k - 1u)) & vec3<u32>(1u)) == vec3<u32>(0u);
        off += select(vec3<u32>(0u), vec3<u32>(coord) * stride, along);
        stride *= select(vec3<u32>(1u), vec3<u32>(size), along);
    }
    return off;
}

// ---------------------------------------------------------------- the ops

// numpy's comparisons (op 7 to 12), 1.0 or 0.0, stored as a bool: with NaN only not_equal holds.
fn compare(a: f32, b: f32, op: u32) -> f32 {
    if (is_nan(a) || is_nan(b)) {
        return select(0.0, 1.0, op == 12u);
    }
    var holds = a != b;
    switch op {
        case 7u: { holds = a > b; }
        case 8u: { holds = a >= b; }
        case 9u: { holds = a < b; }
        case 10u: { holds = a <= b; }
        case 11u: { holds = a == b; }
        default: {}
    }
    return select(0.0, 1.0, holds);
}

// numpy's logical ops (op 13 to 15), 1.0 or 0.0: nonzero is true, NaN too.
fn logical(a: f32, b: f32, op: u32) -> f32 {
    let p = is_nan(a) || a != 0.0;
    let q = is_nan(b) || b != 0.0;
    return select(0.0, 1.0, select(select(p != q, p || q, op == 14u), p && q, op == 13u));
}

fn binary(a: f32, b: f32, op: u32) -> f32 {
    switch op {
        case 0u: { return a + b; }
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 4u: { return a / (1.0 + exp(-a)) * b; }
        case 5u: {
            if (is_nan(a) || is_nan(b)) {
                return select(b, a, is_nan(a));
            }
            return max(a, b);
        }
        case 6u: {
            if (is_nan(a) || is_nan(b)) {
                return select(b, a, is_nan(a));
            }
            return min(a, b);
        }
        case 7u, 8u, 9u, 10u, 11u, 12u: { return compare(a, b, op); }
        case 13u, 14u, 15u: { return logical(a, b, op); }
        case 16u: { return power(a, b); }
        default: { return a / b; }
    }
}

// tanh of a clamped argument: some implementations overflow to NaN past |x| ~ 44. Near 0 by its series
// (x - x^3/3 + 2x^5/15 - 17x^7/315, within 2e-10 relative below 1/8): lavapipe's builtin goes through exp
// there and keeps only absolute precision (tanh(1e-5) off by 0.8%).
fn safe_tanh(x: f32) -> f32 {
    if (abs(x) < 0.125) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333334 + x2 * (0.13333334 + x2 * -0.053968254)));
    }
    return tanh(clamp(x, -15.0, 15.0));
}

fn gelu_tanh(x: f32) -> f32 {
    let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + safe_tanh(inner));
}

// erf by Abramowitz and Stegun 7.1.26 refined: max error ~1.2e-7 (WGSL has no erf)
fn erf(x: f32) -> f32 {
    let s = sign(x);
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.5 * a);
    let y = 1.0 - t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277)))))))));
    return s * y;
}

// A quiet NaN made at run time from x (WGSL refuses a constant NaN).
fn quiet_nan(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | 0x7fc00000u);
}

fn unary(x: f32, op: u32, a: f32, b: f32) -> f32 {
    switch op {
        case 0u: { return a * x; }
        case 1u: { return exp(x); }
        case 2u: { return inverseSqrt(x); }
        case 3u: { return x / (1.0 + exp(-x)); }
        case 4u: { return 0.5 * x * (1.0 + erf(x * 0.7071067811865476)); }
        case 5u: { return gelu_tanh(x); }
        case 7u: {
            if (is_nan(x)) {
                return x;
            }
            return min(max(x, a), b);
        }
        case 8u: { return select(sqrt(x), quiet_nan(x), x < 0.0 || is_nan(x)); }
        case 9u: {
            if (x < 0.0 || is_nan(x)) {
                return quiet_nan(x);
            }
            return select(log(x), bitcast<f32>(bitcast<u32>(x) | 0xff800000u), x == 0.0);  // log(±0) = -inf
        }
        case 10u: { return bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu); }
        case 11u: { return 1.0 / (1.0 + exp(-x)); }
        default: { return safe_tanh(x); }
    }
}

// ---------------------------------------------------------------- bindings: inputs are shared

@group(0) @binding(0) var<storage, read> in0: array<u32>;
@group(0) @binding(1) var<storage, read> in1: array<u32>;
@group(0) @binding(2) var<storage, read> in2: array<u32>;

fn load0(c: u32, i: u32) -> f32 {
    let w = word_of(c, i);
    var hi = 0u;
    if (bytes(c) == 8u) {
        hi = in0[w + 1u];
    }
    return to_f32(c, bits(c, in0[w], hi, i));
}

fn load1(c: u32, i: u32) -> f32 {
    let w = word_of(c, i);
    var hi = 0u;
    if (bytes(c) == 8u) {
        hi = in1[w + 1u];
    }
    return to_f32(c, bits(c, in1[w], hi, i));
}

fn load2(c: u32, i: u32) -> f32 {
    let w = word_of(c, i);
    var hi = 0u;
    if (bytes(c) == 8u) {
        hi = in2[w + 1u];
    }
    return to_f32(c, bits(c, in2[w], hi, i));
}

// Whether cond element i is nonzero (a float by its bits but the sign's: -0.0 is zero, NaN is not,
// whatever the implementation makes of comparing NaN or subnormals).
fn nonzero0(c: u32, i: u32) -> bool {
    if (is_float(c)) {
        return (bitcast<u32>(load0(c, i)) & 0x7fffffffu) != 0u;
    }
    let w = word_of(c, i);
    var hi = 0u;
    if (bytes(c) == 8u) {
        hi = in0[w + 1u];
    }
    let b = bits(c, in0[w], hi, i);
    return (b.x | b.y) != 0u;
}

// ---------------------------------------------------------------- ew_binary

struct BinaryArgs {
    n: u32, op: u32, rank: u32, d0: u32, d1: u32, d2: u32, d3: u32, d4: u32, d5: u32,
    x_bcast: u32, y_bcast: u32, x_dtype: u32, y_dtype: u32, out_dtype: u32,
}

@group(0) @binding(2) var<storage, read_write> binary_out: array<u32>;
@group(0) @binding(3) var<uniform> pb: BinaryArgs;

fn binary_at(e: u32) -> vec2<u32> {
    let d = array<u32, 6>(pb.d0, pb.d1, pb.d2, pb.d3, pb.d4, pb.d5);
    let o = offsets(e, pb.rank, d, vec3<u32>(pb.x_bcast, pb.y_bcast, 0u));
    return encode(pb.out_dtype, binary(load0(pb.x_dtype, o.x), load1(pb.y_dtype, o.y), pb.op));
}

@compute @workgroup_size(256)
fn ew_binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let t = index(gid, groups);
    let c = pb.out_dtype;
    let per = per_word(c);
    let first = t * per;
    if (first >= pb.n) {
        return;
    }
    if (bytes(c) == 8u) {
        let b = binary_at(first);
        binary_out[2u * t] = b.x;
        binary_out[2u * t + 1u] = b.y;
        return;
    }
    let count = min(per, pb.n - first);
    var word = 0u;
    if (count < per) {
        word = binary_out[t];  // the tensor ends inside this word: keep what follows it
    }
    for (var j = 0u; j < count; j++) {
        word = put(c, word, j, binary_at(first + j).x);
    }
    binary_out[t] = word;
}

// ---------------------------------------------------------------- ew_where

struct WhereArgs {
    n: u32, rank: u32, d0: u32, d1: u32, d2: u32, d3: u32, d4: u32, d5: u32,
    cond_bcast: u32, x_bcast: u32, y_bcast: u32, cond_dtype: u32, x_dtype: u32, y_dtype: u32, out_dtype: u32,
}

@group(0) @binding(3) var<storage, read_write> where_out: array<u32>;
@group(0) @binding(4) var<uniform> pw: WhereArgs;

fn where_at(e: u32) -> vec2<u32> {
    let d = array<u32, 6>(pw.d0, pw.d1, pw.d2, pw.d3, pw.d4, pw.d5);
    let o = offsets(e, pw.rank, d, vec3<u32>(pw.cond_bcast, pw.x_bcast, pw.y_bcast));
    var v: f32;
    if (nonzero0(pw.cond_dtype, o.x)) {
        v = load1(pw.x_dtype, o.y);
    } else {
        v = load2(pw.y_dtype, o.z);
    }
    return encode(pw.out_dtype, v);
}

@compute @workgroup_size(256)
fn ew_where(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let t = index(gid, groups);
    let c = pw.out_dtype;
    let per = per_word(c);
    let first = t * per;
    if (first >= pw.n) {
        return;
    }
    if (bytes(c) == 8u) {
        let b = where_at(first);
        where_out[2u * t] = b.x;
        where_out[2u * t + 1u] = b.y;
        return;
    }
    let count = min(per, pw.n - first);
    var word = 0u;
    if (count < per) {
        word = where_out[t];
    }
    for (var j = 0u; j < count; j++) {
        word = put(c, word, j, where_at(first + j).x);
    }
    where_out[t] = word;
}

// ---------------------------------------------------------------- ew_unary and ew_cast

struct UnaryArgs { n: u32, op: u32, a: f32, b: f32, x_dtype: u32, out_dtype: u32 }
struct CastArgs { n: u32, x_dtype: u32, out_dtype: u32 }

@group(0) @binding(1) var<storage, read_write> out1: array<u32>;
@group(0) @binding(2) var<uniform> pu: UnaryArgs;
@group(0) @binding(2) var<uniform> pc: CastArgs;

fn unary_at(e: u32) -> vec2<u32> {
    return encode(pu.out_dtype, unary(load0(pu.x_dtype, e), pu.op, pu.a, pu.b));
}

@compute @workgroup_size(256)
fn ew_unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let t = index(gid, groups);
    let c = pu.out_dtype;
    let per = per_word(c);
    let first = t * per;
    if (first >= pu.n) {
        return;
    }
    if (bytes(c) == 8u) {
        let b = unary_at(first);
        out1[2u * t] = b.x;
        out1[2u * t + 1u] = b.y;
        return;
    }
    let count = min(per, pu.n - first);
    var word = 0u;
    if (count < per) {
        word = out1[t];
    }
    for (var j = 0u; j < count; j++) {
        word = put(c, word, j, unary_at(first + j).x);
    }
    out1[t] = word;
}

// Integer to integer keeps the low bits (numpy's astype); through float32 otherwise.
fn cast_at(e: u32) -> vec2<u32> {
    let src = pc.x_dtype;
    let dst = pc.out_dtype;
    let w = word_of(src, e);
    var hi = 0u;
    if (bytes(src) == 8u) {
        hi = in0[w + 1u];
    }
    let b = bits(src, in0[w], hi, e);
    if (is_float(src) || is_float(dst)) {
        return encode(dst, to_f32(src, b));
    }
    return b;
}

@compute @workgroup_size(256)
fn ew_cast(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let t = index(gid, groups);
    let c = pc.out_dtype;
    let per = per_word(c);
    let first = t * per;
    if (first >= pc.n) {
        return;
    }
    if (bytes(c) == 8u) {
        let b = cast_at(first);
        out1[2u * t] = b.x;
        out1[2u * t + 1u] = b.y;
        return;
    }
    let count = min(per, pc.n - first);
    var word = 0u;
    if (count < per) {
        word = out1[t];
    }
    for (var j = 0u; j < count; j++) {
        word = put(c, word, j, cast_at(first + j).x);
    }
    out1[t] = word;
}

// ---------------------------------------------------------------- ew_binary4, ew_unary4: four floats a thread
// ew_binary's and ew_unary's arithmetic for float operands and outputs only, four consecutive output
// elements a thread (n a multiple of 4), the operands read as 8-byte words (their sizes a multiple of 8
// bytes). Broadcasting over at most two merged axes whose inner one holds a multiple of 4 elements: an
// operand then gives either four consecutive elements (at a multiple of 4) or one element for all four. For lavapipe, where every side
// of every branch runs (a dtype switch costs all its cases, the integer ones too) and each load is a loop
// over the SIMD lanes: the generic kernels take ~20x longer on the same floats.

@group(0) @binding(0) var<storage, read> in0h: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> in1h: array<vec2<u32>>;

// A float of dtype c from its bits (a 16-bit one in the low half)
fn float_of(c: u32, bits: u32) -> f32 {
    if (c == F32) {
        return bitcast<f32>(bits);
    }
    if (c == BF16) {
        return bitcast<f32>(bits << 16u);
    }
    return half_to_f32(bits);
}

// Element o of a float operand of dtype c, from the word holding it
fn float_at(c: u32, word: u32, o: u32) -> f32 {
    return float_of(c, select((word >> ((o & 1u) * 16u)) & 0xffffu, word, c == F32));
}

// Elements o..o + 3 (o a multiple of 4) of a float operand of dtype c, from its 8-byte words lo (o / 4:
// every 16-bit element; o / 2: the first two float32s) and hi (float32 only: o / 2 + 1)
fn floats4(c: u32, lo: vec2<u32>, hi: vec2<u32>) -> vec4<f32> {
    if (c == F32) {
        return bitcast<vec4<f32>>(vec4<u32>(lo, hi));
    }
    return vec4<f32>(float_of(c, lo.x & 0xffffu), float_of(c, lo.x >> 16u), float_of(c, lo.y & 0xffffu),
                     float_of(c, lo.y >> 16u));
}

fn load4_0(c: u32, o: u32, one: bool) -> vec4<f32> {
    if (one) {
        let word = select(o / 2u, o, c == F32);  // the word holding element o
        return vec4<f32>(float_at(c, in0h[word / 2u][word & 1u], o));
    }
    var hi = vec2<u32>();
    if (c == F32) {
        hi = in0h[o / 2u + 1u];
    }
    return floats4(c, in0h[select(o / 4u, o / 2u, c == F32)], hi);
}

fn load4_1(c: u32, o: u32, one: bool) -> vec4<f32> {
    if (one) {
        let word = select(o / 2u, o, c == F32);  // the word holding element o
        return vec4<f32>(float_at(c, in1h[word / 2u][word & 1u], o));
    }
    var hi = vec2<u32>();
    if (c == F32) {
        hi = in1h[o / 2u + 1u];
    }
    return floats4(c, in1h[select(o / 4u, o / 2u, c == F32)], hi);
}

// Where operand elements start for output elements e..e + 3 (e a multiple of 4), and whether they are one
// element (broadcast along the inner axis): rank and dims as ew_binary's, rank <= 2, the inner dim a
// multiple of 4. Bit 0 of a mask is the outer axis (rank 2) or the only one (rank 1).
struct Src4 { at: u32, one: bool }

fn src4(e: u32, rank: u32, d0: u32, d1: u32, mask: u32) -> Src4 {
    let inner = select(d0, d1, rank == 2u);
    let inner_bit = select(1u, 2u, rank == 2u);
    let outer_b = rank == 2u && (mask & 1u) != 0u;
    let one = (mask & inner_bit) != 0u;
    let row = select(e / inner, 0u, outer_b);
    return Src4(select(row * inner + e % inner, row, one), one);
}

// v as float16 (c F16) or bfloat16, rounded as `encode` rounds
fn half_bits(c: u32, v: f32) -> u32 {
    return select(f32_to_half(v), f32_to_bf16(v), c == BF16);
}

// The words of four output values of float dtype c: four float32s, or two words of 16-bit pairs.
fn store4_words(c: u32, v: vec4<f32>) -> vec4<u32> {
    if (c == F32) {
        return bitcast<vec4<u32>>(v);
    }
    let b = vec4<u32>(half_bits(c, v.x), half_bits(c, v.y), half_bits(c, v.z), half_bits(c, v.w));
    return vec4<u32>(b.x | (b.y << 16u), b.z | (b.w << 16u), 0u, 0u);
}

@compute @workgroup_size(256)
fn ew_binary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = 4u * index(gid, groups);
    if (e >= pb.n) {
        return;
    }
    let xs = src4(e, pb.rank, pb.d0, pb.d1, pb.x_bcast);
    let ys = src4(e, pb.rank, pb.d0, pb.d1, pb.y_bcast);
    let a = load4_0(pb.x_dtype, xs.at, xs.one);
    let b = load4_1(pb.y_dtype, ys.at, ys.one);
    let r = vec4<f32>(binary(a.x, b.x, pb.op), binary(a.y, b.y, pb.op), binary(a.z, b.z, pb.op),
                      binary(a.w, b.w, pb.op));
    let w = store4_words(pb.out_dtype, r);
    if (pb.out_dtype == F32) {
        binary_out[e] = w.x;
        binary_out[e + 1u] = w.y;
        binary_out[e + 2u] = w.z;
        binary_out[e + 3u] = w.w;
    } else {
        binary_out[e / 2u] = w.x;
        binary_out[e / 2u + 1u] = w.y;
    }
}

@compute @workgroup_size(256)
fn ew_unary4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = 4u * index(gid, groups);
    if (e >= pu.n) {
        return;
    }
    let a = load4_0(pu.x_dtype, e, false);
    let r = vec4<f32>(unary(a.x, pu.op, pu.a, pu.b), unary(a.y, pu.op, pu.a, pu.b), unary(a.z, pu.op, pu.a, pu.b),
                      unary(a.w, pu.op, pu.a, pu.b));
    let w = store4_words(pu.out_dtype, r);
    if (pu.out_dtype == F32) {
        out1[e] = w.x;
        out1[e + 1u] = w.y;
        out1[e + 2u] = w.z;
        out1[e + 3u] = w.w;
    } else {
        out1[e / 2u] = w.x;
        out1[e / 2u + 1u] = w.y;
    }
}
