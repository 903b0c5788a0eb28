/* Helpers of the interpreter's tests (test_interp.c: the ops' values; test_interp_exec.c:
 * the interpreter as an executor): graphs built node by node, run with a counting
 * allocator, and their values checked element by element. */
#ifndef LOOM_TESTS_INTERP_UTIL_H
#define LOOM_TESTS_INTERP_UTIL_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#include "runtime/runtime.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---- graph building ----------------------------------------------------------------------- */

typedef struct tg {
    loom_ir_graph g;
    loom_ir_diag d;
} tg;

static inline void tg_init(tg *t) {
    loom_allocator sys = loom_allocator_system();
    loom_ir_graph_init(&t->g, &sys);
    loom_ir_diag_init(&t->d);
}

static inline void tg_deinit(tg *t) {
    loom_ir_graph_deinit(&t->g);
}

static inline int32_t add_node(tg *t, loom_ir_node_desc desc) {
    int32_t id = -1;
    if (loom_ir_graph_add(&t->g, &desc, &id, &t->d) != LOOM_OK)
        fail_msg("adding %s: %s", loom_ir_op_name(desc.op), t->d.msg);
    return id;
}

/* The next graph input (indices 0, 1, ... in call order). */
static inline int32_t input(tg *t, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return add_node(t, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                           .dtype = dt,
                                           .rank = rank,
                                           .shape = shape,
                                           .attrs = {.index = t->g.n_graph_inputs}});
}

static inline int32_t constant(tg *t, loom_dtype dt, int32_t rank, const int64_t *shape, double v) {
    return add_node(t, (loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT,
                                           .dtype = dt,
                                           .rank = rank,
                                           .shape = shape,
                                           .attrs = {.value = v}});
}

static inline int32_t op1(tg *t, loom_ir_op op, int32_t a) {
    return add_node(t, (loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = (int32_t[]){a}});
}

static inline int32_t op2(tg *t, loom_ir_op op, int32_t a, int32_t b) {
    return add_node(t, (loom_ir_node_desc){.op = op, .n_inputs = 2, .inputs = (int32_t[]){a, b}});
}

static inline int32_t op3(tg *t, loom_ir_op op, int32_t a, int32_t b, int32_t c) {
    return add_node(t,
                    (loom_ir_node_desc){.op = op, .n_inputs = 3, .inputs = (int32_t[]){a, b, c}});
}

static inline int32_t cast_to(tg *t, int32_t a, loom_dtype dt) {
    return add_node(
        t, (loom_ir_node_desc){
               .op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = (int32_t[]){a}, .dtype = dt});
}

/* broadcast or reshape to `shape` */
static inline int32_t shaped(tg *t, loom_ir_op op, int32_t a, int32_t rank, const int64_t *shape) {
    return add_node(
        t, (loom_ir_node_desc){
               .op = op, .n_inputs = 1, .inputs = (int32_t[]){a}, .rank = rank, .shape = shape});
}

static inline int32_t transpose(tg *t, int32_t a, int32_t rank, const int32_t *perm) {
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = (int32_t[]){a}};
    for (int32_t i = 0; i < rank; i++)
        desc.attrs.perm[i] = perm[i];
    return add_node(t, desc);
}

static inline int32_t reduce(tg *t, loom_ir_op op, int32_t a, uint32_t axes, bool keepdim) {
    return add_node(t, (loom_ir_node_desc){.op = op,
                                           .n_inputs = 1,
                                           .inputs = (int32_t[]){a},
                                           .attrs = {.axes = axes, .keepdim = keepdim}});
}

static inline void output(tg *t, int32_t node, int32_t alias) {
    assert_int_equal(loom_ir_graph_add_output(&t->g, node, alias), LOOM_OK);
}

static inline void expect_type(tg *t, int32_t node, loom_dtype dt, int32_t rank,
                               const int64_t *shape) {
    const loom_ir_node *n = &t->g.nodes[node];
    assert_int_equal(n->dtype, dt);
    assert_int_equal(n->rank, rank);
    for (int32_t i = 0; i < rank; i++)
        assert_int_equal(n->shape[i], shape[i]);
}

