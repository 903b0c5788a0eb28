/* Structural hashing and equality of graphs: what the executable cache keys on. Locations
 * are left out on purpose, so the same model traced from another line still hits. */
#include <string.h>

#include "ir.h"

/* 64-bit FNV-1a over canonical little fields, finished with a murmur-style mix. */
typedef struct hasher {
    uint64_t h;
} hasher;

static inline void mix(hasher *s, uint64_t v) {
    s->h ^= v;
    s->h *= 0x100000001b3ull;
    s->h ^= s->h >> 29;
}

static void hash_node(hasher *s, const loom_ir_node *n) {
    mix(s, (uint64_t)n->op | (uint64_t)n->dtype << 16 | (uint64_t)(uint32_t)n->rank << 24 |
               (uint64_t)(uint32_t)n->n_inputs << 32);
    for (int32_t i = 0; i < n->rank; i++)
        mix(s, (uint64_t)n->shape[i]);
    for (int32_t i = 0; i < n->n_inputs; i++)
        mix(s, (uint64_t)(uint32_t)n->inputs[i]);
    if (n->attrs.autocast != LOOM_DTYPE_F32)
        mix(s, 0xac00u | (uint64_t)n->attrs.autocast);
    switch (loom_ir_op_table[n->op].attrs) {
    case LOOM_IR_ATTRS_NONE: break;
    case LOOM_IR_ATTRS_INDEX: mix(s, (uint64_t)n->attrs.index); break;
    case LOOM_IR_ATTRS_VALUE: {
        uint64_t bits; /* by bits, as equality compares: -0.0 and 0.0 are different graphs */
        memcpy(&bits, &n->attrs.value, sizeof bits);
        mix(s, bits);
        break;
    }
    case LOOM_IR_ATTRS_PERM:
        for (int32_t i = 0; i < n->rank; i++)
            mix(s, (uint64_t)(uint32_t)n->attrs.perm[i]);
        break;
    case LOOM_IR_ATTRS_AXES: mix(s, (uint64_t)n->attrs.axes | (uint64_t)n->attrs.keepdim << 32); break;
    case LOOM_IR_ATTRS_PAD:
    case LOOM_IR_ATTRS_SLICE:
        if (loom_ir_op_table[n->op].attrs == LOOM_IR_ATTRS_PAD) {
            uint64_t bits;
            memcpy(&bits, &n->attrs.value, sizeof bits);
            mix(s, bits);
        }
        for (int32_t i = 0; i < n->rank; i++) {
            mix(s, (uint64_t)n->attrs.start[i]);
            mix(s, (uint64_t)n->attrs.step[i]);
        }
        break;
    case LOOM_IR_ATTRS_AXIS: mix(s, (uint64_t)n->attrs.index); break;
    case LOOM_IR_ATTRS_ATTENTION: /* causal, the scale and (where any) the dropout */
    case LOOM_IR_ATTRS_REDUCE: { /* the op and the scale; never the rank */
        uint64_t bits;
        memcpy(&bits, &n->attrs.value, sizeof bits);
        mix(s, (uint64_t)n->attrs.index);
        mix(s, bits);
        if (n->attrs.dropout != 0) { /* graphs without dropout keep their hashes */
            memcpy(&bits, &n->attrs.dropout, sizeof bits);
            mix(s, 0xd70u ^ bits);
        }
        break;
    }
    case LOOM_IR_ATTRS_ROOT:
    case LOOM_IR_ATTRS_WORLD: mix(s, (uint64_t)n->attrs.index); break;
    case LOOM_IR_ATTRS_CONV: /* a convolution's kernel and a pool's groups are 0 */
    case LOOM_IR_ATTRS_POOL: {
        const loom_ir_conv *c = &n->attrs.conv;
        for (int i = 0; i < 2; i++) {
            mix(s, (uint64_t)c->kernel[i]);
            mix(s, (uint64_t)c->stride[i]);
            mix(s, (uint64_t)c->padding[i]);
            mix(s, (uint64_t)c->dilation[i]);
        }
        mix(s, (uint64_t)c->groups);
        break;
    }
    case LOOM_IR_ATTRS_COUNT_: break;
    }
}

