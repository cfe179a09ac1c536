
// The rotary angle of pair j at `position` as (cos, sin), shared by attention.wgsl's rotary and
// fused.wgsl's rotary_kv_append (gpud.ops.source adds it to their source): the frequency 2^-(j * f),
// f = 2 log2(base) / D given as freq_hi + freq_lo with freq_hi short (12 significant bits) so that
// j * freq_hi is exact; the angle, rounded once, reduced to [-pi, pi] (Cody-Waite, 2 pi in three parts).
fn rotary_turn(j: u32, position: f32, freq_hi: f32, freq_lo: f32) -> vec2<f32> {
    let e = f32(j) * freq_hi; // exact
    let whole = floor(e);
    let frac = (e - whole) + f32(j) * freq_lo;
    let angle = position * ldexp(exp2(-frac), -i32(whole));
    let k = round(angle * 0.15915494309189535);
    let r = ((angle - k * 6.28125) - k * 0.0019378662109375) - k * -2.559031372584286e-06;
    return vec2<f32>(cos(r), sin(r));
}
