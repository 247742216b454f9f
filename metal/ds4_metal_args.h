// Argument structs of the ds4 Metal kernels, shared by the .metal files and the hosts that bind
// them (the emulator driver in python/ds4/metal_emu, the Objective-C++ host later). Plain 32-bit
// fields only, so the layout is the same in MSL, C++ and numpy structured arrays.
#pragma once

struct ds4_norm_args {
    uint n;            // row length
    uint in_stride;    // floats between input rows
    uint out_stride;   // floats between output rows
    float eps;
};

// y[row] = dot(W row, x) for rows of a weight matrix whose rows are row_bytes apart.
struct ds4_matvec_args {
    uint n;            // elements per weight row
    uint rows;         // weight rows
    uint row_bytes;    // bytes per weight row
    uint n_tok;        // activation rows (1 for decode)
    uint act_bytes;    // bytes between activation rows
    uint y_stride;     // floats between output rows
};

struct ds4_quant_act_args {
    uint n;            // elements per row
    uint act_bytes;    // bytes of one quantised row
};

struct ds4_fp_args {
    uint n;            // values per row that the op covers
    uint row_stride;   // floats between rows
};

struct ds4_rope_args {
    uint n_head, head_dim, n_rot;
    uint pos0;           // row r of the batch is at position pos0 + r
    float freq_scale, ext_factor, attn_factor, corr_low, corr_high, theta_scale, mscale_ext;
    float sin_sign;      // +1 forward, -1 inverse
};

struct ds4_attn_args {
    uint n_head, head_dim;
    uint raw_cap, n_raw, raw_first;   // raw window: a ring of raw_cap rows, oldest at raw_first
    uint n_comp;                      // compressed rows after the raw ones
    float scale;                      // 1/sqrt(head_dim)
};

struct ds4_swiglu_args {
    uint n;
    float clamp;         // <= 1e-6: no clamp
    float scale;
};

struct ds4_hc_args {
    uint n_hc;           // streams (n_hc * n_hc <= 32)
    uint n_embd;
    uint iters;          // Sinkhorn iterations
    float eps;
    uint mix_stride;     // floats between tokens' mix rows
};

struct ds4_indexer_args {
    uint n_rows;       // compressed indexer rows to score
    uint n_head, head_dim;
    float w_scale;     // 1/sqrt(head_dim * n_head), applied to the head weights
};

struct ds4_topk_args {
    uint n, k;
};

struct ds4_pool_args {
    uint head_dim;
    uint ratio;        // 4 (two overlapping lanes) or 128
    uint width;        // floats per frontier row: coff(ratio) * head_dim
};

struct ds4_router_args {
    uint n_expert, n_used;
    float weight_scale;
};

// Expert-indexed mat-vec: slot s multiplies expert ids[s]'s matrix (expert_bytes apart) with the
// activation row at x + (s / slots_per_x) * x_slot_bytes, into y[s * rows ...]. slots_per_x = 1:
// one activation row per slot (the down projection); n_used: the slots of a token share its row
// (gate/up of a batch of tokens); x_slot_bytes = 0: every slot shares one row.
struct ds4_matvec_experts_args {
    uint n, rows, row_bytes;
    uint n_slots;
    uint expert_bytes;
    uint x_slot_bytes;
    uint n_expert;
    uint slots_per_x;
};

struct ds4_elementwise_args {
    uint n;            // elements
    float value;       // fill value
};

struct ds4_comp_store_args {
    uint width;        // coff * head_dim
    uint row;          // frontier row written (ratio 4: 4 + pos % 4; else pos % ratio)
    uint shift_rows;   // compressor_shift: rows copied down (4)
};

struct ds4_embed_args {
    uint n_embd;
    uint row_bytes;    // bytes per table row
    uint n_vocab;
    uint n_hc;         // copies per token
};

struct ds4_sum_rows_args {
    uint n;            // row length
    uint rows;         // rows summed per group
};
