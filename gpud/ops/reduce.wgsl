// Reductions over the last axis of x (see gpud_protocol/ops/reduce.py for the interface).
// One workgroup of 256 threads per row, the grid folded into y past 65,535 rows. The threads stride
// over the row (no loop runs more than length / 256 <= 65,535 times: lavapipe cuts longer loops),
// then a tree in workgroup memory combines their partial results. Everything accumulates in float32;
// float16 is read into float32 and rounded once when stored. bfloat16, which WGSL lacks, is bound as
// array<u32> (two to a word) and written through array<atomic<u32>>: the two halves of a word may
// belong to two threads, or to two rows' workgroups.
enable f16;

const BLOCK: u32 = 256u;
const LOWEST: f32 = -3.40282347e38;  // the most negative finite f32: only -inf is below it

struct Reduce { rows: u32, length: u32, op: u32 }
struct Rows { rows: u32, length: u32 }
struct Masked { rows: u32, length: u32, mask_rows: u32 }
struct Norm { rows: u32, length: u32, eps: f32 }

var<workgroup> red: array<f32, 256>;
var<workgroup> red2: array<f32, 256>;
var<workgroup> redi: array<u32, 256>;

fn row_of(wid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return wid.x + wid.y * groups.x;
}

// The sum of every thread's v, returned to every thread.
fn tree_sum(t: u32, v: f32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = BLOCK / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            red[t] = red[t] + red[t + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();  // every thread read it before a later tree writes
    return total;
}

fn tree_max(t: u32, v: f32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = BLOCK / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            red[t] = max_nan(red[t], red[t + s]);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// The index of the largest v (the first NaN if any), the smallest such index on ties.
fn tree_argmax(t: u32, v: f32, i: u32) -> u32 {
    red[t] = v;
    redi[t] = i;
    workgroupBarrier();
    for (var s = BLOCK / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            let w = red[t + s];
            let j = redi[t + s];
            if (wins(w, j, red[t], redi[t])) {
                red[t] = w;
                redi[t] = j;
            }
        }
        workgroupBarrier();
    }
    let best = redi[0];
    workgroupBarrier();
    return best;
}

// Softmax's running (max m, sum of exp(v - m)) after v joins it. Starting from (LOWEST, 0), a -inf
// v adds exp(-inf) = 0, so a row of only -inf ends with a sum of 0.
fn online(ms: vec2<f32>, v: f32) -> vec2<f32> {
    if (v > ms.x) {
        return vec2<f32>(v, ms.y * exp(ms.x - v) + 1.0);
    }
    return vec2<f32>(ms.x, ms.y + exp(v - ms.x));
}

fn tree_online(t: u32, ms: vec2<f32>) -> vec2<f32> {
    red[t] = ms.x;
    red2[t] = ms.y;
    workgroupBarrier();
    for (var s = BLOCK / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            let a = red[t];
            let b = red[t + s];
            let m = max(a, b);
            red2[t] = red2[t] * exp(a - m) + red2[t + s] * exp(b - m);
            red[t] = m;
        }
        workgroupBarrier();
    }
    let total = vec2<f32>(red[0], red2[0]);
    workgroupBarrier();
    return total;
}

// 1 / the softmax's sum, or 0 for a row of only -inf (its outputs are zeros, not NaN); a row holding
// NaN has a NaN sum, and all its outputs are NaN (as numpy's).
fn inverse_sum(ms: vec2<f32>) -> f32 {
    return select(0.0, 1.0 / ms.y, ms.y > 0.0 || is_nan(ms.y));
}

@group(0) @binding(0) var<storage, read> reduce_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> reduce_f32_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_f32_p: Reduce;

@compute @workgroup_size(256)
fn reduce_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= reduce_f32_p.rows) {
        return;
    }
    let n = reduce_f32_p.length;
    let base = row * n;
    var total: f32;
    if (reduce_f32_p.op == 2u) {
        var m = reduce_f32_x[base];  // element 0 is every thread's: the max needs no -inf to start from
        for (var j = t; j < n; j += BLOCK) {
            m = max_nan(m, reduce_f32_x[base + j]);
        }
        total = tree_max(t, m);
    } else {
        var acc = 0.0;
        for (var j = t; j < n; j += BLOCK) {
            acc += reduce_f32_x[base + j];
        }
        total = tree_sum(t, acc);
        if (reduce_f32_p.op == 1u) {
            total = total / f32(n);
        }
    }
    if (t == 0u) {
        reduce_f32_out[row] = total;
    }
}

