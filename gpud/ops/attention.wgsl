// Attention ops (see gpud_protocol/ops/attention.py for the interface): embedding lookup, rotary
// position embedding, KV-cache append, and attention (split over the keys, then combined).
//
// Float16 tensors that are only read are bound as array<u32> (two halves a word, unpacked with
// unpack2x16float) and float32 ones as array<u32> too (bitcast): one body serves both dtypes, picked
// by a constant argument of the entry point. Written float16 tensors are array<f16>.
// No loop runs more than 65,535 times (lavapipe cuts longer ones): per-element kernels have no
// loops, attention loops over tiles of 256 keys (at most 65,535 tiles: 16.7M keys).
enable f16;

const BLOCK: u32 = 256u;
const NONE: f32 = -3.0e38; // the running maximum before any key, and the score of a hidden key
const HIDDEN: f32 = -1.0e30; // a mask value at or below this hides its key

// The index of a thread of a 1-D grid folded into y past 65,535 workgroups.
fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

// ------------------------------------------------------------------------------------------------
// attention_<q>_<kv>(q, k, v, pos, mask, part): one workgroup per (query row, split of the keys).
// A row is (b, t, h); the keys it sees are 0 .. count-1 with count = S, and at most pos[b] + t + 1
// (use_pos), at most t + S - T + 1 (causal). Split `split` takes the tiles [split * per, (split + 1)
// * per) of 256 keys. Per tile: each thread scores one key (q . k * scale + mask), the workgroup
// takes the tile's maximum, rescales its running sums (online softmax), and the threads (g, d) add
// p_j * v_j[d] for the keys j = g mod G of the tile (G = 256 / D groups). The split's partial result
// (m, l, acc[D]) goes to part[row, split]; attention_combine merges the splits. mask_mode 3 to 6:
// the mask is a key mask (B, S) (uint8, int32, float32, int64), nonzero where a key takes part.

