/* The thread pool compiled kernels run on: n - 1 pthread workers plus the calling thread
 * claim the chunks of each parallel_for; idle workers spin briefly, then sleep. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernel.h"

#define POOL_MAX_THREADS 1024

/* How long a waiting thread polls before it sleeps. A plan's kernels run back to back, so a
 * worker that just finished a chunk usually gets the next one within microseconds, while a
 * sleep + wake round trip costs 5-50 us (more under a hypervisor). Past the budget a worker
 * sleeps so an idle pool (the host is tracing the next step) burns no cores. The caller
 * waiting for the last chunks spins longer: its core has nothing else to do meanwhile, and
 * sleeping would add a wake-up to every parallel_for whose chunks are uneven. */
#define POOL_SPIN_NS 100000
#define POOL_CALLER_SPIN_NS 2000000

/* A cache line of padding between fields written by different threads. */
#define POOL_PAD(name) char name[64]

typedef struct pool_worker {
    loom_rt_pool *pool;
    pthread_t thread;
} pool_worker;

/* A parallel_for is a job of n_chunks chunks that threads claim one at a time, the caller
 * included. Claiming instead of assigning chunk i to worker i means the caller never
 * waits for a worker that is still waking up (5-50 us, more under a hypervisor): it runs
 * unclaimed chunks itself, and an oversubscribed pool degrades to running inline. */
struct loom_rt_pool {
    loom_allocator alloc;
    int32_t n_threads;
    int32_t n_started; /* workers whose threads exist (all but during a failed create) */
    /* 0 when oversubscribed: spinning would steal the cores the chunks need */
    int64_t spin_ns, caller_spin_ns;
    pool_worker *workers;

    /* The current job. Written by the caller before it publishes a new `job` word and read
     * by a thread only after it has claimed a chunk; the caller does not return (and so
     * cannot start the next job) before every claimed chunk is done, so they are stable. */
    void (*fn)(void *ud, int64_t lo, int64_t hi);
    void *ud;
    int64_t extent;
    bool timed; /* chunks add their run times to busy_ns */

    POOL_PAD(pad0);
    /* generation << 32 | number of chunks: what sleeping and spinning workers watch */
    _Atomic uint64_t job;
    _Atomic bool stop;
    _Atomic int32_t sleepers; /* workers blocked (or about to block) on `wake` */
    POOL_PAD(pad1);
    /* generation << 32 | next unclaimed chunk. The generation makes a claim by a thread
     * still looking at an older job fail its compare-exchange. */
    _Atomic uint64_t claim;
    POOL_PAD(pad2);
    _Atomic int32_t pending;      /* chunks of the current job not yet finished */
    _Atomic int64_t busy_ns;      /* the current job's chunks' run times, when timed */
    _Atomic bool caller_sleeping; /* the caller blocks on `done` */
    POOL_PAD(pad3);

    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new job or stop */
    pthread_cond_t done; /* pending reached 0 */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls until pred(pool, arg) or spin_ns have passed; reports whether pred came true.
 * Reads the clock once per 64 polls: cheap, and bounded even if the clock is slow. */
static bool spin_until(loom_rt_pool *pool, int64_t spin_ns,
                       bool (*pred)(loom_rt_pool *, uint64_t), uint64_t arg) {
    if (spin_ns <= 0)
        return pred(pool, arg);
    int64_t deadline = loom_rt_now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (pred(pool, arg))
                return true;
            cpu_relax();
        }
        if (loom_rt_now_ns() >= deadline)
            return pred(pool, arg);
    }
}

/* seq_cst loads: the sleep protocols below are Dekker-style (store own flag, then load the
 * other side's), which acquire/release alone does not order. */
static bool job_changed(loom_rt_pool *pool, uint64_t seen) {
    return atomic_load(&pool->job) != seen || atomic_load(&pool->stop);
}

static bool all_done(loom_rt_pool *pool, uint64_t unused) {
    (void)unused;
    return atomic_load(&pool->pending) == 0;
}

/* Chunk i of n over [0, extent): the first extent % n chunks get one extra iteration. */
static void chunk_range(int64_t extent, int64_t n, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t base = extent / n, rem = extent % n;
    *lo = i * base + (i < rem ? i : rem);
    *hi = *lo + base + (i < rem ? 1 : 0);
}

