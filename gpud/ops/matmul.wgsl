// Matrix products (see gpud_protocol/ops/matmul.py for the interface): out = x @ w (+ bias), float32
// accumulation. The operands bind as raw 32-bit words (array<u32>) so that one body serves every mix
// of float32 and float16 (a float16 element is half a word: unpack2x16float); each entry point passes
// its operands' dtypes as constants and writes its own output array (f16 when both operands are f16).
// Lavapipe stops a loop nest once it has made 65,535 iterations, those of the loops inside it counted
// every time they run: so the loops over K hold no loops (rows and tile steps are written out), and
// each makes K / 256 (matvec, w as (N, K)) or K / 16 (the others) iterations: K up to ~1M there.
enable f16;

const BLOCK: u32 = 256u;  // threads per workgroup
const ROWS: u32 = 8u;  // matvec: most rows of x per weight matrix
const COLS: u32 = 64u;  // matvec without wt: columns of out per workgroup (4 slices of K each)
const TILE: u32 = 64u;  // matmul: a TILE x TILE block of out per workgroup
const TK: u32 = 16u;  // matmul: the K step of a tile

struct Params { batch: u32, m: u32, n: u32, k: u32, x_stride: u32, w_stride: u32, wt: u32, bias_kind: u32 }

@group(0) @binding(0) var<storage, read> xs: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<u32>;
@group(0) @binding(2) var<storage, read> bs: array<u32>;
@group(0) @binding(3) var<storage, read_write> out32: array<f32>;
@group(0) @binding(3) var<storage, read_write> out16: array<f16>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> red: array<f32, 2048>;  // matvec: ROWS x BLOCK partial sums

