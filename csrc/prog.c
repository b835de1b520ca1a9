/* Template programs: a graph recorded once over numbered inputs, instantiated over real nodes, hash-consing every
   node. The gradient run (grad.c) instantiates its rule templates through pg_prog_inst_locked; Python's math
   methods instantiate whole method bodies (matmul's eight nodes, relu's three) with one pg_prog_run call. */
#include <stdlib.h>
#include <string.h>
#include "prog.h"

struct pg_prog {
  pg_store *st;  /* the store whose arg ids it holds, and whose nodes it makes */
  int32_t nin, ninstr, nout;  /* code[0..2], kept beside it for the argument checks */
  int32_t *code;
};

int pg_prog_check(const int32_t *prog, int32_t nprog) {
  int32_t nin, ninstr, nout, i, p, avail;
  if (!prog || nprog < PG_PROG_HDR) return 0;
  nin = prog[0];
  ninstr = prog[1];
  nout = prog[2];
  if (nin < 0 || ninstr < 0 || nout < 0 || nout > PG_PROG_MAXOUT || nin > PG_PROG_MAXIN ||
      ninstr > PG_PROG_MAXINSTR)
    return 0;
  p = PG_PROG_HDR;
  avail = nin;
  for (i = 0; i < ninstr; i++) {
    int32_t ns, k;
    if (nprog - p < PG_PROG_INSTR) return 0;
    ns = prog[p + 5];
    if (ns < 0 || ns > PG_PROG_MAXIN || nprog - p - PG_PROG_INSTR < ns) return 0;
    if (prog[p + 2] < 0 || prog[p + 3] < 0) return 0; /* arg and tag ids */
    for (k = 0; k < ns; k++)
      if (prog[p + PG_PROG_INSTR + k] < 0 || prog[p + PG_PROG_INSTR + k] >= avail) return 0;
    p += PG_PROG_INSTR + ns;
    avail++;
  }
  if (nprog - p != nout) return 0;
  for (i = 0; i < nout; i++)
    if (prog[p + i] < -1 || prog[p + i] >= avail) return 0;
  return 1;
}

int pg_prog_inst_locked(pg_store *st, const int32_t *prog, const int32_t *inputs, int32_t *vals, int32_t *outs) {
  int32_t nin = prog[0], ninstr = prog[1], nout = prog[2], i, p = PG_PROG_HDR, built = 0, r = 0;
  int32_t srcbuf[PG_PROG_MAXIN];
  memcpy(vals, inputs, (size_t)nin * sizeof *inputs);
  for (i = 0; i < ninstr; i++, built++) {
    int32_t ns = prog[p + 5], k, id;
    for (k = 0; k < ns; k++) srcbuf[k] = vals[prog[p + PG_PROG_INSTR + k]];
    id = pg_store_make_locked(st, prog[p], prog[p + 1], srcbuf, ns, prog[p + 2], prog[p + 3], prog[p + 4]);
    if (id < 0) {
      r = id;
      break;
    }
    vals[nin + i] = id;
    p += PG_PROG_INSTR + ns;
  }
  for (i = 0; r == 0 && i < nout; i++) {
    int32_t ref = prog[p + i];
    pg_node *n;
    outs[i] = ref < 0 ? -1 : vals[ref];
    if (ref < 0) continue;
    n = pg_node_at(st, (uint32_t)outs[i]);
    if (n->rc == UINT32_MAX) {
      r = PG_ERR_NOMEM;
      while (i-- > 0)
        if (outs[i] >= 0) pg_store_decref_locked(st, outs[i]);
    } else {
      n->rc++;
    }
  }
  for (i = 0; i < built; i++) pg_store_decref_locked(st, vals[nin + i]);
  return r;
}

/* the arg and tag ids of a program's instructions, in order: ids[2 * i], ids[2 * i + 1] */
static int32_t prog_id(const int32_t *prog, int32_t k, int32_t *pos) {
  int32_t v = prog[*pos + 2 + (k & 1)];
  if (k & 1) *pos += PG_PROG_INSTR + prog[*pos + 5];
  return v;
}

/* hold (or release) the arg and tag ids of every instruction, with st->lock held: a program outlives the graph it
   was recorded from, and its ids must not be drained meanwhile. A failed hold releases what it took. */
int pg_prog_hold_locked(pg_store *st, const int32_t *prog, int hold) {
  int32_t n = 2 * prog[1], k, pos = PG_PROG_HDR;
  int r = 0;
  for (k = 0; k < n; k++) {
    int32_t aid = prog_id(prog, k, &pos);
    if (!hold) pg_store_arg_release_locked(st, aid);
    else if ((r = pg_store_arg_hold_locked(st, aid)) != 0) break;
  }
  if (r) {
    int32_t j;
    pos = PG_PROG_HDR;
    for (j = 0; j < k; j++) pg_store_arg_release_locked(st, prog_id(prog, j, &pos));
  }
  return r;
}

