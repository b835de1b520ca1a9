/* Internals of template programs (prog.c), shared with grad.c. Not seen by cffi.

   A program records a graph over numbered inputs, as int32 words:
     ninputs, ninstr, noutputs,
     then per instruction: op, dtype, arg, tag, meta, nsrc, src refs...,
     then noutputs refs (-1: no output).
   A ref names an input (0 .. ninputs-1) or an earlier instruction (ninputs + its index). */
#ifndef PG_PROG_H
#define PG_PROG_H

#include "store_impl.h"

#define PG_PROG_HDR 3      /* ninputs, ninstr, noutputs */
#define PG_PROG_INSTR 6    /* op, dtype, arg, tag, meta, nsrc */
#define PG_PROG_MAXIN 64   /* inputs, and sources of one instruction */
#define PG_PROG_MAXOUT 16
#define PG_PROG_MAXINSTR (1 << 20)

/* 1 if the words form a program whose every ref points backwards and whose sizes add up (checked once, so that
   instantiation can trust it) */
int pg_prog_check(const int32_t *prog, int32_t nprog);

/* make the program's nodes over inputs (live ids) with st->lock held; vals is scratch for ninputs + ninstr ids;
   outs[i] gets one new reference (-1 for a -1 ref). Every intermediate reference is dropped again: the outputs
   keep what they use. On error nothing is left referenced. */
int pg_prog_inst_locked(pg_store *st, const int32_t *prog, const int32_t *inputs, int32_t *vals, int32_t *outs);

/* hold (hold=1) or release (0) the program's arg and tag ids with st->lock held (0 or an error code; a failed hold
   holds nothing) */
int pg_prog_hold_locked(pg_store *st, const int32_t *prog, int hold);

/* pg_prog_run of a one-output program with st->lock held (st must be the program's store): the new id with one
   reference, or an error code (also for a -1 output or an input that is not live) */
int32_t pg_prog_run1_locked(pg_store *st, const struct pg_prog *p, const int32_t *inputs, int32_t ninputs);

#endif
