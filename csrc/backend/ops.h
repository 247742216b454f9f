// The operations of the DS4 forward pass, at the granularity a GPU backend implements with one or
// a few kernels each (close to upstream's GPU op list). Every op is a plain argument struct; the
// graph (engine/forward.cpp) fills them and calls the matching Stream method (backend/backend.h).
//
// Conventions
//   * Activations are F32 tensors of rows (ne[1] = tokens of the batch unless said otherwise).
//   * Weights are `const TensorRef&` views inside the mapped GGUF (model/tensor.h): `data` is the
//     host address inside the mapping that Backend::map_model() registered, so a GPU backend finds
//     the weight at byte (data - map base) of its zero-copy model buffer. Never copied.
//   * Integer/index arguments that the host decides (positions, row counts, ring slots) are plain
//     values: the graph never reads device memory back to decide what to do next.
//   * The float order of every op is part of its contract: the CPU scalar path reproduces
//     upstream's strict CPU build bit for bit (docs/architecture.md, "numerics").
#pragma once
#include <cstdint>

#include "backend/tensor.h"
#include "model/rope_params.h"
#include "model/tensor.h"

namespace ds4 {
namespace backend {

enum class Op : int {
    EmbedTokensHc,     // token embedding rows, replicated into the n_hc residual streams
    RmsNorm,           // per row, plain (weight null) or weighted
    HeadRmsNorm,       // per head of each row, plain, in place
    Linear,            // y = W x for every row (matvec for one row, matmul for many), any weight type
    LinearGroup,       // y_i = W_i x for several weights over one input: x prepared once per activation type
    GroupedOutputA,    // attention output A: group g of the heads through rows g*rank.. of Wa
    HcPre,             // HC pre: RMS(flat) -> mix projection -> Sinkhorn split -> weighted sum
    HcPost,            // HC post: block * post + comb^T * residual
    HcCollapseNorm,    // output head: sigmoid-weighted stream collapse then weighted RMSNorm
    RopeTail,          // RoPE (or its inverse) on the last n_rot dims of each head, YaRN included
    Fp8KvRoundtrip,    // FP8 E4M3 round trip of the non-RoPE dims (blocks of 64)
    StoreRowF16,       // copy rows into a cache with the f16 round trip (raw window / compressed rows)
    CompressorStore,   // add the APE row to the score and write kv/score into the frontier
    CompressorPool,    // softmax pool of the frontier -> RMSNorm -> RoPE -> FP8 or Hadamard+FP4
    CompressorShift,   // ratio 4: the current window becomes the previous one
    IndexerScores,     // indexer query prep (RoPE, Hadamard, FP4, weight scale) + scores of every row
    TopKMask,          // top-k of the scores (score desc, index asc) as a 0/1 mask
    Attention,         // raw window + compressed rows (optionally masked) with sinks, per head
    AttentionBlock,    // Attention for several consecutive query tokens at once (prefill)
    Router,            // sqrt-softplus probs, hash or biased top-k selection, normalised weights
    RoutedExperts,     // gate/up -> SwiGLU(clamp) * route weight -> down, summed over the slots
    Swiglu,            // silu(min(g,c)) * clamp(u,-c,c) * scale (shared expert)
    Add,               // out = a + b, elementwise
    Fill,              // every element = value
    Copy,              // bytes of src into dst (same size)
    Argmax,            // index of the largest element of one row (first on ties)
    kCount
};

const char* op_name(Op op);

struct EmbedTokensHcArgs {
    const TensorRef* table;      // token_embd [n_embd x n_vocab], any dequantisable type
    const int32_t* tokens;       // host array of n token ids, each in [0, n_vocab)
    int64_t n;
    int n_hc;
    Tensor out;                  // n rows of n_hc * n_embd: the embedding repeated per stream
};

struct RmsNormArgs {
    Tensor x;                    // rows of n
    Tensor out;                  // same shape (may alias x)
    const TensorRef* weight;     // F32 [n], or nullptr for the plain norm
    float eps;
};

struct HeadRmsNormArgs {
    Tensor x;                    // rows of n_head * head_dim, normalised in place per head
    int64_t n_head, head_dim;
    float eps;
};

struct LinearArgs {
    const TensorRef* w;          // [n x out] any weight type
    Tensor x;                    // rows of n (x.width() == w->ne[0])
    Tensor y;                    // rows of out
};

// Several linears over the same input rows (the attention input feeds up to 7 projections, the
// FFN input 3): each output is exactly what Linear computes for its weight (same kernels, same
// per-row order), but the input is prepared once per activation type the weights need (Q8_0-act,
// Q8_K, floats) and a backend may run all the products in one dispatch. docs/architecture.md.
struct LinearGroupArgs {
    static constexpr int kMax = 8;
    Tensor x;                            // rows of n (every weight's ne[0] == n)
    int count = 0;
    const TensorRef* w[kMax] = {};       // [n x out_i] any weight types, mixed
    Tensor y[kMax];                      // rows of out_i, one per row of x (must not alias x)

