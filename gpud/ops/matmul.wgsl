// Matrix products (see gpud_protocol/ops/matmul.py for the interface): out = x @ w (+ bias), float32
// accumulation. The operands bind as raw 32-bit words (array<u32>) so that one body serves every pair
// of dtypes (a float16 or bfloat16 element is half a word: unpack2x16float, bf16_at); each entry point
// passes its operands' dtypes as constants (F32, F16, BF16) and writes its own output array: f16 when
// both operands are f16; bfloat16 (which WGSL lacks) as words written through atomics where two threads
// share one (gpud/ops/bf16.wgsl, added to this source by gpud.ops.source); else f32.
// Lavapipe stops a loop nest once it has made 65,535 iterations, those of the loops inside it counted
// every time they run: so the loops over K hold no loops (rows and tile steps are written out), and
// each makes K / 256 (matvec, w as (N, K)) or K / 16 (the others) iterations: K up to ~1M there.
enable f16;

const BLOCK: u32 = 256u;  // threads per workgroup
const ROWS: u32 = 8u;  // matvec: most rows of x per weight matrix
const COLS: u32 = 64u;  // matvec without wt: columns of out per workgroup (4 slices of K each)
const TILE: u32 = 64u;  // matmul: a TILE x TILE block of out per workgroup
const TK: u32 = 16u;  // matmul: the K step of a tile
const F32: u32 = 0u;  // an operand's dtype, a constant of each entry point
const F16: u32 = 1u;
const BF16: u32 = 2u;

struct Params { batch: u32, m: u32, n: u32, k: u32, x_stride: u32, w_stride: u32, wt: u32, epilogue: u32 }

@group(0) @binding(0) var<storage, read> xs: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<u32>;
@group(0) @binding(2) var<storage, read> bs: array<u32>;
@group(0) @binding(3) var<storage, read_write> out32: array<f32>;
@group(0) @binding(3) var<storage, read_write> out16: array<f16>;
@group(0) @binding(3) var<storage, read_write> outbf: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> red: array<f32, 2048>;  // matvec: ROWS x BLOCK partial sums

fn ld_x(i: u32, kind: u32) -> f32 {
    if (kind == F16) {
        return unpack2x16float(xs[i >> 1u])[i & 1u];
    }
    if (kind == BF16) {
        return bf16_at(xs[i >> 1u], i);
    }
    return bitcast<f32>(xs[i]);
}

fn ld_w(i: u32, kind: u32) -> f32 {
    if (kind == F16) {
        return unpack2x16float(ws[i >> 1u])[i & 1u];
    }
    if (kind == BF16) {
        return bf16_at(ws[i >> 1u], i);
    }
    return bitcast<f32>(ws[i]);
}

