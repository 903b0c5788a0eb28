/* All-reduce bucketing: the fused plan's ALL_REDUCE kernels (one per gradient, as the user
 * wrote them) become flat buckets reduced as one range each, started as soon as their last
 * gradient is computed and waited on just before their first reader, so the communication
 * overlaps the rest of backward (PyTorch DDP's reducer, done by the compiler).
 *
 * Rules.
 *  - Candidates: COLLECTIVE kernels holding one ALL_REDUCE whose operand is not itself the
 *    value of a collective (that one must wait for the other; it stays where it is). Other
 *    collectives (broadcasts, all-gathers) stay where they are.
 *  - "Ready" is the kernel that computes the operand (through reshapes; -1 for a graph
 *    input). Candidates are taken in ready order, which is the order backward produces the
 *    gradients: the last layer's first (ties: the order the user recorded them).
 *  - One bucket is open per (dtype, reduce op, scale): 16-bit gradients reduce apart from
 *    f32 ones, and the 1/world_size scale stays one scale per bucket, applied once. A
 *    candidate joins the open bucket of its key; the bucket closes once it holds at least
 *    bucket_bytes (so 0 gives one bucket per gradient, and a huge threshold one per key).
 *    A candidate also starts a new bucket when joining would move the bucket's start past
 *    the first reader of a member, or when the bucket already reduces its operand.
 *  - Each bucket starts right after its last member's ready kernel and is waited on before
 *    the first kernel that reads any member's value (the end of the plan when only copies
 *    do); memory planning lays its values end to end (passes/memplan.c). The other kernels
 *    keep their order.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct cand {
    int32_t kernel; /* its COLLECTIVE kernel before the pass */
    int32_t node;   /* the ALL_REDUCE */
    int32_t ready;  /* the kernel computing its operand, -1 for an input */
    int32_t first_reader;
    size_t bytes;
    int32_t bucket;
} cand;

typedef struct bucket {
    int32_t first, n; /* members: cands[order[first .. first + n)] */
    int32_t start;    /* the latest ready kernel of its members (it starts right after) */
    int32_t limit;    /* the earliest first reader of its members */
    size_t bytes;
    bool open;
} bucket;

static int cmp_ready(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->ready != y->ready)
        return x->ready < y->ready ? -1 : 1;
    return (x->kernel > y->kernel) - (x->kernel < y->kernel);
}

static bool same_key(const loom_ir_node *a, const loom_ir_node *b) {
    return a->dtype == b->dtype && a->attrs.index == b->attrs.index &&
           a->attrs.value == b->attrs.value;
}

/* The kernel producing value x (through views), or -1 for inputs and constants. */
static int32_t producer(const loom_ir_graph *g, const loom_ir_plan *p, int32_t x) {
    return p->node_kernel[loom_ir_view_base(g, x)];
}

/* first_reader[k]: the first kernel after k that reads (through views) a result of kernel k,
 * or n_kernels when none does (copies read after every kernel). */
static void first_readers(const loom_ir_graph *g, const loom_ir_plan *p, int32_t *first_reader) {
    for (int32_t k = 0; k < p->n_kernels; k++)
        first_reader[k] = p->n_kernels;
    for (int32_t k = p->n_kernels - 1; k >= 0; k--) {
        const loom_ir_kernel *kn = &p->kernels[k];
        for (int32_t a = 0; a < kn->n_args; a++) {
            int32_t w = producer(g, p, kn->args[a]);
            if (w >= 0 && w < k)
                first_reader[w] = k;
        }
    }
}

typedef struct bstate {
    const loom_ir_graph *g;
    loom_ir_plan *p;
    cand *cands;
    int32_t n_cands;
    bucket *buckets;
    int32_t n_buckets;
    int32_t *members; /* candidate indices grouped by bucket */
} bstate;