fn ld_x(i: u32, h16: bool) -> f32 {
    if (h16) {
        return unpack2x16float(xs[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(xs[i]);
}

fn ld_w(i: u32, h16: bool) -> f32 {
    if (h16) {
        return unpack2x16float(ws[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(ws[i]);
}

fn bias_at(j: u32) -> f32 {
    switch p.bias_kind {
        case 1u: { return bitcast<f32>(bs[j]); }
        case 2u: { return unpack2x16float(bs[j >> 1u])[j & 1u]; }
        default: { return 0.0; }
    }
}

// matvec with wt: threads that share one row of w (the same rule as threads_per_row in Python)
fn threads_per_row(k: u32) -> u32 {
    var t = 32u;
    while (t < BLOCK && t * 32u < k) {
        t = t * 2u;
    }
    return t;
}

// acc[r] += x[row r at xi] * wv for r < m, without a loop (see the top: loops count against lavapipe's budget)
fn mac_rows(acc: ptr<function, array<f32, 8>>, m: u32, xi: u32, k: u32, xh: bool, wv: f32) {
    (*acc)[0] = fma(ld_x(xi, xh), wv, (*acc)[0]);
    if (m > 1u) { (*acc)[1] = fma(ld_x(xi + k, xh), wv, (*acc)[1]); }
    if (m > 2u) { (*acc)[2] = fma(ld_x(xi + 2u * k, xh), wv, (*acc)[2]); }
    if (m > 3u) { (*acc)[3] = fma(ld_x(xi + 3u * k, xh), wv, (*acc)[3]); }
    if (m > 4u) { (*acc)[4] = fma(ld_x(xi + 4u * k, xh), wv, (*acc)[4]); }
    if (m > 5u) { (*acc)[5] = fma(ld_x(xi + 5u * k, xh), wv, (*acc)[5]); }
    if (m > 6u) { (*acc)[6] = fma(ld_x(xi + 6u * k, xh), wv, (*acc)[6]); }
    if (m > 7u) { (*acc)[7] = fma(ld_x(xi + 7u * k, xh), wv, (*acc)[7]); }
}

// What a matvec thread writes: out[at + i * n] = v[i] for i < m, if ok.
struct Rows { ok: bool, at: u32, v: array<f32, 8> }

// w is (N, K): threads_per_row(k) threads per row of w stride over K (K / 256 iterations each for a
// long K), then a tree sum per row.
fn matvec_nk(lid: u32, group: u32, b: u32, xh: bool, wh: bool) -> Rows {
    let m = min(p.m, ROWS);
    let n = p.n;
    let k = p.k;
    let t = threads_per_row(k);
    let lane = lid % t;
    let j = group * (BLOCK / t) + lid / t;
    var acc: array<f32, 8>;
    if (j < n) {
        let wrow = b * p.w_stride + j * k;
        let xrow = b * p.x_stride;
        for (var i = lane; i < k; i += t) {
            mac_rows(&acc, m, xrow + i, k, xh, ld_w(wrow + i, wh));
        }
    }
    for (var r = 0u; r < m; r++) {
        red[r * BLOCK + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = t / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            for (var r = 0u; r < m; r++) {
                red[r * BLOCK + lid] += red[r * BLOCK + lid + s];
            }
        }
        workgroupBarrier();
    }
    var rows: Rows;
    rows.ok = lane == 0u && j < n;
    rows.at = b * p.m * n + j;
    if (rows.ok) {
        let bias = bias_at(j);
        for (var r = 0u; r < m; r++) {
            rows.v[r] = red[r * BLOCK + lid] + bias;
        }
    }
    return rows;
}

// w is (K, N): COLS columns per workgroup (coalesced rows of w), each summed over K by 4 slices of
// threads, 4 steps of K per iteration (K / 16 iterations).
fn matvec_kn(lid: u32, group: u32, b: u32, xh: bool, wh: bool) -> Rows {
    let m = min(p.m, ROWS);
    let n = p.n;
    let k = p.k;
    let slices = BLOCK / COLS;
    let col = lid % COLS;
    let slice = lid / COLS;
    let j = group * COLS + col;
    var acc: array<f32, 8>;
    if (j < n) {
        let wcol = b * p.w_stride + j;
        let xrow = b * p.x_stride;
        for (var i = slice; i < k; i += 4u * slices) {
            mac_rows(&acc, m, xrow + i, k, xh, ld_w(wcol + i * n, wh));
            let i1 = i + slices;
            if (i1 < k) { mac_rows(&acc, m, xrow + i1, k, xh, ld_w(wcol + i1 * n, wh)); }
            let i2 = i1 + slices;
            if (i2 < k) { mac_rows(&acc, m, xrow + i2, k, xh, ld_w(wcol + i2 * n, wh)); }
            let i3 = i2 + slices;
            if (i3 < k) { mac_rows(&acc, m, xrow + i3, k, xh, ld_w(wcol + i3 * n, wh)); }
        }
    }
    for (var r = 0u; r < m; r++) {
        red[r * BLOCK + lid] = acc[r];
    }
    workgroupBarrier();
    var rows: Rows;
    rows.ok = slice == 0u && j < n;
    rows.at = b * p.m * n + j;
    if (rows.ok) {
        let bias = bias_at(j);
        for (var r = 0u; r < m; r++) {
            var total = bias;
            for (var s = 0u; s < slices; s++) {
                total += red[r * BLOCK + s * COLS + col];
            }
            rows.v[r] = total;
        }
    }
    return rows;
}

fn matvec(lid: u32, wg: vec3<u32>, groups: vec3<u32>, xh: bool, wh: bool) -> Rows {
    let group = wg.x + wg.y * groups.x;
    if (p.wt != 0u) {
        return matvec_nk(lid, group, wg.z, xh, wh);
    }
    return matvec_kn(lid, group, wg.z, xh, wh);
}

// ---------------------------------------------------------------- matmul: tiles
// A TILE x TILE block of out per workgroup, K in steps of TK through workgroup memory. The 256
// threads form four K-groups of 64: in every step group g takes the step's K offsets 4g..4g+3, and
// each of its threads an 8 x 8 block of out: two vec4 loads of each tile per K offset for 64
// products, half the workgroup-memory loads per product of a 4 x 4 block. That matters most on
// lavapipe, where every workgroup-memory load is a loop over the 8 SIMD lanes (the products
// themselves are ~10% of the time), and halves the shared-memory traffic of a GPU. The four partial
// blocks are summed through workgroup memory at the end. The step's loads and products are written
// out (no inner loops): K / TK iterations.

// Threads staging the tiles store one vec4 each per step: 4 rows of x (or 4 columns of out from w) at
// one K offset; a K offset's 64 rows are a row of PAD vec4s (one spare against bank conflicts).
const PAD: u32 = 17u;
const WTILE: u32 = 272u;  // TK * PAD: where the w tile starts in `tiles`
var<workgroup> tiles: array<vec4<f32>, 1024>;  // x tile [0, WTILE), w tile [WTILE, 2 WTILE); then the sums

// What a matmul thread writes: out[row + i, col + 4 j + c] = v[2 i + j][c] (i, j < 2) where in bounds.
struct Block { row: u32, col: u32, v: array<vec4<f32>, 4> }

fn ld_xz(i: u32, ok: bool, h16: bool) -> f32 {
    return select(0.0, ld_x(i, h16), ok);  // a load past the buffer reads 0 or some element (WGSL), never faults
}

fn ld_wz(i: u32, ok: bool, h16: bool) -> f32 {
    return select(0.0, ld_w(i, h16), ok);
}

// acc (8 x 8: acc[2 i + j] holds row i, columns 4 j..4 j + 3) += (x tile at kk, rows 8 ty..) x (w tile
// at kk, columns 8 tx..)
fn mac8x8(acc: ptr<function, array<vec4<f32>, 16>>, kk: u32, tx: u32, ty: u32) {
    let a0 = tiles[kk * PAD + ty * 2u];
    let a1 = tiles[kk * PAD + ty * 2u + 1u];
    let b0 = tiles[WTILE + kk * PAD + tx * 2u];
    let b1 = tiles[WTILE + kk * PAD + tx * 2u + 1u];
    (*acc)[0] = fma(vec4<f32>(a0.x), b0, (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(a0.x), b1, (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(a0.y), b0, (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(a0.y), b1, (*acc)[3]);
    (*acc)[4] = fma(vec4<f32>(a0.z), b0, (*acc)[4]);
    (*acc)[5] = fma(vec4<f32>(a0.z), b1, (*acc)[5]);
    (*acc)[6] = fma(vec4<f32>(a0.w), b0, (*acc)[6]);
    (*acc)[7] = fma(vec4<f32>(a0.w), b1, (*acc)[7]);
    (*acc)[8] = fma(vec4<f32>(a1.x), b0, (*acc)[8]);
    (*acc)[9] = fma(vec4<f32>(a1.x), b1, (*acc)[9]);
    (*acc)[10] = fma(vec4<f32>(a1.y), b0, (*acc)[10]);
    (*acc)[11] = fma(vec4<f32>(a1.y), b1, (*acc)[11]);
    (*acc)[12] = fma(vec4<f32>(a1.z), b0, (*acc)[12]);
    (*acc)[13] = fma(vec4<f32>(a1.z), b1, (*acc)[13]);
    (*acc)[14] = fma(vec4<f32>(a1.w), b0, (*acc)[14]);
    (*acc)[15] = fma(vec4<f32>(a1.w), b1, (*acc)[15]);
}

// acc[4 q + c], q < 4, by selects: an index that varies between threads would move acc to memory
fn quarter(acc: ptr<function, array<vec4<f32>, 16>>, q: u32, c: u32) -> vec4<f32> {
    let lo = select((*acc)[c], (*acc)[4u + c], q == 1u);
    let hi = select((*acc)[8u + c], (*acc)[12u + c], q == 3u);
    return select(lo, hi, q >= 2u);
}

// The four K-groups' blocks summed: quarter q of a thread's block (rows 2q, 2q + 1) is summed by group
// q. In round r group g hands quarter (g + r) % 4 over through `tiles` and adds what group (g - r) % 4
// handed it; `tiles` holds one quarter of every thread (1024 vec4s) at a time.
fn sum_groups(acc: ptr<function, array<vec4<f32>, 16>>, lid: u32) -> array<vec4<f32>, 4> {
    let g = lid / 64u;
    let at = lid * 4u;
    var mine = array<vec4<f32>, 4>(quarter(acc, g, 0u), quarter(acc, g, 1u), quarter(acc, g, 2u), quarter(acc, g, 3u));
    for (var r = 1u; r < 4u; r++) {
        let dst = (g + r) % 4u;
        tiles[at] = quarter(acc, dst, 0u);
        tiles[at + 1u] = quarter(acc, dst, 1u);
        tiles[at + 2u] = quarter(acc, dst, 2u);
        tiles[at + 3u] = quarter(acc, dst, 3u);
        workgroupBarrier();
        let src = ((g + 4u - r) % 4u) * 256u + (lid % 64u) * 4u;
        mine[0] += tiles[src];
        mine[1] += tiles[src + 1u];
        mine[2] += tiles[src + 2u];
        mine[3] += tiles[src + 3u];
        workgroupBarrier();
    }
    return mine;
}

fn matmul_block(lid: u32, wg: vec3<u32>, xh: bool, wh: bool) -> Block {
    let m = p.m;
    let n = p.n;
    let k = p.k;
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    // staging x: rows xr..xr + 3 at K offset e (consecutive threads along K, coalesced)
    let e = lid % TK;
    let q = lid / TK;
    let xr = row0 + 4u * q;
    let x_rows = vec4<bool>(xr < m, xr + 1u < m, xr + 2u < m, xr + 3u < m);
    var xi = wg.z * p.x_stride + xr * k + e;
    // staging w: columns wc..wc + 3 of out at K offset we; with wt along K like x, else along N
    let wt = p.wt != 0u;
    let we = select(lid / 16u, e, wt);
    let wq = select(lid % 16u, q, wt);
    let wc = col0 + 4u * wq;
    let w_cols = vec4<bool>(wc < n, wc + 1u < n, wc + 2u < n, wc + 3u < n);
    var wi = wg.z * p.w_stride + select(we * n + wc, wc * k + we, wt);
    let w_next = select(1u, k, wt);  // from one of the 4 columns to the next
    let w_step = select(TK * n, TK, wt);
    // products: K-group g, rows 8 ty.., columns 8 tx.. of the block
    let kk = (lid / 64u) * 4u;
    let tx = lid % 8u;
    let ty = (lid % 64u) / 8u;
    var acc: array<vec4<f32>, 16>;
    for (var k0 = 0u; k0 < k; k0 += TK) {
        let xin = x_rows & vec4<bool>(k0 + e < k);
        tiles[e * PAD + q] = vec4<f32>(ld_xz(xi, xin.x, xh), ld_xz(xi + k, xin.y, xh),
                                       ld_xz(xi + 2u * k, xin.z, xh), ld_xz(xi + 3u * k, xin.w, xh));
        let win = w_cols & vec4<bool>(k0 + we < k);
        let w_at = WTILE + we * PAD + wq;
        tiles[w_at] = vec4<f32>(ld_wz(wi, win.x, wh), ld_wz(wi + w_next, win.y, wh),
                                ld_wz(wi + 2u * w_next, win.z, wh), ld_wz(wi + 3u * w_next, win.w, wh));
        workgroupBarrier();
        mac8x8(&acc, kk, tx, ty);
        mac8x8(&acc, kk + 1u, tx, ty);
        mac8x8(&acc, kk + 2u, tx, ty);
        mac8x8(&acc, kk + 3u, tx, ty);
        workgroupBarrier();
        xi += TK;
        wi += w_step;
    }
    return Block(row0 + ty * 8u + (lid / 64u) * 2u, col0 + tx * 8u, sum_groups(&acc, lid));
}

// ---------------------------------------------------------------- entry points: matvec_<x>_<w>

@compute @workgroup_size(256)
fn matvec_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let rows = matvec(lid, wg, groups, false, false);
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out32[rows.at + r * p.n] = rows.v[r]; }
    }
}

@compute @workgroup_size(256)
fn matvec_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let rows = matvec(lid, wg, groups, false, true);
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out32[rows.at + r * p.n] = rows.v[r]; }
    }
}

@compute @workgroup_size(256)
fn matvec_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let rows = matvec(lid, wg, groups, true, false);
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out32[rows.at + r * p.n] = rows.v[r]; }
    }
}

