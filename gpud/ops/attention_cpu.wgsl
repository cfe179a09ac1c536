// attention_cpu_d<W>_<q>_<kv>_<out>: full attention in one pass for CPU-backed Vulkan (lavapipe); see
// gpud_protocol/ops/attention_cpu.py for the interface (attention_tiled's, for D = W = 32 or 64).
// attention_tiled shares tiles of keys through workgroup memory: on lavapipe every barrier is a coroutine
// switch of each 8-lane slice of the workgroup, and every load a loop over the lanes. Here each thread
// takes ROWS query rows of one (batch row, head) alone, with no workgroup memory and no barrier: it walks
// the keys two at a time, loading each key's k and v once (16-byte words: 8 dims of float16 or bfloat16,
// 4 of float32) for its ROWS rows, whose scores, running maxima and sums sit in the lanes of vec4s. Per
// pair of keys: the scores, the pair's maximum, one rescale of the sums (online softmax), then
// exp(score - max) * v added for the keys a row sees (a hidden key adds nothing, whatever its v holds).
// Threads are numbered (block of ROWS rows, head, batch row), the block fastest, so that the 8 threads
// sharing a SIMD register read the same keys. The loop over keys makes ceil(S / 2) iterations and holds
// no loop. W is a constant of each entry point (`wide`: W 64), so W 32 runs no code of the other half.
enable f16;

const THREADS: u32 = 64u;
const ROWS: u32 = 4u;  // query rows per thread
const NONE: f32 = -3.0e38;  // the running maximum before any key, and the score of a hidden key
const F32: u32 = 0u;  // a tensor's dtype, a constant of each entry point
const F16: u32 = 1u;
const BF16: u32 = 2u;

struct Tiled { b: u32, t: u32, s: u32, hq: u32, hkv: u32, d: u32, causal: u32, mask_mode: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> rq: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> rk: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> rv: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> rmask: array<u32>;  // a key mask (B, S) of KEY_MASK_MODES' dtypes
@group(0) @binding(4) var<storage, read_write> rout32: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> rout16: array<vec4<u32>>;  // float16 or bfloat16, 8 a word
@group(0) @binding(5) var<uniform> tp: Tiled;

struct K8 { lo: vec4<f32>, hi: vec4<f32> }  // 8 dims
struct D32 { a: K8, b: K8, c: K8, d: K8 }
struct Row { lo: D32, hi: D32 }  // dims 0..31 and, for W 64, 32..63
struct Rows { a: Row, b: Row, c: Row, d: Row }  // a thread's ROWS rows (queries, or accumulators)

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

// dims 8j..8j + 7 of q, k or v (which: 0, 1, 2) at element e, a multiple of 8
fn k8(which: u32, kind: u32, e: u32, j: u32) -> K8 {
    let i = select(e / 8u + j, e / 4u + 2u * j, kind == F32);
    var w0: vec4<u32>;
    var w1: vec4<u32>;
    switch which {
        case 0u: { w0 = rq[i]; if (kind == F32) { w1 = rq[i + 1u]; } }
        case 1u: { w0 = rk[i]; if (kind == F32) { w1 = rk[i + 1u]; } }
        default: { w0 = rv[i]; if (kind == F32) { w1 = rv[i + 1u]; } }
    }
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(w0), bitcast<vec4<f32>>(w1));
    }
    return halves(w0, kind);
}

fn d32(which: u32, kind: u32, e: u32) -> D32 {
    return D32(k8(which, kind, e, 0u), k8(which, kind, e, 1u), k8(which, kind, e, 2u), k8(which, kind, e, 3u));
}

fn row_at(which: u32, kind: u32, e: u32, wide: bool) -> Row {
    var r: Row;
    r.lo = d32(which, kind, e);
    if (wide) {
        r.hi = d32(which, kind, e + 32u);
    }
    return r;
}

fn dot8(x: K8, y: K8) -> f32 {
    return dot(x.lo, y.lo) + dot(x.hi, y.hi);
}

fn dot32(x: D32, y: D32) -> f32 {
    return dot8(x.a, y.a) + dot8(x.b, y.b) + dot8(x.c, y.c) + dot8(x.d, y.d);
}

