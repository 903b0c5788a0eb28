/* Loom distributed runs: one process per device ("single NPU, single process"), ranks from
 * the launcher, collectives through a communicator.
 *
 * Tutorial
 * --------
 *   // mpiexec -n 2 ./train      (or ./train alone: rank 0 of 1, no MPI needed)
 *   if (loom_dist_init(NULL) != LOOM_OK) {                  // reads the launcher's environment
 *       fprintf(stderr, "%s\n", loom_dist_error_message());
 *       return 1;
 *   }
 *   int32_t rank = loom_dist_rank(), world = loom_dist_world_size();
 *   loom_context *ctx = NULL;
 *   loom_context_create(NULL, &ctx);        // device "npu:<local rank>", cores / local ranks
 *   ...                                     // shard the data by rank, train
 *   loom_dist_barrier();
 *   loom_context_destroy(ctx);
 *   return loom_dist_finalize() == LOOM_OK ? 0 : 1;
 *
 * Backends
 *   - "self": world size 1, rank 0. Chosen for a program started without a launcher; it
 *     never touches MPI.
 *   - "mpi": MPICH or Open MPI, when Loom was built with one (see loom_dist_have_mpi). Rank
 *     and world size are MPI_COMM_WORLD's; the local rank is the rank among the processes
 *     of the same machine (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED). Runs under
 *     `mpiexec -n N` on one machine or several (hostfile); the transport is MPI's.
 *   LOOM_DIST=self|mpi|auto (default auto: mpi when a launcher's environment is present —
 *   MPICH/Hydra's PMI_RANK/PMI_SIZE/PMI_FD, PMIx, Open MPI's OMPI_COMM_WORLD_* — else self)
 *   forces a choice; loom_dist_options.backend overrides the variable.
 *
 * Failures
 *   MPI itself hangs or aborts when a rank dies. What Loom guarantees:
 *   - No Loom collective waits without bound: every wait polls with a deadline
 *     (LOOM_DIST_TIMEOUT_S, default 300 s) and then fails with LOOM_STATUS_COMM_ERROR and a
 *     message naming the operation, its sequence number and this rank. After that the
 *     communicator is failed: every later collective returns COMM_ERROR at once, and
 *     loom_dist_finalize does not call MPI_Finalize (which could hang on the dead peer).
 *   - MPI errors are returned, never fatal (MPI_ERRORS_RETURN on Loom's communicator), and
 *     turned into messages with MPI_Error_string.
 *   - A process that gets COMM_ERROR should print the message and exit with a non-zero
 *     status: mpiexec (Hydra) then ends the other ranks. A rank that exits non-zero or is
 *     killed ends the job the same way, usually long before any timeout.
 *   Not guaranteed: MPI_Init itself (inside loom_dist_init) waits for every rank to start;
 *   MPI may still abort the process on an error it considers fatal before Loom's error
 *   handler is installed.
 *
 * Threads
 *   init and finalize are for one thread (the program's main thread), not concurrent with
 *   any other loom_dist_* call. The queries (rank, sizes, backend name) may be called from
 *   any thread once init has returned. Loom calls MPI with MPI_THREAD_SERIALIZED: the host
 *   thread and the device's stream thread may both run collectives, and Loom serializes
 *   every MPI call behind one lock. A program that calls MPI itself must have initialized
 *   MPI with at least MPI_THREAD_SERIALIZED and must not call MPI concurrently with Loom;
 *   Loom then works on a duplicate of MPI_COMM_WORLD and leaves MPI_Finalize to it.
 *   Collectives must be called in the same order on every rank (as MPI's are).
 */
#ifndef LOOM_DIST_H
#define LOOM_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How an all-reduce combines the ranks' values. */
typedef enum loom_reduce_op {
    LOOM_REDUCE_SUM,
    LOOM_REDUCE_MAX,
    LOOM_REDUCE_MIN,
    LOOM_REDUCE_COUNT_
} loom_reduce_op;

typedef enum loom_dist_backend {
    LOOM_DIST_BACKEND_DEFAULT, /* LOOM_DIST if set, else auto */
    LOOM_DIST_BACKEND_AUTO,    /* mpi under a launcher, else self */
    LOOM_DIST_BACKEND_SELF,
    LOOM_DIST_BACKEND_MPI,
    LOOM_DIST_BACKEND_COUNT_
} loom_dist_backend;

typedef struct loom_dist_options {
    loom_dist_backend backend; /* default: LOOM_DIST_BACKEND_DEFAULT */
    double timeout_s;          /* longest wait for one collective; 0: LOOM_DIST_TIMEOUT_S,
                                  else 300 */
    loom_allocator allocator;  /* for collective requests and staging buffers; they are
                                  made on whichever thread starts a collective, so it must
                                  be thread-safe. Default: loom_allocator_system() */
} loom_dist_options;