/* Claims and runs chunks of `job` until none is left (or a newer job replaced it). */
static void run_chunks(loom_rt_pool *pool, uint64_t job) {
    uint64_t gen = job >> 32;
    int64_t n_chunks = (int64_t)(job & 0xffffffffu);
    uint64_t c = atomic_load(&pool->claim);
    for (;;) {
        if (c >> 32 != gen || (int64_t)(c & 0xffffffffu) >= n_chunks)
            return;
        if (!atomic_compare_exchange_weak(&pool->claim, &c, c + 1))
            continue; /* c now holds the current word */
        int64_t lo, hi;
        chunk_range(pool->extent, n_chunks, (int64_t)(c & 0xffffffffu), &lo, &hi);
        if (pool->timed) {
            int64_t t0 = loom_rt_now_ns();
            pool->fn(pool->ud, lo, hi);
            /* relaxed: the pending-- below publishes it to the caller */
            atomic_fetch_add_explicit(&pool->busy_ns, loom_rt_now_ns() - t0, memory_order_relaxed);
        } else {
            pool->fn(pool->ud, lo, hi);
        }
        /* pending-- (seq_cst) then a load of caller_sleeping pairs with the caller's store
         * of caller_sleeping then load of pending: one of the two sides sees the other. */
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeping)) {
            pthread_mutex_lock(&pool->mu); /* as for `wake` in parallel_for */
            pthread_mutex_unlock(&pool->mu);
            pthread_cond_signal(&pool->done);
        }
        c = atomic_load(&pool->claim);
    }
}

static void *worker_main(void *arg) {
    pool_worker *w = arg;
    loom_rt_pool *pool = w->pool;
    /* Not a load of pool->job: a worker that starts late would take an already published
     * first job for old news. The word is 0 until the first parallel_for. */
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(pool, pool->spin_ns, job_changed, seen)) {
            /* Sleep. sleepers++ (seq_cst) before re-checking job pairs with the caller's
             * job store (seq_cst) before it reads sleepers: either we see the new job here
             * or the caller sees us and broadcasts under the mutex we hold until we wait. */
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (!job_changed(pool, seen))
                pthread_cond_wait(&pool->wake, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop))
            return NULL;
        seen = atomic_load(&pool->job);
        run_chunks(pool, seen);
    }
}

static void stop_workers(loom_rt_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, true);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    pool->n_started = 0;
}

static void pool_free(loom_rt_pool *pool) {
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    loom_allocator a = pool->alloc;
    if (pool->workers)
        loom_ir_free(&a, pool->workers, (size_t)(pool->n_threads - 1) * sizeof *pool->workers);
    loom_ir_free(&a, pool, sizeof *pool);
}

loom_status loom_rt_pool_create(int32_t n_threads, const loom_allocator *a, loom_rt_pool **out) {
    if (!out)
        return LOOM_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!a || n_threads < 1 || n_threads > POOL_MAX_THREADS)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_rt_pool *pool = loom_ir_alloc(a, sizeof *pool);
    if (!pool)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memset(pool, 0, sizeof *pool);
    pool->alloc = *a;
    pool->n_threads = n_threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool->spin_ns = cores >= n_threads ? POOL_SPIN_NS : 0;
    pool->caller_spin_ns = cores >= n_threads ? POOL_CALLER_SPIN_NS : 0;
    atomic_init(&pool->job, 0);
    atomic_init(&pool->stop, false);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->claim, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->caller_sleeping, false);
    if (pthread_mutex_init(&pool->mu, NULL) != 0) {
        loom_ir_free(a, pool, sizeof *pool);
        return LOOM_STATUS_DEVICE_ERROR;
    }
    if (pthread_cond_init(&pool->wake, NULL) != 0) {
        pthread_mutex_destroy(&pool->mu);
        loom_ir_free(a, pool, sizeof *pool);
        return LOOM_STATUS_DEVICE_ERROR;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->wake);
        pthread_mutex_destroy(&pool->mu);
        loom_ir_free(a, pool, sizeof *pool);
        return LOOM_STATUS_DEVICE_ERROR;
    }
    if (n_threads > 1) {
        pool->workers = loom_ir_alloc(a, (size_t)(n_threads - 1) * sizeof *pool->workers);
        if (!pool->workers) {
            pool_free(pool);
            return LOOM_STATUS_OUT_OF_MEMORY;
        }
    }
    for (int32_t i = 0; i < n_threads - 1; i++) {
        pool_worker *w = &pool->workers[i];
        w->pool = pool;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            stop_workers(pool);
            pool_free(pool);
            return LOOM_STATUS_DEVICE_ERROR;
        }
        pool->n_started++;
    }
    *out = pool;
    return LOOM_OK;
}

