// Weight and activation block layouts as the GPU reads them (docs/metal.md, "Quant blocks"), and
// the per-block integer dot products of each weight type against its activation format. Each
// block function reproduces the CPU kernel's integer sums exactly and its float combination of
// one block in the same order (csrc/quant/dot_scalar.cpp); only the order in which block values
// are added up differs (lanes, then a simd_sum tree).
#pragma once

#include "iq2xxs_tables.h"

struct ds4_block_q8_0 { half d; int8_t qs[32]; };                                   // 34 bytes
struct ds4_block_q2_k { uchar scales[16]; uchar qs[64]; half d; half dmin; };         // 84
struct ds4_block_q4_k { half d; half dmin; uchar scales[12]; uchar qs[128]; };        // 144
struct ds4_block_iq2_xxs { half d; ushort qs[32]; };                                  // 66
struct ds4_block_q8_0_act { float d; int8_t qs[32]; };                               // 36
struct ds4_block_q8_k { float d; int8_t qs[256]; short bsums[16]; };                 // 292

// Q8_0 x Q8_0-act: (d_w * d_x) * sum(q_w * q_x).
struct ds4_q8_0 {
    typedef ds4_block_q8_0 W;
    typedef ds4_block_q8_0_act A;
    static float dot(device const W* w, device const A* x) {
        int isum = 0;
        for (int i = 0; i < 32; ++i) {
            isum += int(w->qs[i]) * int(x->qs[i]);
        }
        return (float(w->d) * x->d) * float(isum);
    }
    static float finish(float s) { return s; }
};

// Q2_K x Q8_K: 16 sub-blocks of 16 with 4-bit scale and 4-bit min; the min term uses the
// activation's bsums.
struct ds4_q2_k {
    typedef ds4_block_q2_k W;
    typedef ds4_block_q8_k A;
    static float dot(device const W* w, device const A* x) {
        int summs = 0;
        for (int j = 0; j < 16; ++j) {
            summs += int(x->bsums[j]) * int(w->scales[j] >> 4);
        }
        const float dall = x->d * float(w->d);
        const float dmin = x->d * float(w->dmin);
        int isum = 0;
        for (int h = 0; h < 2; ++h) {
            device const uchar* q2 = w->qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                device const int8_t* q8 = x->qs + 128 * h + 32 * j;
                for (int half_ = 0; half_ < 2; ++half_) {
                    int s = 0;
                    for (int l = 16 * half_; l < 16 * half_ + 16; ++l) {
                        s += int(q8[l]) * int((q2[l] >> (2 * j)) & 3);
                    }
                    isum += int(w->scales[8 * h + 2 * j + half_] & 15) * s;
                }
            }
        }
        return dall * float(isum) - dmin * float(summs);
    }
    static float finish(float s) { return s; }
};

// Q4_K's eight 6-bit (scale, min) pairs packed in 12 bytes.
static void ds4_q4k_scale_min(device const uchar* s, int k, thread int& sc, thread int& m) {
    if (k < 4) {
        sc = s[k] & 63;
        m = s[k + 4] & 63;
    } else {
        sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
}

// Q4_K x Q8_K: 8 sub-blocks of 32 (low nibbles then high nibbles of 32 bytes).
struct ds4_q4_k {
    typedef ds4_block_q4_k W;
    typedef ds4_block_q8_k A;
    static float dot(device const W* w, device const A* x) {
        int sc[8];
        int summs = 0;
        for (int k = 0; k < 8; ++k) {
            int m;
            ds4_q4k_scale_min(w->scales, k, sc[k], m);
            summs += (int(x->bsums[2 * k]) + int(x->bsums[2 * k + 1])) * m;
        }
        int isum = 0;
        for (int c = 0; c < 4; ++c) {
            device const uchar* q = w->qs + 32 * c;
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; ++l) {
                lo += int(x->qs[64 * c + l]) * int(q[l] & 15);
                hi += int(x->qs[64 * c + 32 + l]) * int(q[l] >> 4);
            }
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        const float d = x->d * float(w->d);
        const float dmin = x->d * float(w->dmin);
        return d * float(isum) - dmin * float(summs);
    }
    static float finish(float s) { return s; }
};

// IQ2_XXS x Q8_K: per 32 values, four lattice rows (8 magnitudes each) with 7-bit sign codes and a
// 4-bit scale; the block sum is scaled by 0.125 once at the end, as on the CPU.
struct ds4_iq2_xxs {
    typedef ds4_block_iq2_xxs W;
    typedef ds4_block_q8_k A;
    static float dot(device const W* w, device const A* x) {
        const float d = float(w->d) * x->d;
        int bsum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const uint a = uint(w->qs[4 * ib]) | (uint(w->qs[4 * ib + 1]) << 16);
            const uint s = uint(w->qs[4 * ib + 2]) | (uint(w->qs[4 * ib + 3]) << 16);
            device const int8_t* q8 = x->qs + 32 * ib;
            int sumi = 0;
            for (int l = 0; l < 4; ++l) {
                const ulong g = ds4_iq2xxs_grid[(a >> (8 * l)) & 255];
                const uint signs = ds4_iq2xxs_signs[(s >> (7 * l)) & 127];
                for (int j = 0; j < 8; ++j) {
                    const int v = int((g >> (8 * j)) & 255);
                    sumi += ((signs >> j) & 1 ? -v : v) * int(q8[8 * l + j]);
                }
            }
            bsum += sumi * int(2 * (s >> 28) + 1);
        }
        return d * float(bsum);
    }
    static float finish(float s) { return 0.125f * s; }
};

