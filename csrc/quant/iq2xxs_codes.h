// The IQ2_XXS grid (iq2xxs_tables.h) as 2-bit codes, for the VBMI kernels that expand grid rows with
// byte shuffles instead of gathers (dot_avx512vnni.cpp, gemm_avx512vnni.cpp).
//
// Every byte of a grid row is 8, 25 or 43, so row i is eight codes c_j in {0, 1, 2} (value
// 8, 25, 43), code j in bits 2j..2j+1 of a 16-bit word: kIq2GridCodes.word[i]. The low byte holds
// the codes of elements 0..3, the high byte those of elements 4..7 (lo[i], hi[i]: 256-byte tables
// for 128-entry vpermi2b lookups).
#pragma once
#include <cstdint>

#include "quant/iq2xxs_tables.h"

namespace ds4::quant {

struct Iq2GridCodes {
    uint16_t word[256];
    uint8_t lo[256];
    uint8_t hi[256];
    constexpr Iq2GridCodes() : word(), lo(), hi() {
        for (int i = 0; i < 256; ++i) {
            uint16_t c = 0;
            for (int j = 0; j < 8; ++j) {
                const unsigned byte = (unsigned)(kIq2xxsGrid[i] >> (8 * j)) & 0xFF;
                c |= (uint16_t)((byte == 8 ? 0 : byte == 25 ? 1 : 2) << (2 * j));
            }
            word[i] = c;
            lo[i] = (uint8_t)(c & 0xFF);
            hi[i] = (uint8_t)(c >> 8);
        }
    }
};
alignas(64) inline constexpr Iq2GridCodes kIq2GridCodes{};

}  // namespace ds4::quant
