/* vm_gemm.h: the blocked contraction that runs the multiply-then-sum form of matmul. Panels of A (MR rows) and B (NR
   columns) are packed contiguously per cache block, and an MR x NR register tile accumulates over the packed depth.
   vm_simd.c includes this file per instruction set and element type: GT is float or double, GFN(name) names the
   clone, VM_VBYTES is the vector width. GCC/clang vector extensions give the register tile; others get scalar loops. */

#define G_MR 6
#define G_VL (VM_VBYTES / (int)sizeof(GT))
#define G_NR (2 * G_VL)
#define G_KC 256
#define G_MC 96
#define G_NC 2048
#define G_DJ 5
#if VM_VBYTES == 64  /* 20 accumulators and 5 operands: AVX-512 has the 32 registers they need */
#define G_DR 4
#else
#define G_DR 2
#endif

/* rows [i0, i0+mc) x depth [p0, p0+kc) of A into MR-row panels (zero rows pad the last panel) */
VM_TGT static void GFN(pack_a)(GT *dst, const GT *a, int64_t mc, int64_t kc, int64_t sn, int64_t sk) {
  int64_t ir, p, i;
  for (ir = 0; ir < mc; ir += G_MR) {
    int64_t rows = mc - ir < G_MR ? mc - ir : G_MR;
    for (p = 0; p < kc; p++) {
      for (i = 0; i < rows; i++) dst[p * G_MR + i] = a[(ir + i) * sn + p * sk];
      for (; i < G_MR; i++) dst[p * G_MR + i] = 0;
    }
    dst += G_MR * kc;
  }
}

/* depth [p0, p0+kc) x columns [j0, j0+nc) of B into NR-column panels */
VM_TGT static void GFN(pack_b)(GT *dst, const GT *b, int64_t kc, int64_t nc, int64_t sk, int64_t sm) {
  int64_t jr, p, j;
  for (jr = 0; jr < nc; jr += G_NR) {
    int64_t cols = nc - jr < G_NR ? nc - jr : G_NR;
    if (sm == 1 || sk != 1) {
      for (p = 0; p < kc; p++) {
        const GT *src = b + p * sk + jr * sm;
        GT *o = dst + p * G_NR;
        if (sm == 1) for (j = 0; j < cols; j++) o[j] = src[j];
        else for (j = 0; j < cols; j++) o[j] = src[j * sm];
        for (; j < G_NR; j++) o[j] = 0;
      }
    } else {  /* a transposed operand (w.T): read each column along its contiguous depth */
      for (j = 0; j < cols; j++) {
        const GT *src = b + (jr + j) * sm;
        for (p = 0; p < kc; p++) dst[p * G_NR + j] = src[p];
      }
      for (; j < G_NR; j++)
        for (p = 0; p < kc; p++) dst[p * G_NR + j] = 0;
    }
    dst += G_NR * kc;
  }
}

/* C[0:mr, 0:nr] (+)= A panel x packed B panel over depth kc. A's element (row i, depth p) is ap[i * ars + p * aps]:
   a packed panel (ars 1, aps MR), or A's own rows when they run along the depth (ars the row stride, aps 1), which
   spares packing them: rows past mr read row 0 again, and their sums are dropped. */
VM_TGT static void GFN(micro)(int64_t kc, const GT *ap, int64_t ars, int64_t aps, const GT *bp, GT *c, int64_t scn,
                              int64_t scm, int64_t mr, int64_t nr, int accum) {
  GT tile[G_MR * G_NR];
  const GT *ar[G_MR];
  int64_t i, j, p;
  for (i = 0; i < G_MR; i++) ar[i] = ap + (i < mr ? i : 0) * ars;
#if defined(__GNUC__)
  GV acc[G_MR][2];
  memset(acc, 0, sizeof acc);
  for (p = 0; p < kc; p++) {
    GV b0, b1;
    memcpy(&b0, bp + p * G_NR, sizeof b0);
    memcpy(&b1, bp + p * G_NR + G_VL, sizeof b1);
    for (i = 0; i < G_MR; i++) {
      GT av = ar[i][p * aps];
      G_MADD(acc[i][0], av, b0);
      G_MADD(acc[i][1], av, b1);
    }
  }
  if (mr == G_MR && nr == G_NR && scm == 1) {  /* full tile, contiguous rows: vector stores */
    for (i = 0; i < G_MR; i++) {
      GT *row = c + i * scn;
      if (accum) {
        GV c0, c1;
        memcpy(&c0, row, sizeof c0);
        memcpy(&c1, row + G_VL, sizeof c1);
        acc[i][0] += c0;
        acc[i][1] += c1;
      }
      memcpy(row, &acc[i][0], sizeof acc[i][0]);
      memcpy(row + G_VL, &acc[i][1], sizeof acc[i][1]);
    }
    return;
  }
  for (i = 0; i < G_MR; i++) {
    memcpy(tile + i * G_NR, &acc[i][0], sizeof acc[i][0]);
    memcpy(tile + i * G_NR + G_VL, &acc[i][1], sizeof acc[i][1]);
  }
#else
  for (i = 0; i < G_MR * G_NR; i++) tile[i] = 0;
  for (p = 0; p < kc; p++)
    for (i = 0; i < G_MR; i++)
      for (j = 0; j < G_NR; j++) tile[i * G_NR + j] += ar[i][p * aps] * bp[p * G_NR + j];
#endif
  for (i = 0; i < mr; i++)
    for (j = 0; j < nr; j++) {
      GT *o = c + i * scn + j * scm;
      *o = accum ? *o + tile[i * G_NR + j] : tile[i * G_NR + j];
    }
}

