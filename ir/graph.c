/* IR graphs: node construction, subgraph extraction and copying. */
#include <string.h>

#include "ir.h"

void loom_ir_graph_init(loom_ir_graph *g, const loom_allocator *a) {
    memset(g, 0, sizeof *g);
    g->alloc = *a;
    loom_ir_arena_init(&g->arena, a);
}

void loom_ir_graph_deinit(loom_ir_graph *g) {
    loom_ir_free(&g->alloc, g->nodes, (size_t)g->cap_nodes * sizeof *g->nodes);
    loom_ir_free(&g->alloc, g->outputs, (size_t)g->cap_outputs * sizeof *g->outputs);
    loom_ir_arena_deinit(&g->arena);
    loom_allocator a = g->alloc;
    memset(g, 0, sizeof *g);
    g->alloc = a;
}

void loom_ir_graph_reset(loom_ir_graph *g) {
    g->n_nodes = 0;
    g->n_outputs = 0;
    g->n_graph_inputs = 0;
    g->last_file = g->last_file_copy = NULL;
    g->last_scope = g->last_scope_copy = NULL;
    loom_ir_arena_reset(&g->arena);
}

/* File names and scopes repeat from node to node: intern them into the arena, remembering
 * the last one seen (*last) and its copy (*last_copy). */
static const char *intern(loom_ir_graph *g, const char *s, const char **last,
                          const char **last_copy) {
    if (!s)
        return NULL;
    if (s == *last || s == *last_copy)
        return *last_copy;
    if (*last_copy && strcmp(s, *last_copy) == 0) {
        *last = s;
        return *last_copy;
    }
    char *copy = loom_ir_arena_strndup(&g->arena, s, strlen(s));
    if (!copy)
        return NULL;
    *last = s;
    *last_copy = copy;
    return copy;
}

/* Appends a node whose type is already known (no inference). */
static loom_status append_node(loom_ir_graph *g, const loom_ir_node *src, const int32_t *inputs,
                               int32_t *out_id) {
    if (!loom_ir_grow(&g->alloc, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1,
                      sizeof *g->nodes))
        return LOOM_STATUS_OUT_OF_MEMORY;
    loom_ir_node *n = &g->nodes[g->n_nodes];
    *n = *src;
    n->inputs = NULL;
    if (src->n_inputs > 0) {
        n->inputs = loom_ir_arena_alloc(&g->arena, (size_t)src->n_inputs * sizeof *n->inputs);
        if (!n->inputs)
            return LOOM_STATUS_OUT_OF_MEMORY;
        memcpy(n->inputs, inputs, (size_t)src->n_inputs * sizeof *n->inputs);
    }
    n->loc.file = intern(g, src->loc.file, &g->last_file, &g->last_file_copy);
    if (src->loc.file && !n->loc.file)
        return LOOM_STATUS_OUT_OF_MEMORY;
    n->loc.scope = intern(g, src->loc.scope, &g->last_scope, &g->last_scope_copy);
    if (src->loc.scope && !n->loc.scope)
        return LOOM_STATUS_OUT_OF_MEMORY;
    if (n->op == LOOM_IR_OP_INPUT && n->attrs.index + 1 > g->n_graph_inputs)
        g->n_graph_inputs = (int32_t)(n->attrs.index + 1);
    *out_id = g->n_nodes++;
    return LOOM_OK;
}

loom_status loom_ir_graph_add(loom_ir_graph *g, const loom_ir_node_desc *desc, int32_t *out_id,
                              loom_ir_diag *d) {
    loom_ir_node n = {.op = desc->op, .n_inputs = desc->n_inputs, .attrs = desc->attrs,
                      .loc = desc->loc};
    loom_status st = loom_ir_infer(g, desc, &n.dtype, &n.rank, n.shape, d);
    if (st != LOOM_OK)
        return st;
    st = append_node(g, &n, desc->inputs, out_id);
    if (st != LOOM_OK)
        return loom_ir_diag_set(d, st, "out of memory adding a %s node", loom_ir_op_name(desc->op));
    return LOOM_OK;
}

