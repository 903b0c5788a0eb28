/* Tests of the reference interpreter as an executor: outputs aliasing inputs, temporaries
 * freed after their last use, out-of-memory at every allocation, invalid graphs and missing
 * buffers, and executables running their own copy of a graph. */
#include "interp_util.h"

static void test_output_may_alias_its_input(void **state) {
    (void)state;
    /* y = x + 1 written over x: results are computed before any output is written */
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(4));
    int32_t one = constant(&t, LOOM_DTYPE_F32, 1, S(4), 1.0);
    int32_t y = op2(&t, LOOM_IR_OP_ADD, x, one);
    output(&t, y, 0);
    output(&t, op2(&t, LOOM_IR_OP_MUL, x, x), -1); /* reads x after y exists */
    float xs[4] = {1, -2, 0.5f, NAN}, sq[4];
    run_graph(&t, (const void *[]){xs}, (void *[]){xs, sq});
    EXPECT_F32(xs, 0, 2, -1, 1.5f, NAN);
    EXPECT_F32(sq, 0, 1, 4, 0.25f, NAN);
    tg_deinit(&t);
}

static void test_outputs_may_swap_two_inputs(void **state) {
    (void)state;
    /* outputs (b, a) written into (a, b): the old values must not be clobbered */
    tg t;
    tg_init(&t);
    int32_t a = input(&t, LOOM_DTYPE_I32, 1, S(2));
    int32_t b = input(&t, LOOM_DTYPE_I32, 1, S(2));
    output(&t, b, 0);
    output(&t, a, 1);
    int32_t as[2] = {1, 2}, bs[2] = {3, 4};
    run_graph(&t, (const void *[]){as, bs}, (void *[]){as, bs});
    EXPECT_I32(as, 3, 4);
    EXPECT_I32(bs, 1, 2);
    tg_deinit(&t);
}

static void test_one_node_may_feed_two_outputs_and_an_operand_twice(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(2));
    int32_t e = op1(&t, LOOM_IR_OP_NEG, x);
    int32_t sq = op2(&t, LOOM_IR_OP_MUL, e, e);
    output(&t, sq, -1);
    output(&t, sq, -1);
    output(&t, e, -1);
    float xs[2] = {3, -0.5f}, y1[2], y2[2], y3[2];
    run_graph(&t, (const void *[]){xs}, (void *[]){y1, y2, y3});
    EXPECT_F32(y1, 0, 9, 0.25f);
    EXPECT_F32(y2, 0, 9, 0.25f);
    EXPECT_F32(y3, 0, -3, 0.5f);
    tg_deinit(&t);
}

/* x -> exp -> 1 + . -> log -> ... on 4 KiB buffers: at most two temporaries are live. */
static void test_temporaries_are_freed_after_their_last_use(void **state) {
    (void)state;
    enum { N = 1024 };
    tg t;
    tg_init(&t);
    int32_t v = input(&t, LOOM_DTYPE_F32, 1, S(N));
    int32_t one = constant(&t, LOOM_DTYPE_F32, 1, S(N), 1.0);
    for (int i = 0; i < 10; i++)
        v = op2(&t, LOOM_IR_OP_ADD, op1(&t, LOOM_IR_OP_NEG, v), one);
    output(&t, v, -1);
    static float xs[N], ys[N];
    for (int i = 0; i < N; i++)
        xs[i] = (float)i;
    test_alloc ta = {0};
    loom_allocator al = test_alloc_make(&ta);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(&t.g, &al, (const void *[]){xs}, (void *[]){ys}, &d),
                     LOOM_OK);
    /* one = 1, and each of the 10 rounds maps v to 1 - v: 10 rounds give back x */
    EXPECT_F32(ys, 0, 0, 1, 2, 3);
    assert_true(ys[N - 1] == N - 1);
    /* constant + neg + add live at once = 3 buffers; plus per-node bookkeeping */
    int64_t bound = 3 * N * (int64_t)sizeof(float) + t.g.n_nodes * 64;
    if (ta.peak_bytes > bound)
        fail_msg("peak %lld bytes > %lld", (long long)ta.peak_bytes, (long long)bound);
    assert_int_equal(ta.live_bytes, 0);
    tg_deinit(&t);
}

