/* Compiled kernels against the reference interpreter: integer and cast semantics, 16-bit
 * floats, odd sizes, broadcasts, long fused chains, reductions with prologues and
 * epilogues, matmuls with epilogues, many kernels over several threads, the code blob round
 * trip and its corruption checks, dumps, and what codegen refuses (every op in f32 and the
 * vector math: test_codegen_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen_test_util.h"

/* ---- integers, casts, 16-bit floats ------------------------------------------------------- */

static void check_int_ops(loom_dtype dt) {
    static const loom_ir_op un[] = {LOOM_IR_OP_NEG, LOOM_IR_OP_ABS, LOOM_IR_OP_RELU};
    static const loom_ir_op bin[] = {LOOM_IR_OP_ADD, LOOM_IR_OP_SUB,     LOOM_IR_OP_MUL,
                                     LOOM_IR_OP_DIV, LOOM_IR_OP_MAXIMUM, LOOM_IR_OP_MINIMUM,
                                     LOOM_IR_OP_EQ,  LOOM_IR_OP_NE,      LOOM_IR_OP_LT,
                                     LOOM_IR_OP_LE,  LOOM_IR_OP_GT,      LOOM_IR_OP_GE};
    for (size_t i = 0; i < LEN(un) + LEN(bin); i++) {
        fx f;
        fx_init(&f);
        int32_t x = input(&f, dt, 1, S(100));
        int32_t r;
        if (i < LEN(un)) {
            r = op1(&f, un[i], x);
        } else {
            /* y holds the extremes, zeros and -1 in other positions than x */
            int32_t y = input(&f, dt, 1, S(100));
            r = op2(&f, bin[i - LEN(un)], x, y);
        }
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        fill_all(&f, -50, 50, true);
        if (i >= LEN(un)) { /* pair every special of x with every special of y */
            const loom_ir_node *n = node(&f, 1);
            for (int64_t k = 0; k < 64; k++)
                loom_ir_store_i64(f.in[1], n->dtype, k, loom_ir_load_i64(f.in[0], n->dtype, k / 8));
            for (int64_t k = 0; k < 64; k++)
                loom_ir_store_i64(f.in[0], n->dtype, k, loom_ir_load_i64(f.in[0], n->dtype, k % 8));
        }
        char what[64];
        snprintf(what, sizeof what, "%s %s", loom_dtype_name(dt),
                 loom_ir_op_name(i < LEN(un) ? un[i] : bin[i - LEN(un)]));
        check(&f, 0, 0, what);
        fx_deinit(&f);
    }
}

static void test_integer_ops_wrap_and_never_trap_in_i32(void **state) {
    (void)state;
    check_int_ops(LOOM_DTYPE_I32);
}

static void test_integer_ops_wrap_and_never_trap_in_i64(void **state) {
    (void)state;
    check_int_ops(LOOM_DTYPE_I64);
}

static void test_integer_division_by_zero_and_int_min_by_minus_one(void **state) {
    (void)state;
    /* hand-computed: 7/0 = 0, INT_MIN/-1 = INT_MIN, -7/2 = -3 (toward zero), 9/-3 = -3 */
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_I32, 1, S(4));
    int32_t y = input(&f, LOOM_DTYPE_I32, 1, S(4));
    int32_t r = op2(&f, LOOM_IR_OP_DIV, x, y);
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
    int32_t xs[4] = {7, INT32_MIN, -7, 9}, ys[4] = {0, -1, 2, -3};
    f.in[0] = malloc(sizeof xs);
    f.in[1] = malloc(sizeof ys);
    memcpy(f.in[0], xs, sizeof xs);
    memcpy(f.in[1], ys, sizeof ys);
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, &k), LOOM_OK);
    int32_t out[4];
    void *bufs[3] = {f.in[0], f.in[1], out};
    k.fn(bufs, 0, k.extent);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], INT32_MIN);
    assert_int_equal(out[2], -3);
    assert_int_equal(out[3], -3);
    loom_cg_code_destroy(code);
    fx_deinit(&f);
}

static void test_casts_between_every_pair_of_dtypes(void **state) {
    (void)state;
    for (int from = 0; from < LOOM_DTYPE_COUNT_; from++)
        for (int to = 0; to < LOOM_DTYPE_COUNT_; to++) {
            fx f;
            fx_init(&f);
            int32_t x = input(&f, (loom_dtype)from, 1, S(200));
            int32_t r = cast(&f, x, (loom_dtype)to);
            output(&f, r);
            kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
            /* wide enough to saturate i32, overflow f16, round bf16 */
            fill_all(&f, -5e9, 5e9, true);
            if (from == LOOM_DTYPE_I64) /* odd values beyond 2^53: double rounding to f32 */
                for (int64_t k = 100; k < 200; k++)
                    ((int64_t *)f.in[0])[k] = ((int64_t)1 << 55) + 2 * k + 1;
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", loom_dtype_name((loom_dtype)from),
                     loom_dtype_name((loom_dtype)to));
            check(&f, 0, 0, what); /* casts are exact */
            fx_deinit(&f);
        }
}

static void test_float_to_int_cast_saturates_and_maps_nan_to_zero(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 1, S(6));
    int32_t r = cast(&f, x, LOOM_DTYPE_I32);
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
    float xs[6] = {3e9f, -3e9f, NAN, -2.9f, 2.9f, INFINITY};
    f.in[0] = malloc(sizeof xs);
    memcpy(f.in[0], xs, sizeof xs);
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, &k), LOOM_OK);
    int32_t out[6];
    void *bufs[2] = {f.in[0], out};
    k.fn(bufs, 0, k.extent);
    assert_int_equal(out[0], INT32_MAX);
    assert_int_equal(out[1], INT32_MIN);
    assert_int_equal(out[2], 0);
    assert_int_equal(out[3], -2);
    assert_int_equal(out[4], 2);
    assert_int_equal(out[5], INT32_MAX);
    loom_cg_code_destroy(code);
    fx_deinit(&f);
}

/* f32 -> bf16 at its edges, bit for bit as loom_ir_f32_to_bf16: ties to even, NaN quiet,
 * overflow to infinity, subnormals kept (which vcvtneps2bf16 would flush), in whole vectors
 * and the tail. */
static void test_f32_to_bf16_rounds_every_edge_like_the_interpreter(void **state) {
    (void)state;
    enum { N = 75 };
    static const uint32_t edges[] = {
        0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, /* ties to even, either side */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,              /* overflow to +-inf, a tie */
        0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u, /* inf, signaling and quiet NaN */
        0x00000000u, 0x80000000u, 0x00800000u, 0x80800000u, /* zeros, the smallest normals */
        0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, /* subnormals, ties among them */
        0x007f8000u, 0x00408001u, 0x00007fffu,
    };
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 1, S(N));
    int32_t r = cast(&f, x, LOOM_DTYPE_BF16);
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
    float in[N];
    for (int i = 0; i < N; i++) /* normals of both signs around 1 */
        in[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + (float)i / 97.0f);
    for (size_t e = 0; e < 11; e++) /* lanes 0..15: normals, infinities and NaNs */
        memcpy(&in[e], &edges[e], sizeof *in);
    memcpy(&in[20], &edges[15], sizeof *in); /* lanes 16..31: one subnormal among normals */
    for (size_t e = 11; e < LEN(edges); e++) /* lanes 32..47: zeros and subnormals */
        memcpy(&in[32 + e - 11], &edges[e], sizeof *in);
    memcpy(&in[N - 1], &edges[16], sizeof *in); /* the tail */
    memcpy(&in[N - 2], &edges[5], sizeof *in);
    f.in[0] = malloc(sizeof in);
    memcpy(f.in[0], in, sizeof in);
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, &k), LOOM_OK);
    uint16_t out[N];
    void *bufs[2] = {f.in[0], out};
    k.fn(bufs, 0, k.extent);
    for (int i = 0; i < N; i++) {
        uint16_t want = loom_ir_f32_to_bf16(in[i]);
        uint32_t u;
        memcpy(&u, &in[i], sizeof u);
        if (out[i] != want)
            fail_msg("lane %d: f32 0x%08x -> bf16 0x%04x, want 0x%04x", i, u, out[i], want);
    }
    assert_int_equal(loom_ir_f32_to_bf16(in[32 + 18 - 11]), 0x0002); /* 0x00018000: a tie */
    assert_int_equal(loom_ir_f32_to_bf16(in[9]), 0x7fc0);            /* 0x7f800001: quieted */
    loom_cg_code_destroy(code);
    fx_deinit(&f);
}

