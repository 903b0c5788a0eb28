/* Unit tests of the IR's inference: every op's result type by its kind, and the errors
 * that name what is wrong (operand counts, dtype classes, shapes, windows, references). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ir_test_util.h"

static loom_allocator sys;

/* ---- inference: every op ----------------------------------------------------------------- */

/* One desc per op, built from the op's kind, with the result type that kind documents. */
static void test_infer_types_every_op_by_its_kind(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t f = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t f2 = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t b = add_input(&g, 2, LOOM_DTYPE_BOOL, SHAPE(2, 3));
    int32_t v = add_input(&g, 3, LOOM_DTYPE_F32, SHAPE(3));
    int32_t m = add_input(&g, 4, LOOM_DTYPE_F32, SHAPE(3, 4));
    /* operand lists outlive the switch that picks them */
    int32_t sd = add_input(&g, 5, LOOM_DTYPE_I64, 0, NULL);
    int32_t un[1] = {f}, bin[2] = {f, f2}, sel[3] = {b, f, f2}, vec[1] = {v}, mm[2] = {f, m};
    int32_t seed[1] = {sd};
    int32_t cx = add_input(&g, 6, LOOM_DTYPE_F32, SHAPE(1, 2, 5, 5));
    int32_t cw = add_input(&g, 7, LOOM_DTYPE_F32, SHAPE(4, 1, 3, 3));
    int32_t cy = add_input(&g, 8, LOOM_DTYPE_F32, SHAPE(1, 4, 3, 3));
    int32_t py = add_input(&g, 9, LOOM_DTYPE_F32, SHAPE(1, 2, 3, 2));
    /* indices i32[2,5] into f32[2,3] along axis 1; a scatter's src f32[2,5] */
    int32_t gi = add_input(&g, 10, LOOM_DTYPE_I32, SHAPE(2, 5));
    int32_t gs = add_input(&g, 11, LOOM_DTYPE_F32, SHAPE(2, 5));
    int32_t gat[2] = {f, gi}, sca[3] = {f, gi, gs};
    /* attention: q f32[2,3] (f) against k [4,3], v [4,5]; do [2,5], lse and delta f32[2] */
    int32_t ak = add_input(&g, 12, LOOM_DTYPE_F32, SHAPE(4, 3));
    int32_t av = add_input(&g, 13, LOOM_DTYPE_F32, SHAPE(4, 5));
    int32_t ad = add_input(&g, 14, LOOM_DTYPE_F32, SHAPE(2, 5));
    int32_t as = add_input(&g, 15, LOOM_DTYPE_F32, SHAPE(2));
    int32_t att[6] = {f, ak, av, ad, as, as}, attv[4] = {f, ak, ad, as};
    const int64_t sh45[2] = {4, 5}, sh23[2] = {2, 3}, sh312[3] = {3, 1, 2}, sh12[2] = {1, 2};
    int n_checked = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        const loom_ir_op_info *info = &loom_ir_op_table[op];
        loom_ir_node_desc desc = {.op = (loom_ir_op)op};
        const char *want = NULL;
        switch (info->kind) {
        case LOOM_IR_KIND_SOURCE:
            desc.dtype = LOOM_DTYPE_F64;
            desc.rank = 2;
            desc.shape = sh45;
            desc.attrs.index = 7;
            want = "f64[4,5]";
            break;
        case LOOM_IR_KIND_UNARY:
            desc.n_inputs = 1;
            desc.inputs = un;
            want = "f32[2,3]";
            break;
        case LOOM_IR_KIND_PREDICATE:
            desc.n_inputs = 1;
            desc.inputs = un;
            want = "bool[2,3]";
            break;
        case LOOM_IR_KIND_BINARY:
            desc.n_inputs = 2;
            desc.inputs = bin;
            want = "f32[2,3]";
            break;
        case LOOM_IR_KIND_COMPARE:
            desc.n_inputs = 2;
            desc.inputs = bin;
            want = "bool[2,3]";
            break;
        case LOOM_IR_KIND_SELECT:
            desc.n_inputs = 3;
            desc.inputs = sel;
            want = "f32[2,3]";
            break;
        case LOOM_IR_KIND_CAST:
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.dtype = LOOM_DTYPE_BF16;
            want = "bf16[2,3]";
            break;
        case LOOM_IR_KIND_BROADCAST:
            desc.n_inputs = 1;
            desc.inputs = vec;
            desc.rank = 2;
            desc.shape = sh23;
            want = "f32[2,3]";
            break;
        case LOOM_IR_KIND_RESHAPE:
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.rank = 3;
            desc.shape = sh312;
            want = "f32[3,1,2]";
            break;
        case LOOM_IR_KIND_TRANSPOSE:
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.attrs.perm[0] = 1;
            desc.attrs.perm[1] = 0;
            want = "f32[3,2]";
            break;
        case LOOM_IR_KIND_REDUCTION:
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.attrs.axes = 1u << 1;
            want = "f32[2]";
            break;
        case LOOM_IR_KIND_CONTRACTION:
            desc.n_inputs = 2;
            desc.inputs = mm;
            want = "f32[2,4]";
            break;
        case LOOM_IR_KIND_SLICE: /* f32[2,3]: row 1, columns 0 and 2 */
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.rank = 2;
            desc.shape = sh12;
            desc.attrs = (loom_ir_attrs){.start = {1, 0}, .step = {1, 2}};
            want = "f32[1,2]";
            break;
        case LOOM_IR_KIND_PAD: /* [2,3] with low 1, interior 1 on axis 1, high 0: [4,5] */
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.rank = 2;
            desc.shape = sh45;
            desc.attrs = (loom_ir_attrs){.start = {1, 0}, .step = {0, 1}, .value = 2};
            want = "f32[4,5]";
            break;
        case LOOM_IR_KIND_CONCAT:
            desc.n_inputs = 2;
            desc.inputs = bin;
            desc.attrs.index = 1;
            want = "f32[2,6]";
            break;
        case LOOM_IR_KIND_IOTA:
            desc.dtype = LOOM_DTYPE_I32;
            desc.rank = 2;
            desc.shape = sh45;
            desc.attrs.index = 1;
            want = "i32[4,5]";
            break;
        case LOOM_IR_KIND_RAND:
            desc.n_inputs = 1;
            desc.inputs = seed;
            desc.dtype = LOOM_DTYPE_BF16;
            desc.rank = 2;
            desc.shape = sh23;
            want = "bf16[2,3]";
            break;
        case LOOM_IR_KIND_COLLECTIVE: /* max-reduce scaled by 0.5, root 1, or world 2 */
            desc.n_inputs = 1;
            desc.inputs = un;
            desc.attrs.index = op == LOOM_IR_OP_ALL_GATHER ? 2 : 1;
            desc.attrs.value = op == LOOM_IR_OP_ALL_REDUCE ? 0.5 : 0.0;
            want = op == LOOM_IR_OP_ALL_GATHER ? "f32[4,3]" : "f32[2,3]";
            break;
        case LOOM_IR_KIND_CONV: { /* 3x3, stride 2, padding 1, groups 2: 5x5 -> 3x3 */
            static int32_t ops[3][2];
            int w = op == LOOM_IR_OP_CONV2D ? 0 : op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? 1 : 2;
            ops[0][0] = cx, ops[0][1] = cw, ops[1][0] = cy, ops[1][1] = cw;
            ops[2][0] = cx, ops[2][1] = cy;
            static const int64_t res[3][4] = {{0}, {1, 2, 5, 5}, {4, 1, 3, 3}};
            desc.n_inputs = 2;
            desc.inputs = ops[w];
            desc.rank = w ? 4 : 0;
            desc.shape = res[w];
            desc.attrs.conv = (loom_ir_conv){{2, 2}, {1, 1}, {1, 1}, 2, {0, 0}};
            want = w == 0 ? "f32[1,4,3,3]" : w == 1 ? "f32[1,2,5,5]" : "f32[4,1,3,3]";
            break;
        }
        case LOOM_IR_KIND_POOL: { /* 3x2 window, stride 2, padding [1, 0]: 5x5 -> 3x2 */
            static int32_t ops[2];
            ops[0] = cx, ops[1] = py;
            desc.n_inputs = op == LOOM_IR_OP_MAX_POOL2D ? 1 : 2;
            desc.inputs = ops;
            desc.attrs.conv = (loom_ir_conv){{2, 2}, {1, 0}, {1, 1}, 0, {3, 2}};
            want = op == LOOM_IR_OP_MAX_POOL2D ? "f32[1,2,3,2]" : "f32[1,2,5,5]";
            break;
        }
        case LOOM_IR_KIND_GATHER: /* the indices' shape, the data's dtype */
            desc.n_inputs = 2;
            desc.inputs = gat;
            desc.attrs.index = 1;
            want = "f32[2,5]";
            break;
        case LOOM_IR_KIND_SCATTER: /* the base's type */
            desc.n_inputs = 3;
            desc.inputs = sca;
            desc.attrs.index = 1;
            want = "f32[2,3]";
            break;
        case LOOM_IR_KIND_ATTENTION: /* [L, Ev], lse f32[L], dq [L, E], dk [S, E], dv [S, Ev] */
            desc.n_inputs = loom_ir_attention_operands(op); /* no dropout */
            desc.inputs = op == LOOM_IR_OP_ATTENTION_GRAD_V ? attv : att;
            desc.attrs.value = 0.5;
            want = op == LOOM_IR_OP_ATTENTION          ? "f32[2,5]"
                   : op == LOOM_IR_OP_ATTENTION_LSE    ? "f32[2]"
                   : op == LOOM_IR_OP_ATTENTION_GRAD_Q ? "f32[2,3]"
                   : op == LOOM_IR_OP_ATTENTION_GRAD_K ? "f32[4,3]"
                                                       : "f32[4,5]";
            break;
        case LOOM_IR_KIND_COUNT_: break;
        }
        assert_non_null(want);
        if (info->kind != LOOM_IR_KIND_ATTENTION) /* its operands: by dropout, below */
            assert_int_equal(desc.n_inputs, info->arity < 0 ? 2 : info->arity);
        const char *got = infer_type(&g, desc);
        if (strcmp(got, want) != 0)
            fail_msg("%s: inferred %s, expected %s", info->name, got, want);
        n_checked++;
    }
    assert_int_equal(n_checked, LOOM_IR_OP_COUNT_);
    loom_ir_graph_deinit(&g);
}