loom_status loom_ir_graph_add_output(loom_ir_graph *g, int32_t node, int32_t alias) {
    if (!loom_ir_grow(&g->alloc, (void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1,
                      sizeof *g->outputs))
        return LOOM_STATUS_OUT_OF_MEMORY;
    g->outputs[g->n_outputs++] = (loom_ir_output){.node = node, .alias = alias};
    return LOOM_OK;
}

loom_status loom_ir_graph_extract(loom_ir_graph *dst, const loom_ir_graph *src, int32_t n_roots,
                                  const int32_t *roots, const int32_t *aliases, bool keep_inputs,
                                  int32_t *map) {
    loom_ir_graph_reset(dst);
    int32_t *live = map;
    size_t map_bytes = (size_t)src->n_nodes * sizeof *live;
    if (!live && src->n_nodes > 0) {
        live = loom_ir_alloc(&dst->alloc, map_bytes);
        if (!live)
            return LOOM_STATUS_OUT_OF_MEMORY;
    }
    /* Mark the roots, the inputs that must stay, then walk backwards: operands precede
     * their users, so one reverse sweep finds everything the roots depend on. */
    uint8_t *aliased = NULL; /* per src input index: is it donated into by an output? */
    if (!keep_inputs && aliases && src->n_graph_inputs > 0) {
        aliased = loom_ir_arena_alloc(&dst->arena, (size_t)src->n_graph_inputs);
        if (!aliased) {
            if (!map)
                loom_ir_free(&dst->alloc, live, map_bytes);
            return LOOM_STATUS_OUT_OF_MEMORY;
        }
        memset(aliased, 0, (size_t)src->n_graph_inputs);
        for (int32_t r = 0; r < n_roots; r++)
            if (aliases[r] >= 0 && aliases[r] < src->n_graph_inputs)
                aliased[aliases[r]] = 1;
    }
    for (int32_t i = 0; i < src->n_nodes; i++) {
        const loom_ir_node *n = &src->nodes[i];
        bool keep = n->op == LOOM_IR_OP_INPUT && (keep_inputs || (aliased && aliased[n->attrs.index]));
        live[i] = keep ? 0 : -1;
    }
    for (int32_t r = 0; r < n_roots; r++)
        live[roots[r]] = 0;
    for (int32_t i = src->n_nodes - 1; i >= 0; i--) {
        if (live[i] < 0)
            continue;
        const loom_ir_node *n = &src->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++)
            live[n->inputs[k]] = 0;
    }
    loom_status st = LOOM_OK;
    int32_t ins[16];
    int32_t next_input = 0;
    /* src input index -> dst input index, to translate aliases */
    int32_t *input_map = NULL;
    if (!keep_inputs && aliases && src->n_graph_inputs > 0) {
        input_map = loom_ir_arena_alloc(&dst->arena, (size_t)src->n_graph_inputs * sizeof(int32_t));
        if (!input_map)
            st = LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < src->n_nodes && st == LOOM_OK; i++) {
        if (live[i] < 0)
            continue;
        loom_ir_node n = src->nodes[i];
        int32_t *tmp = ins;
        if (n.n_inputs > 16) {
            tmp = loom_ir_arena_alloc(&dst->arena, (size_t)n.n_inputs * sizeof *tmp);
            if (!tmp) {
                st = LOOM_STATUS_OUT_OF_MEMORY;
                break;
            }
        }
        for (int32_t k = 0; k < n.n_inputs; k++)
            tmp[k] = live[n.inputs[k]];
        if (n.op == LOOM_IR_OP_INPUT && !keep_inputs) {
            if (input_map)
                input_map[n.attrs.index] = next_input;
            n.attrs.index = next_input++;
        }
        st = append_node(dst, &n, tmp, &live[i]);
    }
    for (int32_t r = 0; r < n_roots && st == LOOM_OK; r++) {
        int32_t alias = aliases ? aliases[r] : -1;
        if (alias >= 0 && !keep_inputs) /* aliased inputs were kept live above */
            alias = alias < src->n_graph_inputs ? input_map[alias] : -1;
        st = loom_ir_graph_add_output(dst, live[roots[r]], alias);
    }
    if (!map)
        loom_ir_free(&dst->alloc, live, map_bytes);
    if (st != LOOM_OK)
        loom_ir_graph_reset(dst);
    return st;
}

loom_status loom_ir_graph_copy(loom_ir_graph *dst, const loom_ir_graph *src) {
    loom_ir_graph_reset(dst);
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < src->n_nodes && st == LOOM_OK; i++) {
        int32_t id;
        st = append_node(dst, &src->nodes[i], src->nodes[i].inputs, &id);
    }
    for (int32_t r = 0; r < src->n_outputs && st == LOOM_OK; r++)
        st = loom_ir_graph_add_output(dst, src->outputs[r].node, src->outputs[r].alias);
    dst->n_graph_inputs = src->n_graph_inputs;
    if (st != LOOM_OK)
        loom_ir_graph_reset(dst);
    return st;
}