static void test_f16_and_bf16_chains_round_every_node_like_the_interpreter(void **state) {
    (void)state;
    const loom_dtype dts[2] = {LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        fx f;
        fx_init(&f);
        int32_t x = input(&f, dts[t], 2, S(33, 31));
        int32_t y = input(&f, dts[t], 2, S(33, 31));
        int32_t s = op2(&f, LOOM_IR_OP_ADD, x, y);
        int32_t m = op2(&f, LOOM_IR_OP_MUL, s, x);
        int32_t e = op1(&f, LOOM_IR_OP_EXP,
                        op2(&f, LOOM_IR_OP_MUL, m, cst(&f, dts[t], 2, S(33, 31), 0.125)));
        output(&f, m);
        output(&f, e);
        kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, s, e);
        fill_all(&f, -4, 4, true);
        /* add and mul are exact in f32 before rounding, so they match bit for bit; exp may
         * differ in its last f32 ulp, which can move a 16-bit rounding by one ulp */
        check(&f, t == 0 ? 1e-3 : 8e-3, 1e-6, loom_dtype_name(dts[t]));
        fx_deinit(&f);
    }
}

/* ---- shapes ------------------------------------------------------------------------------- */

static void test_odd_sizes_from_scalars_to_large_vectors(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 7, 33, 1000, 20000};
    for (size_t i = 0; i < LEN(sizes); i++) {
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 1, &sizes[i]);
        int32_t y = input(&f, LOOM_DTYPE_F32, 1, &sizes[i]);
        int32_t r = op2(&f, LOOM_IR_OP_MUL, op2(&f, LOOM_IR_OP_ADD, x, y), x);
        r = op1(&f, LOOM_IR_OP_TANH, r);
        output(&f, r);
        kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, 2, r);
        fill_all(&f, -2, 2, false);
        check(&f, 2e-6, 0, "odd size");
        fx_deinit(&f);
    }
    /* rank 0 */
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 0, NULL);
    int32_t r = op2(&f, LOOM_IR_OP_SUB, x, cst(&f, LOOM_DTYPE_F32, 0, NULL, 0.25));
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
    fill_all(&f, -2, 2, false);
    check(&f, 0, 0, "rank 0");
    fx_deinit(&f);
}

static void test_broadcasts_of_rows_columns_and_scalars(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(33, 70));
    int32_t row = input(&f, LOOM_DTYPE_F32, 1, S(70));
    int32_t col = input(&f, LOOM_DTYPE_F32, 2, S(33, 1));
    int32_t sc = input(&f, LOOM_DTYPE_F32, 0, NULL);
    int32_t a = op2(&f, LOOM_IR_OP_ADD, x, shaped(&f, LOOM_IR_OP_BROADCAST, row, 2, S(33, 70)));
    int32_t b = op2(&f, LOOM_IR_OP_MUL, a, shaped(&f, LOOM_IR_OP_BROADCAST, col, 2, S(33, 70)));
    int32_t c = op2(&f, LOOM_IR_OP_SUB, b, shaped(&f, LOOM_IR_OP_BROADCAST, sc, 2, S(33, 70)));
    /* and a transposed read of the same input */
    int32_t t =
        transpose(&f, shaped(&f, LOOM_IR_OP_BROADCAST, col, 2, S(33, 33)), 2, (int32_t[]){1, 0});
    int32_t u = op2(&f, LOOM_IR_OP_ADD, t, shaped(&f, LOOM_IR_OP_BROADCAST, col, 2, S(33, 33)));
    output(&f, c);
    output(&f, u);
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, a - 1, c); /* from the row's broadcast */
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, c + 1, u);
    fill_all(&f, -3, 3, false);
    check(&f, 1e-6, 0, "broadcasts");
    fx_deinit(&f);
}

/* A leaf read with a stride along the innermost loop and contiguously along an outer one
 * makes the nest run in tiles of 16 of that outer group (lower_kernel.c): unrolled when
 * the group's extent is a multiple of 16 and the kernel is small, a loop with a partial
 * last tile otherwise. Each case against the interpreter, on 2 threads. */
static void test_transposed_nests_are_tiled(void **state) {
    (void)state;
    { /* [48, 80] -> [80, 48]: whole tiles, unrolled */
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(48, 80));
        int32_t r = transpose(&f, x, 2, (int32_t[]){1, 0});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        fill_all(&f, -3, 3, true);
        check_with(&f, 2, 0, 0, "2-D transpose");
        fx_deinit(&f);
    }
    { /* a batch of [37, 50] -> [50, 37]: 50 is 3 tiles and a partial one */
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 3, S(3, 37, 50));
        int32_t r = transpose(&f, x, 3, (int32_t[]){0, 2, 1});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        fill_all(&f, -3, 3, true);
        check_with(&f, 2, 0, 0, "batched transpose, partial tile");
        fx_deinit(&f);
    }
    { /* fused: tanh(x^T * y + 0.5) - y with y read in order, and x^T itself a result;
       * more nodes than are unrolled, so whole tiles in a loop */
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(32, 64));
        int32_t y = input(&f, LOOM_DTYPE_F32, 2, S(64, 32));
        int32_t t = transpose(&f, x, 2, (int32_t[]){1, 0});
        int32_t v = op2(&f, LOOM_IR_OP_MUL, t, y);
        for (int i = 0; i < 8; i++)
            v = op2(&f, LOOM_IR_OP_ADD, op1(&f, LOOM_IR_OP_TANH, v),
                    cst(&f, LOOM_DTYPE_F32, 2, S(64, 32), 0.5));
        int32_t r = op2(&f, LOOM_IR_OP_SUB, v, y);
        output(&f, t);
        output(&f, r);
        kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, t, r);
        assert_true(f.plan.kernels[0].n_nodes > 8);
        fill_all(&f, -2, 2, false);
        check_with(&f, 2, 1e-5, 1e-5, "fused transposed nest");
        fx_deinit(&f);
    }
    { /* 16-bit values: [16, 48] -> [48, 16] in bf16, then to f32 */
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_BF16, 2, S(16, 48));
        int32_t r = cast(&f, transpose(&f, x, 2, (int32_t[]){1, 0}), LOOM_DTYPE_F32);
        output(&f, r);
        kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, r - 1, r);
        fill_all(&f, -3, 3, false);
        check_with(&f, 2, 0, 0, "bf16 transpose");
        fx_deinit(&f);
    }
}

static int32_t slice_of(fx *f, int32_t x, const int64_t *shape, const int64_t *start,
                        const int64_t *step) {
    return add(f, (loom_ir_node_desc){
                      .op = LOOM_IR_OP_SLICE,
                      .n_inputs = 1,
                      .inputs = &x,
                      .rank = 2,
                      .shape = shape,
                      .attrs = {.start = {start[0], start[1]}, .step = {step[0], step[1]}}});
}

static int32_t pad_of(fx *f, int32_t x, const int64_t *shape, const int64_t *low,
                      const int64_t *interior, double value) {
    return add(f, (loom_ir_node_desc){.op = LOOM_IR_OP_PAD,
                                      .n_inputs = 1,
                                      .inputs = &x,
                                      .rank = 2,
                                      .shape = shape,
                                      .attrs = {.start = {low[0], low[1]},
                                                .step = {interior[0], interior[1]},
                                                .value = value}});
}

/* A slice read only by pads joins their kernel as a view (fusion.c): each pad reads the
 * slice's operand buffer at start + step * its clamped index. Plain, strided, interior-
 * padded and single-row slices, summed, against the interpreter on 2 threads. */
static void test_pads_read_through_slices_of_a_buffer(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(9, 40));
    int32_t e = op1(&f, LOOM_IR_OP_EXP, x);
    int32_t s1 = slice_of(&f, e, S(3, 40), S(0, 0), S(1, 1));
    int32_t s2 = slice_of(&f, e, S(3, 13), S(3, 1), S(2, 3));
    int32_t s3 = slice_of(&f, e, S(1, 38), S(8, 2), S(1, 1));
    int32_t p1 = pad_of(&f, s1, S(5, 42), S(1, 1), S(0, 0), 0.0);
    int32_t p2 = pad_of(&f, s2, S(5, 42), S(2, 3), S(0, 2), 0.5);
    int32_t p3 = pad_of(&f, s3, S(5, 42), S(4, 2), S(0, 0), -1.0);
    /* a single row, padded along the columns only: its row is a constant index */
    int32_t s4 = slice_of(&f, e, S(1, 40), S(5, 0), S(1, 1));
    int32_t p4 = shaped(&f, LOOM_IR_OP_BROADCAST, pad_of(&f, s4, S(1, 42), S(0, 1), S(0, 0), 2.0),
                        2, S(5, 42));
    int32_t r =
        op2(&f, LOOM_IR_OP_ADD, op2(&f, LOOM_IR_OP_ADD, op2(&f, LOOM_IR_OP_ADD, p1, p2), p3), p4);
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, e, 1, &e);
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, s1, r);
    fill_all(&f, -2, 2, false);
    check_with(&f, 2, 1e-6, 1e-5, "pads through slices");
    fx_deinit(&f);
}