/* Fills *o with the defaults (environment variables are read by loom_dist_init). Accepts
 * NULL. */
LOOM_API void loom_dist_options_init(loom_dist_options *o);

/* Joins the job: picks the backend (see the top of this file), initializes MPI with
 * MPI_THREAD_SERIALIZED if it uses MPI and nobody has yet, and learns this process's rank,
 * world size and local rank. o may be NULL (defaults). Idempotent: once it succeeded, later
 * calls return LOOM_OK without looking at o until loom_dist_finalize. Contexts created
 * afterwards default to device "npu:<local rank>" and cores / local size threads.
 * Errors (message in loom_dist_error_message): INVALID_ARGUMENT (bad option, bad LOOM_DIST
 * or LOOM_DIST_TIMEOUT_S), UNSUPPORTED (mpi asked for, or a launcher started several
 * ranks, but Loom was built without MPI; MPI already finalized in this process; MPI
 * without MPI_THREAD_SERIALIZED), COMM_ERROR (MPI failed), OUT_OF_MEMORY. */
LOOM_API loom_status loom_dist_init(const loom_dist_options *o);

/* Whether loom_dist_init has succeeded and loom_dist_finalize not been called since. */
LOOM_API bool loom_dist_is_initialized(void);

/* This process's rank in [0, world size). 0 when not initialized. */
LOOM_API int32_t loom_dist_rank(void);
/* Number of processes in the job. 1 when not initialized. */
LOOM_API int32_t loom_dist_world_size(void);
/* Rank among the job's processes on this machine (the N of its device "npu:N"). 0 when not
 * initialized. */
LOOM_API int32_t loom_dist_local_rank(void);
/* Number of the job's processes on this machine. 1 when not initialized. */
LOOM_API int32_t loom_dist_local_size(void);
/* "self" or "mpi"; "none" when not initialized. Static string. */
LOOM_API const char *loom_dist_backend_name(void);
/* Whether this build of Loom can use MPI. */
LOOM_API bool loom_dist_have_mpi(void);

/* Returns when every rank has called it (or fails within the timeout). It first waits for the
 * step each live context has in flight (as loom_context_sync would; a step's error is kept in
 * its context), so the barrier never meets a step's collectives, which run on the device's
 * stream thread: call it from the thread that uses the contexts. Errors: INVALID_ARGUMENT
 * (not initialized), COMM_ERROR (MPI error, timeout, failed earlier). */
LOOM_API loom_status loom_dist_barrier(void);

/* Leaves the job: waits for every live context's step in flight (as loom_dist_barrier),
 * frees Loom's communicator and calls MPI_Finalize if loom_dist_init initialized MPI. Rank queries
 * return their not-initialized values afterwards. MPI cannot be initialized twice in one process,
 * so after finalizing the mpi backend loom_dist_init fails with UNSUPPORTED (the self backend may
 * be initialized again). Returns LOOM_OK when not initialized. Errors: COMM_ERROR (the communicator
 * failed earlier: MPI is left unfinalized, so exit with a non-zero status), INVALID_ARGUMENT
 * (collectives are still pending: wait for them first; nothing is finalized). */
LOOM_API loom_status loom_dist_finalize(void);

/* ---- collectives as graph ops ------------------------------------------------------------
 *
 * Recorded like any op (nothing runs until loom_mark_step) and executed inside the step, in
 * graph order, through the world communicator (the self backend when loom_dist_init was
 * never called: world size 1). Every rank must record the same collectives in the same order
 * with the same shapes and dtypes; the graph (and its hash) holds no rank, so every rank
 * compiles the same step. Before a step's first collective the ranks check that they agree
 * (one small all-reduce of a digest of the step's collectives): when they differ, the step
 * fails on every rank with COMM_ERROR naming the first collective and its source line. A rank
 * whose step records no collective at all does not take part, and the others fail at the
 * timeout. The results are step-scoped tensors, as every op's. Collectives are
 * never merged by CSE nor dropped by DCE. A compiled step runs them on the host between
 * its kernels (an all-reduce is started as soon as its operand is computed and waited on
 * before its first reader, so it overlaps the kernels in between). Errors from the communicator
 * (COMM_ERROR: timeout, a dead peer) surface at the step's sync point (loom_mark_step /
 * loom_tensor_read) as the context's error, naming the op and its source line. Op builder errors
 * (recorded, NULL returned) follow loom.h's rules: a NULL operand gives NULL without a new error.
 */

