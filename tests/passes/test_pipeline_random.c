/* The whole JIT pipeline on random graphs: each must compute the same bits after
 * dce/cse/fold and when its plan (fusion, memory) is executed kernel by kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- the pipeline on random graphs --------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

static int32_t rnd(rng *r, int32_t n) {
    return (int32_t)((rng_next(r) >> 33) % (uint64_t)n);
}

static int32_t try_add(loom_ir_graph *g, loom_ir_node_desc desc) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id = -1;
    return loom_ir_graph_add(g, &desc, &id, &d) == LOOM_OK ? id : -1;
}

static int32_t add_input(loom_ir_graph *g, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                          .dtype = dt,
                                          .rank = rank,
                                          .shape = shape,
                                          .attrs.index = g->n_graph_inputs});
}

static int32_t add_const(rng *r, loom_ir_graph *g, loom_dtype dt, int32_t rank,
                         const int64_t *shape) {
    static const double values[] = {0.0, -0.0, 1.0, 2.0, -1.5, 0.5, 3.0, -1.0};
    return try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT,
                                          .dtype = dt,
                                          .rank = rank,
                                          .shape = shape,
                                          .attrs.value = values[rnd(r, 8)]});
}

static int32_t add_op(loom_ir_graph *g, loom_ir_op op, int32_t n_in, const int32_t *ins) {
    return try_add(g, (loom_ir_node_desc){.op = op, .n_inputs = n_in, .inputs = ins});
}

/* A node picked at random, recent ones more often. */
static int32_t pick(rng *r, const loom_ir_graph *g) {
    int32_t n = g->n_nodes;
    return rnd(r, 2) ? n - 1 - rnd(r, n < 6 ? n : 6) : rnd(r, n);
}

/* Another node of x's dtype and shape, or a new constant or input of that type. */
static int32_t partner(rng *r, loom_ir_graph *g, int32_t x) {
    const loom_ir_node n = g->nodes[x];
    int32_t start = rnd(r, g->n_nodes);
    if (rnd(r, 3))
        for (int32_t k = 0; k < g->n_nodes; k++) {
            int32_t y = (start + k) % g->n_nodes;
            const loom_ir_node *m = &g->nodes[y];
            if (y != x && m->dtype == n.dtype && m->rank == n.rank &&
                memcmp(m->shape, n.shape, (size_t)n.rank * sizeof n.shape[0]) == 0)
                return y;
        }
    return rnd(r, 3) ? add_const(r, g, n.dtype, n.rank, n.shape)
                     : add_input(g, n.dtype, n.rank, n.shape);
}

static void random_shape(rng *r, int32_t *rank, int64_t *shape) {
    *rank = rnd(r, 4);
    for (int32_t i = 0; i < *rank; i++)
        shape[i] = 1 + rnd(r, 4);
}