@group(0) @binding(0) var<storage, read> reduce_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> reduce_f16_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_f16_p: Reduce;

@compute @workgroup_size(256)
fn reduce_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= reduce_f16_p.rows) {
        return;
    }
    let n = reduce_f16_p.length;
    let base = row * n;
    var total: f32;
    if (reduce_f16_p.op == 2u) {
        var m = f32(reduce_f16_x[base]);  // element 0 is every thread's: the max needs no -inf to start from
        for (var j = t; j < n; j += BLOCK) {
            m = max_nan(m, f32(reduce_f16_x[base + j]));
        }
        total = tree_max(t, m);
    } else {
        var acc = 0.0;
        for (var j = t; j < n; j += BLOCK) {
            acc += f32(reduce_f16_x[base + j]);
        }
        total = tree_sum(t, acc);
        if (reduce_f16_p.op == 1u) {
            total = total / f32(n);
        }
    }
    if (t == 0u) {
        reduce_f16_out[row] = total;
    }
}

@group(0) @binding(0) var<storage, read> argmax_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> argmax_f32_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_f32_p: Rows;

@compute @workgroup_size(256)
fn argmax_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= argmax_f32_p.rows) {
        return;
    }
    let n = argmax_f32_p.length;
    let base = row * n;
    var best = argmax_f32_x[base];  // element 0 first: ties keep the smaller index
    var at = 0u;
    for (var j = t; j < n; j += BLOCK) {
        let v = argmax_f32_x[base + j];
        if (above(v, best)) {
            best = v;
            at = j;
        }
    }
    let i = tree_argmax(t, best, at);
    if (t == 0u) {
        argmax_f32_out[row] = i32(i);
    }
}

@group(0) @binding(0) var<storage, read> argmax_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> argmax_f16_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_f16_p: Rows;

@compute @workgroup_size(256)
fn argmax_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
              @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= argmax_f16_p.rows) {
        return;
    }
    let n = argmax_f16_p.length;
    let base = row * n;
    var best = f32(argmax_f16_x[base]);  // element 0 first: ties keep the smaller index
    var at = 0u;
    for (var j = t; j < n; j += BLOCK) {
        let v = f32(argmax_f16_x[base + j]);
        if (above(v, best)) {
            best = v;
            at = j;
        }
    }
    let i = tree_argmax(t, best, at);
    if (t == 0u) {
        argmax_f16_out[row] = i32(i);
    }
}

@group(0) @binding(0) var<storage, read> softmax_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> softmax_f32_out: array<f32>;
@group(0) @binding(2) var<uniform> softmax_f32_p: Rows;

@compute @workgroup_size(256)
fn softmax_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_f32_p.rows) {
        return;
    }
    let n = softmax_f32_p.length;
    let base = row * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, softmax_f32_x[base + j]);
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        softmax_f32_out[base + j] = exp(softmax_f32_x[base + j] - ms.x) * scale;
    }
}

@group(0) @binding(0) var<storage, read> softmax_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> softmax_f16_out: array<f16>;
@group(0) @binding(2) var<uniform> softmax_f16_p: Rows;

@compute @workgroup_size(256)
fn softmax_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_f16_p.rows) {
        return;
    }
    let n = softmax_f16_p.length;
    let base = row * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, f32(softmax_f16_x[base + j]));
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        softmax_f16_out[base + j] = f16(exp(f32(softmax_f16_x[base + j]) - ms.x) * scale);
    }
}

@group(0) @binding(0) var<storage, read> softmax_mask_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read> softmax_mask_f32_mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> softmax_mask_f32_out: array<f32>;
@group(0) @binding(3) var<uniform> softmax_mask_f32_p: Masked;

