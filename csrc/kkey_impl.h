/* The kernel-key state shared by kkey.c (which makes keys) and kbatch.c (which keys a plan's small kernels in one
   call). Not seen by cffi. It includes pygrad.h (no include guard, since cffi reads it): a .c file includes this
   header or pygrad.h, never both. */
#ifndef PG_KKEY_IMPL_H
#define PG_KKEY_IMPL_H

#include <stdint.h>
#include "pygrad.h"

typedef struct { int64_t k1, k2; int32_t val; } kk_slot;  /* k1 < 0: empty */
typedef struct { kk_slot *s; int64_t cap, len; } kk_map;   /* open addressing, at most half full */
struct pg_kkey {
  int64_t n;                   /* nodes */
  int32_t *nbuf, *nvid;        /* per node its buffer and view class, -1: not registered */
  kk_map views;                /* (view class | cell << 31, index space id) -> view class (-1: a copy) */
  kk_map classes;              /* (hash, key length) -> class; the key itself is in keys at koff[class] */
  int64_t *keys, keys_len, keys_cap;
  int64_t *koff, nclass, koff_cap;
  int64_t *scratch;            /* one key being made */
  int64_t scratch_cap;
  /* bound by pg_kkey_bind: the walk's buffers, the graph's columns, a make's outputs */
  const int32_t *ent, *srcs, *nsrcs, *obuf, *ovid;
  const int64_t *sig;
  int64_t ent_cap, src_cap, out_cap;
  int64_t *codes, *info;
  int32_t *lbuf, *lvid, *bufs, *miss;
};

#endif