static void test_a_64_op_fused_chain_is_one_kernel(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(37, 129));
    int32_t y = input(&f, LOOM_DTYPE_F32, 2, S(37, 129));
    int32_t v = x, first = -1;
    static const loom_ir_op ops[] = {LOOM_IR_OP_ADD, LOOM_IR_OP_MUL,     LOOM_IR_OP_TANH,
                                     LOOM_IR_OP_SUB, LOOM_IR_OP_SIGMOID, LOOM_IR_OP_MAXIMUM,
                                     LOOM_IR_OP_EXP, LOOM_IR_OP_RELU};
    for (int i = 0; i < 64; i++) {
        loom_ir_op op = ops[i % LEN(ops)];
        if (loom_ir_op_table[op].arity == 2)
            v = op2(&f, op, v, y);
        else
            v = op1(&f, op, v);
        if (first < 0)
            first = v;
    }
    output(&f, v);
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, first, v);
    assert_int_equal(f.plan.kernels[0].n_nodes, 64);
    fill_all(&f, -1, 1, false);
    check(&f, 1e-5, 1e-7, "64-op chain");
    fx_deinit(&f);
}

static void test_results_of_another_shape_are_written_by_a_side_nest(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    /* c = exp(b) is a result of shape [70] inside a kernel over [33, 70] */
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(33, 70));
    int32_t b = input(&f, LOOM_DTYPE_F32, 1, S(70));
    int32_t c = op1(&f, LOOM_IR_OP_EXP, b);
    int32_t cb = shaped(&f, LOOM_IR_OP_BROADCAST, c, 2, S(33, 70));
    int32_t r = op2(&f, LOOM_IR_OP_MUL, x, cb);
    /* and a reduction kernel with one too: d = neg(b) */
    int32_t d = op1(&f, LOOM_IR_OP_NEG, b);
    int32_t db = shaped(&f, LOOM_IR_OP_BROADCAST, d, 2, S(33, 70));
    int32_t s = reduce(&f, LOOM_IR_OP_REDUCE_SUM, op2(&f, LOOM_IR_OP_ADD, x, db), 1u, false);
    output(&f, c);
    output(&f, r);
    output(&f, d);
    output(&f, s);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 3, (int32_t[]){c, cb, r});
    kernel(&f, LOOM_IR_KERNEL_REDUCTION, s, 4, (int32_t[]){d, db, s - 1, s});
    fill_all(&f, -2, 2, false);
    check_with(&f, 1, 2e-6, 0, "side nests");
    fx_deinit(&f);
}

static void test_bool_values_compare_select_and_store_as_bytes(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t p = input(&f, LOOM_DTYPE_BOOL, 1, S(300));
    int32_t q = input(&f, LOOM_DTYPE_BOOL, 1, S(300));
    int32_t x = input(&f, LOOM_DTYPE_I64, 1, S(300));
    int32_t eq = op2(&f, LOOM_IR_OP_EQ, p, q);
    int32_t ne = op2(&f, LOOM_IR_OP_NE, p, q);
    int32_t sb = op3(&f, LOOM_IR_OP_SELECT, eq, p, ne); /* select of bools */
    int32_t si = op3(&f, LOOM_IR_OP_SELECT, sb, x, op1(&f, LOOM_IR_OP_NEG, x));
    int32_t fin = op1(&f, LOOM_IR_OP_ISFINITE, cast(&f, si, LOOM_DTYPE_F32));
    output(&f, sb);
    output(&f, si);
    output(&f, fin);
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, eq, fin);
    fill_all(&f, -1e18, 1e18, true);
    check(&f, 0, 0, "bools");
    fx_deinit(&f);
}

static void test_zero_sized_tensors_compile_and_write_nothing(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(0, 7));
    int32_t e = op1(&f, LOOM_IR_OP_EXP, x);
    int32_t s = reduce(&f, LOOM_IR_OP_REDUCE_SUM, x, 1u, false);  /* [7] of zeros */
    int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MEAN, x, 1u, false); /* [7] of NaN */
    output(&f, e);
    output(&f, s);
    output(&f, m);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, e, 1, &e);
    kernel(&f, LOOM_IR_KERNEL_REDUCTION, s, 1, &s);
    kernel(&f, LOOM_IR_KERNEL_REDUCTION, m, 1, &m);
    fill_all(&f, -1, 1, false);
    check(&f, 0, 0, "zero-sized");
    fx_deinit(&f);
}

/* ---- convolution epilogues ------------------------------------------------------------- */

/* A ResNet block's 1x1 input gradient with the residual add and ReLU mask fused, one kernel:
 * select(x > 0, res + conv2d_grad_input(dy, w), 0) for x and res of shape xs, dy of shape ys
 * (w [ys[1], xs[1], 1, 1]), its operands filled in [-2, 2). */
static void residual_input_gradient(fx *f, loom_dtype dt, const int64_t *xs, const int64_t *ys,
                                    const loom_ir_conv *cv) {
    int32_t dy = input(f, dt, 4, ys);
    int32_t w = input(f, dt, 4, S(ys[1], xs[1], 1, 1));
    int32_t res = input(f, dt, 4, xs);
    int32_t x = input(f, dt, 4, xs);
    int32_t dx = add(f, (loom_ir_node_desc){.op = LOOM_IR_OP_CONV2D_GRAD_INPUT,
                                            .n_inputs = 2,
                                            .inputs = (int32_t[]){dy, w},
                                            .dtype = dt,
                                            .rank = 4,
                                            .shape = xs,
                                            .attrs = {.conv = *cv}});
    int32_t s = op2(f, LOOM_IR_OP_ADD, res, dx);
    int32_t z = cst(f, dt, 4, xs, 0.0);
    int32_t m = op2(f, LOOM_IR_OP_GT, x, z);
    int32_t r = op3(f, LOOM_IR_OP_SELECT, m, s, z);
    output(f, r);
    kernel(f, LOOM_IR_KERNEL_ROOTED, dx, 4, (int32_t[]){dx, s, m, r});
    fill_all(f, -2, 2, false);
}

/* A strided 1x1's input gradient with the residual add and ReLU mask of a ResNet downsample
 * fused (dx = select(x > 0, o + conv2d_grad_input(dy, w), 0)), against the interpreter, f32
 * and bf16: where only one phase of the destination pixels has taps and all phases are
 * equally large, that phase's epilogue writes every phase's pixels, the others' value 0
 * (lower_conv.c spread): stride 2 and 2x3, the tap phase (1, 1) under padding 1, rows of 20
 * and 18 pixels a phase (interleaved by a vector of 16 and a tail); and a 7x9 image, whose
 * phases differ in size, one pass per phase as before. */
static void test_strided_1x1_input_gradient_with_a_fused_epilogue(void **state) {
    (void)state;
    static const struct {
        int64_t h, w, st[2], pad;
    } cases[] = {{8, 10, {2, 2}, 0}, {8, 9, {2, 3}, 0},  {8, 10, {2, 2}, 1},
                 {7, 9, {2, 2}, 0},  {4, 40, {2, 2}, 0}, {4, 34, {2, 2}, 1}};
    const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};
    for (size_t i = 0; i < LEN(cases); i++)
        for (size_t d = 0; d < LEN(dts); d++) {
            fx f;
            fx_init(&f);
            loom_dtype dt = dts[d];
            int64_t n = 2, c = 6, o = 8, p = cases[i].pad;
            int64_t dh = (cases[i].h + 2 * p - 1) / cases[i].st[0] + 1;
            int64_t dw = (cases[i].w + 2 * p - 1) / cases[i].st[1] + 1;
            loom_ir_conv cv = {.stride = {cases[i].st[0], cases[i].st[1]},
                               .padding = {p, p},
                               .dilation = {1, 1},
                               .groups = 1};
            residual_input_gradient(&f, dt, S(n, c, cases[i].h, cases[i].w), S(n, o, dh, dw), &cv);
            char what[96];
            snprintf(what, sizeof what, "%s %lldx%lld stride %lldx%lld pad %lld",
                     loom_dtype_name(dt), (long long)cases[i].h, (long long)cases[i].w,
                     (long long)cases[i].st[0], (long long)cases[i].st[1], (long long)p);
            /* bf16: dx's rounding may differ by an ulp (f32 sums against the interpreter's
             * f64), 0.125 at |dx| < 32, and o + dx may cancel */
            check_with(&f, 2, dt == LOOM_DTYPE_BF16 ? 1e-2 : 1e-5,
                       dt == LOOM_DTYPE_BF16 ? 0.125 : 1e-5, what);
            fx_deinit(&f);
        }
}