@compute @workgroup_size(256)
fn softmax_mask_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_mask_f32_p.rows) {
        return;
    }
    let n = softmax_mask_f32_p.length;
    let base = row * n;
    let mbase = (row % softmax_mask_f32_p.mask_rows) * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, softmax_mask_f32_x[base + j] + softmax_mask_f32_mask[mbase + j]);
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        softmax_mask_f32_out[base + j] = exp(softmax_mask_f32_x[base + j] + softmax_mask_f32_mask[mbase + j] - ms.x) * scale;
    }
}

@group(0) @binding(0) var<storage, read> softmax_mask_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read> softmax_mask_f16_mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> softmax_mask_f16_out: array<f16>;
@group(0) @binding(3) var<uniform> softmax_mask_f16_p: Masked;

@compute @workgroup_size(256)
fn softmax_mask_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_mask_f16_p.rows) {
        return;
    }
    let n = softmax_mask_f16_p.length;
    let base = row * n;
    let mbase = (row % softmax_mask_f16_p.mask_rows) * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, f32(softmax_mask_f16_x[base + j]) + softmax_mask_f16_mask[mbase + j]);
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        softmax_mask_f16_out[base + j] = f16(exp(f32(softmax_mask_f16_x[base + j]) + softmax_mask_f16_mask[mbase + j] - ms.x) * scale);
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f32_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read> rmsnorm_f32_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f32_f32_out: array<f32>;
@group(0) @binding(3) var<uniform> rmsnorm_f32_f32_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f32_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f32_f32_p.rows) {
        return;
    }
    let n = rmsnorm_f32_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = rmsnorm_f32_f32_x[base + j];
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f32_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        rmsnorm_f32_f32_out[base + j] = rmsnorm_f32_f32_x[base + j] * r * rmsnorm_f32_f32_weight[j];
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f32_f16_x: array<f32>;
@group(0) @binding(1) var<storage, read> rmsnorm_f32_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f32_f16_out: array<f32>;
@group(0) @binding(3) var<uniform> rmsnorm_f32_f16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f32_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f32_f16_p.rows) {
        return;
    }
    let n = rmsnorm_f32_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = rmsnorm_f32_f16_x[base + j];
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f32_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        rmsnorm_f32_f16_out[base + j] = rmsnorm_f32_f16_x[base + j] * r * f32(rmsnorm_f32_f16_weight[j]);
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f16_f32_x: array<f16>;
@group(0) @binding(1) var<storage, read> rmsnorm_f16_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f16_f32_out: array<f16>;
@group(0) @binding(3) var<uniform> rmsnorm_f16_f32_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f16_f32_p.rows) {
        return;
    }
    let n = rmsnorm_f16_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = f32(rmsnorm_f16_f32_x[base + j]);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f16_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        rmsnorm_f16_f32_out[base + j] = f16(f32(rmsnorm_f16_f32_x[base + j]) * r * rmsnorm_f16_f32_weight[j]);
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f16_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read> rmsnorm_f16_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f16_f16_out: array<f16>;
@group(0) @binding(3) var<uniform> rmsnorm_f16_f16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f16_f16_p.rows) {
        return;
    }
    let n = rmsnorm_f16_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = f32(rmsnorm_f16_f16_x[base + j]);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f16_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        rmsnorm_f16_f16_out[base + j] = f16(f32(rmsnorm_f16_f16_x[base + j]) * r * f32(rmsnorm_f16_f16_weight[j]));
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f32_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read> layernorm_f32_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read> layernorm_f32_f32_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> layernorm_f32_f32_out: array<f32>;
@group(0) @binding(4) var<uniform> layernorm_f32_f32_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f32_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f32_f32_p.rows) {
        return;
    }
    let n = layernorm_f32_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += layernorm_f32_f32_x[base + j];
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = layernorm_f32_f32_x[base + j] - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f32_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        layernorm_f32_f32_out[base + j] = (layernorm_f32_f32_x[base + j] - mean) * r * layernorm_f32_f32_weight[j] + layernorm_f32_f32_bias[j];
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f32_f16_x: array<f32>;
@group(0) @binding(1) var<storage, read> layernorm_f32_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read> layernorm_f32_f16_bias: array<f16>;
@group(0) @binding(3) var<storage, read_write> layernorm_f32_f16_out: array<f32>;
@group(0) @binding(4) var<uniform> layernorm_f32_f16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f32_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f32_f16_p.rows) {
        return;
    }
    let n = layernorm_f32_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += layernorm_f32_f16_x[base + j];
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = layernorm_f32_f16_x[base + j] - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f32_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        layernorm_f32_f16_out[base + j] = (layernorm_f32_f16_x[base + j] - mean) * r * f32(layernorm_f32_f16_weight[j]) + f32(layernorm_f32_f16_bias[j]);
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f16_f32_x: array<f16>;
@group(0) @binding(1) var<storage, read> layernorm_f16_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read> layernorm_f16_f32_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> layernorm_f16_f32_out: array<f16>;
@group(0) @binding(4) var<uniform> layernorm_f16_f32_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f16_f32_p.rows) {
        return;
    }
    let n = layernorm_f16_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += f32(layernorm_f16_f32_x[base + j]);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = f32(layernorm_f16_f32_x[base + j]) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f16_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        layernorm_f16_f32_out[base + j] = f16((f32(layernorm_f16_f32_x[base + j]) - mean) * r * layernorm_f16_f32_weight[j] + layernorm_f16_f32_bias[j]);
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f16_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read> layernorm_f16_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read> layernorm_f16_f16_bias: array<f16>;
@group(0) @binding(3) var<storage, read_write> layernorm_f16_f16_out: array<f16>;
@group(0) @binding(4) var<uniform> layernorm_f16_f16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f16_f16_p.rows) {
        return;
    }
    let n = layernorm_f16_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += f32(layernorm_f16_f16_x[base + j]);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = f32(layernorm_f16_f16_x[base + j]) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f16_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        layernorm_f16_f16_out[base + j] = f16((f32(layernorm_f16_f16_x[base + j]) - mean) * r * f32(layernorm_f16_f16_weight[j]) + f32(layernorm_f16_f16_bias[j]));
    }
}