fn bias_at(j: u32) -> f32 {
    switch p.epilogue {
        case 1u: { return bitcast<f32>(bs[j]); }
        case 2u: { return unpack2x16float(bs[j >> 1u])[j & 1u]; }
        case 3u: { return bf16_at(bs[j >> 1u], j); }
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
fn mac_rows(acc: ptr<function, array<f32, 8>>, m: u32, xi: u32, k: u32, xk: u32, wv: f32) {
    (*acc)[0] = fma(ld_x(xi, xk), wv, (*acc)[0]);
    if (m > 1u) { (*acc)[1] = fma(ld_x(xi + k, xk), wv, (*acc)[1]); }
    if (m > 2u) { (*acc)[2] = fma(ld_x(xi + 2u * k, xk), wv, (*acc)[2]); }
    if (m > 3u) { (*acc)[3] = fma(ld_x(xi + 3u * k, xk), wv, (*acc)[3]); }
    if (m > 4u) { (*acc)[4] = fma(ld_x(xi + 4u * k, xk), wv, (*acc)[4]); }
    if (m > 5u) { (*acc)[5] = fma(ld_x(xi + 5u * k, xk), wv, (*acc)[5]); }
    if (m > 6u) { (*acc)[6] = fma(ld_x(xi + 6u * k, xk), wv, (*acc)[6]); }
    if (m > 7u) { (*acc)[7] = fma(ld_x(xi + 7u * k, xk), wv, (*acc)[7]); }
}

// What a matvec thread writes: out[at + i * n] = v[i] for i < m, if ok.
struct Rows { ok: bool, at: u32, v: array<f32, 8> }

// w is (N, K): threads_per_row(k) threads per row of w stride over K (K / 256 iterations each for a
// long K), then a tree sum per row.
fn matvec_nk(lid: u32, group: u32, b: u32, xk: u32, wk: u32) -> Rows {
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
            mac_rows(&acc, m, xrow + i, k, xk, ld_w(wrow + i, wk));
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
fn matvec_kn(lid: u32, group: u32, b: u32, xk: u32, wk: u32) -> Rows {
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
            mac_rows(&acc, m, xrow + i, k, xk, ld_w(wcol + i * n, wk));
            let i1 = i + slices;
            if (i1 < k) { mac_rows(&acc, m, xrow + i1, k, xk, ld_w(wcol + i1 * n, wk)); }
            let i2 = i1 + slices;
            if (i2 < k) { mac_rows(&acc, m, xrow + i2, k, xk, ld_w(wcol + i2 * n, wk)); }
            let i3 = i2 + slices;
            if (i3 < k) { mac_rows(&acc, m, xrow + i3, k, xk, ld_w(wcol + i3 * n, wk)); }
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

fn matvec(lid: u32, wg: vec3<u32>, groups: vec3<u32>, xk: u32, wk: u32) -> Rows {
    let group = wg.x + wg.y * groups.x;
    if (p.wt != 0u) {
        return matvec_nk(lid, group, wg.z, xk, wk);
    }
    return matvec_kn(lid, group, wg.z, xk, wk);
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

fn ld_xz(i: u32, ok: bool, kind: u32) -> f32 {
    return select(0.0, ld_x(i, kind), ok);  // a load past the buffer reads 0 or some element (WGSL), never faults
}

fn ld_wz(i: u32, ok: bool, kind: u32) -> f32 {
    return select(0.0, ld_w(i, kind), ok);
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

fn matmul_block(lid: u32, wg: vec3<u32>, xk: u32, wk: u32) -> Block {
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
        tiles[e * PAD + q] = vec4<f32>(ld_xz(xi, xin.x, xk), ld_xz(xi + k, xin.y, xk),
                                       ld_xz(xi + 2u * k, xin.z, xk), ld_xz(xi + 3u * k, xin.w, xk));
        let win = w_cols & vec4<bool>(k0 + we < k);
        let w_at = WTILE + we * PAD + wq;
        tiles[w_at] = vec4<f32>(ld_wz(wi, win.x, wk), ld_wz(wi + w_next, win.y, wk),
                                ld_wz(wi + 2u * w_next, win.z, wk), ld_wz(wi + 3u * w_next, win.w, wk));
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

// ---------------------------------------------------------------- outputs

// bfloat16 element i of out rounded from v, the other half of its word kept (another thread's)
fn put_bf(i: u32, v: f32) {
    atomicAnd(&outbf[i >> 1u], bf16_keep(i));
    atomicOr(&outbf[i >> 1u], bf16_put(v, i));
}

fn matvec_store32(rows: Rows) {
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out32[rows.at + r * p.n] = rows.v[r]; }
    }
}

fn matvec_store16(rows: Rows) {
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { out16[rows.at + r * p.n] = f16(rows.v[r]); }
    }
}

fn matvec_storebf(rows: Rows) {
    if (rows.ok) {
        for (var r = 0u; r < min(p.m, ROWS); r++) { put_bf(rows.at + r * p.n, rows.v[r]); }
    }
}

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

// out[at + c] = v[c] for the columns col + c inside out, in bfloat16: whole words where the thread owns
// both halves (no other thread writes them), atomics at a row's ends
fn putbf(at: u32, col: u32, v: vec4<f32>) {
    if ((at & 1u) == 0u && col + 3u < p.n) {
        atomicStore(&outbf[at >> 1u], bf16_put(v.x, 0u) | bf16_put(v.y, 1u));
        atomicStore(&outbf[(at >> 1u) + 1u], bf16_put(v.z, 0u) | bf16_put(v.w, 1u));
        return;
    }
    if (col < p.n) { put_bf(at, v.x); }
    if (col + 1u < p.n) { put_bf(at + 1u, v.y); }
    if (col + 2u < p.n) { put_bf(at + 2u, v.z); }
    if (col + 3u < p.n) { put_bf(at + 3u, v.w); }
}

fn storebf(blk: Block, b: u32) {
    let lo = bias4(blk.col);
    let hi = bias4(blk.col + 4u);
    let at = (b * p.m + blk.row) * p.n + blk.col;
    if (blk.row < p.m) {
        putbf(at, blk.col, blk.v[0] + lo);
        putbf(at + 4u, blk.col + 4u, blk.v[1] + hi);
    }
    if (blk.row + 1u < p.m) {
        putbf(at + p.n, blk.col, blk.v[2] + lo);
        putbf(at + p.n + 4u, blk.col + 4u, blk.v[3] + hi);
    }
}

// ---------------------------------------------------------------- entry points: matvec_<x>_<w>, matmul_<x>_<w>
// (the pairs of PAIRS in gpud_protocol/ops/matmul.py: every pair of F32, F16, BF16 but F16 with BF16)

@compute @workgroup_size(256)
fn matvec_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store32(matvec(lid, wg, groups, F32, F32)); }
}

@compute @workgroup_size(256)
fn matvec_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store32(matvec(lid, wg, groups, F32, F16)); }
}

