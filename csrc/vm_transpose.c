/* vm_transpose.c: the tile copy of a matrix read through its transpose (vm.c, gather_columns). d[r][c] (rows nc
   elements apart) = s[c * si + r * so] for r < nr, c < nc, elements of esize bytes (4 or 8). A copy of bits: no
   element is converted, so the result is the same whichever path runs.

   Element by element this is one load and one store per element; where the rows of s are contiguous (so == 1) and
   SSE2 is there (every x86-64, the baseline this file is compiled for), 4 x 4 blocks of 4-byte elements are moved
   as four vectors and transposed in registers (unpack: bit moves, NaN payloads kept). */
#include <stdint.h>
#include "vm.h"

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define VM_SSE2 1
#else
#define VM_SSE2 0
#endif

#if VM_SSE2
/* columns [0, nc4) of rows [0, nr4), nc4 and nr4 multiples of 4, of a 4-byte tile whose source rows are contiguous */
static void transpose4_blocks(const uint32_t *s, int64_t si, uint32_t *d, int64_t nr4, int64_t nc4, int64_t nc) {
  int64_t r, c;
  for (c = 0; c < nc4; c += 4)
    for (r = 0; r < nr4; r += 4) {
      __m128i a = _mm_loadu_si128((const __m128i *)(s + c * si + r));
      __m128i b = _mm_loadu_si128((const __m128i *)(s + (c + 1) * si + r));
      __m128i e = _mm_loadu_si128((const __m128i *)(s + (c + 2) * si + r));
      __m128i f = _mm_loadu_si128((const __m128i *)(s + (c + 3) * si + r));
      __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b);
      __m128i ef0 = _mm_unpacklo_epi32(e, f), ef1 = _mm_unpackhi_epi32(e, f);
      _mm_storeu_si128((__m128i *)(d + r * nc + c), _mm_unpacklo_epi64(ab0, ef0));
      _mm_storeu_si128((__m128i *)(d + (r + 1) * nc + c), _mm_unpackhi_epi64(ab0, ef0));
      _mm_storeu_si128((__m128i *)(d + (r + 2) * nc + c), _mm_unpacklo_epi64(ab1, ef1));
      _mm_storeu_si128((__m128i *)(d + (r + 3) * nc + c), _mm_unpackhi_epi64(ab1, ef1));
    }
}
#endif

void vm_transpose_copy(const char *src, int64_t si, int64_t so, char *dst, int64_t nr, int64_t nc, int64_t esize) {
  int64_t r, c, nr4 = 0, nc4 = 0;
  if (esize == 8) {
    const uint64_t *s = (const uint64_t *)src;
    uint64_t *d = (uint64_t *)dst;
    for (c = 0; c < nc; c++)
      for (r = 0; r < nr; r++) d[r * nc + c] = s[c * si + r * so];
    return;
  }
  {
    const uint32_t *s = (const uint32_t *)src;
    uint32_t *d = (uint32_t *)dst;
#if VM_SSE2
    if (so == 1) {
      nr4 = nr / 4 * 4;
      nc4 = nc / 4 * 4;
      transpose4_blocks(s, si, d, nr4, nc4, nc);
    }
#endif
    for (c = 0; c < nc4; c++)  /* the rows past the last block of 4 */
      for (r = nr4; r < nr; r++) d[r * nc + c] = s[c * si + r * so];
    for (c = nc4; c < nc; c++)
      for (r = 0; r < nr; r++) d[r * nc + c] = s[c * si + r * so];
  }
}