/* One random step: adds zero or more nodes. */
static void random_step(rng *r, loom_ir_graph *g) {
    static const loom_ir_op float_unary[] = {LOOM_IR_OP_NEG,  LOOM_IR_OP_ABS,     LOOM_IR_OP_EXP,
                                             LOOM_IR_OP_LOG,  LOOM_IR_OP_SQRT,    LOOM_IR_OP_RSQRT,
                                             LOOM_IR_OP_TANH, LOOM_IR_OP_SIGMOID, LOOM_IR_OP_RELU,
                                             LOOM_IR_OP_GELU, LOOM_IR_OP_ISFINITE};
    static const loom_ir_op int_unary[] = {LOOM_IR_OP_NEG, LOOM_IR_OP_ABS, LOOM_IR_OP_RELU};
    static const loom_ir_op binary[] = {LOOM_IR_OP_ADD, LOOM_IR_OP_SUB,     LOOM_IR_OP_MUL,
                                        LOOM_IR_OP_DIV, LOOM_IR_OP_MAXIMUM, LOOM_IR_OP_MINIMUM,
                                        LOOM_IR_OP_POW};
    static const loom_ir_op compare[] = {LOOM_IR_OP_EQ, LOOM_IR_OP_NE, LOOM_IR_OP_LT,
                                         LOOM_IR_OP_LE, LOOM_IR_OP_GT, LOOM_IR_OP_GE};
    static const loom_ir_op reduce[] = {LOOM_IR_OP_REDUCE_SUM, LOOM_IR_OP_REDUCE_MEAN,
                                        LOOM_IR_OP_REDUCE_MAX};
    static const loom_dtype dtypes[] = {LOOM_DTYPE_F32,  LOOM_DTYPE_F64, LOOM_DTYPE_F16,
                                        LOOM_DTYPE_BF16, LOOM_DTYPE_I32, LOOM_DTYPE_I64,
                                        LOOM_DTYPE_BOOL};
    int32_t x = pick(r, g);
    loom_ir_node n = g->nodes[x];
    bool is_float = loom_ir_dtype_is_float(n.dtype);
    switch (rnd(r, 13)) {
    case 0: /* unary */
        if (is_float)
            add_op(g, float_unary[rnd(r, 11)], 1, &x);
        else if (n.dtype != LOOM_DTYPE_BOOL)
            add_op(g, int_unary[rnd(r, 3)], 1, &x);
        return;
    case 1:
    case 2: { /* binary, often with a constant: fold fodder */
        int32_t y = partner(r, g, x);
        int32_t ins[2] = {x, y};
        if (rnd(r, 2)) {
            ins[0] = y;
            ins[1] = x;
        }
        add_op(g, binary[rnd(r, is_float ? 7 : 6)], 2, ins);
        return;
    }
    case 3: { /* compare, then select */
        int32_t y = partner(r, g, x);
        int32_t c = add_op(g, compare[rnd(r, 6)], 2, (int32_t[]){x, y});
        if (c >= 0 && rnd(r, 2))
            add_op(g, LOOM_IR_OP_SELECT, 3, (int32_t[]){c, x, y});
        return;
    }
    case 4: /* cast, sometimes to its own dtype */
        try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_CAST,
                                       .n_inputs = 1,
                                       .inputs = &x,
                                       .dtype = rnd(r, 4) ? dtypes[rnd(r, 7)] : n.dtype});
        return;
    case 5: { /* broadcast: a new leading axis and/or extents of 1 expanded */
        int64_t shape[LOOM_MAX_RANK];
        int32_t rank = n.rank, off = 0;
        if (rank < 4 && rnd(r, 2)) {
            shape[0] = 1 + rnd(r, 3);
            off = 1;
        }
        for (int32_t i = 0; i < n.rank; i++)
            shape[off + i] = n.shape[i] == 1 && rnd(r, 2) ? 1 + rnd(r, 3) : n.shape[i];
        int32_t b = try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_BROADCAST,
                                                   .n_inputs = 1,
                                                   .inputs = &x,
                                                   .rank = rank + off,
                                                   .shape = shape});
        if (b >= 0 && rnd(r, 3) == 0) /* and again: broadcast of a broadcast */
            try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_BROADCAST,
                                           .n_inputs = 1,
                                           .inputs = &b,
                                           .rank = rank + off,
                                           .shape = shape});
        return;
    }
    case 6: { /* reshape: flatten, or split in two */
        int64_t numel = loom_ir_numel(n.rank, n.shape);
        int64_t shape[2] = {numel, 1};
        int32_t rank = 1;
        if (rnd(r, 2) && numel % 2 == 0) {
            shape[0] = 2;
            shape[1] = numel / 2;
            rank = 2;
        } else if (rnd(r, 2)) {
            shape[0] = 1;
            shape[1] = numel;
            rank = 2;
        }
        int32_t v = try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_RESHAPE,
                                                   .n_inputs = 1,
                                                   .inputs = &x,
                                                   .rank = rank,
                                                   .shape = shape});
        if (v >= 0 && rnd(r, 2)) /* and a reader, so the view feeds a kernel */
            add_op(g, is_float ? LOOM_IR_OP_NEG : LOOM_IR_OP_CAST, 1, &v);
        return;
    }
    case 7: { /* transpose, sometimes the identity, sometimes twice */
        if (n.rank < 2)
            return;
        loom_ir_attrs at = {0};
        for (int32_t i = 0; i < n.rank; i++)
            at.perm[i] = i;
        for (int32_t i = n.rank - 1; i > 0 && rnd(r, 5); i--) {
            int32_t j = rnd(r, i + 1), t = at.perm[i];
            at.perm[i] = at.perm[j];
            at.perm[j] = t;
        }
        int32_t t =
            try_add(g, (loom_ir_node_desc){
                           .op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &x, .attrs = at});
        if (t >= 0 && rnd(r, 2))
            try_add(g, (loom_ir_node_desc){
                           .op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &t, .attrs = at});
        return;
    }
    case 8: { /* reduction */
        if (n.dtype == LOOM_DTYPE_BOOL)
            return;
        loom_ir_attrs at = {.axes = n.rank ? (uint32_t)rnd(r, 1 << n.rank) : 0,
                            .keepdim = rnd(r, 2) != 0};
        loom_ir_op op = is_float ? reduce[rnd(r, 3)] : reduce[2 * rnd(r, 2)]; /* no int mean */
        try_add(g, (loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = &x, .attrs = at});
        return;
    }
    case 9: { /* matmul with an existing or new [K,N] operand (sometimes a constant) */
        if (n.rank != 2 || n.dtype == LOOM_DTYPE_BOOL)
            return;
        int64_t shape[2] = {n.shape[1], 1 + rnd(r, 4)};
        int32_t y = -1;
        for (int32_t k = 0; k < g->n_nodes && y < 0 && rnd(r, 4); k++) {
            const loom_ir_node *m = &g->nodes[k];
            if (m->dtype == n.dtype && m->rank == 2 && m->shape[0] == shape[0])
                y = k;
        }
        if (y < 0)
            y = rnd(r, 3) ? add_input(g, n.dtype, 2, shape) : add_const(r, g, n.dtype, 2, shape);
        int32_t m = add_op(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){x, y});
        if (m >= 0 && rnd(r, 2)) { /* a bias and an activation */
            int64_t bshape[1] = {g->nodes[m].shape[1]};
            int32_t b = add_input(g, n.dtype, 1, bshape);
            int32_t bb = try_add(g, (loom_ir_node_desc){.op = LOOM_IR_OP_BROADCAST,
                                                        .n_inputs = 1,
                                                        .inputs = &b,
                                                        .rank = 2,
                                                        .shape = g->nodes[m].shape});
            int32_t s = add_op(g, LOOM_IR_OP_ADD, 2, (int32_t[]){m, bb});
            if (s >= 0)
                add_op(g, LOOM_IR_OP_RELU, 1, &s);
        }
        return;
    }
    case 10: { /* a duplicate of an existing node (CSE fodder), commutative ones swapped */
        if (n.op == LOOM_IR_OP_INPUT)
            return;
        int32_t ins[3];
        for (int32_t k = 0; k < n.n_inputs; k++)
            ins[k] = n.inputs[k];
        if ((loom_ir_op_table[n.op].flags & LOOM_IR_OPF_COMMUTATIVE) && rnd(r, 2)) {
            ins[0] = n.inputs[1];
            ins[1] = n.inputs[0];
        }
        int32_t y = try_add(g, (loom_ir_node_desc){.op = n.op,
                                                   .n_inputs = n.n_inputs,
                                                   .inputs = ins,
                                                   .dtype = n.dtype,
                                                   .rank = n.rank,
                                                   .shape = n.shape,
                                                   .attrs = n.attrs});
        if (y >= 0 && rnd(r, 2)) /* and both in use, so DCE does not get there first */
            add_op(g, LOOM_IR_OP_EQ, 2, (int32_t[]){x, y});
        return;
    }
    case 11: { /* neg(neg(x)) and constants combined with constants */
        if (is_float || (n.dtype != LOOM_DTYPE_BOOL && rnd(r, 2))) {
            int32_t a = add_op(g, LOOM_IR_OP_NEG, 1, &x);
            if (a >= 0)
                add_op(g, LOOM_IR_OP_NEG, 1, &a);
        }
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        random_shape(r, &rank, shape);
        loom_dtype dt = dtypes[rnd(r, 6)];
        int32_t c1 = add_const(r, g, dt, rank, shape), c2 = add_const(r, g, dt, rank, shape);
        bool fl = loom_ir_dtype_is_float(dt);
        int32_t c3 = add_op(g, binary[rnd(r, fl ? 7 : 6)], 2, (int32_t[]){c1, c2});
        if (c3 >= 0)
            add_op(g, fl ? float_unary[rnd(r, 11)] : int_unary[rnd(r, 3)], 1, &c3);
        return;
    }
    case 12: { /* a fresh input */
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        random_shape(r, &rank, shape);
        add_input(g, dtypes[rnd(r, 5)], rank, shape);
        return;
    }
    }
}

