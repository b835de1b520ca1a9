/* serial_decode.c: the node sections of pygrad's format (pygrad/serialize.py: after the arg table, before the
   checksum) read into the bulk builder's columns in one pass, each count checked against the bytes left before it
   is used and each reference against what it refers to, in the order pygrad's pure core checks them (so both name
   the same problem). Hostile bytes give a PG_DEC_* code, never a read or write out of bounds. */
#include <stdint.h>
#include <string.h>
#include "pygrad.h"

static uint32_t get_le(const uint8_t *p, int32_t w) {
  if (w == 1) return p[0];
  if (w == 2) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* k little-endian words of w bytes (1, 2 or 4) at p, as their uint32 values' bits in out: one loop per width, where
   a get_le call per item was most of reading a large table */
static void get_col(const uint8_t *p, int32_t w, int64_t k, int32_t *out) {
  int64_t i;
  uint32_t *o = (uint32_t *)out;  /* same size and alignment; read back as uint32 by the callers */
  if (w == 1)
    for (i = 0; i < k; i++) o[i] = p[i];
  else if (w == 2)
    for (i = 0; i < k; i++) o[i] = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
  else
    for (i = 0; i < k; i++) o[i] = get_le(p + 4 * i, 4);
}

/* whether k items of w bytes fit in the bytes left (no overflow for any k) */
static int fits(int64_t k, int64_t w, int64_t left) { return k >= 0 && k <= left / w; }

int pg_serial_decode(const uint8_t *data, int64_t size, int64_t n, int64_t m, int64_t nroots, int32_t srcw,
                     int32_t argw, int64_t ngiven, int64_t nargs, int32_t nops, int32_t ndtypes, int32_t *op,
                     int32_t *dtype, int64_t *start, int32_t *src, int32_t *arg, int32_t *tag, int32_t *pdata,
                     int64_t *roots, int64_t *nside, int64_t *what) {
  const uint8_t *ops, *dts, *cnt, *bigs, *args, *deltas, *rts, *side;
  int64_t p = 0, i, j, k, nbig = 0, sum = 0, total;
  int before = 0, cycle = 0, bad;
  *what = 0;
  *nside = 0;
  if (!data || size < 0 || n < 0 || m < 0 || nroots < 0 || ngiven < 0 || nargs < 0 || n > INT32_MAX - ngiven ||
      m > INT32_MAX || (srcw != 1 && srcw != 2 && srcw != 4) || (argw != 1 && argw != 2 && argw != 4) ||
      !op || !dtype || !start || !arg || !tag || !pdata || (m && !src) || (nroots && !roots))
    return PG_ERR_ARG;
  total = ngiven + n;
  /* the sections, in order: each must fit in what is left */
#define TAKE(ptr, k, w, sec) do { if (!fits((k), (w), size - p)) { *what = (sec); return PG_DEC_TRUNC; } \
    (ptr) = data + p; p += (k) * (w); } while (0)
  TAKE(ops, n, 1, 0);
  TAKE(dts, n, 1, 1);
  TAKE(cnt, n, 1, 2);
  for (i = 0; i < n; i++) {  /* one pass: how many counts are in the u32 section, and the sum of the others */
    nbig += cnt[i] == 255;
    sum += cnt[i] == 255 ? 0 : cnt[i];
  }
  TAKE(bigs, nbig, 4, 2);
  TAKE(args, n, argw, 3);
  for (k = 0; k < nbig; k++) sum += get_le(bigs + 4 * k, 4);
  if (sum != m) { *what = sum; return PG_DEC_SUM; }
  TAKE(deltas, m, srcw, 4);
  TAKE(rts, nroots, 4, 5);
  if (!fits(1, 4, size - p)) { *what = 6; return PG_DEC_TRUNC; }
  *nside = get_le(data + p, 4);
  p += 4;
  TAKE(side, *nside, 12, 7);
#undef TAKE
  if (p != size) { *what = size - p; return PG_DEC_TRAIL; }
  /* ops and dtypes copied and checked in one pass each (the first bad one is looked for only if there is one) */
  for (i = 0, bad = 0; i < n; i++) {
    op[ngiven + i] = ops[i];
    bad |= ops[i] >= nops;
  }
  if (bad)
    for (i = 0; i < n; i++) if (ops[i] >= nops) { *what = ops[i]; return PG_DEC_OP; }
  for (i = 0, bad = 0; i < n; i++) {
    dtype[ngiven + i] = dts[i];
    bad |= dts[i] >= ndtypes;
  }
  if (bad)
    for (i = 0; i < n; i++) if (dts[i] >= ndtypes) { *what = dts[i]; return PG_DEC_DTYPE; }
  get_col(args, argw, n, arg + ngiven);
  for (i = 0, bad = 0; i < n; i++) bad |= (uint32_t)arg[ngiven + i] > (uint64_t)nargs;
  if (bad) return PG_DEC_ARG;
  /* the columns: the given rows first, with no sources and no args */
  memset(op, 0, (size_t)ngiven * sizeof *op);
  memset(dtype, 0, (size_t)ngiven * sizeof *dtype);
  memset(arg, 0, (size_t)ngiven * sizeof *arg);
  memset(tag, 0, (size_t)total * sizeof *tag);
  memset(pdata, 0, (size_t)total * sizeof *pdata);
  for (i = 0; i <= ngiven; i++) start[i] = 0;
  if (m) get_col(deltas, srcw, m, src);  /* distances now, rows below */
  for (i = 0, k = 0, j = 0; i < n; i++) {
    int64_t row = ngiven + i, c = cnt[i] == 255 ? (int64_t)get_le(bigs + 4 * k++, 4) : cnt[i], e;
    start[row + 1] = start[row] + c;
    for (e = 0; e < c; e++, j++) {
      int64_t d = (uint32_t)src[j], s = row - d;
      before |= s < 0;
      cycle |= d == 0;
      src[j] = (int32_t)(s < 0 ? 0 : s);
    }
  }
  if (before) return PG_DEC_BEFORE;
  if (cycle) return PG_DEC_CYCLE;
  for (i = 0; i < nroots; i++) {
    roots[i] = get_le(rts + 4 * i, 4);
    if (roots[i] >= total) return PG_DEC_ROOT;
  }
  for (i = 0; i < *nside; i++) {
    uint32_t r = get_le(side + 12 * i, 4), t = get_le(side + 12 * i + 4, 4), d = get_le(side + 12 * i + 8, 4);
    if (r >= (uint64_t)n || t > (uint64_t)nargs || d > (uint64_t)nargs) return PG_DEC_SIDE;
  }
  for (i = 0; i < *nside; i++) {  /* checked first: a bad entry changes no column */
    uint32_t r = get_le(side + 12 * i, 4);
    tag[ngiven + r] = (int32_t)get_le(side + 12 * i + 4, 4);
    pdata[ngiven + r] = (int32_t)get_le(side + 12 * i + 8, 4);
  }
  return 0;
}
