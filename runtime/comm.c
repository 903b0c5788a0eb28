/* Communicators: argument checks, 16-bit staging, scale, the deadline wait and the
 * backend choice shared by every backend, and the "self" backend (one rank). */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "bulk.h"
#include "runtime.h"

static const char *const kind_names[] = {
    [LOOM_RT_COMM_BARRIER] = "barrier",
    [LOOM_RT_COMM_ALLREDUCE] = "allreduce",
    [LOOM_RT_COMM_BROADCAST] = "broadcast",
    [LOOM_RT_COMM_ALLGATHER] = "allgather",
};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == LOOM_RT_COMM_KIND_COUNT_,
               "a name per collective kind");

const char *loom_rt_reduce_op_name(loom_reduce_op op) {
    switch (op) {
    case LOOM_REDUCE_SUM: return "sum";
    case LOOM_REDUCE_MAX: return "max";
    case LOOM_REDUCE_MIN: return "min";
    case LOOM_REDUCE_COUNT_: break;
    }
    return "?";
}

/* ---- the world communicator ---------------------------------------------------------------- */

static _Atomic(loom_rt_comm *) world;

loom_rt_comm *loom_rt_comm_world(void) {
    return atomic_load(&world);
}

void loom_rt_comm_set_world(loom_rt_comm *c) {
    atomic_store(&world, c);
}

/* ---- choosing a backend -------------------------------------------------------------------- */

bool loom_rt_comm_launcher_present(int32_t *out_size) {
    static const char *const rank_vars[] = {"PMI_RANK", "PMI_FD", "PMIX_RANK",
                                            "OMPI_COMM_WORLD_RANK"};
    static const char *const size_vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE"};
    bool present = false;
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++)
        present |= getenv(rank_vars[i]) != NULL;
    int32_t size = 0;
    for (size_t i = 0; i < sizeof size_vars / sizeof size_vars[0] && size == 0; i++) {
        const char *v = getenv(size_vars[i]);
        if (!v)
            continue;
        present = true;
        long n = strtol(v, NULL, 10);
        size = n > 0 && n <= INT32_MAX ? (int32_t)n : 0;
    }
    if (out_size)
        *out_size = size;
    return present;
}

loom_status loom_rt_comm_choose_backend(const loom_dist_options *o, loom_dist_backend *out,
                                        loom_ir_diag *d) {
    loom_dist_backend b = o ? o->backend : LOOM_DIST_BACKEND_DEFAULT;
    if ((unsigned)b >= LOOM_DIST_BACKEND_COUNT_)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: unknown backend %d in loom_dist_options", (int)b);
    if (b == LOOM_DIST_BACKEND_DEFAULT) {
        const char *env = getenv("LOOM_DIST");
        if (!env || !*env || strcmp(env, "auto") == 0)
            b = LOOM_DIST_BACKEND_AUTO;
        else if (strcmp(env, "self") == 0)
            b = LOOM_DIST_BACKEND_SELF;
        else if (strcmp(env, "mpi") == 0)
            b = LOOM_DIST_BACKEND_MPI;
        else
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "dist: LOOM_DIST='%s': expected self, mpi or auto", env);
    }
    int32_t launched_size = 0;
    if (b == LOOM_DIST_BACKEND_AUTO) {
        bool launched = loom_rt_comm_launcher_present(&launched_size);
        b = launched ? LOOM_DIST_BACKEND_MPI : LOOM_DIST_BACKEND_SELF;
        /* `mpiexec -n 1` of a build without MPI is still a correct one-rank run. */
        if (b == LOOM_DIST_BACKEND_MPI && !loom_rt_comm_mpi_available() && launched_size <= 1)
            b = LOOM_DIST_BACKEND_SELF;
    }
    /* Explicit requests for mpi without MPI fail in loom_rt_comm_mpi_create. */
    if (b == LOOM_DIST_BACKEND_MPI && !loom_rt_comm_mpi_available() && launched_size > 1)
        return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                "dist: a launcher started %d ranks, but this Loom was built "
                                "without MPI (install libmpich-dev and reconfigure)",
                                (int)launched_size);
    *out = b;
    return LOOM_OK;
}

