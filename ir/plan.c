/* Execution plans: storage, the verifier that checks the rules written in plan.h, and the
 * human-readable summary that dumps show. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* ---- storage ------------------------------------------------------------------------------ */

/* The per-node arrays share one block: placements (8-byte aligned) first, then node_kernel,
 * then has_placement. Its size follows from n_nodes alone, which is what deinit frees by. */
static size_t node_block_bytes(int32_t n) {
    return (size_t)n * (sizeof(loom_ir_placement) + sizeof(int32_t) + sizeof(bool));
}

static void free_node_block(loom_ir_plan *p) {
    loom_ir_free(&p->alloc, p->placement, node_block_bytes(p->n_nodes));
    p->placement = NULL;
    p->node_kernel = NULL;
    p->has_placement = NULL;
    p->n_nodes = 0;
}

void loom_ir_plan_init(loom_ir_plan *p, const loom_allocator *a) {
    memset(p, 0, sizeof *p);
    p->alloc = *a;
    loom_ir_arena_init(&p->arena, a);
}

void loom_ir_plan_deinit(loom_ir_plan *p) {
    if (!p)
        return;
    free_node_block(p);
    loom_ir_free(&p->alloc, p->kernels, (size_t)p->cap_kernels * sizeof *p->kernels);
    loom_ir_free(&p->alloc, p->copies, (size_t)p->cap_copies * sizeof *p->copies);
    loom_ir_arena_deinit(&p->arena);
    loom_allocator a = p->alloc;
    memset(p, 0, sizeof *p);
    p->alloc = a;
    loom_ir_arena_init(&p->arena, &a);
}

loom_status loom_ir_plan_reset(loom_ir_plan *p, const loom_ir_graph *g) {
    p->n_kernels = 0;
    p->n_copies = 0;
    p->arena_bytes = 0;
    p->peak_bytes = 0;
    loom_ir_arena_reset(&p->arena);
    if (p->n_nodes != g->n_nodes) {
        free_node_block(p);
        if (g->n_nodes > 0) {
            void *block = loom_ir_alloc(&p->alloc, node_block_bytes(g->n_nodes));
            if (!block)
                return LOOM_STATUS_OUT_OF_MEMORY;
            p->placement = block;
            p->node_kernel = (int32_t *)(p->placement + g->n_nodes);
            p->has_placement = (bool *)(p->node_kernel + g->n_nodes);
            p->n_nodes = g->n_nodes;
        }
    }
    for (int32_t i = 0; i < p->n_nodes; i++) {
        p->node_kernel[i] = -1;
        p->has_placement[i] = false;
        p->placement[i] = (loom_ir_placement){.kind = LOOM_IR_BUFFER_ARENA};
    }
    return LOOM_OK;
}

/* ---- verification ------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static loom_status fail(loom_ir_diag *d, int32_t node,
                                                              const char *fmt, ...) {
    if (d && d->code == LOOM_OK)
        d->node = node;
    va_list ap;
    va_start(ap, fmt);
    loom_ir_diag_vset(d, LOOM_STATUS_VERIFY_FAILED, fmt, ap);
    va_end(ap);
    return LOOM_STATUS_VERIFY_FAILED;
}

static bool placement_equal(const loom_ir_placement *a, const loom_ir_placement *b) {
    return a->kind == b->kind && a->index == b->index &&
           (a->kind != LOOM_IR_BUFFER_ARENA || a->offset == b->offset);
}

/* Position of x in the ascending array v, or -1. */
static int32_t sorted_find(const int32_t *v, int32_t n, int32_t x) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && v[lo] == x ? lo : -1;
}

static bool sorted_contains(const int32_t *v, int32_t n, int32_t x) {
    return sorted_find(v, n, x) >= 0;
}

/* Scratch for the verifier: per-node arrays in one block from the plan's allocator. The
 * mark arrays hold the kernel that last marked a node, so they need no clearing per kernel. */
typedef struct vscratch {
    int32_t *produced; /* the kernel that writes the node (a result), or -1 */
    int32_t *seen_in;  /* the kernel whose nodes list it (non-constants), or -1 */
    int32_t *last;     /* the last kernel reading it (through views too); n_kernels when a
                        * copy reads it; -1 when nothing does */
    int32_t *arg_of;   /* kernel marks: listed as an arg */
    int32_t *used_by;  /* kernel marks: an operand of one of the kernel's computed nodes */
    bool *needed;      /* read by a node outside the kernel computing it, or an output */
} vscratch;

/* A collective kernel: collectives only, several only as a bucket of all-reduces that share
 * dtype, reduce op and scale; it completes after itself and at most at the end. */
static loom_status check_collective(const loom_ir_plan *p, const loom_ir_graph *g, int32_t k,
                                    loom_ir_diag *d) {
    const loom_ir_kernel *kn = &p->kernels[k];
    const loom_ir_node *r = &g->nodes[kn->root];
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        const loom_ir_node *nd = &g->nodes[kn->nodes[j]];
        if (!loom_ir_op_traits(nd->op)->ranks)
            return fail(d, kn->nodes[j], "kernel %d (collective): %%%d is a %s, not a collective",
                        (int)k, (int)kn->nodes[j], loom_ir_op_name(nd->op));
        if (kn->n_nodes > 1 &&
            (nd->op != LOOM_IR_OP_ALL_REDUCE || nd->op != r->op || nd->dtype != r->dtype ||
             nd->attrs.index != r->attrs.index || nd->attrs.value != r->attrs.value))
            return fail(d, kn->nodes[j],
                        "kernel %d (collective): %%%d cannot share a bucket with %%%d: a bucket "
                        "holds all_reduces of one dtype, reduce op and scale",
                        (int)k, (int)kn->nodes[j], (int)kn->root);
    }
    if (kn->wait_before <= k || kn->wait_before > p->n_kernels)
        return fail(d, kn->root,
                    "kernel %d (collective): waited on before kernel %d, which is not after it "
                    "and at most %d",
                    (int)k, (int)kn->wait_before, (int)p->n_kernels);
    return LOOM_OK;
}

