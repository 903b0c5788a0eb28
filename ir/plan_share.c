/* Kernels that can share code (plan.h: loom_ir_plan_share_kernels). A kernel's code depends
 * only on its own structure: codegen reads the nodes inside the kernel, their operands
 * (inside it or args) and the args' types, never which buffers they are placed in, since
 * buffers are passed at run time. So two kernels of the same structure (the repeated blocks
 * of a ResNet, a layer's forward and its recompute) are compiled once.
 *
 * Each kernel is described by a signature, an int64 sequence holding its kind, counts, the
 * args' types and, per node, its op, type, autocast tag and operands as kernel-local
 * references (arg i: -2 - i; node j: j), then its root and results the same way. The nodes
 * go in an order of their own structure (canonical_order), not the graph's: a constant that
 * CSE merged into the first block's (the ReLU mask's zeros) stands after the root in the
 * first block's kernels and before it in the later ones', which kept ResNet-50's bf16 step
 * at 224x224 from sharing 28 of the 241 kernels it compiled. Kernels with equal signatures
 * whose nodes also carry equal attributes (compared by loom_ir_attrs_equal) share. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct sig {
    int64_t *v;
    int32_t *ord; /* the kernel's nodes in canonical order */
    int32_t n, cap, n_nodes;
    uint64_t hash;
    int32_t kernel;
} sig;

/* The kernel-local reference of node id: local[id] (arg i: -2 - i, node j: j), or INT64_MIN
 * when the kernel neither reads nor computes it (local[] is -1 off the kernel). */
static int64_t ref(const int32_t *local, int32_t id) {
    return local[id] == -1 ? INT64_MIN : local[id];
}

/* Kernel kn's nodes (their ids) into ord in an order that depends on the kernel's structure
 * only: each node after the kernel nodes it reads (inputs in order, depth first), starting
 * from its results in order, then its root, then any node neither reaches (kernel order).
 * local[id] is node id's position in kn->nodes (>= 0) for the kernel's nodes; seen and
 * stack are scratch of n_nodes and 2 n_nodes. */
static void canonical_order(const loom_ir_graph *g, const loom_ir_kernel *kn, const int32_t *local,
                            int32_t *ord, uint8_t *seen, int32_t *stack) {
    int32_t n = 0;
    memset(seen, 0, (size_t)kn->n_nodes);
    for (int32_t s = 0; s < kn->n_results + 1 + kn->n_nodes; s++) {
        int32_t start = s < kn->n_results    ? kn->results[s]
                        : s == kn->n_results ? kn->root
                                             : kn->nodes[s - kn->n_results - 1];
        int32_t p0 = start >= 0 && start < g->n_nodes ? local[start] : -1;
        if (p0 < 0 || seen[p0])
            continue;
        int32_t top = 0;
        seen[p0] = 1;
        stack[0] = p0, stack[1] = 0;
        while (top >= 0) {
            int32_t pos = stack[2 * top], *next = &stack[2 * top + 1];
            const loom_ir_node *x = &g->nodes[kn->nodes[pos]];
            if (*next < x->n_inputs) {
                int32_t q = local[x->inputs[(*next)++]];
                if (q >= 0 && !seen[q]) {
                    seen[q] = 1;
                    top++;
                    stack[2 * top] = q, stack[2 * top + 1] = 0;
                }
                continue;
            }
            ord[n++] = kn->nodes[pos];
            top--;
        }
    }
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
    size_t nn = (size_t)(kn->n_nodes > 0 ? kn->n_nodes : 1);
    int64_t *v = loom_ir_alloc(a, (size_t)cap * sizeof *v);
    int32_t *ord = loom_ir_alloc(a, nn * sizeof *ord);
    int32_t *stack = loom_ir_alloc(a, 2 * nn * sizeof *stack);
    uint8_t *seen = loom_ir_alloc(a, nn);
    if (!v || !ord || !stack || !seen) { /* loom_ir_free ignores NULL */
        loom_ir_free(a, v, (size_t)cap * sizeof *v);
        loom_ir_free(a, ord, nn * sizeof *ord);
        loom_ir_free(a, stack, 2 * nn * sizeof *stack);
        loom_ir_free(a, seen, nn);
        return false;
    }
    /* arg i is -2 - i in local[] (so -1 stays "not in the kernel"), node j is the j-th in
     * canonical order */
    for (int32_t i = 0; i < kn->n_args; i++)
        local[kn->args[i]] = -2 - i;
    for (int32_t j = 0; j < kn->n_nodes; j++)
        local[kn->nodes[j]] = j;
    canonical_order(g, kn, local, ord, seen, stack);
    loom_ir_free(a, stack, 2 * nn * sizeof *stack);
    loom_ir_free(a, seen, nn);
    for (int32_t j = 0; j < kn->n_nodes; j++)
        local[ord[j]] = j;
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
        const loom_ir_node *x = &g->nodes[ord[j]];
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
        h = h * 31 + loom_ir_node_local_key(&g->nodes[ord[j]]);
    *out = (sig){
        .v = v, .ord = ord, .n = n, .cap = cap, .n_nodes = kn->n_nodes, .hash = h, .kernel = k};
    return true;
}

static int cmp_sig(const void *x, const void *y) {
    const sig *a = x, *b = y;
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return (a->kernel > b->kernel) - (a->kernel < b->kernel);
}

static bool same(const loom_ir_graph *g, const sig *a, const sig *b) {
    if (a->n != b->n || memcmp(a->v, b->v, (size_t)a->n * sizeof *a->v) != 0)
        return false;
    for (int32_t j = 0; j < a->n_nodes; j++)
        if (!loom_ir_attrs_equal(&g->nodes[a->ord[j]], &g->nodes[b->ord[j]]))
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
                    if (rep[sigs[j].kernel] == sigs[j].kernel && same(g, &sigs[i], &sigs[j])) {
                        rep[sigs[i].kernel] = sigs[j].kernel;
                        distinct--;
                        break;
                    }
            s = e;
        }
    }
    for (int32_t s = 0; s < n_sigs; s++) {
        loom_ir_free(a, sigs[s].v, (size_t)sigs[s].cap * sizeof *sigs[s].v);
        loom_ir_free(a, sigs[s].ord,
                     (size_t)(sigs[s].n_nodes > 0 ? sigs[s].n_nodes : 1) * sizeof *sigs[s].ord);
    }
    if (sigs)
        loom_ir_free(a, sigs, sigs_bytes);
    if (local)
        loom_ir_free(a, local, local_bytes);
    if (out_distinct)
        *out_distinct = distinct;
    return st;
}
