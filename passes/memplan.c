/* Memory planning: where every materialized value of a fused plan lives, and the copies
 * that fill outputs after the kernels.
 *
 * Placements.
 *  - An INPUT node lives in the caller's input buffer; a RESHAPE shares the placement of the
 *    value it views (the first non-reshape down its chain), and its readers extend that
 *    value's lifetime.
 *  - A kernel result that is a graph output is written straight into the caller's output
 *    buffer: the first of its outputs that does not alias an input, or that aliases one
 *    and may overwrite it in place (loom_ir_plan_can_update_in_place: an elementwise root
 *    reading the input only at the index it writes, the input's last reader). Every other
 *    output of the same node, and every other output aliasing an input (donation), is
 *    filled by a copy after all kernels ran: kernels may still read the donated input until
 *    then. Outputs that are INPUT nodes or RESHAPEs are copies too.
 *  - Every other kernel result lives in the step's scratch arena.
 *  - Collective kernels (the runtime runs them on the host) write their values when they
 *    complete, before kernel wait_before: those values stay alive at least until then. A
 *    bucket (several all-reduces) puts its values end to end in one arena block, each
 *    64-byte aligned, which the communicator reduces as one range; outputs among them are
 *    copies.
 *
 * The arena (the subtle part). Kernels run in plan order 0..K-1. A value written by kernel s
 * and last read by kernel e (directly or through reshapes) is alive over [s, e]; a value
 * that a copy reads is alive to K (copies run after every kernel); a value nobody reads is
 * alive over [s, s]. Two values whose intervals intersect must not share bytes; in
 * particular a kernel's results never overlap its args (no in-place reuse: a fused kernel
 * may read an arg at another index than the one it writes, through a transpose or a
 * broadcast), but for a scatter_add's result, which takes the block of the base it sums onto
 * where that base dies at the scatter (loom_ir_plan_scatter_base: GPT-2's wte gradient and
 * cross-entropy's, 51 MB each, no longer held twice). The allocator is a linear scan over kernels
 * in order: before kernel k, free every value whose interval ended before k; then place each of k's
 * results in the smallest free gap between live blocks that fits (best fit; lowest offset on ties),
 * or, when none fits, right after the last live block, which grows the arena. Blocks are rounded to
 * 64 bytes and start 64-byte aligned (cache lines, vector loads). Live blocks are kept sorted by
 * offset, so the gaps are read off one walk over them: O(values x live) in all. arena_bytes is the
 * highest block end; peak_bytes adds the output buffers that do not alias inputs (the caller
 * allocates those; donated ones exist anyway).
 *
 * Copies. Copies run in plan order, one after the other, so a copy that writes a donated
 * input's buffer must come after every copy that reads that input (an output that is the
 * input itself, or a reshape of it). The copies are ordered by that rule, outputs order
 * otherwise; when outputs exchange donated inputs in a cycle no order works and planning
 * fails with UNSUPPORTED (loom_pass_build_plan breaks such cycles before planning).
 */
#include <string.h>

#include "passes.h"

enum { ALIGN = 64 };

typedef struct block {
    size_t offset, size;
    int32_t end; /* last kernel that reads the value */
} block;

/* Best fit among the gaps between live blocks (sorted by offset) and below top. */
static size_t place(const block *live, int32_t n_live, size_t size, size_t top) {
    size_t at = 0, best = SIZE_MAX, best_at = 0;
    for (int32_t b = 0; b < n_live; b++) {
        size_t gap = live[b].offset - at;
        if (gap >= size && gap < best) {
            best = gap;
            best_at = at;
        }
        at = live[b].offset + live[b].size;
    }
    if (top > at && top - at >= size && top - at < best) {
        best = top - at;
        best_at = at;
    }
    return best != SIZE_MAX ? best_at : at;
}

