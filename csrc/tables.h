/* tables.h: the one table of ids that Python and C must agree on. The C files include it (through store_impl.h and
   vm.h); Python reads it at import through pg_table_entry (tables.c) and pygrad/ids.py checks it against Ops and
   dtypes, so a change here that Python does not follow fails at import instead of corrupting graphs. */
#ifndef PG_TABLES_H
#define PG_TABLES_H
#include <stdint.h>

/* IR ops, X(name, id): pygrad.ops.Ops */
#define PG_OPS(X) \
  X(CONST, 0) X(DEFINE_VAR, 1) X(BUFFER, 2) X(PARAM, 3) X(NOOP, 4) \
  X(RECIPROCAL, 5) X(SQRT, 6) X(SIN, 7) X(LOG2, 8) X(EXP2, 9) X(TRUNC, 10) X(CAST, 11) X(BITCAST, 12) \
  X(ADD, 13) X(MUL, 14) X(MAX, 15) X(POW, 16) X(IDIV, 17) X(MOD, 18) X(AND, 19) X(OR, 20) X(XOR, 21) \
  X(SHL, 22) X(SHR, 23) X(CMPLT, 24) X(CMPNE, 25) X(CMPEQ, 26) \
  X(WHERE, 27) \
  X(REDUCE_AXIS, 28) X(RESHAPE, 29) X(EXPAND, 30) X(PAD, 31) X(SHRINK, 32) X(PERMUTE, 33) X(FLIP, 34) \
  X(CONTIGUOUS, 35) X(CONTIGUOUS_BACKWARD, 36) X(DETACH, 37) X(COPY, 38) X(MULTI, 39) \
  X(TUPLE, 40) X(GETTUPLE, 41) X(FUNCTION, 42) X(CALL, 43) X(AFTER, 44) X(SINK, 45)

/* value dtypes, X(name, id, VM short name, itemsize): pygrad.dtype.dtypes; the VM's logical types are these ids */
#define PG_DTYPES(X) \
  X(bool, 0, BOOL, 1) X(int8, 1, I8, 1) X(int16, 2, I16, 2) X(int32, 3, I32, 4) X(int64, 4, I64, 8) \
  X(uint8, 5, U8, 1) X(uint16, 6, U16, 2) X(uint32, 7, U32, 4) X(uint64, 8, U64, 8) \
  X(float16, 9, F16, 2) X(bfloat16, 10, BF16, 2) X(float32, 11, F32, 4) X(float64, 12, F64, 8)
/* structural nodes' dtype (TUPLE, SINK, ...); never a VM type */
#define PG_DTYPE_VOID 13

/* VM program format (pygrad/engine/lower.py and program.py write it, vm_read.c reads it) */
#define PG_VM_KINDS(X) X(LOOP, 1) X(GEMM, 2) X(EPILOGUE, 3)  /* kernel kinds (EPILOGUE: a loop run per GEMM tile) */
#define PG_VM_REDOPS(X) X(NONE, 0) X(ADD, 1) X(MAX, 2) X(MUL, 3) X(DOT, 4)  /* DOT: a sum of the last product */
#define PG_VM_MAGIC 0x50475650  /* "PGVP" */
#define PG_VM_VERSION 1
/* VM limits: vm.c refuses a program past them, and pygrad/engine plans within them (so it never emits such a
   program): the dims of a kernel's index space; the elements of an index space and the bytes of a buffer (also the
   bound on sizes, strides and offsets, which keeps every extent sum far from int64 overflow); the registers of one
   kernel, and the bytes of one worker's register file: 128, plus 16 per register, plus 64 per scalar register and
   T * 8 rounded up to a multiple of 64 per tile register (T: the kernel's tile size) */
#define PG_VM_MAXDIM 16
#define PG_VM_MAXSIZE ((int64_t)1 << 48)
#define PG_VM_MAXREGS (1 << 24)
#define PG_VM_MAXREGFILE ((int64_t)1 << 32)

/* arg/tag/pdata ids (pygrad/intern.py hands them out, store.c counts them): the low ARG_SLOT_BITS bits are a slot
   that is reused once its id was drained, the bits above a generation that changes on every reuse, so an id held
   across its drain is told apart from the slot's next id (it reads as gone) and the counts stay as many as the ids
   alive at once, however many were ever made */
#define PG_ARG_SLOT_BITS 24
#define PG_FREE_ORDER_MIN 16384  /* a bulk build of at least this many rows takes recycled ids in ascending order */

/* the inputs of a gradient template program (grad.c fills them, pygrad/gradfast.py records them), in order:
   a rule's (the node, its sources, its incoming gradient) and an accumulation's (the gradient so far, absent when
   there is none, the new gradient, the node) */
#define PG_TPL_RULE_INPUTS(X) X(NODE) X(SRCS) X(GRAD)
#define PG_TPL_ACC_INPUTS(X) X(PREV) X(NEW) X(NODE)

#define PG_OP_ENTRY(name, id) PG_OP_##name = id,
enum pg_op { PG_OPS(PG_OP_ENTRY) PG_NOPS };
#undef PG_OP_ENTRY

#endif