@compute @workgroup_size(256)
fn matvec_f32_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store32(matvec(lid, wg, groups, F32, BF16)); }
}

@compute @workgroup_size(256)
fn matvec_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store32(matvec(lid, wg, groups, F16, F32)); }
}

@compute @workgroup_size(256)
fn matvec_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store16(matvec(lid, wg, groups, F16, F16)); }
}

@compute @workgroup_size(256)
fn matvec_bf16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_store32(matvec(lid, wg, groups, BF16, F32)); }
}

@compute @workgroup_size(256)
fn matvec_bf16_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    if (wg.z < p.batch) { matvec_storebf(matvec(lid, wg, groups, BF16, BF16)); }
}

@compute @workgroup_size(256)
fn matmul_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store32(matmul_block(lid, wg, F32, F32), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store32(matmul_block(lid, wg, F32, F16), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_f32_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store32(matmul_block(lid, wg, F32, BF16), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store32(matmul_block(lid, wg, F16, F32), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store16(matmul_block(lid, wg, F16, F16), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_bf16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { store32(matmul_block(lid, wg, BF16, F32), wg.z); }
}

@compute @workgroup_size(256)
fn matmul_bf16_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { storebf(matmul_block(lid, wg, BF16, BF16), wg.z); }
}

// ---------------------------------------------------------------- matmul_nk: for CPU-backed Vulkan
// w as (N, K) (transpose_w), K a multiple of 8 (gpud_protocol/ops/matmul_nk.py: nk_applies). Lavapipe runs
// 8 invocations in the lanes of a SIMD register: arithmetic is one instruction for all 8, but a load from
// a buffer or workgroup memory is a loop over the lanes (~1 cycle per lane and 32-bit word, uniform
// address or not), so the loads per product decide the speed; and a version of this kernel that staged
// tiles through workgroup memory ran at half the speed (each barrier is a coroutine switch there). So no
// workgroup memory and no barrier: each thread computes an NK_BLOCK x NK_BLOCK block of out as dot
// products of rows of x and of w, loading both straight from the operands 8 K-elements at a time (one
// vec4<u32> of float16 or bfloat16, two of float32), each load serving NK_BLOCK dot products: 24 loads
// per 144 dot products of 8. 8 x 8 threads make an NK_TILE x NK_TILE tile of out. Rows and columns past
// out load its last row or column (their results are dropped). The K loop is the kernel's only loop
// (K / 8 iterations: lavapipe's budget of 65,535 is the invocation's, for loops one after the other
// too), and the block lives in registers (written out: an array indexed by a variable anywhere would
// not). Measured on llvmpipe: ~4x the tiled kernel's rate on MiniLM's products. On a GPU the block does
// not fit in registers: the tiled kernel above serves GPUs.
const NK_BLOCK: u32 = 12u;
const NK_TILE: u32 = 96u;

@group(0) @binding(0) var<storage, read> xv: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> wv: array<vec4<u32>>;

// 8 consecutive elements along K, as float32
struct K8 { lo: vec4<f32>, hi: vec4<f32> }

fn k8_of_halves(v: vec4<u32>, kind: u32) -> K8 {
    if (kind == BF16) {
        return K8(vec4<f32>(bf16_pair(v.x), bf16_pair(v.y)), vec4<f32>(bf16_pair(v.z), bf16_pair(v.w)));
    }
    return K8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)),
              vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}

// elements e..e + 7 of x (e a multiple of 8)
fn ld8_x(e: u32, kind: u32) -> K8 {
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(xv[e / 4u]), bitcast<vec4<f32>>(xv[e / 4u + 1u]));
    }
    return k8_of_halves(xv[e / 8u], kind);
}