bool loom_ir_reductions_share_loops(const loom_ir_graph *g, int32_t a, int32_t b) {
    const loom_ir_node *na = &g->nodes[a], *nb = &g->nodes[b];
    const loom_ir_node *xa = &g->nodes[na->inputs[0]], *xb = &g->nodes[nb->inputs[0]];
    return na->attrs.axes == nb->attrs.axes && na->attrs.keepdim == nb->attrs.keepdim &&
           xa->rank == xb->rank &&
           memcmp(xa->shape, xb->shape, (size_t)xa->rank * sizeof xa->shape[0]) == 0;
}

static loom_status check_kernel(const loom_ir_plan *p, const loom_ir_graph *g, int32_t k,
                                vscratch *s, loom_ir_diag *d) {
    const loom_ir_kernel *kn = &p->kernels[k];
    if ((unsigned)kn->kind >= LOOM_IR_KERNEL_COUNT_)
        return fail(d, -1, "kernel %d: unknown kind %d", (int)k, (int)kn->kind);
    if (kn->n_nodes < 1 || !kn->nodes || kn->n_args < 0 || (kn->n_args > 0 && !kn->args) ||
        kn->n_results < 0 || (kn->n_results > 0 && !kn->results))
        return fail(d, -1, "kernel %d: empty or malformed node/arg/result lists", (int)k);
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        int32_t n = kn->nodes[j];
        if (n < 0 || n >= g->n_nodes)
            return fail(d, -1, "kernel %d: node %d does not exist", (int)k, (int)n);
        if (j > 0 && n <= kn->nodes[j - 1])
            return fail(d, n, "kernel %d: nodes are not in graph order at %%%d", (int)k, (int)n);
    }
    const char *kname = loom_ir_kernel_kind_name(kn->kind);
    if (kn->root < 0 || kn->root >= g->n_nodes ||
        !sorted_contains(kn->nodes, kn->n_nodes, kn->root))
        return fail(d, -1, "kernel %d (%s): root %%%d is not one of its nodes", (int)k, kname,
                    (int)kn->root);
    loom_ir_op root_op = g->nodes[kn->root].op;
    loom_ir_kind root_kind = loom_ir_op_table[root_op].kind;
    switch (kn->kind) {
    case LOOM_IR_KERNEL_ELEMENTWISE:
        if (kn->root != kn->nodes[kn->n_nodes - 1])
            return fail(d, kn->root, "kernel %d (elementwise): root %%%d is not its last node",
                        (int)k, (int)kn->root);
        break;
    case LOOM_IR_KERNEL_REDUCTION:
        if (!loom_ir_kind_table[root_kind].reduces)
            return fail(d, kn->root, "kernel %d (reduction): root %%%d is a %s", (int)k,
                        (int)kn->root, loom_ir_op_name(root_op));
        break;
    case LOOM_IR_KERNEL_ROOTED:
        if (!loom_ir_kind_table[root_kind].roots)
            return fail(d, kn->root, "kernel %d (matmul): root %%%d is a %s", (int)k, (int)kn->root,
                        loom_ir_op_name(root_op));
        break;
    case LOOM_IR_KERNEL_COLLECTIVE: {
        loom_status st = check_collective(p, g, k, d);
        if (st != LOOM_OK)
            return st;
        break;
    }
    case LOOM_IR_KERNEL_COUNT_: break;
    }

    /* Args: read from buffers that exist before this kernel runs. */
    for (int32_t j = 0; j < kn->n_args; j++) {
        int32_t a = kn->args[j];
        if (a < 0 || a >= g->n_nodes)
            return fail(d, -1, "kernel %d (%s): arg %d does not exist", (int)k, kname, (int)a);
        if (s->arg_of[a] == k)
            return fail(d, a, "kernel %d (%s): arg %%%d is listed twice", (int)k, kname, (int)a);
        s->arg_of[a] = k;
        if (sorted_contains(kn->nodes, kn->n_nodes, a))
            return fail(d, a, "kernel %d (%s): %%%d is both an arg and a computed node", (int)k,
                        kname, (int)a);
        int32_t b = loom_ir_view_base(g, a);
        if (g->nodes[b].op != LOOM_IR_OP_INPUT && (s->produced[b] < 0 || s->produced[b] >= k))
            return fail(d, a,
                        "kernel %d (%s): arg %%%d is not an input or the result of an "
                        "earlier kernel",
                        (int)k, kname, (int)a);
        if (s->produced[b] >= 0 && p->kernels[s->produced[b]].kind == LOOM_IR_KERNEL_COLLECTIVE &&
            k < p->kernels[s->produced[b]].wait_before)
            return fail(d, a,
                        "kernel %d (%s): arg %%%d is read before collective kernel %d "
                        "completes (before kernel %d)",
                        (int)k, kname, (int)a, (int)s->produced[b],
                        (int)p->kernels[s->produced[b]].wait_before);
        s->last[b] = k;
        s->last[a] = k;
    }

    /* The nodes: what may be computed in this kind of kernel, and who owns each. */
    int32_t n_red = 1; /* reductions of a REDUCTION kernel, its root counted */
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        int32_t n = kn->nodes[j];
        const loom_ir_node *nd = &g->nodes[n];
        loom_ir_kind kind = loom_ir_op_table[nd->op].kind;
        switch (kind) {
        case LOOM_IR_KIND_SOURCE:
            if (nd->op == LOOM_IR_OP_INPUT)
                return fail(d, n,
                            "kernel %d (%s): input %%%d is listed as a computed node; "
                            "inputs are args",
                            (int)k, kname, (int)n);
            if (p->node_kernel[n] != -1)
                return fail(d, n,
                            "constant %%%d has node_kernel %d; constants belong to no "
                            "kernel",
                            (int)n, (int)p->node_kernel[n]);
            continue; /* constants may be recomputed by any number of kernels */
        case LOOM_IR_KIND_RESHAPE:
            return fail(d, n,
                        "kernel %d (%s): reshape %%%d is listed as a computed node; a "
                        "reshape is a view its readers take as an arg",
                        (int)k, kname, (int)n);
        case LOOM_IR_KIND_REDUCTION:
            if (n != kn->root && kn->kind == LOOM_IR_KERNEL_REDUCTION) {
                /* another reduction of the kernel: over the root's operand shape and axes */
                if (++n_red > LOOM_IR_KERNEL_REDUCTIONS_MAX ||
                    !loom_ir_reductions_share_loops(g, kn->root, n))
                    return fail(d, n,
                                "kernel %d (reduction): %s %%%d is not the root and does not "
                                "reduce an operand of the root's shape along its axes (or is "
                                "one reduction more than %d)",
                                (int)k, loom_ir_op_name(nd->op), (int)n,
                                (int)LOOM_IR_KERNEL_REDUCTIONS_MAX);
                break;
            }
            if (n != kn->root)
                return fail(d, n, "kernel %d (%s): %s %%%d is not the kernel's root", (int)k, kname,
                            loom_ir_op_name(nd->op), (int)n);
            break;
        case LOOM_IR_KIND_CONTRACTION:
            if (n != kn->root)
                return fail(d, n, "kernel %d (%s): %s %%%d is not the kernel's root", (int)k, kname,
                            loom_ir_op_name(nd->op), (int)n);
            break;
        case LOOM_IR_KIND_UNARY:
        case LOOM_IR_KIND_PREDICATE:
        case LOOM_IR_KIND_BINARY:
        case LOOM_IR_KIND_COMPARE:
        case LOOM_IR_KIND_SELECT:
        case LOOM_IR_KIND_CAST:
        case LOOM_IR_KIND_BROADCAST:
        case LOOM_IR_KIND_TRANSPOSE:
        case LOOM_IR_KIND_SLICE:
        case LOOM_IR_KIND_PAD:
        case LOOM_IR_KIND_CONCAT:
        case LOOM_IR_KIND_IOTA:
        case LOOM_IR_KIND_GATHER:
        case LOOM_IR_KIND_RAND: break;
        case LOOM_IR_KIND_COLLECTIVE:
            if (kn->kind != LOOM_IR_KERNEL_COLLECTIVE)
                return fail(d, n,
                            "kernel %d (%s): %s %%%d is a collective, which only collective "
                            "kernels run",
                            (int)k, kname, loom_ir_op_name(nd->op), (int)n);
            break;
        case LOOM_IR_KIND_CONV:
        case LOOM_IR_KIND_POOL:
        case LOOM_IR_KIND_SCATTER:
        case LOOM_IR_KIND_ATTENTION:
            if (kn->kind != LOOM_IR_KERNEL_ROOTED || kn->root != n)
                return fail(d, n,
                            "kernel %d (%s): %s %%%d is not the root of a rooted kernel, which "
                            "alone computes convolutions, pools, scatters and attention",
                            (int)k, kname, loom_ir_op_name(nd->op), (int)n);
            break;
        case LOOM_IR_KIND_COUNT_:
            return fail(d, n, "kernel %d: %%%d has an unknown op", (int)k, (int)n);
        }
        if (s->seen_in[n] >= 0)
            return fail(d, n, "%%%d is computed by kernels %d and %d", (int)n, (int)s->seen_in[n],
                        (int)k);
        s->seen_in[n] = k;
        if (p->node_kernel[n] != k)
            return fail(d, n, "%%%d is listed by kernel %d but node_kernel says %d", (int)n, (int)k,
                        (int)p->node_kernel[n]);
        /* every operand is computed here or read from a buffer */
        for (int32_t q = 0; q < nd->n_inputs; q++) {
            int32_t o = nd->inputs[q];
            bool inside = sorted_contains(kn->nodes, kn->n_nodes, o);
            s->used_by[o] = k;
            if (inside && loom_ir_kind_table[kind].roots && !loom_ir_matmul_operand_fuses(g, n, o))
                return fail(d, n,
                            "kernel %d (%s): %s %%%d computes its operand %%%d; the operands "
                            "of a kernel's root are args (but casts and transposes a matmul "
                            "packs: loom_ir_matmul_operand_fuses)",
                            (int)k, kname, loom_ir_op_name(nd->op), (int)n, (int)o);
            if (!inside && s->arg_of[o] != k)
                return fail(d, n,
                            "kernel %d (%s): operand %%%d of %%%d is neither computed "
                            "nor an arg",
                            (int)k, kname, (int)o, (int)n);
        }
    }
    /* Nothing extraneous: every arg is read, every listed constant is used (unless it is
     * the whole kernel: a constant materialized on its own). */
    for (int32_t j = 0; j < kn->n_args; j++)
        if (s->used_by[kn->args[j]] != k)
            return fail(d, kn->args[j], "kernel %d (%s): arg %%%d is read by none of its nodes",
                        (int)k, kname, (int)kn->args[j]);
    for (int32_t j = 0; j < kn->n_nodes && kn->n_nodes > 1; j++) {
        int32_t c = kn->nodes[j];
        if (g->nodes[c].op == LOOM_IR_OP_CONSTANT && s->used_by[c] != k)
            return fail(d, c,
                        "kernel %d (%s): constant %%%d is listed but nothing in the "
                        "kernel uses it",
                        (int)k, kname, (int)c);
    }

    /* Results: exactly the nodes whose values are needed outside the kernel. */
    for (int32_t j = 0; j < kn->n_results; j++) {
        int32_t r = kn->results[j];
        if (r < 0 || r >= g->n_nodes || !sorted_contains(kn->nodes, kn->n_nodes, r))
            return fail(d, r >= 0 && r < g->n_nodes ? r : -1,
                        "kernel %d (%s): result %%%d is not one of its nodes", (int)k, kname,
                        (int)r);
        if (s->produced[r] == k)
            return fail(d, r, "kernel %d (%s): result %%%d is listed twice", (int)k, kname, (int)r);
        if (g->nodes[r].op == LOOM_IR_OP_CONSTANT && kn->n_nodes != 1)
            return fail(d, r,
                        "kernel %d (%s): constant %%%d is a result; constants are "
                        "materialized only by kernels of their own",
                        (int)k, kname, (int)r);
        if (s->produced[r] >= 0)
            return fail(d, r, "%%%d is written by kernels %d and %d", (int)r, (int)s->produced[r],
                        (int)k);
        s->produced[r] = k;
    }
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        int32_t x = kn->nodes[j];
        if (g->nodes[x].op == LOOM_IR_OP_CONSTANT)
            continue;
        bool listed = s->produced[x] == k;
        if (s->needed[x] && !listed)
            return fail(d, x,
                        "kernel %d (%s): %%%d is needed outside the kernel but is not a "
                        "result",
                        (int)k, kname, (int)x);
        if (!s->needed[x] && listed)
            return fail(d, x, "kernel %d (%s): result %%%d is not needed outside the kernel",
                        (int)k, kname, (int)x);
    }
    return LOOM_OK;
}