/* Every op rejects one operand too many with its arity in the message. */
static void test_infer_rejects_a_wrong_operand_count_for_every_op(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t f = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t ins[7] = {f, f, f, f, f, f, f};
    char want[128];
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        int32_t arity = loom_ir_op_table[op].arity;
        if (arity < 0) /* variadic (concat): checked below */
            continue;
        assert_true(arity <= 6);
        loom_ir_node_desc desc = {.op = (loom_ir_op)op,
                                  .n_inputs = arity + 1,
                                  .inputs = ins,
                                  .dtype = LOOM_DTYPE_F32,
                                  .rank = 2,
                                  .shape = S(2, 3)};
        snprintf(want, sizeof want, "expects %d operand%s, got %d", (int)arity,
                 arity == 1 ? "" : "s", (int)arity + 1);
        const char *got = infer_error(&g, desc);
        if (strcmp(got, want) != 0)
            fail_msg("%s: got \"%s\", expected \"%s\"", loom_ir_op_name((loom_ir_op)op), got, want);
    }
    assert_string_equal(
        infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_ADD, .n_inputs = 1, .inputs = ins}),
        "expects 2 operands, got 1");
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_EXP}),
                        "expects 1 operand, got 0");
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_CONCAT}),
                        "expects at least 1 operand, got 0");
    /* attention's: its own, then an i64 seed exactly where it drops weights, then any mask
     * (bool or q's dtype, to the scores [..., L, S], not with causal) */
    int32_t q = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t seed = add_input(&g, 2, LOOM_DTYPE_I64, 0, NULL);
    int32_t m = add_input(&g, 3, LOOM_DTYPE_BOOL, SHAPE(1, 2));
    int32_t att[5] = {q, q, q, seed, m}, bad_seed[4] = {q, q, q, q};
    loom_ir_node_desc at = {.op = LOOM_IR_OP_ATTENTION, .n_inputs = 5, .inputs = att};
    assert_string_equal(infer_error(&g, at), "expects 3 operands (or a mask after them), got 5");
    at.n_inputs = 4;
    assert_string_equal(infer_error(&g, at),
                        "the mask i64[] must be bool or q's dtype and broadcast to the scores "
                        "[..., L, S] of q f32[2,3] and k f32[2,3]");
    att[3] = m;
    assert_string_equal(infer_type(&g, at), "f32[2,3]"); /* a [1, S] bool mask */
    at.attrs.index = 1;
    assert_string_equal(infer_error(&g, at), "a mask bool[1,2] and causal exclude each other");
    at.attrs.index = 0;
    att[3] = seed;
    at.attrs.dropout = 0.5;
    at.n_inputs = 3;
    assert_string_equal(infer_error(&g, at), "expects 4 operands, the last the dropout's i64 "
                                             "seed (or a mask after them), got 3");
    at.n_inputs = 4;
    at.inputs = bad_seed;
    assert_string_equal(infer_error(&g, at),
                        "the dropout's seed must be an i64 scalar, got f32[2,3]");
    at.attrs.dropout = 1;
    assert_string_equal(infer_error(&g, at), "attention needs a dropout in [0, 1), got 1");
    at.op = LOOM_IR_OP_ATTENTION_LSE;
    at.attrs.dropout = 0.5;
    at.n_inputs = 2;
    assert_string_equal(infer_error(&g, at), "attention_lse needs a dropout in [0, 1) of 0 (its "
                                             "scores are not dropped), got 0.5");
    loom_ir_graph_deinit(&g);
}