uint64_t loom_ir_graph_hash(const loom_ir_graph *g) {
    hasher s = {0xcbf29ce484222325ull};
    mix(&s, (uint64_t)(uint32_t)g->n_nodes | (uint64_t)(uint32_t)g->n_outputs << 32);
    for (int32_t i = 0; i < g->n_nodes; i++)
        hash_node(&s, &g->nodes[i]);
    for (int32_t o = 0; o < g->n_outputs; o++)
        mix(&s, (uint64_t)(uint32_t)g->outputs[o].node | (uint64_t)(uint32_t)g->outputs[o].alias << 32);
    uint64_t h = s.h;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

void loom_ir_graph_prefix_hashes(const loom_ir_graph *g, uint64_t *out) {
    hasher s = {0xcbf29ce484222325ull};
    for (int32_t i = 0; i < g->n_nodes; i++) {
        hash_node(&s, &g->nodes[i]);
        out[i] = s.h;
    }
}

bool loom_ir_conv_equal(const loom_ir_conv *a, const loom_ir_conv *b) {
    for (int i = 0; i < 2; i++)
        if (a->stride[i] != b->stride[i] || a->padding[i] != b->padding[i] ||
            a->dilation[i] != b->dilation[i] || a->kernel[i] != b->kernel[i])
            return false;
    return a->groups == b->groups;
}

bool loom_ir_attrs_equal(const loom_ir_node *a, const loom_ir_node *b) {
    if (a->attrs.autocast != b->attrs.autocast)
        return false;
    switch (loom_ir_op_table[a->op].attrs) {
    case LOOM_IR_ATTRS_NONE: return true;
    case LOOM_IR_ATTRS_INDEX: return a->attrs.index == b->attrs.index;
    case LOOM_IR_ATTRS_VALUE: return memcmp(&a->attrs.value, &b->attrs.value, sizeof(double)) == 0;
    case LOOM_IR_ATTRS_PERM:
        return memcmp(a->attrs.perm, b->attrs.perm, (size_t)a->rank * sizeof(int32_t)) == 0;
    case LOOM_IR_ATTRS_AXES: return a->attrs.axes == b->attrs.axes && a->attrs.keepdim == b->attrs.keepdim;
    case LOOM_IR_ATTRS_SLICE:
    case LOOM_IR_ATTRS_PAD:
        if (loom_ir_op_table[a->op].attrs == LOOM_IR_ATTRS_PAD &&
            memcmp(&a->attrs.value, &b->attrs.value, sizeof(double)) != 0)
            return false;
        return memcmp(a->attrs.start, b->attrs.start, (size_t)a->rank * sizeof(int64_t)) == 0 &&
               memcmp(a->attrs.step, b->attrs.step, (size_t)a->rank * sizeof(int64_t)) == 0;
    case LOOM_IR_ATTRS_AXIS: return a->attrs.index == b->attrs.index;
    case LOOM_IR_ATTRS_REDUCE:
    case LOOM_IR_ATTRS_ATTENTION:
        return a->attrs.index == b->attrs.index &&
               memcmp(&a->attrs.value, &b->attrs.value, sizeof(double)) == 0 &&
               memcmp(&a->attrs.dropout, &b->attrs.dropout, sizeof(double)) == 0;
    case LOOM_IR_ATTRS_ROOT:
    case LOOM_IR_ATTRS_WORLD: return a->attrs.index == b->attrs.index;
    case LOOM_IR_ATTRS_CONV:
    case LOOM_IR_ATTRS_POOL: return loom_ir_conv_equal(&a->attrs.conv, &b->attrs.conv);
    case LOOM_IR_ATTRS_COUNT_: break;
    }
    return false;
}

bool loom_ir_graph_equal(const loom_ir_graph *a, const loom_ir_graph *b) {
    if (a->n_nodes != b->n_nodes || a->n_outputs != b->n_outputs)
        return false;
    for (int32_t i = 0; i < a->n_nodes; i++) {
        const loom_ir_node *x = &a->nodes[i], *y = &b->nodes[i];
        if (x->op != y->op || x->dtype != y->dtype || x->rank != y->rank ||
            x->n_inputs != y->n_inputs)
            return false;
        if (memcmp(x->shape, y->shape, (size_t)x->rank * sizeof x->shape[0]) != 0)
            return false;
        if (x->n_inputs && memcmp(x->inputs, y->inputs, (size_t)x->n_inputs * sizeof(int32_t)) != 0)
            return false;
        if (!loom_ir_attrs_equal(x, y))
            return false;
    }
    return a->n_outputs == 0 ||
           memcmp(a->outputs, b->outputs, (size_t)a->n_outputs * sizeof *a->outputs) == 0;
}

static inline uint64_t key_mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

uint64_t loom_ir_node_local_key(const loom_ir_node *n) {
    uint64_t value;
    memcpy(&value, &n->attrs.value, sizeof value);
    uint64_t h = key_mix((uint64_t)n->op, (uint64_t)n->dtype << 8 | (uint64_t)(uint32_t)n->rank);
    for (int32_t i = 0; i < n->rank; i++)
        h = key_mix(h, (uint64_t)n->shape[i]);
    h = key_mix(h, (uint64_t)n->attrs.index);
    h = key_mix(h, value);
    h = key_mix(h, (uint64_t)n->attrs.axes | (uint64_t)n->attrs.keepdim << 32);
    return key_mix(h, (uint64_t)n->attrs.autocast);
}
