// Fused decode kernels (see gpud_protocol/ops/fused.py for the interface): add_rmsnorm, silu_and_mul
// and rotary_kv_append, the arithmetic of reduce.wgsl's rmsnorm, elementwise.wgsl's silu_mul and
// attention.wgsl's rotary and kv_append in one dispatch each. Every tensor is bound as array<u32> and
// a thread writes whole words (one float32, or two float16 / bfloat16 elements: the even one in the
// low half), so no write needs an atomic; one body serves every dtype, picked by constant arguments
// of the entry points (F32, F16, BF16). bfloat16 helpers and the rotary angle: bf16.wgsl and rotary.wgsl, added
// by gpud.ops.source.
// No loop runs more than 65,535 times (lavapipe cuts longer ones): add_rmsnorm strides over at most
// 65,535 * 256 words of a row.

const BLOCK: u32 = 256u;
const F32: u32 = 0u;
const F16: u32 = 1u;
const BF16: u32 = 2u;

fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

// The elements of a word: (value, 0) for float32, both halves for the 16-bit dtypes.
fn unpack_word(kind: u32, word: u32) -> vec2<f32> {
    if (kind == F32) {
        return vec2<f32>(bitcast<f32>(word), 0.0);
    }
    if (kind == F16) {
        return unpack2x16float(word);
    }
    return bf16_pair(word);
}

// The word holding v (v.x alone for float32), each element rounded once.
fn pack_word(kind: u32, v: vec2<f32>) -> u32 {
    if (kind == F32) {
        return bitcast<u32>(v.x);
    }
    if (kind == F16) {
        return pack2x16float(v);
    }
    return bf16_put(v.x, 0u) | bf16_put(v.y, 1u);
}

fn per_word(kind: u32) -> u32 {
    return select(2u, 1u, kind == F32);
}

// ------------------------------------------------------------------------------------------------
// add_rmsnorm_<x>_<w>(x, r, weight, sum, out): one workgroup per row; the threads stride over the
// row's words, store sum = x + r (rounded) and sum its squares; then out = sum * scale * weight.

struct AddNorm { rows: u32, length: u32, eps: f32 }

@group(0) @binding(0) var<storage, read> an_x: array<u32>;
@group(0) @binding(1) var<storage, read> an_r: array<u32>;
@group(0) @binding(2) var<storage, read> an_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> an_sum: array<u32>;
@group(0) @binding(4) var<storage, read_write> an_out: array<u32>;
@group(0) @binding(5) var<uniform> an_p: AddNorm;

var<workgroup> fred: array<f32, 256>;

fn fused_tree_sum(t: u32, v: f32) -> f32 {
    fred[t] = v;
    workgroupBarrier();
    for (var s = BLOCK / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            fred[t] = fred[t] + fred[t + s];
        }
        workgroupBarrier();
    }
    let total = fred[0];
    workgroupBarrier();
    return total;
}

fn an_weight(kind: u32, j: u32) -> f32 {
    if (kind == F32) {
        return bitcast<f32>(an_w[j]);
    }
    return unpack_word(kind, an_w[j >> 1u])[j & 1u];
}

fn an_sum_word(xk: u32, w: u32) -> vec2<f32> {
    return unpack_word(xk, pack_word(xk, unpack_word(xk, an_x[w]) + unpack_word(xk, an_r[w])));
}

fn add_rmsnorm(xk: u32, wk: u32, t: u32, wid: vec3<u32>, groups: vec3<u32>) {
    let row = wid.x + wid.y * groups.x;
    if (row >= an_p.rows) {
        return; // the whole workgroup
    }
    let per = per_word(xk);
    let words = an_p.length / per;
    let base = row * words;
    var acc = 0.0;
    for (var w = t; w < words; w += BLOCK) {
        let s = an_sum_word(xk, base + w);
        an_sum[base + w] = pack_word(xk, s);
        acc += s.x * s.x + s.y * s.y; // s.y is 0 for float32
    }
    let scale = 1.0 / sqrt(fused_tree_sum(t, acc) / f32(an_p.length) + an_p.eps);
    for (var w = t; w < words; w += BLOCK) {
        let s = an_sum_word(xk, base + w);
        let e = w * per;
        var weight = vec2<f32>(an_weight(wk, e), 0.0);
        if (per == 2u) {
            weight.y = an_weight(wk, e + 1u);
        }
        an_out[base + w] = pack_word(xk, s * scale * weight);
    }
}