typedef struct arena_item {
    size_t offset, end;  /* bytes [offset, end) */
    int32_t first, last; /* kernels the value is alive over */
    int32_t node;
} arena_item;

static int cmp_by_first(const void *a, const void *b) {
    const arena_item *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

static int cmp_by_offset(const void *a, const void *b) {
    const arena_item *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

static loom_status check_outputs(const loom_ir_plan *p, const loom_ir_graph *g, vscratch *s,
                                 loom_ir_diag *d) {
    for (int32_t c = 0; c < p->n_copies; c++) {
        const loom_ir_copy *cp = &p->copies[c];
        if (cp->output < 0 || cp->output >= g->n_outputs || cp->node < 0 || cp->node >= g->n_nodes)
            return fail(d, -1, "copy %d: node %d or output %d is out of range", (int)c,
                        (int)cp->node, (int)cp->output);
        if (g->outputs[cp->output].node != cp->node)
            return fail(d, cp->node, "copy %d: output %d is %%%d, not %%%d", (int)c,
                        (int)cp->output, (int)g->outputs[cp->output].node, (int)cp->node);
        for (int32_t e = 0; e < c; e++)
            if (p->copies[e].output == cp->output)
                return fail(d, cp->node, "copies %d and %d both fill output %d", (int)e, (int)c,
                            (int)cp->output);
        s->last[loom_ir_view_base(g, cp->node)] = p->n_kernels; /* read after every kernel */
        s->last[cp->node] = p->n_kernels;
    }
    for (int32_t o = 0; o < g->n_outputs; o++) {
        int32_t x = g->outputs[o].node;
        bool placed = p->has_placement[x] && p->placement[x].kind == LOOM_IR_BUFFER_OUTPUT &&
                      p->placement[x].index == o && g->nodes[x].op != LOOM_IR_OP_RESHAPE;
        bool copied = false;
        for (int32_t c = 0; c < p->n_copies && !copied; c++)
            copied = p->copies[c].output == o;
        if (placed && copied)
            return fail(d, x, "output %d (%%%d) is both placed and copied", (int)o, (int)x);
        if (!placed && !copied)
            return fail(d, x, "output %d (%%%d) is neither placed in its buffer nor copied", (int)o,
                        (int)x);
        if (placed && g->outputs[o].alias >= 0 && !loom_ir_plan_can_update_in_place(p, g, o))
            return fail(d, x,
                        "output %d (%%%d) is written into donated input %d while kernels "
                        "run; it must be copied after them",
                        (int)o, (int)x, (int)g->outputs[o].alias);
        if (copied && !p->has_placement[x])
            return fail(d, x, "output %d (%%%d) is copied from a value that has no placement",
                        (int)o, (int)x);
    }
    /* Copies run in order: none may overwrite a donated input that a later copy reads. */
    for (int32_t c = 0; c < p->n_copies; c++) {
        int32_t alias = g->outputs[p->copies[c].output].alias;
        if (alias < 0)
            continue;
        for (int32_t e = c + 1; e < p->n_copies; e++) {
            const loom_ir_node *src = &g->nodes[loom_ir_view_base(g, p->copies[e].node)];
            if (src->op == LOOM_IR_OP_INPUT && src->attrs.index == alias &&
                g->outputs[p->copies[e].output].alias != alias)
                return fail(d, p->copies[e].node,
                            "copy %d overwrites donated input %d before "
                            "copy %d reads it",
                            (int)c, (int)alias, (int)e);
        }
    }
    return LOOM_OK;
}

static loom_status check_placements(const loom_ir_plan *p, const loom_ir_graph *g,
                                    const vscratch *s, const bool *is_output, loom_ir_diag *d) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *nd = &g->nodes[i];
        const loom_ir_placement *pl = &p->placement[i];
        if (nd->op == LOOM_IR_OP_RESHAPE) {
            int32_t b = loom_ir_view_base(g, i);
            if (!p->has_placement[b]) {
                if (s->last[i] >= 0 || is_output[i] || p->has_placement[i])
                    return fail(d, i, "reshape %%%d views %%%d, which is not materialized", (int)i,
                                (int)b);
            } else if (!p->has_placement[i] || !placement_equal(pl, &p->placement[b])) {
                return fail(d, i, "reshape %%%d does not share the placement of %%%d", (int)i,
                            (int)b);
            } else if (pl->bytes != loom_ir_node_bytes(nd)) {
                return fail(d, i, "reshape %%%d is placed with %zu bytes, its value has %zu",
                            (int)i, pl->bytes, loom_ir_node_bytes(nd));
            }
            continue;
        }
        bool materialized = nd->op == LOOM_IR_OP_INPUT || s->produced[i] >= 0;
        if (!materialized) {
            if (p->has_placement[i])
                return fail(d, i, "%%%d has a placement but no kernel writes it", (int)i);
            continue;
        }
        if (!p->has_placement[i])
            return fail(d, i, "%%%d is materialized but has no placement", (int)i);
        if (pl->bytes != loom_ir_node_bytes(nd))
            return fail(d, i, "%%%d is placed with %zu bytes, its value has %zu", (int)i, pl->bytes,
                        loom_ir_node_bytes(nd));
        switch (pl->kind) {
        case LOOM_IR_BUFFER_INPUT:
            if (nd->op != LOOM_IR_OP_INPUT || pl->index != nd->attrs.index)
                return fail(d, i, "%%%d is placed in input %d, which is not its own", (int)i,
                            (int)pl->index);
            break;
        case LOOM_IR_BUFFER_OUTPUT:
            if (nd->op == LOOM_IR_OP_INPUT || pl->index < 0 || pl->index >= g->n_outputs ||
                g->outputs[pl->index].node != i)
                return fail(d, i, "%%%d is placed in output %d, which is not its own", (int)i,
                            (int)pl->index);
            break;
        case LOOM_IR_BUFFER_ARENA:
            if (nd->op == LOOM_IR_OP_INPUT)
                return fail(d, i, "input %%%d is placed in the arena", (int)i);
            if (pl->offset % 64 != 0)
                return fail(d, i, "%%%d: arena offset %zu is not 64-byte aligned", (int)i,
                            pl->offset);
            if (pl->offset > p->arena_bytes || pl->bytes > p->arena_bytes - pl->offset)
                return fail(d, i, "%%%d: arena range [%zu, %zu) exceeds the %zu-byte arena", (int)i,
                            pl->offset, pl->offset + pl->bytes, p->arena_bytes);
            break;
        case LOOM_IR_BUFFER_COUNT_:
            return fail(d, i, "%%%d has an unknown placement kind %d", (int)i, (int)pl->kind);
        }
    }
    /* a bucket is reduced as one flat range: its values end to end in the arena */
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        if (kn->kind != LOOM_IR_KERNEL_COLLECTIVE || kn->n_results < 2)
            continue;
        size_t at = 0;
        for (int32_t j = 0; j < kn->n_results; j++) {
            int32_t r = kn->results[j];
            const loom_ir_placement *pl = &p->placement[r];
            if (pl->kind != LOOM_IR_BUFFER_ARENA || (j > 0 && pl->offset != at))
                return fail(d, r,
                            "kernel %d (collective): %%%d is not placed in the arena right "
                            "after the bucket's previous value",
                            (int)k, (int)r);
            at = pl->offset + (pl->bytes + 63) / 64 * 64;
        }
    }
    return LOOM_OK;
}