loom_status loom_rt_comm_timeout_ns(const loom_dist_options *o, int64_t *out_ns, loom_ir_diag *d) {
    double s = o ? o->timeout_s : 0;
    const char *what = "loom_dist_options.timeout_s";
    char text[64] = "";
    if (s == 0) {
        const char *env = getenv("LOOM_DIST_TIMEOUT_S");
        s = LOOM_RT_COMM_DEFAULT_TIMEOUT_S;
        if (env && *env) {
            char *end = NULL;
            errno = 0;
            s = strtod(env, &end);
            if (errno != 0 || *end != '\0')
                s = -1;
            what = "LOOM_DIST_TIMEOUT_S";
            snprintf(text, sizeof text, "'%s'", env);
        }
    }
    if (!text[0])
        snprintf(text, sizeof text, "%g", s);
    /* At most a year: beyond that the nanoseconds would not fit, and nobody waits that long. */
    if (!(s > 0 && s <= 365.0 * 86400))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: %s=%s: expected a number of seconds > 0", what, text);
    *out_ns = (int64_t)(s * 1e9);
    return LOOM_OK;
}

/* ---- the self backend ---------------------------------------------------------------------- */

static loom_status self_post_barrier(loom_rt_comm *c, loom_rt_comm_request *req, loom_ir_diag *d) {
    req->done = true;
    return LOOM_OK;
}

static loom_status self_post_allreduce(loom_rt_comm *c, void *buf, loom_rt_comm_request *req,
                                       loom_ir_diag *d) {
    req->done = true; /* the reduction of one rank's values is those values */
    return LOOM_OK;
}

static loom_status self_post_broadcast(loom_rt_comm *c, void *buf, int32_t root,
                                       loom_rt_comm_request *req, loom_ir_diag *d) {
    req->done = true;
    return LOOM_OK;
}

static loom_status self_post_allgather(loom_rt_comm *c, const void *send, void *recv,
                                       loom_rt_comm_request *req, loom_ir_diag *d) {
    if (send && req->count)
        memmove(recv, send, req->count * loom_dtype_size(req->dtype));
    req->done = true;
    return LOOM_OK;
}

static loom_status self_test(loom_rt_comm *c, loom_rt_comm_request *req, bool *out_done,
                             loom_ir_diag *d) {
    *out_done = true;
    return LOOM_OK;
}

static loom_status self_destroy(loom_rt_comm *c, bool failed, loom_ir_diag *d) {
    return LOOM_OK;
}

static const loom_rt_comm_vtable self_vtable = {
    .name = "self",
    .post_barrier = self_post_barrier,
    .post_allreduce = self_post_allreduce,
    .post_broadcast = self_post_broadcast,
    .post_allgather = self_post_allgather,
    .test = self_test,
    .destroy = self_destroy,
};

/* ---- creation ---------------------------------------------------------------------------- */

loom_status loom_rt_comm_init_base(loom_rt_comm *c, const loom_rt_comm_vtable *vt,
                                   const loom_allocator *a, int64_t timeout_ns) {
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->mu, NULL) != 0)
        return LOOM_STATUS_OUT_OF_MEMORY;
    c->vt = vt;
    c->alloc = *a;
    c->timeout_ns = timeout_ns;
    c->spare_cap = LOOM_RT_COMM_SPARE_BYTES;
    c->size = c->local_size = 1;
    atomic_init(&c->pending, 0);
    atomic_init(&c->failed, false);
    loom_ir_diag_init(&c->failure);
    loom_rt_metrics_init(&c->stats);
    return LOOM_OK;
}

