/* pygrad's C core: the one public header. cffi reads exactly this file (build.py), so it holds only
   declarations cffi can parse: no #include, no macros beyond integer constants. */

/* error codes: every function returns >= 0 on success or one of these */
#define PG_ERR_NOMEM -1
#define PG_ERR_BADID -2
#define PG_ERR_ARG_GONE -3
#define PG_ERR_ARG -4

typedef struct pg_store pg_store;

/* an array of node ids the core allocated; free with pg_ids_free */
typedef struct pg_ids { int32_t *ids; int64_t n; } pg_ids;

/* what a node holds besides its sources */
typedef struct pg_info { int32_t op, dtype, nsrc, arg, tag, meta, pdata; } pg_info;

/* ---- store.c: hash-consed nodes and their lifetime ---- */
pg_store *pg_store_new(void);
void pg_store_delete(pg_store *st);
int32_t pg_store_make(pg_store *st, int32_t op, int32_t dtype, const int32_t *src, int32_t nsrc, int32_t arg,
                      int32_t tag, int32_t meta);
int32_t pg_store_make0(pg_store *st, int32_t op, int32_t dtype, int32_t arg, int32_t tag, int32_t meta);
int32_t pg_store_make1(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t arg, int32_t tag, int32_t meta);
int32_t pg_store_make2(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t s1, int32_t arg, int32_t tag,
                       int32_t meta);
int32_t pg_store_make3(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t s1, int32_t s2, int32_t arg,
                       int32_t tag, int32_t meta);
int32_t pg_store_make2k(pg_store *st, int32_t op, int32_t dtype, int32_t s, int32_t kdtype, int32_t karg,
                        int32_t kmeta, int32_t reversed, int32_t meta);
int pg_store_incref(pg_store *st, int32_t id);
int pg_store_decref(pg_store *st, int32_t id);
int pg_store_decref_many(pg_store *st, const int32_t *ids, int32_t n);
int pg_store_info(pg_store *st, int32_t id, pg_info *out);
int32_t pg_store_src(pg_store *st, int32_t id, int32_t *out, int32_t cap);
int64_t pg_store_rows(pg_store *st, const int32_t *ids, int64_t n, pg_info *info, int32_t *src, int64_t cap);
int pg_store_set_pdata(pg_store *st, int32_t id, int32_t pdata);
int64_t pg_store_live(pg_store *st);
void pg_store_free_order(pg_store *st, int64_t k);  /* the next k recycled ids ascending (store_impl.h) */
int64_t pg_store_id_bound(pg_store *st);
int pg_store_arg_register(pg_store *st, int32_t aid);
int64_t pg_store_arg_drain(pg_store *st, int32_t *out, int64_t cap);

/* ---- pyfast.c: the store's hot calls as CPython builtins that keep the GIL ---- */
int pg_py_bind(pg_store *st, const char *module, const char *name);

/* ---- walk.c: whole-graph walks ---- */
void pg_ids_free(pg_ids *ids);
int pg_walk_toposort(pg_store *st, const int32_t *roots, int32_t nroots, int32_t enter_calls, const int32_t *stop,
                     int32_t nstop, pg_ids **out);
int pg_walk_deepwalk(pg_store *st, int32_t root, const int32_t *targets, int32_t ntargets, int32_t enter_calls,
                     pg_ids **walk, pg_ids **path);

/* ---- prog.c: template programs (a graph recorded over numbered inputs; layout in csrc/prog.h) ---- */
typedef struct pg_prog pg_prog;
pg_prog *pg_prog_new(pg_store *st, const int32_t *prog, int32_t nprog);
void pg_prog_delete(pg_prog *p);
int pg_prog_run(pg_store *st, const pg_prog *p, const int32_t *inputs, int32_t ninputs, int32_t *outs,
                int32_t nouts);
int32_t pg_prog_run1(pg_store *st, const pg_prog *p, int32_t in0);
int32_t pg_prog_run2(pg_store *st, const pg_prog *p, int32_t in0, int32_t in1);

/* ---- grad.c: gradient derivation by cached rule templates ---- */
#define PG_GRAD_DONE 0
#define PG_GRAD_NEED_RULE 1
#define PG_GRAD_NEED_ACC 2
#define PG_GRAD_PY_STEP 3
#define PG_GRAD_PY_ACC 4
#define PG_GRAD_NEED_META 5

