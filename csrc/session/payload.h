// The DSV4 session payload (docs/runtime.md §6.1): 13 u32 header fields, checkpoint tokens, logits,
// per-layer row counts, then every layer's live raw rows, compressed rows and frontiers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "state/kv_state.h"

namespace ds4 {

constexpr uint32_t kPayloadMagic = 0x34565344u;   // "DSV4"
constexpr uint32_t kPayloadVersion = 1;

// The prefill-chunk layout tag upstream writes (header field 3): min(ctx, 2048).
inline int64_t payload_prefill_cap(int64_t ctx) { return ctx < 2048 ? ctx : 2048; }

int64_t payload_bytes(const KvState& kv, int64_t n_tokens);

// Tensors are read through `st` (a download where the backend's memory is not host-visible).
void write_payload(backend::Stream& st, const KvState& kv, const std::vector<int32_t>& tokens,
                   const backend::Tensor& logits, std::vector<uint8_t>& out);

// Parses and validates (docs/runtime.md §6.2) into a fresh state for `into` (initialised with the
// session's shape and ctx). Throws CacheFormat; `into` may be partially written on failure, so
// callers parse into a copy.
void read_payload(backend::Stream& st, const uint8_t* data, size_t size, KvState& into,
                  std::vector<int32_t>& tokens, std::vector<float>& logits);

}  // namespace ds4