@compute @workgroup_size(256)
fn add_rmsnorm_f32_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F32, F32, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_f32_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F32, F16, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_f32_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F32, BF16, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_f16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F16, F32, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_f16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F16, F16, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_f16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(F16, BF16, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_bf16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(BF16, F32, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_bf16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(BF16, F16, t, wid, groups);
}

@compute @workgroup_size(256)
fn add_rmsnorm_bf16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    add_rmsnorm(BF16, BF16, t, wid, groups);
}

// ------------------------------------------------------------------------------------------------
// silu_and_mul_<x>(x, out): a thread per word of out; gate and up are the two halves of x's row.

struct SiluMul { n: u32, width: u32 }

@group(0) @binding(0) var<storage, read> sm_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> sm_out: array<u32>;
@group(0) @binding(2) var<uniform> sm_p: SiluMul;

fn silu_and_mul(kind: u32, i: u32) {
    let per = per_word(kind);
    if (i >= sm_p.n / per) {
        return;
    }
    let e = i * per;
    let row = e / sm_p.width;
    let gate = row * 2u * sm_p.width + e % sm_p.width; // an element of a whole word: width is even for 16 bits
    let a = unpack_word(kind, sm_x[gate / per]);
    let b = unpack_word(kind, sm_x[(gate + sm_p.width) / per]);
    sm_out[i] = pack_word(kind, a / (vec2<f32>(1.0) + exp(-a)) * b);
}

@compute @workgroup_size(256)
fn silu_and_mul_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    silu_and_mul(F32, index(gid, groups));
}

@compute @workgroup_size(256)
fn silu_and_mul_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    silu_and_mul(F16, index(gid, groups));
}

@compute @workgroup_size(256)
fn silu_and_mul_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    silu_and_mul(BF16, index(gid, groups));
}

// ------------------------------------------------------------------------------------------------
// rotary_kv_append_<cache>_<x>(qkv, pos, q, k_cache, v_cache): a thread per four elements of a head
// of qkv, two rotated pairs: neox (j, j + D/2) and (j + 1, j + 1 + D/2) for an even j, whose words are
// (j, j + 1) and (j + D/2, j + 1 + D/2); gptj (4u, 4u + 1) and (4u + 2, 4u + 3), a word each. Query
// heads go rotated to q, key heads rotated to k_cache, value heads as they are to v_cache, at position
// pos[b] + t (outside 0 .. L-1: dropped). The angle: rotary.wgsl's rotary_turn, as attention.wgsl's rotary.

struct RotKv { n: u32, t: u32, hq: u32, hkv: u32, d: u32, l: u32, style: u32, freq_hi: f32, freq_lo: f32 }

@group(0) @binding(0) var<storage, read> rk_qkv: array<u32>;
@group(0) @binding(1) var<storage, read> rk_pos: array<i32>;
@group(0) @binding(2) var<storage, read_write> rk_q: array<u32>;
@group(0) @binding(3) var<storage, read_write> rk_k: array<u32>;
@group(0) @binding(4) var<storage, read_write> rk_v: array<u32>;
@group(0) @binding(5) var<uniform> rk_p: RotKv;

fn rk_at(kind: u32, i: u32) -> f32 {
    if (kind == F32) {
        return bitcast<f32>(rk_qkv[i]);
    }
    return unpack_word(kind, rk_qkv[i >> 1u])[i & 1u];
}

