// Layout: `contiguous`, any view copied into dense memory (see gpud_protocol/ops/layout.py for the
// interface). x is bound whole and read through the view's offset, sizes and strides (coalesced, padded
// in front with size 1 to 6 dimensions); out is dense. The kernels move bits as 32-bit words: each
// thread writes one output word (4 8-bit, 2 16-bit or 1 32-bit element) or one 64-bit element (two
// words), so no two threads write one word; where the elements end inside the last word, its other
// bytes are kept (out may be a dense view with a neighbour after it). The grid folds into y.

const BLOCK: u32 = 256u;

struct View {
    n: u32, offset: u32,
    size0: u32, size1: u32, size2: u32, size3: u32, size4: u32, size5: u32,
    stride0: u32, stride1: u32, stride2: u32, stride3: u32, stride4: u32, stride5: u32,
}

fn index(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return gid.x + gid.y * groups.x * BLOCK;
}

// The element of x's tensor that element e (row-major) of the view is.
fn source_of(e: u32, p: View) -> u32 {
    var rest = e;
    var at = p.offset;
    at += (rest % p.size5) * p.stride5;
    rest = rest / p.size5;
    at += (rest % p.size4) * p.stride4;
    rest = rest / p.size4;
    at += (rest % p.size3) * p.stride3;
    rest = rest / p.size3;
    at += (rest % p.size2) * p.stride2;
    rest = rest / p.size2;
    at += (rest % p.size1) * p.stride1;
    rest = rest / p.size1;
    return at + rest * p.stride0;
}

@group(0) @binding(0) var<storage, read> contiguous_b8_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> contiguous_b8_out: array<u32>;
@group(0) @binding(2) var<uniform> contiguous_b8_p: View;

@compute @workgroup_size(256)
fn contiguous_b8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = index(gid, groups);
    let p = contiguous_b8_p;
    let first = w * 4u;
    if (first >= p.n) {
        return;
    }
    var word = 0u;
    var mask = 0u;
    for (var k = 0u; k < 4u; k++) {
        let e = first + k;
        if (e < p.n) {
            let s = source_of(e, p);
            let bits = (contiguous_b8_x[s / 4u] >> ((s % 4u) * 8u)) & 0xFFu;
            word |= bits << (k * 8u);
            mask |= 0xFFu << (k * 8u);
        }
    }
    if (mask != 0xFFFFFFFFu) {
        word |= contiguous_b8_out[w] & ~mask;  // the bytes after the last element are not ours
    }
    contiguous_b8_out[w] = word;
}

@group(0) @binding(0) var<storage, read> contiguous_b16_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> contiguous_b16_out: array<u32>;
@group(0) @binding(2) var<uniform> contiguous_b16_p: View;

@compute @workgroup_size(256)
fn contiguous_b16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let w = index(gid, groups);
    let p = contiguous_b16_p;
    let first = w * 2u;
    if (first >= p.n) {
        return;
    }
    var word = 0u;
    var mask = 0u;
    for (var k = 0u; k < 2u; k++) {
        let e = first + k;
        if (e < p.n) {
            let s = source_of(e, p);
            let bits = (contiguous_b16_x[s / 2u] >> ((s % 2u) * 16u)) & 0xFFFFu;
            word |= bits << (k * 16u);
            mask |= 0xFFFFu << (k * 16u);
        }
    }
    if (mask != 0xFFFFFFFFu) {
        word |= contiguous_b16_out[w] & ~mask;  // the bytes after the last element are not ours
    }
    contiguous_b16_out[w] = word;
}

@group(0) @binding(0) var<storage, read> contiguous_b32_x: array<u32>;
@group(0) @binding(1) var<storage, read_write> contiguous_b32_out: array<u32>;
@group(0) @binding(2) var<uniform> contiguous_b32_p: View;

@compute @workgroup_size(256)
fn contiguous_b32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = index(gid, groups);
    let p = contiguous_b32_p;
    if (e < p.n) {
        contiguous_b32_out[e] = contiguous_b32_x[source_of(e, p)];
    }
}

@group(0) @binding(0) var<storage, read> contiguous_b64_x: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> contiguous_b64_out: array<vec2<u32>>;
@group(0) @binding(2) var<uniform> contiguous_b64_p: View;

@compute @workgroup_size(256)
fn contiguous_b64(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = index(gid, groups);
    let p = contiguous_b64_p;
    if (e < p.n) {
        contiguous_b64_out[e] = contiguous_b64_x[source_of(e, p)];
    }
}