@compute @workgroup_size(256)
fn matvec_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let rows = matvec(lid, wg, groups, true, true);
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out16[rows.at + r * p.n] = f16(rows.v[r]); }
    }
}

// ---------------------------------------------------------------- entry points: matmul_<x>_<w>

fn bias4(j: u32) -> vec4<f32> {
    return vec4<f32>(bias_at(j), bias_at(j + 1u), bias_at(j + 2u), bias_at(j + 3u));
}

// out[at + c] = v[c] for the columns col + c inside out
fn put32(at: u32, col: u32, v: vec4<f32>) {
    if (col < p.n) { out32[at] = v.x; }
    if (col + 1u < p.n) { out32[at + 1u] = v.y; }
    if (col + 2u < p.n) { out32[at + 2u] = v.z; }
    if (col + 3u < p.n) { out32[at + 3u] = v.w; }
}

fn put16(at: u32, col: u32, v: vec4<f32>) {
    if (col < p.n) { out16[at] = f16(v.x); }
    if (col + 1u < p.n) { out16[at + 1u] = f16(v.y); }
    if (col + 2u < p.n) { out16[at + 2u] = f16(v.z); }
    if (col + 3u < p.n) { out16[at + 3u] = f16(v.w); }
}

fn store32(blk: Block, b: u32) {
    let lo = bias4(blk.col);
    let hi = bias4(blk.col + 4u);
    let at = (b * p.m + blk.row) * p.n + blk.col;
    if (blk.row < p.m) {
        put32(at, blk.col, blk.v[0] + lo);
        put32(at + 4u, blk.col + 4u, blk.v[1] + hi);
    }
    if (blk.row + 1u < p.m) {
        put32(at + p.n, blk.col, blk.v[2] + lo);
        put32(at + p.n + 4u, blk.col + 4u, blk.v[3] + hi);
    }
}

fn store16(blk: Block, b: u32) {
    let lo = bias4(blk.col);
    let hi = bias4(blk.col + 4u);
    let at = (b * p.m + blk.row) * p.n + blk.col;
    if (blk.row < p.m) {
        put16(at, blk.col, blk.v[0] + lo);
        put16(at + 4u, blk.col + 4u, blk.v[1] + hi);
    }
    if (blk.row + 1u < p.m) {
        put16(at + p.n, blk.col, blk.v[2] + lo);
        put16(at + p.n + 4u, blk.col + 4u, blk.v[3] + hi);
    }
}

@compute @workgroup_size(256)
fn matmul_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    store32(matmul_block(lid, wg, false, false), wg.z);
}

@compute @workgroup_size(256)
fn matmul_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    store32(matmul_block(lid, wg, false, true), wg.z);
}

@compute @workgroup_size(256)
fn matmul_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    store32(matmul_block(lid, wg, true, false), wg.z);
}

@compute @workgroup_size(256)
fn matmul_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    store16(matmul_block(lid, wg, true, true), wg.z);
}
