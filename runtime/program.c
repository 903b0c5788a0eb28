/* Program executables: run a plan's compiled kernels on the thread pool over the caller's
 * buffers and a scratch arena cached between runs, then the plan's copies. Its COLLECTIVE
 * kernels run here on the host through the communicator (collective.h): an all-reduce
 * starts where its kernel stands and is waited on before kernel wait_before, the MPI
 * requests in flight being polled between kernels so communication overlaps them. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "bulk.h"
#include "collective.h"
#include "kernel.h"
#include "trace.h"

/* Where a value lives, resolved at create time so a run only adds base pointers: placements
 * of RESHAPEs are followed to their operand's, INPUT nodes without one get their own. */
typedef struct slot {
    loom_ir_buffer_kind kind;
    int32_t index;
    size_t offset; /* ARENA only */
} slot;

typedef struct prog_kernel {
    loom_rt_kernel k;            /* fn NULL for a collective */
    int32_t first_slot, n_slots; /* args then results, into program.slots */
    int32_t coll;                /* into program.colls, or -1 */
    int32_t per_thread;          /* chunks a thread (loom_rt_pool_parallel_for_ex) */
} prog_kernel;

/* Chunks a thread for elementwise kernels, whose tasks cost nothing to start: a thread
 * whose core the host thread shares (tracing the next step while this one runs) then takes
 * fewer chunks instead of holding the other up. Matmul kernels (matmuls, convolutions,
 * pools) keep one chunk a thread: each chunk packs its operands anew, and more chunks made
 * ResNet-50's convolutions slower (5818bcc). So do reductions: 4 chunks a thread
 * made batch norm's sums 5-10% slower at 64x64 (each chunk sets up and sums its own
 * accumulators). */
enum { PROG_SPLIT_PER_THREAD = 4 };

/* A COLLECTIVE kernel: one collective, or a bucket of all-reduces whose values lie end to
 * end from the first result's buffer (memplan), reduced as count elements in place. */
typedef struct prog_coll {
    int32_t kernel, node; /* node: the first collective (the bucket's attributes) */
    int32_t n_members;    /* args, then as many results, from the kernel's first slot */
    int32_t first_member; /* into program.coll_nodes */
    int32_t wait_before;
    size_t count;              /* all-reduce: elements reduced, padding between members too */
    loom_rt_comm_request *req; /* in flight; NULL when done */
    int64_t t_start;           /* when it started (traced runs) */
    bool in_flight;
} prog_coll;

typedef struct prog_copy {
    slot src;
    int32_t output;
    size_t bytes;
} prog_copy;

typedef struct program {
    loom_rt_executable base; /* first: the executable API casts between the two */
    loom_rt_pool *pool;      /* borrowed */
    void *code_owner;
    void (*release_code)(void *code_owner);
    prog_kernel *kernels;
    int32_t n_kernels;
    slot *slots;
    void **bufs; /* n_slots pointers, rewritten by each run: why runs must be sequential */
    int32_t n_slots;
    prog_copy *copies;
    int32_t n_copies;
    prog_coll *colls;
    int32_t n_colls;
    /* the graph the plan is for (base.graph becomes the graph as traced, which the cache
     * compares): its collective nodes' attributes and source lines; empty without any */
    loom_ir_graph coll_graph;
    int32_t *coll_nodes; /* every collective kernel's nodes, in kernel order */
    int32_t n_coll_nodes;
    int32_t n_in_flight;
    uint64_t coll_digest; /* of the collectives in plan order, for loom_rt_collectives_agree */
    uint64_t step_digest; /* with the traced graph's hash (loom_rt_step_digest), at the first
                             run: base.graph is the graph as traced by then */
    bool step_digest_ready;
    size_t *input_bytes;  /* per graph input: its value's size */
    size_t *output_bytes; /* per graph output */
    size_t arena_bytes;
    loom_rt_buffer *arena; /* kept between runs; NULL until the first run or prepare */
    atomic_bool running;   /* catches overlapping runs, which would share arena and bufs */
    loom_rt_profile_kernel *prof; /* per kernel, owned by the profile; NULL: not timed */
    loom_rt_trace *trace;         /* borrowed; NULL: not traced */
    char (*trace_names)[352];     /* per kernel while traced: "k3 matmul f32[64,10] a.c:9" */
} program;