fn ld8_w(e: u32, kind: u32) -> K8 {
    if (kind == F32) {
        return K8(bitcast<vec4<f32>>(wv[e / 4u]), bitcast<vec4<f32>>(wv[e / 4u + 1u]));
    }
    return k8_of_halves(wv[e / 8u], kind);
}

fn dot8(x: K8, w: K8) -> f32 {
    return dot(x.lo, w.lo) + dot(x.hi, w.hi);
}

fn dot8x4(x: K8, w0: K8, w1: K8, w2: K8, w3: K8) -> vec4<f32> {
    return vec4<f32>(dot8(x, w0), dot8(x, w1), dot8(x, w2), dot8(x, w3));
}

// 8 K-elements of a thread's NK_BLOCK rows of w
struct W12 { c0: K8, c1: K8, c2: K8, c3: K8, c4: K8, c5: K8, c6: K8, c7: K8, c8: K8, c9: K8, c10: K8, c11: K8 }

// one row of a thread's block of out: NK_BLOCK columns as three vec4
struct R12 { a: vec4<f32>, b: vec4<f32>, c: vec4<f32> }

// a thread's block of out
struct Acc12 {
    r0: R12, r1: R12, r2: R12, r3: R12, r4: R12, r5: R12, r6: R12, r7: R12, r8: R12, r9: R12, r10: R12, r11: R12,
}

fn ld_w12(at: array<u32, 12>, e: u32, kind: u32) -> W12 {
    return W12(ld8_w(at[0] + e, kind), ld8_w(at[1] + e, kind), ld8_w(at[2] + e, kind), ld8_w(at[3] + e, kind),
               ld8_w(at[4] + e, kind), ld8_w(at[5] + e, kind), ld8_w(at[6] + e, kind), ld8_w(at[7] + e, kind),
               ld8_w(at[8] + e, kind), ld8_w(at[9] + e, kind), ld8_w(at[10] + e, kind), ld8_w(at[11] + e, kind));
}

fn mac_row(r: R12, x: K8, w: W12) -> R12 {
    return R12(r.a + dot8x4(x, w.c0, w.c1, w.c2, w.c3), r.b + dot8x4(x, w.c4, w.c5, w.c6, w.c7),
               r.c + dot8x4(x, w.c8, w.c9, w.c10, w.c11));
}