    LinearGroupArgs() = default;
    explicit LinearGroupArgs(const Tensor& input) : x(input) {}
    // Appends W -> y; more than kMax members throws InvalidArgument (ops.cpp).
    LinearGroupArgs& add(const TensorRef* weight, const Tensor& out);
};

// Throws InvalidArgument unless W is set, x rows are W.ne[0] wide and y holds one row of W.ne[1]
// per row of x (backends check this before touching memory).
void check_linear(const LinearArgs& a);

// Throws InvalidArgument unless every member fits: W.ne[0] == x width, y rows of W.ne[1], one
// per row of x (backends check this before touching memory).
void check_linear_group(const LinearGroupArgs& a);

struct GroupedOutputAArgs {
    const TensorRef* wa;         // [group_dim x n_group*rank]
    Tensor heads;                // rows of n_group * group_dim
    Tensor low;                  // rows of n_group * rank
    int64_t n_group, rank;
};

// An HC split row holds hc_mix = 2*n_hc + n_hc^2 floats: pre[n_hc], post[n_hc], comb[n_hc*n_hc]
// with comb[n_hc*src + dst].
struct HcPreArgs {
    const TensorRef* fn;         // mix projection [hc_dim x hc_mix]
    const TensorRef* scale;      // F32 [3]
    const TensorRef* base;       // F32 [hc_mix]
    Tensor H;                    // rows of hc_dim (n_hc streams of n_embd)
    Tensor x;                    // rows of n_embd: the sublayer input
    Tensor split;                // rows of hc_mix
    int n_hc, sinkhorn_iters;
    float rms_eps, hc_eps;
};

struct HcPostArgs {
    Tensor block;                // rows of n_embd: the sublayer output
    Tensor residual;             // rows of hc_dim
    Tensor split;                // rows of hc_mix (from HcPre)
    Tensor out;                  // rows of hc_dim (must not alias residual)
    int n_hc;
};

struct HcCollapseNormArgs {
    const TensorRef* fn;         // [hc_dim x n_hc]
    const TensorRef* scale;      // F32 [1]
    const TensorRef* base;       // F32 [n_hc]
    const TensorRef* norm;       // F32 [n_embd]
    Tensor H;                    // one row of hc_dim
    Tensor y;                    // one row of n_embd
    int n_hc;
    float rms_eps, hc_eps;
};

struct RopeTailArgs {
    Tensor x;                    // rows of n_head * head_dim, rotated in place
    int64_t n_head, head_dim, n_rot;
    int64_t pos0;                // row r is at position pos0 + r
    RopeParams rope;
    bool inverse;
};

struct Fp8KvRoundtripArgs {
    Tensor x;                    // rows of head_dim, in place
    int64_t head_dim, n_rot;
};

struct StoreRowF16Args {
    Tensor src;                  // rows of width
    Tensor dst;                  // destination rows (same width); row i of src -> dst row i
};

// The compressor frontier of one lane: 2*ratio rows (ratio 4: previous + current window) or
// ratio rows (ratio 128) of coff*head_dim floats, kv and score side by side in two tensors.
struct CompressorStoreArgs {
    const TensorRef* ape;        // [coff*head_dim x ratio]
    Tensor kv_cur, score_cur;    // one row of coff*head_dim each (score_cur gets the APE added)
    Tensor state_kv, state_score;  // written at row Shape::frontier_row(ratio, pos)
    int ratio;
    int64_t head_dim;
    int64_t pos;
};

struct CompressorPoolArgs {
    const TensorRef* norm;       // F32 [head_dim]
    Tensor state_kv, state_score;
    Tensor out;                  // one row of head_dim (before the cache's f16 round trip)
    int ratio;
    int64_t head_dim, n_rot;
    float eps;
    RopeParams rope;
    int64_t pos;                 // position of the window's first token
    bool fp8;                    // true: FP8 on the non-RoPE dims; false: Hadamard-128 + FP4
};

struct CompressorShiftArgs {
    Tensor state_kv, state_score;  // ratio-4 frontier: rows 4..7 are copied onto rows 0..3
    int64_t head_dim;
};

struct IndexerScoresArgs {
    Tensor q;                    // one row of n_head * head_dim (modified: RoPE, Hadamard, FP4)
    Tensor w;                    // one row of n_head (modified: scaled by 1/sqrt(head_dim*n_head))
    Tensor rows;                 // compressed indexer rows (at least n_rows of head_dim)
    int64_t n_rows;
    int64_t n_head, head_dim, n_rot;
    int64_t pos;
    RopeParams rope;
    Tensor scores;               // n_rows floats
};

struct TopKMaskArgs {
    Tensor scores;               // n floats
    int64_t n, k;
    Tensor mask;                 // U8, n entries: 1 = kept (row 0 also kept when fewer than k qualify)
};

struct AttentionArgs {
    Tensor q;                    // one row of n_head * head_dim (RoPE'd)
    Tensor raw;                  // ring of raw_cap rows of head_dim
    int64_t raw_cap, n_raw;
    int64_t raw_first;           // ring slot of the oldest live row
    Tensor comp;                 // compressed rows (n_comp of head_dim), unused when n_comp == 0
    int64_t n_comp;
    Tensor mask;                 // U8 n_comp, or empty: every compressed row visible
    const TensorRef* sinks;      // F32 [n_head]
    int64_t n_head, head_dim;
    Tensor out;                  // one row of n_head * head_dim
};

// Attention for nq consecutive tokens at positions p0.., as if each ran Attention right after its own
// raw row was pushed: query j sees the newest min(raw_cap, n_raw + j + 1) positions up to p0 + j,
// oldest first (the ring's rows for positions before p0, then fresh rows 0..j), then the first
// n_comp[j] compressed rows (those allowed by mask row j from query mask_first on). The ring is not written: the graph pushes the
// fresh rows after the op (a block may be longer than the ring). Each query's result is what
// Attention computes for it, bit for bit on the CPU backend (docs/kernels.md "Attention").
struct AttentionBlockArgs {
    Tensor q;                    // nq rows of n_head * head_dim (RoPE'd)
    Tensor raw;                  // ring of raw_cap rows of head_dim, as it was before the block
    int64_t raw_cap, n_raw;      // n_raw: live rows before the block
    int64_t raw_first;           // ring slot of the oldest live row (before the block)
    Tensor fresh;                // nq rows of head_dim: the block's own rows, already f16-rounded
    Tensor comp;                 // compressed rows (at least n_comp[nq-1]), unused when they are all 0
    const int64_t* n_comp;       // host, nq non-decreasing counts
    Tensor mask;                 // U8 nq rows of mask_stride (>= n_comp[j]), or empty: all visible
    int64_t mask_stride;
    int64_t mask_first;          // queries before it see every compressed row (the indexer not yet on)
    const TensorRef* sinks;      // F32 [n_head]
    int64_t n_head, head_dim;
    Tensor out;                  // nq rows of n_head * head_dim
};

struct RouterArgs {
    Tensor logits;               // rows of n_expert
    const int32_t* tokens;       // host, one per row (hash routing)
    const TensorRef* bias;       // F32 [n_expert] or nullptr
    const TensorRef* hash;       // I32 [n_used x n_vocab] token -> experts, or nullptr (top-k)
    int n_expert, n_used;
    float weight_scale;
    Tensor sel;                  // I32 rows of n_used
    Tensor weights;              // F32 rows of n_used
};

struct RoutedExpertsArgs {
    const TensorRef* gate;       // [n_embd x n_ff x n_expert]
    const TensorRef* up;
    const TensorRef* down;       // [n_ff x n_embd x n_expert]
    Tensor x;                    // rows of n_embd
    Tensor sel, weights;         // rows of n_used (from Router)
    int n_expert, n_used;
    int64_t n_ff;
    float clamp;
    Tensor out;                  // rows of n_embd: sum over slots, in slot order
};

struct SwigluArgs {
    Tensor g, u, out;            // same shape
    float clamp, scale;
};

struct AddArgs {
    Tensor a, b, out;            // same element count; out may alias a or b
};

struct FillArgs {
    Tensor t;
    float value;                 // F32 tensors
};

struct CopyArgs {
    Tensor src, dst;             // same byte size
};

struct ArgmaxArgs {
    Tensor x;                    // one row
    int32_t* result;             // host
};

}  // namespace backend
}  // namespace ds4