static void random_graph(rng *r, loom_ir_graph *g) {
    loom_ir_graph_init(g, &sys);
    int32_t n_inputs = 1 + rnd(r, 3);
    for (int32_t i = 0; i < n_inputs; i++) {
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        random_shape(r, &rank, shape);
        if (i == 0 && rank < 2) { /* give matmuls something to work with */
            rank = 2;
            shape[0] = 1 + rnd(r, 4);
            shape[1] = 1 + rnd(r, 4);
        }
        add_input(g, rnd(r, 4) ? LOOM_DTYPE_F32 : LOOM_DTYPE_I32, rank, shape);
    }
    int32_t steps = 4 + rnd(r, 20);
    for (int32_t s = 0; s < steps; s++)
        random_step(r, g);
    /* outputs: recent nodes mostly, any node sometimes (an input, a constant, a duplicate);
     * some donated into an input of their type */
    int32_t n_out = 1 + rnd(r, 4);
    bool used_alias[64] = {false};
    for (int32_t o = 0; o < n_out; o++) {
        int32_t x = rnd(r, 4) ? g->n_nodes - 1 - rnd(r, g->n_nodes < 5 ? g->n_nodes : 5)
                              : rnd(r, g->n_nodes);
        int32_t alias = -1;
        const loom_ir_node *nx = &g->nodes[x];
        for (int32_t i = 0; i < g->n_nodes && rnd(r, 3) == 0 && alias < 0; i++) {
            const loom_ir_node *in = &g->nodes[i];
            if (in->op == LOOM_IR_OP_INPUT && in->attrs.index < 64 &&
                !used_alias[in->attrs.index] && in->dtype == nx->dtype && in->rank == nx->rank &&
                memcmp(in->shape, nx->shape, (size_t)in->rank * sizeof in->shape[0]) == 0) {
                alias = (int32_t)in->attrs.index;
                used_alias[alias] = true;
            }
        }
        assert_int_equal(loom_ir_graph_add_output(g, x, alias), LOOM_OK);
    }
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_verify(g, &d) != LOOM_OK)
        fail_msg("random graph does not verify: %s", d.msg);
}

