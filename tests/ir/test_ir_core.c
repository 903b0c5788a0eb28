/* Unit tests of the IR core: the verifier, dtype helpers, hashing and equality,
 * extraction and memory helpers (inference: test_ir_infer.c; files: test_ir_file.c). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir_test_util.h"

static loom_allocator sys;

/* ---- verifier ---------------------------------------------------------------------------- */

/* %0 = input 0 f32[2,3]; %1 = input 1 f32[3]; %2 = broadcast %1 : f32[2,3];
 * %3 = add %0, %2; %4 = reduce_sum %3 {axes = [0]} : f32[3]; return %3 {alias 0}, %4 {alias 1} */
static void build_good_graph(loom_ir_graph *g) {
    loom_ir_graph_init(g, &sys);
    int32_t x = add_input(g, 0, LOOM_DTYPE_F32, SHAPE(2, 3));
    int32_t b = add_input(g, 1, LOOM_DTYPE_F32, SHAPE(3));
    int32_t bb = add_broadcast(g, b, SHAPE(2, 3));
    int32_t s = add2(g, LOOM_IR_OP_ADD, x, bb);
    int32_t r = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_REDUCE_SUM,
                                                   .n_inputs = 1,
                                                   .inputs = (int32_t[]){s},
                                                   .attrs.axes = 1});
    tu_output(g, s, 0);
    tu_output(g, r, 1);
}

static void expect_verify_failure(const loom_ir_graph *g, int32_t node, const char *msg) {
    loom_ir_diag d;
    loom_status st = verify(g, &d);
    if (st != LOOM_STATUS_VERIFY_FAILED || d.code != LOOM_STATUS_VERIFY_FAILED ||
        d.node != node || strcmp(d.msg, msg) != 0)
        fail_msg("verify gave %s, node %d, \"%s\"; expected VERIFY_FAILED, node %d, \"%s\"",
                 loom_status_name(st), (int)d.node, d.msg, (int)node, msg);
}

