/* Common-subexpression elimination: one sweep in graph order with a hash table of the nodes
 * kept so far; a node equal to a kept one (after its operands were themselves merged) is
 * replaced by it. */
#include <string.h>

#include "passes.h"

/* Per node while sweeping: the kept node it stands for (itself when kept) and its hash. */
typedef struct cse_state {
    const loom_ir_graph *g;
    int32_t *canon;
    uint64_t *hash;
    int32_t *table; /* open addressing over node ids, -1 empty; size is a power of two */
    uint32_t mask;
} cse_state;

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* The operands of n as merged so far; a commutative op's two operands in a fixed order so
 * that add(a, b) and add(b, a) look the same. */
static void canon_operands(const cse_state *s, const loom_ir_node *n, int32_t *out) {
    for (int32_t k = 0; k < n->n_inputs; k++)
        out[k] = s->canon[n->inputs[k]];
    if ((loom_ir_op_table[n->op].flags & LOOM_IR_OPF_COMMUTATIVE) && n->n_inputs == 2 &&
        out[0] > out[1]) {
        int32_t t = out[0];
        out[0] = out[1];
        out[1] = t;
    }
}

static uint64_t attrs_hash(const loom_ir_node *n) {
    uint64_t h = 0;
    switch (loom_ir_op_table[n->op].attrs) {
    case LOOM_IR_ATTRS_NONE: break;
    case LOOM_IR_ATTRS_INDEX: h = (uint64_t)n->attrs.index; break;
    case LOOM_IR_ATTRS_VALUE: memcpy(&h, &n->attrs.value, sizeof h); break;
    case LOOM_IR_ATTRS_PERM:
        for (int32_t i = 0; i < n->rank; i++)
            h = mix(h, (uint64_t)(uint32_t)n->attrs.perm[i]);
        break;
    case LOOM_IR_ATTRS_AXES: h = (uint64_t)n->attrs.axes | (uint64_t)n->attrs.keepdim << 32; break;
    case LOOM_IR_ATTRS_PAD:
    case LOOM_IR_ATTRS_SLICE:
        if (loom_ir_op_table[n->op].attrs == LOOM_IR_ATTRS_PAD)
            memcpy(&h, &n->attrs.value, sizeof h);
        for (int32_t i = 0; i < n->rank; i++)
            h = mix(mix(h, (uint64_t)n->attrs.start[i]), (uint64_t)n->attrs.step[i]);
        break;
    case LOOM_IR_ATTRS_AXIS: h = (uint64_t)n->attrs.index; break;
    case LOOM_IR_ATTRS_ATTENTION: /* causal and the scale (attention_lse's copies merge) */
    case LOOM_IR_ATTRS_REDUCE: /* all_reduce: never merged (side effect), hashed for completeness */
        memcpy(&h, &n->attrs.value, sizeof h);
        h = mix(h, (uint64_t)n->attrs.index);
        break;
    case LOOM_IR_ATTRS_ROOT:
    case LOOM_IR_ATTRS_WORLD: h = (uint64_t)n->attrs.index; break;
    case LOOM_IR_ATTRS_CONV: /* a convolution's kernel and a pool's groups are 0 */
    case LOOM_IR_ATTRS_POOL:
        for (int i = 0; i < 2; i++)
            h = mix(mix(mix(mix(h, (uint64_t)n->attrs.conv.kernel[i]),
                            (uint64_t)n->attrs.conv.stride[i]),
                        (uint64_t)n->attrs.conv.padding[i]),
                    (uint64_t)n->attrs.conv.dilation[i]);
        h = mix(h, (uint64_t)n->attrs.conv.groups);
        break;
    case LOOM_IR_ATTRS_COUNT_: break;
    }
    return h;
}

static uint64_t node_hash(const loom_ir_node *n, const int32_t *ops) {
    uint64_t h = mix(0, (uint64_t)n->op | (uint64_t)n->dtype << 16 | (uint64_t)n->rank << 32);
    for (int32_t i = 0; i < n->rank; i++)
        h = mix(h, (uint64_t)n->shape[i]);
    for (int32_t k = 0; k < n->n_inputs; k++)
        h = mix(h, (uint64_t)(uint32_t)ops[k]);
    return mix(h, attrs_hash(n));
}