/* Each op of a restricted dtype class names the operand, its type and the class it needs. */
static void test_infer_rejects_operands_outside_the_ops_dtype_class(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t i = add_input(&g, 0, LOOM_DTYPE_I32, SHAPE(2, 3));
    int32_t b = add_input(&g, 1, LOOM_DTYPE_BOOL, SHAPE(2, 3));
    char want[256];
    int n_float = 0, n_num = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        const loom_ir_op_info *info = &loom_ir_op_table[op];
        if (info->dtypes == LOOM_IR_DT_ANY)
            continue;
        bool is_float = info->dtypes == LOOM_IR_DT_FLOAT;
        int32_t bad = is_float ? i : b;
        loom_ir_node_desc desc = {.op = (loom_ir_op)op,
                                  .n_inputs = info->kind == LOOM_IR_KIND_ATTENTION
                                                  ? loom_ir_attention_operands((loom_ir_op)op)
                                                  : info->arity,
                                  .inputs = (int32_t[]){bad, bad, bad, bad, bad, bad}};
        snprintf(want, sizeof want, "operand 0 has dtype %s[2,3]; %s needs %s",
                 is_float ? "i32" : "bool", info->name,
                 is_float ? "a float dtype" : "a numeric dtype");
        const char *got = infer_error(&g, desc);
        if (strcmp(got, want) != 0)
            fail_msg("%s: got \"%s\", expected \"%s\"", info->name, got, want);
        n_float += is_float;
        n_num += !is_float;
    }
    /* exp, log, sqrt, rsqrt, tanh, sigmoid, gelu, gelu_tanh, isfinite, pow, reduce_mean,
     * conv2d with its two gradients, max_pool2d with its gradient, the 5 attention ops */
    assert_int_equal(n_float, 21);
    assert_true(n_num >= 10);
    int32_t small = add_input(&g, 2, LOOM_DTYPE_I32, SHAPE(2));
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_EXP,
                                                            .n_inputs = 1,
                                                            .inputs = (int32_t[]){small}}),
                        "operand 0 has dtype i32[2]; exp needs a float dtype");
    /* The second operand is checked too. */
    int32_t f = add_input(&g, 3, LOOM_DTYPE_F32, SHAPE(2, 3));
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_POW,
                                                            .n_inputs = 2,
                                                            .inputs = (int32_t[]){f, i}}),
                        "operand 1 has dtype i32[2,3]; pow needs a float dtype");
    loom_ir_graph_deinit(&g);
}

