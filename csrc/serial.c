/* serial.c: graphs as tables. Export walks the graph under some roots into columns (op, dtype, arg, tag, pdata,
   source count, sources as table rows) in one C call, optionally continuing a table, and encodes a table as the
   binary format's node sections (pygrad/serialize.py). The other way: serial_decode.c reads those sections back and
   serial_build.c makes the nodes of a table. */
#include <stddef.h>
#include <stdlib.h>
#include "store_impl.h"

/* free a table pg_serial_table made */
void pg_serial_table_free(pg_table *t) {
  if (!t) return;
  free(t->ids);
  free(t->op);
  free(t->dtype);
  free(t->arg);
  free(t->tag);
  free(t->pdata);
  free(t->nsrc);
  free(t->src);
  free(t->args);
  free(t);
}

/* the slot of id a (nonzero) in the open-addressing set key[0..mask]: where it is, or the empty slot it goes in */
static uint64_t args_slot(const int32_t *key, uint64_t mask, int32_t a) {
  uint64_t h = (((uint64_t)(uint32_t)a * 0x9e3779b97f4a7c15ull) >> 20) & mask;
  while (key[h] && key[h] != a) h = (h + 1) & mask;
  return h;
}

/* number the arg, tag and pdata ids of rows [0, n) in order of first use (row by row: arg, tag, pdata) 1, 2, ...,
   replacing each column entry by its number (0 stays 0) and listing the ids in t->args: the table's own arg table,
   in O(n) (an open-addressing map over the ids used, not over the store's whole id range). The map starts small and
   doubles at half full: a graph has far fewer distinct args than rows, and zeroing a map sized by the rows cost a
   third of writing a small graph's node table. */
static int table_number_args(pg_table *t, int64_t n) {
  uint64_t cap = 256, mask = cap - 1, h, j;
  int64_t i, na = 0;
  int32_t *key, *val, *cols[3];
  int c;
  key = (int32_t *)calloc((size_t)cap, sizeof *key);  /* 0: empty (0 is never numbered) */
  val = (int32_t *)malloc((size_t)cap * sizeof *val);
  t->args = (int32_t *)malloc((size_t)(n ? 3 * n : 1) * sizeof *t->args);
  if (!key || !val || !t->args) {
    free(key);
    free(val);
    return PG_ERR_NOMEM;
  }
  cols[0] = t->arg, cols[1] = t->tag, cols[2] = t->pdata;
  for (i = 0; i < n; i++)
    for (c = 0; c < 3; c++) {
      int32_t a = cols[c][i];
      if (a == 0) continue;
      h = args_slot(key, mask, a);
      if (!key[h]) {
        if ((uint64_t)(na + 1) * 2 > cap) {  /* grow to keep the load <= 1/2: the ids are t->args[0..na) */
          int32_t *k2 = (int32_t *)calloc((size_t)cap * 2, sizeof *k2);
          int32_t *v2 = (int32_t *)malloc((size_t)cap * 2 * sizeof *v2);
          if (!k2 || !v2) {
            free(k2), free(v2), free(key), free(val);
            return PG_ERR_NOMEM;
          }
          free(key), free(val);
          key = k2, val = v2, cap *= 2, mask = cap - 1;
          for (j = 0; j < (uint64_t)na; j++) {
            uint64_t g = args_slot(key, mask, t->args[j]);
            key[g] = t->args[j], val[g] = (int32_t)(j + 1);
          }
          h = args_slot(key, mask, a);
        }
        key[h] = a;
        val[h] = (int32_t)++na;
        t->args[na - 1] = a;
      }
      cols[c][i] = val[h];
    }
  t->nargs = na;
  free(key);
  free(val);
  return 0;
}

/* a walk frame: a node and the index of its next source */
typedef struct tframe { int32_t id, i; } tframe;

/* post-order DFS from the roots, sources left to right (pg_walk_toposort's order with enter_calls), skipping nodes
   pos lists; each new node gets pos[id] = base + its index in *ids. Returns 0 or an error (then pos is as it was). */