struct Attn {
    b: u32,
    t: u32,
    s: u32,
    hq: u32,
    hkv: u32,
    d: u32,
    splits: u32,
    causal: u32,
    mask_mode: u32, // 0 none, 1 one (T, S) mask for every batch, 2 one per batch (B, T, S)
    use_pos: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> aq: array<u32>;
@group(0) @binding(1) var<storage, read> ak: array<u32>;
@group(0) @binding(2) var<storage, read> av: array<u32>;
@group(0) @binding(3) var<storage, read> apos: array<i32>;
@group(0) @binding(4) var<storage, read> amask: array<u32>; // f32 bits, or a key mask of any KEY_MASK_MODES dtype
@group(0) @binding(5) var<storage, read_write> apart: array<f32>;
@group(0) @binding(6) var<uniform> ap: Attn;

var<workgroup> sq: array<f32, 256>; // the query row, scaled
var<workgroup> sp: array<f32, 256>; // the tile's scores, then its weights; the final sums
var<workgroup> sr: array<f32, 256>; // the accumulators of the groups, at the end
var<workgroup> sm: array<f32, 16>; // partial maxima and sums
var<workgroup> scount: i32;

fn aq_at(half: bool, i: u32) -> f32 {
    if (half) {
        return unpack2x16float(aq[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(aq[i]);
}

fn ak_at(half: bool, i: u32) -> f32 {
    if (half) {
        return unpack2x16float(ak[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(ak[i]);
}

fn av_at(half: bool, i: u32) -> f32 {
    if (half) {
        return unpack2x16float(av[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(av[i]);
}

// Whether key mask element i lets its key take part (mask_mode 3 uint8, 4 int32, 5 float32, 6 int64).
fn key_on(mode: u32, i: u32) -> bool {
    switch mode {
        case 3u: {
            return ((amask[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u;
        }
        case 4u: {
            return amask[i] != 0u;
        }
        case 5u: {
            return bitcast<f32>(amask[i]) != 0.0;
        }
        default: {
            return (amask[2u * i] | amask[2u * i + 1u]) != 0u;
        }
    }
}

fn attend(qh: bool, kvh: bool, wid: vec3<u32>, groups: vec3<u32>, tid: u32) {
    let work = wid.x + wid.y * groups.x; // (row, split)
    let splits = ap.splits;
    if (work >= ap.b * ap.t * ap.hq * splits) {
        return;
    }
    let split = work % splits;
    let row = work / splits;
    let h = row % ap.hq;
    let bt = row / ap.hq;
    let t = bt % ap.t;
    let b = bt / ap.t;
    let d = ap.d;

    if (tid == 0u) {
        var count = i32(ap.s);
        if (ap.use_pos != 0u) {
            count = min(count, apos[b] + i32(t) + 1);
        }
        if (ap.causal != 0u) {
            count = min(count, i32(t) + i32(ap.s) - i32(ap.t) + 1);
        }
        scount = max(count, 0);
    }
    if (tid < d) {
        sq[tid] = aq_at(qh, row * d + tid) * ap.scale;
    }
    let count = u32(workgroupUniformLoad(&scount)); // a barrier: sq is ready too
    let per = ((ap.s + BLOCK - 1u) / BLOCK + splits - 1u) / splits;
    let first = split * per;
    let end = min(first + per, (count + BLOCK - 1u) / BLOCK);

    let stride = ap.hkv * d; // between key positions
    let kv0 = b * ap.s * stride + (h / (ap.hq / ap.hkv)) * d;
    let ngroups = BLOCK / d;
    let g = tid / d;
    let dd = tid % d;
    let mask0 = select(0u, b * ap.t * ap.s, ap.mask_mode == 2u) + t * ap.s;
    var m = NONE;
    var l = 0.0;
    var acc = 0.0;
    for (var tile = first; tile < end; tile++) {
        let key0 = tile * BLOCK;
        let key = key0 + tid;
        var score = NONE;
        if (key < count) {
            var dot = 0.0;
            let k0 = kv0 + key * stride;
            for (var i = 0u; i < d; i++) {
                dot += sq[i] * ak_at(kvh, k0 + i);
            }
            score = dot;
            if (ap.mask_mode >= 3u) { // a key mask (B, S)
                if (!key_on(ap.mask_mode, b * ap.s + key)) {
                    score = NONE;
                }
            } else if (ap.mask_mode != 0u) {
                let hide = bitcast<f32>(amask[mask0 + key]);
                score = select(dot + hide, NONE, hide <= HIDDEN);
            }
        }
        sp[tid] = score;
        workgroupBarrier();
        if (tid < 16u) {
            var mx = NONE;
            for (var i = 0u; i < 16u; i++) {
                mx = max(mx, sp[tid * 16u + i]);
            }
            sm[tid] = mx;
        }
        workgroupBarrier();
        var top = m;
        for (var i = 0u; i < 16u; i++) {
            top = max(top, sm[i]);
        }
        let correction = exp(m - top);
        m = top;
        var p = 0.0;
        if (score > NONE) {
            p = exp(score - top);
        }
        sp[tid] = p; // every read of the scores was before the barrier above
        l = l * correction + p;
        workgroupBarrier();
        if (g < ngroups) {
            acc *= correction;
            let keys = min(BLOCK, count - key0);
            for (var j = g; j < keys; j += ngroups) {
                let pj = sp[j];
                if (pj != 0.0) {
                    acc += pj * av_at(kvh, kv0 + (key0 + j) * stride + dd);
                }
            }
        }
        workgroupBarrier(); // the next tile overwrites sp
    }

    sp[tid] = l;
    sr[tid] = select(0.0, acc, g < ngroups);
    workgroupBarrier();
    if (tid < 16u) {
        var total = 0.0;
        for (var i = 0u; i < 16u; i++) {
            total += sp[tid * 16u + i];
        }
        sm[tid] = total;
    }
    workgroupBarrier();
    let out = work * (d + 2u);
    if (tid == 0u) {
        var total = 0.0;
        for (var i = 0u; i < 16u; i++) {
            total += sm[i];
        }
        apart[out] = m;
        apart[out + 1u] = total;
    }
    if (tid < d) {
        var total = 0.0;
        for (var gi = 0u; gi < ngroups; gi++) {
            total += sr[gi * d + tid];
        }
        apart[out + 2u + tid] = total;
    }
}

@compute @workgroup_size(256)
fn attention_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(false, false, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(false, true, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(true, false, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(true, true, wid, groups, tid);
}

// attention_combine(part, out): out[row, d] = sum_s w_s acc_s[d] / sum_s w_s l_s, w_s = exp(m_s - max m).
// One thread per output element; a row no key reached (every l_s = 0) gives zeros.

struct Combine { n: u32, d: u32, splits: u32 }

@group(0) @binding(0) var<storage, read> cpart: array<f32>;
@group(0) @binding(1) var<storage, read_write> cout: array<f32>;
@group(0) @binding(2) var<uniform> cp: Combine;

@compute @workgroup_size(256)
fn attention_combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i >= cp.n) {
        return;
    }
    let width = cp.d + 2u;
    let row = i / cp.d;
    let base = row * cp.splits * width;
    var top = NONE;
    for (var s = 0u; s < cp.splits; s++) {
        top = max(top, cpart[base + s * width]);
    }
    var num = 0.0;
    var den = 0.0;
    for (var s = 0u; s < cp.splits; s++) {
        let at = base + s * width;
        let w = exp(cpart[at] - top);
        den += w * cpart[at + 1u];
        num += w * cpart[at + 2u + i % cp.d];
    }
    cout[i] = select(0.0, num / den, den > 0.0);
}

// ------------------------------------------------------------------------------------------------
// embedding_<table>_<out>(ids, table, out): out[i, c] = table[ids[i], c], zeros for an id outside
// 0 .. V-1. One thread per output element.

struct Embed { n: u32, d: u32, v: u32 }

@group(0) @binding(0) var<storage, read> eids: array<i32>;
@group(0) @binding(1) var<storage, read> etable: array<u32>;
@group(0) @binding(2) var<storage, read_write> eout32: array<f32>;
@group(0) @binding(2) var<storage, read_write> eout16: array<f16>;
@group(0) @binding(3) var<uniform> ep: Embed;

fn embed(half: bool, i: u32) -> f32 {
    let id = eids[i / ep.d];
    if (id < 0 || u32(id) >= ep.v) {
        return 0.0;
    }
    let at = u32(id) * ep.d + i % ep.d;
    if (half) {
        return unpack2x16float(etable[at >> 1u])[at & 1u];
    }
    return bitcast<f32>(etable[at]);
}

@compute @workgroup_size(256)
fn embedding_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout32[i] = embed(false, i);
    }
}

@compute @workgroup_size(256)
fn embedding_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout32[i] = embed(true, i);
    }
}

@compute @workgroup_size(256)
fn embedding_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout16[i] = f16(embed(false, i));
    }
}

@compute @workgroup_size(256)
fn embedding_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout16[i] = f16(embed(true, i));
    }
}

// ------------------------------------------------------------------------------------------------
// rotary_<dtype>(x, pos, out) and rotary_inplace_<dtype>(x, pos): one thread per rotated pair of
// x (B, T, H, D); element (b, t) is at position pos[b] + t. Pair j of a row is (j, j + D/2) (neox)
// or (2j, 2j+1) (gptj), rotated by the angle position * base^(-2j/D).
// The frequency: 2^-(j * f), f = 2 log2(base) / D given as freq_hi + freq_lo with freq_hi short
// (12 significant bits) so that j * freq_hi is exact, and 2^-(whole + frac) = ldexp(2^-frac, -whole):
// the frequency is then within a few ulp. The angle (rounded once, as float32 implementations do) is
// reduced to [-pi, pi] before sin and cos (Cody-Waite, 2 pi in three parts, exact for |angle| < 400k).

struct Rot { n: u32, t: u32, h: u32, d: u32, style: u32, freq_hi: f32, freq_lo: f32 }

struct Pair { i0: u32, i1: u32, c: f32, s: f32 }

@group(0) @binding(0) var<storage, read> rx: array<u32>;
@group(0) @binding(1) var<storage, read> rpos: array<i32>;
@group(0) @binding(2) var<storage, read_write> rout32: array<f32>;
@group(0) @binding(2) var<storage, read_write> rout16: array<f16>;
@group(0) @binding(3) var<uniform> rp: Rot;

@group(0) @binding(0) var<storage, read_write> rio32: array<f32>;
@group(0) @binding(0) var<storage, read_write> rio16: array<f16>;
@group(0) @binding(2) var<uniform> rpi: Rot;

fn rot_pair(pair: u32, p: Rot) -> Pair {
    let half = p.d / 2u;
    let j = pair % half;
    let row = pair / half; // (b, t, h)
    let bt = row / p.h;
    let t = bt % p.t;
    let b = bt / p.t;
    let position = f32(rpos[b] + i32(t));
    let e = f32(j) * p.freq_hi; // exact
    let whole = floor(e);
    let frac = (e - whole) + f32(j) * p.freq_lo;
    let angle = position * ldexp(exp2(-frac), -i32(whole));
    let k = round(angle * 0.15915494309189535);
    let r = ((angle - k * 6.28125) - k * 0.0019378662109375) - k * -2.559031372584286e-06;
    var out: Pair;
    out.c = cos(r);
    out.s = sin(r);
    let base = row * p.d;
    if (p.style == 0u) {
        out.i0 = base + j;
        out.i1 = base + j + half;
    } else {
        out.i0 = base + 2u * j;
        out.i1 = out.i0 + 1u;
    }
    return out;
}

fn rx_at(half: bool, i: u32) -> f32 {
    if (half) {
        return unpack2x16float(rx[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(rx[i]);
}

@compute @workgroup_size(256)
fn rotary_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rp.n) {
        let q = rot_pair(i, rp);
        let a = rx_at(false, q.i0);
        let b = rx_at(false, q.i1);
        rout32[q.i0] = a * q.c - b * q.s;
        rout32[q.i1] = b * q.c + a * q.s;
    }
}

@compute @workgroup_size(256)
fn rotary_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rp.n) {
        let q = rot_pair(i, rp);
        let a = rx_at(true, q.i0);
        let b = rx_at(true, q.i1);
        rout16[q.i0] = f16(a * q.c - b * q.s);
        rout16[q.i1] = f16(b * q.c + a * q.s);
    }
}

@compute @workgroup_size(256)
fn rotary_inplace_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rpi.n) {
        let q = rot_pair(i, rpi);
        let a = rio32[q.i0];
        let b = rio32[q.i1];
        rio32[q.i0] = a * q.c - b * q.s;
        rio32[q.i1] = b * q.c + a * q.s;
    }
}

@compute @workgroup_size(256)
fn rotary_inplace_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rpi.n) {
        let q = rot_pair(i, rpi);
        let a = f32(rio16[q.i0]);
        let b = f32(rio16[q.i1]);
        rio16[q.i0] = f16(a * q.c - b * q.s);
        rio16[q.i1] = f16(b * q.c + a * q.s);
    }
}