/* ---- inference: per kind ----------------------------------------------------------------- */

static void test_infer_matmul_contracts_the_inner_dimension(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t a = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t w = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(3, 4));
    int32_t ba = add_input(&g, 2, LOOM_DTYPE_BF16, SHAPE(5, 2, 3));
    int32_t bw = add_input(&g, 3, LOOM_DTYPE_BF16, SHAPE(5, 3, 7));
    int32_t ia = add_input(&g, 4, LOOM_DTYPE_I32, SHAPE(2, 6, 1, 8));
    int32_t iw = add_input(&g, 5, LOOM_DTYPE_I32, SHAPE(2, 6, 8, 1));
    loom_ir_node_desc mm = {.op = LOOM_IR_OP_MATMUL, .n_inputs = 2};
    mm.inputs = (int32_t[]){a, w};
    assert_string_equal(infer_type(&g, mm), "f32[2,4]");
    mm.inputs = (int32_t[]){ba, bw};
    assert_string_equal(infer_type(&g, mm), "bf16[5,2,7]");
    mm.inputs = (int32_t[]){ia, iw};
    assert_string_equal(infer_type(&g, mm), "i32[2,6,1,1]");
    mm.inputs = (int32_t[]){iw, ia};
    assert_string_equal(infer_type(&g, mm), "i32[2,6,8,8]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_matmul_errors_name_both_types(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(64, 784));
    int32_t w = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(512, 784));
    int32_t wd = add_input(&g, 2, LOOM_DTYPE_F64, SHAPE(784, 512));
    int32_t v = add_input(&g, 3, LOOM_DTYPE_F32, SHAPE(784));
    int32_t b1 = add_input(&g, 4, LOOM_DTYPE_F32, SHAPE(5, 2, 3));
    int32_t b2 = add_input(&g, 5, LOOM_DTYPE_F32, SHAPE(6, 3, 4));
    loom_ir_node_desc mm = {.op = LOOM_IR_OP_MATMUL, .n_inputs = 2};
    mm.inputs = (int32_t[]){x, w};
    assert_string_equal(infer_error(&g, mm), "inner dimensions differ: f32[64,784] x f32[512,784]");
    mm.inputs = (int32_t[]){x, wd};
    assert_string_equal(infer_error(&g, mm), "dtypes differ: f32[64,784] x f64[784,512]");
    mm.inputs = (int32_t[]){v, x};
    assert_string_equal(infer_error(&g, mm),
                        "operands need equal ranks >= 2: f32[784] x f32[64,784]");
    mm.inputs = (int32_t[]){x, b2};
    assert_string_equal(infer_error(&g, mm),
                        "operands need equal ranks >= 2: f32[64,784] x f32[6,3,4]");
    mm.inputs = (int32_t[]){b1, b2};
    assert_string_equal(infer_error(&g, mm), "batch dimensions differ: f32[5,2,3] x f32[6,3,4]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_reduction_uses_the_axes_bitmask_and_keepdim(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2, 3, 4));
    int32_t i = add_input(&g, 1, LOOM_DTYPE_I32, SHAPE(2, 3, 4));
    loom_ir_node_desc r = {.op = LOOM_IR_OP_REDUCE_SUM, .n_inputs = 1, .inputs = (int32_t[]){x}};
    r.attrs.axes = 0x5; /* axes 0 and 2 */
    assert_string_equal(infer_type(&g, r), "f32[3]");
    r.attrs.keepdim = true;
    assert_string_equal(infer_type(&g, r), "f32[1,3,1]");
    r.attrs.axes = 0x7;
    assert_string_equal(infer_type(&g, r), "f32[1,1,1]");
    r.attrs.keepdim = false;
    assert_string_equal(infer_type(&g, r), "f32[]");
    r.attrs.axes = 0x2;
    assert_string_equal(infer_type(&g, r), "f32[2,4]");
    r.attrs.axes = 0; /* no axes: the identity */
    assert_string_equal(infer_type(&g, r), "f32[2,3,4]");
    r.op = LOOM_IR_OP_REDUCE_MAX;
    r.inputs = (int32_t[]){i};
    r.attrs.axes = 0x4;
    assert_string_equal(infer_type(&g, r), "i32[2,3]");
    r.op = LOOM_IR_OP_REDUCE_MEAN;
    r.inputs = (int32_t[]){x};
    r.attrs.axes = 0x1;
    r.attrs.keepdim = true;
    assert_string_equal(infer_type(&g, r), "f32[1,3,4]");
    r.attrs.axes = 0x8; /* axis 3 of a rank-3 operand */
    assert_string_equal(infer_error(&g, r), "reduction axes 0x8 are out of range for f32[2,3,4]");
    r.attrs.axes = 0x80000000u;
    assert_string_equal(infer_error(&g, r),
                        "reduction axes 0x80000000 are out of range for f32[2,3,4]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_transpose_permutes_by_perm(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_F16, SHAPE(2, 3, 4));
    int32_t s = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(2, 3));
    loom_ir_node_desc t = {.op = LOOM_IR_OP_TRANSPOSE,
                           .n_inputs = 1,
                           .inputs = (int32_t[]){x},
                           .attrs.perm = {2, 0, 1}};
    assert_string_equal(infer_type(&g, t), "f16[4,2,3]");
    t.attrs = (loom_ir_attrs){.perm = {0, 1, 2}};
    assert_string_equal(infer_type(&g, t), "f16[2,3,4]");
    t.attrs = (loom_ir_attrs){.perm = {1, 2, 0}};
    assert_string_equal(infer_type(&g, t), "f16[3,4,2]");
    const char *bad3 = "perm is not a permutation of the 3 axes of f16[2,3,4]";
    t.attrs = (loom_ir_attrs){.perm = {0, 0, 1}};
    assert_string_equal(infer_error(&g, t), bad3);
    t.attrs = (loom_ir_attrs){.perm = {0, 1, 3}};
    assert_string_equal(infer_error(&g, t), bad3);
    t.attrs = (loom_ir_attrs){.perm = {-1, 0, 1}};
    assert_string_equal(infer_error(&g, t), bad3);
    t.inputs = (int32_t[]){s};
    t.attrs = (loom_ir_attrs){.perm = {1, 1}};
    assert_string_equal(infer_error(&g, t), "perm is not a permutation of the 2 axes of f32[2,3]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_broadcast_follows_numpy_alignment(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t v = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(3));
    int32_t c = add_input(&g, 1, LOOM_DTYPE_I64, SHAPE(2, 1));
    int32_t s = add_const(&g, LOOM_DTYPE_BF16, 1.5);
    loom_ir_node_desc bc = {.op = LOOM_IR_OP_BROADCAST, .n_inputs = 1};
    bc.inputs = (int32_t[]){v};
    bc.rank = 2;
    bc.shape = S(2, 3);
    assert_string_equal(infer_type(&g, bc), "f32[2,3]");
    bc.inputs = (int32_t[]){c};
    assert_string_equal(infer_type(&g, bc), "i64[2,3]");
    bc.rank = 3;
    bc.shape = S(4, 2, 5);
    assert_string_equal(infer_type(&g, bc), "i64[4,2,5]");
    bc.inputs = (int32_t[]){s};
    bc.rank = 2;
    bc.shape = S(4, 5);
    assert_string_equal(infer_type(&g, bc), "bf16[4,5]");
    bc.rank = 0;
    bc.shape = NULL;
    assert_string_equal(infer_type(&g, bc), "bf16[]");
    /* errors */
    bc.inputs = (int32_t[]){v};
    bc.rank = 2;
    bc.shape = S(2, 4);
    assert_string_equal(infer_error(&g, bc), "cannot broadcast f32[3] to f32[2,4]");
    bc.inputs = (int32_t[]){c};
    bc.rank = 1;
    bc.shape = S(3);
    assert_string_equal(infer_error(&g, bc), "cannot broadcast i64[2,1] to i64[3]");
    bc.rank = 2;
    bc.shape = S(3, 3);
    assert_string_equal(infer_error(&g, bc), "cannot broadcast i64[2,1] to i64[3,3]");
    bc.shape = S(2, -1);
    assert_string_equal(infer_error(&g, bc), "extent -1 of axis 1 is negative");
    loom_ir_graph_deinit(&g);
}

static void test_infer_elementwise_compare_cast_and_select(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_F64, SHAPE(4));
    int32_t y = add_input(&g, 1, LOOM_DTYPE_F64, SHAPE(4));
    int32_t k = add_input(&g, 2, LOOM_DTYPE_I64, SHAPE(4));
    int32_t cond = add_input(&g, 3, LOOM_DTYPE_BOOL, SHAPE(4));
    int32_t fcond = add_input(&g, 4, LOOM_DTYPE_F32, SHAPE(4));
    int32_t y5 = add_input(&g, 5, LOOM_DTYPE_F64, SHAPE(5));
    int32_t x2 = add_input(&g, 6, LOOM_DTYPE_F64, SHAPE(4, 1));
    loom_ir_node_desc d2 = {.op = LOOM_IR_OP_LT, .n_inputs = 2, .inputs = (int32_t[]){x, y}};
    assert_string_equal(infer_type(&g, d2), "bool[4]");
    d2.op = LOOM_IR_OP_EQ; /* eq accepts bool operands */
    d2.inputs = (int32_t[]){cond, cond};
    assert_string_equal(infer_type(&g, d2), "bool[4]");
    d2.op = LOOM_IR_OP_MAXIMUM;
    d2.inputs = (int32_t[]){k, k};
    assert_string_equal(infer_type(&g, d2), "i64[4]");
    d2.op = LOOM_IR_OP_SUB;
    d2.inputs = (int32_t[]){x, k};
    assert_string_equal(infer_error(&g, d2), "dtypes differ: f64[4] vs i64[4]");
    d2.inputs = (int32_t[]){x, y5};
    assert_string_equal(infer_error(&g, d2), "shapes differ: f64[4] vs f64[5]");
    d2.op = LOOM_IR_OP_GE;
    d2.inputs = (int32_t[]){x, x2};
    assert_string_equal(infer_error(&g, d2), "shapes differ: f64[4] vs f64[4,1]");

    loom_ir_node_desc cast = {.op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = (int32_t[]){x}};
    cast.dtype = LOOM_DTYPE_I32;
    assert_string_equal(infer_type(&g, cast), "i32[4]");
    cast.dtype = LOOM_DTYPE_BOOL;
    assert_string_equal(infer_type(&g, cast), "bool[4]");
    cast.inputs = (int32_t[]){cond};
    cast.dtype = LOOM_DTYPE_F16;
    assert_string_equal(infer_type(&g, cast), "f16[4]");
    cast.dtype = (loom_dtype)42;
    assert_string_equal(infer_error(&g, cast), "target dtype 42 is not a valid dtype");

    loom_ir_node_desc sel = {.op = LOOM_IR_OP_SELECT, .n_inputs = 3};
    sel.inputs = (int32_t[]){cond, x, y};
    assert_string_equal(infer_type(&g, sel), "f64[4]");
    sel.inputs = (int32_t[]){cond, cond, cond};
    assert_string_equal(infer_type(&g, sel), "bool[4]");
    sel.inputs = (int32_t[]){fcond, x, y};
    assert_string_equal(infer_error(&g, sel), "condition must be bool, got f32[4]");
    sel.inputs = (int32_t[]){cond, x, k};
    assert_string_equal(infer_error(&g, sel), "dtypes differ: f64[4] vs i64[4]");
    sel.inputs = (int32_t[]){cond, x, y5};
    assert_string_equal(infer_error(&g, sel), "shapes differ: bool[4], f64[4], f64[5]");

    loom_ir_node_desc pred = {.op = LOOM_IR_OP_ISFINITE, .n_inputs = 1, .inputs = (int32_t[]){x2}};
    assert_string_equal(infer_type(&g, pred), "bool[4,1]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_reshape_keeps_the_element_count(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_I32, SHAPE(2, 3));
    int32_t z = add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(0, 5));
    loom_ir_node_desc r = {.op = LOOM_IR_OP_RESHAPE, .n_inputs = 1, .inputs = (int32_t[]){x}};
    r.rank = 1;
    r.shape = S(6);
    assert_string_equal(infer_type(&g, r), "i32[6]");
    r.rank = 4;
    r.shape = S(1, 3, 1, 2);
    assert_string_equal(infer_type(&g, r), "i32[1,3,1,2]");
    r.rank = 1;
    r.shape = S(4);
    assert_string_equal(infer_error(&g, r),
                        "cannot reshape i32[2,3] to i32[4]: element counts differ");
    r.rank = 2;
    r.shape = S(-2, -3); /* the IR takes no -1 wildcard: the frontend resolves it */
    assert_string_equal(infer_error(&g, r), "extent -2 of axis 0 is negative");
    r.inputs = (int32_t[]){z};
    r.rank = 3;
    r.shape = S(5, 0, 7);
    assert_string_equal(infer_type(&g, r), "f32[5,0,7]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_sources_check_dtype_rank_extents_and_index(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    loom_ir_node_desc in = {.op = LOOM_IR_OP_INPUT, .dtype = LOOM_DTYPE_F32};
    assert_string_equal(infer_type(&g, in), "f32[]");
    in.rank = 2;
    in.shape = S(3, -1);
    assert_string_equal(infer_error(&g, in), "extent -1 of axis 1 is negative");
    in.rank = 9;
    in.shape = S(1, 1, 1, 1, 1, 1, 1, 1, 1);
    assert_string_equal(infer_error(&g, in), "rank 9 is out of range (0..8)");
    in.rank = -1;
    assert_string_equal(infer_error(&g, in), "rank -1 is out of range (0..8)");
    in.rank = 8;
    in.shape = S(1, 2, 1, 2, 1, 2, 1, 2);
    assert_string_equal(infer_type(&g, in), "f32[1,2,1,2,1,2,1,2]");
    in.rank = 2;
    in.shape = NULL;
    assert_string_equal(infer_error(&g, in), "shape is NULL for rank 2");
    in.rank = 3;
    in.shape = S(1 << 30, 1 << 30, 1 << 30);
    assert_string_equal(infer_error(&g, in), "shape has too many elements");
    in.rank = 1;
    in.shape = S(2);
    in.attrs.index = -1;
    assert_string_equal(infer_error(&g, in), "input index -1 is out of range");
    in.attrs.index = (int64_t)INT32_MAX + 1;
    assert_string_equal(infer_error(&g, in), "input index 2147483648 is out of range");
    /* INT32_MAX itself would make the graph's input count (index + 1) overflow int32 */
    in.attrs.index = INT32_MAX;
    assert_string_equal(infer_error(&g, in), "input index 2147483647 is out of range");
    in.attrs.index = INT32_MAX - 1;
    assert_string_equal(infer_type(&g, in), "f32[2]");
    in.attrs.index = 0;
    in.dtype = (loom_dtype)LOOM_DTYPE_COUNT_;
    assert_string_equal(infer_error(&g, in), "dtype 7 is not a valid dtype");
    /* a constant carries no index: a negative one is irrelevant */
    loom_ir_node_desc c = {.op = LOOM_IR_OP_CONSTANT,
                           .dtype = LOOM_DTYPE_I64,
                           .rank = 1,
                           .shape = S(3),
                           .attrs = {.index = -5, .value = 2.0}};
    assert_string_equal(infer_type(&g, c), "i64[3]");
    loom_ir_graph_deinit(&g);
}

static void test_infer_rejects_bad_operand_references_and_unknown_ops(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_ADD,
                                                            .n_inputs = 2,
                                                            .inputs = (int32_t[]){x, 7}}),
                        "operand 1 refers to %7, which does not exist");
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_NEG,
                                                            .n_inputs = 1,
                                                            .inputs = (int32_t[]){-1}}),
                        "operand 0 refers to %-1, which does not exist");
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = LOOM_IR_OP_NEG, .n_inputs = 1}),
                        "operand list is NULL");
    assert_string_equal(infer_error(&g, (loom_ir_node_desc){.op = (loom_ir_op)99}),
                        "unknown op 99");
    /* graph_add reports the same error and appends nothing */
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id = 1234;
    loom_ir_node_desc bad = {.op = LOOM_IR_OP_EXP, .n_inputs = 1, .inputs = (int32_t[]){5}};
    assert_int_equal(loom_ir_graph_add(&g, &bad, &id, &d), LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "operand 0 refers to %5, which does not exist");
    assert_int_equal(id, 1234);
    assert_int_equal(g.n_nodes, 1);
    loom_ir_graph_deinit(&g);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_infer_types_every_op_by_its_kind),
        cmocka_unit_test(test_infer_rejects_a_wrong_operand_count_for_every_op),
        cmocka_unit_test(test_infer_rejects_operands_outside_the_ops_dtype_class),
        cmocka_unit_test(test_infer_matmul_contracts_the_inner_dimension),
        cmocka_unit_test(test_infer_matmul_errors_name_both_types),
        cmocka_unit_test(test_infer_reduction_uses_the_axes_bitmask_and_keepdim),
        cmocka_unit_test(test_infer_transpose_permutes_by_perm),
        cmocka_unit_test(test_infer_broadcast_follows_numpy_alignment),
        cmocka_unit_test(test_infer_elementwise_compare_cast_and_select),
        cmocka_unit_test(test_infer_reshape_keeps_the_element_count),
        cmocka_unit_test(test_infer_sources_check_dtype_rank_extents_and_index),
        cmocka_unit_test(test_infer_rejects_bad_operand_references_and_unknown_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