/* Items x and y share bytes as a scatter's result and the base it was summed onto
 * (loom_ir_plan_scatter_base): the same block, the base last read by the kernel that writes
 * the result. */
static bool scatter_reuse(const loom_ir_plan *p, const loom_ir_graph *g, const arena_item *x,
                          const arena_item *y) {
    for (int pass = 0; pass < 2; pass++) {
        const arena_item *b = pass ? y : x, *r = pass ? x : y;
        if (b->offset == r->offset && b->end == r->end && b->last == r->first &&
            loom_ir_plan_scatter_base(p, g, r->first) == b->node &&
            p->kernels[r->first].root == r->node)
            return true;
    }
    return false;
}

/* Arena values alive at the same time never share bytes (but a scatter's result and its
 * base: scatter_reuse). A value lives from the kernel that
 * writes it to the last kernel that reads it (past all of them when a copy reads it). Two
 * values alive together are both alive when the later of them is written, so it is enough
 * to check, at each kernel that writes arena values, the values alive then: sorted by
 * offset, any overlap shows between neighbours. `items` has room for 2 * n_nodes. */
static loom_status check_arena_overlap(const loom_ir_plan *p, const loom_ir_graph *g,
                                       const vscratch *s, arena_item *items, loom_ir_diag *d) {
    int32_t n_items = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_placement *pl = &p->placement[i];
        if (g->nodes[i].op == LOOM_IR_OP_RESHAPE || !p->has_placement[i] ||
            pl->kind != LOOM_IR_BUFFER_ARENA || pl->bytes == 0)
            continue;
        int32_t first = s->produced[i], last = s->last[i] > first ? s->last[i] : first;
        const loom_ir_kernel *pk = &p->kernels[first];
        if (pk->kind == LOOM_IR_KERNEL_COLLECTIVE && pk->wait_before > last)
            last = pk->wait_before; /* written when it completes */
        items[n_items++] = (arena_item){.offset = pl->offset,
                                        .end = pl->offset + pl->bytes,
                                        .first = first,
                                        .last = last,
                                        .node = i};
    }
    qsort(items, (size_t)n_items, sizeof *items, cmp_by_first);
    arena_item *alive = items + g->n_nodes;
    int32_t n_alive = 0;
    for (int32_t at = 0; at < n_items;) {
        int32_t k = items[at].first, kept = 0;
        for (int32_t a = 0; a < n_alive; a++)
            if (alive[a].last >= k)
                alive[kept++] = alive[a];
        n_alive = kept;
        while (at < n_items && items[at].first == k)
            alive[n_alive++] = items[at++];
        qsort(alive, (size_t)n_alive, sizeof *alive, cmp_by_offset);
        for (int32_t a = 0; a + 1 < n_alive; a++)
            if (alive[a + 1].offset < alive[a].end &&
                !scatter_reuse(p, g, &alive[a], &alive[a + 1]))
                return fail(d, alive[a + 1].node,
                            "%%%d and %%%d are alive together (kernels %d..%d and %d..%d) and "
                            "share arena bytes from offset %zu",
                            (int)alive[a].node, (int)alive[a + 1].node, (int)alive[a].first,
                            (int)alive[a].last, (int)alive[a + 1].first, (int)alive[a + 1].last,
                            alive[a + 1].offset);
    }
    return LOOM_OK;
}