/* Buffers for a graph's inputs (random values) and outputs. */
typedef struct buffers {
    int32_t n_in, n_out;
    void *in[64];
    size_t in_bytes[64];
    void *out[16];
    size_t out_bytes[16];
} buffers;

static void fill_inputs(rng *r, const loom_ir_graph *g, buffers *b) {
    memset(b, 0, sizeof *b);
    b->n_in = g->n_graph_inputs;
    assert_true(b->n_in <= 64);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        size_t bytes = tu_node_bytes(n);
        int64_t count = loom_ir_numel(n->rank, n->shape);
        void *p = malloc(bytes + 1);
        for (int64_t e = 0; e < count; e++) {
            double v = (double)(rnd(r, 17) - 8) * 0.25 + (double)rnd(r, 1000) * 1e-4;
            if (loom_ir_dtype_is_float(n->dtype))
                loom_ir_store_f64(p, n->dtype, e, rnd(r, 10) ? v : -0.0);
            else
                loom_ir_store_i64(p, n->dtype, e, rnd(r, 9) - 4);
        }
        b->in[n->attrs.index] = p;
        b->in_bytes[n->attrs.index] = bytes;
    }
}

static void alloc_outputs(const loom_ir_graph *g, buffers *b) {
    b->n_out = g->n_outputs;
    assert_true(b->n_out <= 16);
    for (int32_t o = 0; o < g->n_outputs; o++) {
        b->out_bytes[o] = tu_node_bytes(&g->nodes[g->outputs[o].node]);
        b->out[o] = malloc(b->out_bytes[o] + 1);
        memset(b->out[o], 0xa5, b->out_bytes[o] + 1);
    }
}

static void free_buffers(buffers *b) {
    for (int32_t i = 0; i < 64; i++)
        free(b->in[i]);
    for (int32_t o = 0; o < 16; o++)
        free(b->out[o]);
    memset(b, 0, sizeof *b);
}

