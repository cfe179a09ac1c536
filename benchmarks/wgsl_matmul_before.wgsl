// The matmul_<x>_<w> kernels of gpud/ops/matmul.wgsl before the split-K 8 x 8 tiles (git 112914c),
// kept as the "before" of benchmarks/wgsl_matmul.py (a user kernel there, same interface): a 64 x 64
// block of out per workgroup of 256 threads, 4 x 4 per thread, scalar workgroup-memory loads.
enable f16;

const BLOCK: u32 = 256u;  // threads per workgroup
const TILE: u32 = 64u;  // matmul: a TILE x TILE block of out per workgroup, 4 x 4 per thread
const TK: u32 = 16u;  // matmul: the K step of a tile

struct Params { batch: u32, m: u32, n: u32, k: u32, x_stride: u32, w_stride: u32, wt: u32, bias_kind: u32 }

@group(0) @binding(0) var<storage, read> xs: array<u32>;
@group(0) @binding(1) var<storage, read> ws: array<u32>;
@group(0) @binding(2) var<storage, read> bs: array<u32>;
@group(0) @binding(3) var<storage, read_write> out32: array<f32>;
@group(0) @binding(3) var<storage, read_write> out16: array<f16>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> ta: array<f32, 1024>;  // matmul: the x tile, [TK][TILE]
var<workgroup> tb: array<f32, 1024>;  // matmul: the w tile, [TK][TILE]

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

// What a matmul thread writes: out[row + i, col + j] = v[i][j] where in bounds.
struct Block { row: u32, col: u32, v: array<vec4<f32>, 4> }

// One element of the x tile: row lr of the block, K offset kk (zero outside x)
fn tile_x(row: u32, kk: u32, xb: u32, xh: bool) -> f32 {
    if (row < p.m && kk < p.k) {
        return ld_x(xb + row * p.k + kk, xh);
    }
    return 0.0;
}

// One element of the w tile: column col of out, K offset kk (zero outside w)
fn tile_w(col: u32, kk: u32, wb: u32, wh: bool) -> f32 {
    if (col < p.n && kk < p.k) {
        if (p.wt != 0u) {
            return ld_w(wb + col * p.k + kk, wh);
        }
        return ld_w(wb + kk * p.n + col, wh);
    }
    return 0.0;
}

// acc += (column kk of the x tile) x (row kk of the w tile), for this thread's 4 x 4 elements
fn mac_tile(acc: ptr<function, array<vec4<f32>, 4>>, kk: u32, tx: u32, ty: u32) {
    let ai = kk * TILE + ty * 4u;
    let bi = kk * TILE + tx * 4u;
    let bv = vec4<f32>(tb[bi], tb[bi + 1u], tb[bi + 2u], tb[bi + 3u]);
    (*acc)[0] = fma(vec4<f32>(ta[ai]), bv, (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(ta[ai + 1u]), bv, (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(ta[ai + 2u]), bv, (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(ta[ai + 3u]), bv, (*acc)[3]);
}

// A TILE x TILE block of out: tiles of x and w through workgroup memory, K in steps of TK. The step's
// loads and products are written out (no inner loops): K / TK iterations.
fn matmul_block(lid: u32, wg: vec3<u32>, xh: bool, wh: bool) -> Block {
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    let xb = wg.z * p.x_stride;
    let wb = wg.z * p.w_stride;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let lr = lid / 4u;  // x (and w with wt) tile: row lr, K offsets lk..lk+3
    let lk = (lid % 4u) * 4u;
    let nk = lid / 16u;  // w tile without wt: K offset nk, columns nc..nc+3
    let nc = (lid % 16u) * 4u;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        ta[lk * TILE + lr] = tile_x(row0 + lr, k0 + lk, xb, xh);
        ta[(lk + 1u) * TILE + lr] = tile_x(row0 + lr, k0 + lk + 1u, xb, xh);
        ta[(lk + 2u) * TILE + lr] = tile_x(row0 + lr, k0 + lk + 2u, xb, xh);
        ta[(lk + 3u) * TILE + lr] = tile_x(row0 + lr, k0 + lk + 3u, xb, xh);
        if (p.wt != 0u) {
            tb[lk * TILE + lr] = tile_w(col0 + lr, k0 + lk, wb, wh);
            tb[(lk + 1u) * TILE + lr] = tile_w(col0 + lr, k0 + lk + 1u, wb, wh);
            tb[(lk + 2u) * TILE + lr] = tile_w(col0 + lr, k0 + lk + 2u, wb, wh);
            tb[(lk + 3u) * TILE + lr] = tile_w(col0 + lr, k0 + lk + 3u, wb, wh);
        } else {
            tb[nk * TILE + nc] = tile_w(col0 + nc, k0 + nk, wb, wh);
            tb[nk * TILE + nc + 1u] = tile_w(col0 + nc + 1u, k0 + nk, wb, wh);
            tb[nk * TILE + nc + 2u] = tile_w(col0 + nc + 2u, k0 + nk, wb, wh);
            tb[nk * TILE + nc + 3u] = tile_w(col0 + nc + 3u, k0 + nk, wb, wh);
        }
        workgroupBarrier();
        mac_tile(&acc, 0u, tx, ty);
        mac_tile(&acc, 1u, tx, ty);
        mac_tile(&acc, 2u, tx, ty);
        mac_tile(&acc, 3u, tx, ty);
        mac_tile(&acc, 4u, tx, ty);
        mac_tile(&acc, 5u, tx, ty);
        mac_tile(&acc, 6u, tx, ty);
        mac_tile(&acc, 7u, tx, ty);
        mac_tile(&acc, 8u, tx, ty);
        mac_tile(&acc, 9u, tx, ty);
        mac_tile(&acc, 10u, tx, ty);
        mac_tile(&acc, 11u, tx, ty);
        mac_tile(&acc, 12u, tx, ty);
        mac_tile(&acc, 13u, tx, ty);
        mac_tile(&acc, 14u, tx, ty);
        mac_tile(&acc, 15u, tx, ty);
        workgroupBarrier();
    }
    return Block(row0 + ty * 4u, col0 + tx * 4u, acc);
}

// ---------------------------------------------------------------- entry points: matmul_<x>_<w>

@compute @workgroup_size(256)
fn matmul_f32_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let blk = matmul_block(lid, wg, false, false);
    let base = wg.z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            if (blk.row + i < p.m && blk.col + j < p.n) {
                out32[base + (blk.row + i) * p.n + blk.col + j] = blk.v[i][j] + bias_at(blk.col + j);
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_f32_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let blk = matmul_block(lid, wg, false, true);
    let base = wg.z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            if (blk.row + i < p.m && blk.col + j < p.n) {
                out32[base + (blk.row + i) * p.n + blk.col + j] = blk.v[i][j] + bias_at(blk.col + j);
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_f16_f32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let blk = matmul_block(lid, wg, true, false);
    let base = wg.z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            if (blk.row + i < p.m && blk.col + j < p.n) {
                out32[base + (blk.row + i) * p.n + blk.col + j] = blk.v[i][j] + bias_at(blk.col + j);
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_f16_f16(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    if (wg.z >= p.batch) { return; }
    let blk = matmul_block(lid, wg, true, true);
    let base = wg.z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            if (blk.row + i < p.m && blk.col + j < p.n) {
                out16[base + (blk.row + i) * p.n + blk.col + j] = f16(blk.v[i][j] + bias_at(blk.col + j));
            }
        }
    }
}