/* n elements of size each from a (NULL for n == 0); false on out-of-memory. */
static bool alloc_array(const loom_allocator *a, void **out, int32_t n, size_t size) {
    *out = NULL;
    if (n <= 0)
        return true;
    *out = loom_ir_alloc(a, (size_t)n * size);
    if (*out)
        memset(*out, 0, (size_t)n * size);
    return *out != NULL;
}

static void program_destroy(loom_rt_executable *exe) {
    if (!exe)
        return;
    program *p = (program *)exe;
    loom_allocator a = p->base.alloc;
    loom_rt_buffer_release(p->arena);
    const loom_ir_graph *g = &p->base.graph;
    loom_ir_free(&a, p->kernels, (size_t)p->n_kernels * sizeof *p->kernels);
    loom_ir_free(&a, p->slots, (size_t)p->n_slots * sizeof *p->slots);
    loom_ir_free(&a, p->bufs, (size_t)p->n_slots * sizeof *p->bufs);
    loom_ir_free(&a, p->copies, (size_t)p->n_copies * sizeof *p->copies);
    loom_ir_free(&a, p->colls, (size_t)p->n_colls * sizeof *p->colls);
    if (p->trace_names)
        loom_ir_free(&a, p->trace_names, (size_t)p->n_kernels * sizeof *p->trace_names);
    loom_ir_free(&a, p->coll_nodes, (size_t)p->n_coll_nodes * sizeof *p->coll_nodes);
    loom_ir_free(&a, p->input_bytes, (size_t)g->n_graph_inputs * sizeof *p->input_bytes);
    loom_ir_free(&a, p->output_bytes, (size_t)g->n_outputs * sizeof *p->output_bytes);
    loom_ir_graph_deinit(&p->base.graph);
    loom_ir_graph_deinit(&p->coll_graph);
    if (p->release_code)
        p->release_code(p->code_owner);
    loom_ir_free(&a, p, sizeof *p);
}

/* Resolves where node's value lives and checks that its bytes fit there. */
static bool resolve_slot(const program *p, const loom_ir_plan *plan, int32_t node, slot *out) {
    const loom_ir_graph *g = &p->base.graph;
    if (node < 0 || node >= g->n_nodes)
        return false;
    size_t bytes = loom_ir_node_bytes(&g->nodes[node]);
    /* A RESHAPE is its operand's bytes: follow the chain to the first placed value. */
    int32_t at = node;
    while (!plan->has_placement[at] && g->nodes[at].op == LOOM_IR_OP_RESHAPE)
        at = g->nodes[at].inputs[0];
    loom_ir_placement pl;
    if (plan->has_placement[at]) {
        pl = plan->placement[at];
    } else if (g->nodes[at].op == LOOM_IR_OP_INPUT) {
        pl = (loom_ir_placement){.kind = LOOM_IR_BUFFER_INPUT,
                                 .index = (int32_t)g->nodes[at].attrs.index};
    } else {
        return false;
    }
    *out = (slot){.kind = pl.kind, .index = pl.index, .offset = pl.offset};
    switch (pl.kind) {
    case LOOM_IR_BUFFER_INPUT:
        return pl.index >= 0 && pl.index < g->n_graph_inputs && bytes <= p->input_bytes[pl.index];
    case LOOM_IR_BUFFER_OUTPUT:
        return pl.index >= 0 && pl.index < g->n_outputs && bytes <= p->output_bytes[pl.index];
    case LOOM_IR_BUFFER_ARENA:
        return pl.offset <= p->arena_bytes && bytes <= p->arena_bytes - pl.offset;
    case LOOM_IR_BUFFER_COUNT_:
        return false;
    }
    return false;
}

/* Collective kernel k (its slots resolved): one collective whose operand and value are its
 * only arg and result, or a bucket whose values lie end to end in the arena. */
