// Prefill mat-mat Y[tok, row] = W[row] . X[tok] with simdgroup_matrix tiles: a threadgroup of 4
// simdgroups owns a 32-row x 32-token output tile. Per step of 32 along k, its 128 threads
// dequantise the 32x32 weight tile and the 32x32 activation tile into threadgroup memory (8
// values each), then each simdgroup multiplies its 16x16 quarter as 2x2 blocks of 8x8 float
// matrices. Edge tiles are zero-filled (rows, tokens, and k past n for plain types) and written
// back through threadgroup memory with bounds checks. Grid: (ceil(rows/32), ceil(n_tok/32)),
// 128 threads, 8 KiB of threadgroup memory.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"
#include "quant_blocks.h"

#define MM_TILE 32

// GGML type ids of the weights.
#define DS4_T_F32 0
#define DS4_T_F16 1
#define DS4_T_Q8_0 8
#define DS4_T_Q2_K 10
#define DS4_T_Q4_K 12
#define DS4_T_IQ2_XXS 16
#define DS4_T_BF16 30

template <int WT>
static void ds4_mm_weights8(device const uchar* row, uint k, uint n, thread float* v) {
    if (WT == DS4_T_F32) {
        ds4_deq8_f32(row, k, n, v);
    } else if (WT == DS4_T_F16) {
        ds4_deq8_f16(row, k, n, v);
    } else if (WT == DS4_T_BF16) {
        ds4_deq8_bf16(row, k, n, v);
    } else if (WT == DS4_T_Q8_0) {
        ds4_deq8_q8_0(row, k, v);
    } else if (WT == DS4_T_Q2_K) {
        ds4_deq8_q2_k(row, k, v);
    } else if (WT == DS4_T_Q4_K) {
        ds4_deq8_q4_k(row, k, v);
    } else {
        ds4_deq8_iq2_xxs(row, k, v);
    }
}

template <int WT>
static void ds4_mm_act8(device const uchar* row, uint k, uint n, thread float* v) {
    if (WT == DS4_T_F32 || WT == DS4_T_F16 || WT == DS4_T_BF16) {
        ds4_deq8_f32(row, k, n, v);
    } else if (WT == DS4_T_Q8_0) {
        ds4_act8_q8_0(row, k, v);
    } else {
        ds4_act8_q8_k(row, k, v);
    }
}