loom_status loom_rt_comm_create(const loom_dist_options *o, loom_rt_comm **out, loom_ir_diag *d) {
    if (!out)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "dist: out is NULL");
    *out = NULL;
    loom_dist_backend b;
    int64_t timeout_ns;
    loom_status st = loom_rt_comm_choose_backend(o, &b, d);
    if (st == LOOM_OK)
        st = loom_rt_comm_timeout_ns(o, &timeout_ns, d);
    if (st != LOOM_OK)
        return st;
    loom_allocator a = o && o->allocator.fn ? o->allocator : loom_allocator_system();
    if (b == LOOM_DIST_BACKEND_MPI)
        return loom_rt_comm_mpi_create(&a, timeout_ns, out, d);
    loom_rt_comm *c = loom_ir_alloc(&a, sizeof *c);
    if (!c || loom_rt_comm_init_base(c, &self_vtable, &a, timeout_ns) != LOOM_OK) {
        loom_ir_free(&a, c, sizeof *c);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "dist: out of memory");
    }
    *out = c;
    return LOOM_OK;
}

loom_status loom_rt_comm_destroy(loom_rt_comm *c, loom_ir_diag *d) {
    if (!c)
        return LOOM_OK;
    int pending = atomic_load(&c->pending);
    if (pending > 0)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: finalize with %d collective(s) not yet waited for", pending);
    bool failed = atomic_load(&c->failed);
    loom_status st = c->vt->destroy(c, failed, d);
    if (failed)
        st = loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR,
                              "dist: MPI left unfinalized after an earlier failure (%s): exit "
                              "with a non-zero status so that mpiexec ends the other ranks",
                              c->failure.msg);
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        loom_ir_free(&c->alloc, c->spare[i], c->spare_bytes[i]);
    pthread_mutex_destroy(&c->mu);
    loom_allocator a = c->alloc;
    loom_ir_free(&a, c, sizeof *c);
    return st;
}

/* ---- collectives ---------------------------------------------------------------------------- */

static bool dtype_ok(loom_dtype dt) {
    return (unsigned)dt < LOOM_DTYPE_COUNT_;
}

static loom_status check_comm(loom_rt_comm *c, const char *what, loom_ir_diag *d) {
    if (!c)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: %s before loom_dist_init (no communicator)", what);
    if (atomic_load(&c->failed))
        return loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR,
                                "dist: %s on rank %d: the communicator failed earlier: %s", what,
                                (int)c->rank, c->failure.msg);
    return LOOM_OK;
}

static loom_status check_buffer(const char *what, const void *buf, const char *buf_name,
                                size_t count, loom_dtype dt, loom_ir_diag *d) {
    if (!dtype_ok(dt))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "dist: %s: unknown dtype %d", what,
                                (int)dt);
    if (count > INT32_MAX)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: %s: %zu elements of %s: at most %d per collective", what,
                                count, loom_dtype_name(dt), INT32_MAX);
    if (count > 0 && !buf)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: %s: %s is NULL for %zu elements", what, buf_name, count);
    return LOOM_OK;
}

/* Marks c failed with d's message (the first failure wins). Returns d's code. */
static loom_status fail_comm(loom_rt_comm *c, loom_ir_diag *d) {
    if (d->code == LOOM_STATUS_COMM_ERROR) {
        if (!atomic_load(&c->failed))
            c->failure = *d;
        atomic_store(&c->failed, true);
    }
    return d->code;
}

/* A new request for c (seq taken under the lock by the caller's post). */
static loom_status new_request(loom_rt_comm *c, loom_rt_comm_kind kind, size_t count, loom_dtype dt,
                               loom_rt_comm_request **out, loom_ir_diag *d) {
    loom_rt_comm_request *r = loom_ir_alloc(&c->alloc, sizeof *r);
    if (!r)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "dist: %s: out of memory",
                                kind_names[kind]);
    memset(r, 0, sizeof *r);
    r->comm = c;
    r->kind = kind;
    r->count = count;
    r->dtype = dt;
    r->op = LOOM_REDUCE_SUM;
    r->scale = 1.0;
    *out = r;
    return LOOM_OK;
}