/* the sum of v's lanes, halving: lane l + lane l + VL/2, and so on down to one (gemm_dot's portable path adds in
   this order, hsum4 in its own: the bits may differ between builds, never between thread counts). On x86 the halves are taken with intrinsics: a memcpy of part of v would keep v, and with it the
   accumulators of gemm_dot, in memory */
#if defined(__GNUC__)
VM_TGT static inline GT GFN(hsum)(GV v) {
  GT t[16 / sizeof(GT)];
#if VM_X86 && VM_VBYTES >= 32 && defined(G_F32)
#if VM_VBYTES == 64
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256((__m512)v), _mm512_extractf32x8_ps((__m512)v, 1));
#else
  __m256 h = (__m256)v;
#endif
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
#elif VM_X86 && VM_VBYTES >= 32
#if VM_VBYTES == 64
  __m256d h = _mm256_add_pd(_mm512_castpd512_pd256((__m512d)v), _mm512_extractf64x4_pd((__m512d)v, 1));
#else
  __m256d h = (__m256d)v;
#endif
  __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
#else
#if VM_VBYTES == 64
  G32 h, h2;
  memcpy(&h, &v, 32);
  memcpy(&h2, (const char *)&v + 32, 32);
  h += h2;
#elif VM_VBYTES == 32
  GV h = v;
#endif
#if VM_VBYTES >= 32
  G16 q, q2;
  memcpy(&q, &h, 16);
  memcpy(&q2, (const char *)&h + 16, 16);
  q += q2;
#else
  GV q = v;
#endif
#endif
  memcpy(t, &q, 16);
#if defined(G_F32)
  return (t[0] + t[2]) + (t[1] + t[3]);
#else
  return t[0] + t[1];
#endif
}
#endif

/* the lane sums of four float32 vectors at once (gemm_dot's tile ends with 20 of them): pairs interleaved and added,
   then the 128-bit lanes; a third of the shuffles of four hsum calls. Elsewhere four hsum calls */
#if defined(__GNUC__)
VM_TGT static inline void GFN(hsum4)(GV x0, GV x1, GV x2, GV x3, GT *o0, GT *o1, GT *o2, GT *o3) {
#if VM_X86 && VM_VBYTES == 64 && defined(G_F32)
  __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps((__m512)x0, (__m512)x1), _mm512_unpackhi_ps((__m512)x0, (__m512)x1));
  __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps((__m512)x2, (__m512)x3), _mm512_unpackhi_ps((__m512)x2, (__m512)x3));
  __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xee));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
#elif VM_X86 && VM_VBYTES == 32 && defined(G_F32)
  __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps((__m256)x0, (__m256)x1), _mm256_unpackhi_ps((__m256)x0, (__m256)x1));
  __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps((__m256)x2, (__m256)x3), _mm256_unpackhi_ps((__m256)x2, (__m256)x3));
  __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, 0x44), _mm256_shuffle_ps(t0, t1, 0xee));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
#endif
#if VM_X86 && VM_VBYTES >= 32 && defined(G_F32)
  GT t[4];
  memcpy(t, &q, sizeof t);
  *o0 = t[0]; *o1 = t[1]; *o2 = t[2]; *o3 = t[3];
#else
  *o0 = GFN(hsum)(x0); *o1 = GFN(hsum)(x1); *o2 = GFN(hsum)(x2); *o3 = GFN(hsum)(x3);
#endif
}
#endif

