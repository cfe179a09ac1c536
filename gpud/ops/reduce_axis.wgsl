// Reductions over any axis of x, and of any view (see gpud_protocol/ops/reduce_axis.py for the
// interface). x is bound whole and read through an element offset and strides: the reduced axis's,
// and those of x's other axes merged into 6 (padded in front with size 1). Outputs are dense. One
// thread per output, walking the reduced axis (at most 65,535 long: lavapipe cuts longer loops).
// Everything accumulates in float32; float16 is read into float32 and rounded once when stored. The
// grid folds into y. bfloat16, which WGSL lacks, is bound as array<u32> (two to a word) and written
// through array<atomic<u32>> (neighbouring threads write the two halves of a word).
enable f16;

const BLOCK: u32 = 256u;
const LOWEST: f32 = -3.40282347e38;  // the most negative finite f32: only -inf is below it

struct Reduce {
    n: u32, length: u32, inner: u32, op: u32, offset: u32, s_length: u32,
    size0: u32, size1: u32, size2: u32, size3: u32, size4: u32, size5: u32,
    stride0: u32, stride1: u32, stride2: u32, stride3: u32, stride4: u32, stride5: u32,
}
struct Axis {
    n: u32, length: u32, inner: u32, offset: u32, s_length: u32,
    size0: u32, size1: u32, size2: u32, size3: u32, size4: u32, size5: u32,
    stride0: u32, stride1: u32, stride2: u32, stride3: u32, stride4: u32, stride5: u32,
}

fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

// Softmax's running (max m, sum of exp(v - m)) after v joins it; a -inf v adds exp(-inf) = 0.
fn online(ms: vec2<f32>, v: f32) -> vec2<f32> {
    if (v > ms.x) {
        return vec2<f32>(v, ms.y * exp(ms.x - v) + 1.0);
    }
    return vec2<f32>(ms.x, ms.y + exp(v - ms.x));
}

@group(0) @binding(0) var<storage, read> reduce_axis_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> reduce_axis_f32_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_axis_f32_p: Reduce;

@compute @workgroup_size(256)
fn reduce_axis_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = reduce_axis_f32_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var total: f32;
    if (p.op == 2u) {
        total = f32(reduce_axis_f32_x[base]);
        for (var r = 1u; r < p.length; r++) {
            total = max_nan(total, f32(reduce_axis_f32_x[base + r * p.s_length]));
        }
    } else {
        total = 0.0;
        for (var r = 0u; r < p.length; r++) {
            total += f32(reduce_axis_f32_x[base + r * p.s_length]);
        }
        if (p.op == 1u) {
            total = total / f32(p.length);
        }
    }
    reduce_axis_f32_out[k] = total;
}

@group(0) @binding(0) var<storage, read> argmax_axis_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> argmax_axis_f32_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_axis_f32_p: Axis;

@compute @workgroup_size(256)
fn argmax_axis_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = argmax_axis_f32_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var best = f32(argmax_axis_f32_x[base]);
    var at = 0u;
    for (var r = 1u; r < p.length; r++) {
        let v = f32(argmax_axis_f32_x[base + r * p.s_length]);
        if (above(v, best)) {  // strictly: ties keep the first index (and the first NaN wins)
            best = v;
            at = r;
        }
    }
    argmax_axis_f32_out[k] = i32(at);
}

@group(0) @binding(0) var<storage, read> softmax_axis_f32_x: array<f32>;
@group(0) @binding(1) var<storage, read_write> softmax_axis_f32_out: array<f32>;
@group(0) @binding(2) var<uniform> softmax_axis_f32_p: Axis;

@compute @workgroup_size(256)
fn softmax_axis_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = softmax_axis_f32_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var r = 0u; r < p.length; r++) {
        ms = online(ms, f32(softmax_axis_f32_x[base + r * p.s_length]));
    }
    let scale = select(0.0, 1.0 / ms.y, ms.y > 0.0 || is_nan(ms.y));  // only -inf: zeros; NaN: NaN
    let first = (k / p.inner) * p.length * p.inner + k % p.inner;
    for (var r = 0u; r < p.length; r++) {
        let v = f32(softmax_axis_f32_x[base + r * p.s_length]);
        softmax_axis_f32_out[first + r * p.inner] = f32(exp(v - ms.x) * scale);
    }
}

@group(0) @binding(0) var<storage, read> reduce_axis_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> reduce_axis_f16_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_axis_f16_p: Reduce;

@compute @workgroup_size(256)
fn reduce_axis_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = reduce_axis_f16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var total: f32;
    if (p.op == 2u) {
        total = f32(reduce_axis_f16_x[base]);
        for (var r = 1u; r < p.length; r++) {
            total = max_nan(total, f32(reduce_axis_f16_x[base + r * p.s_length]));
        }
    } else {
        total = 0.0;
        for (var r = 0u; r < p.length; r++) {
            total += f32(reduce_axis_f16_x[base + r * p.s_length]);
        }
        if (p.op == 1u) {
            total = total / f32(p.length);
        }
    }
    reduce_axis_f16_out[k] = total;
}

