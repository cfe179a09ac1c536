// Normalizations over the last axis for CPU-backed Vulkan (lavapipe): one thread per row (see
// gpud_protocol/ops/rows.py for the interface). The reduce family's kernels give each row a workgroup
// of 256 threads combined by trees in workgroup memory: on lavapipe each barrier of those trees is a
// coroutine switch of every 8-lane slice of the workgroup, and a 384-element row leaves most threads
// idle. Here a thread walks its row alone, 8 elements per load (one 16-byte word of float16 or
// bfloat16, two of float32), in three passes (mean, variance of x - mean, the output), and 8 threads
// share a SIMD register (8 rows at once). Rows are a multiple of 8 elements long, so a thread writes
// whole words of its own row: no atomics for 16-bit outputs. Each of the three loops makes length / 8
// iterations: lavapipe's budget of 65,535 is one per invocation, for loops one after the other too.
enable f16;

const THREADS: u32 = 64u;
const F32: u32 = 0u;  // a tensor's dtype, a constant of each entry point
const F16: u32 = 1u;
const BF16: u32 = 2u;

struct Norm { rows: u32, length: u32, eps: f32 }

@group(0) @binding(0) var<storage, read> xs: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> bias: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out32: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out16: array<vec4<u32>>;  // float16 or bfloat16, 8 a word
@group(0) @binding(4) var<uniform> p: Norm;

// 8 consecutive elements of a row, as float32
struct K8 { lo: vec4<f32>, hi: vec4<f32> }

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

fn halves(v: vec4<u32>, kind: u32) -> K8 {
    if (kind == BF16) {
        return K8(vec4<f32>(bf16_pair(v.x), bf16_pair(v.y)), vec4<f32>(bf16_pair(v.z), bf16_pair(v.w)));
    }
    return K8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}

// elements e..e + 7 (e a multiple of 8) of x, weight, bias
fn x8(e: u32, kind: u32) -> K8 {
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(xs[e / 4u]), bitcast<vec4<f32>>(xs[e / 4u + 1u]));
    }
    return halves(xs[e / 8u], kind);
}

fn w8(e: u32, kind: u32) -> K8 {
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(weight[e / 4u]), bitcast<vec4<f32>>(weight[e / 4u + 1u]));
    }
    return halves(weight[e / 8u], kind);
}

fn b8(e: u32, kind: u32) -> K8 {
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(bias[e / 4u]), bitcast<vec4<f32>>(bias[e / 4u + 1u]));
    }
    return halves(bias[e / 8u], kind);
}

fn row_of(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * THREADS;
}

// (mean, 1 / sqrt(variance + eps)) of the row starting at element `base`. Float32 sums of long rows
// lose the mean's low bits: the first pass sums x - x[0] (near 0 where the row's values are near each
// other), the second (x - mean)^2, each in blocks of 64 loads added to a total (a sum never takes more
// than ~64 + length / 512 terms of its own size).
fn moments(base: u32, xk: u32) -> vec2<f32> {
    let n = p.length;
    let shift = x8(base, xk).lo.x;
    var total = vec4<f32>(0.0);
    var part = vec4<f32>(0.0);
    for (var e = 0u; e < n; e += 8u) {
        let v = x8(base + e, xk);
        part += (v.lo - shift) + (v.hi - shift);
        if ((e & 504u) == 504u) {
            total += part;
            part = vec4<f32>(0.0);
        }
    }
    let mean = shift + dot(total + part, vec4<f32>(1.0)) / f32(n);
    total = vec4<f32>(0.0);
    part = vec4<f32>(0.0);
    for (var e = 0u; e < n; e += 8u) {
        let v = x8(base + e, xk);
        let a = v.lo - mean;
        let b = v.hi - mean;
        part += a * a + b * b;
        if ((e & 504u) == 504u) {
            total += part;
            part = vec4<f32>(0.0);
        }
    }
    return vec2<f32>(mean, 1.0 / sqrt(dot(total + part, vec4<f32>(1.0)) / f32(n) + p.eps));
}

// the output's elements e..e + 7 of the row at `base`
fn normed(base: u32, e: u32, m: vec2<f32>, xk: u32, wk: u32) -> K8 {
    let v = x8(base + e, xk);
    let w = w8(e, wk);
    let b = b8(e, wk);
    return K8((v.lo - m.x) * m.y * w.lo + b.lo, (v.hi - m.x) * m.y * w.hi + b.hi);
}

// v rounded to bfloat16 (nearest even; NaN: the quiet NaN of its sign), in the low 16 bits
fn bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return ((x >> 16u) & 0x8000u) | 0x7fc0u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

fn bf16_words(v: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(bf16_bits(v.x) | (bf16_bits(v.y) << 16u), bf16_bits(v.z) | (bf16_bits(v.w) << 16u));
}

fn layernorm32(row: u32, xk: u32, wk: u32) {
    let base = row * p.length;
    let m = moments(base, xk);
    for (var e = 0u; e < p.length; e += 8u) {
        let o = normed(base, e, m, xk, wk);
        out32[(base + e) / 4u] = o.lo;
        out32[(base + e) / 4u + 1u] = o.hi;
    }
}

fn layernorm16(row: u32, xk: u32, wk: u32) {
    let base = row * p.length;
    let m = moments(base, xk);
    for (var e = 0u; e < p.length; e += 8u) {
        let o = normed(base, e, m, xk, wk);
        out16[(base + e) / 8u] = vec4<u32>(pack2x16float(o.lo.xy), pack2x16float(o.lo.zw), pack2x16float(o.hi.xy),
                                           pack2x16float(o.hi.zw));
    }
}

fn layernormbf(row: u32, xk: u32, wk: u32) {
    let base = row * p.length;
    let m = moments(base, xk);
    for (var e = 0u; e < p.length; e += 8u) {
        let o = normed(base, e, m, xk, wk);
        out16[(base + e) / 8u] = vec4<u32>(bf16_words(o.lo), bf16_words(o.hi));
    }
}

// ---------------------------------------------------------------- entry points: layernorm_rows_<x>_<w>

@compute @workgroup_size(64)
fn layernorm_rows_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm32(row, F32, F32); }
}

@compute @workgroup_size(64)
fn layernorm_rows_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm32(row, F32, F16); }
}

@compute @workgroup_size(64)
fn layernorm_rows_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm32(row, F32, BF16); }
}

@compute @workgroup_size(64)
fn layernorm_rows_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm16(row, F16, F32); }
}

@compute @workgroup_size(64)
fn layernorm_rows_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm16(row, F16, F16); }
}

@compute @workgroup_size(64)
fn layernorm_rows_f16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernorm16(row, F16, BF16); }
}

@compute @workgroup_size(64)
fn layernorm_rows_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernormbf(row, BF16, F32); }
}

@compute @workgroup_size(64)
fn layernorm_rows_bf16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                           @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernormbf(row, BF16, F16); }
}

@compute @workgroup_size(64)
fn layernorm_rows_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                            @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(gid, groups);
    if (row < p.rows) { layernormbf(row, BF16, BF16); }
}