// The thread's first row and column of out
fn nk_origin(lid: u32, wg: vec3<u32>) -> vec2<u32> {
    return vec2<u32>(wg.y * NK_TILE + (lid / 8u) * NK_BLOCK, wg.x * NK_TILE + (lid % 8u) * NK_BLOCK);
}

// Where rows first..first + 11 (at most `last`) of a matrix of k columns start, from `base`: written out,
// not looped (lavapipe's budget of loop iterations is the invocation's, the K loop's too)
fn nk_starts(base: u32, first: u32, last: u32, k: u32) -> array<u32, 12> {
    return array<u32, 12>(base + min(first, last) * k, base + min(first + 1u, last) * k,
                          base + min(first + 2u, last) * k, base + min(first + 3u, last) * k,
                          base + min(first + 4u, last) * k, base + min(first + 5u, last) * k,
                          base + min(first + 6u, last) * k, base + min(first + 7u, last) * k,
                          base + min(first + 8u, last) * k, base + min(first + 9u, last) * k,
                          base + min(first + 10u, last) * k, base + min(first + 11u, last) * k);
}

fn nk_block(lid: u32, wg: vec3<u32>, xk: u32, wk: u32) -> Acc12 {
    let m = p.m;
    let n = p.n;
    let k = p.k;
    let origin = nk_origin(lid, wg);
    let xa = nk_starts(wg.z * p.x_stride, origin.x, m - 1u, k);
    let wa = nk_starts(wg.z * p.w_stride, origin.y, n - 1u, k);
    var acc: Acc12;
    for (var e = 0u; e < k; e += 8u) {
        let w = ld_w12(wa, e, wk);
        acc.r0 = mac_row(acc.r0, ld8_x(xa[0] + e, xk), w);
        acc.r1 = mac_row(acc.r1, ld8_x(xa[1] + e, xk), w);
        acc.r2 = mac_row(acc.r2, ld8_x(xa[2] + e, xk), w);
        acc.r3 = mac_row(acc.r3, ld8_x(xa[3] + e, xk), w);
        acc.r4 = mac_row(acc.r4, ld8_x(xa[4] + e, xk), w);
        acc.r5 = mac_row(acc.r5, ld8_x(xa[5] + e, xk), w);
        acc.r6 = mac_row(acc.r6, ld8_x(xa[6] + e, xk), w);
        acc.r7 = mac_row(acc.r7, ld8_x(xa[7] + e, xk), w);
        acc.r8 = mac_row(acc.r8, ld8_x(xa[8] + e, xk), w);
        acc.r9 = mac_row(acc.r9, ld8_x(xa[9] + e, xk), w);
        acc.r10 = mac_row(acc.r10, ld8_x(xa[10] + e, xk), w);
        acc.r11 = mac_row(acc.r11, ld8_x(xa[11] + e, xk), w);
    }
    return acc;
}

// What a matmul_nk thread writes: row first + i of out from its block's row i, + bias, at columns col..
struct NkOut { first: u32, col: u32, at: u32, bias: R12 }

fn nk_out(lid: u32, wg: vec3<u32>) -> NkOut {
    let o = nk_origin(lid, wg);
    return NkOut(o.x, o.y, (wg.z * p.m + o.x) * p.n + o.y, R12(bias4(o.y), bias4(o.y + 4u), bias4(o.y + 8u)));
}

fn nk_row32(o: NkOut, i: u32, r: R12) {
    if (o.first + i < p.m) {
        let at = o.at + i * p.n;
        put32(at, o.col, r.a + o.bias.a);
        put32(at + 4u, o.col + 4u, r.b + o.bias.b);
        put32(at + 8u, o.col + 8u, r.c + o.bias.c);
    }
}