static loom_status build_collective(program *p, const loom_ir_plan *plan, int32_t k,
                                    prog_coll *out) {
    const loom_ir_graph *g = &p->base.graph;
    const loom_ir_kernel *pk = &plan->kernels[k];
    const prog_kernel *pr = &p->kernels[k];
    if (pk->n_nodes < 1 || pk->n_args != pk->n_nodes || pk->n_results != pk->n_nodes ||
        pk->wait_before <= k || pk->wait_before > plan->n_kernels)
        return LOOM_STATUS_INVALID_ARGUMENT;
    const loom_ir_node *first = &g->nodes[pk->nodes[0]], *x = &g->nodes[first->inputs[0]];
    size_t count = (size_t)loom_ir_numel(x->rank, x->shape);
    for (int32_t j = 0; j < pk->n_nodes; j++) {
        const loom_ir_node *n = &g->nodes[pk->nodes[j]];
        if (pk->results[j] != pk->nodes[j] || n->inputs[0] != pk->args[j] ||
            !loom_ir_op_traits(n->op)->ranks)
            return LOOM_STATUS_INVALID_ARGUMENT;
        if (j == 0)
            continue;
        /* a bucket: all-reduces alike, each right after the previous, 64-byte aligned */
        const slot *prev = &p->slots[pr->first_slot + pk->n_args + j - 1];
        const slot *at = &p->slots[pr->first_slot + pk->n_args + j];
        size_t prev_bytes = loom_ir_node_bytes(&g->nodes[pk->nodes[j - 1]]);
        if (n->op != LOOM_IR_OP_ALL_REDUCE || first->op != LOOM_IR_OP_ALL_REDUCE ||
            n->dtype != first->dtype || n->attrs.index != first->attrs.index ||
            n->attrs.value != first->attrs.value || prev->kind != LOOM_IR_BUFFER_ARENA ||
            at->kind != LOOM_IR_BUFFER_ARENA ||
            at->offset != prev->offset + (prev_bytes + 63) / 64 * 64)
            return LOOM_STATUS_INVALID_ARGUMENT;
        count = (at->offset - p->slots[pr->first_slot + pk->n_args].offset) /
                    loom_dtype_size(n->dtype) +
                (size_t)loom_ir_numel(n->rank, n->shape);
    }
    *out = (prog_coll){.kernel = k,
                       .node = pk->nodes[0],
                       .n_members = pk->n_nodes,
                       .wait_before = pk->wait_before,
                       .count = count};
    p->coll_digest = loom_rt_collective_digest(p->coll_digest, first, count);
    return LOOM_OK;
}

