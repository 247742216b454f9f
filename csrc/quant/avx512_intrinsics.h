// <immintrin.h> for the AVX-512 translation units (dot_avx512*, gemm_avx512vnni). Include it first:
// the diagnostic pragmas stay in force for the rest of the including file.
//
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_* idiom
// (GCC PR 105593, fixed in 13); nothing in these files reads an uninitialised value.
#pragma once
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
