/* mem.c: large blocks straight from the operating system (see mem.h for why), malloc for small ones and where
   neither mmap nor VirtualAlloc exists. Whether a block is mapped follows from its size alone, so no header is
   kept and the caller passes the size back. */
#if !defined(_WIN32) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE 1  /* MAP_ANONYMOUS under -std=c11 with glibc */
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pygrad.h"
#include "mem.h"
#if defined(__GLIBC__)
#include <malloc.h>  /* malloc_trim */
#endif

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#define PG_MEM_OS 1
#elif defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif
#if defined(MAP_ANONYMOUS)
#define PG_MEM_OS 1
#endif
#endif

#if defined(PG_MEM_OS)
/* the operating system's pages for n bytes, or NULL */
static void *os_map(size_t n) {
#if defined(_WIN32)
  return VirtualAlloc(NULL, n, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
#endif
}

/* give the pages of a mapped block of n bytes back */
static void os_unmap(void *p, size_t n) {
#if defined(_WIN32)
  (void)n;
  VirtualFree(p, 0, MEM_RELEASE);
#else
  munmap(p, n);
#endif
}
#endif

/* whether a block of n bytes is (to be) mapped */
static int mapped(size_t n) {
#if defined(PG_MEM_OS)
  return n >= PG_MEM_MAP_MIN;
#else
  (void)n;
  return 0;
#endif
}

void *pg_mem_alloc(size_t n) {
  if (n == 0) n = 1;
#if defined(PG_MEM_OS)
  if (mapped(n)) return os_map(n);
#endif
  return malloc(n);
}

void pg_mem_free(void *p, size_t n) {
  if (!p) return;
#if defined(PG_MEM_OS)
  if (mapped(n)) {
    os_unmap(p, n);
    return;
  }
#endif
  free(p);
}

void pg_mem_huge(void *p, size_t n) {
#if defined(PG_MEM_OS) && defined(MADV_HUGEPAGE)
  if (p && mapped(n) && n >= PG_MEM_HUGE_MIN) madvise(p, n, MADV_HUGEPAGE);  /* refused or not: the block works */
#else
  (void)p, (void)n;
#endif
}

void *pg_mem_realloc(void *p, size_t old, size_t n) {
  void *q;
  if (n == 0) n = 1;
  if (!p) return pg_mem_alloc(n);
  if (!mapped(old) && !mapped(n)) return realloc(p, n);  /* both small: malloc may grow it in place */
  if (!(q = pg_mem_alloc(n))) return NULL;
  memcpy(q, p, old < n ? old : n);
  pg_mem_free(p, old);
  return q;
}

/* Give the pages of free heap memory back to the OS, wherever they lie in the heap: glibc keeps what is freed below
   the heap's top block (fragments between blocks still in use) and returns only the top, so a process that planned
   a graph of 100k nodes -- ~100 MB of short-lived Python lists, dicts and ints -- kept that much RSS for good
   (pygrad/engine/program.py calls this after planning a big graph). A malloc setting is not changed: the next
   allocations there fault fresh pages in. Returns 1 if memory was released, 0 if not or off glibc. */
int pg_mem_trim(void) {
#if defined(__GLIBC__)
  return malloc_trim(0);
#else
  return 0;
#endif
}