/* Runs the graph with a counting allocator; it must succeed and free everything. */
static inline void run_graph(tg *t, const void *const *ins, void *const *outs) {
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_rt_interp_run(&t->g, &a, ins, outs, &d);
    if (st != LOOM_OK)
        fail_msg("interp: %s: %s", loom_status_name(st), d.msg);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

/* out = op(x[, y]) over rank-1 operands of n elements of dtype dt. */
static inline void unary(loom_ir_op op, loom_dtype dt, int64_t n, const void *x, void *out) {
    tg t;
    tg_init(&t);
    output(&t, op1(&t, op, input(&t, dt, 1, S(n))), -1);
    run_graph(&t, (const void *[]){x}, (void *[]){out});
    tg_deinit(&t);
}

static inline void binary(loom_ir_op op, loom_dtype dt, int64_t n, const void *x, const void *y,
                          void *out) {
    tg t;
    tg_init(&t);
    int32_t a = input(&t, dt, 1, S(n)); /* not as call arguments: their order is unspecified */
    int32_t b = input(&t, dt, 1, S(n));
    output(&t, op2(&t, op, a, b), -1);
    run_graph(&t, (const void *[]){x, y}, (void *[]){out});
    tg_deinit(&t);
}

/* ---- value checks ------------------------------------------------------------------------- */

/* NaN matches NaN; infinities and zeros (rtol 0: everything) must match exactly. */
static inline void expect_f64_at(double got, double want, double rtol, size_t i) {
    if (isnan(want)) {
        if (!isnan(got))
            fail_msg("element %zu: got %.9g, want nan", i, got);
        return;
    }
    if (rtol == 0.0 || isinf(want) || want == 0.0) {
        if (got != want)
            fail_msg("element %zu: got %.9g, want %.9g", i, got, want);
        return;
    }
    if (!(fabs(got - want) <= rtol * fabs(want)))
        fail_msg("element %zu: got %.9g, want %.9g (rtol %g)", i, got, want, rtol);
}

static inline void expect_f32(const float *got, const float *want, size_t n, double rtol) {
    for (size_t i = 0; i < n; i++)
        expect_f64_at(got[i], want[i], rtol, i);
}

static inline void expect_f64(const double *got, const double *want, size_t n, double rtol) {
    for (size_t i = 0; i < n; i++)
        expect_f64_at(got[i], want[i], rtol, i);
}

static inline void expect_i64(const int64_t *got, const int64_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: got %lld, want %lld", i, (long long)got[i], (long long)want[i]);
}

static inline void expect_i32(const int32_t *got, const int32_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: got %d, want %d", i, (int)got[i], (int)want[i]);
}

static inline void expect_u8(const uint8_t *got, const uint8_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: got %d, want %d", i, (int)got[i], (int)want[i]);
}

static inline void expect_u16(const uint16_t *got, const uint16_t *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: got 0x%04x, want 0x%04x", i, got[i], want[i]);
}

#define LIT(T, ...) ((const T[]){__VA_ARGS__})
#define NLIT(T, ...) (sizeof((const T[]){__VA_ARGS__}) / sizeof(T))
#define EXPECT_F32(got, rtol, ...)                                                                 \
    expect_f32((got), LIT(float, __VA_ARGS__), NLIT(float, __VA_ARGS__), (rtol))
#define EXPECT_F64(got, rtol, ...)                                                                 \
    expect_f64((got), LIT(double, __VA_ARGS__), NLIT(double, __VA_ARGS__), (rtol))
#define EXPECT_I64(got, ...)                                                                       \
    expect_i64((got), LIT(int64_t, __VA_ARGS__), NLIT(int64_t, __VA_ARGS__))
#define EXPECT_I32(got, ...)                                                                       \
    expect_i32((got), LIT(int32_t, __VA_ARGS__), NLIT(int32_t, __VA_ARGS__))
#define EXPECT_U8(got, ...) expect_u8((got), LIT(uint8_t, __VA_ARGS__), NLIT(uint8_t, __VA_ARGS__))
#define EXPECT_U16(got, ...)                                                                       \
    expect_u16((got), LIT(uint16_t, __VA_ARGS__), NLIT(uint16_t, __VA_ARGS__))

#define TOL 1e-6 /* relative, for f32 results of transcendental functions */

#endif