static int table_walk_locked(pg_store *st, const int32_t *roots, int32_t nroots, int32_t *pos, int64_t npos,
                             int64_t base, int32_t **ids, int64_t *nids, int64_t *nsrc) {
  tframe *stk = NULL;
  int32_t *out = NULL, r;
  int64_t sp = 0, cap = 0, n = 0, ncap = 0, m = 0, j;
  int err = 0;
  for (r = 0; r < nroots && !err; r++) {
    if (pos[roots[r]] >= 0) continue;
    sp = 0;
    if (cap == 0) {
      cap = 256;
      if (!(stk = (tframe *)malloc((size_t)cap * sizeof *stk))) { err = PG_ERR_NOMEM; break; }
    }
    stk[sp].id = roots[r];
    stk[sp++].i = 0;
    while (sp) {
      tframe *f = &stk[sp - 1];
      const pg_node *nd = pg_node_at(st, (uint32_t)f->id);
      if (f->i < nd->nsrc) {
        int32_t c = pg_node_src(nd)[f->i++];
        if (c >= npos) { err = PG_ERR_ARG; break; }  /* pos too short (made before the roots: not by a race) */
        if (pos[c] >= 0) continue;  /* listed before, or in an earlier table */
        if (sp == cap) {
          tframe *t = (tframe *)realloc(stk, (size_t)cap * 2 * sizeof *t);
          if (!t) { err = PG_ERR_NOMEM; break; }
          stk = t;
          cap *= 2;
        }
        stk[sp].id = c;
        stk[sp++].i = 0;
      } else {
        if (n == ncap) {
          int64_t c2 = ncap ? ncap * 2 : 1024;
          int32_t *o = (int32_t *)realloc(out, (size_t)c2 * sizeof *o);
          if (!o) { err = PG_ERR_NOMEM; break; }
          out = o;
          ncap = c2;
        }
        if (base + n > INT32_MAX) { err = PG_ERR_ARG; break; }  /* rows are int32 */
        pos[f->id] = (int32_t)(base + n);
        out[n++] = f->id;
        m += nd->nsrc;
        sp--;
      }
    }
  }
  free(stk);
  if (err) {
    for (j = 0; j < n; j++) pos[out[j]] = -1;
    free(out);
    return err;
  }
  *ids = out;
  *nids = n;
  *nsrc = m;
  return 0;
}

/* The nodes under roots that pos (one int32 per node id, npos >= pg_store_id_bound once the roots exist) does not
   list yet (pos[id] < 0), sources before users, as the rows base, base + 1, ... of a table: pos[id] is set to each
   new node's row and *out gets the rows' columns, with sources as rows (of this table or earlier ones, through pos)
   and args, tags and pdata numbered in order of first use (t->args lists their ids). One call exports a whole graph
   (pos all -1, base 0: the rows are pg_walk_toposort's order); a caller that keeps pos across calls appends to one
   table without listing a node twice (pickle's shared table). On error pos is as it was. */