/* An f32 staging of at least bytes for r: the smallest spare that fits, else a new one. */
static bool take_staging(loom_rt_comm *c, loom_rt_comm_request *r, size_t bytes) {
    int best = -1;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        if (c->spare[i] && c->spare_bytes[i] >= bytes &&
            (best < 0 || c->spare_bytes[i] < c->spare_bytes[best]))
            best = i;
    if (best >= 0) {
        r->staging = c->spare[best];
        r->staging_bytes = c->spare_bytes[best];
        c->spare[best] = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (best < 0) {
        r->staging = loom_ir_alloc(&c->alloc, bytes);
        r->staging_bytes = r->staging ? bytes : 0;
    }
    return r->staging != NULL;
}

/* Keeps a finished request's staging as a spare (in a free place, or instead of a smaller
 * spare), the smallest others freed while the spares exceed spare_cap; else frees it (and
 * one larger than the cap). */
static void give_staging(loom_rt_comm *c, float *p, size_t bytes) {
    if (!p)
        return;
    float *drop[LOOM_RT_COMM_SPARES + 1];
    size_t drop_bytes[LOOM_RT_COMM_SPARES + 1];
    int n_drop = 0, at = -1, smallest = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < LOOM_RT_COMM_SPARES && at < 0 && bytes <= c->spare_cap; i++)
        if (!c->spare[i])
            at = i;
        else if (c->spare_bytes[i] < c->spare_bytes[smallest])
            smallest = i;
    if (at < 0 && bytes <= c->spare_cap && c->spare_bytes[smallest] < bytes)
        at = smallest;
    if (at < 0) {
        drop[n_drop] = p, drop_bytes[n_drop++] = bytes;
    } else {
        if (c->spare[at])
            drop[n_drop] = c->spare[at], drop_bytes[n_drop++] = c->spare_bytes[at];
        c->spare[at] = p, c->spare_bytes[at] = bytes;
        size_t total = 0;
        for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
            total += c->spare[i] ? c->spare_bytes[i] : 0;
        while (total > c->spare_cap) { /* p alone fits: the others go, the smallest first */
            int s = -1;
            for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
                if (i != at && c->spare[i] && (s < 0 || c->spare_bytes[i] < c->spare_bytes[s]))
                    s = i;
            if (s < 0)
                break; /* not reached: p alone is within the cap */
            drop[n_drop] = c->spare[s], drop_bytes[n_drop++] = c->spare_bytes[s];
            total -= c->spare_bytes[s];
            c->spare[s] = NULL, c->spare_bytes[s] = 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n_drop; i++)
        loom_ir_free(&c->alloc, drop[i], drop_bytes[i]);
}

static void free_request(loom_rt_comm_request *r, bool free_staging) {
    loom_rt_comm *c = r->comm;
    if (free_staging)
        give_staging(c, r->staging, r->staging_bytes);
    loom_ir_free(&c->alloc, r, sizeof *r);
}

/* "allreduce #7 (sum, f32 x1024)" into buf. */
static const char *describe(const loom_rt_comm_request *r, char *buf, size_t size) {
    switch (r->kind) {
    case LOOM_RT_COMM_BARRIER:
        snprintf(buf, size, "barrier #%llu", (unsigned long long)r->seq);
        break;
    case LOOM_RT_COMM_ALLREDUCE:
        snprintf(buf, size, "allreduce #%llu (%s, %s x%zu)", (unsigned long long)r->seq,
                 loom_rt_reduce_op_name(r->op), loom_dtype_name(r->dtype), r->count);
        break;
    case LOOM_RT_COMM_BROADCAST:
    case LOOM_RT_COMM_ALLGATHER:
        snprintf(buf, size, "%s #%llu (%s x%zu)", kind_names[r->kind], (unsigned long long)r->seq,
                 loom_dtype_name(r->dtype), r->count);
        break;
    case LOOM_RT_COMM_KIND_COUNT_: snprintf(buf, size, "?"); break;
    }
    return buf;
}

/* Reports a backend failure (its message in bd) as r's, and marks c failed if it is a
 * communication error. Called under c's lock. */
static loom_status backend_failed(loom_rt_comm *c, const loom_rt_comm_request *r, loom_status st,
                                  const loom_ir_diag *bd, loom_ir_diag *d) {
    char what[128];
    loom_ir_diag_set(d, st, "dist: %s failed on rank %d of %d: %s", describe(r, what, sizeof what),
                     (int)c->rank, (int)c->size, bd->msg[0] ? bd->msg : loom_status_name(st));
    return fail_comm(c, d);
}

typedef struct post_args {
    void *buf;
    const void *send;
    int32_t root;
} post_args;

/* Posts r on c's backend under the lock; on failure frees r and marks c failed. */
static loom_status post(loom_rt_comm *c, loom_rt_comm_request *r, post_args args, loom_ir_diag *d) {
    loom_ir_diag bd;
    loom_ir_diag_init(&bd);
    pthread_mutex_lock(&c->mu);
    r->seq = ++c->seq;
    r->t_start = loom_rt_now_ns();
    loom_status st = LOOM_STATUS_INTERNAL;
    switch (r->kind) {
    case LOOM_RT_COMM_BARRIER: st = c->vt->post_barrier(c, r, &bd); break;
    case LOOM_RT_COMM_ALLREDUCE: st = c->vt->post_allreduce(c, args.buf, r, &bd); break;
    case LOOM_RT_COMM_BROADCAST: st = c->vt->post_broadcast(c, args.buf, args.root, r, &bd); break;
    case LOOM_RT_COMM_ALLGATHER: st = c->vt->post_allgather(c, args.send, args.buf, r, &bd); break;
    case LOOM_RT_COMM_KIND_COUNT_: break;
    }
    if (st != LOOM_OK)
        backend_failed(c, r, st, &bd, d);
    pthread_mutex_unlock(&c->mu);
    if (st != LOOM_OK) {
        free_request(r, true);
        return st;
    }
    atomic_fetch_add(&c->pending, 1);
    return LOOM_OK;
}

loom_status loom_rt_comm_test(loom_rt_comm_request *req, bool *out_done, loom_ir_diag *d) {
    if (!req || !out_done)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "dist: test: NULL argument");
    loom_rt_comm *c = req->comm;
    *out_done = req->done;
    if (req->done)
        return LOOM_OK;
    if (atomic_load(&c->failed))
        return check_comm(c, kind_names[req->kind], d);
    loom_ir_diag bd;
    loom_ir_diag_init(&bd);
    pthread_mutex_lock(&c->mu);
    bool done = false;
    loom_status st = c->vt->test(c, req, &done, &bd);
    if (st != LOOM_OK)
        backend_failed(c, req, st, &bd, d);
    pthread_mutex_unlock(&c->mu);
    req->done = done;
    *out_done = done;
    return st;
}

