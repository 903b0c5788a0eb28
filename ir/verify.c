/* The IR verifier: re-derives every node's type and checks the graph's invariants. */
#include <stdarg.h>
#include <string.h>

#include "ir.h"

__attribute__((format(printf, 3, 4)))
static loom_status fail(loom_ir_diag *d, int32_t node, const char *fmt, ...) {
    if (d && d->code == LOOM_OK)
        d->node = node;
    va_list ap;
    va_start(ap, fmt);
    loom_ir_diag_vset(d, LOOM_STATUS_VERIFY_FAILED, fmt, ap);
    va_end(ap);
    return LOOM_STATUS_VERIFY_FAILED;
}

loom_status loom_ir_graph_verify(const loom_ir_graph *g, loom_ir_diag *d) {
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    uint8_t seen_small[256];
    uint8_t *seen = seen_small;
    /* Each input index 0..n-1 needs its own node: a larger claimed count is wrong, and
     * must be rejected before it sizes the table below. */
    if (g->n_graph_inputs > g->n_nodes && (size_t)g->n_graph_inputs > sizeof seen_small)
        return fail(d, -1, "graph claims %d inputs but has only %d nodes", (int)g->n_graph_inputs,
                    (int)g->n_nodes);
    size_t seen_bytes = (size_t)g->n_graph_inputs;
    if (seen_bytes > sizeof seen_small) {
        seen = loom_ir_alloc(&g->alloc, seen_bytes);
        if (!seen)
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory verifying");
    }
    memset(seen, 0, seen_bytes);
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if ((unsigned)n->op >= LOOM_IR_OP_COUNT_) {
            st = fail(d, i, "%%%d: unknown op %d", (int)i, (int)n->op);
            break;
        }
        for (int32_t k = 0; k < n->n_inputs; k++) {
            if (n->inputs[k] < 0 || n->inputs[k] >= i) {
                st = fail(d, i, "%%%d: %s operand %d is not an earlier node", (int)i,
                          loom_ir_op_name(n->op), (int)k);
                break;
            }
        }
        if (st != LOOM_OK)
            break;
        loom_ir_node_desc desc = {.op = n->op, .n_inputs = n->n_inputs, .inputs = n->inputs,
                                  .dtype = n->dtype, .rank = n->rank, .shape = n->shape,
                                  .attrs = n->attrs, .loc = n->loc};
        loom_ir_diag sub;
        loom_ir_diag_init(&sub);
        loom_dtype dt;
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        if (loom_ir_infer(g, &desc, &dt, &rank, shape, &sub) != LOOM_OK) {
            st = fail(d, i, "%%%d: %s: %s", (int)i, loom_ir_op_name(n->op), sub.msg);
            break;
        }
        bool same = dt == n->dtype && rank == n->rank;
        for (int32_t k = 0; same && k < rank; k++)
            same = shape[k] == n->shape[k];
        if (!same) {
            loom_ir_format_type(ta, sizeof ta, n->dtype, n->rank, n->shape);
            loom_ir_format_type(tb, sizeof tb, dt, rank, shape);
            st = fail(d, i, "%%%d: declared type %s, but the operands give %s", (int)i, ta, tb);
            break;
        }
        if (n->op == LOOM_IR_OP_INPUT) {
            int64_t idx = n->attrs.index;
            if (idx >= g->n_graph_inputs || seen[idx]) {
                st = fail(d, i, "%%%d: input index %lld is %s", (int)i, (long long)idx,
                          idx >= g->n_graph_inputs ? "out of range" : "used twice");
                break;
            }
            seen[idx] = 1;
        }
    }
    for (int32_t k = 0; st == LOOM_OK && k < g->n_graph_inputs; k++)
        if (!seen[k])
            st = fail(d, -1, "graph input %d has no input node", (int)k);
    for (int32_t o = 0; st == LOOM_OK && o < g->n_outputs; o++) {
        const loom_ir_output *out = &g->outputs[o];
        if (out->node < 0 || out->node >= g->n_nodes) {
            st = fail(d, -1, "output %d names %%%d, which does not exist", (int)o, (int)out->node);
            break;
        }
        if (out->alias < -1 || out->alias >= g->n_graph_inputs) {
            st = fail(d, out->node, "%%%d: output %d aliases input %d, which does not exist",
                      (int)out->node, (int)o, (int)out->alias);
            break;
        }
        if (out->alias >= 0) {
            const loom_ir_node *src = NULL;
            for (int32_t i = 0; i < g->n_nodes; i++)
                if (g->nodes[i].op == LOOM_IR_OP_INPUT && g->nodes[i].attrs.index == out->alias)
                    src = &g->nodes[i];
            const loom_ir_node *res = &g->nodes[out->node];
            bool same = src && src->dtype == res->dtype && src->rank == res->rank;
            for (int32_t k = 0; same && k < res->rank; k++)
                same = src->shape[k] == res->shape[k];
            if (!same) {
                loom_ir_format_type(ta, sizeof ta, res->dtype, res->rank, res->shape);
                st = fail(d, out->node, "%%%d: output of type %s cannot be written into %s",
                          (int)out->node, ta, src ? loom_ir_format_type(tb, sizeof tb, src->dtype, src->rank,
                                                        src->shape)
                                  : "a missing input");
                break;
            }
            for (int32_t p = 0; p < o; p++)
                if (g->outputs[p].alias == out->alias) {
                    st = fail(d, out->node, "%%%d: two outputs alias input %d", (int)out->node,
                              (int)out->alias);
                    break;
                }
        }
    }
    if (seen != seen_small)
        loom_ir_free(&g->alloc, seen, seen_bytes);
    return st;
}
