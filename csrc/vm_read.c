/* vm_read.c: the VM's program reader. pg_vm_prepare parses the flat program Python's planner writes
   (pygrad/engine/program.py): every word is range-checked, every view's extent is checked against its buffer and
   every instruction's operand types against its registers, once, so that pg_vm_run (vm.c) trusts what it runs;
   the first failure is reported with its word position. The kernels' arrays come from one arena per program
   (vm_take). pg_vm_free releases a program. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include "pygrad.h"
#include "vm.h"
#include "mem.h"

#define LIM_SIZE PG_VM_MAXSIZE  /* bound on sizes, strides, offsets: keeps extent sums far from overflow */
#define LIM_TERM ((int64_t)1 << 56)

static const char *const vm_opnames[] = {
#define PG_VM_NAME_ENTRY(name, nsrc) #name,
  PG_VM_OPCODES(PG_VM_NAME_ENTRY)
#undef PG_VM_NAME_ENTRY
};
static const int vm_opnsrc[] = {
#define PG_VM_NSRC_ENTRY(name, nsrc) nsrc,
  PG_VM_OPCODES(PG_VM_NSRC_ENTRY)
#undef PG_VM_NSRC_ENTRY
};

/* the name of VM opcode op (the Python opcode map is built from these), NULL past the table */
const char *pg_vm_opcode_name(int32_t op) { return op >= 0 && op < VM_NOPCODES ? vm_opnames[op] : NULL; }

/* the compute type of logical type lt: float16/bfloat16 compute in float32 */
int vm_ct(int32_t lt) { return lt == VT_F16 || lt == VT_BF16 ? VT_F32 : lt; }

/* bytes of one element of storage type t (VT_BF16 as storage is 2 bytes; internal buffers keep it as float32) */
int64_t vm_esize(int32_t t) {
#define VM_SIZE_ENTRY(name, id, vt, size) [id] = size,
  static const int64_t sz[VT_N] = {PG_DTYPES(VM_SIZE_ENTRY)};
#undef VM_SIZE_ENTRY
  return t >= 0 && t < VT_N ? sz[t] : 1;
}

static int is_float(int32_t lt) { return lt >= VT_F16 && lt <= VT_F64; }
static int is_int(int32_t lt) { return lt >= VT_I8 && lt <= VT_U64; }
static int is_ct(int32_t t) { return t >= 0 && t < VT_N && t != VT_F16 && t != VT_BF16; }

/* ---- program reader: every value is range-checked; the first failure is reported with its position ---- */
typedef struct rd { const int64_t *p; int64_t n, i; char *msg; int32_t cap; int err; } rd;

static void rd_fail(rd *r, const char *what) {
  if (r->err) return;
  r->err = 1;
  if (r->msg && r->cap > 0) snprintf(r->msg, (size_t)r->cap, "bad program at word %lld: %s", (long long)r->i, what);
}

static int64_t rd_get(rd *r, int64_t lo, int64_t hi, const char *what) {
  int64_t v;
  if (r->err) return lo;
  if (r->i >= r->n) { rd_fail(r, "truncated"); return lo; }
  v = r->p[r->i];
  if (v < lo || v > hi) { rd_fail(r, what); return lo; }
  r->i++;
  return v;
}

/* lowest and highest element offset of a view: off + sum over dims of st*(size-1), 0 when a size is 0 */
static int extent(const int64_t *size, const int64_t *st, const int64_t *lo, const int64_t *hi, int nd, int64_t off,
                  int64_t *mn, int64_t *mx) {
  int d;
  int64_t a = off, b = off;
  for (d = 0; d < nd; d++) {
    int64_t l = lo ? lo[d] : 0, h = hi ? hi[d] : size[d], span;
    if (h <= l) { *mn = 0; *mx = -1; return 1; }  /* empty: touches nothing */
    if (st[d] != 0 && (h - l) > LIM_TERM / (st[d] < 0 ? -st[d] : st[d])) return 0;
    span = st[d] * (h - 1);
    if (st[d] > 0) { a += st[d] * l; b += span; } else { a += span; b += st[d] * l; }
  }
  *mn = a;
  *mx = b;
  return 1;
}

/* whether the elements [mn, mx] of esize bytes lie inside buffer bf */
static int in_buf(const pg_vm *vm, int32_t bf, int64_t mn, int64_t mx, int64_t esize) {
  if (mx < mn) return 1;
  return mn >= 0 && mx < LIM_SIZE && (mx + 1) * esize <= vm->bufs[bf].nbytes;
}