void loom_rt_pool_destroy(loom_rt_pool *pool) {
    if (!pool)
        return;
    stop_workers(pool);
    pool_free(pool);
}

int32_t loom_rt_pool_threads(const loom_rt_pool *pool) { return pool ? pool->n_threads : 0; }

/* Returns, when timed, the summed run times of the chunks (else 0). */
static int64_t parallel_for(loom_rt_pool *pool, int64_t extent, int64_t grain, int32_t per_thread,
                            void (*fn)(void *ud, int64_t lo, int64_t hi), void *ud, bool timed) {
    if (extent <= 0)
        return 0;
    if (grain < 1)
        grain = 1;
    per_thread = per_thread < 1 ? 1 : per_thread > 64 ? 64 : per_thread; /* fits the job word */
    /* per_thread chunks a thread, but none smaller than grain: extent / n_chunks >= grain
     * whenever n_chunks <= extent / grain, and chunks differ in size by at most one. */
    int64_t n_chunks = extent / grain;
    if (n_chunks > (int64_t)pool->n_threads * per_thread)
        n_chunks = (int64_t)pool->n_threads * per_thread;
    if (n_chunks <= 1) { /* no hand-off: nothing to share */
        int64_t t0 = timed ? loom_rt_now_ns() : 0;
        fn(ud, 0, extent);
        return timed ? loom_rt_now_ns() - t0 : 0;
    }
    pool->fn = fn;
    pool->ud = ud;
    pool->extent = extent;
    pool->timed = timed;
    atomic_store_explicit(&pool->busy_ns, 0, memory_order_relaxed);
    uint64_t gen = ((atomic_load_explicit(&pool->job, memory_order_relaxed) >> 32) + 1) << 32;
    atomic_store_explicit(&pool->pending, (int32_t)n_chunks, memory_order_relaxed);
    atomic_store_explicit(&pool->claim, gen, memory_order_relaxed);
    uint64_t job = gen | (uint64_t)n_chunks;
    atomic_store(&pool->job, job); /* seq_cst, and publishes the stores above */
    if (atomic_load(&pool->sleepers) > 0) {
        /* The lock/unlock orders us after any worker that counted itself a sleeper has
         * entered its wait (it holds mu from the count until then); broadcasting after the
         * unlock spares the woken workers from blocking on mu we still hold, which would
         * cost a second wake-up. */
        pthread_mutex_lock(&pool->mu);
        pthread_mutex_unlock(&pool->mu);
        pthread_cond_broadcast(&pool->wake);
    }
    run_chunks(pool, job);
    if (!spin_until(pool, pool->caller_spin_ns, all_done, 0)) {
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->caller_sleeping, true);
        while (!all_done(pool, 0))
            pthread_cond_wait(&pool->done, &pool->mu);
        atomic_store(&pool->caller_sleeping, false);
        pthread_mutex_unlock(&pool->mu);
    }
    return timed ? atomic_load(&pool->busy_ns) : 0;
}

void loom_rt_pool_parallel_for(loom_rt_pool *pool, int64_t extent, int64_t grain,
                               void (*fn)(void *ud, int64_t lo, int64_t hi), void *ud) {
    (void)parallel_for(pool, extent, grain, 1, fn, ud, false);
}

void loom_rt_pool_parallel_for_ex(loom_rt_pool *pool, int64_t extent, int64_t grain,
                                  int32_t per_thread, void (*fn)(void *ud, int64_t lo, int64_t hi),
                                  void *ud, int64_t *idle_ns) {
    if (!idle_ns) {
        (void)parallel_for(pool, extent, grain, per_thread, fn, ud, false);
        return;
    }
    int64_t t0 = loom_rt_now_ns();
    int64_t busy = parallel_for(pool, extent, grain, per_thread, fn, ud, true);
    int64_t idle = (int64_t)pool->n_threads * (loom_rt_now_ns() - t0) - busy;
    *idle_ns = idle > 0 ? idle : 0;
}

int32_t loom_rt_default_threads(void) { return loom_rt_default_threads_shared(1); }

int32_t loom_rt_default_threads_shared(int32_t sharers) {
    const char *env = getenv("LOOM_NUM_THREADS");
    if (env && *env >= '0' && *env <= '9') {
        char *end = NULL;
        errno = 0;
        long v = strtol(env, &end, 10);
        if (errno == 0 && *end == '\0' && v >= 1 && v <= POOL_MAX_THREADS)
            return (int32_t)v;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (sharers > 1)
        cores /= sharers;
    if (cores < 1)
        return 1;
    return cores > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int32_t)cores;
}