// x / max(||x||, eps) over each row (torch.nn.functional.normalize, p=2).
@group(0) @binding(0) var<storage, read> normalize_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> normalize_f32_out: array<f32>;
@group(0) @binding(2) var<uniform> normalize_f32_p: Norm;

@compute @workgroup_size(256)
fn normalize_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= normalize_f32_p.rows) {
        return;
    }
    let n = normalize_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = normalize_f32_x[base + j];
        acc += v * v;
    }
    let norm = max(sqrt(tree_sum(t, acc)), normalize_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        normalize_f32_out[base + j] = normalize_f32_x[base + j] / norm;
    }
}

@group(0) @binding(0) var<storage, read> normalize_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> normalize_f16_out: array<f16>;
@group(0) @binding(2) var<uniform> normalize_f16_p: Norm;

@compute @workgroup_size(256)
fn normalize_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= normalize_f16_p.rows) {
        return;
    }
    let n = normalize_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = f32(normalize_f16_x[base + j]);
        acc += v * v;
    }
    let norm = max(sqrt(tree_sum(t, acc)), normalize_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        normalize_f16_out[base + j] = f16(f32(normalize_f16_x[base + j]) / norm);
    }
}

// ---------------------------------------------------------------- bfloat16: x, or weight and bias
@group(0) @binding(0) var<storage, read> reduce_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> reduce_bf16_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_bf16_p: Reduce;

@compute @workgroup_size(256)
fn reduce_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= reduce_bf16_p.rows) {
        return;
    }
    let n = reduce_bf16_p.length;
    let base = row * n;
    var total: f32;
    if (reduce_bf16_p.op == 2u) {
        var m = bf16_at(reduce_bf16_x[base >> 1u], base);  // element 0 is every thread's: no -inf to start from
        for (var j = t; j < n; j += BLOCK) {
            m = max_nan(m, bf16_at(reduce_bf16_x[(base + j) >> 1u], base + j));
        }
        total = tree_max(t, m);
    } else {
        var acc = 0.0;
        for (var j = t; j < n; j += BLOCK) {
            acc += bf16_at(reduce_bf16_x[(base + j) >> 1u], base + j);
        }
        total = tree_sum(t, acc);
        if (reduce_bf16_p.op == 1u) {
            total = total / f32(n);
        }
    }
    if (t == 0u) {
        reduce_bf16_out[row] = total;
    }
}