fn dot_row(x: Row, y: Row, wide: bool) -> f32 {
    var s = dot32(x.lo, y.lo);
    if (wide) {
        s += dot32(x.hi, y.hi);
    }
    return s;
}

fn scores(q: Rows, k: Row, wide: bool) -> vec4<f32> {
    return vec4<f32>(dot_row(q.a, k, wide), dot_row(q.b, k, wide), dot_row(q.c, k, wide), dot_row(q.d, k, wide));
}

fn scale8(x: K8, c: f32) -> K8 {
    return K8(x.lo * c, x.hi * c);
}

fn scale32(x: D32, c: f32) -> D32 {
    return D32(scale8(x.a, c), scale8(x.b, c), scale8(x.c, c), scale8(x.d, c));
}

fn scale_row(x: Row, c: f32, wide: bool) -> Row {
    var r: Row;
    r.lo = scale32(x.lo, c);
    if (wide) {
        r.hi = scale32(x.hi, c);
    }
    return r;
}

fn scale_rows(x: Rows, c: vec4<f32>, wide: bool) -> Rows {
    return Rows(scale_row(x.a, c.x, wide), scale_row(x.b, c.y, wide), scale_row(x.c, c.z, wide),
                scale_row(x.d, c.w, wide));
}

// x + p * y where p > 0 (p 0: a key the row does not see, whose v may hold anything, NaN included)
fn axpy8(x: K8, p: f32, y: K8) -> K8 {
    let on = p > 0.0;
    return K8(x.lo + select(vec4<f32>(0.0), p * y.lo, on), x.hi + select(vec4<f32>(0.0), p * y.hi, on));
}

fn axpy32(x: D32, p: f32, y: D32) -> D32 {
    return D32(axpy8(x.a, p, y.a), axpy8(x.b, p, y.b), axpy8(x.c, p, y.c), axpy8(x.d, p, y.d));
}

fn axpy_row(x: Row, p: f32, y: Row, wide: bool) -> Row {
    var r: Row;
    r.lo = axpy32(x.lo, p, y.lo);
    if (wide) {
        r.hi = axpy32(x.hi, p, y.hi);
    }
    return r;
}

fn axpy_rows(x: Rows, p: vec4<f32>, y: Row, wide: bool) -> Rows {
    return Rows(axpy_row(x.a, p.x, y, wide), axpy_row(x.b, p.y, y, wide), axpy_row(x.c, p.z, y, wide),
                axpy_row(x.d, p.w, y, wide));
}

// Whether key element i of the key mask takes part (mask_mode 3 to 6: uint8, int32, float32, int64;
// 0: no mask). One word read (two for int64) whatever the mode: lavapipe runs every case of a switch.
fn key_on(mode: u32, i: u32) -> bool {
    let word = rmask[select(select(i, i >> 2u, mode == 3u), 2u * i, mode == 6u)];
    let high = select(0u, rmask[2u * i + 1u], mode == 6u);
    let byte = (word >> ((i & 3u) * 8u)) & 0xffu;
    let float_on = bitcast<f32>(word) != 0.0;
    let on = select(select(word | high, select(0u, 1u, float_on), mode == 5u), byte, mode == 3u) != 0u;
    return mode == 0u || on;
}

// What a thread computes: its rows t0..t0 + 3 of head h of batch row b (live: b exists)
struct Task { t0: u32, h: u32, b: u32, live: bool }

fn task_of(gid: vec3<u32>, groups: vec3<u32>) -> Task {
    let index = gid.x + gid.y * groups.x * THREADS;
    let blocks = (tp.t + ROWS - 1u) / ROWS;
    let rest = index / blocks;
    return Task((index % blocks) * ROWS, rest % tp.hq, min(rest / tp.hq, tp.b - 1u), rest / tp.hq < tp.b);
}

// element where row t of head h of batch row b starts in q and out (t past T: the last row, not written)
fn row_base(task: Task, r: u32) -> u32 {
    return ((task.b * tp.t + min(task.t0 + r, tp.t - 1u)) * tp.hq + task.h) * tp.d;
}