static void test_verify_accepts_well_formed_graphs(void **state) {
    (void)state;
    loom_ir_graph g;
    build_good_graph(&g);
    assert_int_equal(g.n_graph_inputs, 2);
    assert_verifies(&g);
    /* inputs may appear in any order as long as each index appears once */
    loom_ir_graph h;
    loom_ir_graph_init(&h, &sys);
    int32_t b = add_input(&h, 1, LOOM_DTYPE_I32, SHAPE(4));
    int32_t a = add_input(&h, 0, LOOM_DTYPE_I32, SHAPE(4));
    tu_output(&h, add2(&h, LOOM_IR_OP_MUL, a, b), 1);
    assert_verifies(&h);
    /* the empty graph is valid */
    loom_ir_graph e;
    loom_ir_graph_init(&e, &sys);
    assert_verifies(&e);
    loom_ir_graph_deinit(&e);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_verify_rejects_a_tampered_node_type(void **state) {
    (void)state;
    loom_ir_graph g;
    build_good_graph(&g);
    g.nodes[3].shape[1] = 4;
    expect_verify_failure(&g, 3, "%3: declared type f32[2,4], but the operands give f32[2,3]");
    g.nodes[3].shape[1] = 3;
    g.nodes[3].dtype = LOOM_DTYPE_F16;
    expect_verify_failure(&g, 3, "%3: declared type f16[2,3], but the operands give f32[2,3]");
    g.nodes[3].dtype = LOOM_DTYPE_F32;
    g.nodes[4].rank = 2;
    g.nodes[4].shape[1] = 1;
    expect_verify_failure(&g, 4, "%4: declared type f32[3,1], but the operands give f32[3]");
    g.nodes[4].rank = 1;
    assert_verifies(&g);
    /* a node whose attributes no longer infer: the inference message is kept */
    g.nodes[4].attrs.axes = 0x10;
    expect_verify_failure(&g, 4,
                          "%4: reduce_sum: reduction axes 0x10 are out of range for f32[2,3]");
    g.nodes[4].attrs.axes = 1;
    g.nodes[2].op = (loom_ir_op)77;
    expect_verify_failure(&g, 2, "%2: unknown op 77");
    loom_ir_graph_deinit(&g);
}

static void test_verify_rejects_an_operand_that_is_not_earlier(void **state) {
    (void)state;
    loom_ir_graph g;
    build_good_graph(&g);
    g.nodes[3].inputs[1] = 4; /* forward */
    expect_verify_failure(&g, 3, "%3: add operand 1 is not an earlier node");
    g.nodes[3].inputs[1] = 3; /* itself */
    expect_verify_failure(&g, 3, "%3: add operand 1 is not an earlier node");
    g.nodes[3].inputs[1] = -1;
    expect_verify_failure(&g, 3, "%3: add operand 1 is not an earlier node");
    g.nodes[3].inputs[1] = 2;
    g.nodes[2].inputs[0] = 40;
    expect_verify_failure(&g, 2, "%2: broadcast operand 0 is not an earlier node");
    loom_ir_graph_deinit(&g);
}

static void test_verify_rejects_bad_input_numbering(void **state) {
    (void)state;
    /* the same index twice */
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t a = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    int32_t b = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    tu_output(&g, add2(&g, LOOM_IR_OP_ADD, a, b), -1);
    expect_verify_failure(&g, 1, "%1: input index 0 is used twice");
    loom_ir_graph_deinit(&g);

    /* a gap: indices 0 and 2, no 1. No node is at fault, so d.node stays -1. */
    loom_ir_graph_init(&g, &sys);
    a = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    b = add_input(&g, 2, LOOM_DTYPE_F32, SHAPE(2));
    tu_output(&g, add2(&g, LOOM_IR_OP_ADD, a, b), -1);
    assert_int_equal(g.n_graph_inputs, 3);
    expect_verify_failure(&g, -1, "graph input 1 has no input node");
    loom_ir_graph_deinit(&g);

    /* an index past n_graph_inputs (the count was tampered with) */
    loom_ir_graph_init(&g, &sys);
    add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    add_input(&g, 1, LOOM_DTYPE_F32, SHAPE(2));
    g.n_graph_inputs = 1;
    expect_verify_failure(&g, 1, "%1: input index 1 is out of range");
    loom_ir_graph_deinit(&g);
}

static void test_verify_rejects_bad_outputs_and_aliases(void **state) {
    (void)state;
    loom_ir_graph g;
    build_good_graph(&g);
    g.outputs[1].node = 5;
    expect_verify_failure(&g, -1, "output 1 names %5, which does not exist");
    g.outputs[1].node = -1;
    expect_verify_failure(&g, -1, "output 1 names %-1, which does not exist");
    g.outputs[1].node = 4;
    assert_verifies(&g);

    g.outputs[1].alias = 2; /* there are inputs 0 and 1 only */
    expect_verify_failure(&g, 4, "%4: output 1 aliases input 2, which does not exist");
    g.outputs[1].alias = -2;
    expect_verify_failure(&g, 4, "%4: output 1 aliases input -2, which does not exist");

    g.outputs[1].alias = 0; /* f32[3] into input 0, an f32[2,3] */
    expect_verify_failure(&g, 4, "%4: output of type f32[3] cannot be written into f32[2,3]");

    g.outputs[1].alias = 1;
    g.outputs[0].alias = 1; /* f32[2,3] into input 1, an f32[3] */
    expect_verify_failure(&g, 3, "%3: output of type f32[2,3] cannot be written into f32[3]");
    g.outputs[0].alias = 0;
    assert_verifies(&g);

    /* two outputs donated into the same input */
    int32_t n = add1(&g, LOOM_IR_OP_NEG, 3);
    tu_output(&g, n, 0);
    expect_verify_failure(&g, n, "%5: two outputs alias input 0");
    g.outputs[2].alias = -1;
    assert_verifies(&g);

    /* an alias naming an index that has no input node (the count was tampered with) */
    g.n_graph_inputs = 3;
    g.outputs[2].alias = 2;
    expect_verify_failure(&g, -1, "graph input 2 has no input node");
    loom_ir_graph_deinit(&g);
}

static void test_verify_an_alias_to_a_missing_input_node_names_the_output(void **state) {
    (void)state;
    /* The only input node was turned into a constant and the input count dropped to
     * match: the output's alias now names an input that does not exist. */
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t a = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    int32_t n = add1(&g, LOOM_IR_OP_NEG, a);
    tu_output(&g, n, 0);
    g.nodes[0].op = LOOM_IR_OP_CONSTANT;
    g.n_graph_inputs = 0;
    expect_verify_failure(&g, 1, "%1: output 0 aliases input 0, which does not exist");
    loom_ir_graph_deinit(&g);
}

/* Over 256 inputs the verifier allocates its bookkeeping; that allocation can fail. */
static void test_verify_handles_many_inputs_and_out_of_memory(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int32_t acc = add_input(&g, 0, LOOM_DTYPE_F32, SHAPE(2));
    for (int64_t i = 1; i < 300; i++)
        acc = add2(&g, LOOM_IR_OP_ADD, acc, add_input(&g, i, LOOM_DTYPE_F32, SHAPE(2)));
    tu_output(&g, acc, 299);
    assert_int_equal(g.n_graph_inputs, 300);
    int64_t before = ta.live_bytes;
    assert_verifies(&g);
    assert_int_equal(ta.live_bytes, before);
    ta.fail_at = ta.n_allocs + 1;
    loom_ir_diag d;
    assert_int_equal(verify(&g, &d), LOOM_STATUS_OUT_OF_MEMORY);
    assert_string_equal(d.msg, "out of memory verifying");
    assert_int_equal(ta.live_bytes, before);
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

/* ---- dtypes ------------------------------------------------------------------------------ */

static void test_dtype_table_names_sizes_and_classes(void **state) {
    (void)state;
    static const struct {
        loom_dtype dt;
        const char *name;
        size_t size;
        bool is_float, is_int;
    } want[] = {
        {LOOM_DTYPE_F32, "f32", 4, true, false},   {LOOM_DTYPE_F16, "f16", 2, true, false},
        {LOOM_DTYPE_BF16, "bf16", 2, true, false}, {LOOM_DTYPE_F64, "f64", 8, true, false},
        {LOOM_DTYPE_I32, "i32", 4, false, true},   {LOOM_DTYPE_I64, "i64", 8, false, true},
        {LOOM_DTYPE_BOOL, "bool", 1, false, false},
    };
    assert_int_equal(sizeof want / sizeof want[0], LOOM_DTYPE_COUNT_);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_string_equal(loom_dtype_name(want[i].dt), want[i].name);
        assert_int_equal(loom_dtype_size(want[i].dt), want[i].size);
        assert_int_equal(loom_ir_dtype_is_float(want[i].dt), want[i].is_float);
        assert_int_equal(loom_ir_dtype_is_int(want[i].dt), want[i].is_int);
        assert_int_equal(loom_ir_dtype_from_name(want[i].name, strlen(want[i].name)), want[i].dt);
        assert_true(loom_ir_dtype_in_class(want[i].dt, LOOM_IR_DT_ANY));
        assert_int_equal(loom_ir_dtype_in_class(want[i].dt, LOOM_IR_DT_NUM),
                         want[i].dt != LOOM_DTYPE_BOOL);
        assert_int_equal(loom_ir_dtype_in_class(want[i].dt, LOOM_IR_DT_FLOAT), want[i].is_float);
    }
    assert_string_equal(loom_dtype_name(LOOM_DTYPE_COUNT_), "?");
    assert_string_equal(loom_dtype_name((loom_dtype)-1), "?");
    assert_int_equal(loom_dtype_size(LOOM_DTYPE_COUNT_), 0);
    assert_false(loom_ir_dtype_in_class(LOOM_DTYPE_COUNT_, LOOM_IR_DT_ANY));
    assert_int_equal(loom_ir_dtype_from_name("f3", 2), LOOM_DTYPE_COUNT_);
    assert_int_equal(loom_ir_dtype_from_name("f32x", 4), LOOM_DTYPE_COUNT_);
    assert_int_equal(loom_ir_dtype_from_name("f32x", 3), LOOM_DTYPE_F32); /* len bounds it */
}

static void test_format_type_prints_dtype_and_extents(void **state) {
    (void)state;
    char buf[LOOM_IR_TYPE_STR_MAX];
    assert_string_equal(loom_ir_format_type(buf, sizeof buf, LOOM_DTYPE_F32, 2, S(64, 784)),
                        "f32[64,784]");
    assert_string_equal(loom_ir_format_type(buf, sizeof buf, LOOM_DTYPE_BOOL, 0, NULL), "bool[]");
    assert_string_equal(loom_ir_format_type(buf, sizeof buf, LOOM_DTYPE_I64, 8,
                                            S(1, 2, 3, 4, 5, 6, 7, 9223372036854775807)),
                        "i64[1,2,3,4,5,6,7,9223372036854775807]");
    /* a short buffer truncates and stays terminated */
    char small[8];
    assert_string_equal(loom_ir_format_type(small, sizeof small, LOOM_DTYPE_F32, 2, S(64, 784)),
                        "f32[64,");
    assert_int_equal(loom_ir_numel(0, NULL), 1);
    assert_int_equal(loom_ir_numel(3, S(2, 3, 4)), 24);
    assert_int_equal(loom_ir_numel(2, S(5, 0)), 0);
    /* a [3, 1, 5] mask broadcast to [2, 3, 4, 5] scores: 0 on the axes it lacks or spans 1 */
    int64_t st[4] = {-1, -1, -1, -1};
    assert_int_equal(loom_ir_broadcast_strides(3, S(3, 1, 5), 4, st), 15);
    assert_int_equal(st[0], 0);
    assert_int_equal(st[1], 5);
    assert_int_equal(st[2], 0);
    assert_int_equal(st[3], 1);
    assert_int_equal(loom_ir_broadcast_strides(0, NULL, 2, st), 1);
    assert_int_equal(st[0] | st[1], 0);
}

static void test_bf16_rounds_to_nearest_even(void **state) {
    (void)state;
    assert_int_equal(loom_ir_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(loom_ir_f32_to_bf16(-2.0f), 0xc000);
    /* 1 + 2^-8 is halfway between 1 (even mantissa) and 1 + 2^-7: ties go to even */
    assert_int_equal(loom_ir_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up */
    assert_int_equal(loom_ir_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* just above the tie rounds up */
    assert_int_equal(loom_ir_f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    assert_int_equal(loom_ir_f32_to_bf16(bits_f32(0x3f807fffu)), 0x3f80);
    /* a carry into the exponent: the largest mantissa rounds up to 2.0 */
    assert_int_equal(loom_ir_f32_to_bf16(bits_f32(0x3fffffffu)), 0x4000);
    /* FLT_MAX is past bf16's largest finite value plus half an ulp: inf */
    assert_int_equal(loom_ir_f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(loom_ir_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(loom_ir_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(loom_ir_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(loom_ir_f32_to_bf16(0.0f), 0x0000);
    /* the smallest f32 subnormal rounds to zero (it is below half of bf16's smallest) */
    assert_int_equal(loom_ir_f32_to_bf16(bits_f32(0x00000001u)), 0x0000);
    assert_int_equal(loom_ir_f32_to_bf16(bits_f32(0x00010000u)), 0x0001);
    /* NaN stays NaN, including a signalling NaN whose payload lies in the dropped bits
     * (plain rounding would turn it into inf) */
    uint16_t qn = loom_ir_f32_to_bf16(NAN);
    assert_true(isnan(loom_ir_bf16_to_f32(qn)));
    uint16_t sn = loom_ir_f32_to_bf16(bits_f32(0x7f800001u));
    assert_true((sn & 0x7f80) == 0x7f80 && (sn & 0x7f) != 0);
    assert_true(isnan(loom_ir_bf16_to_f32(sn)));
    uint16_t nn = loom_ir_f32_to_bf16(bits_f32(0xffffffffu));
    assert_true(isnan(loom_ir_bf16_to_f32(nn)));
    assert_int_equal(nn & 0x8000, 0x8000);
    /* widening is exact */
    assert_int_equal(f32_bits(loom_ir_bf16_to_f32(0x3f80)), 0x3f800000u);
    assert_int_equal(f32_bits(loom_ir_bf16_to_f32(0x8000)), 0x80000000u);
    assert_true(loom_ir_bf16_to_f32(0x4049) == 3.140625f);
}

static void test_f16_rounds_to_nearest_even_with_subnormals_and_overflow(void **state) {
    (void)state;
    assert_int_equal(loom_ir_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(loom_ir_f32_to_f16(-1.5f), 0xbe00);
    /* ulp at 1 is 2^-10: 1 + 2^-11 ties to 1, 1 + 3*2^-11 ties up to 1 + 2^-9 */
    assert_int_equal(loom_ir_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(loom_ir_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(loom_ir_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* carry into the exponent: 2 - 2^-12 is above the midpoint of 2 - 2^-10 and 2 */
    assert_int_equal(loom_ir_f32_to_f16(2.0f - 0x1p-12f), 0x4000);
    /* the top of the range: 65504 is the largest finite; 65519.99 still rounds to it;
     * 65520 is the midpoint to 65536 and ties away from the odd 0x7bff to inf */
    assert_int_equal(loom_ir_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(loom_ir_f32_to_f16(bits_f32(f32_bits(65520.0f) - 1)), 0x7bff);
    assert_int_equal(loom_ir_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(loom_ir_f32_to_f16(-65520.0f), 0xfc00);
    assert_int_equal(loom_ir_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(loom_ir_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(loom_ir_f32_to_f16(-INFINITY), 0xfc00);
    /* subnormals: the unit is 2^-24 */
    assert_int_equal(loom_ir_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(loom_ir_f32_to_f16(-0x1p-24f), 0x8001);
    assert_int_equal(loom_ir_f32_to_f16(0x1p-25f), 0x0000);          /* tie to even 0 */
    assert_int_equal(loom_ir_f32_to_f16(0x1.8p-25f), 0x0001);        /* 0.75 ulp up */
    assert_int_equal(loom_ir_f32_to_f16(3 * 0x1p-25f), 0x0002);      /* 1.5 ulp: tie to 2 */
    assert_int_equal(loom_ir_f32_to_f16(5 * 0x1p-25f), 0x0002);      /* 2.5 ulp: tie to 2 */
    assert_int_equal(loom_ir_f32_to_f16(1023 * 0x1p-24f), 0x03ff);   /* largest subnormal */
    assert_int_equal(loom_ir_f32_to_f16(1023.5f * 0x1p-24f), 0x0400); /* rounds to 2^-14 */
    assert_int_equal(loom_ir_f32_to_f16(0x1p-14f), 0x0400);          /* smallest normal */
    assert_int_equal(loom_ir_f32_to_f16(0x1p-30f), 0x0000);
    assert_int_equal(loom_ir_f32_to_f16(bits_f32(0x00000001u)), 0x0000);
    assert_int_equal(loom_ir_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(loom_ir_f32_to_f16(0.0f), 0x0000);
    /* NaN stays NaN, also with a payload only in the low bits */
    uint16_t qn = loom_ir_f32_to_f16(NAN);
    assert_int_equal(qn & 0x7e00, 0x7e00);
    assert_true(isnan(loom_ir_f16_to_f32(qn)));
    uint16_t sn = loom_ir_f32_to_f16(bits_f32(0xff800001u));
    assert_true(isnan(loom_ir_f16_to_f32(sn)));
    assert_int_equal(sn & 0x8000, 0x8000);
    /* widening is exact */
    assert_true(loom_ir_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(loom_ir_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(loom_ir_f16_to_f32(0x8001) == -0x1p-24f);
    assert_true(loom_ir_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(loom_ir_f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_int_equal(f32_bits(loom_ir_f16_to_f32(0x8000)), 0x80000000u);
    assert_int_equal(f32_bits(loom_ir_f16_to_f32(0x7c00)), 0x7f800000u);
    assert_int_equal(f32_bits(loom_ir_f16_to_f32(0xfc00)), 0xff800000u);
    /* every finite f16 survives a round trip through f32 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        uint16_t back = loom_ir_f32_to_f16(loom_ir_f16_to_f32((uint16_t)h));
        if (back != h)
            fail_msg("f16 0x%04x came back as 0x%04x", (unsigned)h, (unsigned)back);
    }
}

static void test_typed_loads_and_stores_convert_and_saturate(void **state) {
    (void)state;
    int32_t i32[4];
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 0, 1e20);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 1, NAN);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 2, -3.7);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 3, -1e20);
    assert_int_equal(i32[0], INT32_MAX);
    assert_int_equal(i32[1], 0);
    assert_int_equal(i32[2], -3);
    assert_int_equal(i32[3], INT32_MIN);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 0, 3.99);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 1, -INFINITY);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 2, 2147483647.0);
    loom_ir_store_f64(i32, LOOM_DTYPE_I32, 3, -0.9);
    assert_int_equal(i32[0], 3);
    assert_int_equal(i32[1], INT32_MIN);
    assert_int_equal(i32[2], INT32_MAX);
    assert_int_equal(i32[3], 0);
    assert_true(loom_ir_load_f64(i32, LOOM_DTYPE_I32, 1) == -2147483648.0);

    int64_t i64[3];
    loom_ir_store_f64(i64, LOOM_DTYPE_I64, 0, 1e30);
    loom_ir_store_f64(i64, LOOM_DTYPE_I64, 1, -1e30);
    loom_ir_store_f64(i64, LOOM_DTYPE_I64, 2, 0x1p53);
    assert_true(i64[0] == INT64_MAX);
    assert_true(i64[1] == INT64_MIN);
    assert_true(i64[2] == 9007199254740992LL);
    loom_ir_store_i64(i64, LOOM_DTYPE_I64, 0, INT64_MIN + 1);
    assert_true(loom_ir_load_i64(i64, LOOM_DTYPE_I64, 0) == INT64_MIN + 1);

    uint8_t b[5];
    loom_ir_store_f64(b, LOOM_DTYPE_BOOL, 0, 0.5);
    loom_ir_store_f64(b, LOOM_DTYPE_BOOL, 1, -0.0);
    loom_ir_store_f64(b, LOOM_DTYPE_BOOL, 2, NAN);
    loom_ir_store_i64(b, LOOM_DTYPE_BOOL, 3, 256); /* not truncated to a byte's 0 */
    loom_ir_store_i64(b, LOOM_DTYPE_BOOL, 4, 0);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[1], 0);
    assert_int_equal(b[2], 1);
    assert_int_equal(b[3], 1);
    assert_int_equal(b[4], 0);
    b[0] = 7; /* any nonzero byte loads as true */
    assert_true(loom_ir_load_f64(b, LOOM_DTYPE_BOOL, 0) == 1.0);
    assert_int_equal(loom_ir_load_i64(b, LOOM_DTYPE_BOOL, 0), 1);

    uint16_t h[2];
    loom_ir_store_f64(h, LOOM_DTYPE_BF16, 0, 1.0);
    loom_ir_store_f64(h, LOOM_DTYPE_F16, 1, 65520.0);
    assert_int_equal(h[0], 0x3f80);
    assert_int_equal(h[1], 0x7c00);
    loom_ir_store_i64(h, LOOM_DTYPE_F16, 0, -3);
    assert_int_equal(h[0], 0xc200);
    assert_true(loom_ir_load_f64(h, LOOM_DTYPE_F16, 0) == -3.0);
    assert_int_equal(loom_ir_load_i64(h, LOOM_DTYPE_F16, 0), -3);

    float f[2] = {-2.5f, 1e30f};
    assert_int_equal(loom_ir_load_i64(f, LOOM_DTYPE_F32, 0), -2); /* toward zero */
    assert_true(loom_ir_load_i64(f, LOOM_DTYPE_F32, 1) == INT64_MAX);
    double dd[1];
    loom_ir_store_i64(dd, LOOM_DTYPE_F64, 0, -7);
    assert_true(dd[0] == -7.0);
    loom_ir_store_f64(f, LOOM_DTYPE_F32, 0, 0.1);
    assert_true(f[0] == 0.1f);
}

/* ---- hash and equality ------------------------------------------------------------------- */

/* %0 = input 0 f32[3,3]; %1 = input 1 f32[3,3]; %2 = constant 0.5 f32[];
 * %3 = broadcast %2 f32[3,3]; %4 = sub %0, %3; %5 = mul %4, %1;
 * %6 = transpose %5 perm [1,0]; %7 = reduce_sum %5 axes {1}; return %5 {alias 0}, %7, %6 */
static void build_hash_sample(loom_ir_graph *g, const char *file) {
    loom_ir_graph_init(g, &sys);
    loom_ir_loc loc = {.file = file, .line = 1};
    int32_t x = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                                   .dtype = LOOM_DTYPE_F32,
                                                   .rank = 2,
                                                   .shape = S(3, 3),
                                                   .loc = loc});
    loc.line++;
    int32_t y = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                                   .dtype = LOOM_DTYPE_F32,
                                                   .rank = 2,
                                                   .shape = S(3, 3),
                                                   .attrs.index = 1,
                                                   .loc = loc});
    int32_t c = add_const(g, LOOM_DTYPE_F32, 0.5);
    int32_t cb = add_broadcast(g, c, SHAPE(3, 3));
    loc.line += 10;
    int32_t s = tu_add_desc(
        g, (loom_ir_node_desc){
               .op = LOOM_IR_OP_SUB, .n_inputs = 2, .inputs = (int32_t[]){x, cb}, .loc = loc});
    int32_t m = add2(g, LOOM_IR_OP_MUL, s, y);
    int32_t t = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_TRANSPOSE,
                                                   .n_inputs = 1,
                                                   .inputs = (int32_t[]){m},
                                                   .attrs.perm = {1, 0}});
    int32_t r = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_REDUCE_SUM,
                                                   .n_inputs = 1,
                                                   .inputs = (int32_t[]){m},
                                                   .attrs.axes = 2});
    tu_output(g, m, 0);
    tu_output(g, r, -1);
    tu_output(g, t, -1);
}

static void test_hash_is_equal_for_equal_graphs_whatever_their_locations(void **state) {
    (void)state;
    loom_ir_graph a, b;
    build_hash_sample(&a, "train.c");
    build_hash_sample(&b, NULL);
    assert_verifies(&a);
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    assert_true(loom_ir_graph_equal(&a, &b));
    assert_true(loom_ir_graph_equal(&b, &a));
    /* moving a node's line, or its file, changes nothing either */
    b.nodes[4].loc.line = 999;
    b.nodes[0].loc.file = "elsewhere.c";
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    assert_true(loom_ir_graph_equal(&a, &b));
    /* nor does an attribute the op does not carry (add has none; inputs have no value) */
    b.nodes[4].attrs.value = 3.0;
    b.nodes[4].attrs.axes = 7;
    b.nodes[0].attrs.value = 9.0;
    b.nodes[2].attrs.index = 5;
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    assert_true(loom_ir_graph_equal(&a, &b));
    /* nor perm entries past the node's rank */
    b.nodes[6].attrs.perm[2] = 5;
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    assert_true(loom_ir_graph_equal(&a, &b));
    /* a copy is equal */
    loom_ir_graph c;
    loom_ir_graph_init(&c, &sys);
    assert_int_equal(loom_ir_graph_copy(&c, &a), LOOM_OK);
    assert_int_equal(c.n_graph_inputs, 2);
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&c));
    assert_true(loom_ir_graph_equal(&a, &c));
    assert_string_equal(c.nodes[0].loc.file, "train.c");
    assert_true(c.nodes[0].loc.file != a.nodes[0].loc.file); /* owned by c */
    loom_ir_graph_deinit(&c);
    loom_ir_graph_deinit(&a);
    loom_ir_graph_deinit(&b);
}

/* Graphs without outputs (or without anything) compare by their nodes alone. */
static void test_equality_of_graphs_without_outputs(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_graph_init(&a, &sys);
    loom_ir_graph_init(&b, &sys);
    assert_true(loom_ir_graph_equal(&a, &b));
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    add_input(&a, 0, LOOM_DTYPE_F32, SHAPE(2));
    assert_false(loom_ir_graph_equal(&a, &b));
    assert_true(loom_ir_graph_hash(&a) != loom_ir_graph_hash(&b));
    add_input(&b, 0, LOOM_DTYPE_F32, SHAPE(2));
    assert_true(loom_ir_graph_equal(&a, &b));
    assert_true(loom_ir_graph_hash(&a) == loom_ir_graph_hash(&b));
    loom_ir_graph_deinit(&a);
    loom_ir_graph_deinit(&b);
}

typedef enum mutation {
    MUT_EXTENT,
    MUT_DTYPE,
    MUT_RANK,
    MUT_CONST_VALUE,
    MUT_CONST_NEG_ZERO,
    MUT_PERM,
    MUT_AXES,
    MUT_KEEPDIM,
    MUT_INPUT_INDEX,
    MUT_SWAP_SUB,
    MUT_EDGE,
    MUT_OP,
    MUT_OUTPUT_NODE,
    MUT_OUTPUT_ORDER,
    MUT_ALIAS_ADDED,
    MUT_ALIAS_REMOVED,
    MUT_OUTPUT_DROPPED,
    MUT_COUNT_
} mutation;

static const char *const mutation_names[MUT_COUNT_] = {
    "extent", "dtype", "rank", "constant value", "constant -0.0", "perm", "axes", "keepdim",
    "input index", "swapped sub operands", "edge", "op", "output node", "output order",
    "alias added", "alias removed", "output dropped",
};

/* One structural change to b, a copy of the sample; the changed graph need not verify:
 * the hash must tell the fields apart on their own. */
static void mutate(loom_ir_graph *b, mutation m) {
    switch (m) {
    case MUT_EXTENT: b->nodes[1].shape[1] = 4; break;
    case MUT_DTYPE: b->nodes[1].dtype = LOOM_DTYPE_F64; break;
    case MUT_RANK: b->nodes[7].rank = 2; b->nodes[7].shape[1] = 1; break;
    case MUT_CONST_VALUE: b->nodes[2].attrs.value = 0.25; break;
    case MUT_CONST_NEG_ZERO:
        b->nodes[2].attrs.value = 0.0;
        break;
    case MUT_PERM:
        b->nodes[6].attrs.perm[0] = 0;
        b->nodes[6].attrs.perm[1] = 1;
        break;
    case MUT_AXES: b->nodes[7].attrs.axes = 1; break;
    case MUT_KEEPDIM: b->nodes[7].attrs.keepdim = true; break;
    case MUT_INPUT_INDEX:
        b->nodes[0].attrs.index = 1;
        b->nodes[1].attrs.index = 0;
        break;
    case MUT_SWAP_SUB: {
        int32_t t = b->nodes[4].inputs[0];
        b->nodes[4].inputs[0] = b->nodes[4].inputs[1];
        b->nodes[4].inputs[1] = t;
        break;
    }
    case MUT_EDGE: b->nodes[5].inputs[1] = 0; break; /* mul %4, %0 instead of %4, %1 */
    case MUT_OP: b->nodes[5].op = LOOM_IR_OP_ADD; break;
    case MUT_OUTPUT_NODE: b->outputs[1].node = 4; break;
    case MUT_OUTPUT_ORDER: {
        loom_ir_output t = b->outputs[1];
        b->outputs[1] = b->outputs[2];
        b->outputs[2] = t;
        break;
    }
    case MUT_ALIAS_ADDED: b->outputs[2].alias = 1; break;
    case MUT_ALIAS_REMOVED: b->outputs[0].alias = -1; break;
    case MUT_OUTPUT_DROPPED: b->n_outputs = 2; break;
    case MUT_COUNT_: break;
    }
}

static void test_hash_and_equality_see_every_structural_change(void **state) {
    (void)state;
    loom_ir_graph a;
    build_hash_sample(&a, "a.c");
    uint64_t ha = loom_ir_graph_hash(&a);
    uint64_t seen[MUT_COUNT_];
    for (int m = 0; m < MUT_COUNT_; m++) {
        loom_ir_graph b;
        loom_ir_graph_init(&b, &sys);
        assert_int_equal(loom_ir_graph_copy(&b, &a), LOOM_OK);
        if (m == MUT_CONST_NEG_ZERO) { /* compare 0.0 with -0.0, which are different graphs */
            a.nodes[2].attrs.value = -0.0;
            ha = loom_ir_graph_hash(&a);
        }
        mutate(&b, (mutation)m);
        uint64_t hb = loom_ir_graph_hash(&b);
        if (hb == ha)
            fail_msg("mutation '%s' did not change the hash", mutation_names[m]);
        if (loom_ir_graph_equal(&a, &b) || loom_ir_graph_equal(&b, &a))
            fail_msg("mutation '%s' left the graphs equal", mutation_names[m]);
        seen[m] = hb;
        if (m == MUT_CONST_NEG_ZERO) {
            a.nodes[2].attrs.value = 0.5;
            ha = loom_ir_graph_hash(&a);
        }
        loom_ir_graph_deinit(&b);
    }
    /* and the mutations hash apart from each other */
    for (int i = 0; i < MUT_COUNT_; i++)
        for (int j = i + 1; j < MUT_COUNT_; j++)
            if (seen[i] == seen[j])
                fail_msg("mutations '%s' and '%s' hash equal", mutation_names[i],
                         mutation_names[j]);
    loom_ir_graph_deinit(&a);
}

/* ---- extract ----------------------------------------------------------------------------- */

/* %0 = input 0 f32[2]; %1 = input 1 f32[2]; %2 = input 2 f32[2]; %3 = exp %2;
 * %4 = neg %0; %5 = add %3, %2 */
static void build_extract_source(loom_ir_graph *g) {
    loom_ir_graph_init(g, &sys);
    int32_t x0 = add_input(g, 0, LOOM_DTYPE_F32, SHAPE(2));
    add_input(g, 1, LOOM_DTYPE_F32, SHAPE(2));
    int32_t x2 = add_input(g, 2, LOOM_DTYPE_F32, SHAPE(2));
    int32_t e = add1(g, LOOM_IR_OP_EXP, x2);
    add1(g, LOOM_IR_OP_NEG, x0);
    add2(g, LOOM_IR_OP_ADD, e, x2);
}

static void assert_node(const loom_ir_graph *g, int32_t id, loom_ir_op op, int32_t n_inputs,
                        int32_t in0, int32_t in1) {
    assert_true(id < g->n_nodes);
    const loom_ir_node *n = &g->nodes[id];
    if (n->op != op || n->n_inputs != n_inputs || (n_inputs > 0 && n->inputs[0] != in0) ||
        (n_inputs > 1 && n->inputs[1] != in1))
        fail_msg("node %%%d is %s with %d operands (%d, %d); expected %s (%d, %d)", (int)id,
                 loom_ir_op_name(n->op), (int)n->n_inputs, n->n_inputs > 0 ? n->inputs[0] : -1,
                 n->n_inputs > 1 ? n->inputs[1] : -1, loom_ir_op_name(op), (int)in0, (int)in1);
}

static void test_extract_keeps_what_the_roots_need_and_renumbers_inputs(void **state) {
    (void)state;
    loom_ir_graph src, dst;
    build_extract_source(&src);
    loom_ir_graph_init(&dst, &sys);
    int32_t map[6];
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 1, (int32_t[]){5}, NULL, false, map),
                     LOOM_OK);
    assert_int_equal(dst.n_nodes, 3);
    assert_node(&dst, 0, LOOM_IR_OP_INPUT, 0, -1, -1);
    assert_int_equal(dst.nodes[0].attrs.index, 0); /* was input 2 */
    assert_node(&dst, 1, LOOM_IR_OP_EXP, 1, 0, -1);
    assert_node(&dst, 2, LOOM_IR_OP_ADD, 2, 1, 0);
    assert_int_equal(dst.n_graph_inputs, 1);
    assert_int_equal(dst.n_outputs, 1);
    assert_int_equal(dst.outputs[0].node, 2);
    assert_int_equal(dst.outputs[0].alias, -1);
    const int32_t want_map[6] = {-1, -1, 0, 1, -1, 2};
    assert_memory_equal(map, want_map, sizeof want_map);
    assert_verifies(&dst);

    /* without a map, and reusing dst: the old contents are replaced */
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 2, (int32_t[]){4, 3}, NULL, false, NULL),
                     LOOM_OK);
    assert_int_equal(dst.n_nodes, 4);
    assert_node(&dst, 0, LOOM_IR_OP_INPUT, 0, -1, -1);
    assert_int_equal(dst.nodes[0].attrs.index, 0); /* was input 0 */
    assert_node(&dst, 1, LOOM_IR_OP_INPUT, 0, -1, -1);
    assert_int_equal(dst.nodes[1].attrs.index, 1); /* was input 2 */
    assert_node(&dst, 2, LOOM_IR_OP_EXP, 1, 1, -1);
    assert_node(&dst, 3, LOOM_IR_OP_NEG, 1, 0, -1);
    assert_int_equal(dst.n_graph_inputs, 2);
    assert_int_equal(dst.outputs[0].node, 3); /* roots keep their order */
    assert_int_equal(dst.outputs[1].node, 2);
    assert_verifies(&dst);
    loom_ir_graph_deinit(&dst);
    loom_ir_graph_deinit(&src);
}

static void test_extract_with_keep_inputs_keeps_every_input_and_its_index(void **state) {
    (void)state;
    loom_ir_graph src, dst;
    build_extract_source(&src);
    loom_ir_graph_init(&dst, &sys);
    int32_t map[6];
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 1, (int32_t[]){5}, (int32_t[]){2}, true,
                                           map),
                     LOOM_OK);
    assert_int_equal(dst.n_nodes, 5);
    for (int32_t i = 0; i < 3; i++) {
        assert_node(&dst, i, LOOM_IR_OP_INPUT, 0, -1, -1);
        assert_int_equal(dst.nodes[i].attrs.index, i);
    }
    assert_node(&dst, 3, LOOM_IR_OP_EXP, 1, 2, -1);
    assert_node(&dst, 4, LOOM_IR_OP_ADD, 2, 3, 2);
    assert_int_equal(dst.n_graph_inputs, 3);
    assert_int_equal(dst.outputs[0].node, 4);
    assert_int_equal(dst.outputs[0].alias, 2); /* indices are unchanged, so is the alias */
    const int32_t want_map[6] = {0, 1, 2, 3, -1, 4};
    assert_memory_equal(map, want_map, sizeof want_map);
    assert_verifies(&dst);
    loom_ir_graph_deinit(&dst);
    loom_ir_graph_deinit(&src);
}

static void test_extract_translates_aliases_and_keeps_aliased_inputs(void **state) {
    (void)state;
    loom_ir_graph src, dst;
    build_extract_source(&src);
    loom_ir_graph_init(&dst, &sys);
    int32_t map[6];
    /* the root aliases input 2, the only live one: it becomes input 0 */
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 1, (int32_t[]){5}, (int32_t[]){2}, false,
                                           map),
                     LOOM_OK);
    assert_int_equal(dst.n_nodes, 3);
    assert_int_equal(dst.outputs[0].alias, 0);
    assert_verifies(&dst);

    /* the root aliases input 1, which nothing reads: it is kept (the result is written into
     * it) and numbered in node order, before input 2 */
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 1, (int32_t[]){5}, (int32_t[]){1}, false,
                                           map),
                     LOOM_OK);
    assert_int_equal(dst.n_nodes, 4);
    assert_node(&dst, 0, LOOM_IR_OP_INPUT, 0, -1, -1);
    assert_int_equal(dst.nodes[0].attrs.index, 0); /* was input 1 */
    assert_node(&dst, 1, LOOM_IR_OP_INPUT, 0, -1, -1);
    assert_int_equal(dst.nodes[1].attrs.index, 1); /* was input 2 */
    assert_node(&dst, 2, LOOM_IR_OP_EXP, 1, 1, -1);
    assert_node(&dst, 3, LOOM_IR_OP_ADD, 2, 2, 1);
    assert_int_equal(dst.n_graph_inputs, 2);
    assert_int_equal(dst.outputs[0].node, 3);
    assert_int_equal(dst.outputs[0].alias, 0);
    const int32_t want_map[6] = {-1, 0, 1, 2, -1, 3};
    assert_memory_equal(map, want_map, sizeof want_map);
    assert_verifies(&dst);

    /* two roots, one aliased, one not */
    assert_int_equal(loom_ir_graph_extract(&dst, &src, 2, (int32_t[]){4, 3},
                                           (int32_t[]){-1, 2}, false, NULL),
                     LOOM_OK);
    assert_int_equal(dst.n_outputs, 2);
    assert_int_equal(dst.outputs[0].alias, -1);
    assert_int_equal(dst.outputs[1].alias, 1); /* input 2 became input 1 (after input 0) */
    assert_verifies(&dst);
    loom_ir_graph_deinit(&dst);
    loom_ir_graph_deinit(&src);
}

static void test_extract_leaks_nothing_when_allocations_fail(void **state) {
    (void)state;
    loom_ir_graph src;
    build_extract_source(&src);
    int failures = 0;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc ta = {.fail_at = fail_at};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph dst;
        loom_ir_graph_init(&dst, &a);
        loom_status st = loom_ir_graph_extract(&dst, &src, 1, (int32_t[]){5}, (int32_t[]){1},
                                               false, NULL);
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_int_equal(dst.n_nodes, 4);
            loom_ir_graph_deinit(&dst);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(dst.n_nodes, 0); /* left empty */
        assert_int_equal(dst.n_outputs, 0);
        loom_ir_graph_deinit(&dst);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
        failures++;
    }
    assert_true(failures >= 3); /* map, arena, nodes, outputs */
    loom_ir_graph_deinit(&src);
}

/* ---- memory helpers ---------------------------------------------------------------------- */

static void test_arena_aligns_grows_and_resets_to_one_chunk(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_arena ar;
    loom_ir_arena_init(&ar, &a);
    assert_int_equal(ta.n_allocs, 0); /* lazy */
    char *p1 = loom_ir_arena_alloc(&ar, 1);
    char *p2 = loom_ir_arena_alloc(&ar, 17);
    char *p3 = loom_ir_arena_alloc(&ar, 0);
    assert_non_null(p1);
    assert_int_equal((uintptr_t)p1 % 16, 0);
    assert_int_equal((uintptr_t)p2 % 16, 0);
    assert_int_equal((uintptr_t)p3 % 16, 0);
    assert_int_equal(p2 - p1, 16);
    assert_int_equal(p3 - p2, 32);
    assert_int_equal(ta.n_allocs, 1);
    char *s = loom_ir_arena_strndup(&ar, "hello, world", 5);
    assert_string_equal(s, "hello");
    /* a block larger than a chunk gets a chunk of its own */
    char *big = loom_ir_arena_alloc(&ar, 100000);
    assert_non_null(big);
    memset(big, 0xab, 100000);
    assert_string_equal(s, "hello"); /* earlier allocations stay put */
    assert_int_equal(ta.n_allocs, 2);
    for (int i = 0; i < 2000; i++)
        assert_non_null(loom_ir_arena_alloc(&ar, 64));
    int64_t n_before_reset = ta.n_allocs;
    assert_true(n_before_reset >= 3);
    loom_ir_arena_reset(&ar);
    assert_int_equal(ta.live_blocks, 1); /* the oldest chunk stays */
    char *q = loom_ir_arena_alloc(&ar, 100);
    assert_true(q == p1); /* reused from the start */
    assert_int_equal(ta.n_allocs, n_before_reset);
    /* out of memory: NULL, and the arena still works afterwards */
    ta.fail_at = ta.n_allocs + 1;
    assert_null(loom_ir_arena_alloc(&ar, 1 << 20));
    ta.fail_at = 0;
    assert_non_null(loom_ir_arena_alloc(&ar, 1 << 20));
    loom_ir_arena_deinit(&ar);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
    loom_ir_arena_reset(&ar); /* on an empty arena: nothing happens */
    loom_ir_arena_deinit(&ar);
}

static void test_sbuf_appends_formats_and_flags_out_of_memory(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &a);
    assert_null(sb.data);
    loom_ir_sbuf_append(&sb, "abc", 3);
    loom_ir_sbuf_printf(&sb, "-%d-%s", 42, "x");
    loom_ir_sbuf_write("!", 1, &sb);
    assert_string_equal(sb.data, "abc-42-x!");
    assert_int_equal(sb.len, 9);
    /* a formatted piece longer than the printf scratch buffer */
    char longer[600];
    memset(longer, 'z', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    loom_ir_sbuf_printf(&sb, "[%s]", longer);
    assert_int_equal(sb.len, 9 + 601);
    assert_int_equal(sb.data[9], '[');
    assert_int_equal(sb.data[9 + 600], ']');
    assert_int_equal(sb.data[sb.len], '\0');
    assert_int_equal(strlen(sb.data), sb.len);
    assert_false(sb.oom);
    /* growth that fails sets oom and drops everything after */
    ta.fail_at = ta.n_allocs + 1;
    char chunk[2000];
    memset(chunk, 'y', sizeof chunk);
    loom_ir_sbuf_append(&sb, chunk, sizeof chunk);
    assert_true(sb.oom);
    assert_int_equal(sb.len, 610);
    ta.fail_at = 0;
    loom_ir_sbuf_append(&sb, "q", 1);
    assert_int_equal(sb.len, 610);
    loom_ir_sbuf_deinit(&sb);
    assert_null(sb.data);
    assert_int_equal(ta.live_bytes, 0);
    /* a failing allocation inside printf's long path */
    loom_ir_sbuf_init(&sb, &a);
    ta.fail_at = ta.n_allocs + 1;
    loom_ir_sbuf_printf(&sb, "%s", longer);
    assert_true(sb.oom);
    loom_ir_sbuf_deinit(&sb);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_grow_doubles_from_eight_and_fails_cleanly(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    int64_t *arr = NULL;
    int32_t cap = 0;
    assert_true(loom_ir_grow(&a, (void **)&arr, &cap, 5, sizeof *arr));
    assert_int_equal(cap, 8);
    assert_int_equal(ta.live_bytes, 64);
    for (int i = 0; i < 8; i++)
        arr[i] = i * 11;
    assert_true(loom_ir_grow(&a, (void **)&arr, &cap, 8, sizeof *arr)); /* fits: no call */
    assert_int_equal(ta.n_allocs, 1);
    assert_true(loom_ir_grow(&a, (void **)&arr, &cap, 9, sizeof *arr));
    assert_int_equal(cap, 16);
    assert_true(loom_ir_grow(&a, (void **)&arr, &cap, 100, sizeof *arr));
    assert_int_equal(cap, 128);
    assert_int_equal(arr[7], 77); /* contents kept */
    /* failure leaves the array and its capacity alone */
    ta.fail_at = ta.n_allocs + 1;
    int64_t *old = arr;
    assert_false(loom_ir_grow(&a, (void **)&arr, &cap, 129, sizeof *arr));
    assert_true(arr == old);
    assert_int_equal(cap, 128);
    assert_int_equal(arr[7], 77);
    ta.fail_at = 0;
    /* a capacity past INT32_MAX is refused without allocating */
    int64_t n = ta.n_allocs;
    assert_false(loom_ir_grow(&a, (void **)&arr, &cap, INT32_MAX, 1));
    assert_int_equal(ta.n_allocs, n);
    assert_int_equal(cap, 128);
    loom_ir_free(&a, arr, (size_t)cap * sizeof *arr);
    assert_int_equal(ta.live_bytes, 0);
    loom_ir_free(&a, NULL, 123); /* NULL is a no-op */
    assert_null(loom_ir_alloc(&a, 0));
}

static void test_diag_keeps_the_first_error(void **state) {
    (void)state;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(d.code, LOOM_OK);
    assert_int_equal(d.node, -1);
    assert_string_equal(d.msg, "");
    assert_int_equal(loom_ir_diag_set(&d, LOOM_STATUS_IO_ERROR, "first %d", 1),
                     LOOM_STATUS_IO_ERROR);
    assert_int_equal(loom_ir_diag_set(&d, LOOM_STATUS_INTERNAL, "second"), LOOM_STATUS_INTERNAL);
    assert_int_equal(d.code, LOOM_STATUS_IO_ERROR);
    assert_string_equal(d.msg, "first 1");
    /* a NULL diagnostic is allowed */
    assert_int_equal(loom_ir_diag_set(NULL, LOOM_STATUS_PARSE_ERROR, "x"),
                     LOOM_STATUS_PARSE_ERROR);
    /* long messages are truncated, not overflowed */
    char longer[1000];
    memset(longer, 'm', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    loom_ir_diag_init(&d);
    loom_ir_diag_set(&d, LOOM_STATUS_INTERNAL, "%s", longer);
    assert_int_equal(strlen(d.msg), sizeof d.msg - 1);
    assert_string_equal(loom_status_name(LOOM_STATUS_VERIFY_FAILED), "VERIFY_FAILED");
    assert_string_equal(loom_status_name((loom_status)99), "UNKNOWN");
}

/* ---- out-of-memory sweep over graph building --------------------------------------------- */

/* Adds node k (0-based) of a 50-node chain over two inputs; locations from three files so
 * interning runs too. */
static loom_status add_chain_node(loom_ir_graph *g, int32_t k, loom_ir_diag *d) {
    static const char *const files[] = {"model.c", "layers.c", "loss.c"};
    static const int64_t shape[2] = {4, 8};
    loom_ir_loc loc = {.file = files[k % 3], .line = 100 + k};
    loom_ir_node_desc desc = {.loc = loc};
    int32_t ins[2];
    if (k < 2) {
        desc.op = LOOM_IR_OP_INPUT;
        desc.dtype = LOOM_DTYPE_F32;
        desc.rank = 2;
        desc.shape = shape;
        desc.attrs.index = k;
    } else if (k % 4 == 0) {
        desc.op = LOOM_IR_OP_ADD;
        ins[0] = k - 1;
        ins[1] = k - 2;
    } else if (k % 4 == 1) {
        desc.op = LOOM_IR_OP_TANH;
        ins[0] = k - 1;
    } else if (k % 4 == 2) {
        desc.op = LOOM_IR_OP_MUL;
        ins[0] = k - 1;
        ins[1] = k % 2; /* one of the two inputs */
    } else {
        desc.op = LOOM_IR_OP_NEG;
        ins[0] = k - 2;
    }
    desc.n_inputs = loom_ir_op_table[desc.op].arity;
    desc.inputs = ins;
    int32_t id = -1;
    loom_status st = loom_ir_graph_add(g, &desc, &id, d);
    if (st == LOOM_OK)
        assert_int_equal(id, k);
    return st;
}

enum { CHAIN_NODES = 50 };

static loom_status build_chain(loom_ir_graph *g, loom_ir_diag *d) {
    for (int32_t k = 0; k < CHAIN_NODES; k++) {
        loom_status st = add_chain_node(g, k, d);
        if (st != LOOM_OK)
            return st;
    }
    loom_status st = loom_ir_graph_add_output(g, CHAIN_NODES - 1, 0);
    if (st == LOOM_OK)
        st = loom_ir_graph_add_output(g, CHAIN_NODES - 2, -1);
    return st;
}

static void test_building_a_graph_fails_cleanly_at_every_allocation(void **state) {
    (void)state;
    loom_ir_graph ref;
    loom_ir_graph_init(&ref, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(build_chain(&ref, &d), LOOM_OK);
    assert_verifies(&ref);
    uint64_t ref_hash = loom_ir_graph_hash(&ref);

    int failures = 0;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc ta = {.fail_at = fail_at};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &a);
        loom_ir_diag_init(&d);
        loom_status st = build_chain(&g, &d);
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_true(loom_ir_graph_hash(&g) == ref_hash);
            loom_ir_graph_deinit(&g);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        if (st != LOOM_STATUS_OUT_OF_MEMORY)
            fail_msg("allocation %lld failed: got %s", (long long)fail_at, loom_status_name(st));
        /* a node failure names the op; an output failure has no diagnostic to fill */
        if (d.code != LOOM_OK) {
            assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
            assert_non_null(strstr(d.msg, "out of memory adding a "));
        }
        loom_ir_graph_deinit(&g);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
        failures++;
    }
    /* nodes 8 -> 16 -> 32 -> 64, the arena chunk, outputs */
    assert_true(failures >= 6);
    loom_ir_graph_deinit(&ref);
}

/* After a failed add the graph is intact: retrying the same node builds the same graph. */
static void test_a_failed_add_leaves_the_graph_usable(void **state) {
    (void)state;
    loom_ir_graph ref;
    loom_ir_graph_init(&ref, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(build_chain(&ref, &d), LOOM_OK);
    int64_t total_allocs;
    {
        test_alloc probe = {0};
        loom_allocator a = test_alloc_make(&probe);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &a);
        assert_int_equal(build_chain(&g, &d), LOOM_OK);
        total_allocs = probe.n_allocs;
        loom_ir_graph_deinit(&g);
    }
    for (int64_t fail_at = 1; fail_at <= total_allocs; fail_at++) {
        test_alloc ta = {.fail_at = fail_at};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &a);
        for (int32_t k = 0; k < CHAIN_NODES; k++) {
            loom_ir_diag_init(&d);
            loom_status st = add_chain_node(&g, k, &d);
            if (st != LOOM_OK) {
                assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
                assert_int_equal(g.n_nodes, k);
                loom_ir_diag_init(&d);
                assert_int_equal(add_chain_node(&g, k, &d), LOOM_OK);
            }
        }
        if (loom_ir_graph_add_output(&g, CHAIN_NODES - 1, 0) != LOOM_OK)
            assert_int_equal(loom_ir_graph_add_output(&g, CHAIN_NODES - 1, 0), LOOM_OK);
        assert_int_equal(loom_ir_graph_add_output(&g, CHAIN_NODES - 2, -1), LOOM_OK);
        assert_int_equal(ta.n_failed, 1);
        assert_verifies(&g);
        assert_true(loom_ir_graph_equal(&g, &ref));
        /* locations survive too */
        for (int32_t k = 0; k < CHAIN_NODES; k++) {
            assert_string_equal(g.nodes[k].loc.file, ref.nodes[k].loc.file);
            assert_int_equal(g.nodes[k].loc.line, 100 + k);
        }
        loom_ir_graph_deinit(&g);
        assert_int_equal(ta.live_bytes, 0);
    }
    loom_ir_graph_deinit(&ref);
}

static void test_graph_reset_empties_and_reuses_memory(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(build_chain(&g, &d), LOOM_OK);
    uint64_t h = loom_ir_graph_hash(&g);
    int64_t n = ta.n_allocs;
    loom_ir_graph_reset(&g);
    assert_int_equal(g.n_nodes, 0);
    assert_int_equal(g.n_outputs, 0);
    assert_int_equal(g.n_graph_inputs, 0);
    assert_verifies(&g);
    /* the steady state: rebuilding the same graph allocates nothing */
    assert_int_equal(build_chain(&g, &d), LOOM_OK);
    assert_int_equal(ta.n_allocs, n);
    assert_true(loom_ir_graph_hash(&g) == h);
    assert_string_equal(g.nodes[5].loc.file, "loss.c");
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(g.n_nodes, 0);
    assert_true(g.alloc.ud == &ta); /* deinit keeps the allocator: the graph can be reused */
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_accepts_well_formed_graphs),
        cmocka_unit_test(test_verify_rejects_a_tampered_node_type),
        cmocka_unit_test(test_verify_rejects_an_operand_that_is_not_earlier),
        cmocka_unit_test(test_verify_rejects_bad_input_numbering),
        cmocka_unit_test(test_verify_rejects_bad_outputs_and_aliases),
        cmocka_unit_test(test_verify_an_alias_to_a_missing_input_node_names_the_output),
        cmocka_unit_test(test_verify_handles_many_inputs_and_out_of_memory),
        cmocka_unit_test(test_dtype_table_names_sizes_and_classes),
        cmocka_unit_test(test_format_type_prints_dtype_and_extents),
        cmocka_unit_test(test_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_f16_rounds_to_nearest_even_with_subnormals_and_overflow),
        cmocka_unit_test(test_typed_loads_and_stores_convert_and_saturate),
        cmocka_unit_test(test_hash_is_equal_for_equal_graphs_whatever_their_locations),
        cmocka_unit_test(test_hash_and_equality_see_every_structural_change),
        cmocka_unit_test(test_equality_of_graphs_without_outputs),
        cmocka_unit_test(test_extract_keeps_what_the_roots_need_and_renumbers_inputs),
        cmocka_unit_test(test_extract_with_keep_inputs_keeps_every_input_and_its_index),
        cmocka_unit_test(test_extract_translates_aliases_and_keeps_aliased_inputs),
        cmocka_unit_test(test_extract_leaks_nothing_when_allocations_fail),
        cmocka_unit_test(test_arena_aligns_grows_and_resets_to_one_chunk),
        cmocka_unit_test(test_sbuf_appends_formats_and_flags_out_of_memory),
        cmocka_unit_test(test_grow_doubles_from_eight_and_fails_cleanly),
        cmocka_unit_test(test_diag_keeps_the_first_error),
        cmocka_unit_test(test_building_a_graph_fails_cleanly_at_every_allocation),
        cmocka_unit_test(test_a_failed_add_leaves_the_graph_usable),
        cmocka_unit_test(test_graph_reset_empties_and_reuses_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