@group(0) @binding(0) var<storage, read> argmax_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> argmax_bf16_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_bf16_p: Rows;

@compute @workgroup_size(256)
fn argmax_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= argmax_bf16_p.rows) {
        return;
    }
    let n = argmax_bf16_p.length;
    let base = row * n;
    var best = bf16_at(argmax_bf16_x[base >> 1u], base);  // element 0 first: ties keep the smaller index
    var at = 0u;
    for (var j = t; j < n; j += BLOCK) {
        let v = bf16_at(argmax_bf16_x[(base + j) >> 1u], base + j);
        if (above(v, best)) {
            best = v;
            at = j;
        }
    }
    let i = tree_argmax(t, best, at);
    if (t == 0u) {
        argmax_bf16_out[row] = i32(i);
    }
}

@group(0) @binding(0) var<storage, read> softmax_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> softmax_bf16_out: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> softmax_bf16_p: Rows;

@compute @workgroup_size(256)
fn softmax_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_bf16_p.rows) {
        return;
    }
    let n = softmax_bf16_p.length;
    let base = row * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, bf16_at(softmax_bf16_x[(base + j) >> 1u], base + j));
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = exp(bf16_at(softmax_bf16_x[k >> 1u], k) - ms.x) * scale;
        atomicAnd(&softmax_bf16_out[k >> 1u], bf16_keep(k));
        atomicOr(&softmax_bf16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> softmax_mask_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read> softmax_mask_bf16_mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> softmax_mask_bf16_out: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> softmax_mask_bf16_p: Masked;

@compute @workgroup_size(256)
fn softmax_mask_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= softmax_mask_bf16_p.rows) {
        return;
    }
    let n = softmax_mask_bf16_p.length;
    let base = row * n;
    let mbase = (row % softmax_mask_bf16_p.mask_rows) * n;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = t; j < n; j += BLOCK) {
        ms = online(ms, bf16_at(softmax_mask_bf16_x[(base + j) >> 1u], base + j) + softmax_mask_bf16_mask[mbase + j]);
    }
    ms = tree_online(t, ms);
    let scale = inverse_sum(ms);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = exp(bf16_at(softmax_mask_bf16_x[k >> 1u], k) + softmax_mask_bf16_mask[mbase + j] - ms.x) * scale;
        atomicAnd(&softmax_mask_bf16_out[k >> 1u], bf16_keep(k));
        atomicOr(&softmax_mask_bf16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_bf16_f32_x: array<u32>;
@group(0) @binding(1) var<storage, read> rmsnorm_bf16_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_bf16_f32_out: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> rmsnorm_bf16_f32_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_bf16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_bf16_f32_p.rows) {
        return;
    }
    let n = rmsnorm_bf16_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = bf16_at(rmsnorm_bf16_f32_x[(base + j) >> 1u], base + j);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_bf16_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = bf16_at(rmsnorm_bf16_f32_x[k >> 1u], k) * r * rmsnorm_bf16_f32_weight[j];
        atomicAnd(&rmsnorm_bf16_f32_out[k >> 1u], bf16_keep(k));
        atomicOr(&rmsnorm_bf16_f32_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_bf16_f16_x: array<u32>;
@group(0) @binding(1) var<storage, read> rmsnorm_bf16_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_bf16_f16_out: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> rmsnorm_bf16_f16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_bf16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_bf16_f16_p.rows) {
        return;
    }
    let n = rmsnorm_bf16_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = bf16_at(rmsnorm_bf16_f16_x[(base + j) >> 1u], base + j);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_bf16_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = bf16_at(rmsnorm_bf16_f16_x[k >> 1u], k) * r * f32(rmsnorm_bf16_f16_weight[j]);
        atomicAnd(&rmsnorm_bf16_f16_out[k >> 1u], bf16_keep(k));
        atomicOr(&rmsnorm_bf16_f16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_bf16_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read> rmsnorm_bf16_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_bf16_bf16_out: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> rmsnorm_bf16_bf16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_bf16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_bf16_bf16_p.rows) {
        return;
    }
    let n = rmsnorm_bf16_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = bf16_at(rmsnorm_bf16_bf16_x[(base + j) >> 1u], base + j);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_bf16_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = bf16_at(rmsnorm_bf16_bf16_x[k >> 1u], k) * r * bf16_at(rmsnorm_bf16_bf16_weight[j >> 1u], j);
        atomicAnd(&rmsnorm_bf16_bf16_out[k >> 1u], bf16_keep(k));
        atomicOr(&rmsnorm_bf16_bf16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f32_bf16_x: array<f32>;
@group(0) @binding(1) var<storage, read> rmsnorm_f32_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f32_bf16_out: array<f32>;
@group(0) @binding(3) var<uniform> rmsnorm_f32_bf16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f32_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f32_bf16_p.rows) {
        return;
    }
    let n = rmsnorm_f32_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = rmsnorm_f32_bf16_x[base + j];
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f32_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        rmsnorm_f32_bf16_out[k] = rmsnorm_f32_bf16_x[k] * r * bf16_at(rmsnorm_f32_bf16_weight[j >> 1u], j);
    }
}