/* A copy of b's inputs (the interpreter never writes them; donation in run_plan does). */
static void clone_inputs(const buffers *b, buffers *c) {
    memset(c, 0, sizeof *c);
    c->n_in = b->n_in;
    for (int32_t i = 0; i < b->n_in; i++) {
        c->in_bytes[i] = b->in_bytes[i];
        if (b->in[i]) {
            c->in[i] = malloc(b->in_bytes[i] + 1);
            memcpy(c->in[i], b->in[i], b->in_bytes[i]);
        }
    }
}

static void interp(const loom_ir_graph *g, buffers *b) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_interp_run(g, &sys, (const void *const *)b->in, b->out, &d) != LOOM_OK)
        fail_msg("interp: %s", d.msg);
}

static void *value_ptr(const loom_ir_plan *p, int32_t node, void **in, void **out, char *arena) {
    if (!p->has_placement[node])
        fail_msg("%%%d has no placement", (int)node);
    const loom_ir_placement *pl = &p->placement[node];
    switch (pl->kind) {
    case LOOM_IR_BUFFER_INPUT: return in[pl->index];
    case LOOM_IR_BUFFER_OUTPUT: return out[pl->index];
    case LOOM_IR_BUFFER_ARENA: return arena + pl->offset;
    case LOOM_IR_BUFFER_COUNT_: break;
    }
    fail_msg("bad placement");
    return NULL;
}

/* Executes a plan as the runtime would: each kernel (its nodes as a subgraph over its args)
 * through the interpreter, reading and writing the planned buffers; the arena is one block
 * filled with garbage; outputs donated into an input are that input's buffer; then the
 * copies in order. A wrong placement, lifetime or copy order shows up as wrong outputs. */
static void run_plan(const loom_ir_graph *g, const loom_ir_plan *p, buffers *b) {
    void *out[16];
    for (int32_t o = 0; o < g->n_outputs; o++)
        out[o] = g->outputs[o].alias >= 0 ? b->in[g->outputs[o].alias] : b->out[o];
    char *arena = malloc(p->arena_bytes + 1);
    memset(arena, 0x5a, p->arena_bytes + 1);
    int32_t *map = malloc(((size_t)g->n_nodes + 1) * sizeof *map);
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        loom_ir_graph sg;
        loom_ir_graph_init(&sg, &sys);
        for (int32_t i = 0; i < g->n_nodes; i++)
            map[i] = -1;
        const void *ins[64];
        void *outs[64];
        assert_true(kn->n_args <= 64 && kn->n_results <= 64);
        for (int32_t a = 0; a < kn->n_args; a++) {
            const loom_ir_node *n = &g->nodes[kn->args[a]];
            map[kn->args[a]] = try_add(&sg, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                                                .dtype = n->dtype,
                                                                .rank = n->rank,
                                                                .shape = n->shape,
                                                                .attrs.index = a});
            ins[a] = value_ptr(p, kn->args[a], b->in, out, arena);
        }
        for (int32_t j = 0; j < kn->n_nodes; j++) {
            const loom_ir_node *n = &g->nodes[kn->nodes[j]];
            int32_t ops[3];
            for (int32_t q = 0; q < n->n_inputs; q++) {
                ops[q] = map[n->inputs[q]];
                assert_true(ops[q] >= 0);
            }
            map[kn->nodes[j]] = try_add(&sg, (loom_ir_node_desc){.op = n->op,
                                                                 .n_inputs = n->n_inputs,
                                                                 .inputs = ops,
                                                                 .dtype = n->dtype,
                                                                 .rank = n->rank,
                                                                 .shape = n->shape,
                                                                 .attrs = n->attrs});
            assert_true(map[kn->nodes[j]] >= 0);
        }
        for (int32_t r = 0; r < kn->n_results; r++) {
            assert_int_equal(loom_ir_graph_add_output(&sg, map[kn->results[r]], -1), LOOM_OK);
            outs[r] = value_ptr(p, kn->results[r], b->in, out, arena);
        }
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_rt_interp_run(&sg, &sys, ins, outs, &d) != LOOM_OK)
            fail_msg("kernel %d: %s", (int)k, d.msg);
        loom_ir_graph_deinit(&sg);
    }
    for (int32_t c = 0; c < p->n_copies; c++) {
        const loom_ir_copy *cp = &p->copies[c];
        memmove(out[cp->output], value_ptr(p, cp->node, b->in, out, arena),
                tu_node_bytes(&g->nodes[cp->node]));
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        if (out[o] != b->out[o])
            memcpy(b->out[o], out[o], b->out_bytes[o]);
    free(map);
    free(arena);
}