/* Groups the candidates (sorted by ready) into buckets. */
static void fill_buckets(bstate *s, int64_t bucket_bytes) {
    const loom_ir_graph *g = s->g;
    int32_t *owner = s->members; /* scratch first: the bucket of each candidate */
    for (int32_t c = 0; c < s->n_cands; c++) {
        cand *cd = &s->cands[c];
        const loom_ir_node *n = &g->nodes[cd->node];
        int32_t b = -1;
        for (int32_t o = 0; o < s->n_buckets && b < 0; o++) {
            bucket *bk = &s->buckets[o];
            if (!bk->open || !same_key(n, &g->nodes[s->cands[bk->first].node]))
                continue;
            int32_t start = cd->ready > bk->start ? cd->ready : bk->start;
            int32_t limit = cd->first_reader < bk->limit ? cd->first_reader : bk->limit;
            bool dup = false;
            for (int32_t m = 0; m < c && !dup; m++)
                dup = owner[m] == o && g->nodes[s->cands[m].node].inputs[0] == n->inputs[0];
            if (start >= limit || dup)
                bk->open = false; /* closes: the candidate starts the next one */
            else
                b = o;
        }
        if (b < 0) {
            b = s->n_buckets++;
            s->buckets[b] =
                (bucket){.first = c, .start = cd->ready, .limit = cd->first_reader, .open = true};
        }
        bucket *bk = &s->buckets[b];
        owner[c] = b;
        cd->bucket = b;
        bk->n++;
        bk->bytes += cd->bytes;
        bk->start = cd->ready > bk->start ? cd->ready : bk->start;
        bk->limit = cd->first_reader < bk->limit ? cd->first_reader : bk->limit;
        if (bucket_bytes >= 0 && bk->bytes >= (uint64_t)bucket_bytes)
            bk->open = false;
    }
    /* members grouped by bucket, each group in candidate (ready) order */
    int32_t at = 0;
    for (int32_t b = 0; b < s->n_buckets; b++) {
        s->buckets[b].first = at;
        at += s->buckets[b].n;
        s->buckets[b].n = 0;
    }
    for (int32_t c = 0; c < s->n_cands; c++) {
        bucket *bk = &s->buckets[s->cands[c].bucket];
        s->members[bk->first + bk->n++] = c;
    }
}

/* The kernel list in its new order: old kernels (bucketed ones left out) with each bucket
 * right after the kernel it starts after. order[j] >= 0: old kernel; < 0: bucket -order - 1. */
static int32_t new_order(const bstate *s, const bool *moved, int32_t *order) {
    int32_t n = 0;
    for (int32_t k = -1; k < s->p->n_kernels; k++) {
        if (k >= 0 && !moved[k])
            order[n++] = k;
        for (int32_t b = 0; b < s->n_buckets; b++)
            if (s->buckets[b].start == k)
                order[n++] = -b - 1;
    }
    return n;
}

static loom_status build_bucket(bstate *s, int32_t b, loom_ir_kernel *out) {
    const bucket *bk = &s->buckets[b];
    loom_ir_arena *ar = &s->p->arena;
    int32_t *nodes = loom_ir_arena_alloc(ar, (size_t)bk->n * sizeof *nodes);
    int32_t *args = loom_ir_arena_alloc(ar, (size_t)bk->n * sizeof *args);
    int32_t *results = loom_ir_arena_alloc(ar, (size_t)bk->n * sizeof *results);
    if (!nodes || !args || !results)
        return LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t m = 0; m < bk->n; m++)
        nodes[m] = s->cands[s->members[bk->first + m]].node;
    qsort(nodes, (size_t)bk->n, sizeof *nodes, loom_ir_cmp_i32); /* the plan's rule: graph order */
    for (int32_t m = 0; m < bk->n; m++) {
        args[m] = s->g->nodes[nodes[m]].inputs[0];
        results[m] = nodes[m];
    }
    *out = (loom_ir_kernel){.kind = LOOM_IR_KERNEL_COLLECTIVE,
                            .root = nodes[0],
                            .n_nodes = bk->n,
                            .nodes = nodes,
                            .n_args = bk->n,
                            .args = args,
                            .n_results = bk->n,
                            .results = results};
    return LOOM_OK;
}