/* Compiles f's kernels with their dumps in a fresh folder and fails (naming `what`) unless
 * dump `which` (0 the MLIR, 1 the lowered MLIR, 2 the LLVM IR, 3 the assembly) holds each of
 * the n needles; the folder is removed. */
static void check_dump_holds(fx *f, int which, size_t n, const char *const *needles,
                             const char *what) {
    char dir[] = "/tmp/loom_cg_dumpXXXXXX";
    assert_non_null(mkdtemp(dir));
    loom_cg_options opts = {.compile_threads = 1, .dump_dir = dir, .dump_prefix = "k"};
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(loom_cg_compile(&f->g, &f->plan, &opts, &code, &k, &f->d), LOOM_OK);
    loom_cg_code_destroy(code);
    static const char *const ext[] = {".mlir", ".lowered.mlir", ".m0.ll", ".m0.s"};
    for (int i = 0; i < (int)LEN(ext); i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/k%s", dir, ext[i]);
        if (i == which) {
            char *text = tu_read_file(path);
            assert_non_null(text);
            for (size_t j = 0; j < n; j++)
                if (!strstr(text, needles[j]))
                    fail_msg("%s: %s (no '%s')", path, what, needles[j]);
            free(text);
        }
        unlink(path);
    }
    rmdir(dir);
}

/* A convolution's tiles prefetch what its epilogue reads and writes (lower_conv.c cv_pf): a
 * 1x1 input gradient with a ResNet block's residual add and ReLU mask fused, whose MLIR
 * holds read prefetches (the addend, the mask's source) and write ones (dx), and whose
 * values still match the interpreter's, f32 and bf16, on 2 threads, with images whose rows
 * split across the tiles' 32 columns (13x11). */
static void test_conv_epilogue_operands_are_prefetched(void **state) {
    (void)state;
    const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};
    for (size_t d = 0; d < LEN(dts); d++) {
        fx f;
        fx_init(&f);
        loom_dtype dt = dts[d];
        loom_ir_conv cv = {.stride = {1, 1}, .dilation = {1, 1}, .groups = 1};
        residual_input_gradient(&f, dt, S(3, 40, 13, 11), S(3, 24, 13, 11), &cv);
        check_with(&f, 2, dt == LOOM_DTYPE_BF16 ? 1e-2 : 1e-5, dt == LOOM_DTYPE_BF16 ? 0.125 : 1e-5,
                   loom_dtype_name(dt));
        static const char *const needles[] = {"memref.prefetch", "read, locality<2>",
                                              "write, locality<2>"};
        check_dump_holds(&f, 0, LEN(needles), needles,
                         "the epilogue's operands and result are not prefetched");
        fx_deinit(&f);
    }
}

/* ---- reductions --------------------------------------------------------------------------- */

static void test_reductions_with_prologue_and_epilogue_over_axis_sets(void **state) {
    (void)state;
    const uint32_t axis_sets[] = {
        1u << 0, 1u << 1, 1u << 2, (1u << 0) | (1u << 2), (1u << 0) | (1u << 1), 7u};
    const loom_ir_op ops[] = {LOOM_IR_OP_REDUCE_SUM, LOOM_IR_OP_REDUCE_MEAN, LOOM_IR_OP_REDUCE_MAX};
    for (size_t a = 0; a < LEN(axis_sets); a++)
        for (size_t o = 0; o < LEN(ops); o++)
            for (int keep = 0; keep < 2; keep++) {
                fx f;
                fx_init(&f);
                int32_t x = input(&f, LOOM_DTYPE_F32, 3, S(5, 37, 1100));
                /* prologue exp(x * 0.5), also a result; epilogue sqrt(r) + 1 */
                int32_t h =
                    op2(&f, LOOM_IR_OP_MUL, x, cst(&f, LOOM_DTYPE_F32, 3, S(5, 37, 1100), 0.5));
                int32_t p = op1(&f, LOOM_IR_OP_EXP, h);
                int32_t r = reduce(&f, ops[o], p, axis_sets[a], keep);
                const loom_ir_node *rn = node(&f, r);
                int32_t s = op1(&f, LOOM_IR_OP_SQRT, r);
                int32_t e =
                    op2(&f, LOOM_IR_OP_ADD, s, cst(&f, LOOM_DTYPE_F32, rn->rank, rn->shape, 1.0));
                output(&f, e);
                output(&f, p);
                output(&f, r);
                kernel(&f, LOOM_IR_KERNEL_REDUCTION, r, 5, (int32_t[]){h, p, r, s, e});
                fill_all(&f, -2, 2, false);
                char what[64];
                snprintf(what, sizeof what, "%s axes %#x keepdim %d", loom_ir_op_name(ops[o]),
                         axis_sets[a], keep);
                check(&f, 2e-6, 0, what);
                fx_deinit(&f);
            }
}

/* Reductions over dims on both sides of the innermost kept one (batch norm's over batch and
 * pixels of NCHW) run blocked: a task takes a tile of channels and sums, image by image,
 * the tile's contiguous run (lower_reduction.c); where the runs are short (64 or fewer),
 * each run element accumulates on its own, 4 images a load and store, and the runs are
 * summed at the end. Tiles of one channel and of many, a last tile short, a reduced dim
 * between two kept ones, images in fours with and without a remainder and fewer than four,
 * a stored prologue (x - 0.25) * x and an epilogue, sum, mean and max, each against the
 * interpreter with its calls in 3 ranges. */
static void test_blocked_reductions_over_batch_and_pixels(void **state) {
    (void)state;
    static const struct {
        int64_t shape[4];
        uint32_t axes;
    } cases[] = {
        {{3, 37, 7, 9}, (1u << 0) | (1u << 2) | (1u << 3)},    /* 63 a run, 3 images */
        {{7, 19, 5, 5}, (1u << 0) | (1u << 2) | (1u << 3)},    /* 25 a run, 4 + 3 images */
        {{9, 70, 1, 2}, (1u << 0) | (1u << 2) | (1u << 3)},    /* 2 a run: tiles of 70 */
        {{2, 5, 181, 183}, (1u << 0) | (1u << 2) | (1u << 3)}, /* runs above 32768: 1 */
        {{4, 300, 3, 1}, (1u << 0) | (1u << 2)},               /* 3: tiles of 19 of 300 */
        {{5, 6, 7, 8}, (1u << 1) | (1u << 3)}, /* kept 0 (per task) and 2 (the tile) */
    };
    const loom_ir_op ops[] = {LOOM_IR_OP_REDUCE_SUM, LOOM_IR_OP_REDUCE_MEAN, LOOM_IR_OP_REDUCE_MAX};
    for (size_t i = 0; i < LEN(cases); i++)
        for (size_t o = 0; o < LEN(ops); o++) {
            fx f;
            fx_init(&f);
            const int64_t *sh = cases[i].shape;
            int32_t x = input(&f, LOOM_DTYPE_F32, 4, sh);
            int32_t d = op2(&f, LOOM_IR_OP_SUB, x, cst(&f, LOOM_DTYPE_F32, 4, sh, 0.25));
            int32_t p = op2(&f, LOOM_IR_OP_MUL, d, x);
            int32_t r = reduce(&f, ops[o], p, cases[i].axes, o == 1);
            const loom_ir_node *rn = node(&f, r);
            int32_t e = op2(&f, LOOM_IR_OP_MUL, r, cst(&f, LOOM_DTYPE_F32, rn->rank, rn->shape, 3));
            output(&f, e);
            output(&f, p);
            kernel(&f, LOOM_IR_KERNEL_REDUCTION, r, 4, (int32_t[]){d, p, r, e});
            fill_all(&f, -2, 2, false);
            char what[96];
            snprintf(what, sizeof what, "%s of [%d,%d,%d,%d] axes %#x", loom_ir_op_name(ops[o]),
                     (int)sh[0], (int)sh[1], (int)sh[2], (int)sh[3], cases[i].axes);
            check(&f, 2e-6, 1e-6, what);
            fx_deinit(&f);
        }
}

/* A REDUCTION kernel with several reductions over operands of one shape along the same
 * axes (batch norm's backward: sum(dy) and sum(dy * (x - mean)) in one pass over dy and x):
 * one loop nest, an accumulator each, the epilogue reading all of them; per output, blocked
 * and inner-kept forms, sum, mean and max together, against the interpreter. A second
 * reduction along other axes is refused with its reason. */