typedef struct pg_tcache pg_tcache;
typedef struct pg_grad pg_grad;
/* why a run stopped: the walk position, the node and its gradient, and for accumulations the source k, its
   gradient so far (prev, or -1) and the new one (v); key is the missing template's key; for NEED_META the node's
   metadata (md, a pdata id) and that of a node of its rule's result (mdcur, 0 for none) */
typedef struct pg_stop { int64_t pos; int32_t node, ctx, k, prev, v, md, mdcur, nkey; int32_t key[16]; } pg_stop;

pg_tcache *pg_tcache_new(pg_store *st, int32_t limit);
void pg_tcache_delete(pg_tcache *tc);
int pg_tcache_add(pg_store *st, pg_tcache *tc, const int32_t *key, int32_t nkey, const int32_t *prog, int32_t nprog);
int64_t pg_tcache_count(pg_tcache *tc);
pg_grad *pg_grad_new(pg_store *st, const int32_t *walk, int64_t nwalk, int32_t root, int32_t root_grad,
                     const uint8_t *py_node, const uint8_t *py_grad, int32_t nops, int32_t carry_pdata);
void pg_grad_delete(pg_grad *g);
int pg_grad_run(pg_grad *g, pg_tcache *tc, pg_stop *out);
int32_t pg_grad_get(pg_grad *g, int32_t node);
int pg_grad_set(pg_grad *g, int32_t node, int32_t grad);
int pg_grad_skip(pg_grad *g);
int pg_grad_consume(pg_grad *g);
int pg_grad_meta_add(pg_grad *g, int32_t md, int32_t mdcur, int32_t merged);
int64_t pg_grad_count(pg_grad *g);
int64_t pg_grad_items(pg_grad *g, int32_t *keys, int32_t *vals, int64_t cap);

/* ---- vm_read.c, vm.c, vm_simd.c: the vectorized interpreter. It runs a flat program (int64 words) that
   pygrad/engine/planner.py lowers a graph to; it never touches the node store. ---- */
#define PG_VM_ERR_PROGRAM -20
#define PG_VM_ERR_SLOTS -21
typedef struct pg_vm pg_vm;
int pg_vm_prepare(const int64_t *code, int64_t ncode, pg_vm **out, char *msg, int32_t msgcap);
int pg_vm_run(pg_vm *vm, void *const *slots, const int64_t *sizes, int32_t nslots);
void pg_vm_free(pg_vm *vm);
const char *pg_vm_opcode_name(int32_t op);
int pg_vm_set_isa(int32_t isa);
const char *pg_vm_isa_name(int32_t isa);
/* vm_pool.c: the threads a run may use (1 = the calling thread only); set returns the count in force */
int32_t pg_vm_set_threads(int32_t n);
int32_t pg_vm_get_threads(void);

/* ---- regalloc.c: the registers of one VM loop kernel (pygrad/engine/lower.py, allocate_c); compute types are
   dtype ids below PG_RA_MAXCT ---- */
#define PG_RA_MAXCT 64
int64_t pg_regalloc(int64_t n, const int8_t *nsrc, const int32_t *src, int64_t src_len, const int32_t *ct,
                    const uint8_t *sc_in, const uint8_t *pinned, int32_t *reg, uint8_t *sc_out, int32_t *file_ct,
                    uint8_t *file_sc);

/* ---- kwalk.c: the walk building one fused kernel's expression (pygrad/engine/planner.py, _build_c): node flags,
   and the result when the kernel reads through a movement op ---- */
#define PG_KW_LEAF 1
#define PG_KW_ALU 2
#define PG_KW_SCALAR 4
#define PG_KW_MOVES -30
int64_t pg_kernel_walk(int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src, int64_t src_len,
                       const uint8_t *flags, int64_t top, int32_t top_leaf, int32_t *memo, int32_t *out, int64_t out_cap,
                       int32_t *out_src, int64_t src_cap);
/* kwalk_moves.c: the same walk through movement ops (pending views as cells, kept in a pg_kwm across one plan's
   walks), for any kernel */