static loom_status build(program *p, const loom_ir_plan *plan, const loom_rt_kernel *kernels) {
    const loom_ir_graph *g = &p->base.graph;
    const loom_allocator *a = &p->base.alloc;
    if (!alloc_array(a, (void **)&p->input_bytes, g->n_graph_inputs, sizeof *p->input_bytes) ||
        !alloc_array(a, (void **)&p->output_bytes, g->n_outputs, sizeof *p->output_bytes))
        return LOOM_STATUS_OUT_OF_MEMORY;
    /* run() indexes the caller's arrays with these: check them even if g was verified. */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        if (n->attrs.index < 0 || n->attrs.index >= g->n_graph_inputs)
            return LOOM_STATUS_INVALID_ARGUMENT;
        p->input_bytes[n->attrs.index] = loom_ir_node_bytes(n);
    }
    for (int32_t o = 0; o < g->n_outputs; o++) {
        if (g->outputs[o].node < 0 || g->outputs[o].node >= g->n_nodes)
            return LOOM_STATUS_INVALID_ARGUMENT;
        p->output_bytes[o] = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]);
    }

    int32_t n_slots = 0;
    for (int32_t k = 0; k < plan->n_kernels; k++) {
        const loom_ir_kernel *pk = &plan->kernels[k];
        if (pk->n_args < 0 || pk->n_results < 0 || pk->n_args > INT32_MAX - pk->n_results ||
            n_slots > INT32_MAX - pk->n_args - pk->n_results)
            return LOOM_STATUS_INVALID_ARGUMENT;
        n_slots += pk->n_args + pk->n_results;
    }
    p->n_kernels = plan->n_kernels;
    p->n_slots = n_slots;
    p->n_copies = plan->n_copies;
    p->n_colls = p->n_coll_nodes = 0;
    for (int32_t k = 0; k < plan->n_kernels; k++)
        if (plan->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE) {
            p->n_colls++;
            p->n_coll_nodes += plan->kernels[k].n_nodes;
        }
    if (!alloc_array(a, (void **)&p->kernels, p->n_kernels, sizeof *p->kernels) ||
        !alloc_array(a, (void **)&p->slots, p->n_slots, sizeof *p->slots) ||
        !alloc_array(a, (void **)&p->bufs, p->n_slots, sizeof *p->bufs) ||
        !alloc_array(a, (void **)&p->copies, p->n_copies, sizeof *p->copies) ||
        !alloc_array(a, (void **)&p->colls, p->n_colls, sizeof *p->colls) ||
        !alloc_array(a, (void **)&p->coll_nodes, p->n_coll_nodes, sizeof *p->coll_nodes))
        return LOOM_STATUS_OUT_OF_MEMORY;

    int32_t s = 0, nc = 0, m = 0;
    for (int32_t k = 0; k < plan->n_kernels; k++) {
        const loom_ir_kernel *pk = &plan->kernels[k];
        const loom_rt_kernel *rk = &kernels[k];
        bool coll = pk->kind == LOOM_IR_KERNEL_COLLECTIVE;
        if (!rk->fn != coll || rk->extent < 1 || rk->grain < 1)
            return LOOM_STATUS_INVALID_ARGUMENT;
        bool split = pk->kind == LOOM_IR_KERNEL_ELEMENTWISE;
        p->kernels[k] = (prog_kernel){.k = *rk,
                                      .first_slot = s,
                                      .n_slots = pk->n_args + pk->n_results,
                                      .coll = -1,
                                      .per_thread = split ? PROG_SPLIT_PER_THREAD : 1};
        for (int32_t i = 0; i < pk->n_args; i++)
            if (!resolve_slot(p, plan, pk->args[i], &p->slots[s++]))
                return LOOM_STATUS_INVALID_ARGUMENT;
        for (int32_t i = 0; i < pk->n_results; i++)
            if (!resolve_slot(p, plan, pk->results[i], &p->slots[s++]))
                return LOOM_STATUS_INVALID_ARGUMENT;
        if (coll) {
            loom_status st = build_collective(p, plan, k, &p->colls[nc]);
            if (st != LOOM_OK)
                return st;
            p->colls[nc].first_member = m;
            for (int32_t j = 0; j < plan->kernels[k].n_nodes; j++)
                p->coll_nodes[m++] = plan->kernels[k].nodes[j];
            p->kernels[k].coll = nc++;
        }
    }
    for (int32_t c = 0; c < plan->n_copies; c++) {
        const loom_ir_copy *pc = &plan->copies[c];
        prog_copy *cp = &p->copies[c];
        if (pc->output < 0 || pc->output >= g->n_outputs || !resolve_slot(p, plan, pc->node,
                                                                           &cp->src))
            return LOOM_STATUS_INVALID_ARGUMENT;
        cp->output = pc->output;
        cp->bytes = loom_ir_node_bytes(&g->nodes[pc->node]);
        if (cp->bytes > p->output_bytes[pc->output])
            return LOOM_STATUS_INVALID_ARGUMENT;
    }
    return LOOM_OK;
}

/* Makes sure the arena lives on dev (one allocation per executable and device, not per
 * step: device pools are slow compared with a step's kernels). */
static loom_status ensure_arena(program *p, loom_rt_device *dev, loom_ir_diag *d) {
    if (p->arena_bytes == 0 || (p->arena && p->arena->device == dev))
        return LOOM_OK;
    loom_rt_buffer_release(p->arena);
    p->arena = NULL;
    if (loom_rt_buffer_alloc(dev, p->arena_bytes, &p->arena) != LOOM_OK) {
        p->arena = NULL;
        char cap[160];
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "program: out of memory allocating the %zu-byte arena on %s%s",
                                p->arena_bytes, dev->name,
                                loom_rt_device_cap_note(dev, cap, sizeof cap));
    }
    return LOOM_OK;
}

static loom_status check_buffer(const program *p, const char *what, int32_t i,
                                const loom_rt_buffer *b, size_t need, int32_t node,
                                loom_ir_diag *d) {
    if (!b)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "program: %s %d has no buffer",
                                what, (int)i);
    if (b->size < need) {
        const loom_ir_node *n = &p->base.graph.nodes[node];
        char ty[LOOM_IR_TYPE_STR_MAX];
        loom_ir_format_type(ty, sizeof ty, n->dtype, n->rank, n->shape);
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "program: %s %d buffer has %zu bytes, its value %s needs %zu",
                                what, (int)i, b->size, ty, need);
    }
    return LOOM_OK;
}

static void *slot_ptr(const slot *s, loom_rt_buffer *const *inputs,
                      loom_rt_buffer *const *outputs, loom_rt_buffer *arena) {
    switch (s->kind) {
    case LOOM_IR_BUFFER_INPUT: return inputs[s->index]->data;
    case LOOM_IR_BUFFER_OUTPUT: return outputs[s->index]->data;
    case LOOM_IR_BUFFER_ARENA: return arena ? (char *)arena->data + s->offset : NULL;
    case LOOM_IR_BUFFER_COUNT_: return NULL;
    }
    return NULL;
}