#define VM_CHUNK_HEAD ((sizeof(vm_chunk) + 63) / 64 * 64)  /* (a block's data 64-byte aligned) */
#define VM_CHUNK_MIN ((size_t)64 << 10)
#define VM_CHUNK_MAX ((size_t)16 << 20)

/* count elements of size bytes, zeroed and 16-byte aligned, from the program's arena: blocks from mem.h, each
   twice the last up to VM_CHUNK_MAX (or as large as one request), all freed with the program. A program of tens of
   thousands of kernels made four callocs per kernel and freed them one by one: about half the time of preparing
   and freeing it. NULL without memory (or for a request past what size_t holds) */
static void *vm_take(pg_vm *vm, size_t count, size_t size) {
  vm_chunk *c = vm->chunks;
  size_t n;
  char *p;
  if (size == 0 || count > (SIZE_MAX / 4) / size) return NULL;
  n = (count * size + 15) & ~(size_t)15;
  if (!c || c->cap - c->used < n) {
    size_t cap = vm->chunk_next < VM_CHUNK_MIN ? VM_CHUNK_MIN : vm->chunk_next;
    if (cap < n) cap = n;
    c = (vm_chunk *)pg_mem_alloc(VM_CHUNK_HEAD + cap);
    if (!c) return NULL;
    c->next = vm->chunks, c->cap = cap, c->used = 0, c->size = VM_CHUNK_HEAD + cap;
    vm->chunks = c;
    vm->chunk_next = cap >= VM_CHUNK_MAX / 2 ? VM_CHUNK_MAX : 2 * cap;
  }
  p = (char *)c + VM_CHUNK_HEAD + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

/* the array of a kernel's count elements of size bytes, each read from at least `words` words: as many as the
   words left can fill, plus the one a read running out of words writes before it fails (a program claiming 2**28
   instructions in a few words gets no gigabytes), at least one. NULL, with the reader failed, without memory */
static void *rd_take(rd *r, pg_vm *vm, int64_t count, int64_t words, size_t size) {
  int64_t most = (r->n - r->i) / words + 1;
  void *p = vm_take(vm, (size_t)(count < 1 ? 1 : count < most ? count : most), size);
  if (!p) rd_fail(r, "out of memory");
  return p;
}

static void read_view(rd *r, pg_vm *vm, vm_kernel *k, vm_view *v, int isstore) {
  int d;
  int64_t mn, mx, numel = 1;
  v->reg = (int32_t)rd_get(r, 0, k->nregs - 1, "view register out of range");
  v->buf = (int32_t)rd_get(r, 0, vm->nbufs - 1, "view buffer out of range");
  v->stype = (int32_t)rd_get(r, 0, VT_N - 1, "view storage type out of range");
  v->esize = (int32_t)vm_esize(v->stype);
  v->off = rd_get(r, -LIM_SIZE, LIM_SIZE, "view offset out of range");
  v->masked = (int32_t)rd_get(r, 0, isstore ? 0 : 1, "stores take no mask");
  v->st = (int64_t *)vm_take(vm, (size_t)k->ndim, sizeof *v->st);
  if (!v->st) { rd_fail(r, "out of memory"); return; }
  for (d = 0; d < k->ndim; d++) v->st[d] = rd_get(r, -LIM_SIZE, LIM_SIZE, "view stride out of range");
  if (v->masked) {
    v->lo = (int64_t *)vm_take(vm, 2 * (size_t)k->ndim, sizeof *v->lo);
    if (!v->lo) { rd_fail(r, "out of memory"); return; }
    v->hi = v->lo + k->ndim;
    for (d = 0; d < k->ndim; d++) v->lo[d] = rd_get(r, 0, k->shape[d], "mask bound out of range");
    for (d = 0; d < k->ndim; d++) v->hi[d] = rd_get(r, v->lo[d], k->shape[d], "mask bound out of range");
  }
  if (r->err) return;
  if (k->regs[v->reg].ct != vm_ct(v->stype)) { rd_fail(r, "view storage type does not match its register"); return; }
  if (!extent(k->shape, v->st, v->lo, v->hi, k->ndim, v->off, &mn, &mx)) {
    rd_fail(r, "view extent overflows");
    return;
  }
  if (!in_buf(vm, v->buf, mn, mx, v->esize)) { rd_fail(r, "view reaches outside its buffer"); return; }
  if (v->esize > vm->bufs[v->buf].align) vm->bufs[v->buf].align = v->esize;  /* checked against pointers at run */
  v->invariant = !v->masked;
  for (d = 0; d < k->ndim; d++) if (v->st[d] != 0 && k->shape[d] > 1) v->invariant = 0;
  v->rowinv = !v->masked && !v->invariant;
  for (d = 0; d + 1 < k->ndim; d++) if (v->st[d] != 0 && k->shape[d] > 1) v->rowinv = 0;
  v->contig = !v->masked && v->stype == vm_ct(v->stype);
  for (d = k->ndim - 1; d >= 0; d--) {
    if (k->shape[d] > 1 && v->st[d] != numel) v->contig = 0;
    numel *= k->shape[d];
  }
  if (!isstore && k->regs[v->reg].scalar && !v->invariant) rd_fail(r, "a scalar register needs an invariant view");
}

/* the checks of one instruction's operand types; mode is derived here from the registers, not trusted */
static void check_ins(rd *r, vm_kernel *k, vm_ins *in) {
  const vm_regdef *R = k->regs;
  int32_t lt = in->lt, ct = vm_ct(lt), op = in->op, ns = vm_opnsrc[op], srcs[3] = {in->a, in->b, in->c}, i, allsc = 1;
  if (R[in->dst].isload) { rd_fail(r, "an instruction writes a load register"); return; }
  for (i = 0; i < ns; i++)
    if (srcs[i] < 0 || srcs[i] >= k->nregs) { rd_fail(r, "operand register out of range"); return; }
  in->mode = 0;
  for (i = 0; i < ns; i++) {
    if (R[srcs[i]].scalar) in->mode |= 1 << i;
    else allsc = 0;
  }
  if (R[in->dst].scalar) in->mode |= 8;
  if (R[in->dst].scalar && !allsc) { rd_fail(r, "a scalar register computed from a vector"); return; }
  if (!R[in->dst].scalar && allsc && op != VM_MOV && op != VM_WHERE) {
    rd_fail(r, "vector from scalars: MOV first");
    return;
  }
  in->sct = R[in->a].ct;
  switch (op) {
  case VM_MOV:
    if (R[in->dst].ct != ct || R[in->a].ct != ct) rd_fail(r, "MOV types differ");
    return;
  case VM_CAST:
    if (R[in->dst].ct != ct) rd_fail(r, "CAST result type");
    return;
  case VM_BITCAST:
    if (in->c < 0 || in->c >= VT_N || vm_esize(in->c) != vm_esize(lt)) { rd_fail(r, "BITCAST sizes"); return; }
    if (R[in->dst].ct != ct || R[in->a].ct != vm_ct(in->c)) rd_fail(r, "BITCAST types");
    return;
  case VM_ABS:
    if (lt == VT_BOOL) { rd_fail(r, "ABS of bool"); return; }
    if (R[in->dst].ct != ct || R[in->a].ct != ct) rd_fail(r, "ABS types differ");
    return;
  case VM_TRUNC:
    if (!is_float(lt) && !is_int(lt)) { rd_fail(r, "TRUNC type"); return; }
    if (R[in->dst].ct != ct || R[in->a].ct != ct) rd_fail(r, "TRUNC types differ");
    return;
  case VM_RECIPROCAL: case VM_SQRT: case VM_SIN: case VM_LOG2: case VM_EXP2:
    if (!is_float(lt)) { rd_fail(r, "transcendental of a non-float"); return; }
    if (R[in->dst].ct != ct || R[in->a].ct != ct) rd_fail(r, "unary types differ");
    return;
  case VM_WHERE:
    if (R[in->a].ct != VT_BOOL || R[in->b].ct != ct || R[in->c].ct != ct || R[in->dst].ct != ct)
      rd_fail(r, "WHERE types");
    return;
  default: break;
  }
  if (R[in->a].ct != ct || R[in->b].ct != ct) { rd_fail(r, "binary operand types differ"); return; }
  if (R[in->dst].ct != (op == VM_CMPLT || op == VM_CMPNE || op == VM_CMPEQ ? VT_BOOL : ct)) {
    rd_fail(r, "binary result type");
    return;
  }
  if ((op == VM_IDIV || op == VM_MOD || op == VM_SHL || op == VM_SHR) && !is_int(lt)) rd_fail(r, "integer-only op");
  if ((op == VM_AND || op == VM_OR || op == VM_XOR) && is_float(lt)) rd_fail(r, "bitwise op on floats");
  if (op == VM_DIV && !is_float(lt)) rd_fail(r, "DIV of a non-float");
}

static void read_loop(rd *r, pg_vm *vm, vm_kernel *k) {
  int32_t i, d;
  int64_t numel = 1, ws;
  k->ndim = (int32_t)rd_get(r, 1, VM_MAXDIM, "ndim out of range");
  k->T = rd_get(r, 1, VM_MAXTILE, "tile size out of range");
  k->redop = (int32_t)rd_get(r, VR_NONE, VR_DOT, "reduce op out of range");
  k->rlt = (int32_t)rd_get(r, 0, VT_N - 1, "reduce type out of range");
  k->post = (int32_t)rd_get(r, 0, 2, "post-rounding out of range");
  k->redmask = (uint32_t)rd_get(r, 0, ((int64_t)1 << VM_MAXDIM) - 1, "reduce mask out of range");
  for (d = 0; d < k->ndim; d++) {
    k->shape[d] = rd_get(r, 0, LIM_SIZE, "dim size out of range");
    numel = k->shape[d] && numel > LIM_SIZE / k->shape[d] ? LIM_SIZE + 1 : numel * k->shape[d];
  }
  if (numel > LIM_SIZE) rd_fail(r, "index space too large");
  if (k->redmask >> k->ndim) rd_fail(r, "reduce mask names a dim past ndim");
  k->nregs = (int32_t)rd_get(r, 1, PG_VM_MAXREGS, "register count out of range");
  if (r->err) return;
  k->regs = (vm_regdef *)rd_take(r, vm, k->nregs, 2, sizeof *k->regs);
  if (!k->regs) return;
  ws = 128 + 2 * (int64_t)k->nregs * (int64_t)sizeof(char *);  /* ptr[] and scratch[], then 64-aligned tiles */
  for (i = 0; i < k->nregs && !r->err; i++) {
    k->regs[i].ct = (int32_t)rd_get(r, 0, VT_N - 1, "register type out of range");
    k->regs[i].scalar = (int32_t)rd_get(r, 0, 1, "register scalar flag");
    if (!is_ct(k->regs[i].ct)) rd_fail(r, "register type is not a compute type");
    ws += k->regs[i].scalar ? 64 : (k->T * 8 + 63) / 64 * 64;
  }
  if (ws > PG_VM_MAXREGFILE) rd_fail(r, "register file too large");
  k->wsbytes = ws;
  k->nloads = (int32_t)rd_get(r, 0, k->nregs, "load count out of range");
  if (r->err) return;
  k->loads = (vm_view *)rd_take(r, vm, k->nloads, 5 + k->ndim, sizeof *k->loads);
  if (!k->loads) return;
  for (i = 0; i < k->nloads && !r->err; i++) {
    read_view(r, vm, k, &k->loads[i], 0);
    if (r->err) return;
    if (k->regs[k->loads[i].reg].isload) rd_fail(r, "two loads fill one register");
    k->regs[k->loads[i].reg].isload = 1;
  }
  k->nins = (int32_t)rd_get(r, 0, (int64_t)1 << 28, "instruction count out of range");
  if (r->err) return;
  k->ins = (vm_ins *)rd_take(r, vm, k->nins, 6, sizeof *k->ins);
  if (!k->ins) return;
  for (i = 0; i < k->nins && !r->err; i++) {
    vm_ins *in = &k->ins[i];
    in->op = (int32_t)rd_get(r, 0, VM_NOPCODES - 1, "opcode out of range");
    in->lt = (int32_t)rd_get(r, 0, VT_N - 1, "instruction type out of range");
    in->dst = (int32_t)rd_get(r, 0, k->nregs - 1, "destination register out of range");
    in->a = (int32_t)rd_get(r, 0, k->nregs - 1, "operand register out of range");
    in->b = (int32_t)rd_get(r, -1, k->nregs - 1, "operand register out of range");
    in->c = (int32_t)rd_get(r, -1, in->op == VM_BITCAST ? VT_N - 1 : k->nregs - 1, "operand out of range");
    if (!r->err) check_ins(r, k, in);
  }
  k->nstores = (int32_t)rd_get(r, k->redop ? 1 : 0, k->redop ? 1 : 1 << 20, "store count out of range");
  if (r->err) return;
  k->stores = (vm_view *)rd_take(r, vm, k->nstores, 5 + k->ndim, sizeof *k->stores);
  if (!k->stores) return;
  for (i = 0; i < k->nstores && !r->err; i++) {
    read_view(r, vm, k, &k->stores[i], 1);
    if (!r->err && k->regs[k->stores[i].reg].scalar && k->redop) rd_fail(r, "a reduction of a scalar register");
  }
  if (r->err || !k->redop) return;
  if (k->stores[0].stype != vm_ct(k->rlt) || k->regs[k->stores[0].reg].ct != vm_ct(k->rlt))
    rd_fail(r, "a reduction accumulates in its compute type");
  if (k->post && vm_ct(k->rlt) != VT_F32) rd_fail(r, "post-rounding of a non-float32 reduction");
  if (k->redop == VR_DOT) {  /* the last instruction is the product whose sum this is */
    const vm_ins *in = k->nins ? &k->ins[k->nins - 1] : NULL;
    if (!in || in->op != VM_MUL || (in->lt != VT_F32 && in->lt != VT_F64) || in->lt != k->rlt ||
        in->dst != k->stores[0].reg || (in->mode & 3))
      rd_fail(r, "a dot reduction needs a last vector MUL into its register");
  }
  for (d = 0; d < k->ndim; d++)
    if ((k->redmask >> d & 1u) && k->stores[0].st[d] != 0) rd_fail(r, "a reduced dim of the output needs stride 0");
}

/* a contraction operand: its extent over (batch dims, two matrix dims) must lie in its buffer */
static void check_gemm_operand(rd *r, pg_vm *vm, const vm_gemm *g, int32_t bf, int64_t off, const int64_t *bst,
                               int64_t s0, int64_t n0, int64_t s1, int64_t n1) {
  int64_t size[VM_MAXDIM + 2], st[VM_MAXDIM + 2], mn, mx;
  int32_t d;
  for (d = 0; d < g->nbatch; d++) { size[d] = g->bsize[d]; st[d] = bst[d]; }
  size[d] = n0; st[d] = s0; size[d + 1] = n1; st[d + 1] = s1;
  if (!extent(size, st, NULL, NULL, g->nbatch + 2, off, &mn, &mx)) {
    rd_fail(r, "contraction extent overflows");
    return;
  }
  if (!in_buf(vm, bf, mn, mx, vm_esize(g->lt))) rd_fail(r, "contraction operand reaches outside its buffer");
  if (vm_esize(g->lt) > vm->bufs[bf].align) vm->bufs[bf].align = vm_esize(g->lt);
}

static void read_gemm(rd *r, pg_vm *vm, vm_kernel *k) {
  vm_gemm *g = k->gemm = (vm_gemm *)rd_take(r, vm, 1, 1, sizeof *k->gemm);
  int32_t d, nb = vm->nbufs - 1;
  if (!g) return;
  g->lt = (int32_t)rd_get(r, VT_F32, VT_F64, "contraction type must be float32 or float64");
  g->a = (int32_t)rd_get(r, 0, nb, "buffer out of range");
  g->offa = rd_get(r, 0, LIM_SIZE, "offset out of range");
  g->b = (int32_t)rd_get(r, 0, nb, "buffer out of range");
  g->offb = rd_get(r, 0, LIM_SIZE, "offset out of range");
  g->c = (int32_t)rd_get(r, 0, nb, "buffer out of range");
  g->offc = rd_get(r, 0, LIM_SIZE, "offset out of range");
  g->n = rd_get(r, 0, LIM_SIZE, "size out of range");
  g->m = rd_get(r, 0, LIM_SIZE, "size out of range");
  g->k = rd_get(r, 0, LIM_SIZE, "size out of range");
  g->san = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->sak = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->sbk = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->sbm = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->scn = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->scm = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  g->nbatch = (int32_t)rd_get(r, 0, VM_MAXDIM - 2, "batch dims out of range");
  for (d = 0; d < g->nbatch; d++) {
    g->bsize[d] = rd_get(r, 0, LIM_SIZE, "size out of range");
    g->bsa[d] = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
    g->bsb[d] = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
    g->bsc[d] = rd_get(r, -LIM_SIZE, LIM_SIZE, "stride out of range");
  }
  if (r->err) return;
  check_gemm_operand(r, vm, g, g->a, g->offa, g->bsa, g->san, g->n, g->sak, g->k);
  check_gemm_operand(r, vm, g, g->b, g->offb, g->bsb, g->sbk, g->k, g->sbm, g->m);
  check_gemm_operand(r, vm, g, g->c, g->offc, g->bsc, g->scn, g->n, g->scm, g->m);
}

/* free a program and everything it owns (NULL is fine) */
void pg_vm_free(pg_vm *vm) {
  if (!vm) return;
  while (vm->chunks) {
    vm_chunk *c = vm->chunks;
    vm->chunks = c->next;
    pg_mem_free(c, c->size);
  }
  free(vm->kern);
  free(vm->bufs);
  free(vm->slotmin);
  pg_mem_free(vm->ws, vm->wscap);
  pg_lock_destroy(&vm->wslock);
  free(vm);
}

/* parse and validate a program of ncode words; on error returns PG_VM_ERR_PROGRAM with a message in msg */
int pg_vm_prepare(const int64_t *code, int64_t ncode, pg_vm **out, char *msg, int32_t msgcap) {
  rd r = {code, ncode, 0, msg, msgcap, 0};
  pg_vm *vm;
  int32_t i;
  if (!out) return PG_ERR_ARG;
  *out = NULL;
  if (msg && msgcap > 0) msg[0] = 0;
  if (!code || ncode < 0) return PG_ERR_ARG;
  vm = (pg_vm *)calloc(1, sizeof *vm);
  if (!vm) return PG_ERR_NOMEM;
  if (pg_lock_init(&vm->wslock) != 0) {
    free(vm);
    return PG_ERR_NOMEM;
  }
  rd_get(&r, VM_MAGIC, VM_MAGIC, "not a VM program (magic)");
  rd_get(&r, VM_VERSION, VM_VERSION, "unsupported program version");
  vm->nslots = (int32_t)rd_get(&r, 0, 1 << 20, "slot count out of range");
  vm->nbufs = (int32_t)rd_get(&r, 0, 1 << 24, "buffer count out of range");
  vm->nkern = (int32_t)rd_get(&r, 0, 1 << 24, "kernel count out of range");
  if (!r.err) {
    vm->slotmin = (int64_t *)calloc((size_t)vm->nslots + 1, sizeof *vm->slotmin);
    vm->bufs = (vm_buf *)calloc((size_t)vm->nbufs + 1, sizeof *vm->bufs);
    vm->kern = (vm_kernel *)calloc((size_t)vm->nkern + 1, sizeof *vm->kern);
    if (!vm->slotmin || !vm->bufs || !vm->kern) { pg_vm_free(vm); return PG_ERR_NOMEM; }
  }
  for (i = 0; i < vm->nslots && !r.err; i++) vm->slotmin[i] = rd_get(&r, 0, LIM_SIZE, "slot size out of range");
  for (i = 0; i < vm->nbufs && !r.err; i++) {
    vm_buf *b = &vm->bufs[i];
    b->slot = (int32_t)rd_get(&r, 0, vm->nslots - 1, "buffer slot out of range");
    b->off = rd_get(&r, 0, LIM_SIZE, "buffer offset out of range");
    b->nbytes = rd_get(&r, 0, LIM_SIZE, "buffer size out of range");
    b->align = 1;
    if (!r.err && b->off + b->nbytes > vm->slotmin[b->slot]) rd_fail(&r, "buffer reaches past its slot");
  }
  for (i = 0; i < vm->nkern && !r.err; i++) {
    vm_kernel *k = &vm->kern[i];
    k->kind = (int32_t)rd_get(&r, VK_LOOP, VK_EPILOGUE, "kernel kind out of range");
    if (r.err) break;
    if (k->kind == VK_LOOP) read_loop(&r, vm, k);
    else if (k->kind == VK_GEMM) read_gemm(&r, vm, k);
    else {  /* an epilogue: whether its index space is transposed, then a loop kernel */
      k->epi_tr = (int32_t)rd_get(&r, 0, 1, "epilogue orientation out of range");
      if (!r.err) read_loop(&r, vm, k);
      if (!r.err) {
        const char *why = vm_epilogue_check(vm, i);
        if (why) rd_fail(&r, why);
      }
      vm->hasepi = 1;
    }
    if (!r.err && k->wsbytes > vm->wsbytes) vm->wsbytes = k->wsbytes;
  }
  if (!r.err && r.i != r.n) rd_fail(&r, "trailing words");
  if (r.err) { pg_vm_free(vm); return PG_VM_ERR_PROGRAM; }
  *out = vm;
  return 0;
}
