// Attention ops (see gpud_protocol/ops/attention.py for the interface): embedding lookup, rotary
// position embedding, KV-cache append, and attention (split over the keys, then combined; or, for
// full attention, attention_tiled: one pass, query rows sharing tiles of keys).
//
// Float16 and bfloat16 tensors that are only read are bound as array<u32> (two halves a word, unpacked
// with unpack2x16float, or bf16_at and bf16_pair of gpud/ops/bf16.wgsl, which gpud.ops.source adds to
// this source) and float32 ones as array<u32> too (bitcast): one body serves every dtype, picked by a
// constant argument of the entry point (F32, F16, BF16). Written float16 tensors are array<f16>; written
// bfloat16 ones array<atomic<u32>> (two threads may write the halves of one word).
// No loop runs more than 65,535 times (lavapipe cuts longer ones): per-element kernels have no
// loops, attention loops over tiles of 256 keys (at most 65,535 tiles: 16.7M keys), attention_tiled
// over tiles of 32 / L keys (its Python side picks the split kernel past its budget).
enable f16;

const BLOCK: u32 = 256u;
const NONE: f32 = -3.0e38; // the running maximum before any key, and the score of a hidden key
const HIDDEN: f32 = -1.0e30; // a mask value at or below this hides its key
const F32: u32 = 0u; // a tensor's dtype, a constant of each entry point
const F16: u32 = 1u;
const BF16: u32 = 2u;

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

fn aq_at(kind: u32, i: u32) -> f32 {
    if (kind == F16) {
        return unpack2x16float(aq[i >> 1u])[i & 1u];
    }
    if (kind == BF16) {
        return bf16_at(aq[i >> 1u], i);
    }
    return bitcast<f32>(aq[i]);
}

fn ak_at(kind: u32, i: u32) -> f32 {
    if (kind == F16) {
        return unpack2x16float(ak[i >> 1u])[i & 1u];
    }
    if (kind == BF16) {
        return bf16_at(ak[i >> 1u], i);
    }
    return bitcast<f32>(ak[i]);
}

fn av_at(kind: u32, i: u32) -> f32 {
    if (kind == F16) {
        return unpack2x16float(av[i >> 1u])[i & 1u];
    }
    if (kind == BF16) {
        return bf16_at(av[i >> 1u], i);
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

fn attend(qk: u32, kvk: u32, wid: vec3<u32>, groups: vec3<u32>, tid: u32) {
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
        sq[tid] = aq_at(qk, row * d + tid) * ap.scale;
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
                dot += sq[i] * ak_at(kvk, k0 + i);
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
                    acc += pj * av_at(kvk, kv0 + (key0 + j) * stride + dd);
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
    attend(F32, F32, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(F32, F16, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f32_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) tid: u32) {
    attend(F32, BF16, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(F16, F32, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) tid: u32) {
    attend(F16, F16, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) tid: u32) {
    attend(BF16, F32, wid, groups, tid);
}

@compute @workgroup_size(256)
fn attention_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                       @builtin(local_invocation_index) tid: u32) {
    attend(BF16, BF16, wid, groups, tid);
}

// attention_combine_<out>(part, out): out[row, d] = sum_s w_s acc_s[d] / sum_s w_s l_s, w_s = exp(m_s -
// max m). One thread per output element; a row no key reached (every l_s = 0) gives zeros.

struct Combine { n: u32, d: u32, splits: u32 }

@group(0) @binding(0) var<storage, read> cpart: array<f32>;
@group(0) @binding(1) var<storage, read_write> cout32: array<f32>;
@group(0) @binding(1) var<storage, read_write> cout16: array<f16>;
@group(0) @binding(1) var<storage, read_write> coutbf: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> cp: Combine;

fn combine(i: u32) -> f32 {
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
    return select(0.0, num / den, den > 0.0);
}

@compute @workgroup_size(256)
fn attention_combine_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < cp.n) {
        cout32[i] = combine(i);
    }
}

@compute @workgroup_size(256)
fn attention_combine_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < cp.n) {
        cout16[i] = f16(combine(i));
    }
}

@compute @workgroup_size(256)
fn attention_combine_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < cp.n) {
        atomicAnd(&coutbf[i >> 1u], bf16_keep(i));
        atomicOr(&coutbf[i >> 1u], bf16_put(combine(i), i));
    }
}

