/* Communicators: collectives across the ranks of a job on host buffers, behind a vtable
 * with two backends, "self" (one rank) and "mpi" (comm_mpi.c), plus the process's world
 * communicator that loom_dist_init creates.
 *
 * The generic layer (comm.c) validates arguments, stages 16-bit floats, applies the scale,
 * serializes backend calls behind the communicator's lock, and waits with a deadline; a
 * backend only posts non-blocking collectives on native element types and polls them.
 *
 * Semantics (every rank calls the same collectives in the same order, as in MPI):
 *   - allreduce: buf (count elements of dt, in place) becomes scale * op(buf of every
 *     rank). Dtypes f32, f64, bf16, f16, i32, i64 for sum/max/min, bool for max/min (any /
 *     all). bf16 and f16 are widened to f32, reduced in f32 and rounded once at the end
 *     (after the scale): twice the bytes on the wire, but one rounding whatever the number
 *     of ranks or the reduction order, so N ranks match one rank on the same global batch.
 *     scale must be finite, and 1 for integer and bool dtypes.
 *   - broadcast: buf on every rank becomes root's buf.
 *   - allgather: recv (count * size elements) becomes the ranks' send buffers in rank order;
 *     send NULL means in place (this rank's part already at recv + rank * count).
 *   - count may be 0 (the collective still happens) and is at most INT32_MAX.
 *
 * Requests: *_start returns a request that must be passed to loom_rt_comm_wait exactly
 * once (wait frees it, whatever it returns); loom_rt_comm_test polls without freeing. The
 * buffers belong to the collective until the wait returns.
 *
 * Failures: a wait fails with COMM_ERROR after the communicator's timeout, naming the
 * operation, its sequence number and the rank; an MPI error does too. Either marks the
 * communicator failed: every later collective fails at once with the first message, and
 * destroy leaves MPI unfinalized (MPI_Finalize could hang on the dead peer). Argument
 * errors (INVALID_ARGUMENT) are local and leave the communicator usable.
 *
 * Metrics: each collective that completes adds its time (start to the end of its wait) and
 * payload bytes to the communicator's CollectiveTime and CollectiveBytes (runtime/metrics.def),
 * whatever thread ran it; loom_rt_comm_read_metrics copies them out.
 *
 * Threads: every backend call is made under the communicator's lock (MPI runs at
 * MPI_THREAD_SERIALIZED), so collectives may be started and waited on from several
 * threads; their order across ranks is still the callers' to keep identical. */
#ifndef LOOM_RUNTIME_COMM_H
#define LOOM_RUNTIME_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "ir/ir.h"
#include "loom/dist.h"
#include "runtime.h"

/* Default for LOOM_DIST_TIMEOUT_S: long enough for one rank to compile a step that another
 * found in its cache, short enough that a dead peer ends the job within minutes. */
#define LOOM_RT_COMM_DEFAULT_TIMEOUT_S 300.0
/* 16-bit all-reduce stagings a communicator keeps for reuse: one per bucket of a step that
 * has up to this many in flight, and together at most this many bytes (a 25 MB bf16 bucket
 * stages 50 MB of f32: five of them). */
#define LOOM_RT_COMM_SPARES 8
#define LOOM_RT_COMM_SPARE_BYTES ((size_t)256 << 20)

typedef struct loom_rt_comm loom_rt_comm;
typedef struct loom_rt_comm_request loom_rt_comm_request;

/* Operation kinds, for messages. */
typedef enum loom_rt_comm_kind {
    LOOM_RT_COMM_BARRIER,
    LOOM_RT_COMM_ALLREDUCE,
    LOOM_RT_COMM_BROADCAST,
    LOOM_RT_COMM_ALLGATHER,
    LOOM_RT_COMM_KIND_COUNT_
} loom_rt_comm_kind;

struct loom_rt_comm_request {
    loom_rt_comm *comm;
    loom_rt_comm_kind kind;
    loom_reduce_op op;
    loom_dtype dtype;
    size_t count;
    double scale;
    uint64_t seq;   /* the communicator's collective number, from 1 */
    int64_t t_start; /* loom_rt_now_ns() when it was posted */
    void *buf;      /* allreduce: the caller's buffer, written at the wait */
    float *staging; /* allreduce of bf16/f16: the f32 copy that is reduced */
    size_t staging_bytes;
    bool done;                           /* the backend reported completion */
    _Alignas(16) unsigned char impl[32]; /* the backend's handle (an MPI_Request) */
};

/* A backend. Each post_* starts one non-blocking collective on native types (allreduce
 * never sees bf16/f16; broadcast and allgather move them as 16-bit words) and keeps its
 * handle in req->impl; test sets *out_done once it completed. All are called under the
 * communicator's lock. Failures fill d and return COMM_ERROR (or OUT_OF_MEMORY). */
typedef struct loom_rt_comm_vtable {
    const char *name;
    loom_status (*post_barrier)(loom_rt_comm *c, loom_rt_comm_request *req, loom_ir_diag *d);
    loom_status (*post_allreduce)(loom_rt_comm *c, void *buf, loom_rt_comm_request *req,
                                  loom_ir_diag *d);
    loom_status (*post_broadcast)(loom_rt_comm *c, void *buf, int32_t root,
                                  loom_rt_comm_request *req, loom_ir_diag *d);
    loom_status (*post_allgather)(loom_rt_comm *c, const void *send, void *recv,
                                  loom_rt_comm_request *req, loom_ir_diag *d);
    loom_status (*test)(loom_rt_comm *c, loom_rt_comm_request *req, bool *out_done,
                        loom_ir_diag *d);
    /* Frees the backend; failed: the communicator failed earlier (do not finalize MPI). */
    loom_status (*destroy)(loom_rt_comm *c, bool failed, loom_ir_diag *d);
} loom_rt_comm_vtable;

