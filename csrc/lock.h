/* A portable mutex: one per store, taken around every public call (cffi releases the GIL). SRWLOCK on Windows,
   pthread elsewhere. Header-only: each helper is a static inline wrapper. */
#ifndef PG_LOCK_H
#define PG_LOCK_H

#if defined(_MSC_VER)
#define PG_INLINE __inline
#else
#define PG_INLINE inline
#endif

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

typedef SRWLOCK pg_lock;

/* an SRWLOCK needs no resources; init cannot fail */
static PG_INLINE int pg_lock_init(pg_lock *l) { InitializeSRWLock(l); return 0; }
/* nothing to release for an SRWLOCK */
static PG_INLINE void pg_lock_destroy(pg_lock *l) { (void)l; }
/* exclusive: every store call mutates or walks the store */
static PG_INLINE void pg_lock_take(pg_lock *l) { AcquireSRWLockExclusive(l); }
/* take the lock if it is free: non-zero if taken, 0 (and nothing held) if another thread holds it */
static PG_INLINE int pg_lock_try(pg_lock *l) { return TryAcquireSRWLockExclusive(l) != 0; }
/* release what pg_lock_take acquired */
static PG_INLINE void pg_lock_drop(pg_lock *l) { ReleaseSRWLockExclusive(l); }

#else
#include <pthread.h>

typedef pthread_mutex_t pg_lock;

/* a default (non-recursive) mutex; returns non-zero if the system refuses one */
static PG_INLINE int pg_lock_init(pg_lock *l) { return pthread_mutex_init(l, NULL); }
/* free the mutex's resources; the store is no longer shared */
static PG_INLINE void pg_lock_destroy(pg_lock *l) { pthread_mutex_destroy(l); }
/* block until this thread holds the store */
static PG_INLINE void pg_lock_take(pg_lock *l) { pthread_mutex_lock(l); }
/* take the lock if it is free: non-zero if taken, 0 (and nothing held) if another thread holds it */
static PG_INLINE int pg_lock_try(pg_lock *l) { return pthread_mutex_trylock(l) == 0; }
/* release what pg_lock_take acquired */
static PG_INLINE void pg_lock_drop(pg_lock *l) { pthread_mutex_unlock(l); }
#endif

#endif