// ------------------------------------------------------------------------------------------------
// attention_tiled_d<W>_<q>_<kv>_<out>(q, k, v, mask, out): full attention in one pass for D <= W (32, 64,
// 128, 256), one workgroup of 64 threads per (block of query rows, query head, batch row). A row is
// held by L = W / 32 threads, each owning 32 of its dims (its q, scaled, and its accumulator in
// registers), so a workgroup holds R = 64 / L rows; the keys go by in tiles of C = 32 / L keys, whose
// K and V (C x W floats each, zero past D, past S and where the key mask hides a key) the R rows share
// in workgroup memory. Per tile each thread scores the C keys on its 32 dims (with L > 1 the L partial
// dot products of a row meet in workgroup memory), takes the tile's maximum, rescales its running sums
// once, then adds exp(score - max) * v for the keys its row sees. A block stops at the last key its
// last row sees (causal). L is a constant of each entry point, so that lavapipe, which runs both sides
// of every branch, runs no code of the other widths. Loop iterations per tile (lavapipe's budget): at
// most 8 + (C + 1) (2 + [L > 1]), `tiled_loop` in gpud_protocol/ops/attention_tiled.py. The entry point
// stores the thread's dims of its row (out float32 or float16: a binding of each type, and an entry point
// binds only those it uses).

const TT: u32 = 64u; // threads of a workgroup of attention_tiled

struct Tiled { b: u32, t: u32, s: u32, hq: u32, hkv: u32, d: u32, causal: u32, mask_mode: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> tq: array<u32>;
@group(0) @binding(1) var<storage, read> tk: array<u32>;
@group(0) @binding(2) var<storage, read> tv: array<u32>;
@group(0) @binding(3) var<storage, read> tmask: array<u32>; // as amask
@group(0) @binding(4) var<storage, read_write> tout32: array<f32>;
@group(0) @binding(4) var<storage, read_write> tout16: array<f16>;
@group(0) @binding(4) var<storage, read_write> toutbf: array<atomic<u32>>;
@group(0) @binding(5) var<uniform> tp: Tiled;

var<workgroup> wk: array<vec4<f32>, 256>; // the tile's keys: dims 4i .. 4i+3 of key c at c * 8L + i
var<workgroup> wv: array<vec4<f32>, 256>; // its values, likewise
var<workgroup> wpart: array<f32, 1024>; // L > 1: thread u's partial dot product with key c at c * 64 + u
var<workgroup> won: array<u32, 32>; // key c of the tile exists and the key mask lets it take part

// Four elements of q, k or v (which: 0, 1, 2) from element i, dims dim .. dim+3 of a row of d; zeros past d.
fn tiled4(which: u32, kind: u32, i: u32, dim: u32, d: u32) -> vec4<f32> {
    let half = kind != F32; // two elements a word
    if (d % 4u == 0u && which != 0u) { // whole, aligned vec4s (q is read once: the general path)
        if (dim >= d) {
            return vec4<f32>(0.0);
        }
        if (kind == F16) {
            let w = i >> 1u;
            if (which == 1u) {
                return vec4<f32>(unpack2x16float(tk[w]), unpack2x16float(tk[w + 1u]));
            }
            return vec4<f32>(unpack2x16float(tv[w]), unpack2x16float(tv[w + 1u]));
        }
        if (kind == BF16) {
            let w = i >> 1u;
            if (which == 1u) {
                return vec4<f32>(bf16_pair(tk[w]), bf16_pair(tk[w + 1u]));
            }
            return vec4<f32>(bf16_pair(tv[w]), bf16_pair(tv[w + 1u]));
        }
        if (which == 1u) {
            return bitcast<vec4<f32>>(vec4<u32>(tk[i], tk[i + 1u], tk[i + 2u], tk[i + 3u]));
        }
        return bitcast<vec4<f32>>(vec4<u32>(tv[i], tv[i + 1u], tv[i + 2u], tv[i + 3u]));
    }
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let e = i + c;
        var word: u32;
        switch which {
            case 0u: { word = tq[select(e, e >> 1u, half)]; }
            case 1u: { word = tk[select(e, e >> 1u, half)]; }
            default: { word = tv[select(e, e >> 1u, half)]; }
        }
        var x = bitcast<f32>(word);
        if (kind == F16) {
            x = unpack2x16float(word)[e & 1u];
        } else if (kind == BF16) {
            x = bf16_at(word, e);
        }
        out[c] = select(0.0, x, dim + c < d);
    }
    return out;
}