static bool nodes_equal(const cse_state *s, int32_t a, const int32_t *a_ops, int32_t b) {
    const loom_ir_node *x = &s->g->nodes[a], *y = &s->g->nodes[b];
    if (x->op != y->op || x->dtype != y->dtype || x->rank != y->rank || x->n_inputs != y->n_inputs)
        return false;
    if (memcmp(x->shape, y->shape, (size_t)x->rank * sizeof x->shape[0]) != 0)
        return false;
    if (!loom_ir_attrs_equal(x, y)) /* by bits: 0.0 and -0.0 differ */
        return false;
    int32_t b_ops[16]; /* only mergeable nodes, of at most 16 operands, are in the table */
    canon_operands(s, y, b_ops);
    return memcmp(a_ops, b_ops, (size_t)x->n_inputs * sizeof *a_ops) == 0;
}

/* Whether a node may stand for another: inputs are distinct values whatever they look like,
 * and ops with side effects must all run. */
static bool mergeable(const loom_ir_node *n) {
    return n->op != LOOM_IR_OP_INPUT &&
           !(loom_ir_op_table[n->op].flags & LOOM_IR_OPF_SIDE_EFFECT) && n->n_inputs <= 16;
}

static loom_status rebuild(loom_ir_graph *g, const int32_t *canon, int32_t *map, loom_ir_diag *d) {
    loom_ir_graph out;
    loom_ir_graph_init(&out, &g->alloc);
    loom_status st = LOOM_OK;
    int32_t ops[16];
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        map[i] = -1;
        if (canon[i] != i)
            continue;
        const loom_ir_node *n = &g->nodes[i];
        const int32_t *in = n->inputs;
        int32_t *tmp = NULL;
        size_t tmp_bytes = (size_t)n->n_inputs * sizeof *tmp;
        if (n->n_inputs > 16) {
            tmp = loom_ir_alloc(&g->alloc, tmp_bytes);
            if (!tmp) {
                st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
                break;
            }
        }
        int32_t *dst = tmp ? tmp : ops;
        for (int32_t k = 0; k < n->n_inputs; k++)
            dst[k] = map[canon[in[k]]];
        map[i] = loom_pass_add_copy(&out, n, dst, &st, d);
        loom_ir_free(&g->alloc, tmp, tmp_bytes);
    }
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++)
        if (loom_ir_graph_add_output(&out, map[canon[g->outputs[o].node]], g->outputs[o].alias) !=
            LOOM_OK)
            st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    if (st != LOOM_OK) {
        loom_ir_graph_deinit(&out);
        return st;
    }
    out.n_graph_inputs = g->n_graph_inputs; /* every input is kept, so the count stays */
    loom_ir_graph_deinit(g);
    *g = out;
    return LOOM_OK;
}

static loom_status cse_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    if (g->n_nodes < 2)
        return LOOM_OK;
    uint32_t size = 16;
    while (size < 2u * (uint32_t)g->n_nodes)
        size *= 2;
    size_t n = (size_t)g->n_nodes;
    size_t bytes = n * (2 * sizeof(int32_t) + sizeof(uint64_t)) + size * sizeof(int32_t);
    uint64_t *block = loom_ir_alloc(&g->alloc, bytes);
    if (!block)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    cse_state s = {.g = g, .hash = block, .canon = (int32_t *)(block + n), .mask = size - 1};
    int32_t *map = s.canon + n;
    s.table = map + n;
    memset(s.table, 0xff, size * sizeof *s.table);

    int32_t merged = 0;
    int32_t ops[16];
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *nd = &g->nodes[i];
        s.canon[i] = i;
        if (!mergeable(nd))
            continue;
        canon_operands(&s, nd, ops);
        uint64_t h = node_hash(nd, ops);
        s.hash[i] = h;
        uint32_t slot = (uint32_t)(h ^ (h >> 32)) & s.mask;
        for (;; slot = (slot + 1) & s.mask) {
            int32_t other = s.table[slot];
            if (other < 0) {
                s.table[slot] = i;
                break;
            }
            if (s.hash[other] == h && nodes_equal(&s, i, ops, other)) {
                s.canon[i] = other;
                merged++;
                break;
            }
        }
    }
    loom_status st = LOOM_OK;
    if (merged > 0) {
        st = rebuild(g, s.canon, map, d);
        *out_changed = st == LOOM_OK;
    }
    loom_ir_free(&g->alloc, block, bytes);
    return st;
}

const loom_pass loom_pass_cse = {.name = "cse", .run = cse_run};