#define PG_KW_MOVE 8
#define PG_KW_FULL -31
typedef struct pg_kwm pg_kwm;
pg_kwm *pg_kwm_new(void);
void pg_kwm_free(pg_kwm *st);
int64_t pg_kwm_cells(const pg_kwm *st, int64_t from, int32_t *out, int64_t cap);
int64_t pg_kernel_walk_moves(pg_kwm *st, int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src,
                             int64_t src_len, const uint8_t *flags, const int32_t *mvclass, const int32_t *shape,
                             int64_t top, int32_t top_leaf, int32_t *out, int64_t out_cap, int32_t *out_src,
                             int64_t src_cap, int64_t max_cells, int64_t *keys, int64_t *info);

/* ---- kkey.c: the kernel cache's key of a small walked kernel (pygrad/engine/kcache.py, walked_c): leaves' loads
   registered once per plan, a kernel's key made from its walk's entries and interned as a class ---- */
#define PG_KKEY_MISS -32
typedef struct pg_kkey pg_kkey;
pg_kkey *pg_kkey_new(int64_t n);
void pg_kkey_free(pg_kkey *st);
int pg_kkey_node(pg_kkey *st, int64_t node, int32_t buf, int32_t vid);
int pg_kkey_nodes(pg_kkey *st, int64_t k, const int32_t *node, const int32_t *buf, const int32_t *vid);
int pg_kkey_view(pg_kkey *st, int32_t vid, int32_t cell, int32_t space, int32_t vid2);
int pg_kkey_bind(pg_kkey *st, const int32_t *ent, int64_t ent_cap, const int32_t *srcs, int64_t src_cap,
                 const int32_t *nsrcs, const int64_t *sig, const int32_t *obuf, const int32_t *ovid, int64_t out_cap,
                 int64_t *codes, int32_t *lbuf, int32_t *lvid, int32_t *bufs, int32_t *miss, int64_t *info);
int64_t pg_kkey_make(pg_kkey *st, int64_t m, int64_t nsrc, int32_t over, int32_t space, int64_t head, int32_t sbuf);
/* kbatch.c: a plan's small kernels walked and keyed in one call, up to the first job that needs Python */
int64_t pg_kbatch_run(pg_kkey *kk, pg_kwm *kwm, int64_t n, const int32_t *nsrc, const int64_t *off,
                      const int32_t *src, int64_t src_len, const uint8_t *flags, const int32_t *mvclass,
                      const int32_t *shape, int32_t *out, int32_t *out_src, int64_t max_cells, int64_t *keys,
                      int64_t *winfo, int64_t from, int64_t nj, const int32_t *jtop, const uint8_t *jleaf,
                      const int32_t *jspace, const int64_t *jhead, const int32_t *jsbuf, int64_t max_m,
                      const uint8_t *ok, int64_t nok, int32_t *cls, int32_t *nids, int32_t *ids, int64_t ids_cap,
                      int64_t *ids_len);

/* ---- place.c: arena offsets of a program's internal buffers by liveness (pygrad/engine/program.py, _place) ---- */
int64_t pg_place(int64_t nk, const int32_t *counts, const int32_t *ids, int64_t nids, int64_t nbufs,
                 const uint8_t *arena, const int64_t *need, int64_t *offset);

/* ---- plan_users.c: the planner's users count and fused-value sweeps (pygrad/engine/planner.py, _Graph) ---- */
#define PG_PU_ALU 2
#define PG_PU_ALU_MOVE 8
#define PG_PU_OUTPUT 16
int pg_plan_users(int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src, int64_t src_len,
                  const uint8_t *flags, const int32_t *shape, int32_t *users, uint8_t *fused);

/* ---- mem.c: give free heap pages back to the OS (glibc's malloc_trim; 0 elsewhere) ---- */
int pg_mem_trim(void);

/* ---- tables.c: the ids Python and C share (csrc/tables.h), for pygrad/ids.py: the name of entry i of a table
   and its values (an id, and for dtypes the itemsize), or NULL past the end ---- */