@group(0) @binding(0) var<storage, read> rmsnorm_f16_bf16_x: array<f16>;
@group(0) @binding(1) var<storage, read> rmsnorm_f16_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read_write> rmsnorm_f16_bf16_out: array<f16>;
@group(0) @binding(3) var<uniform> rmsnorm_f16_bf16_p: Norm;

@compute @workgroup_size(256)
fn rmsnorm_f16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= rmsnorm_f16_bf16_p.rows) {
        return;
    }
    let n = rmsnorm_f16_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = f32(rmsnorm_f16_bf16_x[base + j]);
        acc += v * v;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc) / f32(n) + rmsnorm_f16_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        rmsnorm_f16_bf16_out[k] = f16(f32(rmsnorm_f16_bf16_x[k]) * r * bf16_at(rmsnorm_f16_bf16_weight[j >> 1u], j));
    }
}

@group(0) @binding(0) var<storage, read> layernorm_bf16_f32_x: array<u32>;
@group(0) @binding(1) var<storage, read> layernorm_bf16_f32_weight: array<f32>;
@group(0) @binding(2) var<storage, read> layernorm_bf16_f32_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> layernorm_bf16_f32_out: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> layernorm_bf16_f32_p: Norm;

@compute @workgroup_size(256)
fn layernorm_bf16_f32(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_bf16_f32_p.rows) {
        return;
    }
    let n = layernorm_bf16_f32_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += bf16_at(layernorm_bf16_f32_x[(base + j) >> 1u], base + j);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = bf16_at(layernorm_bf16_f32_x[(base + j) >> 1u], base + j) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_bf16_f32_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = (bf16_at(layernorm_bf16_f32_x[k >> 1u], k) - mean) * r * layernorm_bf16_f32_weight[j] + layernorm_bf16_f32_bias[j];
        atomicAnd(&layernorm_bf16_f32_out[k >> 1u], bf16_keep(k));
        atomicOr(&layernorm_bf16_f32_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> layernorm_bf16_f16_x: array<u32>;
@group(0) @binding(1) var<storage, read> layernorm_bf16_f16_weight: array<f16>;
@group(0) @binding(2) var<storage, read> layernorm_bf16_f16_bias: array<f16>;
@group(0) @binding(3) var<storage, read_write> layernorm_bf16_f16_out: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> layernorm_bf16_f16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_bf16_f16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_bf16_f16_p.rows) {
        return;
    }
    let n = layernorm_bf16_f16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += bf16_at(layernorm_bf16_f16_x[(base + j) >> 1u], base + j);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = bf16_at(layernorm_bf16_f16_x[(base + j) >> 1u], base + j) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_bf16_f16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = (bf16_at(layernorm_bf16_f16_x[k >> 1u], k) - mean) * r * f32(layernorm_bf16_f16_weight[j]) + f32(layernorm_bf16_f16_bias[j]);
        atomicAnd(&layernorm_bf16_f16_out[k >> 1u], bf16_keep(k));
        atomicOr(&layernorm_bf16_f16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> layernorm_bf16_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read> layernorm_bf16_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read> layernorm_bf16_bf16_bias: array<u32>;
@group(0) @binding(3) var<storage, read_write> layernorm_bf16_bf16_out: array<atomic<u32>>;
@group(0) @binding(4) var<uniform> layernorm_bf16_bf16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_bf16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_bf16_bf16_p.rows) {
        return;
    }
    let n = layernorm_bf16_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += bf16_at(layernorm_bf16_bf16_x[(base + j) >> 1u], base + j);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = bf16_at(layernorm_bf16_bf16_x[(base + j) >> 1u], base + j) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_bf16_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = (bf16_at(layernorm_bf16_bf16_x[k >> 1u], k) - mean) * r * bf16_at(layernorm_bf16_bf16_weight[j >> 1u], j) + bf16_at(layernorm_bf16_bf16_bias[j >> 1u], j);
        atomicAnd(&layernorm_bf16_bf16_out[k >> 1u], bf16_keep(k));
        atomicOr(&layernorm_bf16_bf16_out[k >> 1u], bf16_put(v, k));
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f32_bf16_x: array<f32>;
@group(0) @binding(1) var<storage, read> layernorm_f32_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read> layernorm_f32_bf16_bias: array<u32>;
@group(0) @binding(3) var<storage, read_write> layernorm_f32_bf16_out: array<f32>;
@group(0) @binding(4) var<uniform> layernorm_f32_bf16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f32_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f32_bf16_p.rows) {
        return;
    }
    let n = layernorm_f32_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += layernorm_f32_bf16_x[base + j];
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = layernorm_f32_bf16_x[base + j] - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f32_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        layernorm_f32_bf16_out[k] = (layernorm_f32_bf16_x[k] - mean) * r * bf16_at(layernorm_f32_bf16_weight[j >> 1u], j) + bf16_at(layernorm_f32_bf16_bias[j >> 1u], j);
    }
}