struct Result { acc: Rows, inv: vec4<f32> }  // the rows' sums of p * v, and 1 / their sums of p (0: no key)

fn attend(task: Task, qk: u32, kvk: u32, wide: bool) -> Result {
    let s = tp.s;
    let stride = tp.hkv * tp.d;  // between key positions
    let kv0 = (task.b * s * tp.hkv + task.h / (tp.hq / tp.hkv)) * tp.d;
    let q = Rows(scale_row(row_at(0u, qk, row_base(task, 0u), wide), tp.scale, wide),
                 scale_row(row_at(0u, qk, row_base(task, 1u), wide), tp.scale, wide),
                 scale_row(row_at(0u, qk, row_base(task, 2u), wide), tp.scale, wide),
                 scale_row(row_at(0u, qk, row_base(task, 3u), wide), tp.scale, wide));
    // the keys each row sees: s, or up to t + S - T (causal)
    let t = vec4<i32>(vec4<u32>(task.t0) + vec4<u32>(0u, 1u, 2u, 3u));
    let count = select(vec4<i32>(i32(s)), min(vec4<i32>(i32(s)), t + i32(s) - i32(tp.t) + 1), tp.causal != 0u);
    var acc: Rows;
    var m = vec4<f32>(NONE);
    var l = vec4<f32>(0.0);
    for (var key = 0u; key < s; key += 2u) {
        let key1 = min(key + 1u, s - 1u);
        let on0 = vec4<i32>(i32(key)) < count & vec4<bool>(key_on(tp.mask_mode, task.b * s + key));
        let on1 = vec4<i32>(i32(key + 1u)) < count & vec4<bool>(key_on(tp.mask_mode, task.b * s + key1));
        let s0 = select(vec4<f32>(NONE), scores(q, row_at(1u, kvk, kv0 + key * stride, wide), wide), on0);
        let s1 = select(vec4<f32>(NONE), scores(q, row_at(1u, kvk, kv0 + key1 * stride, wide), wide), on1);
        let top = max(m, max(s0, s1));
        let correction = exp(m - top);
        m = top;
        let p0 = select(vec4<f32>(0.0), exp(s0 - top), on0);
        let p1 = select(vec4<f32>(0.0), exp(s1 - top), on1);
        l = l * correction + p0 + p1;
        acc = scale_rows(acc, correction, wide);
        acc = axpy_rows(acc, p0, row_at(2u, kvk, kv0 + key * stride, wide), wide);
        acc = axpy_rows(acc, p1, row_at(2u, kvk, kv0 + key1 * stride, wide), wide);
    }
    return Result(acc, select(vec4<f32>(0.0), 1.0 / l, l > vec4<f32>(0.0)));  // a row that sees no key: zeros
}

fn pack16(x: K8) -> vec4<u32> {
    return vec4<u32>(pack2x16float(x.lo.xy), pack2x16float(x.lo.zw), pack2x16float(x.hi.xy), pack2x16float(x.hi.zw));
}

// v rounded to bfloat16 (nearest even; NaN: the quiet NaN of its sign), in the low 16 bits
fn bf16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return ((x >> 16u) & 0x8000u) | 0x7fc0u;
    }
    return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
}

fn packbf(x: K8) -> vec4<u32> {
    let a = vec4<u32>(bf16_bits(x.lo.x), bf16_bits(x.lo.y), bf16_bits(x.lo.z), bf16_bits(x.lo.w));
    let b = vec4<u32>(bf16_bits(x.hi.x), bf16_bits(x.hi.y), bf16_bits(x.hi.z), bf16_bits(x.hi.w));
    return vec4<u32>(a.x | (a.y << 16u), a.z | (a.w << 16u), b.x | (b.y << 16u), b.z | (b.w << 16u));
}

