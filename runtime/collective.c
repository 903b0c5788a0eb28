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
        return loom_ir_diag_set(d, st, "%s:%d: %s%s%%%d = %s of %s: %s", n->loc.file,
                                (int)n->loc.line, n->loc.scope ? n->loc.scope : "",
                                n->loc.scope ? ": " : "", (int)i, loom_ir_op_name(n->op), t, msg);
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

uint64_t loom_rt_step_digest(uint64_t coll_digest, const loom_ir_graph *step) {
    uint64_t pair[2] = {coll_digest, step ? loom_ir_graph_hash(step) : 0};
    return loom_rt_hash64(pair, sizeof pair);
}

/* Whether every rank holds the same v: one all-reduce (max) of its halves and their
 * negations, which agree when max == min. */
static loom_status all_same(loom_rt_comm *c, uint64_t v, bool *out_same, loom_ir_diag *sub) {
    int64_t hi = (int64_t)(v >> 32), lo = (int64_t)(v & 0xffffffffu);
    int64_t w[4] = {hi, -hi, lo, -lo};
    loom_status st = loom_rt_comm_allreduce(c, w, 4, LOOM_DTYPE_I64, LOOM_REDUCE_MAX, 1.0, sub);
    *out_same = w[0] == -w[1] && w[2] == -w[3];
    return st;
}

/* What each rank says of the first node where the ranks' step graphs part. */
#define RANK_NOTE_BYTES 192
typedef union {
    char text[RANK_NOTE_BYTES];
    int64_t words[RANK_NOTE_BYTES / 8]; /* gathered as i64, which every transport moves */
} rank_note;

/* The ranks' step graphs differ: finds the first node where they do, with every rank taking
 * part in the same rounds (a binary search over prefix hashes, about log2(nodes) tiny
 * all-reduces), gathers each rank's text of that node and writes into msg what this rank and
 * the others have there. */
static loom_status name_first_difference(loom_rt_comm *c, const loom_ir_graph *step, char *msg,
                                         size_t size, loom_ir_diag *sub) {
    int64_t n = step ? step->n_nodes : 0, w[2] = {n, -n};
    loom_status st = loom_rt_comm_allreduce(c, w, 2, LOOM_DTYPE_I64, LOOM_REDUCE_MAX, 1.0, sub);
    if (st != LOOM_OK)
        return st;
    int64_t most = w[0];
    uint64_t *prefix = n > 0 ? loom_ir_alloc(&step->alloc, (size_t)n * sizeof *prefix) : NULL;
    if (prefix)
        loom_ir_graph_prefix_hashes(step, prefix);
    int64_t lo = 0, hi = most; /* the first index whose prefix differs lies in [lo, hi] */
    while (lo < hi && st == LOOM_OK) {
        int64_t mid = lo + (hi - lo) / 2;
        /* past a graph's end (or without memory for its hashes) a rank holds no node there */
        uint64_t v = mid < n && prefix ? prefix[mid] : 0x9e3779b97f4a7c15ull ^ (uint64_t)mid;
        bool same = false;
        st = all_same(c, v, &same, sub);
        if (same)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (prefix)
        loom_ir_free(&step->alloc, prefix, (size_t)n * sizeof *prefix);
    if (st != LOOM_OK)
        return st;
    rank_note mine;
    memset(&mine, 0, sizeof mine);
    if (lo < n) { /* "`%1 = transpose %0 {perm = [1, 0]} : f32[784,32]` at models.h:89" */
        loom_ir_node x = step->nodes[lo];
        char node[RANK_NOTE_BYTES - 80], loc[LOOM_IR_LOC_STR_MAX];
        loom_ir_format_loc(loc, sizeof loc, x.loc);
        x.loc.file = NULL;
        loom_ir_format_node(node, sizeof node, &x, (int32_t)lo);
        snprintf(mine.text, sizeof mine.text, "`%s`%s%.40s (%lld nodes)", node, *loc ? " at " : "",
                 loc, (long long)n);
    } else if (lo < most) {
        snprintf(mine.text, sizeof mine.text, "no node %%%lld: its graph ends at %lld nodes",
                 (long long)lo, (long long)n);
    } else {
        snprintf(mine.text, sizeof mine.text, "the same %lld nodes, other outputs or collectives",
                 (long long)n);
    }
    rank_note *all = loom_ir_alloc(&step->alloc, (size_t)c->size * sizeof *all);
    if (!all)
        return loom_ir_diag_set(sub, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    st = loom_rt_comm_allgather(c, mine.words, all, RANK_NOTE_BYTES / 8, LOOM_DTYPE_I64, sub);
    if (st == LOOM_OK) {
        /* this rank, then rank 0, then the first rank that has something else there */
        int32_t other = -1;
        for (int32_t r = 0; r < c->size && other < 0; r++)
            if (r != c->rank && strncmp(all[r].text, mine.text, sizeof mine.text) != 0)
                other = r;
        all[c->rank].text[RANK_NOTE_BYTES - 1] = '\0';
        int len = snprintf(msg, size, "first at node %%%lld; rank %d: %s", (long long)lo,
                           (int)c->rank, all[c->rank].text);
        for (int32_t k = 0; k < 2 && len >= 0 && (size_t)len < size; k++) {
            int32_t r = k == 0 ? (c->rank != 0 ? 0 : -1) : (other != 0 ? other : -1);
            if (r < 0)
                continue;
            all[r].text[RANK_NOTE_BYTES - 1] = '\0';
            len += snprintf(msg + len, size - (size_t)len, "; rank %d: %s", (int)r, all[r].text);
        }
    }
    loom_ir_free(&step->alloc, all, (size_t)c->size * sizeof *all);
    return st;
}

loom_status loom_rt_collectives_agree(const loom_ir_graph *g, int32_t first, int32_t n,
                                      uint64_t digest, const loom_ir_graph *step,
                                      loom_ir_diag *d) {
    loom_rt_comm *c = loom_rt_comm_world();
    if (!c || c->size <= 1 || n == 0)
        return LOOM_OK;
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    bool same = false;
    loom_status st = all_same(c, digest, &same, &sub);
    if (st == LOOM_OK && !same) {
        char where[3 * RANK_NOTE_BYTES + 128];
        st = name_first_difference(c, step, where, sizeof where, &sub);
        if (st == LOOM_OK) /* not one collective's fault: no collective named */
            return loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR,
                                    "rank %d of %d: the ranks are not running the same step "
                                    "(the same model, batch size, amp mode and settings on "
                                    "each): their graphs differ %s",
                                    (int)c->rank, (int)c->size, where);
    }
    if (st == LOOM_OK)
        return LOOM_OK;
    char msg[sizeof sub.msg + 64];
    snprintf(msg, sizeof msg, "checking that the ranks agree: %s", sub.msg);
    return loom_rt_collective_error(g, first, st, msg, d);
}