@group(0) @binding(0) var<storage, read> layernorm_f16_bf16_x: array<f16>;
@group(0) @binding(1) var<storage, read> layernorm_f16_bf16_weight: array<u32>;
@group(0) @binding(2) var<storage, read> layernorm_f16_bf16_bias: array<u32>;
@group(0) @binding(3) var<storage, read_write> layernorm_f16_bf16_out: array<f16>;
@group(0) @binding(4) var<uniform> layernorm_f16_bf16_p: Norm;

@compute @workgroup_size(256)
fn layernorm_f16_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= layernorm_f16_bf16_p.rows) {
        return;
    }
    let n = layernorm_f16_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        acc += f32(layernorm_f16_bf16_x[base + j]);
    }
    let mean = tree_sum(t, acc) / f32(n);
    var acc2 = 0.0;  // the variance from a second pass: no cancellation
    for (var j = t; j < n; j += BLOCK) {
        let c = f32(layernorm_f16_bf16_x[base + j]) - mean;
        acc2 += c * c;
    }
    let r = 1.0 / sqrt(tree_sum(t, acc2) / f32(n) + layernorm_f16_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        layernorm_f16_bf16_out[k] = f16((f32(layernorm_f16_bf16_x[k]) - mean) * r * bf16_at(layernorm_f16_bf16_weight[j >> 1u], j) + bf16_at(layernorm_f16_bf16_bias[j >> 1u], j));
    }
}

@group(0) @binding(0) var<storage, read> normalize_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> normalize_bf16_out: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> normalize_bf16_p: Norm;

@compute @workgroup_size(256)
fn normalize_bf16(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) groups: vec3<u32>) {
    let row = row_of(wid, groups);
    if (row >= normalize_bf16_p.rows) {
        return;
    }
    let n = normalize_bf16_p.length;
    let base = row * n;
    var acc = 0.0;
    for (var j = t; j < n; j += BLOCK) {
        let v = bf16_at(normalize_bf16_x[(base + j) >> 1u], base + j);
        acc += v * v;
    }
    let norm = max(sqrt(tree_sum(t, acc)), normalize_bf16_p.eps);
    for (var j = t; j < n; j += BLOCK) {
        let k = base + j;
        let v = bf16_at(normalize_bf16_x[k >> 1u], k) / norm;
        atomicAnd(&normalize_bf16_out[k >> 1u], bf16_keep(k));
        atomicOr(&normalize_bf16_out[k >> 1u], bf16_put(v, k));
    }
}