bool loom_ir_matmul_operand_fuses(const loom_ir_graph *g, int32_t mm, int32_t operand) {
    if (mm < 0 || mm >= g->n_nodes || operand < 0 || operand >= g->n_nodes)
        return false;
    const loom_ir_node *m = &g->nodes[mm], *x = &g->nodes[operand];
    if (!loom_ir_op_traits(m->op)->packs_operands)
        return false;
    if (m->dtype == LOOM_DTYPE_BF16 || m->dtype == LOOM_DTYPE_F16)
        return x->op == LOOM_IR_OP_CAST || x->op == LOOM_IR_OP_TRANSPOSE;
    /* f32: a transpose of the last two axes of an operand large enough, of a product of
     * enough rows (loom_ir_f32_transpose_fuses: a weight's W^T); codegen then packs that
     * matmul (on any host) */
    int32_t r = x->rank;
    return m->dtype == LOOM_DTYPE_F32 && x->op == LOOM_IR_OP_TRANSPOSE && r >= 2 && r == m->rank &&
           x->attrs.perm[r - 1] == r - 2 && x->attrs.perm[r - 2] == r - 1 &&
           loom_ir_f32_transpose_fuses(loom_ir_numel(r, x->shape), m->shape[r - 2]);
}

loom_status loom_ir_plan_verify(const loom_ir_plan *p, const loom_ir_graph *g, loom_ir_diag *d) {
    if (!p || !g)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "plan verify: %s is NULL",
                                !p ? "the plan" : "the graph");
    if (p->n_nodes != g->n_nodes)
        return fail(d, -1, "plan is for %d nodes, the graph has %d", (int)p->n_nodes,
                    (int)g->n_nodes);
    if (p->n_kernels < 0 || (p->n_kernels > 0 && !p->kernels) || p->n_copies < 0 ||
        (p->n_copies > 0 && !p->copies))
        return fail(d, -1, "plan has malformed kernel or copy arrays");
    if (g->n_nodes == 0) {
        if (p->n_kernels != 0 || p->n_copies != 0)
            return fail(d, -1, "plan of an empty graph has kernels or copies");
        return LOOM_OK;
    }
    int32_t n = g->n_nodes;
    size_t per_node = 5 * sizeof(int32_t) + 2 * sizeof(bool) + 2 * sizeof(arena_item);
    size_t bytes = (size_t)n * per_node;
    arena_item *items = loom_ir_alloc(&p->alloc, bytes);
    if (!items)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory verifying a plan");
    int32_t *ints = (int32_t *)(items + 2 * n);
    vscratch s = {.produced = ints,
                  .seen_in = ints + n,
                  .last = ints + 2 * n,
                  .arg_of = ints + 3 * n,
                  .used_by = ints + 4 * n,
                  .needed = (bool *)(ints + 5 * n)};
    bool *is_output = s.needed + n;
    for (int32_t i = 0; i < n; i++) {
        s.produced[i] = s.seen_in[i] = s.last[i] = s.arg_of[i] = s.used_by[i] = -1;
        s.needed[i] = is_output[i] = false;
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        is_output[g->outputs[o].node] = s.needed[g->outputs[o].node] = true;

    /* Which kernel computes what, so "needed outside" is one pass over the edges: a node is
     * needed outside its kernel when a node computed elsewhere (or no kernel's: a reshape
     * view) reads it. */
    loom_status st = LOOM_OK;
    for (int32_t k = 0; k < p->n_kernels && st == LOOM_OK; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        for (int32_t j = 0; j < kn->n_nodes && kn->nodes; j++) {
            int32_t x = kn->nodes[j];
            if (x >= 0 && x < n && g->nodes[x].op != LOOM_IR_OP_CONSTANT)
                s.seen_in[x] = s.seen_in[x] == -1 ? k : -2; /* -2: listed twice, caught below */
        }
    }
    for (int32_t u = 0; u < n; u++) {
        const loom_ir_node *un = &g->nodes[u];
        for (int32_t q = 0; q < un->n_inputs; q++) {
            int32_t o = un->inputs[q];
            if (s.seen_in[o] != -1 && s.seen_in[o] != s.seen_in[u])
                s.needed[o] = true;
        }
    }
    /* a collective's value is always materialized: the communicator works on buffers */
    for (int32_t i = 0; i < n; i++) {
        s.seen_in[i] = -1;
        if (loom_ir_op_traits(g->nodes[i].op)->ranks)
            s.needed[i] = true;
    }

    for (int32_t k = 0; k < p->n_kernels && st == LOOM_OK; k++)
        st = check_kernel(p, g, k, &s, d);
    /* every node that is computed has a kernel; inputs, constants, reshapes have none */
    for (int32_t i = 0; i < n && st == LOOM_OK; i++) {
        loom_ir_op op = g->nodes[i].op;
        bool none = op == LOOM_IR_OP_INPUT || op == LOOM_IR_OP_CONSTANT || op == LOOM_IR_OP_RESHAPE;
        if (none && p->node_kernel[i] != -1)
            st = fail(d, i, "%s %%%d has node_kernel %d; it belongs to no kernel",
                      loom_ir_op_name(op), (int)i, (int)p->node_kernel[i]);
        else if (!none && s.seen_in[i] < 0)
            st = fail(d, i, "%s %%%d belongs to no kernel", loom_ir_op_name(op), (int)i);
    }
    if (st == LOOM_OK)
        st = check_outputs(p, g, &s, d);
    if (st == LOOM_OK)
        st = check_placements(p, g, &s, is_output, d);
    if (st == LOOM_OK)
        st = check_arena_overlap(p, g, &s, items, d);
    if (st == LOOM_OK && p->peak_bytes < p->arena_bytes)
        st = fail(d, -1, "peak %zu bytes is below the %zu-byte arena", p->peak_bytes,
                  p->arena_bytes);
    loom_ir_free(&p->alloc, items, bytes);
    return st;
}