fn put32(at: u32, x: D32) {
    let i = at / 4u;
    rout32[i] = x.a.lo;
    rout32[i + 1u] = x.a.hi;
    rout32[i + 2u] = x.b.lo;
    rout32[i + 3u] = x.b.hi;
    rout32[i + 4u] = x.c.lo;
    rout32[i + 5u] = x.c.hi;
    rout32[i + 6u] = x.d.lo;
    rout32[i + 7u] = x.d.hi;
}

fn put16(at: u32, x: D32, kind: u32) {
    let i = at / 8u;
    if (kind == BF16) {
        rout16[i] = packbf(x.a);
        rout16[i + 1u] = packbf(x.b);
        rout16[i + 2u] = packbf(x.c);
        rout16[i + 3u] = packbf(x.d);
    } else {
        rout16[i] = pack16(x.a);
        rout16[i + 1u] = pack16(x.b);
        rout16[i + 2u] = pack16(x.c);
        rout16[i + 3u] = pack16(x.d);
    }
}

// row r of the thread's block into out (float32), if it exists
fn store32(task: Task, r: u32, x: Row, inv: f32, wide: bool) {
    if (task.live && task.t0 + r < tp.t) {
        let at = row_base(task, r);
        put32(at, scale32(x.lo, inv));
        if (wide) {
            put32(at + 32u, scale32(x.hi, inv));
        }
    }
}

fn store16(task: Task, r: u32, x: Row, inv: f32, wide: bool, kind: u32) {
    if (task.live && task.t0 + r < tp.t) {
        let at = row_base(task, r);
        put16(at, scale32(x.lo, inv), kind);
        if (wide) {
            put16(at + 32u, scale32(x.hi, inv), kind);
        }
    }
}

fn rows32(gid: vec3<u32>, groups: vec3<u32>, qk: u32, kvk: u32, wide: bool) {
    let task = task_of(gid, groups);
    let o = attend(task, qk, kvk, wide);
    store32(task, 0u, o.acc.a, o.inv.x, wide);
    store32(task, 1u, o.acc.b, o.inv.y, wide);
    store32(task, 2u, o.acc.c, o.inv.z, wide);
    store32(task, 3u, o.acc.d, o.inv.w, wide);
}

fn rows16(gid: vec3<u32>, groups: vec3<u32>, qk: u32, kvk: u32, wide: bool, ok: u32) {
    let task = task_of(gid, groups);
    let o = attend(task, qk, kvk, wide);
    store16(task, 0u, o.acc.a, o.inv.x, wide, ok);
    store16(task, 1u, o.acc.b, o.inv.y, wide, ok);
    store16(task, 2u, o.acc.c, o.inv.z, wide, ok);
    store16(task, 3u, o.acc.d, o.inv.w, wide, ok);
}

// ---------------------------------------------------------------- entry points
// attention_cpu_d<W>_<q>_<kv>_<out>: W 32 and 64, (q, kv, out) of TILED_DTYPES
// (gpud_protocol/ops/attention_tiled.py)

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, F32, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, F32, false, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, F16, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, F16, false, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f16_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F16, F32, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f16_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F16, F32, false, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f16_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F16, F16, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f16_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F16, F16, false, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                  @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, BF16, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_f32_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, BF16, false, BF16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_bf16_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                  @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, BF16, F32, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_bf16_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, BF16, F32, false, BF16);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_bf16_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, BF16, BF16, false);
}

@compute @workgroup_size(64)
fn attention_cpu_d32_bf16_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                    @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, BF16, BF16, false, BF16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, F32, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, F32, true, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, F16, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, F16, true, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f16_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F16, F32, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f16_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F16, F32, true, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f16_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F16, F16, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f16_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>,
                                 @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F16, F16, true, F16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                  @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, F32, BF16, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_f32_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, F32, BF16, true, BF16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_bf16_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                  @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, BF16, F32, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_bf16_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, BF16, F32, true, BF16);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_bf16_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>,
                                   @builtin(num_workgroups) groups: vec3<u32>) {
    rows32(gid, groups, BF16, BF16, true);
}

@compute @workgroup_size(64)
fn attention_cpu_d64_bf16_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>,
                                    @builtin(num_workgroups) groups: vec3<u32>) {
    rows16(gid, groups, BF16, BF16, true, BF16);
}