/* Fails the N-th allocation for N = 1, 2, ... until the run succeeds. */
static void test_out_of_memory_at_every_allocation_is_clean(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t w = input(&t, LOOM_DTYPE_F32, 2, S(3, 2));
    int32_t z = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t m = op2(&t, LOOM_IR_OP_MATMUL, x, w);
    int32_t r = op1(&t, LOOM_IR_OP_RELU, m);
    int32_t s = reduce(&t, LOOM_IR_OP_REDUCE_SUM, r, 1u << 1, false);
    int32_t b =
        shaped(&t, LOOM_IR_OP_BROADCAST, constant(&t, LOOM_DTYPE_F32, 0, NULL, 0.5), 1, S(2));
    output(&t, op2(&t, LOOM_IR_OP_MUL, s, b), -1);
    /* x and z swap buffers: both are copied aside before any output is written */
    output(&t, x, 2);
    output(&t, z, 0);
    output(&t, r, -1);
    const float xs[6] = {1, -2, 3, -4, 5, -6}, ws[6] = {1, 0, 0, 1, 1, 1};
    const float zs[6] = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
    int64_t failures = 0;
    for (int64_t n = 1;; n++) {
        float xb[6], zb[6], y[2] = {0, 0}, ry[4];
        memcpy(xb, xs, sizeof xs);
        memcpy(zb, zs, sizeof zs);
        test_alloc ta = {.fail_at = n};
        loom_allocator al = test_alloc_make(&ta);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        int64_t before = ta.live_bytes;
        loom_status st = loom_rt_interp_run(&t.g, &al, (const void *[]){xb, ws, zb},
                                            (void *[]){y, zb, xb, ry}, &d);
        assert_int_equal(ta.live_bytes, before);
        assert_int_equal(ta.live_blocks, 0);
        if (st == LOOM_OK) {
            assert_int_equal(ta.n_failed, 0);
            /* x w = [1+3, -2+3; -4-6, 5-6] = [4, 1; -10, -1]; relu: [4, 1; 0, 0] */
            EXPECT_F32(ry, 0, 4, 1, 0, 0);
            EXPECT_F32(y, 0, 2.5f, 0);
            EXPECT_F32(zb, 0, 1, -2, 3, -4, 5, -6);
            EXPECT_F32(xb, 0, 0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
        assert_non_null(strstr(d.msg, "out of memory"));
        assert_int_equal(ta.n_failed, 1);
        failures++;
        assert_true(n < 100);
    }
    /* bookkeeping, 6 temporaries and the copies aside of x and z */
    assert_true(failures == 9);
    tg_deinit(&t);
}

static void test_invalid_graphs_and_missing_buffers_are_rejected(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator al = test_alloc_make(&ta);
    loom_ir_diag d;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(2));
    output(&t, op1(&t, LOOM_IR_OP_EXP, x), -1);
    float y[2];
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(&t.g, &al, NULL, (void *[]){y}, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(d.msg, "input 0"));
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(&t.g, &al, (const void *[]){y}, (void *[]){NULL}, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(d.msg, "output 0"));
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(NULL, &al, NULL, NULL, &d), LOOM_STATUS_INVALID_ARGUMENT);
    /* a corrupted node (operand not earlier) fails verification instead of crashing */
    t.g.nodes[1].inputs[0] = 5;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(&t.g, &al, (const void *[]){y}, (void *[]){y}, &d),
                     LOOM_STATUS_VERIFY_FAILED);
    assert_int_equal(d.node, 1);
    assert_int_equal(ta.live_bytes, 0);
    tg_deinit(&t);
}

