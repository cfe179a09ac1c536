// NaN as numpy sees it, shared by the WGSL families that compare floats (no includes: gpud.ops.source
// adds this to each such family's source). WGSL leaves max() and comparisons with NaN to the
// implementation, so NaN is found on the bits.

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// numpy's max of two (np.maximum): NaN if either is.
fn max_nan(a: f32, b: f32) -> f32 {
    return select(select(max(a, b), b, is_nan(b)), a, is_nan(a));
}

// v, met after best in one scan, takes its place for argmax: larger, or the first NaN.
fn above(v: f32, best: f32) -> bool {
    return v > best || (is_nan(v) && !is_nan(best));
}

// (w, j) wins over (v, i) for argmax: a NaN over a number, else the larger number; on ties (two NaNs
// too) the smaller index.
fn wins(w: f32, j: u32, v: f32, i: u32) -> bool {
    let wn = is_nan(w);
    if (wn != is_nan(v)) {
        return wn;
    }
    return (!wn && w > v) || ((wn || w == v) && j < i);
}
