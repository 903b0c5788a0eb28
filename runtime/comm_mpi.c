/* The MPI communicator backend (MPICH or Open MPI): non-blocking collectives on a duplicate
 * of MPI_COMM_WORLD with MPI_ERRORS_RETURN, polled by comm.c's deadline wait. The only file
 * that includes mpi.h. */
#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "comm.h"

_Static_assert(sizeof(MPI_Request) <= sizeof((loom_rt_comm_request *)0)->impl,
               "an MPI_Request fits in a request's backend handle");

typedef struct mpi_state {
    MPI_Comm comm;
    bool initialized_mpi; /* loom_dist_init called MPI_Init_thread: finalize calls MPI_Finalize */
} mpi_state;

/* Whether Loom called MPI_Init_thread (then the last destroy calls MPI_Finalize). Kept
 * across a failed creation so that a retry reuses the initialized MPI. */
static bool initialized_by_loom;

static MPI_Request *request_of(loom_rt_comm_request *r) {
    return (MPI_Request *)(void *)r->impl;
}

/* "MPI_Iallreduce: <MPI's message>" into d. */
static loom_status mpi_error(int rc, const char *call, loom_ir_diag *d) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR, "%s: %s", call, text);
}

/* The MPI type moving dt's elements: 16-bit floats travel as 16-bit words (they are never
 * reduced here: comm.c stages them in f32), bool as bytes (max = any, min = all). */
static MPI_Datatype mpi_type(loom_dtype dt) {
    switch (dt) {
    case LOOM_DTYPE_F32: return MPI_FLOAT;
    case LOOM_DTYPE_F64: return MPI_DOUBLE;
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16: return MPI_UINT16_T;
    case LOOM_DTYPE_I32: return MPI_INT32_T;
    case LOOM_DTYPE_I64: return MPI_INT64_T;
    case LOOM_DTYPE_BOOL: return MPI_UINT8_T;
    case LOOM_DTYPE_COUNT_: break;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(loom_reduce_op op) {
    switch (op) {
    case LOOM_REDUCE_SUM: return MPI_SUM;
    case LOOM_REDUCE_MAX: return MPI_MAX;
    case LOOM_REDUCE_MIN: return MPI_MIN;
    case LOOM_REDUCE_COUNT_: break;
    }
    return MPI_OP_NULL;
}

static MPI_Comm comm_of(loom_rt_comm *c) {
    return ((mpi_state *)c->impl)->comm;
}

static loom_status mpi_post_barrier(loom_rt_comm *c, loom_rt_comm_request *req, loom_ir_diag *d) {
    int rc = MPI_Ibarrier(comm_of(c), request_of(req));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_error(rc, "MPI_Ibarrier", d);
}

static loom_status mpi_post_allreduce(loom_rt_comm *c, void *buf, loom_rt_comm_request *req,
                                      loom_ir_diag *d) {
    /* bf16/f16 arrive staged as f32. */
    loom_dtype dt = req->staging ? LOOM_DTYPE_F32 : req->dtype;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)req->count, mpi_type(dt), mpi_op(req->op),
                            comm_of(c), request_of(req));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_error(rc, "MPI_Iallreduce", d);
}

static loom_status mpi_post_broadcast(loom_rt_comm *c, void *buf, int32_t root,
                                      loom_rt_comm_request *req, loom_ir_diag *d) {
    int rc =
        MPI_Ibcast(buf, (int)req->count, mpi_type(req->dtype), root, comm_of(c), request_of(req));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_error(rc, "MPI_Ibcast", d);
}

static loom_status mpi_post_allgather(loom_rt_comm *c, const void *send, void *recv,
                                      loom_rt_comm_request *req, loom_ir_diag *d) {
    MPI_Datatype t = mpi_type(req->dtype);
    int n = (int)req->count;
    int rc = MPI_Iallgather(send ? send : MPI_IN_PLACE, send ? n : 0, send ? t : MPI_DATATYPE_NULL,
                            recv, n, t, comm_of(c), request_of(req));
    return rc == MPI_SUCCESS ? LOOM_OK : mpi_error(rc, "MPI_Iallgather", d);
}