loom_status loom_pass_bucket_allreduces(const loom_ir_graph *g, loom_ir_plan *p,
                                        int64_t bucket_bytes, loom_ir_diag *d) {
    if (!g || !p)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "buckets: %s is NULL",
                                !g ? "the graph" : "the plan");
    int32_t K = p->n_kernels, n_cands = 0;
    for (int32_t k = 0; k < K; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        n_cands += kn->kind == LOOM_IR_KERNEL_COLLECTIVE && kn->n_nodes == 1 &&
                   g->nodes[kn->root].op == LOOM_IR_OP_ALL_REDUCE;
    }
    if (n_cands == 0)
        return LOOM_OK;
    size_t bytes = (size_t)n_cands * (sizeof(cand) + sizeof(bucket) + sizeof(int32_t)) +
                   (size_t)K * (sizeof(int32_t) + sizeof(bool)) +
                   (size_t)(K + n_cands) * (sizeof(int32_t) + sizeof(loom_ir_kernel));
    void *block = loom_ir_alloc(&p->alloc, bytes);
    if (!block)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "buckets: out of memory");
    bstate s = {.g = g, .p = p};
    s.cands = block;
    s.buckets = (bucket *)(s.cands + n_cands);
    loom_ir_kernel *kernels = (loom_ir_kernel *)(s.buckets + n_cands);
    s.members = (int32_t *)(kernels + K + n_cands);
    int32_t *first_reader = s.members + n_cands;
    int32_t *order = first_reader + K; /* K + n_cands */
    bool *moved = (bool *)(order + K + n_cands);
    first_readers(g, p, first_reader);
    for (int32_t k = 0; k < K; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        moved[k] = false;
        if (kn->kind != LOOM_IR_KERNEL_COLLECTIVE || kn->n_nodes != 1 ||
            g->nodes[kn->root].op != LOOM_IR_OP_ALL_REDUCE)
            continue;
        int32_t ready = producer(g, p, g->nodes[kn->root].inputs[0]);
        if (ready >= 0 && p->kernels[ready].kind == LOOM_IR_KERNEL_COLLECTIVE)
            continue; /* reduces a collective's value: stays after it */
        moved[k] = true;
        s.cands[s.n_cands++] = (cand){.kernel = k,
                                      .node = kn->root,
                                      .ready = ready,
                                      .first_reader = first_reader[k],
                                      .bytes = loom_ir_node_bytes(&g->nodes[kn->root])};
    }
    qsort(s.cands, (size_t)s.n_cands, sizeof *s.cands, cmp_ready);
    fill_buckets(&s, bucket_bytes);

    int32_t n_new = new_order(&s, moved, order);
    loom_status st = LOOM_OK;
    for (int32_t j = 0; j < n_new && st == LOOM_OK; j++) {
        if (order[j] >= 0) {
            kernels[j] = p->kernels[order[j]];
        } else {
            st = build_bucket(&s, -order[j] - 1, &kernels[j]);
        }
    }
    if (st == LOOM_OK &&
        !loom_ir_grow(&p->alloc, (void **)&p->kernels, &p->cap_kernels, n_new, sizeof *p->kernels))
        st = LOOM_STATUS_OUT_OF_MEMORY;
    if (st != LOOM_OK) {
        loom_ir_free(&p->alloc, block, bytes);
        return loom_ir_diag_set(d, st, "buckets: out of memory");
    }
    memcpy(p->kernels, kernels, (size_t)n_new * sizeof *kernels);
    p->n_kernels = n_new;
    for (int32_t j = 0; j < n_new; j++)
        for (int32_t m = 0; m < p->kernels[j].n_nodes; m++)
            if (g->nodes[p->kernels[j].nodes[m]].op != LOOM_IR_OP_CONSTANT)
                p->node_kernel[p->kernels[j].nodes[m]] = j;
    /* every collective is waited on before its first reader in the new order */
    first_readers(g, p, first_reader);
    for (int32_t j = 0; j < n_new; j++)
        if (p->kernels[j].kind == LOOM_IR_KERNEL_COLLECTIVE)
            p->kernels[j].wait_before = first_reader[j];
    loom_ir_free(&p->alloc, block, bytes);
    return LOOM_OK;
}