double loom_ir_node_flops(const loom_ir_graph *g, const loom_ir_node *n) {
    double numel = (double)loom_ir_numel(n->rank, n->shape);
    switch (loom_ir_op_table[n->op].kind) {
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_CAST: return numel;
    case LOOM_IR_KIND_REDUCTION: {
        const loom_ir_node *in = &g->nodes[n->inputs[0]];
        return (double)loom_ir_numel(in->rank, in->shape);
    }
    case LOOM_IR_KIND_CONTRACTION: {
        const loom_ir_node *a = &g->nodes[n->inputs[0]];
        return 2.0 * numel * (double)a->shape[a->rank - 1];
    }
    case LOOM_IR_KIND_RAND: return numel; /* a hash per element */
    case LOOM_IR_KIND_CONV: { /* 2 * each output element * its window: C/groups * KH * KW */
        const loom_ir_node *a = &g->nodes[n->inputs[0]], *b = &g->nodes[n->inputs[1]];
        const loom_ir_node *y = n->op == LOOM_IR_OP_CONV2D              ? n
                                : n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? a
                                                                        : b;
        const loom_ir_node *w = n->op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT ? n : b;
        return 2.0 * (double)loom_ir_numel(4, y->shape) * (double)loom_ir_numel(3, w->shape + 1);
    }
    case LOOM_IR_KIND_POOL: { /* a compare per window tap of each pooled element */
        const loom_ir_node *y = n->op == LOOM_IR_OP_MAX_POOL2D ? n : &g->nodes[n->inputs[1]];
        return (double)loom_ir_numel(4, y->shape) * (double)n->attrs.conv.kernel[0] *
               (double)n->attrs.conv.kernel[1];
    }
    case LOOM_IR_KIND_SCATTER: { /* an add per element of src */
        const loom_ir_node *src = &g->nodes[n->inputs[2]];
        return (double)loom_ir_numel(src->rank, src->shape);
    }
    case LOOM_IR_KIND_ATTENTION: { /* 2 E or 2 Ev per attended (query, key) pair and product */
        const loom_ir_node *q = &g->nodes[n->inputs[0]], *k = &g->nodes[n->inputs[1]];
        int32_t r = q->rank;
        double L = (double)q->shape[r - 2], S = (double)k->shape[r - 2];
        /* Ev: the output's last extent, or do's (grad_q, grad_k: operand 3) */
        const loom_ir_node *o =
            n->op == LOOM_IR_OP_ATTENTION || n->op == LOOM_IR_OP_ATTENTION_GRAD_V
                ? n
                : &g->nodes[n->inputs[n->op == LOOM_IR_OP_ATTENTION_LSE ? 0 : 3]];
        double E = (double)q->shape[r - 1], Ev = (double)o->shape[o->rank - 1];
        /* causal (top-left): query i attends min(i + 1, S) keys */
        double pairs = !n->attrs.index ? L * S
                       : L <= S        ? L * (L + 1) / 2
                                       : S * (S + 1) / 2 + (L - S) * S;
        pairs *= (double)loom_ir_numel(r - 2, q->shape);
        /* the products each computes: the scores, then its own */
        if (n->op == LOOM_IR_OP_ATTENTION_LSE)
            return 2 * pairs * E;
        if (n->op == LOOM_IR_OP_ATTENTION_GRAD_Q || n->op == LOOM_IR_OP_ATTENTION_GRAD_K)
            return 2 * pairs * (2 * E + Ev);
        return 2 * pairs * (E + Ev); /* attention, grad_v */
    }
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_SLICE:
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_CONCAT:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_GATHER:     /* data movement */
    case LOOM_IR_KIND_COLLECTIVE: /* communication, not arithmetic */
    case LOOM_IR_KIND_COUNT_: break;
    }
    return 0;
}

int64_t loom_ir_conv_out_extent(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
    if (in < 0 || k < 1 || stride < 1 || dil < 1 || pad < 0 || in > INT64_MAX / 4 ||
        pad > INT64_MAX / 8 || k - 1 > INT64_MAX / 4 / dil)
        return 0;
    int64_t span = dil * (k - 1) + 1;
    if (in + 2 * pad < span)
        return 0;
    return (in + 2 * pad - span) / stride + 1;
}

size_t loom_ir_node_bytes(const loom_ir_node *n) {
    return (size_t)loom_ir_numel(n->rank, n->shape) * loom_dtype_size(n->dtype);
}

int32_t loom_ir_view_base(const loom_ir_graph *g, int32_t n) {
    while (g->nodes[n].op == LOOM_IR_OP_RESHAPE)
        n = g->nodes[n].inputs[0];
    return n;
}