/* ---- printing ----------------------------------------------------------------------------- */

const char *loom_ir_kernel_kind_name(loom_ir_kernel_kind k) {
    switch (k) {
    case LOOM_IR_KERNEL_ELEMENTWISE: return "elementwise";
    case LOOM_IR_KERNEL_REDUCTION: return "reduction";
    case LOOM_IR_KERNEL_ROOTED: return "rooted";
    case LOOM_IR_KERNEL_COLLECTIVE: return "collective";
    case LOOM_IR_KERNEL_COUNT_: break;
    }
    return "?";
}

static void put_ids(loom_ir_writer *w, const char *label, const int32_t *ids, int32_t n) {
    loom_ir_writer_printf(w, "    %s:", label);
    if (n == 0)
        loom_ir_writer_puts(w, " none");
    for (int32_t i = 0; i < n; i++)
        loom_ir_writer_printf(w, i ? ", %%%d" : " %%%d", (int)ids[i]);
    loom_ir_writer_puts(w, "\n");
}

static void put_placement(loom_ir_writer *w, const loom_ir_placement *pl) {
    switch (pl->kind) {
    case LOOM_IR_BUFFER_INPUT: loom_ir_writer_printf(w, "input %d", (int)pl->index); break;
    case LOOM_IR_BUFFER_OUTPUT: loom_ir_writer_printf(w, "output %d", (int)pl->index); break;
    case LOOM_IR_BUFFER_ARENA: loom_ir_writer_printf(w, "arena +%zu", pl->offset); break;
    case LOOM_IR_BUFFER_COUNT_: loom_ir_writer_puts(w, "?"); break;
    }
    loom_ir_writer_printf(w, " (%zu bytes)", pl->bytes);
}

void loom_ir_kernel_cost(const loom_ir_kernel *kn, const loom_ir_graph *g, double *out_flops,
                         double *out_bytes) {
    double flops = 0, bytes = 0;
    for (int32_t j = 0; j < kn->n_nodes; j++)
        if (kn->nodes[j] >= 0 && kn->nodes[j] < g->n_nodes)
            flops += loom_ir_node_flops(g, &g->nodes[kn->nodes[j]]);
    for (int32_t j = 0; j < kn->n_args + kn->n_results; j++) {
        int32_t x = j < kn->n_args ? kn->args[j] : kn->results[j - kn->n_args];
        if (x >= 0 && x < g->n_nodes)
            bytes += (double)loom_ir_numel(g->nodes[x].rank, g->nodes[x].shape) *
                     (double)loom_dtype_size(g->nodes[x].dtype);
    }
    *out_flops = flops;
    *out_bytes = bytes;
}