/* Between polls: only yield for the first 200 ms, as MPI moves a large message only inside
 * its calls (a 25 MB all-reduce is hundreds of pipelined chunks, and a 50 µs sleep between
 * them made it 1.4x slower than a blocking MPI_Allreduce); then 50 µs sleeps, then 1 ms
 * after a second (a peer that is compiling or dead). */
static void backoff(int64_t waited_ns) {
    if (waited_ns < 200000000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited_ns < 1000000000 ? 50000 : 1000000};
    nanosleep(&ts, NULL);
}

static void scale_in_place(void *buf, size_t count, loom_dtype dt, double scale) {
    if (dt == LOOM_DTYPE_F32) {
        loom_rt_scale_f32(buf, buf, count, (float)scale);
    } else if (dt == LOOM_DTYPE_F64) {
        double *x = buf;
        for (size_t i = 0; i < count; i++)
            x[i] *= scale;
    }
}

/* Writes a completed allreduce's result into the caller's buffer. */
static void finish_allreduce(loom_rt_comm_request *r) {
    if (r->staging)
        loom_rt_narrow16(r->buf, r->staging, r->count, (float)r->scale, r->dtype);
    else if (r->scale != 1.0)
        scale_in_place(r->buf, r->count, r->dtype, r->scale);
}

/* The payload of a completed collective on this rank: what it reduced (the f32 staging of
 * 16-bit floats), received from the root, or gathered. */
