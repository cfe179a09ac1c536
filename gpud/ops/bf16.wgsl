
// bfloat16 helpers shared by the WGSL families that store it (WGSL has no bfloat16 and no includes:
// gpud.ops.source adds this to each such family's source). Values live in array<u32>, two to a
// word, the even element in the low half.

// bfloat16 element i, out of the word holding it (word i / 2; the even element in the low half).
fn bf16_at(word: u32, i: u32) -> f32 {
    return bitcast<f32>(((word >> ((i & 1u) * 16u)) & 0xffffu) << 16u);
}

// Both bfloat16 elements of a word (the even one first), as unpack2x16float for float16.
fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// v rounded to bfloat16 (nearest even; NaN: the quiet NaN of its sign), in element i's half of a word:
// stored with atomicAnd(word, bf16_keep(i)) then atomicOr(word, bf16_put(v, i)), the other half kept.
fn bf16_put(v: f32, i: u32) -> u32 {
    let x = bitcast<u32>(v);
    var b = (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        b = ((x >> 16u) & 0x8000u) | 0x7fc0u;
    }
    return b << ((i & 1u) * 16u);
}

fn bf16_keep(i: u32) -> u32 {
    return 0xffff0000u >> ((i & 1u) * 16u);
}