loom_status loom_ir_plan_print(const loom_ir_plan *p, const loom_ir_graph *g,
                               loom_ir_write_fn write, void *ud) {
    if (!p || !g || !write || p->n_nodes != g->n_nodes)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_ir_writer w = {.write = write, .ud = ud};
    char type[LOOM_IR_TYPE_STR_MAX];
    double total_flops = 0, total_bytes = 0;
    loom_ir_writer_printf(&w, "plan: %d kernel%s, %d cop%s, arena %zu bytes, peak %zu bytes\n",
                          (int)p->n_kernels, p->n_kernels == 1 ? "" : "s", (int)p->n_copies,
                          p->n_copies == 1 ? "y" : "ies", p->arena_bytes, p->peak_bytes);
    loom_ir_memory_report mem; /* what a person wants first: where the memory goes */
    if (loom_ir_plan_memory(p, g, &mem) == LOOM_OK) {
        loom_ir_writer_flush(&w);
        loom_ir_memory_report_print(&mem, p, g, 8, write, ud);
        loom_ir_memory_report_deinit(&mem);
    }
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        bool root_ok = kn->root >= 0 && kn->root < g->n_nodes;
        loom_ir_writer_printf(&w, "kernel %d: %s, root %%%d", (int)k,
                              loom_ir_kernel_kind_name(kn->kind), (int)kn->root);
        if (root_ok)
            loom_ir_writer_printf(&w, " (%s)", loom_ir_op_name(g->nodes[kn->root].op));
        loom_ir_writer_puts(&w, "\n");
        for (int32_t j = 0; j < kn->n_nodes; j++) {
            int32_t x = kn->nodes[j];
            if (x < 0 || x >= g->n_nodes)
                continue;
            const loom_ir_node *nd = &g->nodes[x];
            loom_ir_writer_printf(&w, "    %%%d = %s", (int)x, loom_ir_op_name(nd->op));
            for (int32_t q = 0; q < nd->n_inputs; q++)
                loom_ir_writer_printf(&w, q ? ", %%%d" : " %%%d", (int)nd->inputs[q]);
            loom_ir_writer_puts(&w, " : ");
            loom_ir_writer_puts(
                &w, loom_ir_format_type(type, sizeof type, nd->dtype, nd->rank, nd->shape));
            if (nd->loc.scope) /* "  layer1.0.conv1.grad (model.c:161)" */
                loom_ir_writer_printf(&w, "  %s%s%s", nd->loc.scope,
                                      nd->loc.backward ? ".grad" : "", nd->loc.file ? " (" : "");
            else if (nd->loc.file)
                loom_ir_writer_puts(&w, "  ");
            if (nd->loc.file) {
                loom_ir_writer_puts(&w, nd->loc.file);
                loom_ir_writer_printf(&w, ":%d%s", (int)nd->loc.line, nd->loc.scope ? ")" : "");
            }
            loom_ir_writer_puts(&w, "\n");
        }
        put_ids(&w, "args", kn->args, kn->n_args);
        put_ids(&w, "results", kn->results, kn->n_results);
        if (kn->kind == LOOM_IR_KERNEL_COLLECTIVE) {
            size_t bucket = 0;
            for (int32_t j = 0; j < kn->n_nodes; j++)
                if (kn->nodes[j] >= 0 && kn->nodes[j] < g->n_nodes)
                    bucket += loom_ir_node_bytes(&g->nodes[kn->nodes[j]]);
            if (kn->n_nodes > 1)
                loom_ir_writer_printf(&w, "    bucket: %d all_reduces, %zu bytes\n",
                                      (int)kn->n_nodes, bucket);
            if (kn->wait_before >= p->n_kernels)
                loom_ir_writer_puts(&w, "    starts here, waited on after the last kernel\n");
            else
                loom_ir_writer_printf(&w, "    starts here, waited on before kernel %d\n",
                                      (int)kn->wait_before);
        }
        double flops, bytes;
        loom_ir_kernel_cost(kn, g, &flops, &bytes);
        loom_ir_writer_printf(&w, "    cost: %.0f flops, %.0f bytes moved\n", flops, bytes);
        total_flops += flops;
        total_bytes += bytes;
    }
    loom_ir_writer_puts(&w, "placements:\n");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        if (!p->has_placement[i])
            continue;
        const loom_ir_node *nd = &g->nodes[i];
        loom_ir_writer_printf(&w, "    %%%d %s : ", (int)i, loom_ir_op_name(nd->op));
        loom_ir_writer_puts(&w,
                            loom_ir_format_type(type, sizeof type, nd->dtype, nd->rank, nd->shape));
        loom_ir_writer_puts(&w, " -> ");
        put_placement(&w, &p->placement[i]);
        if (nd->op == LOOM_IR_OP_RESHAPE)
            loom_ir_writer_printf(&w, ", a view of %%%d", (int)loom_ir_view_base(g, i));
        loom_ir_writer_puts(&w, "\n");
    }
    if (p->n_copies > 0) {
        loom_ir_writer_puts(&w, "copies after the kernels:\n");
        for (int32_t c = 0; c < p->n_copies; c++)
            loom_ir_writer_printf(&w, "    %%%d -> output %d\n", (int)p->copies[c].node,
                                  (int)p->copies[c].output);
    }
    loom_ir_writer_printf(&w, "arena: %zu bytes\npeak: %zu bytes\n", p->arena_bytes, p->peak_bytes);
    loom_ir_writer_printf(&w, "total: %.0f flops, %.0f bytes moved\n", total_flops, total_bytes);
    loom_ir_writer_flush(&w);
    return LOOM_OK;
}

static bool same_type_shape(const loom_ir_node *a, const loom_ir_node *b) {
    return a->rank == b->rank &&
           memcmp(a->shape, b->shape, (size_t)a->rank * sizeof a->shape[0]) == 0;
}