static void test_executable_runs_its_graph_copy_on_buffers(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(3));
    int32_t w = input(&t, LOOM_DTYPE_F32, 1, S(3));
    output(&t, op2(&t, LOOM_IR_OP_SUB, x, w), 0);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_SUM, w, 1u, false), -1);
    test_alloc ta = {0};
    loom_allocator al = test_alloc_make(&ta);
    loom_rt_executable *exe = NULL;
    assert_int_equal(loom_rt_interp_executable_create(&t.g, 0x1234u, &al, &exe), LOOM_OK);
    assert_non_null(exe);
    assert_int_equal(exe->hash, 0x1234u);
    assert_true(loom_ir_graph_equal(&exe->graph, &t.g));
    tg_deinit(&t); /* the executable owns its copy */

    float xs[3] = {1, 2, 3}, ws[3] = {0.5f, -1, 4}, s = 0;
    loom_rt_buffer bx = {.data = xs, .size = sizeof xs, .refs = 1};
    loom_rt_buffer bw = {.data = ws, .size = sizeof ws, .refs = 1};
    loom_rt_buffer bs = {.data = &s, .size = sizeof s, .refs = 1};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(
        exe->vt->run(exe, (loom_rt_buffer *[]){&bx, &bw}, (loom_rt_buffer *[]){&bx, &bs}, &d),
        LOOM_OK);
    EXPECT_F32(xs, 0, 0.5f, 3, -1);
    EXPECT_F32(&s, 0, 3.5f);
    /* a buffer that is too small is reported, not overrun */
    loom_rt_buffer small = {.data = &s, .size = 2, .refs = 1};
    loom_ir_diag_init(&d);
    assert_int_equal(
        exe->vt->run(exe, (loom_rt_buffer *[]){&bx, &bw}, (loom_rt_buffer *[]){&bx, &small}, &d),
        LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(d.msg, "output 1"));
    exe->vt->destroy(exe);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

static void test_executable_create_out_of_memory_is_clean(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(3));
    output(&t, op1(&t, LOOM_IR_OP_TANH, x), -1);
    int64_t failures = 0;
    for (int64_t n = 1;; n++) {
        test_alloc ta = {.fail_at = n};
        loom_allocator al = test_alloc_make(&ta);
        loom_rt_executable *exe = (loom_rt_executable *)&failures; /* must be overwritten */
        loom_status st = loom_rt_interp_executable_create(&t.g, 7, &al, &exe);
        if (st == LOOM_OK) {
            ta.fail_at = 0; /* the run below allocates too */
            float xs[3] = {0, 1, -1}, ys[3];
            loom_rt_buffer bx = {.data = xs, .size = sizeof xs, .refs = 1};
            loom_rt_buffer by = {.data = ys, .size = sizeof ys, .refs = 1};
            loom_ir_diag d;
            loom_ir_diag_init(&d);
            assert_int_equal(
                exe->vt->run(exe, (loom_rt_buffer *[]){&bx}, (loom_rt_buffer *[]){&by}, &d),
                LOOM_OK);
            EXPECT_F32(ys, TOL, 0, 0.761594176f, -0.761594176f);
            exe->vt->destroy(exe);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_null(exe);
        assert_int_equal(ta.live_bytes, 0);
        failures++;
        assert_true(n < 100);
    }
    assert_true(failures >= 2);
    tg_deinit(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_output_may_alias_its_input),
        cmocka_unit_test(test_outputs_may_swap_two_inputs),
        cmocka_unit_test(test_one_node_may_feed_two_outputs_and_an_operand_twice),
        cmocka_unit_test(test_temporaries_are_freed_after_their_last_use),
        cmocka_unit_test(test_out_of_memory_at_every_allocation_is_clean),
        cmocka_unit_test(test_invalid_graphs_and_missing_buffers_are_rejected),
        cmocka_unit_test(test_executable_runs_its_graph_copy_on_buffers),
        cmocka_unit_test(test_executable_create_out_of_memory_is_clean),
    };
    return cmocka_run_group_tests_name("interp_exec", tests, NULL, NULL);
}