/* scale * op(x of every rank), of x's dtype and shape. Dtypes: any float, i32, i64 (sum,
 * max, min) and bool (max: any, min: all). 16-bit floats are reduced in f32 and rounded once.
 * scale must be finite, and 1 for integer and bool dtypes. Backward (loom_backward): the
 * gradient of a sum is the all_reduce (sum, same scale) of the incoming gradient; max and min
 * have no gradient rule (backward through them fails with UNSUPPORTED naming the op).
 * Errors: INVALID_ARGUMENT (bad op, scale or dtype), STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_tensor *loom_all_reduce_at(loom_context *ctx, loom_tensor *x, loom_reduce_op op,
                                         double scale, const char *file, int line);
#define loom_all_reduce(...) loom_all_reduce_at(__VA_ARGS__, __FILE__, __LINE__)

/* Rank root's x on every rank (any dtype and shape). root must be in [0, world size).
 * No gradient rule. Errors: INVALID_ARGUMENT (root out of range), STALE_HANDLE,
 * OUT_OF_MEMORY. */
LOOM_API loom_tensor *loom_broadcast_from_at(loom_context *ctx, loom_tensor *x, int32_t root,
                                             const char *file, int line);
#define loom_broadcast_from(...) loom_broadcast_from_at(__VA_ARGS__, __FILE__, __LINE__)

/* The ranks' x concatenated along axis 0 in rank order: [world * n, ...] for x of shape
 * [n, ...] (rank >= 1, any dtype). The world size (loom_dist_world_size() when recorded) is
 * part of the graph, as shapes are static. No gradient rule. Errors: INVALID_ARGUMENT
 * (scalar x), STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_tensor *loom_all_gather_at(loom_context *ctx, loom_tensor *x, const char *file,
                                         int line);
#define loom_all_gather(...) loom_all_gather_at(__VA_ARGS__, __FILE__, __LINE__)

/* DDP's gradient averaging: each non-NULL grads[i] (a float tensor, normally from
 * loom_backward) is replaced by loom_all_reduce(ctx, grads[i], LOOM_REDUCE_SUM,
 * 1.0 / world size), one op per gradient in array order (the same order on every rank).
 * A compiled step reduces them in buckets, as DDP does: all-reduces of one dtype and scale
 * share a flat buffer of at least LOOM_ALLREDUCE_BUCKET_MB (default 25; 0: one per
 * gradient; "inf": one per dtype; loom_context_options.allreduce_bucket_mb), filled in the
 * order backward computes the gradients, each bucket started as soon as its last gradient
 * exists and waited on before its first reader, so the communication overlaps the rest of
 * backward. The plan dump (LOOM_DUMP) lists each bucket. With a world size of 1 nothing is
 * recorded and grads is left as it is (the step holds no collective) after the checks. NULL
 * entries stay NULL. grads may be NULL when n is 0. On failure no entry is replaced. Errors
 * (recorded and returned): INVALID_ARGUMENT (n < 0, NULL grads, a gradient that is not
 * floating point), STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_status loom_allreduce_gradients_at(loom_context *ctx, int32_t n, loom_tensor **grads,
                                                 const char *file, int line);
#define loom_allreduce_gradients(...) loom_allreduce_gradients_at(__VA_ARGS__, __FILE__, __LINE__)

/* DDP's start-up broadcast: every non-NULL tensors[i] (long-lived: parameters, optimizer or
 * scaler state after a load) is assigned rank 0's value (loom_broadcast_from(..., 0) then
 * loom_assign, in array order), so every rank begins from identical state. It happens at the
 * next loom_mark_step. With a world size of 1 nothing is recorded (the step stays compiled)
 * and LOOM_OK is returned after the checks. NULL entries are skipped. Every entry is checked
 * before anything is recorded. Errors (recorded and returned): INVALID_ARGUMENT (n < 0, NULL
 * tensors, an entry that is not long-lived), STALE_HANDLE, OUT_OF_MEMORY (the only error that
 * can leave earlier entries assigned). */
LOOM_API loom_status loom_broadcast_parameters_at(loom_context *ctx, int32_t n,
                                                  loom_tensor *const *tensors, const char *file,
                                                  int line);
#define loom_broadcast_parameters(...) loom_broadcast_parameters_at(__VA_ARGS__, __FILE__, __LINE__)

/* The message of the most recent failed loom_dist_* call ("" if none yet), naming the
 * operation and the rank, e.g. "barrier #3 on rank 1 of 2 did not complete within 300 s
 * (LOOM_DIST_TIMEOUT_S): ...". Borrowed, valid until the next loom_dist_* call. */
LOOM_API const char *loom_dist_error_message(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_DIST_H */