static size_t payload_bytes(const loom_rt_comm_request *r) {
    switch (r->kind) {
    case LOOM_RT_COMM_BARRIER: return 0;
    case LOOM_RT_COMM_ALLREDUCE:
        return r->count * (r->staging ? sizeof(float) : loom_dtype_size(r->dtype));
    case LOOM_RT_COMM_BROADCAST: return r->count * loom_dtype_size(r->dtype);
    case LOOM_RT_COMM_ALLGATHER:
        return r->count * (size_t)r->comm->size * loom_dtype_size(r->dtype);
    case LOOM_RT_COMM_KIND_COUNT_: break;
    }
    return 0;
}

static void count_collective(loom_rt_comm *c, const loom_rt_comm_request *r) {
    int64_t ns = loom_rt_now_ns() - r->t_start;
    pthread_mutex_lock(&c->mu);
    loom_rt_metrics_add(&c->stats, LOOM_RT_METRIC_COLLECTIVE_TIME, ns);
    loom_rt_metrics_add(&c->stats, LOOM_RT_METRIC_COLLECTIVE_BYTES, (int64_t)payload_bytes(r));
    pthread_mutex_unlock(&c->mu);
}

void loom_rt_comm_read_metrics(loom_rt_comm *c, loom_rt_metrics *m) {
    if (!c || !m)
        return;
    static const loom_rt_metric mine[] = {LOOM_RT_METRIC_COLLECTIVE_TIME,
                                          LOOM_RT_METRIC_COLLECTIVE_BYTES};
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) {
        loom_rt_metric k = mine[i];
        m->count[k] = c->stats.count[k];
        m->total[k] = c->stats.total[k];
        m->min[k] = c->stats.min[k];
        m->max[k] = c->stats.max[k];
        m->last[k] = c->stats.last[k];
    }
    pthread_mutex_unlock(&c->mu);
}

loom_status loom_rt_comm_wait(loom_rt_comm_request *req, loom_ir_diag *d) {
    if (!req)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "dist: wait: request is NULL");
    loom_rt_comm *c = req->comm;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = LOOM_OK;
    bool done = req->done;
    while (!done) {
        st = loom_rt_comm_test(req, &done, d);
        if (st != LOOM_OK || done)
            break;
        int64_t waited = loom_rt_now_ns() - t0;
        if (waited >= c->timeout_ns) {
            char what[128];
            pthread_mutex_lock(&c->mu);
            st = loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR,
                                  "dist: %s on rank %d of %d did not complete within %g s "
                                  "(LOOM_DIST_TIMEOUT_S): another rank died, stalled, or is "
                                  "waiting in a different collective",
                                  describe(req, what, sizeof what), (int)c->rank, (int)c->size,
                                  (double)c->timeout_ns / 1e9);
            fail_comm(c, d);
            pthread_mutex_unlock(&c->mu);
            break;
        }
        backoff(waited);
    }
    if (st == LOOM_OK && req->kind == LOOM_RT_COMM_ALLREDUCE)
        finish_allreduce(req);
    if (st == LOOM_OK)
        count_collective(c, req);
    /* A collective that never completed may still write its staging buffer if MPI makes
     * progress later: leave that buffer to MPI rather than free it under its feet. The
     * request goes before the count drops: a finalize that sees none pending may free c. */
    free_request(req, done);
    atomic_fetch_sub(&c->pending, 1);
    return st;
}

static loom_status run_blocking(loom_rt_comm *c, loom_rt_comm_request *r, post_args args,
                                loom_ir_diag *d) {
    loom_status st = post(c, r, args, d);
    return st == LOOM_OK ? loom_rt_comm_wait(r, d) : st;
}

loom_status loom_rt_comm_barrier(loom_rt_comm *c, loom_ir_diag *d) {
    loom_status st = check_comm(c, "barrier", d);
    loom_rt_comm_request *r = NULL;
    if (st == LOOM_OK)
        st = new_request(c, LOOM_RT_COMM_BARRIER, 0, LOOM_DTYPE_I32, &r, d);
    return st == LOOM_OK ? run_blocking(c, r, (post_args){0}, d) : st;
}