/* C[i0:i1, j0:j1] (+)= A B over depth [pc, pc+kc) for a narrow C (fewer columns than VM_GEMM_NARROW) whose A rows
   run along the depth. A tile with vectors along C's columns would leave most lanes empty (10 of 16 at m = 10) and
   broadcast one A element per multiply-add; here vectors run along the depth instead: every element of C is a dot
   product of an A row (read in place) and a B column, and a tile of DR rows x DJ columns keeps DR x DJ vector
   accumulators, loading DR + DJ vectors per DR x DJ multiply-adds, every lane busy. The lanes are summed at the end
   (hsum) and the depth's last kc % VL products added in order. B's columns are copied, zero padded to a multiple of
   DJ, into bt first (column j at bt + j * kcs); rows past i1 read row i0 again and are dropped. Each element's sum
   runs in the same order whatever rows or columns the call covers, so any split of C gives the same bits. */
VM_TGT static void GFN(gemm_dot)(const vm_gemm *g, const GT *a, const GT *b, GT *c, int64_t i0, int64_t i1,
                                 int64_t j0, int64_t j1, int64_t pc, int64_t kc, GT *bt) {
  int64_t nj = j1 - j0, njp = (nj + G_DJ - 1) / G_DJ * G_DJ, kcs = (kc + 15) / 16 * 16, kv = kc / G_VL * G_VL;
  int64_t jg, i, j, p, r, q;
  if (g->sbk == 1)
    for (j = 0; j < nj; j++) memcpy(bt + j * kcs, b + pc + (j0 + j) * g->sbm, (size_t)kc * sizeof(GT));
  else  /* B's rows hold the columns side by side: read each row once, along its contiguous side */
    for (p = 0; p < kc; p++) {
      const GT *src = b + (pc + p) * g->sbk + j0 * g->sbm;
      for (j = 0; j < nj; j++) bt[j * kcs + p] = src[j * g->sbm];
    }
  for (j = nj; j < njp; j++) memset(bt + j * kcs, 0, (size_t)kc * sizeof(GT));
  for (i = i0; i < i1; i += G_DR) {
    const GT *ar[G_DR];
    int64_t rows = i1 - i < G_DR ? i1 - i : G_DR;
    for (r = 0; r < G_DR; r++) ar[r] = a + (i + (r < rows ? r : 0)) * g->san + pc;
    for (jg = 0; jg < njp; jg += G_DJ) {
      const GT *bc = bt + jg * kcs;
      GT s[G_DR][G_DJ];
#if defined(__GNUC__)
      {  /* named accumulators c<row><column>: an array of them would live in memory */
#define G_DOT_DECL(r) \
        GV a##r, c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z, c##r##4 = z;
#define G_DOT_SUM(r) GFN(hsum4)(c##r##0, c##r##1, c##r##2, c##r##3, &s[r][0], &s[r][1], &s[r][2], &s[r][3]);
        GV z = {0}, bv;
        G_DOT_DECL(0) G_DOT_DECL(1)
#if G_DR == 4
        G_DOT_DECL(2) G_DOT_DECL(3)
#define G_DOT_COL(q) \
          memcpy(&bv, bc + q * kcs + p, sizeof bv); \
          G_VMADD(c0##q, a0, bv); G_VMADD(c1##q, a1, bv); G_VMADD(c2##q, a2, bv); G_VMADD(c3##q, a3, bv);
#else
#define G_DOT_COL(q) \
          memcpy(&bv, bc + q * kcs + p, sizeof bv); \
          G_VMADD(c0##q, a0, bv); G_VMADD(c1##q, a1, bv);
#endif
        for (p = 0; p < kv; p += G_VL) {
          memcpy(&a0, ar[0] + p, sizeof a0);
          memcpy(&a1, ar[1] + p, sizeof a1);
#if G_DR == 4
          memcpy(&a2, ar[2] + p, sizeof a2);
          memcpy(&a3, ar[3] + p, sizeof a3);
#endif
          G_DOT_COL(0) G_DOT_COL(1) G_DOT_COL(2) G_DOT_COL(3) G_DOT_COL(4)
        }
        G_DOT_SUM(0) G_DOT_SUM(1)
#if G_DR == 4
        G_DOT_SUM(2) G_DOT_SUM(3)
        GFN(hsum4)(c04, c14, c24, c34, &s[0][4], &s[1][4], &s[2][4], &s[3][4]);
#else
        s[0][4] = GFN(hsum)(c04);
        s[1][4] = GFN(hsum)(c14);
#endif
#undef G_DOT_DECL
#undef G_DOT_SUM
#undef G_DOT_COL
      }
#else
      GT acc[G_DR][G_DJ][G_VL];
      int64_t l, w;
      memset(acc, 0, sizeof acc);
      for (p = 0; p < kv; p += G_VL)
        for (q = 0; q < G_DJ; q++)
          for (r = 0; r < G_DR; r++)
            for (l = 0; l < G_VL; l++) acc[r][q][l] += ar[r][p + l] * bc[q * kcs + p + l];
      for (r = 0; r < G_DR; r++)
        for (q = 0; q < G_DJ; q++) {
          for (w = G_VL / 2; w >= 1; w /= 2)
            for (l = 0; l < w; l++) acc[r][q][l] += acc[r][q][l + w];
          s[r][q] = acc[r][q][0];
        }
#endif
      for (r = 0; r < rows; r++)
        for (q = 0; q < G_DJ && jg + q < nj; q++) {
          GT v = s[r][q], *o = c + (i + r) * g->scn + (j0 + jg + q) * g->scm;
          for (p = kv; p < kc; p++) v += ar[r][p] * bc[q * kcs + p];
          *o = pc > 0 ? *o + v : v;
        }
    }
  }
}

/* packing bytes one worker needs for contraction g: an A block of up to MC rows and a B block of up to NC columns,
   both at depth up to KC */
VM_TGT static size_t GFN(gemm_ws)(const vm_gemm *g) {
  int64_t mc = g->n < G_MC ? g->n : G_MC, kc = g->k < G_KC ? g->k : G_KC, nc = g->m < G_NC ? g->m : G_NC;
  int64_t kcs = (kc + 15) / 16 * 16;  /* (gemm_dot's copy of B: up to nc + DJ - 1 columns, kcs apart) */
  return (size_t)(((mc + G_MR - 1) / G_MR * G_MR + (nc + G_NR - 1) / G_NR * G_NR + G_DJ) * kcs + 32) * sizeof(GT) + 64;
}

/* C[i0:i1, j0:j1] = A[i0:i1, :] B[:, j0:j1] of one batch element, packing into ws (gemm_ws bytes). Every element
   sums its products in the same order whatever tile it falls in, so any split of C gives the same bits. */
VM_TGT static void GFN(gemm_part)(const vm_gemm *g, const char *a_, const char *b_, char *c_, int64_t i0, int64_t i1,
                                  int64_t j0, int64_t j1, char *ws) {
  const GT *a = (const GT *)a_, *b = (const GT *)b_;
  GT *c = (GT *)c_, *apack, *bpack;
  int64_t jc, pc, ic, jr, ir, i, j, mcmax = g->n < G_MC ? g->n : G_MC, kcmax = g->k < G_KC ? g->k : G_KC;
  /* A's rows run along the depth and each packed block would serve few B panels: the tile reads them in place (see
     micro). Where a block serves many panels packing pays (rows 4 KB apart also collide in the L1 cache) */
  int direct = g->sak == 1 && j1 - j0 <= 8 * G_NR;
  if (g->k == 0) {
    for (i = i0; i < i1; i++)
      for (j = j0; j < j1; j++) c[i * g->scn + j * g->scm] = 0;
    return;
  }
  apack = (GT *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
  bpack = apack + ((mcmax + G_MR - 1) / G_MR * G_MR * kcmax + 16) / 16 * 16;
  if (g->m < VM_GEMM_NARROW && direct) {  /* bpack holds the block's columns (gemm_ws) */
    for (pc = 0; pc < g->k; pc += G_KC)
      GFN(gemm_dot)(g, a, b, c, i0, i1, j0, j1, pc, g->k - pc < G_KC ? g->k - pc : G_KC, bpack);
    return;
  }
  for (jc = j0; jc < j1; jc += G_NC) {
    int64_t nc = j1 - jc < G_NC ? j1 - jc : G_NC;
    for (pc = 0; pc < g->k; pc += G_KC) {
      int64_t kc = g->k - pc < G_KC ? g->k - pc : G_KC;
      GFN(pack_b)(bpack, b + pc * g->sbk + jc * g->sbm, kc, nc, g->sbk, g->sbm);
      for (ic = i0; ic < i1; ic += G_MC) {
        int64_t mc = i1 - ic < G_MC ? i1 - ic : G_MC;
        const GT *ablk = a + ic * g->san + pc * g->sak;
        if (!direct) GFN(pack_a)(apack, ablk, mc, kc, g->san, g->sak);
        for (jr = 0; jr < nc; jr += G_NR)
          for (ir = 0; ir < mc; ir += G_MR)
            GFN(micro)(kc, direct ? ablk + ir * g->san : apack + ir * kc, direct ? g->san : 1, direct ? 1 : G_MR,
                       bpack + jr * kc, c + (ic + ir) * g->scn + (jc + jr) * g->scm, g->scn, g->scm,
                       mc - ir < G_MR ? mc - ir : G_MR, nc - jr < G_NR ? nc - jr : G_NR, pc > 0);
      }
    }
  }
}

#undef G_MR
#undef G_VL
#undef G_NR
#undef G_KC
#undef G_MC
#undef G_NC
#undef G_DR
#undef G_DJ
