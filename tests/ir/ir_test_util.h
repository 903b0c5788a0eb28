/* Helpers of the IR core's tests (test_ir_core.c, test_ir_infer.c): graphs built node by
 * node, the type or the error inference gives, the verifier, f32 bit patterns. */
#ifndef LOOM_TESTS_IR_TEST_UTIL_H
#define LOOM_TESTS_IR_TEST_UTIL_H

#include <string.h>

#include "ir/ir.h"
#include "test_util.h"

/* Shape literals: S(2, 3) is a pointer to {2, 3}; SHAPE(2, 3) is "rank, pointer" for
 * argument lists. */
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define SHAPE(...) (int32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), S(__VA_ARGS__)

/* ---- helpers ----------------------------------------------------------------------------- */

static inline int32_t add_input(loom_ir_graph *g, int64_t index, loom_dtype dt, int32_t rank,
                                const int64_t *shape) {
    return tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                              .dtype = dt,
                                              .rank = rank,
                                              .shape = shape,
                                              .attrs.index = index});
}

static inline int32_t add_const(loom_ir_graph *g, loom_dtype dt, double value) {
    return tu_add_desc(
        g, (loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT, .dtype = dt, .attrs.value = value});
}

static inline int32_t add1(loom_ir_graph *g, loom_ir_op op, int32_t a) {
    return tu_add_desc(g, (loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = (int32_t[]){a}});
}

static inline int32_t add2(loom_ir_graph *g, loom_ir_op op, int32_t a, int32_t b) {
    return tu_add_desc(g,
                       (loom_ir_node_desc){.op = op, .n_inputs = 2, .inputs = (int32_t[]){a, b}});
}

static inline int32_t add_broadcast(loom_ir_graph *g, int32_t a, int32_t rank,
                                    const int64_t *shape) {
    return tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_BROADCAST,
                                              .n_inputs = 1,
                                              .inputs = (int32_t[]){a},
                                              .rank = rank,
                                              .shape = shape});
}

/* The inferred type of desc over g ("f32[2,4]"), or a description of the error. */
static inline const char *infer_type(const loom_ir_graph *g, loom_ir_node_desc desc) {
    static char buf[700];
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_dtype dt = LOOM_DTYPE_COUNT_;
    int32_t rank = -1;
    int64_t shape[LOOM_MAX_RANK];
    loom_status st = loom_ir_infer(g, &desc, &dt, &rank, shape, &d);
    if (st != LOOM_OK)
        snprintf(buf, sizeof buf, "error %s: %s", loom_status_name(st), d.msg);
    else
        loom_ir_format_type(buf, sizeof buf, dt, rank, shape);
    return buf;
}

/* The INVALID_ARGUMENT message inference gives for desc, or a description of what it
 * did instead. */
static inline const char *infer_error(const loom_ir_graph *g, loom_ir_node_desc desc) {
    static char buf[700];
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_dtype dt;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    loom_status st = loom_ir_infer(g, &desc, &dt, &rank, shape, &d);
    if (st == LOOM_OK)
        snprintf(buf, sizeof buf, "no error: %s",
                 loom_ir_format_type((char[LOOM_IR_TYPE_STR_MAX]){0}, LOOM_IR_TYPE_STR_MAX, dt,
                                     rank, shape));
    else if (st != LOOM_STATUS_INVALID_ARGUMENT || d.code != st)
        snprintf(buf, sizeof buf, "status %s (diag %s): %s", loom_status_name(st),
                 loom_status_name(d.code), d.msg);
    else
        snprintf(buf, sizeof buf, "%s", d.msg);
    return buf;
}

/* Runs the verifier; returns its status and leaves the diagnostic in *d. */
static inline loom_status verify(const loom_ir_graph *g, loom_ir_diag *d) {
    loom_ir_diag_init(d);
    return loom_ir_graph_verify(g, d);
}

static inline void assert_verifies(const loom_ir_graph *g) {
    loom_ir_diag d;
    loom_status st = verify(g, &d);
    if (st != LOOM_OK)
        fail_msg("verify: %s (node %d)", d.msg, (int)d.node);
    assert_int_equal(d.code, LOOM_OK);
    assert_int_equal(d.node, -1);
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