static void test_reductions_sharing_one_pass(void **state) {
    (void)state;
    const uint32_t axis_sets[] = {1u << 3, (1u << 0) | (1u << 2) | (1u << 3), (1u << 0) | (1u << 1),
                                  (1u << 0) | (1u << 2) | (1u << 3)};
    for (size_t a = 0; a < LEN(axis_sets); a++) {
        fx f;
        fx_init(&f);
        /* the last: runs of 15, each element its own accumulators, 4 + 2 images */
        const int64_t *sh = a == 3 ? S(6, 37, 3, 5) : S(3, 37, 9, 41);
        int32_t x = input(&f, LOOM_DTYPE_F32, 4, sh), y = input(&f, LOOM_DTYPE_F32, 4, sh);
        int32_t xy = op2(&f, LOOM_IR_OP_MUL, x, y); /* a prologue result too */
        int32_t s1 = reduce(&f, LOOM_IR_OP_REDUCE_SUM, x, axis_sets[a], true);
        int32_t s2 = reduce(&f, LOOM_IR_OP_REDUCE_MEAN, xy, axis_sets[a], true);
        int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MAX, y, axis_sets[a], true);
        int32_t e = op2(&f, LOOM_IR_OP_ADD, op2(&f, LOOM_IR_OP_MUL, s1, s2), m);
        output(&f, e);
        output(&f, s2);
        output(&f, xy);
        kernel(&f, LOOM_IR_KERNEL_REDUCTION, s1, 6, (int32_t[]){xy, s1, s2, m, e - 1, e});
        fill_all(&f, -2, 2, false);
        char what[64];
        snprintf(what, sizeof what, "three reductions over axes %#x", axis_sets[a]);
        check_with(&f, 2, 1e-5, 1e-5, what);
        fx_deinit(&f);
    }
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(8, 16));
    int32_t s1 = reduce(&f, LOOM_IR_OP_REDUCE_SUM, x, 1u << 1, true);
    int32_t s2 = reduce(&f, LOOM_IR_OP_REDUCE_SUM, x, 1u << 0, true);
    output(&f, s1);
    output(&f, s2);
    kernel(&f, LOOM_IR_KERNEL_REDUCTION, s1, 2, (int32_t[]){s1, s2});
    loom_rt_kernel k[2];
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, k), LOOM_STATUS_UNSUPPORTED);
    assert_null(code);
    assert_non_null(strstr(f.d.msg, "along its axes"));
    fx_deinit(&f);
}

/* A staged REDUCTION kernel (fusion's rows rules): softmax's max(x), then sum(exp(x - max)),
 * then a third stage reading both, mean(y * exp(x - max) / s) (softmax's backward), then a
 * final elementwise stage over the row reading the last, p * (y - mean) (the backward's
 * input gradient), one row at a time: a stored prologue result of stage 1 (exp(x - max)),
 * an epilogue reading all three (log-sum-exp and the backward's dot), rows of one and of two
 * reduced axes, odd lengths, specials (a row holding inf and NaN) and 1 and 2 threads,
 * against the interpreter. A staged kernel whose reductions do not reduce rows is refused
 * by codegen with its reason. */
static void test_staged_reductions_run_row_by_row(void **state) {
    (void)state;
    const uint32_t axis_sets[] = {1u << 2, (1u << 1) | (1u << 2)};
    for (size_t a = 0; a < LEN(axis_sets); a++)
        for (int32_t threads = 1; threads <= 2; threads++) {
            fx f;
            fx_init(&f);
            const int64_t *sh = S(3, 7, 301);
            int32_t x = input(&f, LOOM_DTYPE_F32, 3, sh), y = input(&f, LOOM_DTYPE_F32, 3, sh);
            int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MAX, x, axis_sets[a], true);
            int32_t e = op1(&f, LOOM_IR_OP_EXP,
                            op2(&f, LOOM_IR_OP_SUB, x, shaped(&f, LOOM_IR_OP_BROADCAST, m, 3, sh)));
            int32_t sm = reduce(&f, LOOM_IR_OP_REDUCE_SUM, e, axis_sets[a], true);
            int32_t p = op2(&f, LOOM_IR_OP_DIV, e, shaped(&f, LOOM_IR_OP_BROADCAST, sm, 3, sh));
            int32_t d = reduce(&f, LOOM_IR_OP_REDUCE_MEAN, op2(&f, LOOM_IR_OP_MUL, y, p),
                               axis_sets[a], true);
            int32_t lse = op2(&f, LOOM_IR_OP_ADD, op1(&f, LOOM_IR_OP_LOG, sm), m);
            int32_t r = op2(&f, LOOM_IR_OP_SUB, lse, d);
            int32_t dx =
                op2(&f, LOOM_IR_OP_MUL, p,
                    op2(&f, LOOM_IR_OP_SUB, y, shaped(&f, LOOM_IR_OP_BROADCAST, d, 3, sh)));
            output(&f, r);
            output(&f, e);
            output(&f, m);
            output(&f, dx);
            kernel_range(&f, LOOM_IR_KERNEL_REDUCTION, m, dx);
            f.plan.kernels[0].root = m;
            fill_all(&f, -3, 3, true);
            char what[96];
            snprintf(what, sizeof what, "max, sum, mean, row in 4 stages over axes %#x, %d threads",
                     axis_sets[a], (int)threads);
            check_with(&f, threads, 1e-5, 1e-6, what);
            fx_deinit(&f);
        }
    { /* a max over rows of 16, which alone would be unrolled (small_reduction), with a
       * last stage x - max(x) */
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(37, 16));
        int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MAX, x, 1u << 1, true);
        int32_t d = op2(&f, LOOM_IR_OP_SUB, x, shaped(&f, LOOM_IR_OP_BROADCAST, m, 2, S(37, 16)));
        output(&f, d);
        kernel_range(&f, LOOM_IR_KERNEL_REDUCTION, m, d);
        f.plan.kernels[0].root = m;
        fill_all(&f, -3, 3, true);
        check_with(&f, 2, 0, 0, "x - max(x) over rows of 16");
        fx_deinit(&f);
    }
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 2, S(64, 9));
    int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MAX, x, 1u << 0, true);
    int32_t e = op1(&f, LOOM_IR_OP_EXP,
                    op2(&f, LOOM_IR_OP_SUB, x, shaped(&f, LOOM_IR_OP_BROADCAST, m, 2, S(64, 9))));
    int32_t sm = reduce(&f, LOOM_IR_OP_REDUCE_SUM, e, 1u << 0, true);
    output(&f, sm);
    kernel_range(&f, LOOM_IR_KERNEL_REDUCTION, m, sm);
    f.plan.kernels[0].root = m;
    loom_rt_kernel k[2];
    loom_cg_code *code = NULL;
    assert_int_not_equal(compile(&f, 1, &code, k), LOOM_OK);
    assert_null(code);
    assert_non_null(strstr(f.d.msg, "does not reduce rows"));
    fx_deinit(&f);
}

/* A float sum over its innermost dims (batch norm's, over batch and pixels) runs in vector
 * lanes of f64 partial sums (compile.c mark_reductions lets its adds reassociate): the LLVM
 * IR holds a vector fadd marked reassoc, and the sums, bf16 operands widened, agree with the
 * interpreter's in-order f64 sums once rounded (odd sizes: the vector loop's remainder). */
static void test_float_sums_add_in_vector_lanes_of_f64(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_BF16, 4, S(3, 5, 37, 41));
    int32_t s = reduce(&f, LOOM_IR_OP_REDUCE_SUM, cast(&f, x, LOOM_DTYPE_F32),
                       (1u << 0) | (1u << 2) | (1u << 3), false);
    output(&f, s);
    kernel_range(&f, LOOM_IR_KERNEL_REDUCTION, s - 1, s);
    fill_all(&f, -2, 2, false);
    check(&f, 1e-7, 0, "bf16 sum over axes 0, 2, 3");
    check_dump_holds(&f, 2, 1, (const char *const[]){"fadd reassoc <"},
                     "the sum is not vectorized");
    fx_deinit(&f);
}

/* A max over a few elements per output with the innermost dim reduced (a pool's windows)
 * is unrolled under the loop over the innermost kept dim (lower_kernel.c small_reduction).
 * With a stored prologue, an epilogue, NaN and infinities (max propagates NaN), on 2 threads:
 * 2x2 windows as in a max pool, 3x3 windows with keepdim, and a 1-D case. */