#define PG_TABLE_OPS 0
#define PG_TABLE_DTYPES 1
#define PG_TABLE_VM_KINDS 2
#define PG_TABLE_VM_REDOPS 3
#define PG_TABLE_CONSTS 4
#define PG_TABLE_TPL_RULE_INPUTS 5
#define PG_TABLE_TPL_ACC_INPUTS 6
const char *pg_table_entry(int32_t table, int32_t i, int64_t *v0, int64_t *v1);

/* ---- serial.c, serial_build.c: graphs as node tables (pygrad/serialize.py): export, and the bulk builder ---- */
#define PG_BUILD_DONE 0
#define PG_BUILD_ASK 1
typedef struct pg_build pg_build;
/* a node table: n rows (store ids and columns; arg, tag and pdata as 1-based numbers into args, the nargs distinct
   ids in order of first use) and the rows' sources, m in all, as rows */
typedef struct pg_table {
  int64_t n, m, nargs;
  int32_t *ids, *op, *dtype, *arg, *tag, *pdata, *nsrc, *src, *args;
} pg_table;
int pg_serial_table(pg_store *st, const int32_t *roots, int32_t nroots, int32_t *pos, int64_t npos, int64_t base,
                    pg_table **out);
void pg_serial_table_free(pg_table *t);
/* the node sections of pygrad's format for a table (data, size bytes), the rows below its base it uses (imports,
   ascending) and the widths of its source distances and arg numbers */
typedef struct pg_blob { uint8_t *data; int64_t size; int32_t *imports; int64_t nimports; int32_t srcw, argw; } pg_blob;
int pg_serial_encode(const pg_table *t, int64_t base, const int32_t *roots, int32_t nroots, pg_blob **out);
void pg_serial_blob_free(pg_blob *b);
pg_build *pg_serial_build_new(pg_store *st, int64_t n, const int32_t *op, const int32_t *dtype, const int64_t *start,
                              const int32_t *src, const int32_t *arg, const int32_t *tag, const int32_t *pdata,
                              const int32_t *holds, int64_t nholds, const int32_t *given, int64_t ngiven, const int32_t *known, const uint8_t *flags,
                              int32_t nops, int32_t ndtypes, int *err, int64_t *where);
/* the rows a builder has not made that are leaves whose signature its store's cache lacks (Python infers those up
   front and writes their metas into the builder's known array before pg_serial_build_run); at most cap in rows */
int64_t pg_serial_build_misses(pg_build *b, int64_t *rows, int64_t cap);
int pg_serial_build_run(pg_build *b, int64_t *pos);
int pg_serial_build_set(pg_build *b, int32_t id);
int32_t pg_serial_build_id(const pg_build *b, int64_t i);
int pg_serial_build_ids(const pg_build *b, int32_t *out, int64_t n);
int pg_serial_build_rows(pg_build *b, const int64_t *rows, int64_t nrows, int32_t *ids, int32_t *metas);
void pg_serial_build_delete(pg_build *b);
/* serial_decode.c: the node sections of pygrad's format (size bytes, every byte used) as the builder's columns for
   ngiven given rows and n stored ones (op, dtype, arg, tag, pdata: ngiven + n each, the given rows zero; start:
   ngiven + n + 1; src: m rows; roots: nroots rows), arg numbers checked against nargs. 0, or a PG_DEC_* problem
   with *what the section (PG_DEC_TRUNC: 0 ops, 1 dtypes, 2 source counts, 3 args, 4 sources, 5 roots, 6 side
   table size, 7 side table) or the value at fault; *nside: the side table's entries */
#define PG_DEC_TRUNC 1
#define PG_DEC_SUM 2
#define PG_DEC_TRAIL 3
#define PG_DEC_OP 4
#define PG_DEC_DTYPE 5
#define PG_DEC_ARG 6
#define PG_DEC_BEFORE 7
#define PG_DEC_CYCLE 8
#define PG_DEC_ROOT 9
#define PG_DEC_SIDE 10
int pg_serial_decode(const uint8_t *data, int64_t size, int64_t n, int64_t m, int64_t nroots, int32_t srcw,
                     int32_t argw, int64_t ngiven, int64_t nargs, int32_t nops, int32_t ndtypes, int32_t *op,
                     int32_t *dtype, int64_t *start, int32_t *src, int32_t *arg, int32_t *tag, int32_t *pdata,
                     int64_t *roots, int64_t *nside, int64_t *what);