static void expect_same_outputs(const buffers *want, const buffers *got, int seed,
                                const char *what) {
    for (int32_t o = 0; o < want->n_out; o++)
        if (memcmp(want->out[o], got->out[o], want->out_bytes[o]) != 0)
            fail_msg("seed %d: output %d differs %s", seed, (int)o, what);
}

/* How many graphs each pass of the pipeline changed. */
typedef struct pass_counts {
    int32_t dce, cse, fold, recompute;
} pass_counts;

static void count_changes(const char *pass_name, bool changed, const loom_ir_graph *g, void *ud) {
    (void)g;
    pass_counts *c = ud;
    if (changed) {
        c->dce += strcmp(pass_name, "dce") == 0;
        c->cse += strcmp(pass_name, "cse") == 0;
        c->fold += strcmp(pass_name, "fold") == 0;
        c->recompute += strcmp(pass_name, "recompute") == 0;
    }
}

static void test_pipeline_keeps_random_graphs_bit_exact_and_plans_them_validly(void **state) {
    (void)state;
    int32_t kernels = 0, nodes_before = 0, nodes_after = 0, copies = 0;
    pass_counts changed = {0};
    for (int seed = 1; seed <= 200; seed++) {
        rng r = {0x9e3779b97f4a7c15ull * (uint64_t)seed};
        loom_ir_graph g;
        random_graph(&r, &g);
        buffers ref, got, sim;
        fill_inputs(&r, &g, &ref);
        clone_inputs(&ref, &got);
        clone_inputs(&ref, &sim);
        alloc_outputs(&g, &ref);
        interp(&g, &ref);

        loom_ir_graph opt;
        loom_ir_graph_init(&opt, &sys);
        assert_int_equal(loom_ir_graph_copy(&opt, &g), LOOM_OK);
        loom_ir_plan p;
        loom_ir_plan_init(&p, &sys);
        loom_pass_options opts = {.verify_each = true, .after_pass = count_changes, .ud = &changed};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_pass_build_plan(&opt, &opts, &p, &d) != LOOM_OK) {
            loom_ir_sbuf sb;
            loom_ir_sbuf_init(&sb, &sys);
            loom_ir_graph_print(&g, loom_ir_sbuf_write, &sb);
            fail_msg("seed %d: build plan: %s\n%s", seed, d.msg, sb.data);
        }
        assert_int_equal(opt.n_outputs, g.n_outputs);
        assert_int_equal(opt.n_graph_inputs, g.n_graph_inputs);
        nodes_before += g.n_nodes;
        nodes_after += opt.n_nodes;
        kernels += p.n_kernels;
        copies += p.n_copies;

        alloc_outputs(&opt, &got);
        interp(&opt, &got);
        expect_same_outputs(&ref, &got, seed, "after the passes");
        tu_expect_no_overlap(&opt, &p);
        alloc_outputs(&opt, &sim);
        run_plan(&opt, &p, &sim);
        expect_same_outputs(&ref, &sim, seed, "when the plan is executed kernel by kernel");

        free_buffers(&ref);
        free_buffers(&got);
        free_buffers(&sim);
        tu_deinit_both(&opt, &p);
        loom_ir_graph_deinit(&g);
    }
    /* the generator makes the passes and the planner work: nodes go away, kernels fuse */
    print_message("# 200 random graphs: %d nodes -> %d after the passes, %d kernels, "
                  "%d copies; changed by dce %d, cse %d, fold %d, recompute %d times\n",
                  (int)nodes_before, (int)nodes_after, (int)kernels, (int)copies, (int)changed.dce,
                  (int)changed.cse, (int)changed.fold, (int)changed.recompute);
    assert_true(changed.cse >= 30 && changed.fold >= 60 && changed.recompute >= 10);
    assert_true(nodes_after < nodes_before * 9 / 10);
    assert_true(kernels < nodes_after / 2);
    assert_true(copies > 0);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_keeps_random_graphs_bit_exact_and_plans_them_validly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