loom_status loom_rt_comm_allreduce_start(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                         loom_reduce_op op, double scale,
                                         loom_rt_comm_request **out_req, loom_ir_diag *d) {
    if (!out_req)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "dist: allreduce: out is NULL");
    *out_req = NULL;
    loom_status st = check_comm(c, "allreduce", d);
    if (st == LOOM_OK)
        st = check_buffer("allreduce", buf, "buf", count, dt, d);
    if (st != LOOM_OK)
        return st;
    if ((unsigned)op >= LOOM_REDUCE_COUNT_)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allreduce: unknown reduce op %d", (int)op);
    if (dt == LOOM_DTYPE_BOOL && op == LOOM_REDUCE_SUM)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allreduce: sum of bool (use max for any, min for all)");
    if (!isfinite(scale))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allreduce: scale %g is not finite", scale);
    if (scale != 1.0 && !loom_ir_dtype_is_float(dt))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allreduce: scale %g on %s (only float dtypes scale)", scale,
                                loom_dtype_name(dt));
    loom_rt_comm_request *r = NULL;
    st = new_request(c, LOOM_RT_COMM_ALLREDUCE, count, dt, &r, d);
    if (st != LOOM_OK)
        return st;
    r->op = op;
    r->scale = scale;
    r->buf = buf;
    void *reduced = buf;
    if (dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16) {
        if (count && !take_staging(c, r, count * sizeof(float))) {
            free_request(r, false);
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                    "dist: allreduce: out of memory staging %zu %s elements", count,
                                    loom_dtype_name(dt));
        }
        loom_rt_widen16(r->staging, buf, count, dt);
        reduced = r->staging;
    }
    st = post(c, r, (post_args){.buf = reduced}, d);
    if (st == LOOM_OK)
        *out_req = r;
    return st;
}

loom_status loom_rt_comm_allreduce(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                   loom_reduce_op op, double scale, loom_ir_diag *d) {
    loom_rt_comm_request *r = NULL;
    loom_status st = loom_rt_comm_allreduce_start(c, buf, count, dt, op, scale, &r, d);
    return st == LOOM_OK ? loom_rt_comm_wait(r, d) : st;
}

loom_status loom_rt_comm_broadcast(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                   int32_t root, loom_ir_diag *d) {
    loom_status st = check_comm(c, "broadcast", d);
    if (st == LOOM_OK)
        st = check_buffer("broadcast", buf, "buf", count, dt, d);
    if (st != LOOM_OK)
        return st;
    if (root < 0 || root >= c->size)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: broadcast: root %d is not a rank (world size %d)", (int)root,
                                (int)c->size);
    loom_rt_comm_request *r = NULL;
    st = new_request(c, LOOM_RT_COMM_BROADCAST, count, dt, &r, d);
    return st == LOOM_OK ? run_blocking(c, r, (post_args){.buf = buf, .root = root}, d) : st;
}

loom_status loom_rt_comm_allgather(loom_rt_comm *c, const void *send, void *recv, size_t count,
                                   loom_dtype dt, loom_ir_diag *d) {
    loom_status st = check_comm(c, "allgather", d);
    if (st == LOOM_OK)
        st = check_buffer("allgather", send ? send : recv, send ? "send" : "recv", count, dt, d);
    if (st != LOOM_OK)
        return st;
    if (count > 0 && !recv)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allgather: recv is NULL for %zu elements", count);
    if (count > (size_t)INT32_MAX / (size_t)c->size)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "dist: allgather: %zu elements x %d ranks: at most %d in all",
                                count, (int)c->size, INT32_MAX);
    loom_rt_comm_request *r = NULL;
    st = new_request(c, LOOM_RT_COMM_ALLGATHER, count, dt, &r, d);
    return st == LOOM_OK ? run_blocking(c, r, (post_args){.buf = recv, .send = send}, d) : st;
}