typedef struct kernel_call {
    loom_rt_kernel_fn fn;
    void *const *bufs;
} kernel_call;

static void call_kernel(void *ud, int64_t lo, int64_t hi) {
    const kernel_call *c = ud;
    c->fn(c->bufs, lo, hi);
}

/* Starts collective c: an all-reduce copies its operands into place (zeroing the padding
 * between a bucket's values: it is reduced too) and starts; broadcast and all-gather run to
 * completion here. */
static loom_status start_collective(program *p, prog_coll *c, loom_ir_diag *d) {
    const loom_ir_graph *g = &p->coll_graph;
    void *const *bufs = p->bufs + p->kernels[c->kernel].first_slot;
    const loom_ir_node *n = &g->nodes[c->node];
    if (n->op != LOOM_IR_OP_ALL_REDUCE)
        return loom_rt_collective_run(g, c->node, bufs[0], bufs[1], d);
    /* An f32 sum's scale (the gradients' 1/world) is applied while the operands are copied
     * in, not in a pass of its own over the reduced buffer; in f32, as the communicator
     * applies it (exact for the 1/2^k of power-of-two worlds). */
    float scale = (float)n->attrs.value;
    bool prescale =
        n->dtype == LOOM_DTYPE_F32 && n->attrs.index == LOOM_REDUCE_SUM && n->attrs.value != 1.0;
    for (int32_t j = 0; j < c->n_members; j++) {
        const void *src = bufs[j];
        char *dst = bufs[c->n_members + j];
        size_t bytes = loom_ir_node_bytes(&g->nodes[p->coll_nodes[c->first_member + j]]);
        if (prescale)
            loom_rt_scale_f32((float *)dst, src, bytes / sizeof(float), scale);
        else if (bytes && dst != src)
            memcpy(dst, src, bytes);
        if (j + 1 < c->n_members)
            memset(dst + bytes, 0, (size_t)((char *)bufs[c->n_members + j + 1] - dst) - bytes);
    }
    loom_status st = loom_rt_collective_allreduce_start(g, c->node, bufs[c->n_members], c->count,
                                                        prescale, &c->req, d);
    c->in_flight = st == LOOM_OK && c->req;
    p->n_in_flight += c->in_flight;
    return st;
}

/* The trace's event for collective c, from its start until now (its completion). */
static void trace_collective(program *p, const prog_coll *c) {
    if (!p->trace)
        return;
    const loom_ir_node *n = &p->coll_graph.nodes[c->node];
    char args[96];
    snprintf(args, sizeof args, "\"bytes\":%zu,\"values\":%d,\"waited_before_kernel\":%d",
             c->count * loom_dtype_size(n->dtype), (int)c->n_members, (int)c->wait_before);
    loom_rt_trace_event(p->trace, "collective", p->trace_names[c->kernel], c->t_start,
                        loom_rt_now_ns(), args);
}

/* Waits for collective c if it is in flight. */
static loom_status wait_collective(program *p, prog_coll *c, loom_ir_diag *d) {
    if (!c->in_flight)
        return LOOM_OK;
    c->in_flight = false;
    p->n_in_flight--;
    loom_rt_comm_request *req = c->req;
    c->req = NULL;
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    loom_status st = loom_rt_comm_wait(req, &sub);
    trace_collective(p, c);
    return st == LOOM_OK ? LOOM_OK
                         : loom_rt_collective_error(&p->coll_graph, c->node, st, sub.msg, d);
}

/* Waits for the collectives in flight due before kernel k (every one when k is n_kernels),
 * in the order they started; on an error still waits for the rest, keeping the first. */
static loom_status wait_due(program *p, int32_t k, loom_status st, loom_ir_diag *d) {
    loom_ir_diag ignored;
    for (int32_t c = 0; c < p->n_colls; c++) {
        prog_coll *pc = &p->colls[c];
        if (!pc->in_flight || (pc->wait_before > k && k < p->n_kernels))
            continue;
        loom_ir_diag_init(&ignored);
        loom_status w = wait_collective(p, pc, st == LOOM_OK ? d : &ignored);
        st = st == LOOM_OK ? w : st;
    }
    return st;
}

