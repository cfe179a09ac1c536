
// ---------------------------------------------------------------- power (added after the elementwise family)
// numpy's float32 power (ew_binary's op 16), with C99 powf's special values. WGSL's pow leaves x < 0, and
// x = 0 with y <= 0, undefined, and its log2 need only be accurate to 2^-21 absolutely (near 1 that is
// hardly a digit: x ** 3000 for x = 1.001 off by 4e-4), so: an integer exponent up to POWER_SQUARING goes
// by squaring (x ** 2 and x ** 3 round as x * x and x * x * x do), any other by exp2(y * log2|x|) with a
// log2 of its own, a few ulp relative everywhere (beyond POWER_SQUARING the squarings' rounding, ~|y| / 2
// ulp, passes exp2's). Infinities and NaN are made from run-time bits: WGSL refuses constant ones.

const POWER_SQUARING: f32 = 64.0;

// log2(x) for a finite x > 0, within a few ulp: x = m 2^e, m in [sqrt(1/2), sqrt(2)], and log2(m) =
// 2 atanh(s) / ln 2 with s = (m - 1) / (m + 1) (m - 1 exact), by its series (|s| < 0.172: five terms).
fn log2_of_positive(x: f32) -> f32 {
    var bits = bitcast<u32>(x);
    var e = -127;
    if (bits < 0x00800000u) {  // subnormal: scaled into the normals by 2^23
        bits = bitcast<u32>(x * 8388608.0);
        e -= 23;
    }
    e += i32(bits >> 23u);
    var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
    if (m > 1.4142135) {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let series = 1.0 + z * (0.33333334 + z * (0.2 + z * (0.14285715 + z * 0.11111111)));
    return f32(e) + 2.8853900817779268 * s * series;  // 2 / ln 2
}

fn power(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let xa = ua & 0x7fffffffu;  // |a|'s bits
    let yb = bitcast<u32>(b) & 0x7fffffffu;  // |b|'s bits
    if (yb == 0u || ua == 0x3f800000u) {
        return 1.0;  // pow(x, +-0) and pow(1, y), NaN or not
    }
    if (is_nan(a) || is_nan(b)) {
        return bitcast<f32>(select(bitcast<u32>(b), ua, is_nan(a)) | 0x7fc00000u);  // quiet
    }
    if (yb == 0x7f800000u) {  // y +-inf: 1 for x = -1, else +inf where (|x| > 1) == (y > 0), +0 elsewhere
        return select(select(0.0, bitcast<f32>(yb), (xa > 0x3f800000u) == (b > 0.0)), 1.0, xa == 0x3f800000u);
    }
    let y = bitcast<f32>(yb);
    let integer = floor(y) == y;
    let odd = integer && yb < 0x4b800000u && (u32(y) & 1u) == 1u;  // from 2^24 on, every float is even
    let sign = select(0u, ua & 0x80000000u, odd);  // x's sign, kept for an odd integer y
    if (xa == 0u || xa == 0x7f800000u) {  // x +-0 or +-inf: +-inf or +-0 by y's sign
        return bitcast<f32>(sign | select(0u, 0x7f800000u, (xa == 0u) == (b < 0.0)));
    }
    if (a < 0.0 && !integer) {
        return bitcast<f32>(ua | 0x7fc00000u);  // a negative base to a non-integer exponent: NaN
    }
    let x = bitcast<f32>(xa);
    var r = 0.0;
    var normal = false;
    if (integer && y <= POWER_SQUARING) {
        var base = x;
        var e = u32(y);
        r = 1.0;
        loop {
            if ((e & 1u) != 0u) {
                r *= base;
            }
            e >>= 1u;
            if (e == 0u) {
                break;
            }
            base *= base;
        }
        if (b < 0.0) {
            r = 1.0 / r;
        }
        let rb = bitcast<u32>(r);
        normal = rb >= 0x00800000u && rb < 0x7f800000u;  // else |x|^|y| overflowed or went subnormal
    }
    if (!normal) {
        r = exp2(b * log2_of_positive(x));
    }
    return bitcast<f32>(bitcast<u32>(r) | sign);
}