static loom_status mpi_test(loom_rt_comm *c, loom_rt_comm_request *req, bool *out_done,
                            loom_ir_diag *d) {
    int flag = 0;
    int rc = MPI_Test(request_of(req), &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Test", d);
    *out_done = flag != 0;
    return LOOM_OK;
}

static loom_status mpi_destroy(loom_rt_comm *c, bool failed, loom_ir_diag *d) {
    mpi_state *s = c->impl;
    loom_status st = LOOM_OK;
    /* After a failure a peer may be gone: MPI_Comm_free and MPI_Finalize could wait for it
     * forever. Leave MPI as it is; the caller exits non-zero and mpiexec cleans up. */
    if (!failed) {
        int rc = MPI_Comm_free(&s->comm);
        if (rc != MPI_SUCCESS)
            st = mpi_error(rc, "MPI_Comm_free", d);
        if (s->initialized_mpi && st == LOOM_OK) {
            rc = MPI_Finalize();
            if (rc != MPI_SUCCESS)
                st = mpi_error(rc, "MPI_Finalize", d);
        }
    }
    loom_ir_free(&c->alloc, s, sizeof *s);
    return st;
}

static const loom_rt_comm_vtable mpi_vtable = {
    .name = "mpi",
    .post_barrier = mpi_post_barrier,
    .post_allreduce = mpi_post_allreduce,
    .post_broadcast = mpi_post_broadcast,
    .post_allgather = mpi_post_allgather,
    .test = mpi_test,
    .destroy = mpi_destroy,
};

bool loom_rt_comm_mpi_available(void) {
    return true;
}

static const char *thread_level_name(int level) {
    if (level == MPI_THREAD_SINGLE)
        return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED)
        return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED)
        return "MPI_THREAD_SERIALIZED";
    return "MPI_THREAD_MULTIPLE";
}

/* Rank, size, local rank and local size of s->comm into c. */
static loom_status query_ranks(loom_rt_comm *c, mpi_state *s, loom_ir_diag *d) {
    int rank = 0, size = 1, local_rank = 0, local_size = 1, rc;
    if ((rc = MPI_Comm_rank(s->comm, &rank)) != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_rank", d);
    if ((rc = MPI_Comm_size(s->comm, &size)) != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_size", d);
    /* The local rank: this process's rank among those sharing its memory (its machine). */
    MPI_Comm local;
    rc = MPI_Comm_split_type(s->comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_split_type", d);
    if ((rc = MPI_Comm_rank(local, &local_rank)) == MPI_SUCCESS)
        rc = MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
    if (rc != MPI_SUCCESS)
        return mpi_error(rc, "MPI_Comm_rank (local)", d);
    c->rank = rank;
    c->size = size;
    c->local_rank = local_rank;
    c->local_size = local_size;
    return LOOM_OK;
}

loom_status loom_rt_comm_mpi_create(const loom_allocator *a, int64_t timeout_ns, loom_rt_comm **out,
                                    loom_ir_diag *d) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
        return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                "dist: MPI was finalized already in this process and cannot be "
                                "initialized again");
    int provided = MPI_THREAD_SINGLE, rc;
    /* SERIALIZED: collectives run on the host thread and on the device's stream thread, never
     * at once (comm.c holds a lock around every MPI call). MULTIPLE would cost MPICH a lock
     * of its own on every call for nothing. */
    if (!initialized) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, "dist: MPI_Init_thread", d);
        initialized_by_loom = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                "dist: MPI provides %s, Loom needs MPI_THREAD_SERIALIZED "
                                "(collectives also run on the device's stream thread)",
                                thread_level_name(provided));
    loom_rt_comm *c = loom_ir_alloc(a, sizeof *c);
    mpi_state *s = loom_ir_alloc(a, sizeof *s);
    loom_status st = LOOM_OK;
    if (!c || !s || loom_rt_comm_init_base(c, &mpi_vtable, a, timeout_ns) != LOOM_OK) {
        loom_ir_free(a, s, sizeof *s);
        loom_ir_free(a, c, sizeof *c);
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "dist: out of memory");
    } else {
        s->comm = MPI_COMM_NULL;
        s->initialized_mpi = initialized_by_loom;
        c->impl = s;
        /* Our own communicator: our collectives never match a program's own MPI calls, and
         * its errors come back as codes instead of aborting. */
        rc = MPI_Comm_dup(MPI_COMM_WORLD, &s->comm);
        if (rc != MPI_SUCCESS)
            st = mpi_error(rc, "dist: MPI_Comm_dup", d);
        if (st == LOOM_OK && (rc = MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN)))
            st = mpi_error(rc, "dist: MPI_Comm_set_errhandler", d);
        if (st == LOOM_OK)
            st = query_ranks(c, s, d);
        if (st != LOOM_OK) {
            if (s->comm != MPI_COMM_NULL)
                MPI_Comm_free(&s->comm);
            loom_ir_free(a, s, sizeof *s);
            pthread_mutex_destroy(&c->mu);
            loom_ir_free(a, c, sizeof *c);
        }
    }
    if (st != LOOM_OK)
        return st; /* MPI stays initialized: a retry reuses it, the last destroy finalizes */
    *out = c;
    return LOOM_OK;
}