static void test_max_over_small_windows_is_unrolled(void **state) {
    (void)state;
    static const struct {
        int32_t rank;
        int64_t shape[6];
        uint32_t axes;
        bool keep;
    } cases[] = {
        {6, {3, 5, 10, 2, 12, 2}, (1u << 3) | (1u << 5), false},
        {6, {2, 7, 4, 3, 9, 3}, (1u << 3) | (1u << 5), true},
        {2, {40, 5}, 1u << 1, false},
    };
    for (size_t i = 0; i < LEN(cases); i++) {
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, cases[i].rank, cases[i].shape);
        int32_t p = op1(&f, LOOM_IR_OP_NEG, x); /* prologue, also a result */
        int32_t r = reduce(&f, LOOM_IR_OP_REDUCE_MAX, p, cases[i].axes, cases[i].keep);
        const loom_ir_node *rn = node(&f, r);
        int32_t e = op2(&f, LOOM_IR_OP_MUL, r, cst(&f, LOOM_DTYPE_F32, rn->rank, rn->shape, 2.0));
        output(&f, e);
        output(&f, p);
        kernel(&f, LOOM_IR_KERNEL_REDUCTION, r, 3, (int32_t[]){p, r, e});
        fill_all(&f, -5, 5, true);
        check_with(&f, 2, 0, 0, "max over small windows");
        fx_deinit(&f);
    }
}

static void test_reductions_read_transposed_and_broadcast_operands(void **state) {
    (void)state;
    for (uint32_t axes = 1; axes < 8; axes++) {
        fx f;
        fx_init(&f);
        int32_t x = input(&f, LOOM_DTYPE_F32, 3, S(6, 50, 9));
        int32_t b = input(&f, LOOM_DTYPE_F32, 2, S(1, 6));
        int32_t t = transpose(&f, x, 3, (int32_t[]){2, 0, 1}); /* [9, 6, 50] */
        int32_t bb = shaped(&f, LOOM_IR_OP_BROADCAST, transpose(&f, b, 2, (int32_t[]){1, 0}), 3,
                            S(9, 6, 50));
        int32_t r = reduce(&f, LOOM_IR_OP_REDUCE_MAX, op2(&f, LOOM_IR_OP_MUL, t, bb), axes, false);
        output(&f, r);
        kernel_range(&f, LOOM_IR_KERNEL_REDUCTION, t, r);
        fill_all(&f, -2, 2, false);
        check(&f, 0, 0, "transposed reduction");
        fx_deinit(&f);
    }
}

static void test_integer_sums_wrap_and_maxima_are_exact(void **state) {
    (void)state;
    const loom_dtype dts[] = {LOOM_DTYPE_I32, LOOM_DTYPE_I64};
    for (size_t t = 0; t < LEN(dts); t++)
        for (uint32_t axes = 1; axes < 4; axes++) {
            fx f;
            fx_init(&f);
            int32_t x = input(&f, dts[t], 2, S(9, 300));
            int32_t s = reduce(&f, LOOM_IR_OP_REDUCE_SUM, x, axes, false);
            int32_t m = reduce(&f, LOOM_IR_OP_REDUCE_MAX, x, axes, true);
            output(&f, s);
            output(&f, m);
            kernel(&f, LOOM_IR_KERNEL_REDUCTION, s, 1, &s);
            kernel(&f, LOOM_IR_KERNEL_REDUCTION, m, 1, &m);
            fill_all(&f, -1e9, 1e9, true);
            check(&f, 0, 0, "integer reductions");
            fx_deinit(&f);
        }
}

/* ---- matmul ------------------------------------------------------------------------------- */

static void check_matmul(int32_t rank, const int64_t *ashape, const int64_t *bshape, loom_dtype dt,
                         bool epilogue) {
    fx f;
    fx_init(&f);
    int32_t a = input(&f, dt, rank, ashape);
    int32_t b = input(&f, dt, rank, bshape);
    int32_t m = op2(&f, LOOM_IR_OP_MATMUL, a, b);
    int32_t last = m;
    if (epilogue) { /* + bias (a row broadcast), relu */
        const loom_ir_node *mn = node(&f, m);
        int32_t bias = input(&f, dt, 1, &mn->shape[mn->rank - 1]);
        int32_t bb = shaped(&f, LOOM_IR_OP_BROADCAST, bias, mn->rank, mn->shape);
        last = op1(&f, LOOM_IR_OP_RELU, op2(&f, LOOM_IR_OP_ADD, m, bb));
        output(&f, last);
        kernel(&f, LOOM_IR_KERNEL_ROOTED, m, 4, (int32_t[]){m, bb, last - 1, last});
    } else {
        output(&f, last);
        kernel(&f, LOOM_IR_KERNEL_ROOTED, m, 1, &m);
    }
    fill_all(&f, -1, 1, false);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %lldx%lldx%lld%s", loom_dtype_name(dt),
             (long long)ashape[rank - 2], (long long)ashape[rank - 1], (long long)bshape[rank - 1],
             epilogue ? " + bias + relu" : "");
    /* f32 accumulates in f32 (the interpreter in double): K * eps relative to sum |a||b| */
    double tol = dt == LOOM_DTYPE_F32 ? 1e-5 : dt == LOOM_DTYPE_F64 ? 1e-12 : 0;
    if (dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16)
        tol = dt == LOOM_DTYPE_BF16 ? 1e-2 : 2e-3;
    check(&f, tol, tol * (double)ashape[rank - 1], what);
    fx_deinit(&f);
}

static void test_matmuls_of_odd_and_batched_shapes(void **state) {
    (void)state;
    check_matmul(2, S(1, 1), S(1, 1), LOOM_DTYPE_F32, false);
    check_matmul(2, S(7, 13), S(13, 5), LOOM_DTYPE_F32, false);
    check_matmul(2, S(64, 64), S(64, 64), LOOM_DTYPE_F32, false);
    check_matmul(2, S(100, 70), S(70, 90), LOOM_DTYPE_F32, false);
    check_matmul(3, S(3, 7, 13), S(3, 13, 5), LOOM_DTYPE_F32, false);
    check_matmul(4, S(2, 3, 40, 9), S(2, 3, 9, 33), LOOM_DTYPE_F32, false);
    check_matmul(2, S(7, 13), S(13, 5), LOOM_DTYPE_F64, false);
    check_matmul(2, S(33, 20), S(20, 17), LOOM_DTYPE_I32, false);
    check_matmul(2, S(33, 20), S(20, 17), LOOM_DTYPE_I64, false);
    check_matmul(2, S(33, 20), S(20, 17), LOOM_DTYPE_BF16, false);
    check_matmul(2, S(33, 20), S(20, 17), LOOM_DTYPE_F16, false);
}

/* Few row blocks and many columns: the tasks split the columns (lower_kernel.c), in blocks
 * that divide N or leave a remainder block, with a short last row block too, through the
 * matmul schedule (f32) and the plain loops with a scratch accumulator (f16, bf16). */
static void test_wide_matmuls_with_few_rows_split_their_columns_across_tasks(void **state) {
    (void)state;
    check_matmul(2, S(32, 9), S(9, 4100), LOOM_DTYPE_F32, false);       /* 12 x 320 + 260 */
    check_matmul(2, S(40, 9), S(9, 4096), LOOM_DTYPE_F32, true);        /* 16 blocks of 256 */
    check_matmul(3, S(2, 520, 8), S(2, 8, 4100), LOOM_DTYPE_F32, true); /* 264 + 256 rows */
    check_matmul(2, S(20, 9), S(9, 4100), LOOM_DTYPE_F16, true);
    check_matmul(2, S(3, 5), S(5, 4500), LOOM_DTYPE_BF16, false);
    check_matmul(3, S(3, 5, 9), S(3, 9, 4096), LOOM_DTYPE_F64, true);
    check_matmul(2, S(9, 8), S(8, 4200), LOOM_DTYPE_I32, true);
}

static void test_matmul_reads_a_reshaped_operand_and_writes_product_and_epilogue(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 3, S(4, 10, 24));
    int32_t w = input(&f, LOOM_DTYPE_F32, 2, S(24, 40));
    int32_t xr = shaped(&f, LOOM_IR_OP_RESHAPE, x, 2, S(40, 24));
    int32_t m = op2(&f, LOOM_IR_OP_MATMUL, xr, w);
    int32_t g = op1(&f, LOOM_IR_OP_GELU, m);
    int32_t h = cast(&f, g, LOOM_DTYPE_BF16);
    output(&f, m); /* the product itself is an output too */
    output(&f, g);
    output(&f, h);
    kernel(&f, LOOM_IR_KERNEL_ROOTED, m, 3, (int32_t[]){m, g, h});
    fill_all(&f, -1, 1, false);
    check(&f, 1e-5, 1e-5, "matmul of a reshape with outputs");
    fx_deinit(&f);
}