static size_t aligned(size_t bytes) {
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* Keeps live sorted by offset; grows top past the new block. */
static void add_live(block *live, int32_t *n_live, size_t *top, size_t at, size_t size,
                     int32_t end) {
    if (size == 0)
        return;
    int32_t pos = *n_live;
    while (pos > 0 && live[pos - 1].offset > at) {
        live[pos] = live[pos - 1];
        pos--;
    }
    live[pos] = (block){.offset = at, .size = size, .end = end};
    (*n_live)++;
    if (at + size > *top)
        *top = at + size;
}

/* Whether kernel k is a bucket: several all-reduces reduced as one flat range. */
static bool in_bucket(const loom_ir_plan *p, int32_t k) {
    return p->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE && p->kernels[k].n_results > 1;
}

static loom_status add_copy(loom_ir_plan *p, int32_t node, int32_t output) {
    if (!loom_ir_grow(&p->alloc, (void **)&p->copies, &p->cap_copies, p->n_copies + 1,
                      sizeof *p->copies))
        return LOOM_STATUS_OUT_OF_MEMORY;
    p->copies[p->n_copies++] = (loom_ir_copy){.node = node, .output = output};
    return LOOM_OK;
}

/* The input whose buffer copy c reads (-1: none) and writes (-1: none). */
static int32_t copy_reads(const loom_ir_graph *g, const loom_ir_copy *c) {
    const loom_ir_node *b = &g->nodes[loom_ir_view_base(g, c->node)];
    return b->op == LOOM_IR_OP_INPUT ? (int32_t)b->attrs.index : -1;
}

static int32_t copy_writes(const loom_ir_graph *g, const loom_ir_copy *c) {
    return g->outputs[c->output].alias;
}

/* Orders p's copies so that every copy writing a donated input's buffer follows the copies
 * that read that input. pending[i]: copies still to run that read input i (the writer of i
 * reading itself does not count: it copies a buffer onto itself). */
static loom_status order_copies(const loom_ir_graph *g, loom_ir_plan *p, int32_t *pending,
                                loom_ir_copy *tmp, loom_ir_diag *d) {
    int32_t n = p->n_copies;
    if (n == 0)
        return LOOM_OK;
    for (int32_t i = 0; i < g->n_graph_inputs; i++)
        pending[i] = 0;
    for (int32_t c = 0; c < n; c++) {
        int32_t r = copy_reads(g, &p->copies[c]);
        if (r >= 0 && r != copy_writes(g, &p->copies[c]))
            pending[r]++;
    }
    int32_t done = 0;
    memcpy(tmp, p->copies, (size_t)n * sizeof *tmp);
    int32_t n_left = n;
    while (n_left > 0) {
        int32_t kept = 0;
        for (int32_t c = 0; c < n_left; c++) {
            int32_t w = copy_writes(g, &tmp[c]);
            if (w >= 0 && pending[w] > 0) {
                tmp[kept++] = tmp[c];
                continue;
            }
            int32_t r = copy_reads(g, &tmp[c]);
            if (r >= 0 && r != w)
                pending[r]--;
            p->copies[done++] = tmp[c];
        }
        if (kept == n_left) {
            const loom_ir_copy *c = &tmp[0];
            return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                    "memplan: output %d (%%%d) is written into donated input %d "
                                    "while another output still reads that input, in a cycle "
                                    "of exchanged inputs; no order of copies can fill them",
                                    (int)c->output, (int)c->node, (int)copy_writes(g, c));
        }
        n_left = kept;
    }
    return LOOM_OK;
}

