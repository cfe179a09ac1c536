// The rotary angle of pair j at `position`, as cos and sin, shared by attention.cu's rotary and
// fused.cu's rotary_kv_append (added before their source by gpud.ops.source): see attention.wgsl for
// the frequency (2^-(j * (freq_hi + freq_lo))) and the reduction of the angle.

__device__ __forceinline__ void turn(unsigned int j, float position, float freq_hi, float freq_lo, float& c, float& s) {
    const float e = __fmul_rn((float)j, freq_hi);  // exact
    const float whole = floorf(e);
    const float frac = __fadd_rn(__fsub_rn(e, whole), __fmul_rn((float)j, freq_lo));
    const float angle = __fmul_rn(position, ldexpf(exp2f(-frac), -(int)whole));
    const float k = rintf(__fmul_rn(angle, 0.15915494309189535f));
    const float r = __fsub_rn(__fsub_rn(__fsub_rn(angle, __fmul_rn(k, 6.28125f)), __fmul_rn(k, 0.0019378662109375f)),
                              __fmul_rn(k, -2.559031372584286e-06f));
    sincosf(r, &s, &c);
}