int32_t loom_ir_plan_scatter_base(const loom_ir_plan *p, const loom_ir_graph *g, int32_t k) {
    if (k < 0 || k >= p->n_kernels || p->n_nodes != g->n_nodes)
        return -1;
    const loom_ir_kernel *kn = &p->kernels[k];
    if (kn->kind != LOOM_IR_KERNEL_ROOTED || kn->root < 0 || kn->root >= g->n_nodes)
        return -1;
    const loom_ir_node *root = &g->nodes[kn->root];
    if (root->op != LOOM_IR_OP_SCATTER_ADD || root->n_inputs != 3)
        return -1;
    bool stored = false;
    for (int32_t r = 0; r < kn->n_results; r++)
        stored = stored || kn->results[r] == kn->root;
    int32_t base = loom_ir_view_base(g, root->inputs[0]);
    const loom_ir_node *bn = &g->nodes[base];
    if (!stored || bn->op == LOOM_IR_OP_INPUT || bn->op == LOOM_IR_OP_CONSTANT ||
        loom_ir_node_bytes(bn) != loom_ir_node_bytes(root) ||
        loom_ir_view_base(g, root->inputs[1]) == base ||
        loom_ir_view_base(g, root->inputs[2]) == base)
        return -1;
    for (int32_t i = 0; i < kn->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[kn->nodes[i]];
        if (kn->nodes[i] == kn->root)
            continue;
        for (int32_t q = 0; q < n->n_inputs; q++)
            if (loom_ir_view_base(g, n->inputs[q]) == base)
                return -1;
    }
    return base;
}

bool loom_ir_plan_can_update_in_place(const loom_ir_plan *p, const loom_ir_graph *g,
                                      int32_t output) {
    if (output < 0 || output >= g->n_outputs || p->n_nodes != g->n_nodes)
        return false;
    int32_t x = g->outputs[output].node, alias = g->outputs[output].alias;
    if (alias < 0 || x < 0 || x >= g->n_nodes)
        return false;
    int32_t k = p->node_kernel[x];
    if (k < 0 || k >= p->n_kernels)
        return false;
    const loom_ir_kernel *kn = &p->kernels[k];
    /* The output must be stored in the kernel's main loop, where every result at an index
     * is stored after all of them are evaluated (codegen's cg_emit_sinks): the root of an
     * elementwise kernel, or a result of its shape (a concat kernel stores only its root
     * there), or a result of a matmul's epilogue (computed from the product, once per
     * element, after all of it). Results elsewhere are stored by loops of their own. */
    const loom_ir_node *root = &g->nodes[kn->root];
    bool main_loop = kn->kind == LOOM_IR_KERNEL_ELEMENTWISE
                         ? kn->root == x || (root->op != LOOM_IR_OP_CONCAT &&
                                             same_type_shape(&g->nodes[x], root))
                         : kn->kind == LOOM_IR_KERNEL_ROOTED && kn->root != x;
    if (!main_loop)
        return false;
    int32_t in = -1;
    for (int32_t i = 0; i < g->n_nodes && in < 0; i++)
        if (g->nodes[i].op == LOOM_IR_OP_INPUT && g->nodes[i].attrs.index == alias)
            in = i;
    if (in < 0)
        return false;
    /* A broadcast, transpose, slice, pad, concat or rand_uniform of anything derived from
     * the input would read it at another index than the one written (a broadcast constant is
     * fine). Kernel nodes are in graph order, so one forward sweep marks what depends on the
     * input. */
    uint64_t dep_small[8] = {0}, root_small[8] = {0}; /* depends on the input; on the root */
    if (kn->n_nodes > 64 * 8)
        return false; /* large kernels: stay on the copy path rather than allocate */
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        const loom_ir_node *nd = &g->nodes[kn->nodes[j]];
        bool dep = false, on_root = kn->nodes[j] == kn->root;
        for (int32_t q = 0; q < nd->n_inputs; q++) {
            int32_t src = nd->inputs[q], pos = sorted_find(kn->nodes, j, src);
            dep = dep || loom_ir_view_base(g, src) == in ||
                  (pos >= 0 && (dep_small[pos / 64] >> (pos % 64) & 1));
            on_root = on_root || (pos >= 0 && (root_small[pos / 64] >> (pos % 64) & 1));
        }
        if (on_root)
            root_small[j / 64] |= (uint64_t)1 << (j % 64);
        if (kn->nodes[j] == x && kn->kind == LOOM_IR_KERNEL_ROOTED && !on_root)
            return false; /* not the epilogue's: a loop of its own */
        if (!dep)
            continue;
        dep_small[j / 64] |= (uint64_t)1 << (j % 64);
        if (!loom_ir_op_traits(nd->op)->pointwise)
            return false;
    }
    /* The results stored outside the main loop (codegen's side nests) are computed in the
     * kernel's first task while the other tasks run the main loop: one of them that reads
     * the input could see it overwritten. Main-loop results are those of the root's shape
     * (elementwise) or the epilogue's (on the product). */
    for (int32_t r = 0; r < kn->n_results; r++) {
        int32_t j = sorted_find(kn->nodes, kn->n_nodes, kn->results[r]);
        if (j < 0 || !(dep_small[j / 64] >> (j % 64) & 1))
            continue;
        bool in_main = kn->kind == LOOM_IR_KERNEL_ELEMENTWISE
                           ? kn->results[r] == kn->root ||
                                 (root->op != LOOM_IR_OP_CONCAT &&
                                  same_type_shape(&g->nodes[kn->results[r]], root))
                           : (root_small[j / 64] >> (j % 64) & 1) != 0;
        if (!in_main)
            return false;
    }
    for (int32_t a = 0; a < kn->n_args; a++)
        if (loom_ir_view_base(g, kn->args[a]) == in &&
            !same_type_shape(&g->nodes[kn->args[a]], &g->nodes[x]))
            return false;
    for (int32_t k2 = k + 1; k2 < p->n_kernels; k2++) /* read after it is overwritten? */
        for (int32_t a = 0; a < p->kernels[k2].n_args; a++)
            if (loom_ir_view_base(g, p->kernels[k2].args[a]) == in)
                return false;
    for (int32_t o = 0; o < g->n_outputs; o++) /* copied out after the kernels? */
        if (o != output && loom_ir_view_base(g, g->outputs[o].node) == in)
            return false;
    return true;
}