/* Lets MPI progress the collectives in flight (it moves data only inside its calls). */
static void poll_collectives(program *p) {
    for (int32_t c = 0; c < p->n_colls; c++) {
        if (!p->colls[c].in_flight)
            continue;
        bool done;
        loom_ir_diag ignored;
        loom_ir_diag_init(&ignored);
        (void)loom_rt_comm_test(p->colls[c].req, &done, &ignored); /* the wait reports */
    }
}

static loom_status run_checked(program *p, loom_rt_buffer *const *inputs,
                               loom_rt_buffer *const *outputs, loom_ir_diag *d) {
    const loom_ir_graph *g = &p->base.graph;
    if ((g->n_graph_inputs > 0 && !inputs) || (g->n_outputs > 0 && !outputs))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "program: NULL %s array", !inputs ? "input" : "output");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int32_t idx = (int32_t)n->attrs.index;
        loom_status st = check_buffer(p, "input", idx, inputs[idx], p->input_bytes[idx], i, d);
        if (st != LOOM_OK)
            return st;
    }
    for (int32_t o = 0; o < g->n_outputs; o++) {
        loom_status st = check_buffer(p, "output", o, outputs[o], p->output_bytes[o],
                                      g->outputs[o].node, d);
        if (st != LOOM_OK)
            return st;
    }
    if (p->arena_bytes > 0) {
        loom_rt_buffer *any = g->n_outputs > 0 ? outputs[0]
                              : g->n_graph_inputs > 0 ? inputs[0] : NULL;
        if (!any)
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "program: no input or output buffer names the device "
                                    "to place the %zu-byte arena on", p->arena_bytes);
        loom_status st = ensure_arena(p, any->device, d);
        if (st != LOOM_OK)
            return st;
    }

    if (p->arena && p->arena->device->poison) /* LOOM_POISON: no value survives a run */
        memset(p->arena->data, 0xff, p->arena->size);
    for (int32_t s = 0; s < p->n_slots; s++)
        p->bufs[s] = slot_ptr(&p->slots[s], inputs, outputs, p->arena);
    loom_status st = LOOM_OK;
    if (p->n_colls > 0) {
        if (!p->step_digest_ready) {
            p->step_digest = loom_rt_step_digest(p->coll_digest, &p->base.graph);
            p->step_digest_ready = true;
        }
        st = loom_rt_collectives_agree(&p->coll_graph, p->colls[0].node, p->n_colls,
                                       p->step_digest, &p->base.graph, d);
    }
    for (int32_t k = 0; k < p->n_kernels && st == LOOM_OK; k++) {
        const prog_kernel *pk = &p->kernels[k];
        if (p->n_in_flight > 0 && (st = wait_due(p, k, st, d)) != LOOM_OK)
            break;
        int64_t t0 = p->prof || p->trace ? loom_rt_now_ns() : 0;
        if (pk->coll >= 0) {
            p->colls[pk->coll].t_start = t0;
            st = start_collective(p, &p->colls[pk->coll], d);
        } else {
            kernel_call call = {.fn = pk->k.fn, .bufs = p->bufs + pk->first_slot};
            int64_t idle = 0;
            loom_rt_pool_parallel_for_ex(p->pool, pk->k.extent, pk->k.grain, pk->per_thread,
                                         call_kernel, &call, p->prof ? &idle : NULL);
            if (p->prof)
                p->prof[k].idle_ns += idle;
            if (p->n_in_flight > 0)
                poll_collectives(p);
        }
        if (p->prof || p->trace) {
            int64_t t1 = loom_rt_now_ns();
            if (p->prof) {
                p->prof[k].total_ns += t1 - t0;
                p->prof[k].thread_ns += (int64_t)loom_rt_pool_threads(p->pool) * (t1 - t0);
                p->prof[k].calls++;
            }
            if (p->trace && pk->coll < 0)
                loom_rt_trace_event(p->trace, "kernel", p->trace_names[k], t0, t1, NULL);
            else if (p->trace && !p->colls[pk->coll].in_flight) /* ran to completion */
                trace_collective(p, &p->colls[pk->coll]);
        }
    }
    if (p->n_in_flight > 0)
        st = wait_due(p, p->n_kernels, st, d);
    if (st != LOOM_OK)
        return st;
    /* In plan order: the planner orders copies so none overwrites a donated input that a
     * later copy still reads. memmove: an output aliasing its own input is a no-op copy. */
    for (int32_t c = 0; c < p->n_copies; c++) {
        const prog_copy *cp = &p->copies[c];
        void *dst = outputs[cp->output]->data;
        const void *src = slot_ptr(&cp->src, inputs, outputs, p->arena);
        if (dst != src && cp->bytes > 0)
            memmove(dst, src, cp->bytes);
    }
    return LOOM_OK;
}