// ------------------------------------------------------------------------------------------------
// kv_append_<cache>_<x>(x, pos, cache): cache[b, pos[b] + t] = x[b, t] (cast when stored); a
// position outside 0 .. L-1 is dropped. One thread per element of x (B, T, H, D).

struct Append { n: u32, t: u32, l: u32, hd: u32 }

@group(0) @binding(0) var<storage, read> kx: array<u32>;
@group(0) @binding(1) var<storage, read> kpos: array<i32>;
@group(0) @binding(2) var<storage, read_write> kc32: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc16: array<f16>;
@group(0) @binding(3) var<uniform> kp: Append;

// The cache element x[i] goes to, or -1 when its position is outside the cache.
fn append_at(i: u32) -> i32 {
    let bt = i / kp.hd;
    let t = bt % kp.t;
    let b = bt / kp.t;
    let position = kpos[b] + i32(t);
    if (position < 0 || u32(position) >= kp.l) {
        return -1;
    }
    return i32((b * kp.l + u32(position)) * kp.hd + i % kp.hd);
}

fn kx_at(half: bool, i: u32) -> f32 {
    if (half) {
        return unpack2x16float(kx[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(kx[i]);
}

@compute @workgroup_size(256)
fn kv_append_f32_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc32[at] = kx_at(false, i);
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc32[at] = kx_at(true, i);
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc16[at] = f16(kx_at(false, i));
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_f16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc16[at] = f16(kx_at(true, i));
        }
    }
}
