/* vm_pool.c: the VM's worker threads. vm_pool_for(n, chunk, fn, ctx) runs fn over [0, n) in chunks of `chunk`
   units on the calling thread and up to nthreads-1 persistent workers, and returns when every chunk is done.
   Which thread runs a chunk never changes a result: callers give chunks that write disjoint memory, and reductions
   combine their partials in a fixed order afterwards.

   Chunks are claimed with a compare-and-swap on one 64-bit ticket (job generation << 32 | which chunks are claimed:
   a bit each for jobs of up to 32 chunks, each thread taking its own contiguous share first, else the next chunk),
   so a worker that wakes late for a finished job claims nothing of it; the caller waits only for chunks, never for
   a slow worker.
   Between jobs the ticket is closed (a generation with no chunk left) while the job's fields change.
   Workers spin briefly after a job (the next kernel of a program follows within microseconds), then sleep on a
   condition variable. One caller at a time owns the pool; a concurrent caller (another Python thread running a
   program) runs its chunks alone on its own thread.

   Windows builds without pthreads run every job on the calling thread (nthreads stays 1): a documented fallback. */
#include <stdint.h>
#include <stdlib.h>
#include "pygrad.h"
#include "vm.h"

#define POOL_MAX 256
#define POOL_SPIN 20000  /* ticket polls before a worker sleeps: ~0.1-0.5 ms */
#define POOL_MASKED 32   /* jobs of at most this many chunks claim them by bitmask, each thread its own share first */

#if !defined(_WIN32)
#include <pthread.h>
#include <sched.h>
#define POOL_THREADS 1

#if defined(__x86_64__) || defined(__i386__)
#define POOL_PAUSE() __builtin_ia32_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

#define A_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define A_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define A_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define A_CAS(p, e, v) __atomic_compare_exchange_n((p), (e), (v), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

static struct {
  pthread_mutex_t mu, busy;
  pthread_cond_t wake;
  int32_t want, started, sleepers, nw;
  uint64_t ticket;        /* gen << 32 | claimed chunks' bits (at most POOL_MASKED chunks), else next chunk index */
  int64_t done;           /* chunks finished of the current job */
  int64_t n, chunk, nchunks;
  vm_task fn;
  void *ctx;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 1, 0, 1, 0, 0, 0, 0, 0,
       NULL, NULL};

/* the chunk thread `worker` of nw claims next in a job of nchunks <= POOL_MASKED chunks, given the claimed ones
   (bits of mask), or -1 when all are claimed. Its own share first, in order: the contiguous range
   [worker * nchunks / nw, (worker + 1) * nchunks / nw). Then the others' from the job's end down, so a thread that
   finished early takes the chunks its peers would reach last. A thread keeps to the same rows or tiles in every job
   of like shape, so a kernel mostly reads what the same core wrote in the kernel before, from its own cache */
static int64_t pool_pick(uint32_t mask, int64_t nchunks, int32_t worker, int32_t nw) {
  uint32_t full = nchunks >= 32 ? 0xffffffffu : ((uint32_t)1 << nchunks) - 1, avail = ~mask & full;
  int64_t i;
  if (worker < nw) {  /* (a late reader may hold the next job's nw: then no share of its own) */
    int64_t lo = worker * nchunks / nw, hi = (worker + 1) * nchunks / nw;
    for (i = lo; i < hi; i++) if (avail >> i & 1u) return i;
  }
  for (i = nchunks - 1; i >= 0; i--) if (avail >> i & 1u) return i;
  return -1;
}

/* claim and run chunks of job generation gen until none is left; worker is this thread's index */
static void pool_work(uint32_t gen, int32_t worker) {
  for (;;) {
    uint64_t t = A_LOAD(&P.ticket), claimed;
    int64_t i, lo, hi, n, chunk, nchunks;
    vm_task fn;
    void *ctx;
    if ((uint32_t)(t >> 32) != gen) return;
    /* a late reader may see the next job's fields here; its compare-and-swap then fails on the generation */
    n = A_LOAD(&P.n); chunk = A_LOAD(&P.chunk); fn = A_LOAD(&P.fn); ctx = A_LOAD(&P.ctx);
    nchunks = A_LOAD(&P.nchunks);
    if (nchunks <= POOL_MASKED) {  /* the low word: a bit per claimed chunk */
      i = pool_pick((uint32_t)t, nchunks, worker, A_LOAD(&P.nw));
      if (i < 0) return;
      claimed = t | (uint64_t)1 << i;
    } else {  /* the low word: the next chunk */
      i = (int64_t)(t & 0xffffffffu);
      if (i >= nchunks) return;
      claimed = t + 1;
    }
    if (!A_CAS(&P.ticket, &t, claimed)) continue;
    lo = i * chunk;
    hi = lo + chunk < n ? lo + chunk : n;
    fn(ctx, lo, hi, worker);
    A_ADD(&P.done, 1);
  }
}