fn nk_store32(o: NkOut, a: Acc12) {
    nk_row32(o, 0u, a.r0);
    nk_row32(o, 1u, a.r1);
    nk_row32(o, 2u, a.r2);
    nk_row32(o, 3u, a.r3);
    nk_row32(o, 4u, a.r4);
    nk_row32(o, 5u, a.r5);
    nk_row32(o, 6u, a.r6);
    nk_row32(o, 7u, a.r7);
    nk_row32(o, 8u, a.r8);
    nk_row32(o, 9u, a.r9);
    nk_row32(o, 10u, a.r10);
    nk_row32(o, 11u, a.r11);
}

fn nk_row16(o: NkOut, i: u32, r: R12) {
    if (o.first + i < p.m) {
        let at = o.at + i * p.n;
        put16(at, o.col, r.a + o.bias.a);
        put16(at + 4u, o.col + 4u, r.b + o.bias.b);
        put16(at + 8u, o.col + 8u, r.c + o.bias.c);
    }
}

fn nk_store16(o: NkOut, a: Acc12) {
    nk_row16(o, 0u, a.r0);
    nk_row16(o, 1u, a.r1);
    nk_row16(o, 2u, a.r2);
    nk_row16(o, 3u, a.r3);
    nk_row16(o, 4u, a.r4);
    nk_row16(o, 5u, a.r5);
    nk_row16(o, 6u, a.r6);
    nk_row16(o, 7u, a.r7);
    nk_row16(o, 8u, a.r8);
    nk_row16(o, 9u, a.r9);
    nk_row16(o, 10u, a.r10);
    nk_row16(o, 11u, a.r11);
}

fn nk_rowbf(o: NkOut, i: u32, r: R12) {
    if (o.first + i < p.m) {
        let at = o.at + i * p.n;
        putbf(at, o.col, r.a + o.bias.a);
        putbf(at + 4u, o.col + 4u, r.b + o.bias.b);
        putbf(at + 8u, o.col + 8u, r.c + o.bias.c);
    }
}

fn nk_storebf(o: NkOut, a: Acc12) {
    nk_rowbf(o, 0u, a.r0);
    nk_rowbf(o, 1u, a.r1);
    nk_rowbf(o, 2u, a.r2);
    nk_rowbf(o, 3u, a.r3);
    nk_rowbf(o, 4u, a.r4);
    nk_rowbf(o, 5u, a.r5);
    nk_rowbf(o, 6u, a.r6);
    nk_rowbf(o, 7u, a.r7);
    nk_rowbf(o, 8u, a.r8);
    nk_rowbf(o, 9u, a.r9);
    nk_rowbf(o, 10u, a.r10);
    nk_rowbf(o, 11u, a.r11);
}

// entry points matmul_nk_<x>_<w> (the PAIRS), out as matmul_<x>_<w>'s

@compute @workgroup_size(64)
fn matmul_nk_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store32(nk_out(lid, wg), nk_block(lid, wg, F32, F32)); }
}

@compute @workgroup_size(64)
fn matmul_nk_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store32(nk_out(lid, wg), nk_block(lid, wg, F32, F16)); }
}

@compute @workgroup_size(64)
fn matmul_nk_f32_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store32(nk_out(lid, wg), nk_block(lid, wg, F32, BF16)); }
}

@compute @workgroup_size(64)
fn matmul_nk_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store32(nk_out(lid, wg), nk_block(lid, wg, F16, F32)); }
}

@compute @workgroup_size(64)
fn matmul_nk_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store16(nk_out(lid, wg), nk_block(lid, wg, F16, F16)); }
}

@compute @workgroup_size(64)
fn matmul_nk_bf16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_store32(nk_out(lid, wg), nk_block(lid, wg, BF16, F32)); }
}

@compute @workgroup_size(64)
fn matmul_nk_bf16_bf16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z < p.batch) { nk_storebf(nk_out(lid, wg), nk_block(lid, wg, BF16, BF16)); }
}