loom_status loom_pass_plan_memory(const loom_ir_graph *g, loom_ir_plan *p, loom_ir_diag *d) {
    if (!g || !p)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "memplan: %s is NULL",
                                !g ? "the graph" : "the plan");
    if (p->n_nodes != g->n_nodes)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "memplan: the plan is for %d nodes, the graph has %d",
                                (int)p->n_nodes, (int)g->n_nodes);
    p->n_copies = 0;
    p->arena_bytes = 0;
    p->peak_bytes = 0;
    int32_t n = g->n_nodes, K = p->n_kernels;
    for (int32_t i = 0; i < n; i++)
        p->has_placement[i] = false;
    if (n == 0)
        return LOOM_OK;

    size_t n_in = (size_t)g->n_graph_inputs, n_out = (size_t)g->n_outputs;
    size_t bytes = (size_t)n * (sizeof(block) + 2 * sizeof(int32_t) + sizeof(bool)) +
                   n_out * sizeof(loom_ir_copy) + n_in * sizeof(int32_t);
    block *live = loom_ir_alloc(&p->alloc, bytes);
    if (!live)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "memplan: out of memory");
    loom_ir_copy *tmp = (loom_ir_copy *)(live + n);
    int32_t *produced = (int32_t *)(tmp + n_out);
    int32_t *last = produced + n;
    int32_t *pending = last + n;
    bool *in_output = (bool *)(pending + n_in);
    for (int32_t i = 0; i < n; i++) {
        produced[i] = last[i] = -1;
        in_output[i] = false;
    }
    loom_status st = LOOM_OK;
    for (int32_t k = 0; k < K; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        for (int32_t r = 0; r < kn->n_results; r++)
            produced[kn->results[r]] = k;
        for (int32_t a = 0; a < kn->n_args; a++) {
            int32_t b = loom_ir_view_base(g, kn->args[a]);
            last[b] = k > last[b] ? k : last[b];
        }
    }

    /* outputs: straight into the caller's buffer where possible, else copies */
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++) {
        int32_t x = g->outputs[o].node;
        const loom_ir_node *nd = &g->nodes[x];
        if (nd->op != LOOM_IR_OP_INPUT && nd->op != LOOM_IR_OP_RESHAPE && produced[x] < 0) {
            st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL,
                                  "memplan: output %d (%%%d = %s) is written by no kernel", (int)o,
                                  (int)x, loom_ir_op_name(nd->op));
        } else if (produced[x] >= 0 && !in_output[x] && !in_bucket(p, produced[x]) &&
                   (g->outputs[o].alias < 0 || loom_ir_plan_can_update_in_place(p, g, o))) {
            in_output[x] = true;
            p->placement[x] = (loom_ir_placement){
                .kind = LOOM_IR_BUFFER_OUTPUT, .index = o, .bytes = loom_ir_node_bytes(nd)};
            p->has_placement[x] = true;
        } else {
            st = add_copy(p, x, o) == LOOM_OK
                     ? LOOM_OK
                     : loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "memplan: out of memory");
            last[loom_ir_view_base(g, x)] = K;
        }
        if (g->outputs[o].alias < 0)
            p->peak_bytes += loom_ir_node_bytes(nd);
    }

    /* inputs, then the arena by a linear scan over the kernels */
    for (int32_t i = 0; i < n; i++)
        if (g->nodes[i].op == LOOM_IR_OP_INPUT) {
            p->placement[i] = (loom_ir_placement){.kind = LOOM_IR_BUFFER_INPUT,
                                                  .index = (int32_t)g->nodes[i].attrs.index,
                                                  .bytes = loom_ir_node_bytes(&g->nodes[i])};
            p->has_placement[i] = true;
        }
    int32_t n_live = 0;
    size_t top = 0;
    for (int32_t k = 0; k < K && st == LOOM_OK; k++) {
        int32_t kept = 0;
        for (int32_t b = 0; b < n_live; b++)
            if (live[b].end >= k)
                live[kept++] = live[b];
        n_live = kept;
        const loom_ir_kernel *kn = &p->kernels[k];
        /* a bucket's values go end to end in one block, alive as long as any of them */
        bool bucket = in_bucket(p, k);
        size_t bucket_size = 0;
        int32_t bucket_end = k;
        for (int32_t r = 0; r < kn->n_results && bucket; r++) {
            bucket_size += aligned(loom_ir_node_bytes(&g->nodes[kn->results[r]]));
            bucket_end = last[kn->results[r]] > bucket_end ? last[kn->results[r]] : bucket_end;
        }
        size_t bucket_at = bucket_size > 0 ? place(live, n_live, bucket_size, top) : 0;
        for (int32_t r = 0; r < kn->n_results; r++) {
            int32_t x = kn->results[r];
            if (p->has_placement[x])
                continue; /* in its output buffer */
            size_t vb = loom_ir_node_bytes(&g->nodes[x]);
            size_t size = aligned(vb);
            /* a scatter's sums in the block of the base that dies here (its own block: not a
             * bucket's), which then lives on */
            int32_t base = x == kn->root && !bucket ? loom_ir_plan_scatter_base(p, g, k) : -1;
            int32_t reuse = -1;
            if (base >= 0 && last[base] == k && p->has_placement[base] &&
                p->placement[base].kind == LOOM_IR_BUFFER_ARENA)
                for (int32_t b = 0; b < n_live; b++)
                    if (live[b].offset == p->placement[base].offset && live[b].size == size)
                        reuse = b;
            if (reuse >= 0) {
                p->placement[x] = (loom_ir_placement){
                    .kind = LOOM_IR_BUFFER_ARENA, .offset = live[reuse].offset, .bytes = vb};
                p->has_placement[x] = true;
                int32_t end = last[x] > k ? last[x] : k;
                live[reuse].end = end > live[reuse].end ? end : live[reuse].end;
                continue;
            }
            size_t at = bucket ? bucket_at : size > 0 ? place(live, n_live, size, top) : 0;
            p->placement[x] =
                (loom_ir_placement){.kind = LOOM_IR_BUFFER_ARENA, .offset = at, .bytes = vb};
            p->has_placement[x] = true;
            if (bucket) {
                bucket_at += size;
                continue;
            }
            int32_t end = last[x] > k ? last[x] : k;
            if (kn->kind == LOOM_IR_KERNEL_COLLECTIVE && kn->wait_before > end)
                end = kn->wait_before; /* written when it completes */
            add_live(live, &n_live, &top, at, size, end);
        }
        if (bucket) {
            int32_t end = kn->wait_before > bucket_end ? kn->wait_before : bucket_end;
            add_live(live, &n_live, &top, bucket_at - bucket_size, bucket_size, end);
        }
    }
    p->arena_bytes = top;
    p->peak_bytes += top;

    /* views share their base's placement (operands come first: one sweep) */
    for (int32_t i = 0; i < n && st == LOOM_OK; i++) {
        if (g->nodes[i].op != LOOM_IR_OP_RESHAPE)
            continue;
        int32_t b = loom_ir_view_base(g, i);
        if (!p->has_placement[b])
            continue;
        p->placement[i] = p->placement[b];
        p->placement[i].bytes = loom_ir_node_bytes(&g->nodes[i]);
        p->has_placement[i] = true;
    }
    if (st == LOOM_OK)
        st = order_copies(g, p, pending, tmp, d);
    loom_ir_free(&p->alloc, live, bytes);
    return st;
}
