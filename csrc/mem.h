/* mem.h: the core's large allocations (store hash tables, walk scratch, the VM's per-run workspace). Not seen by
   cffi. Blocks of PG_MEM_MAP_MIN bytes or more come from the operating system (mmap, VirtualAlloc) and go back to
   it when freed; smaller ones from malloc. Why not malloc for all: glibc serves a large request by mmap, but when
   such a block is freed it raises its mmap threshold (up to 32 MiB) to the block's size, and from then on serves
   large requests from its heap, where a workspace that grows from run to run leaves holes the heap never gives
   back -- a long-running process's RSS climbed by the size of the largest workspace every few rounds. Blocks the
   core maps itself never move that threshold, and the caller's malloc settings stay the user's. */
#ifndef PG_MEM_H
#define PG_MEM_H

#include <stddef.h>

#define PG_MEM_MAP_MIN ((size_t)1 << 20)

/* n bytes (n > 0), aligned for any type (page-aligned when mapped), not zeroed; NULL without memory */
void *pg_mem_alloc(size_t n);
/* free a block of pg_mem_alloc/pg_mem_realloc; n is the size it was made with (NULL is ignored) */
void pg_mem_free(void *p, size_t n);
/* ask for transparent huge pages (Linux) for a block of pg_mem_alloc of n bytes if it is mapped and at least
   PG_MEM_HUGE_MIN; a hint, nothing elsewhere. For blocks read at random (the store's hash table, the bulk builder's
   per-row arrays): with 4 KB pages nearly every access of a big one is a TLB miss besides a cache miss, and a
   prefetch does not hide it (it waits for the translation) */
#define PG_MEM_HUGE_MIN ((size_t)2 << 20)
void pg_mem_huge(void *p, size_t n);
/* a block of n bytes holding the first min(old, n) bytes of p (a block of old bytes, or NULL with old 0); on
   failure NULL, and p is left as it was */
void *pg_mem_realloc(void *p, size_t old, size_t n);

#endif