// As key_on, for attention_tiled's mask.
fn tiled_key_on(mode: u32, i: u32) -> bool {
    switch mode {
        case 3u: {
            return ((tmask[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu) != 0u;
        }
        case 4u: {
            return tmask[i] != 0u;
        }
        case 5u: {
            return bitcast<f32>(tmask[i]) != 0.0;
        }
        default: {
            return (tmask[2u * i] | tmask[2u * i + 1u]) != 0u;
        }
    }
}

// Slot e of the tile (4 dims of one key) into wk and wv, and whether its key takes part into won.
fn tiled_load(kvk: u32, e: u32, width: u32, key0: u32, b: u32, kv0: u32, stride: u32) {
    let c = e / width;
    let dim = (e % width) * 4u;
    let key = key0 + c;
    var on = key < tp.s;
    if (on && tp.mask_mode >= 3u) {
        on = tiled_key_on(tp.mask_mode, b * tp.s + key);
    }
    var kk = vec4<f32>(0.0);
    var vv = vec4<f32>(0.0);
    if (on) {
        let at = kv0 + key * stride + dim;
        kk = tiled4(1u, kvk, at, dim, tp.d);
        vv = tiled4(2u, kvk, at, dim, tp.d);
    }
    wk[e] = kk;
    wv[e] = vv;
    if (dim == 0u) {
        won[c] = u32(on);
    }
}

// Written out rather than looped (loops count against lavapipe's budget): 32 dims of q . key.
fn tiled_dot(q: ptr<function, array<vec4<f32>, 8>>, at: u32) -> f32 {
    return dot((*q)[0], wk[at]) + dot((*q)[1], wk[at + 1u]) + dot((*q)[2], wk[at + 2u])
        + dot((*q)[3], wk[at + 3u]) + dot((*q)[4], wk[at + 4u]) + dot((*q)[5], wk[at + 5u])
        + dot((*q)[6], wk[at + 6u]) + dot((*q)[7], wk[at + 7u]);
}

fn tiled_axpy(acc: ptr<function, array<vec4<f32>, 8>>, p: f32, at: u32) {
    (*acc)[0] += p * wv[at];
    (*acc)[1] += p * wv[at + 1u];
    (*acc)[2] += p * wv[at + 2u];
    (*acc)[3] += p * wv[at + 3u];
    (*acc)[4] += p * wv[at + 4u];
    (*acc)[5] += p * wv[at + 5u];
    (*acc)[6] += p * wv[at + 6u];
    (*acc)[7] += p * wv[at + 7u];
}

fn tiled_scale(acc: ptr<function, array<vec4<f32>, 8>>, c: f32) {
    (*acc)[0] *= c;
    (*acc)[1] *= c;
    (*acc)[2] *= c;
    (*acc)[3] *= c;
    (*acc)[4] *= c;
    (*acc)[5] *= c;
    (*acc)[6] *= c;
    (*acc)[7] *= c;
}

// The dot product of a row with key c: the sum of its L threads' partial ones (at + j * rows).
fn tiled_row_sum(at: u32, rows: u32, lanes: u32) -> f32 {
    var total = wpart[at] + wpart[at + rows];
    if (lanes > 2u) {
        total += wpart[at + 2u * rows] + wpart[at + 3u * rows];
    }
    if (lanes > 4u) {
        total += wpart[at + 4u * rows] + wpart[at + 5u * rows] + wpart[at + 6u * rows] + wpart[at + 7u * rows];
    }
    return total;
}

// Where a thread's dims of its row go: from element `at` of out, `dims` of them (0: the thread has no row).
struct TiledRow { at: u32, dims: u32 }

// Attention of the thread's row on its 32 dims into acc (normalised), and where they go.
fn attend_tiled(qk: u32, kvk: u32, lanes: u32, wid: vec3<u32>, tid: u32,
                acc: ptr<function, array<vec4<f32>, 8>>) -> TiledRow {
    let d = tp.d;
    let s = tp.s;
    let rows = TT / lanes;
    let width = 8u * lanes; // vec4 slots per key in the tile
    let keys = 32u / lanes; // keys per tile
    let lane = tid / rows; // threads of one lane are neighbours: they read the same words of the tile
    let r = tid % rows;
    let h = wid.y;
    let b = wid.z;
    let t = wid.x * rows + r;
    let live = t < tp.t;
    let row = (b * tp.t + t) * tp.hq + h;
    let d0 = 32u * lane;

    var q: array<vec4<f32>, 8>;
    if (live) {
        for (var i = 0u; i < 8u; i++) {
            q[i] = tiled4(0u, qk, row * d + d0 + 4u * i, d0 + 4u * i, d) * tp.scale;
        }
    }
    // the keys this row sees (none past the last row), and the keys the block's last row sees
    var count = i32(s);
    var block_end = i32(s);
    if (tp.causal != 0u) {
        let last = min(tp.t - 1u, wid.x * rows + rows - 1u);
        count = min(count, i32(t) + i32(s) - i32(tp.t) + 1);
        block_end = min(block_end, i32(last) + i32(s) - i32(tp.t) + 1);
    }
    count = select(0, max(count, 0), live);
    let end = u32(max(block_end, 0));

    let stride = tp.hkv * d; // between key positions
    let kv0 = b * s * stride + (h / (tp.hq / tp.hkv)) * d;
    let mode = tp.mask_mode;
    let additive = mode == 1u || mode == 2u;
    let mrow = select(0u, b * tp.t * s, mode == 2u) + t * s;
    var m = NONE;
    var l = 0.0;
    var score: array<f32, 32>;
    for (var key0 = 0u; key0 < end; key0 += keys) {
        for (var e = tid; e < 256u; e += TT) {
            tiled_load(kvk, e, width, key0, b, kv0, stride);
        }
        workgroupBarrier();
        if (lanes > 1u) {
            for (var c = 0u; c < keys; c++) {
                wpart[c * TT + tid] = tiled_dot(&q, c * width + 8u * lane);
            }
            workgroupBarrier();
        }
        var top = m;
        for (var c = 0u; c < keys; c++) {
            var sc: f32;
            if (lanes == 1u) {
                sc = tiled_dot(&q, c * width);
            } else {
                sc = tiled_row_sum(c * TT + r, rows, lanes);
            }
            let key = key0 + c;
            var seen = i32(key) < count && won[c] != 0u;
            if (additive) {
                let add = select(NONE, bitcast<f32>(tmask[mrow + key]), seen);
                seen = add > HIDDEN;
                sc += add;
            }
            sc = select(NONE, sc, seen);
            score[c] = sc;
            top = max(top, sc);
        }
        let correction = exp(m - top);
        m = top;
        l *= correction;
        tiled_scale(acc, correction);
        for (var c = 0u; c < keys; c++) {
            let sc = score[c];
            if (sc > NONE) { // a hidden key is never read: its v may be anything, NaN included
                let p = exp(sc - top);
                l += p;
                tiled_axpy(acc, p, c * width + 8u * lane);
            }
        }
        workgroupBarrier(); // the next tile overwrites wk, wv, won and wpart
    }
    var out: TiledRow;
    if (live) {
        tiled_scale(acc, select(0.0, 1.0 / l, l > 0.0)); // a row that sees no key: zeros
        out.at = row * d + d0;
        out.dims = min(d - min(d0, d), 32u);
    }
    return out;
}

fn tiled_store32(acc: ptr<function, array<vec4<f32>, 8>>, r: TiledRow) {
    for (var i = 0u; i < 8u; i++) {
        for (var c = 0u; c < 4u; c++) {
            if (4u * i + c < r.dims) {
                tout32[r.at + 4u * i + c] = (*acc)[i][c];
            }
        }
    }
}

fn tiled_store16(acc: ptr<function, array<vec4<f32>, 8>>, r: TiledRow) {
    for (var i = 0u; i < 8u; i++) {
        for (var c = 0u; c < 4u; c++) {
            if (4u * i + c < r.dims) {
                tout16[r.at + 4u * i + c] = f16((*acc)[i][c]);
            }
        }
    }
}

// bfloat16: whole words where the thread's dims start on a word and are even in number (an even D: no
// other thread writes into them), else each half through atomics
fn tiled_storebf(acc: ptr<function, array<vec4<f32>, 8>>, r: TiledRow) {
    let whole = ((r.at | r.dims) & 1u) == 0u;
    for (var i = 0u; i < 8u; i++) {
        let v = (*acc)[i];
        let at = r.at + 4u * i;
        if (whole) {
            if (4u * i < r.dims) {
                atomicStore(&toutbf[at >> 1u], bf16_put(v.x, 0u) | bf16_put(v.y, 1u));
            }
            if (4u * i + 2u < r.dims) {
                atomicStore(&toutbf[(at >> 1u) + 1u], bf16_put(v.z, 0u) | bf16_put(v.w, 1u));
            }
        } else {
            for (var c = 0u; c < 4u; c++) {
                if (4u * i + c < r.dims) {
                    atomicAnd(&toutbf[(at + c) >> 1u], bf16_keep(at + c));
                    atomicOr(&toutbf[(at + c) >> 1u], bf16_put(v[c], at + c));
                }
            }
        }
    }
}

// Entry points: the (q, kv, out) of TILED_DTYPES in gpud_protocol/ops/attention_tiled.py for each W.

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 1u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 1u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f16_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 1u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f16_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f16_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 1u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_f32_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 1u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_bf16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_bf16_f32_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 1u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_bf16_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 1u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d32_bf16_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 1u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 2u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 2u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f16_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 2u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f16_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f16_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 2u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_f32_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 2u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_bf16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_bf16_f32_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 2u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_bf16_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 2u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d64_bf16_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 2u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 4u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 4u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f16_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 4u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f16_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f16_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 4u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_f32_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 4u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_bf16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_bf16_f32_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 4u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_bf16_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 4u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d128_bf16_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 4u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F32, 8u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, F16, 8u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f16_f32_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F32, 8u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f16_f16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f16_f16_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F16, F16, 8u, wid, tid, &acc);
    tiled_store16(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_f32_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(F32, BF16, 8u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_bf16_f32_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_bf16_f32_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, F32, 8u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_bf16_bf16_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 8u, wid, tid, &acc);
    tiled_store32(&acc, r);
}

@compute @workgroup_size(64)
fn attention_tiled_d256_bf16_bf16_bf16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    var acc: array<vec4<f32>, 8>;
    let r = attend_tiled(BF16, BF16, 8u, wid, tid, &acc);
    tiled_storebf(&acc, r);
}

