// Exact helpers for the FP8 (E4M3) and FP4 (E2M1) round trips, written with integer and
// power-of-two arithmetic only, so that a GPU's approximate log2 or fast-math division cannot
// change a bit: the results equal the CPU's table searches (csrc/layers/fp_quant.cpp).
#pragma once

// ceil(log2f(r)) as the CPU computes it (log2f rounded to float, then ceil), for a normal r > 0.
// With r = m * 2^e (1 <= m < 2): e when m == 1; otherwise e + 1, except when log2(m) is below half
// the float spacing next to e, where log2f(r) rounds to exactly e. That happens for the few
// smallest mantissas once |e| >= 4: mantissa bits below ln(2) * 2^(j-1), j = floor(log2 of the
// value's magnitude) (the table holds the largest such mantissa per j).
static int ds4_ceil_log2f(float r) {
    const uint bits = as_type<uint>(r);
    const int e = int((bits >> 23) & 255u) - 127;
    const uint mant = bits & 0x7fffffu;
    if (mant == 0) {
        return e;
    }
    if (e == 0) {
        return 1;
    }
    const uint ae = uint(e < 0 ? -e : e);
    int j = 31 - int(clz(ae));
    if (e < 0 && (ae & (ae - 1u)) == 0) {
        j -= 1;  // e + log2(m) is just above -|e|: its magnitude lies in the binade below |e|
    }
    const uint max_mant[7] = {0u, 0u, 1u, 2u, 5u, 11u, 22u};
    return (j >= 0 && j < 7 && mant <= max_mant[j]) ? e : e + 1;
}

// 2^ceil(log2f(amax / qmax)): the block scale of both round trips.
static float ds4_pow2_scale(float amax, float qmax) {
    return ldexp(1.0f, ds4_ceil_log2f(amax / qmax));
}

// Nearest E4M3FN value of |v| <= 448 with ties to the even code: below 2^-6 the codes are spaced
// 2^-9, in binade [2^e, 2^(e+1)) they are spaced 2^(e-3); a code's parity is that of the scaled
// value, so rint (ties to even) picks the even code.
static float ds4_e4m3_round(float v) {
    const float ax = min(fabs(v), 448.0f);
    const int e = max(int((as_type<uint>(ax) >> 23) & 255u) - 127, -6);
    const float step = ldexp(1.0f, e - 3);
    const float r = rint(ax / step) * step;
    return v < 0.0f ? -r : r;
}

// Nearest E2M1 value (0, .5, 1, 1.5, 2, 3, 4, 6) of |v| <= 6, ties to the even code.
static float ds4_e2m1_round(float v) {
    const float ax = min(fabs(v), 6.0f);
    const float step = ax < 2.0f ? 0.5f : (ax < 4.0f ? 1.0f : 2.0f);
    const float r = rint(ax / step) * step;
    return v < 0.0f ? -r : r;
}