int pg_serial_table(pg_store *st, const int32_t *roots, int32_t nroots, int32_t *pos, int64_t npos, int64_t base,
                    pg_table **out) {
  pg_table *t;
  int32_t r, *ids = NULL;
  int64_t n = 0, m = 0, i, k = 0;
  int err = 0;
  if (!out || nroots < 0 || (nroots > 0 && !roots) || npos < 0 || (npos > 0 && !pos) || base < 0) return PG_ERR_ARG;
  *out = NULL;
  pg_lock_take(&st->lock);
  for (r = 0; r < nroots && !err; r++)
    if (!pg_node_live(st, roots[r])) err = PG_ERR_BADID;
    else if (roots[r] >= npos) err = PG_ERR_ARG;
  if (!err) err = table_walk_locked(st, roots, nroots, pos, npos, base, &ids, &n, &m);
  if (!err) {
    size_t nb = (size_t)(n ? n : 1) * sizeof(int32_t);
    t = (pg_table *)calloc(1, sizeof *t);
    if (t) {
      t->op = (int32_t *)malloc(nb), t->dtype = (int32_t *)malloc(nb), t->arg = (int32_t *)malloc(nb);
      t->tag = (int32_t *)malloc(nb), t->pdata = (int32_t *)malloc(nb), t->nsrc = (int32_t *)malloc(nb);
      t->src = (int32_t *)malloc((size_t)(m ? m : 1) * sizeof(int32_t));
      t->ids = ids;
    }
    if (!t || !t->op || !t->dtype || !t->arg || !t->tag || !t->pdata || !t->nsrc || !t->src) {
      for (i = 0; i < n; i++) pos[ids[i]] = -1;
      if (t) pg_serial_table_free(t);
      else free(ids);
      err = PG_ERR_NOMEM;
    } else {
      for (i = 0; i < n; i++) {
        const pg_node *nd = pg_node_at(st, (uint32_t)ids[i]);
        const int32_t *s = pg_node_src(nd);
        int32_t q;
        t->op[i] = nd->op;
        t->dtype[i] = nd->dtype;
        t->arg[i] = nd->arg;
        t->tag[i] = nd->tag;
        t->pdata[i] = nd->pdata;
        t->nsrc[i] = nd->nsrc;
        for (q = 0; q < nd->nsrc; q++) t->src[k++] = pos[s[q]];
      }
      t->n = n;
      t->m = m;
      if ((err = table_number_args(t, n)) != 0) {
        for (i = 0; i < n; i++) pos[ids[i]] = -1;
        pg_serial_table_free(t);
      } else *out = t;
    }
  }
  pg_lock_drop(&st->lock);
  return err;
}

/* free what pg_serial_encode made */
void pg_serial_blob_free(pg_blob *b) {
  if (!b) return;
  free(b->data);
  free(b->imports);
  free(b);
}

/* v in w bytes, little-endian, at p; returns p + w */
static uint8_t *put_le(uint8_t *p, uint32_t v, int32_t w) {
  int32_t k;
  for (k = 0; k < w; k++) p[k] = (uint8_t)(v >> (8 * k));
  return p + w;
}

/* v[0..n) as w-byte (1, 2 or 4) little-endian integers at p; returns the end. A loop per width: the generic byte
   loop of put_le costs ~4x more per value. */
static uint8_t *put_col(uint8_t *p, const uint32_t *v, int64_t n, int32_t w) {
  int64_t i;
  if (w == 1)
    for (i = 0; i < n; i++) p[i] = (uint8_t)v[i];
  else if (w == 2)
    for (i = 0; i < n; i++) p[2 * i] = (uint8_t)v[i], p[2 * i + 1] = (uint8_t)(v[i] >> 8);
  else
    for (i = 0; i < n; i++)
      p[4 * i] = (uint8_t)v[i], p[4 * i + 1] = (uint8_t)(v[i] >> 8), p[4 * i + 2] = (uint8_t)(v[i] >> 16),
      p[4 * i + 3] = (uint8_t)(v[i] >> 24);
  return p + n * w;
}

/* bytes of the smallest of 1, 2, 4 that hold v */
static int32_t width_of(int64_t v) { return v < 256 ? 1 : v < 65536 ? 2 : 4; }

/* ascending int32 order, for qsort */
static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* the position of v in the sorted a[0..n), which holds it */
static int64_t find_i32(const int32_t *a, int64_t n, int32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The node sections of pygrad's format (pygrad/serialize.py: ops, dtypes, source counts, arg numbers, source
   distances, roots, side table) for table t, whose rows are base, base + 1, ...: sources and roots below base are
   rows of earlier tables, written as the "given" rows that come first (b->imports lists them, ascending). roots are
   rows (of t or earlier). Python writes the header and the arg table around it. */
