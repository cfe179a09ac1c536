// Elementwise ops (see gpud_protocol/ops/elementwise.py for the interface). One thread per element;
// the grid may fold into y past 65,535 workgroups. Float16 is computed in float32.
enable f16;

const BLOCK: u32 = 256u;

fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

fn binary(a: f32, b: f32, op: u32) -> f32 {
    switch op {
        case 0u: { return a + b; }
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 4u: { return a / (1.0 + exp(-a)) * b; }
        default: { return a / b; }
    }
}

// tanh of a clamped argument: some implementations overflow to NaN past |x| ~ 44
fn safe_tanh(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

fn gelu_tanh(x: f32) -> f32 {
    let inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + safe_tanh(inner));
}

// erf by Abramowitz and Stegun 7.1.26 refined: max error ~1.2e-7 (WGSL has no erf)
fn erf(x: f32) -> f32 {
    let s = sign(x);
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.5 * a);
    let y = 1.0 - t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277)))))))));
    return s * y;
}

fn unary(x: f32, op: u32, a: f32) -> f32 {
    switch op {
        case 0u: { return a * x; }
        case 1u: { return exp(x); }
        case 2u: { return inverseSqrt(x); }
        case 3u: { return x / (1.0 + exp(-x)); }
        case 4u: { return 0.5 * x * (1.0 + erf(x * 0.7071067811865476)); }
        case 5u: { return gelu_tanh(x); }
        default: { return safe_tanh(x); }
    }
}

struct Binary { n: u32, nx: u32, ny: u32, op: u32 }
struct Unary { n: u32, op: u32, a: f32 }
struct Count { n: u32 }

@group(0) @binding(0) var<storage, read> bx32: array<f32>;
@group(0) @binding(1) var<storage, read> by32: array<f32>;
@group(0) @binding(2) var<storage, read_write> bo32: array<f32>;
@group(0) @binding(3) var<uniform> bp32: Binary;

@compute @workgroup_size(256)
fn binary_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < bp32.n) {
        bo32[i] = binary(bx32[i % bp32.nx], by32[i % bp32.ny], bp32.op);
    }
}

@group(0) @binding(0) var<storage, read> bx16: array<f16>;
@group(0) @binding(1) var<storage, read> by16: array<f16>;
@group(0) @binding(2) var<storage, read_write> bo16: array<f16>;
@group(0) @binding(3) var<uniform> bp16: Binary;

@compute @workgroup_size(256)
fn binary_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < bp16.n) {
        bo16[i] = f16(binary(f32(bx16[i % bp16.nx]), f32(by16[i % bp16.ny]), bp16.op));
    }
}

@group(0) @binding(0) var<storage, read> ux32: array<f32>;
@group(0) @binding(1) var<storage, read_write> uo32: array<f32>;
@group(0) @binding(2) var<uniform> up32: Unary;

@compute @workgroup_size(256)
fn unary_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < up32.n) {
        uo32[i] = unary(ux32[i], up32.op, up32.a);
    }
}

@group(0) @binding(0) var<storage, read> ux16: array<f16>;
@group(0) @binding(1) var<storage, read_write> uo16: array<f16>;
@group(0) @binding(2) var<uniform> up16: Unary;

@compute @workgroup_size(256)
fn unary_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < up16.n) {
        uo16[i] = f16(unary(f32(ux16[i]), up16.op, up16.a));
    }
}

@group(0) @binding(0) var<storage, read> cx32: array<f32>;
@group(0) @binding(1) var<storage, read_write> co16: array<f16>;
@group(0) @binding(2) var<uniform> cp32: Count;

@compute @workgroup_size(256)
fn cast_f32_f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < cp32.n) {
        co16[i] = f16(cx32[i]);
    }
}

@group(0) @binding(0) var<storage, read> cx16: array<f16>;
@group(0) @binding(1) var<storage, read_write> co32: array<f32>;
@group(0) @binding(2) var<uniform> cp16: Count;

@compute @workgroup_size(256)
fn cast_f16_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = index(gid, groups);
    if (i < cp16.n) {
        co32[i] = f32(cx16[i]);
    }
}