static void test_matmul_with_bias_and_relu_epilogue(void **state) {
    (void)state;
    check_matmul(2, S(64, 64), S(64, 64), LOOM_DTYPE_F32, true);
    check_matmul(2, S(37, 50), S(50, 70), LOOM_DTYPE_F32, true);
    check_matmul(3, S(3, 7, 13), S(3, 13, 5), LOOM_DTYPE_F32, true);
    check_matmul(2, S(37, 50), S(50, 70), LOOM_DTYPE_BF16, true);
    check_matmul(2, S(9, 8), S(8, 6), LOOM_DTYPE_I32, true);
}

/* ---- whole plans -------------------------------------------------------------------------- */

/* An MLP-like step through the real passes (fusion and memory planning), many kernels. */
static void build_mlp(fx *f, int layers) {
    int32_t x = input(f, LOOM_DTYPE_F32, 2, S(16, 24));
    int32_t h = x;
    for (int l = 0; l < layers; l++) {
        int32_t w = input(f, LOOM_DTYPE_F32, 2, S(24, 24));
        int32_t b = input(f, LOOM_DTYPE_F32, 1, S(24));
        int32_t m = op2(f, LOOM_IR_OP_MATMUL, h, w);
        int32_t z = op2(f, LOOM_IR_OP_ADD, m, shaped(f, LOOM_IR_OP_BROADCAST, b, 2, S(16, 24)));
        int32_t mx = reduce(f, LOOM_IR_OP_REDUCE_MAX, z, 1u << 1, true);
        int32_t c = op2(f, LOOM_IR_OP_SUB, z, shaped(f, LOOM_IR_OP_BROADCAST, mx, 2, S(16, 24)));
        int32_t e = op1(f, LOOM_IR_OP_EXP, c);
        int32_t s = reduce(f, LOOM_IR_OP_REDUCE_SUM, e, 1u << 1, true);
        h = op2(f, LOOM_IR_OP_DIV, e, shaped(f, LOOM_IR_OP_BROADCAST, s, 2, S(16, 24)));
        h = op1(f, LOOM_IR_OP_GELU,
                op2(f, LOOM_IR_OP_MUL, h, cst(f, LOOM_DTYPE_F32, 2, S(16, 24), 4.0)));
    }
    output(f, h);
    output(f, reduce(f, LOOM_IR_OP_REDUCE_MEAN, h, 3u, false));
}

static void test_fused_plans_of_many_kernels_compile_on_several_threads(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    build_mlp(&f, 12);
    assert_int_equal(loom_pass_fuse(&f.g, &f.plan, &f.d), LOOM_OK);
    f.planned = true;
    /* per layer the matmul with its bias, and the softmax (max, sum, output) with the gelu
     * as one staged reduction kernel over the rows; then the mean */
    assert_int_equal(f.plan.n_kernels, 2 * 12 + 1);
    fill_all(&f, -1, 1, false);
    check_with(&f, 2, 1e-4, 1e-5, "fused mlp, 2 threads");
    check_with(&f, 5, 1e-4, 1e-5, "fused mlp, 5 threads");
    fx_deinit(&f);
}

/* ---- the code blob ------------------------------------------------------------------------ */

/* loom_cg_code_sizes on kernels ks of code: every kernel's code is more than a return, lies in
 * executable memory and overlaps no other kernel's (kernels sharing code aside). */
static void check_code_sizes(const loom_cg_code *code, loom_rt_kernel *ks, int32_t nk) {
    loom_cg_code_sizes(code, nk, ks);
    for (int32_t k = 0; k < nk; k++) {
        uintptr_t lo = (uintptr_t)ks[k].fn, hi = lo + (uintptr_t)ks[k].code_bytes;
        assert_true(ks[k].code_bytes > 16 && ks[k].code_bytes < (1 << 20));
        assert_true(tu_mapped_executable(lo, hi, NULL));
        for (int32_t j = 0; j < nk; j++) {
            uintptr_t lo2 = (uintptr_t)ks[j].fn, hi2 = lo2 + (uintptr_t)ks[j].code_bytes;
            assert_true(lo2 == lo || hi2 <= lo || lo2 >= hi);
        }
    }
}

static void test_serialized_code_loads_and_computes_the_same(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    build_mlp(&f, 3);
    assert_int_equal(loom_pass_fuse(&f.g, &f.plan, &f.d), LOOM_OK);
    f.planned = true;
    fill_all(&f, -1, 1, false);
    int32_t nk = f.plan.n_kernels;
    loom_rt_kernel *ks = calloc((size_t)nk, sizeof *ks), *ks2 = calloc((size_t)nk, sizeof *ks2);
    loom_cg_code *code = NULL, *code2 = NULL;
    assert_int_equal(compile(&f, 2, &code, ks), LOOM_OK);
    loom_ir_sbuf blob;
    loom_ir_sbuf_init(&blob, &f.a);
    assert_int_equal(loom_cg_code_serialize(code, &blob, &f.d), LOOM_OK);
    assert_true(blob.len > 1000);
    assert_memory_equal(blob.data, "LOOMCGB", 7);
    assert_int_equal(loom_cg_code_load(blob.data, blob.len, &f.plan, &code2, ks2, &f.d), LOOM_OK);
    check_code_sizes(code, ks, nk);
    check_code_sizes(code2, ks2, nk);
    for (int32_t k = 0; k < nk; k++) {
        assert_int_equal(ks2[k].extent, ks[k].extent);
        assert_int_equal(ks2[k].grain, ks[k].grain);
        assert_int_equal(ks2[k].code_bytes, ks[k].code_bytes); /* the same machine code */
    }
    void **a = alloc_outputs(&f), **b = alloc_outputs(&f);
    run_kernels(&f, ks, 1, a);
    loom_cg_code_destroy(code); /* the loaded code does not depend on the original */
    run_kernels(&f, ks2, 2, b);
    compare(&f, b, a, 0, 0, "reloaded code");
    free_outputs(&f, a);
    free_outputs(&f, b);
    /* the wrong kernel count is refused, and code for a kernel the runtime runs itself */
    loom_ir_plan other = f.plan;
    other.n_kernels = nk - 1;
    assert_int_equal(loom_cg_code_load(blob.data, blob.len, &other, &code, ks2, &f.d),
                     LOOM_STATUS_CORRUPT_DATA);
    assert_null(code);
    loom_ir_kernel kinds[64];
    assert_true(nk <= 64);
    memcpy(kinds, f.plan.kernels, (size_t)nk * sizeof kinds[0]);
    kinds[0].kind = LOOM_IR_KERNEL_COLLECTIVE;
    other = f.plan;
    other.kernels = kinds;
    loom_ir_diag_init(&f.d);
    assert_int_equal(loom_cg_code_load(blob.data, blob.len, &other, &code, ks2, &f.d),
                     LOOM_STATUS_CORRUPT_DATA);
    assert_string_equal(f.d.msg, "codegen: code blob: kernel table differs from the plan's");
    assert_null(code);
    loom_cg_code_destroy(code2);
    loom_ir_sbuf_deinit(&blob);
    free(ks);
    free(ks2);
    fx_deinit(&f);
}

static void test_corrupt_or_truncated_blobs_are_rejected(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 1, S(100));
    int32_t r = op1(&f, LOOM_IR_OP_EXP, x);
    output(&f, r);
    kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, &k), LOOM_OK);
    loom_ir_sbuf blob;
    loom_ir_sbuf_init(&blob, &f.a);
    assert_int_equal(loom_cg_code_serialize(code, &blob, &f.d), LOOM_OK);
    loom_cg_code_destroy(code);
    char *copy = malloc(blob.len);
    /* a flipped byte anywhere: header, key, kernel table, machine code, checksum */
    size_t step = blob.len / 97 + 1;
    for (size_t pos = 0; pos < blob.len; pos += step) {
        memcpy(copy, blob.data, blob.len);
        copy[pos] ^= 0x10;
        loom_cg_code *c2 = NULL;
        loom_ir_diag_init(&f.d);
        assert_int_equal(loom_cg_code_load(copy, blob.len, &f.plan, &c2, &k, &f.d),
                         LOOM_STATUS_CORRUPT_DATA);
        assert_null(c2);
    }
    /* truncated at every length (sampled) */
    for (size_t len = 0; len < blob.len; len += step) {
        loom_cg_code *c2 = NULL;
        assert_int_equal(loom_cg_code_load(blob.data, len, &f.plan, &c2, &k, &f.d),
                         LOOM_STATUS_CORRUPT_DATA);
        assert_null(c2);
    }
    /* a blob with a recomputed checksum but bad structure: garbage appended */
    assert_int_equal(loom_cg_code_load("LOOMCGB", 8, &f.plan, &code, &k, &f.d),
                     LOOM_STATUS_CORRUPT_DATA);
    assert_non_null(strstr(f.d.msg, "code blob"));
    free(copy);
    loom_ir_sbuf_deinit(&blob);
    fx_deinit(&f);
}