// ------------------------------------------------------------------------------------------------
// embedding_<table>_<out>(ids, table, out): out[i, c] = table[ids[i], c], zeros for an id outside
// 0 .. V-1. One thread per output element. WGSL has no 64-bit integers: an int64 or uint64 id is two
// words, the low one first, and a high word other than 0 (a negative id, or one past 2^32) is outside.

struct Embed { n: u32, d: u32, v: u32, ids_mode: u32 } // ids_mode: 0 int32, 1 uint32, 2 int64, 3 uint64

@group(0) @binding(0) var<storage, read> eids: array<u32>;
@group(0) @binding(1) var<storage, read> etable: array<u32>;
@group(0) @binding(2) var<storage, read_write> eout32: array<f32>;
@group(0) @binding(2) var<storage, read_write> eout16: array<f16>;
@group(0) @binding(3) var<uniform> ep: Embed;

// The table row id j names, or V for an id outside 0 .. V-1.
fn embed_row(j: u32) -> u32 {
    var id: u32;
    var outside: bool;
    if (ep.ids_mode >= 2u) {
        id = eids[2u * j];
        outside = eids[2u * j + 1u] != 0u;
    } else {
        id = eids[j];
        outside = ep.ids_mode == 0u && bitcast<i32>(id) < 0;
    }
    return select(id, ep.v, outside || id >= ep.v);
}

