/* tables.c: csrc/tables.h's tables for Python (pygrad/ids.py reads them once at import). */
#include <stddef.h>
#include <stdint.h>
#include "pygrad.h"
#include "tables.h"

typedef struct entry { const char *name; int64_t v0, v1; } entry;

#define OP_ROW(name, id) {#name, id, 0},
#define DTYPE_ROW(name, id, vt, size) {#name, id, size},
#define PAIR_ROW(name, v) {#name, v, 0},
#define POS_ROW(name) {#name, 0, 0},
static const entry ops[] = {PG_OPS(OP_ROW) {NULL, 0, 0}};
static const entry dtypes[] = {PG_DTYPES(DTYPE_ROW) {"void", PG_DTYPE_VOID, 0}, {NULL, 0, 0}};
static const entry kinds[] = {PG_VM_KINDS(PAIR_ROW) {NULL, 0, 0}};
static const entry redops[] = {PG_VM_REDOPS(PAIR_ROW) {NULL, 0, 0}};
static const entry consts[] = {{"VM_MAGIC", PG_VM_MAGIC, 0}, {"VM_VERSION", PG_VM_VERSION, 0},
                               {"VM_MAXDIM", PG_VM_MAXDIM, 0}, {"VM_MAXSIZE", PG_VM_MAXSIZE, 0},
                               {"VM_MAXREGS", PG_VM_MAXREGS, 0}, {"VM_MAXREGFILE", PG_VM_MAXREGFILE, 0},
                               {"ARG_SLOT_BITS", PG_ARG_SLOT_BITS, 0}, {"FREE_ORDER_MIN", PG_FREE_ORDER_MIN, 0},
                               {NULL, 0, 0}};
static const entry rule_in[] = {PG_TPL_RULE_INPUTS(POS_ROW) {NULL, 0, 0}};
static const entry acc_in[] = {PG_TPL_ACC_INPUTS(POS_ROW) {NULL, 0, 0}};
static const entry *const tables[] = {ops, dtypes, kinds, redops, consts, rule_in, acc_in};

const char *pg_table_entry(int32_t table, int32_t i, int64_t *v0, int64_t *v1) {
  const entry *t;
  int32_t k;
  if (table < 0 || table >= (int32_t)(sizeof tables / sizeof *tables) || i < 0 || !v0 || !v1) return NULL;
  t = tables[table];
  for (k = 0; k < i; k++)  /* walk rather than index: i may lie past the end */
    if (!t[k].name) return NULL;
  *v0 = t[i].v0;
  *v1 = t[i].v1;
  return t[i].name;
}