static void *pool_main(void *arg) {
  int32_t me = (int32_t)(intptr_t)arg, spin = 0;
  uint32_t seen = (uint32_t)(A_LOAD(&P.ticket) >> 32);
  for (;;) {
    uint32_t gen = (uint32_t)(A_LOAD(&P.ticket) >> 32);
    if (gen != seen) {
      seen = gen;
      if (me < A_LOAD(&P.nw)) pool_work(gen, me);
      spin = 0;
      continue;
    }
    if (++spin < POOL_SPIN) { POOL_PAUSE(); continue; }
    pthread_mutex_lock(&P.mu);
    A_ADD(&P.sleepers, 1);
    while ((uint32_t)(A_LOAD(&P.ticket) >> 32) == seen) pthread_cond_wait(&P.wake, &P.mu);
    A_ADD(&P.sleepers, -1);
    pthread_mutex_unlock(&P.mu);
    spin = 0;
  }
  return NULL;
}

/* after fork() the child has only the forking thread: it starts its own workers when it needs them */
static void pool_after_fork(void) {
  pthread_mutex_init(&P.mu, NULL);
  pthread_mutex_init(&P.busy, NULL);
  pthread_cond_init(&P.wake, NULL);
  P.started = 1;
  P.sleepers = 0;
}

/* start workers up to P.want (with P.busy held); returns how many threads a job may use */
static int32_t pool_grow(void) {
  static int hooked = 0;
  int32_t want;
  if (!hooked) { pthread_atfork(NULL, NULL, pool_after_fork); hooked = 1; }
  want = A_LOAD(&P.want);
  while (P.started < want) {
    pthread_t th;
    pthread_attr_t at;
    int rc;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &at, pool_main, (void *)(intptr_t)P.started);
    pthread_attr_destroy(&at);
    if (rc != 0) break;  /* the system refuses more threads: run with those there are */
    P.started++;
  }
  return P.started < want ? P.started : want;
}

void vm_pool_for(int64_t n, int64_t chunk, vm_task fn, void *ctx, int32_t maxw) {
  int64_t nchunks, spins = 0;
  int32_t nw;
  uint64_t gen;
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  nchunks = (n + chunk - 1) / chunk;
  if (nchunks > 0x7fffffff) { chunk = (n + 0x7ffffffe) / 0x7fffffff; nchunks = (n + chunk - 1) / chunk; }
  if (nchunks < 2 || maxw < 2 || A_LOAD(&P.want) < 2 || pthread_mutex_trylock(&P.busy) != 0) {
    fn(ctx, 0, n, 0);  /* one chunk, one thread wanted, or the pool is another caller's: all here */
    return;
  }
  nw = pool_grow();
  if (nw > maxw) nw = maxw;
  if (nw < 2) { pthread_mutex_unlock(&P.busy); fn(ctx, 0, n, 0); return; }
  /* close the last job's ticket before its fields change: a worker that read that ticket when all its chunks were
     claimed, (gen, nchunks), and then this job's larger nchunks, would otherwise win its compare-and-swap on the
     unchanged ticket and run a chunk "past the end" with the fields being replaced here (fn of one job and ctx of
     another: a loop task on a contraction's job, seen under ASan). The closed ticket, gen + 1 with no chunk left,
     fails every such swap; this job opens as gen + 2. */
  gen = A_LOAD(&P.ticket) >> 32;
  A_STORE(&P.ticket, ((gen + 1) & 0xffffffffu) << 32 | 0xffffffffu);
  A_STORE(&P.n, n); A_STORE(&P.chunk, chunk); A_STORE(&P.nchunks, nchunks); A_STORE(&P.fn, fn); A_STORE(&P.ctx, ctx);
  A_STORE(&P.done, 0);
  A_STORE(&P.nw, nw);
  gen = (gen + 2) & 0xffffffffu;
  A_STORE(&P.ticket, gen << 32);
  if (A_LOAD(&P.sleepers) > 0) {
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
  }
  pool_work((uint32_t)gen, 0);
  while (A_LOAD(&P.done) < nchunks) {  /* a worker finishes its last chunk */
    if (++spins < POOL_SPIN) POOL_PAUSE();
    else sched_yield();
  }
  pthread_mutex_unlock(&P.busy);
}

/* the thread count later jobs use (1..POOL_MAX); returns the count now in force */
int32_t pg_vm_set_threads(int32_t n) {
  if (n < 1) return PG_ERR_ARG;
  if (n > POOL_MAX) n = POOL_MAX;
  pthread_mutex_lock(&P.busy);
  A_STORE(&P.want, n);
  pthread_mutex_unlock(&P.busy);
  return n;
}

#else  /* _WIN32: the serial fallback */
#define POOL_THREADS 0

void vm_pool_for(int64_t n, int64_t chunk, vm_task fn, void *ctx, int32_t maxw) {
  (void)chunk;
  (void)maxw;
  if (n > 0) fn(ctx, 0, n, 0);
}

int32_t pg_vm_set_threads(int32_t n) { return n < 1 ? PG_ERR_ARG : 1; }
#endif

int32_t pg_vm_get_threads(void) {
#if POOL_THREADS
  return A_LOAD(&P.want);
#else
  return 1;
#endif
}