fn embed(half: bool, i: u32) -> f32 {
    let row = embed_row(i / ep.d);
    if (row >= ep.v) {
        return 0.0;
    }
    let at = row * ep.d + i % ep.d;
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
    let turn = rotary_turn(j, f32(rpos[b] + i32(t)), p.freq_hi, p.freq_lo);
    var out: Pair;
    out.c = turn.x;
    out.s = turn.y;
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

// ------------------------------------------------------------------------------------------------
// bfloat16 (WGSL has none): embedding tables and outputs, rotary's x, kv_append's x and cache (attention's
// q, k, v and out are above). Read from array<u32>, two to a word, as the top half of a float32;
// written rounded to nearest even on the bits (NaN: the quiet NaN of its sign) into element i's half of a
// word of an array<atomic<u32>>: two threads may write the two halves of one word.

@group(0) @binding(2) var<storage, read_write> eoutbf: array<atomic<u32>>;

fn eoutbf_put(i: u32, v: f32) {
    atomicAnd(&eoutbf[i >> 1u], bf16_keep(i));
    atomicOr(&eoutbf[i >> 1u], bf16_put(v, i));
}

// A bfloat16 table's element for output i (zeros for an id outside 0 .. V-1).
fn embed_bf16(i: u32) -> f32 {
    let row = embed_row(i / ep.d);
    if (row >= ep.v) {
        return 0.0;
    }
    let at = row * ep.d + i % ep.d;
    return bf16_at(etable[at >> 1u], at);
}

@compute @workgroup_size(256)
fn embedding_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout32[i] = embed_bf16(i);
    }
}