int pg_serial_encode(const pg_table *t, int64_t base, const int32_t *roots, int32_t nroots, pg_blob **out) {
  pg_blob *b;
  int64_t i, j, k = 0, nimp = 0, nbig = 0, nside = 0, maxd = 0, size;
  int32_t *imp;
  uint32_t *dist;
  uint8_t *p;
  if (!t || !out || base < 0 || nroots < 0 || (nroots > 0 && !roots)) return PG_ERR_ARG;
  *out = NULL;
  for (i = 0; i < nroots; i++)
    if (roots[i] < 0 || roots[i] >= base + t->n) return PG_ERR_ARG;
  if (!(b = (pg_blob *)calloc(1, sizeof *b))) return PG_ERR_NOMEM;
  if (!(imp = (int32_t *)malloc((size_t)(t->m + nroots + 1) * sizeof *imp))) {
    free(b);
    return PG_ERR_NOMEM;
  }
  b->imports = imp;
  for (i = 0, k = 0; i < t->n; i++) {  /* a table from pg_serial_table, but checked: sources are earlier rows */
    int32_t q;
    if (t->nsrc[i] < 0 || t->nsrc[i] > t->m - k) break;
    for (q = 0; q < t->nsrc[i]; q++, k++)
      if (t->src[k] < 0 || t->src[k] >= base + i) break;
    if (q < t->nsrc[i]) break;
  }
  if (i < t->n || k != t->m) {
    pg_serial_blob_free(b);
    return PG_ERR_ARG;
  }
  k = 0;
  for (j = 0; j < t->m; j++)
    if (t->src[j] < base) imp[nimp++] = t->src[j];
  for (i = 0; i < nroots; i++)
    if (roots[i] < base) imp[nimp++] = roots[i];
  if (nimp) {
    qsort(imp, (size_t)nimp, sizeof *imp, cmp_i32);
    for (i = 1, j = 1; i < nimp; i++)
      if (imp[i] != imp[j - 1]) imp[j++] = imp[i];
    nimp = j;
  }
  b->nimports = nimp;
  if (!(dist = (uint32_t *)malloc((size_t)(t->m ? t->m : 1) * sizeof *dist))) {
    pg_serial_blob_free(b);
    return PG_ERR_NOMEM;
  }
  /* a source's local row: an import's place among the imports, else nimp + (row - base); distance = user - source */
  for (i = 0; i < t->n; i++) {
    int32_t q;
    if (t->nsrc[i] >= 255) nbig++;
    if (t->tag[i] || t->pdata[i]) nside++;
    for (q = 0; q < t->nsrc[i]; q++, k++) {
      int32_t s = t->src[k];
      int64_t local = s < base ? find_i32(imp, nimp, s) : nimp + (s - base), d = nimp + i - local;
      if (d > maxd) maxd = d;
      dist[k] = (uint32_t)d;
    }
  }
  b->srcw = width_of(maxd);
  b->argw = width_of(t->nargs);
  size = 3 * t->n + 4 * nbig + (int64_t)b->argw * t->n + (int64_t)b->srcw * t->m + 4 * (int64_t)nroots + 4 + 12 * nside;
  if (!(b->data = (uint8_t *)malloc((size_t)(size ? size : 1)))) {
    free(dist);
    pg_serial_blob_free(b);
    return PG_ERR_NOMEM;
  }
  p = b->data;
  for (i = 0; i < t->n; i++) *p++ = (uint8_t)t->op[i];
  for (i = 0; i < t->n; i++) *p++ = (uint8_t)t->dtype[i];
  for (i = 0; i < t->n; i++) *p++ = (uint8_t)(t->nsrc[i] < 255 ? t->nsrc[i] : 255);
  for (i = 0; i < t->n; i++)
    if (t->nsrc[i] >= 255) p = put_le(p, (uint32_t)t->nsrc[i], 4);
  p = put_col(p, (const uint32_t *)t->arg, t->n, b->argw);  /* arg numbers are >= 0 */
  p = put_col(p, dist, t->m, b->srcw);
  free(dist);
  for (i = 0; i < nroots; i++)
    p = put_le(p, (uint32_t)(roots[i] < base ? find_i32(imp, nimp, roots[i]) : nimp + (roots[i] - base)), 4);
  p = put_le(p, (uint32_t)nside, 4);
  for (i = 0; i < t->n; i++)
    if (t->tag[i] || t->pdata[i]) {
      p = put_le(p, (uint32_t)i, 4);
      p = put_le(p, (uint32_t)t->tag[i], 4);
      p = put_le(p, (uint32_t)t->pdata[i], 4);
    }
  b->size = (int64_t)(p - b->data);
  *out = b;
  return 0;
}
