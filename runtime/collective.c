/* The host side of the collective IR ops: see collective.h. */
#include <stdio.h>
#include <string.h>

#include "collective.h"
#include "disk_cache.h"

loom_status loom_rt_collective_error(const loom_ir_graph *g, int32_t i, loom_status st,
                                     const char *msg, loom_ir_diag *d) {
    const loom_ir_node *n = &g->nodes[i], *x = &g->nodes[n->inputs[0]];
    char t[LOOM_IR_TYPE_STR_MAX];
    loom_ir_format_type(t, sizeof t, x->dtype, x->rank, x->shape);
    if (n->loc.file)
        return loom_ir_diag_set(d, st, "%s:%d: %%%d = %s of %s: %s", n->loc.file, (int)n->loc.line,
                                (int)i, loom_ir_op_name(n->op), t, msg);
    return loom_ir_diag_set(d, st, "%%%d = %s of %s: %s", (int)i, loom_ir_op_name(n->op), t, msg);
}

/* The all-reduce's start without the error's decoration. */
static loom_status allreduce_start(const loom_ir_node *n, void *buf, size_t count, double scale,
                                   loom_rt_comm_request **out_req, loom_ir_diag *sub) {
    *out_req = NULL;
    loom_rt_comm *c = loom_rt_comm_world();
    if (c)
        return loom_rt_comm_allreduce_start(c, buf, count, n->dtype, (loom_reduce_op)n->attrs.index,
                                            scale, out_req, sub);
    if (scale != 1.0) /* one rank: the reduction is the value itself */
        for (size_t k = 0; k < count; k++)
            loom_ir_store_f64(buf, n->dtype, (int64_t)k,
                              scale * loom_ir_load_f64(buf, n->dtype, (int64_t)k));
    return LOOM_OK;
}

loom_status loom_rt_collective_allreduce_start(const loom_ir_graph *g, int32_t i, void *buf,
                                               size_t count, bool prescaled,
                                               loom_rt_comm_request **out_req, loom_ir_diag *d) {
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    const loom_ir_node *n = &g->nodes[i];
    loom_status st =
        allreduce_start(n, buf, count, prescaled ? 1.0 : n->attrs.value, out_req, &sub);
    return st == LOOM_OK ? LOOM_OK : loom_rt_collective_error(g, i, st, sub.msg, d);
}

/* The value is copied into dst first, as the communicator works in place. */
loom_status loom_rt_collective_run(const loom_ir_graph *g, int32_t i, const void *src, void *dst,
                                   loom_ir_diag *d) {
    const loom_ir_node *n = &g->nodes[i];
    const loom_ir_node *x = &g->nodes[n->inputs[0]];
    size_t count = (size_t)loom_ir_numel(x->rank, x->shape);
    size_t bytes = loom_ir_node_bytes(x);
    loom_rt_comm *c = loom_rt_comm_world();
    int32_t world = c ? c->size : 1, rank = c ? c->rank : 0;
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    loom_status st = LOOM_OK;
    if (n->op == LOOM_IR_OP_ALL_REDUCE) {
        if (bytes && dst != src)
            memcpy(dst, src, bytes);
        loom_rt_comm_request *req = NULL;
        st = allreduce_start(n, dst, count, n->attrs.value, &req, &sub);
        if (st == LOOM_OK && req)
            st = loom_rt_comm_wait(req, &sub);
    } else if (n->op == LOOM_IR_OP_BROADCAST_FROM) {
        if (n->attrs.index >= world) {
            st = loom_ir_diag_set(&sub, LOOM_STATUS_INVALID_ARGUMENT,
                                  "root %lld is not a rank of a world of %d",
                                  (long long)n->attrs.index, (int)world);
        } else {
            if (bytes && dst != src)
                memcpy(dst, src, bytes);
            if (c)
                st = loom_rt_comm_broadcast(c, dst, count, n->dtype, (int32_t)n->attrs.index, &sub);
        }
    } else { /* all_gather */
        if (n->attrs.index != world)
            st = loom_ir_diag_set(&sub, LOOM_STATUS_INVALID_ARGUMENT,
                                  "the graph gathers from %lld ranks, but the world has %d",
                                  (long long)n->attrs.index, (int)world);
        else if (c)
            st = loom_rt_comm_allgather(c, src, dst, count, n->dtype, &sub);
        else if (bytes)
            memcpy((char *)dst + (size_t)rank * bytes, src, bytes);
    }
    return st == LOOM_OK ? LOOM_OK : loom_rt_collective_error(g, i, st, sub.msg, d);
}

uint64_t loom_rt_collective_digest(uint64_t h, const loom_ir_node *n, size_t count) {
    struct {
        uint64_t prev, count;
        int64_t op, dtype, index;
        double value;
    } rec;
    memset(&rec, 0, sizeof rec);
    rec.prev = h;
    rec.count = count;
    rec.op = n->op;
    rec.dtype = n->dtype;
    rec.index = n->attrs.index;
    rec.value = n->attrs.value;
    return loom_rt_hash64(&rec, sizeof rec);
}

loom_status loom_rt_collectives_agree(const loom_ir_graph *g, int32_t first, int32_t n,
                                      uint64_t digest, loom_ir_diag *d) {
    loom_rt_comm *c = loom_rt_comm_world();
    if (!c || c->size <= 1 || n == 0)
        return LOOM_OK;
    int64_t hi = (int64_t)(digest >> 33), lo = (int64_t)(digest & 0x7fffffffu);
    int64_t v[4] = {hi, -hi, lo, -lo};
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    loom_status st = loom_rt_comm_allreduce(c, v, 4, LOOM_DTYPE_I64, LOOM_REDUCE_MAX, 1.0, &sub);
    if (st == LOOM_OK && (v[0] != -v[1] || v[2] != -v[3]))
        st = loom_ir_diag_set(&sub, LOOM_STATUS_COMM_ERROR,
                              "rank %d of %d: this step's %d collective(s) differ from another "
                              "rank's; every rank must record the same collectives, in the same "
                              "order, with the same types and attributes",
                              (int)c->rank, (int)c->size, (int)n);
    if (st == LOOM_OK)
        return LOOM_OK;
    char msg[sizeof sub.msg + 64];
    snprintf(msg, sizeof msg, "checking that the ranks agree: %s", sub.msg);
    return loom_rt_collective_error(g, first, st, msg, d);
}