// Plain weights against float activations, one element per "block" so lanes read neighbours.
struct ds4_f16 {
    typedef half W;
    typedef float A;
    static float dot(device const W* w, device const A* x) { return float(*w) * *x; }
    static float finish(float s) { return s; }
};

// BF16 stores the high 16 bits of a float: widening is a shift, exact like the CPU's.
static inline float ds4_bf16_to_float(ushort b) { return as_type<float>(uint(b) << 16); }

struct ds4_bf16 {
    typedef ushort W;
    typedef float A;
    static float dot(device const W* w, device const A* x) { return ds4_bf16_to_float(*w) * *x; }
    static float finish(float s) { return s; }
};

struct ds4_f32 {
    typedef float W;
    typedef float A;
    static float dot(device const W* w, device const A* x) { return *w * *x; }
    static float finish(float s) { return s; }
};

// ---- dequantisation of 8 consecutive weights (element k of a row, k a multiple of 8) -------------
// The CPU dequantiser's float expressions (csrc/quant/dequantize.cpp), so the values are exact
// copies of ds4._core.dequantize. Used to fill threadgroup tiles in the mat-mat kernels.

static void ds4_deq8_q8_0(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_q8_0* b = (device const ds4_block_q8_0*)row + k / 32;
    const float d = float(b->d);
    for (uint j = 0; j < 8; ++j) {
        out[j] = d * float(b->qs[k % 32 + j]);
    }
}

static void ds4_deq8_q2_k(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_q2_k* b = (device const ds4_block_q2_k*)row + k / 256;
    const uint i = k % 256, h = i / 128, j = (i % 128) / 32, l0 = i % 32;
    const uchar sc = b->scales[8 * h + 2 * j + l0 / 16];
    const float dl = float(b->d) * float(sc & 15);
    const float ml = float(b->dmin) * float(sc >> 4);
    for (uint t = 0; t < 8; ++t) {
        out[t] = dl * float((b->qs[32 * h + l0 + t] >> (2 * j)) & 3) - ml;
    }
}

static void ds4_deq8_q4_k(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_q4_k* b = (device const ds4_block_q4_k*)row + k / 256;
    const uint i = k % 256, c = i / 64, hi = (i % 64) / 32, l0 = i % 32;
    int sc, m;
    ds4_q4k_scale_min(b->scales, int(2 * c + hi), sc, m);
    const float d = float(b->d) * float(sc);
    const float mm = float(b->dmin) * float(m);
    for (uint t = 0; t < 8; ++t) {
        const uchar q = b->qs[32 * c + l0 + t];
        out[t] = d * float(hi ? (q >> 4) : (q & 15)) - mm;
    }
}

static void ds4_deq8_iq2_xxs(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_iq2_xxs* b = (device const ds4_block_iq2_xxs*)row + k / 256;
    const uint i = k % 256, ib = i / 32, l = (i % 32) / 8;
    const uint a = uint(b->qs[4 * ib]) | (uint(b->qs[4 * ib + 1]) << 16);
    const uint s = uint(b->qs[4 * ib + 2]) | (uint(b->qs[4 * ib + 3]) << 16);
    const float db = float(b->d) * (0.5f + float(s >> 28)) * 0.25f;
    const ulong g = ds4_iq2xxs_grid[(a >> (8 * l)) & 255];
    const uint signs = ds4_iq2xxs_signs[(s >> (7 * l)) & 127];
    for (uint j = 0; j < 8; ++j) {
        out[j] = db * float((g >> (8 * j)) & 255) * ((signs >> j) & 1 ? -1.0f : 1.0f);
    }
}

// Plain types: n need not be a multiple of 8; values past n read as 0.
static void ds4_deq8_f16(device const uchar* row, uint k, uint n, thread float* out) {
    device const half* w = (device const half*)row;
    for (uint j = 0; j < 8; ++j) {
        out[j] = k + j < n ? float(w[k + j]) : 0.0f;
    }
}

static void ds4_deq8_bf16(device const uchar* row, uint k, uint n, thread float* out) {
    device const ushort* w = (device const ushort*)row;
    for (uint j = 0; j < 8; ++j) {
        out[j] = k + j < n ? ds4_bf16_to_float(w[k + j]) : 0.0f;
    }
}

static void ds4_deq8_f32(device const uchar* row, uint k, uint n, thread float* out) {
    device const float* w = (device const float*)row;
    for (uint j = 0; j < 8; ++j) {
        out[j] = k + j < n ? w[k + j] : 0.0f;
    }
}

// Activations: Q8_0-act and Q8_K blocks are d * q; float rows are read as they are.
static void ds4_act8_q8_0(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_q8_0_act* b = (device const ds4_block_q8_0_act*)row + k / 32;
    for (uint j = 0; j < 8; ++j) {
        out[j] = b->d * float(b->qs[k % 32 + j]);
    }
}

static void ds4_act8_q8_k(device const uchar* row, uint k, thread float* out) {
    device const ds4_block_q8_k* b = (device const ds4_block_q8_k*)row + k / 256;
    for (uint j = 0; j < 8; ++j) {
        out[j] = b->d * float(b->qs[k % 256 + j]);
    }
}