static loom_status program_run(loom_rt_executable *exe, loom_rt_buffer *const *inputs,
                               loom_rt_buffer *const *outputs, loom_ir_diag *d) {
    program *p = (program *)exe;
    if (atomic_exchange(&p->running, true))
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL,
                                "program: two runs of one executable overlap; its arena is "
                                "not shared (run it from one stream)");
    loom_status st = run_checked(p, inputs, outputs, d);
    atomic_store(&p->running, false);
    return st;
}

static const loom_rt_executable_vtable program_vtable = {
    .run = program_run,
    .destroy = program_destroy,
};

loom_status loom_rt_program_create(const loom_ir_graph *g, uint64_t hash, const loom_ir_plan *plan,
                                   const loom_rt_kernel *kernels, void *code_owner,
                                   void (*release_code)(void *code_owner), loom_rt_pool *pool,
                                   const loom_allocator *a, loom_rt_executable **out_exe) {
    if (out_exe)
        *out_exe = NULL;
    if (!g || !plan || (!kernels && plan->n_kernels > 0) || !pool || !a || !out_exe ||
        plan->n_nodes != g->n_nodes || plan->n_kernels < 0 || plan->n_copies < 0 ||
        (g->n_nodes > 0 && (!plan->has_placement || !plan->placement))) {
        if (release_code)
            release_code(code_owner);
        return LOOM_STATUS_INVALID_ARGUMENT;
    }
    program *p = loom_ir_alloc(a, sizeof *p);
    if (!p) {
        if (release_code)
            release_code(code_owner);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    memset(p, 0, sizeof *p);
    p->base = (loom_rt_executable){.vt = &program_vtable, .alloc = *a, .hash = hash};
    p->pool = pool;
    p->code_owner = code_owner;
    p->release_code = release_code;
    p->arena_bytes = plan->arena_bytes;
    atomic_init(&p->running, false);
    loom_ir_graph_init(&p->base.graph, a);
    loom_ir_graph_init(&p->coll_graph, a);
    loom_status st = loom_ir_graph_copy(&p->base.graph, g);
    if (st == LOOM_OK)
        st = build(p, plan, kernels);
    if (st == LOOM_OK && p->n_colls > 0)
        st = loom_ir_graph_copy(&p->coll_graph, g);
    if (st != LOOM_OK) {
        program_destroy(&p->base); /* releases the code too */
        return st;
    }
    *out_exe = &p->base;
    return LOOM_OK;
}

loom_status loom_rt_program_prepare(loom_rt_executable *exe, loom_rt_device *dev,
                                    loom_ir_diag *d) {
    if (!exe || !dev)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "program_prepare: NULL %s", !exe ? "executable" : "device");
    if (exe->vt != &program_vtable)
        return LOOM_OK;
    program *p = (program *)exe;
    if (atomic_exchange(&p->running, true))
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL,
                                "program_prepare: the executable is running");
    loom_status st = ensure_arena(p, dev, d);
    atomic_store(&p->running, false);
    return st;
}

/* Kernel k of plan (for g), as the profile and the trace name it: its root, "matmul
 * bf16[64,576]" ("" when out of range), and the root's source line, "train.c:88". */
static void describe_kernel(const loom_ir_plan *plan, const loom_ir_graph *g, int32_t k, char *root,
                            size_t root_size, char *loc, size_t loc_size) {
    const loom_ir_kernel *kn = &plan->kernels[k];
    root[0] = loc[0] = '\0';
    if (kn->root < 0 || kn->root >= g->n_nodes)
        return;
    const loom_ir_node *r = &g->nodes[kn->root];
    char ty[LOOM_IR_TYPE_STR_MAX];
    loom_ir_format_type(ty, sizeof ty, r->dtype, r->rank, r->shape);
    snprintf(root, root_size, "%s %s", loom_ir_op_name(r->op), ty);
    loom_ir_format_loc(loc, loc_size, r->loc);
}

/* The program exe is, to be profiled or traced from plan and g: NULL with *st INVALID_ARGUMENT
 * when they do not match it, NULL with *st OK when there is nothing to do (another kind of
 * executable, no kernels). */
