/* The public distributed API (loom/dist.h): the process's world communicator, its rank
 * queries, and the message of the last failed call. */
#include <stdio.h>
#include <string.h>

#include "frontend.h"
#include "loom/dist.h"
#include "runtime/comm.h"

/* The last failure's message. init/finalize are single-threaded by contract; a barrier
 * racing another call's failure can at worst mix two messages. */
static char last_error[sizeof(((loom_ir_diag *)0)->msg)];

static loom_status remember(loom_status st, const loom_ir_diag *d) {
    if (st != LOOM_OK)
        snprintf(last_error, sizeof last_error, "%s", d->msg[0] ? d->msg : loom_status_name(st));
    return st;
}

LOOM_API void loom_dist_options_init(loom_dist_options *o) {
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->backend = LOOM_DIST_BACKEND_DEFAULT;
    o->allocator = loom_allocator_system();
}

LOOM_API loom_status loom_dist_init(const loom_dist_options *o) {
    if (loom_rt_comm_world())
        return LOOM_OK;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_rt_comm *c = NULL;
    loom_status st = loom_rt_comm_create(o, &c, &d);
    if (st == LOOM_OK)
        loom_rt_comm_set_world(c);
    return remember(st, &d);
}

LOOM_API bool loom_dist_is_initialized(void) {
    return loom_rt_comm_world() != NULL;
}

LOOM_API int32_t loom_dist_rank(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    return c ? c->rank : 0;
}

LOOM_API int32_t loom_dist_world_size(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    return c ? c->size : 1;
}

LOOM_API int32_t loom_dist_local_rank(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    return c ? c->local_rank : 0;
}

LOOM_API int32_t loom_dist_local_size(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    return c ? c->local_size : 1;
}

LOOM_API const char *loom_dist_backend_name(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    return c ? c->vt->name : "none";
}

LOOM_API bool loom_dist_have_mpi(void) {
    return loom_rt_comm_mpi_available();
}

LOOM_API loom_status loom_dist_barrier(void) {
    loom_fe_finish_all_inflight();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    return remember(loom_rt_comm_barrier(loom_rt_comm_world(), &d), &d);
}

LOOM_API loom_status loom_dist_finalize(void) {
    loom_rt_comm *c = loom_rt_comm_world();
    if (!c)
        return LOOM_OK;
    loom_fe_finish_all_inflight();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_rt_comm_destroy(c, &d);
    if (st != LOOM_STATUS_INVALID_ARGUMENT) /* pending requests: nothing was freed */
        loom_rt_comm_set_world(NULL);
    return remember(st, &d);
}

LOOM_API const char *loom_dist_error_message(void) {
    return last_error;
}