template <int WT>
static void ds4_matmul_tile(constant ds4_matvec_args& a, device const uchar* w, device const uchar* x,
                            device float* y, threadgroup float* tiles, uint2 tg, uint tid, uint sg) {
    threadgroup float* wt = tiles;                      // [32 rows][32 k]
    threadgroup float* xt = tiles + MM_TILE * MM_TILE;  // [32 tokens][32 k]
    const uint row0 = tg.x * MM_TILE, tok0 = tg.y * MM_TILE;
    const uint r = tid / 4, kp = (tid % 4) * 8;         // this thread's 8 values of each tile
    const uint sr = sg / 2, sc = sg % 2;                // this simdgroup's 16x16 quarter
    simdgroup_float8x8 acc[2][2];
    for (uint i = 0; i < 2; ++i) {
        for (uint j = 0; j < 2; ++j) {
            acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        }
    }
    for (uint k0 = 0; k0 < a.n; k0 += MM_TILE) {
        float v[8];
        const bool k_in = k0 + kp < a.n;
        if (row0 + r < a.rows && k_in) {
            ds4_mm_weights8<WT>(w + (ulong)(row0 + r) * a.row_bytes, k0 + kp, a.n, v);
        } else {
            for (uint j = 0; j < 8; ++j) {
                v[j] = 0.0f;
            }
        }
        for (uint j = 0; j < 8; ++j) {
            wt[r * MM_TILE + kp + j] = v[j];
        }
        if (tok0 + r < a.n_tok && k_in) {
            ds4_mm_act8<WT>(x + (ulong)(tok0 + r) * a.act_bytes, k0 + kp, a.n, v);
        } else {
            for (uint j = 0; j < 8; ++j) {
                v[j] = 0.0f;
            }
        }
        for (uint j = 0; j < 8; ++j) {
            xt[r * MM_TILE + kp + j] = v[j];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < MM_TILE; kk += 8) {
            simdgroup_float8x8 A[2];
            simdgroup_float8x8 B[2];
            for (uint i = 0; i < 2; ++i) {
                simdgroup_load(A[i], wt, MM_TILE, ulong2(kk, sr * 16 + 8 * i));
            }
            for (uint j = 0; j < 2; ++j) {
                simdgroup_load(B[j], xt, MM_TILE, ulong2(kk, sc * 16 + 8 * j), true);
            }
            for (uint i = 0; i < 2; ++i) {
                for (uint j = 0; j < 2; ++j) {
                    simdgroup_multiply_accumulate(acc[i][j], A[i], B[j], acc[i][j]);
                }
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    // C[row][tok] staged in the tile memory (free after the loop's last barrier), then written.
    threadgroup float* ct = tiles;
    for (uint i = 0; i < 2; ++i) {
        for (uint j = 0; j < 2; ++j) {
            simdgroup_store(acc[i][j], ct, MM_TILE, ulong2(sc * 16 + 8 * j, sr * 16 + 8 * i));
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < MM_TILE * MM_TILE; e += 128) {
        const uint tok = e / MM_TILE, row = e % MM_TILE;
        if (tok0 + tok < a.n_tok && row0 + row < a.rows) {
            y[(ulong)(tok0 + tok) * a.y_stride + row0 + row] = ct[row * MM_TILE + tok];
        }
    }
}

kernel void matmul_f32(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                       threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_F32>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_f16(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                       device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                       threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_F16>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_bf16(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_BF16>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_q8_0(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_Q8_0>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_q2_k(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_Q2_K>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_q4_k(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                        device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                        threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_Q4_K>(a, w, x, y, tiles, tg, tid, sg);
}

kernel void matmul_iq2_xxs(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                           device const uchar* x [[buffer(2)]], device float* y [[buffer(3)]],
                           threadgroup float* tiles [[threadgroup(0)]], uint2 tg [[threadgroup_position_in_grid]],
                           uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]) {
    ds4_matmul_tile<DS4_T_IQ2_XXS>(a, w, x, y, tiles, tg, tid, sg);
}

// Weight type of dequantize_rows (a GGML type id: 0, 1, 8, 10, 12, 16 or 30).
constant int FC_DEQ_TYPE [[function_constant(0)]];

// out[row][k..k+7] = the row's dequantised weights, one thread per 8 values: the tile loaders'
// values, checked byte for byte against the CPU dequantiser. Grid (in threads): (n/8 rounded
// up, rows).
kernel void dequantize_rows(constant ds4_matvec_args& a [[buffer(0)]], device const uchar* w [[buffer(1)]],
                            device float* out [[buffer(2)]], uint2 gid [[thread_position_in_grid]]) {
    const uint k = gid.x * 8;
    device const uchar* row = w + (ulong)gid.y * a.row_bytes;
    float v[8];
    if (FC_DEQ_TYPE == DS4_T_F32) {
        ds4_mm_weights8<DS4_T_F32>(row, k, a.n, v);
    } else if (FC_DEQ_TYPE == DS4_T_F16) {
        ds4_mm_weights8<DS4_T_F16>(row, k, a.n, v);
    } else if (FC_DEQ_TYPE == DS4_T_BF16) {
        ds4_mm_weights8<DS4_T_BF16>(row, k, a.n, v);
    } else if (FC_DEQ_TYPE == DS4_T_Q8_0) {
        ds4_mm_weights8<DS4_T_Q8_0>(row, k, a.n, v);
    } else if (FC_DEQ_TYPE == DS4_T_Q2_K) {
        ds4_mm_weights8<DS4_T_Q2_K>(row, k, a.n, v);
    } else if (FC_DEQ_TYPE == DS4_T_Q4_K) {
        ds4_mm_weights8<DS4_T_Q4_K>(row, k, a.n, v);
    } else {
        ds4_mm_weights8<DS4_T_IQ2_XXS>(row, k, a.n, v);
    }
    for (uint j = 0; j < 8 && k + j < a.n; ++j) {
        out[(ulong)gid.y * a.n + k + j] = v[j];
    }
}

// Token embeddings replicated into the n_hc residual streams: out[t][h][...] = dequantised row
// tokens[t] of the table (weight type FC_DEQ_TYPE), the tile loaders' values. Ids outside the
// vocabulary give NaN rows. Grid (threads): (n_embd / 8 rounded up, tokens).
kernel void embed_rows_hc(constant ds4_embed_args& a [[buffer(0)]], device const uchar* table [[buffer(1)]],
                          device const int* tokens [[buffer(2)]], device float* out [[buffer(3)]],
                          uint2 gid [[thread_position_in_grid]]) {
    const uint k = gid.x * 8, t = gid.y;
    const int id = tokens[t];
    float v[8];
    if (id < 0 || uint(id) >= a.n_vocab) {
        for (uint j = 0; j < 8; ++j) {
            v[j] = NAN;
        }
    } else {
        device const uchar* row = table + (ulong)id * a.row_bytes;
        if (FC_DEQ_TYPE == DS4_T_F32) {
            ds4_mm_weights8<DS4_T_F32>(row, k, a.n_embd, v);
        } else if (FC_DEQ_TYPE == DS4_T_F16) {
            ds4_mm_weights8<DS4_T_F16>(row, k, a.n_embd, v);
        } else if (FC_DEQ_TYPE == DS4_T_BF16) {
            ds4_mm_weights8<DS4_T_BF16>(row, k, a.n_embd, v);
        } else if (FC_DEQ_TYPE == DS4_T_Q8_0) {
            ds4_mm_weights8<DS4_T_Q8_0>(row, k, a.n_embd, v);
        } else if (FC_DEQ_TYPE == DS4_T_Q2_K) {
            ds4_mm_weights8<DS4_T_Q2_K>(row, k, a.n_embd, v);
        } else if (FC_DEQ_TYPE == DS4_T_Q4_K) {
            ds4_mm_weights8<DS4_T_Q4_K>(row, k, a.n_embd, v);
        } else {
            ds4_mm_weights8<DS4_T_IQ2_XXS>(row, k, a.n_embd, v);
        }
    }
    for (uint h = 0; h < a.n_hc; ++h) {
        for (uint j = 0; j < 8 && k + j < a.n_embd; ++j) {
            out[((ulong)t * a.n_hc + h) * a.n_embd + k + j] = v[j];
        }
    }
}
