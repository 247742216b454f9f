// The MoE router of one token per threadgroup, one thread per expert: probabilities
// sqrt(softplus(logit)), selection of the n_used best biased probabilities (greater first, lower
// id on ties, as the CPU's insertion top-k) by rank counting, or the token's row of the hash
// table (hash_table[token id][n_used], the host having checked ids against n_expert); weights are the unbiased probabilities of the selected experts divided by their sum
// (clamped below at 2^-14, summed in slot order) times the weight scale.
#include <metal_stdlib>
using namespace metal;

#include "ds4_metal_args.h"

// true: experts come from the hash table (first layers); false: biased top-k.
constant bool FC_ROUTER_HASH [[function_constant(0)]];

// log(1 + e) to a few ulps for any e >= 0 (MSL has no log1p): log(u) * e / (u - 1) with u = 1 + e
// cancels the rounding of u (Goldberg's formulation). Needs IEEE arithmetic (no fast-math
// reassociation of u - 1).
static float ds4_log1p_small(float e) {
    const float u = 1.0f + e;
    if (u == 1.0f) {
        return e;
    }
    return log(u) * (e / (u - 1.0f));
}

static float ds4_softplus(float x) {
    if (x > 20.0f) {
        return x;
    }
    if (x < -20.0f) {
        return exp(x);
    }
    return ds4_log1p_small(exp(x));
}

// tg: n_expert floats (probs), n_expert floats (biased), n_used floats (selected probs).
// Grid: (tokens) threadgroups of n_expert threads (<= 1024).
kernel void router(constant ds4_router_args& a [[buffer(0)]],
                   device const float* logits [[buffer(1)]],
                   device const float* bias [[buffer(2)]],
                   device const int* hash_table [[buffer(3)]],
                   device int* sel [[buffer(4)]],
                   device float* weights [[buffer(5)]],
                   device const int* tokens [[buffer(6)]],
                   threadgroup float* tg [[threadgroup(0)]],
                   uint tok [[threadgroup_position_in_grid]],
                   uint e [[thread_index_in_threadgroup]]) {
    threadgroup float* probs = tg;
    threadgroup float* biased = tg + a.n_expert;
    threadgroup float* chosen = tg + 2 * a.n_expert;
    const float p = sqrt(ds4_softplus(logits[(ulong)tok * a.n_expert + e]));
    probs[e] = p;
    biased[e] = p + bias[e];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    device int* s = sel + (ulong)tok * a.n_used;
    if (FC_ROUTER_HASH) {
        if (e < a.n_used) {
            const int id = hash_table[(ulong)tokens[tok] * a.n_used + e];
            s[e] = id;
            chosen[e] = probs[id];
        }
    } else {
        uint rank = 0;
        const float be = biased[e];
        for (uint j = 0; j < a.n_expert; ++j) {
            const float bj = biased[j];
            if (bj > be || (bj == be && j < e)) {
                ++rank;
            }
        }
        if (rank < a.n_used) {
            s[rank] = int(e);
            chosen[rank] = p;
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (e < a.n_used) {
        float sum = 0.0f;
        for (uint i = 0; i < a.n_used; ++i) {
            sum += chosen[i];
        }
        sum = max(sum, 6.103515625e-5f);
        weights[(ulong)tok * a.n_used + e] = chosen[e] / sum * a.weight_scale;
    }
}