struct loom_rt_comm {
    const loom_rt_comm_vtable *vt;
    loom_allocator alloc;
    int32_t rank, size, local_rank, local_size;
    int64_t timeout_ns;
    pthread_mutex_t mu; /* every backend call, seq, failure */
    uint64_t seq;       /* collectives started */
    atomic_int pending; /* requests started and not yet waited for */
    atomic_bool failed;
    loom_ir_diag failure; /* the first failure, repeated by later calls */
    loom_rt_metrics stats; /* CollectiveTime, CollectiveBytes; under mu */
    /* f32 stagings of finished 16-bit all-reduces, kept for the next ones (under mu): a fresh
     * buffer each time paid its page faults and, under MPI's zero-copy transports, the
     * walk of its new pages (a bf16 all-reduce of 25 MB of f32 took 28 ms against 7 ms in
     * f32) */
    float *spare[LOOM_RT_COMM_SPARES];
    size_t spare_bytes[LOOM_RT_COMM_SPARES];
    size_t spare_cap; /* their bytes at most: LOOM_RT_COMM_SPARE_BYTES (tests lower it) */
    void *impl; /* the backend's state */
};

/* ---- creation ---------------------------------------------------------------------------- */

/* Which backend o (NULL: defaults) and the environment ask for: SELF or MPI, never
 * DEFAULT/AUTO (MPI even in a build without it when asked for explicitly: creating it then
 * fails). Errors: INVALID_ARGUMENT (bad LOOM_DIST or option), UNSUPPORTED (a launcher
 * started several ranks but this build has no MPI). */
loom_status loom_rt_comm_choose_backend(const loom_dist_options *o, loom_dist_backend *out,
                                        loom_ir_diag *d);
/* Whether a launcher's environment is present (PMI_RANK, PMI_SIZE, PMI_FD, PMIX_RANK,
 * OMPI_COMM_WORLD_SIZE); *out_size gets the world size it announces, 0 if none. */
bool loom_rt_comm_launcher_present(int32_t *out_size);
/* The timeout o asks for (LOOM_DIST_TIMEOUT_S when o->timeout_s is 0), in ns.
 * Errors: INVALID_ARGUMENT. */
loom_status loom_rt_comm_timeout_ns(const loom_dist_options *o, int64_t *out_ns, loom_ir_diag *d);

/* A communicator with o's backend (chosen as loom_rt_comm_choose_backend does). o may be
 * NULL. Errors: as loom_dist_init. */
loom_status loom_rt_comm_create(const loom_dist_options *o, loom_rt_comm **out, loom_ir_diag *d);
/* Fills the generic part of c (lock, counters, allocator, timeout); the backends call it. */
loom_status loom_rt_comm_init_base(loom_rt_comm *c, const loom_rt_comm_vtable *vt,
                                   const loom_allocator *a, int64_t timeout_ns);
/* Frees c. Errors: INVALID_ARGUMENT (requests pending: nothing is freed), COMM_ERROR (c
 * failed earlier; c is freed, MPI left unfinalized). Accepts NULL. */
loom_status loom_rt_comm_destroy(loom_rt_comm *c, loom_ir_diag *d);

/* The MPI backend (comm_mpi.c; comm_nompi.c says UNSUPPORTED when built without MPI). */
loom_status loom_rt_comm_mpi_create(const loom_allocator *a, int64_t timeout_ns, loom_rt_comm **out,
                                    loom_ir_diag *d);
bool loom_rt_comm_mpi_available(void);

/* ---- the world communicator ---------------------------------------------------------------- */

/* The communicator loom_dist_init created, or NULL. Borrowed. */
loom_rt_comm *loom_rt_comm_world(void);
/* Sets the world communicator (NULL clears it); the frontend owns its lifetime. */
void loom_rt_comm_set_world(loom_rt_comm *c);

/* ---- collectives ---------------------------------------------------------------------------- */

loom_status loom_rt_comm_barrier(loom_rt_comm *c, loom_ir_diag *d);
loom_status loom_rt_comm_allreduce(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                   loom_reduce_op op, double scale, loom_ir_diag *d);
loom_status loom_rt_comm_broadcast(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                   int32_t root, loom_ir_diag *d);
loom_status loom_rt_comm_allgather(loom_rt_comm *c, const void *send, void *recv, size_t count,
                                   loom_dtype dt, loom_ir_diag *d);

/* Non-blocking all-reduce (MPI_Iallreduce): on success *out_req must be waited for. */
loom_status loom_rt_comm_allreduce_start(loom_rt_comm *c, void *buf, size_t count, loom_dtype dt,
                                         loom_reduce_op op, double scale,
                                         loom_rt_comm_request **out_req, loom_ir_diag *d);
/* Polls req: *out_done true once it completed (still wait for it). */
loom_status loom_rt_comm_test(loom_rt_comm_request *req, bool *out_done, loom_ir_diag *d);
/* Waits for req (at most the communicator's timeout), finishes it (scale, 16-bit rounding)
 * and frees it, on success and on failure alike. */
loom_status loom_rt_comm_wait(loom_rt_comm_request *req, loom_ir_diag *d);

/* Copies c's collective metrics (CollectiveTime, CollectiveBytes) into m, replacing m's
 * values of those two; leaves m alone when c is NULL. Thread-safe. */
void loom_rt_comm_read_metrics(loom_rt_comm *c, loom_rt_metrics *m);

/* "sum", "max", "min"; "?" out of range. */
const char *loom_rt_reduce_op_name(loom_reduce_op op);

#endif /* LOOM_RUNTIME_COMM_H */