/* a checked copy of a program holding its arg ids, or NULL if the words are not one, name an id that is not live
   or memory ran out */
pg_prog *pg_prog_new(pg_store *st, const int32_t *prog, int32_t nprog) {
  pg_prog *p;
  int r;
  if (!st || !pg_prog_check(prog, nprog)) return NULL;
  p = (pg_prog *)malloc(sizeof *p);
  if (!p) return NULL;
  p->code = (int32_t *)malloc((size_t)nprog * sizeof *prog);
  if (!p->code) {
    free(p);
    return NULL;
  }
  memcpy(p->code, prog, (size_t)nprog * sizeof *prog);
  p->nin = prog[0];
  p->ninstr = prog[1];
  p->nout = prog[2];
  p->st = st;
  pg_lock_take(&st->lock);
  r = pg_prog_hold_locked(st, p->code, 1);
  if (r == 0) pg_store_retain_locked(st);
  pg_lock_drop(&st->lock);
  if (r) {
    free(p->code);
    free(p);
    return NULL;
  }
  return p;
}

/* free a program, releasing its arg ids and its use of the store */
void pg_prog_delete(pg_prog *p) {
  if (!p) return;
  pg_lock_take(&p->st->lock);
  pg_prog_hold_locked(p->st, p->code, 0);
  pg_lock_drop(&p->st->lock);
  pg_store_release(p->st);
  free(p->code);
  free(p);
}

/* the program over ninputs live ids: outs (room for its noutputs) get one new reference each */
int pg_prog_run(pg_store *st, const pg_prog *p, const int32_t *inputs, int32_t ninputs, int32_t *outs,
                int32_t nouts) {
  int32_t stackvals[128], *vals = stackvals, i;
  int r = 0;
  if (!st || !p || p->st != st || ninputs != p->nin || (ninputs && !inputs) || nouts < p->nout ||
      (p->nout && !outs))
    return PG_ERR_ARG;
  if (p->nin + p->ninstr > 128) {
    vals = (int32_t *)malloc((size_t)(p->nin + p->ninstr) * sizeof *vals);
    if (!vals) return PG_ERR_NOMEM;
  }
  pg_lock_take(&st->lock);
  for (i = 0; i < ninputs; i++)
    if (!pg_node_live(st, inputs[i])) r = PG_ERR_BADID;
  if (r == 0) r = pg_prog_inst_locked(st, p->code, inputs, vals, outs);
  pg_lock_drop(&st->lock);
  if (vals != stackvals) free(vals);
  return r;
}

int32_t pg_prog_run1_locked(pg_store *st, const pg_prog *p, const int32_t *inputs, int32_t ninputs) {
  int32_t stackvals[128], *vals = stackvals, out[PG_PROG_MAXOUT], i;
  int r = 0;
  if (!st || !p || p->st != st || ninputs != p->nin || (ninputs && !inputs) || p->nout != 1) return PG_ERR_ARG;
  for (i = 0; i < ninputs; i++)
    if (!pg_node_live(st, inputs[i])) return PG_ERR_BADID;
  if (p->nin + p->ninstr > 128) {
    vals = (int32_t *)malloc((size_t)(p->nin + p->ninstr) * sizeof *vals);
    if (!vals) return PG_ERR_NOMEM;
  }
  r = pg_prog_inst_locked(st, p->code, inputs, vals, out);
  if (vals != stackvals) free(vals);
  if (r) return r;
  return out[0] < 0 ? PG_ERR_ARG : out[0];
}

/* pg_prog_run of a one-output program over one or two inputs: the new id (one reference), or an error code
   (also when the program's output is -1). Fixed arity spares Python building arrays. */
int32_t pg_prog_run1(pg_store *st, const pg_prog *p, int32_t in0) {
  int32_t out[PG_PROG_MAXOUT];
  int r;
  if (!p || p->nout != 1) return PG_ERR_ARG;
  r = pg_prog_run(st, p, &in0, 1, out, PG_PROG_MAXOUT);
  if (r) return r;
  return out[0] < 0 ? PG_ERR_ARG : out[0];
}

int32_t pg_prog_run2(pg_store *st, const pg_prog *p, int32_t in0, int32_t in1) {
  int32_t in[2], out[PG_PROG_MAXOUT];
  int r;
  if (!p || p->nout != 1) return PG_ERR_ARG;
  in[0] = in0;
  in[1] = in1;
  r = pg_prog_run(st, p, in, 2, out, PG_PROG_MAXOUT);
  if (r) return r;
  return out[0] < 0 ? PG_ERR_ARG : out[0];
}