static void test_target_key_names_llvm_cpu_and_format(void **state) {
    (void)state;
    const char *key = loom_cg_target_key();
    assert_non_null(key);
    assert_int_equal(strncmp(key, "llvm-19.", 8), 0);
    assert_non_null(strstr(key, ";cg"));
    assert_ptr_equal(key, loom_cg_target_key()); /* stable */
    /* code compiled with LLVM's loop strength reduction is cached apart (LOOM_CG_LSR=1) */
    const char *lsr = getenv("LOOM_CG_LSR");
    assert_int_equal(strstr(key, ";lsr") != NULL, lsr && strcmp(lsr, "1") == 0);
#if defined(__x86_64__)
    assert_non_null(strstr(key, "+sse2"));
#endif
}

/* ---- dumps -------------------------------------------------------------------------------- */

static void test_dumps_write_mlir_lowered_llvm_ir_and_assembly(void **state) {
    (void)state;
    char dir[] = "/tmp/loom_cg_dumpXXXXXX";
    assert_non_null(mkdtemp(dir));
    fx f;
    fx_init(&f);
    int32_t x = input(&f, LOOM_DTYPE_F32, 1, S(4096));
    int32_t y = input(&f, LOOM_DTYPE_F32, 1, S(4096));
    int32_t r = op1(&f, LOOM_IR_OP_EXP, op2(&f, LOOM_IR_OP_ADD, x, y));
    output(&f, r);
    kernel_range(&f, LOOM_IR_KERNEL_ELEMENTWISE, r - 1, r);
    loom_cg_options opts = {.compile_threads = 1, .dump_dir = dir, .dump_prefix = "step1"};
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(loom_cg_compile(&f.g, &f.plan, &opts, &code, &k, &f.d), LOOM_OK);
    const char *ext[4] = {".mlir", ".lowered.mlir", ".m0.ll", ".m0.s"};
    const char *needle[4] = {"func.func @loom_k0_body", "llvm.func @loom_k0_body",
                             "define void @loom_k0(ptr", "loom_k0:"};
    for (int i = 0; i < 4; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/step1%s", dir, ext[i]);
        char *text = tu_read_file(path);
        assert_non_null(text);
        if (!strstr(text, needle[i]))
            fail_msg("%s lacks '%s'", path, needle[i]);
        if (i == 1) /* fully lowered */
            assert_null(strstr(text, "scf.for"));
        if (i == 2) { /* the body was inlined into the wrapper and dropped */
            assert_null(strstr(text, "define internal"));
            assert_null(strstr(text, "memcheck")); /* noalias survived the inlining */
        }
#if defined(__x86_64__)
        if (i == 3) /* the exp chain's loop is vectorized: packed single-precision ops */
            assert_true(strstr(text, "ps\t%ymm") || strstr(text, "ps\t%zmm") ||
                        strstr(text, "ps\t%xmm"));
#endif
        free(text);
        /* each file is accepted by its own tool, where the tool is installed */
        static const char *const tool[4] = {"mlir-opt-19", "mlir-opt-19",
                                            "opt-19 -passes=verify -disable-output", "as"};
        static const char *const which[4] = {"mlir-opt-19", "mlir-opt-19", "opt-19", "as"};
        char cmd[512];
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", which[i]);
        if (system(cmd) == 0) {
            snprintf(cmd, sizeof cmd, "%s %s -o /dev/null", tool[i], path);
            if (system(cmd) != 0)
                fail_msg("%s rejects %s", which[i], path);
        } else {
            printf("# %s not installed: %s not checked with it\n", which[i], path);
        }
        unlink(path);
    }
    rmdir(dir);
    loom_cg_code_destroy(code);
    fx_deinit(&f);
}

/* ---- refusals ----------------------------------------------------------------------------- */

static void test_a_matmul_operand_computed_in_its_kernel_is_unsupported(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    int32_t a = input(&f, LOOM_DTYPE_F32, 2, S(4, 4));
    int32_t b = input(&f, LOOM_DTYPE_F32, 2, S(4, 4));
    int32_t e = op1(&f, LOOM_IR_OP_EXP, a);
    int32_t m = op2(&f, LOOM_IR_OP_MATMUL, e, b);
    output(&f, m);
    kernel(&f, LOOM_IR_KERNEL_ROOTED, m, 2, (int32_t[]){e, m});
    loom_rt_kernel k;
    loom_cg_code *code = NULL;
    assert_int_equal(compile(&f, 1, &code, &k), LOOM_STATUS_UNSUPPORTED);
    assert_null(code);
    assert_non_null(strstr(f.d.msg, "matmul operand"));
    assert_non_null(strstr(f.d.msg, "kernel 0"));
    fx_deinit(&f);
}

static void test_null_arguments_are_invalid(void **state) {
    (void)state;
    fx f;
    fx_init(&f);
    begin_plan(&f);
    loom_cg_code *code = NULL;
    assert_int_equal(loom_cg_compile(NULL, &f.plan, NULL, &code, NULL, &f.d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_cg_code_serialize(NULL, NULL, &f.d), LOOM_STATUS_INVALID_ARGUMENT);
    loom_cg_code_destroy(NULL);
    /* an empty plan compiles to empty code */
    assert_int_equal(loom_cg_compile(&f.g, &f.plan, NULL, &code, NULL, &f.d), LOOM_OK);
    assert_non_null(code);
    loom_cg_code_destroy(code);
    fx_deinit(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_ops_wrap_and_never_trap_in_i32),
        cmocka_unit_test(test_integer_ops_wrap_and_never_trap_in_i64),
        cmocka_unit_test(test_integer_division_by_zero_and_int_min_by_minus_one),
        cmocka_unit_test(test_casts_between_every_pair_of_dtypes),
        cmocka_unit_test(test_float_to_int_cast_saturates_and_maps_nan_to_zero),
        cmocka_unit_test(test_f32_to_bf16_rounds_every_edge_like_the_interpreter),
        cmocka_unit_test(test_f16_and_bf16_chains_round_every_node_like_the_interpreter),
        cmocka_unit_test(test_odd_sizes_from_scalars_to_large_vectors),
        cmocka_unit_test(test_broadcasts_of_rows_columns_and_scalars),
        cmocka_unit_test(test_transposed_nests_are_tiled),
        cmocka_unit_test(test_pads_read_through_slices_of_a_buffer),
        cmocka_unit_test(test_a_64_op_fused_chain_is_one_kernel),
        cmocka_unit_test(test_results_of_another_shape_are_written_by_a_side_nest),
        cmocka_unit_test(test_bool_values_compare_select_and_store_as_bytes),
        cmocka_unit_test(test_zero_sized_tensors_compile_and_write_nothing),
        cmocka_unit_test(test_reductions_with_prologue_and_epilogue_over_axis_sets),
        cmocka_unit_test(test_strided_1x1_input_gradient_with_a_fused_epilogue),
        cmocka_unit_test(test_conv_epilogue_operands_are_prefetched),
        cmocka_unit_test(test_blocked_reductions_over_batch_and_pixels),
        cmocka_unit_test(test_reductions_sharing_one_pass),
        cmocka_unit_test(test_staged_reductions_run_row_by_row),
        cmocka_unit_test(test_float_sums_add_in_vector_lanes_of_f64),
        cmocka_unit_test(test_max_over_small_windows_is_unrolled),
        cmocka_unit_test(test_reductions_read_transposed_and_broadcast_operands),
        cmocka_unit_test(test_integer_sums_wrap_and_maxima_are_exact),
        cmocka_unit_test(test_matmuls_of_odd_and_batched_shapes),
        cmocka_unit_test(test_wide_matmuls_with_few_rows_split_their_columns_across_tasks),
        cmocka_unit_test(test_matmul_reads_a_reshaped_operand_and_writes_product_and_epilogue),
        cmocka_unit_test(test_matmul_with_bias_and_relu_epilogue),
        cmocka_unit_test(test_fused_plans_of_many_kernels_compile_on_several_threads),
        cmocka_unit_test(test_serialized_code_loads_and_computes_the_same),
        cmocka_unit_test(test_corrupt_or_truncated_blobs_are_rejected),
        cmocka_unit_test(test_target_key_names_llvm_cpu_and_format),
        cmocka_unit_test(test_dumps_write_mlir_lowered_llvm_ir_and_assembly),
        cmocka_unit_test(test_a_matmul_operand_computed_in_its_kernel_is_unsupported),
        cmocka_unit_test(test_null_arguments_are_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