@group(0) @binding(0) var<storage, read> argmax_axis_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> argmax_axis_f16_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_axis_f16_p: Axis;

@compute @workgroup_size(256)
fn argmax_axis_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = argmax_axis_f16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var best = f32(argmax_axis_f16_x[base]);
    var at = 0u;
    for (var r = 1u; r < p.length; r++) {
        let v = f32(argmax_axis_f16_x[base + r * p.s_length]);
        if (above(v, best)) {  // strictly: ties keep the first index (and the first NaN wins)
            best = v;
            at = r;
        }
    }
    argmax_axis_f16_out[k] = i32(at);
}

@group(0) @binding(0) var<storage, read> softmax_axis_f16_x: array<f16>;
@group(0) @binding(1) var<storage, read_write> softmax_axis_f16_out: array<f16>;
@group(0) @binding(2) var<uniform> softmax_axis_f16_p: Axis;

@compute @workgroup_size(256)
fn softmax_axis_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = softmax_axis_f16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var r = 0u; r < p.length; r++) {
        ms = online(ms, f32(softmax_axis_f16_x[base + r * p.s_length]));
    }
    let scale = select(0.0, 1.0 / ms.y, ms.y > 0.0 || is_nan(ms.y));  // only -inf: zeros; NaN: NaN
    let first = (k / p.inner) * p.length * p.inner + k % p.inner;
    for (var r = 0u; r < p.length; r++) {
        let v = f32(softmax_axis_f16_x[base + r * p.s_length]);
        softmax_axis_f16_out[first + r * p.inner] = f16(exp(v - ms.x) * scale);
    }
}

@group(0) @binding(0) var<storage, read> reduce_axis_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> reduce_axis_bf16_out: array<f32>;
@group(0) @binding(2) var<uniform> reduce_axis_bf16_p: Reduce;

@compute @workgroup_size(256)
fn reduce_axis_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = reduce_axis_bf16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var total: f32;
    if (p.op == 2u) {
        total = bf16_at(reduce_axis_bf16_x[base >> 1u], base);
        for (var r = 1u; r < p.length; r++) {
            total = max_nan(total, bf16_at(reduce_axis_bf16_x[(base + r * p.s_length) >> 1u], base + r * p.s_length));
        }
    } else {
        total = 0.0;
        for (var r = 0u; r < p.length; r++) {
            total += bf16_at(reduce_axis_bf16_x[(base + r * p.s_length) >> 1u], base + r * p.s_length);
        }
        if (p.op == 1u) {
            total = total / f32(p.length);
        }
    }
    reduce_axis_bf16_out[k] = total;
}

@group(0) @binding(0) var<storage, read> argmax_axis_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> argmax_axis_bf16_out: array<i32>;
@group(0) @binding(2) var<uniform> argmax_axis_bf16_p: Axis;

@compute @workgroup_size(256)
fn argmax_axis_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = argmax_axis_bf16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var best = bf16_at(argmax_axis_bf16_x[base >> 1u], base);
    var at = 0u;
    for (var r = 1u; r < p.length; r++) {
        let v = bf16_at(argmax_axis_bf16_x[(base + r * p.s_length) >> 1u], base + r * p.s_length);
        if (above(v, best)) {  // strictly: ties keep the first index (and the first NaN wins)
            best = v;
            at = r;
        }
    }
    argmax_axis_bf16_out[k] = i32(at);
}

@group(0) @binding(0) var<storage, read> softmax_axis_bf16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> softmax_axis_bf16_out: array<atomic<u32>>;
@group(0) @binding(2) var<uniform> softmax_axis_bf16_p: Axis;

@compute @workgroup_size(256)
fn softmax_axis_bf16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let p = softmax_axis_bf16_p;
    let k = index(gid, groups);
    if (k >= p.n) {
        return;
    }
    var rest = k;
    var base = p.offset;
    base += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    base += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    base += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    base += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    base += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    base += rest * p.stride0;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var r = 0u; r < p.length; r++) {
        ms = online(ms, bf16_at(softmax_axis_bf16_x[(base + r * p.s_length) >> 1u], base + r * p.s_length));
    }
    let scale = select(0.0, 1.0 / ms.y, ms.y > 0.0 || is_nan(ms.y));  // only -inf: zeros; NaN: NaN
    let first = (k / p.inner) * p.length * p.inner + k % p.inner;
    for (var r = 0u; r < p.length; r++) {
        let v = bf16_at(softmax_axis_bf16_x[(base + r * p.s_length) >> 1u], base + r * p.s_length);
        let o = first + r * p.inner;
        atomicAnd(&softmax_axis_bf16_out[o >> 1u], bf16_keep(o));
        atomicOr(&softmax_axis_bf16_out[o >> 1u], bf16_put(exp(v - ms.x) * scale, o));
    }
}