static program *instrumentable(loom_rt_executable *exe, const void *sink, const loom_ir_plan *plan,
                               const loom_ir_graph *g, loom_status *st) {
    *st = LOOM_OK;
    if (!exe || !sink || !plan || !g || plan->n_nodes != g->n_nodes) {
        *st = LOOM_STATUS_INVALID_ARGUMENT;
        return NULL;
    }
    if (exe->vt != &program_vtable)
        return NULL;
    program *p = (program *)exe;
    if (plan->n_kernels != p->n_kernels) {
        *st = LOOM_STATUS_INVALID_ARGUMENT;
        return NULL;
    }
    return p->n_kernels > 0 ? p : NULL;
}

loom_status loom_rt_program_profile(loom_rt_executable *exe, loom_rt_profile *prof,
                                    const loom_ir_plan *plan, const loom_ir_graph *g) {
    loom_status st;
    program *p = instrumentable(exe, prof, plan, g, &st);
    if (!p || p->prof)
        return st;
    loom_rt_profile_kernel *e = loom_rt_profile_add(prof, p->n_kernels);
    if (!e)
        return LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &plan->kernels[k];
        e[k].program = exe->hash;
        e[k].index = k;
        loom_ir_kernel_cost(kn, g, &e[k].flops, &e[k].bytes);
        snprintf(e[k].kind, sizeof e[k].kind, "%s", loom_ir_kernel_kind_name(kn->kind));
        describe_kernel(plan, g, k, e[k].root, sizeof e[k].root, e[k].loc, sizeof e[k].loc);
    }
    p->prof = e;
    return LOOM_OK;
}

loom_status loom_rt_program_trace(loom_rt_executable *exe, loom_rt_trace *trace,
                                  const loom_ir_plan *plan, const loom_ir_graph *g) {
    loom_status st;
    program *p = instrumentable(exe, trace, plan, g, &st);
    if (!p || p->trace)
        return st;
    if (!alloc_array(&p->base.alloc, (void **)&p->trace_names, p->n_kernels,
                     sizeof *p->trace_names))
        return LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t k = 0; k < p->n_kernels; k++) {
        char root[LOOM_IR_TYPE_STR_MAX + 32], loc[128];
        describe_kernel(plan, g, k, root, sizeof root, loc, sizeof loc);
        const loom_ir_kernel *kn = &plan->kernels[k];
        if (kn->kind == LOOM_IR_KERNEL_COLLECTIVE && kn->n_nodes > 1)
            snprintf(p->trace_names[k], sizeof p->trace_names[k], "k%d bucket of %d all_reduces %s",
                     (int)k, (int)kn->n_nodes, loc);
        else
            snprintf(p->trace_names[k], sizeof p->trace_names[k], "k%d %s %s", (int)k, root, loc);
    }
    p->trace = trace;
    return LOOM_OK;
}

loom_status loom_rt_program_each_code(loom_rt_executable *exe, const loom_ir_plan *plan,
                                      const loom_ir_graph *g, loom_rt_code_fn fn, void *ud) {
    loom_status st;
    program *p = instrumentable(exe, fn ? plan : NULL, plan, g, &st);
    for (int32_t k = 0; p && k < p->n_kernels; k++) {
        const loom_rt_kernel *rk = &p->kernels[k].k;
        bool first = rk->fn && rk->code_bytes > 0;
        for (int32_t j = 0; j < k && first; j++) /* shared code: named after its first kernel */
            first = p->kernels[j].k.fn != rk->fn;
        if (!first)
            continue;
        int32_t sharing = 0;
        for (int32_t j = k + 1; j < p->n_kernels; j++)
            sharing += p->kernels[j].k.fn == rk->fn;
        char root[LOOM_IR_TYPE_STR_MAX + 32], loc[128], more[48] = "", name[384];
        describe_kernel(plan, g, k, root, sizeof root, loc, sizeof loc);
        if (sharing)
            snprintf(more, sizeof more, " (+%d kernel%s sharing its code)", (int)sharing,
                     sharing > 1 ? "s" : "");
        snprintf(name, sizeof name, "loom %016" PRIx64 ":%d %s %s%s", exe->hash, (int)k, root,
                 *loc ? loc : "?", more);
        fn(ud, (const void *)(uintptr_t)rk->fn, (size_t)rk->code_bytes, name);
    }
    return st;
}
