/* Kernels that can share code (plan.h: loom_ir_plan_share_kernels). A kernel's code depends
 * only on its own structure: codegen reads the nodes inside the kernel, their operands
 * (inside it or args) and the args' types, never which buffers they are placed in, since
 * buffers are passed at run time. So two kernels of the same structure (the repeated blocks
 * of a ResNet, a layer's forward and its recompute) are compiled once.
 *
 * Each kernel is described by a signature, an int64 sequence holding its kind, counts, the
 * args' types and, per node, its op, type, autocast tag and operands as kernel-local
 * references (arg i: -2 - i; node j: j), then its root and results the same way. Kernels
 * with equal signatures whose nodes also carry equal attributes (compared by
 * loom_ir_attrs_equal) share. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct sig {
    int64_t *v;
    int32_t n, cap;
    uint64_t hash;
    int32_t kernel;
} sig;

/* The kernel-local reference of node id: local[id] (arg i: -2 - i, node j: j), or INT64_MIN
 * when the kernel neither reads nor computes it (local[] is -1 off the kernel). */
static int64_t ref(const int32_t *local, int32_t id) {
    return local[id] == -1 ? INT64_MIN : local[id];
}

static bool build_sig(const loom_ir_plan *p, const loom_ir_graph *g, int32_t k, int32_t *local,
                      const loom_allocator *a, sig *out) {
    const loom_ir_kernel *kn = &p->kernels[k];
    int32_t cap = 8 + kn->n_results + 1;
    for (int32_t i = 0; i < kn->n_args; i++)
        cap += 3 + g->nodes[kn->args[i]].rank;
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        const loom_ir_node *n = &g->nodes[kn->nodes[j]];
        cap += 6 + n->rank + n->n_inputs;
    }
    int64_t *v = loom_ir_alloc(a, (size_t)cap * sizeof *v);
    if (!v)
        return false;
    /* arg i is -2 - i in local[] (so -1 stays "not in the kernel"), node j is j */
    for (int32_t i = 0; i < kn->n_args; i++)
        local[kn->args[i]] = -2 - i;
    for (int32_t j = 0; j < kn->n_nodes; j++)
        local[kn->nodes[j]] = j;
    int32_t n = 0;
    v[n++] = kn->kind;
    v[n++] = kn->n_args;
    v[n++] = kn->n_nodes;
    v[n++] = kn->n_results;
    for (int32_t i = 0; i < kn->n_args; i++) {
        const loom_ir_node *x = &g->nodes[kn->args[i]];
        v[n++] = x->dtype;
        v[n++] = x->rank;
        for (int32_t r = 0; r < x->rank; r++)
            v[n++] = x->shape[r];
    }
    for (int32_t j = 0; j < kn->n_nodes; j++) {
        const loom_ir_node *x = &g->nodes[kn->nodes[j]];
        v[n++] = x->op;
        v[n++] = x->dtype;
        v[n++] = x->attrs.autocast;
        v[n++] = x->rank;
        for (int32_t r = 0; r < x->rank; r++)
            v[n++] = x->shape[r];
        v[n++] = x->n_inputs;
        for (int32_t i = 0; i < x->n_inputs; i++)
            v[n++] = ref(local, x->inputs[i]);
    }
    v[n++] = ref(local, kn->root);
    for (int32_t i = 0; i < kn->n_results; i++)
        v[n++] = ref(local, kn->results[i]);
    for (int32_t i = 0; i < kn->n_args; i++)
        local[kn->args[i]] = -1;
    for (int32_t j = 0; j < kn->n_nodes; j++)
        local[kn->nodes[j]] = -1;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint64_t)v[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (int32_t j = 0; j < kn->n_nodes; j++) /* the attributes' values too */
        h = h * 31 + loom_ir_node_local_key(&g->nodes[kn->nodes[j]]);
    *out = (sig){.v = v, .n = n, .cap = cap, .hash = h, .kernel = k};
    return true;
}

static int cmp_sig(const void *x, const void *y) {
    const sig *a = x, *b = y;
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return (a->kernel > b->kernel) - (a->kernel < b->kernel);
}

static bool same(const loom_ir_plan *p, const loom_ir_graph *g, const sig *a, const sig *b) {
    if (a->n != b->n || memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v) != 0)
        return false;
    const loom_ir_kernel *ka = &p->kernels[a->kernel], *kb = &p->kernels[b->kernel];
    for (int32_t j = 0; j < ka->n_nodes; j++)
        if (!loom_ir_attrs_equal(&g->nodes[ka->nodes[j]], &g->nodes[kb->nodes[j]]))
            return false;
    return true;
}

loom_status loom_ir_plan_share_kernels(const loom_ir_plan *p, const loom_ir_graph *g, int32_t *rep,
                                       int32_t *out_distinct) {
    int32_t nk = p->n_kernels;
    const loom_allocator *a = &p->alloc;
    size_t sigs_bytes = (size_t)(nk > 0 ? nk : 1) * sizeof(sig);
    size_t local_bytes = (size_t)(g->n_nodes > 0 ? g->n_nodes : 1) * sizeof(int32_t);
    sig *sigs = loom_ir_alloc(a, sigs_bytes);
    int32_t *local = loom_ir_alloc(a, local_bytes);
    int32_t n_sigs = 0;
    loom_status st = sigs && local ? LOOM_OK : LOOM_STATUS_OUT_OF_MEMORY;
    if (local)
        memset(local, 0xff, local_bytes); /* -1 */
    for (int32_t k = 0; k < nk; k++)
        rep[k] = k;
    for (int32_t k = 0; k < nk && st == LOOM_OK; k++) {
        if (p->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE)
            continue; /* run by the runtime: no code */
        if (!build_sig(p, g, k, local, a, &sigs[n_sigs]))
            st = LOOM_STATUS_OUT_OF_MEMORY;
        else
            n_sigs++;
    }
    int32_t distinct = nk;
    if (st == LOOM_OK) {
        qsort(sigs, (size_t)n_sigs, sizeof *sigs, cmp_sig);
        /* within a run of equal hashes (sorted by kernel), each kernel takes the first
         * earlier one it equals */
        for (int32_t s = 0; s < n_sigs;) {
            int32_t e = s;
            while (e < n_sigs && sigs[e].hash == sigs[s].hash)
                e++;
            for (int32_t i = s + 1; i < e; i++)
                for (int32_t j = s; j < i; j++)
                    if (rep[sigs[j].kernel] == sigs[j].kernel && same(p, g, &sigs[i], &sigs[j])) {
                        rep[sigs[i].kernel] = sigs[j].kernel;
                        distinct--;
                        break;
                    }
            s = e;
        }
    }
    for (int32_t s = 0; s < n_sigs; s++)
        loom_ir_free(a, sigs[s].v, (size_t)sigs[s].cap * sizeof *sigs[s].v);
    if (sigs)
        loom_ir_free(a, sigs, sigs_bytes);
    if (local)
        loom_ir_free(a, local, local_bytes);
    if (out_distinct)
        *out_distinct = distinct;
    return st;
}