@compute @workgroup_size(256)
fn embedding_bf16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eout16[i] = f16(embed_bf16(i));
    }
}

@compute @workgroup_size(256)
fn embedding_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eoutbf_put(i, embed_bf16(i));
    }
}

@compute @workgroup_size(256)
fn embedding_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eoutbf_put(i, embed(false, i));
    }
}

@compute @workgroup_size(256)
fn embedding_f16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < ep.n) {
        eoutbf_put(i, embed(true, i));
    }
}

@group(0) @binding(2) var<storage, read_write> routbf: array<atomic<u32>>;
@group(0) @binding(0) var<storage, read_write> riobf: array<atomic<u32>>;

@compute @workgroup_size(256)
fn rotary_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rp.n) {
        let q = rot_pair(i, rp);
        let a = bf16_at(rx[q.i0 >> 1u], q.i0);
        let b = bf16_at(rx[q.i1 >> 1u], q.i1);
        atomicAnd(&routbf[q.i0 >> 1u], bf16_keep(q.i0));
        atomicOr(&routbf[q.i0 >> 1u], bf16_put(a * q.c - b * q.s, q.i0));
        atomicAnd(&routbf[q.i1 >> 1u], bf16_keep(q.i1));
        atomicOr(&routbf[q.i1 >> 1u], bf16_put(b * q.c + a * q.s, q.i1));
    }
}

// Each thread reads and writes its own pair's halves only: the other halves' writers leave them be.
@compute @workgroup_size(256)
fn rotary_inplace_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < rpi.n) {
        let q = rot_pair(i, rpi);
        let a = bf16_at(atomicLoad(&riobf[q.i0 >> 1u]), q.i0);
        let b = bf16_at(atomicLoad(&riobf[q.i1 >> 1u]), q.i1);
        atomicAnd(&riobf[q.i0 >> 1u], bf16_keep(q.i0));
        atomicOr(&riobf[q.i0 >> 1u], bf16_put(a * q.c - b * q.s, q.i0));
        atomicAnd(&riobf[q.i1 >> 1u], bf16_keep(q.i1));
        atomicOr(&riobf[q.i1 >> 1u], bf16_put(b * q.c + a * q.s, q.i1));
    }
}

@group(0) @binding(2) var<storage, read_write> kcbf: array<atomic<u32>>;

fn kcbf_put(at: i32, v: f32) {
    let i = u32(at);
    atomicAnd(&kcbf[i >> 1u], bf16_keep(i));
    atomicOr(&kcbf[i >> 1u], bf16_put(v, i));
}

@compute @workgroup_size(256)
fn kv_append_bf16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kcbf_put(at, kx_at(false, i));
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_bf16_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kcbf_put(at, kx_at(true, i));
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_bf16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kcbf_put(at, bf16_at(kx[i >> 1u], i));
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_f32_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc32[at] = bf16_at(kx[i >> 1u], i);
        }
    }
}

@compute @workgroup_size(256)
fn kv_append_f16_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < kp.n) {
        let at = append_at(i);
        if (at >= 0) {
            kc16[at] = f16(bf16_at(kx[i >> 1u], i));
        }
    }
}