// Elements i and i + 1 (i even for 16 bits) of q (dest 0), k_cache (1) or v_cache (2).
fn rk_put(dest: u32, kind: u32, i: u32, a: f32, b: f32) {
    if (kind == F32) {
        if (dest == 0u) {
            rk_q[i] = bitcast<u32>(a);
        } else if (dest == 1u) {
            rk_k[i] = bitcast<u32>(a);
        } else {
            rk_v[i] = bitcast<u32>(a);
        }
        return;
    }
    let word = pack_word(kind, vec2<f32>(a, b));
    if (dest == 0u) {
        rk_q[i >> 1u] = word;
    } else if (dest == 1u) {
        rk_k[i >> 1u] = word;
    } else {
        rk_v[i >> 1u] = word;
    }
}

// Stores elements e0..e3 (values v): whole words for 16 bits, as the style pairs them.
fn rk_store(dest: u32, kind: u32, at: u32, e: vec4<u32>, v: vec4<f32>) {
    if (kind == F32) {
        rk_put(dest, kind, at + e.x, v.x, 0.0);
        rk_put(dest, kind, at + e.y, v.y, 0.0);
        rk_put(dest, kind, at + e.z, v.z, 0.0);
        rk_put(dest, kind, at + e.w, v.w, 0.0);
    } else if (rk_p.style == 0u) {
        rk_put(dest, kind, at + e.x, v.x, v.z); // (j, j + 1)
        rk_put(dest, kind, at + e.y, v.y, v.w); // (j + D/2, j + 1 + D/2)
    } else {
        rk_put(dest, kind, at + e.x, v.x, v.y);
        rk_put(dest, kind, at + e.z, v.z, v.w);
    }
}

fn rotary_kv_append(ck: u32, xk: u32, i: u32) {
    let p = rk_p;
    if (i >= p.n) {
        return;
    }
    let quads = p.d / 4u;
    let heads = p.hq + 2u * p.hkv;
    let u = i % quads;
    let head = (i / quads) % heads;
    let bt = i / (quads * heads);
    let b = bt / p.t;
    let t = bt % p.t;
    let src = (bt * heads + head) * p.d;
    let position = rk_pos[b] + i32(t);
    let j0 = 2u * u;
    var e = vec4<u32>(4u * u, 4u * u + 1u, 4u * u + 2u, 4u * u + 3u);
    if (p.style == 0u) {
        e = vec4<u32>(j0, j0 + p.d / 2u, j0 + 1u, j0 + 1u + p.d / 2u);
    }
    var v = vec4<f32>(rk_at(xk, src + e.x), rk_at(xk, src + e.y), rk_at(xk, src + e.z), rk_at(xk, src + e.w));
    if (head < p.hq + p.hkv) {
        let c0 = rotary_turn(j0, f32(position), p.freq_hi, p.freq_lo);
        let c1 = rotary_turn(j0 + 1u, f32(position), p.freq_hi, p.freq_lo);
        v = vec4<f32>(v.x * c0.x - v.y * c0.y, v.y * c0.x + v.x * c0.y, v.z * c1.x - v.w * c1.y, v.w * c1.x + v.z * c1.y);
    }
    if (head < p.hq) {
        rk_store(0u, xk, (bt * p.hq + head) * p.d, e, v);
        return;
    }
    if (position < 0 || u32(position) >= p.l) {
        return;
    }
    let key = head < p.hq + p.hkv;
    let h = select(head - p.hq - p.hkv, head - p.hq, key);
    rk_store(select(2u, 1u, key), ck, ((b * p.l + u32(position)) * p.hkv + h) * p.d, e, v);
}

@compute @workgroup_size(256)
fn rotary_kv_append_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F32, F32, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F32, F16, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F32, BF16, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F16, F32, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F16, F16, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_f16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(F16, BF16, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(BF16, F32, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_bf16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(BF16, F16, index(gid, groups));
}

@compute @workgroup_size(256)
fn rotary_kv_append_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    rotary_kv_append(BF16, BF16, index(gid, groups));
}
