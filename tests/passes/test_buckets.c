/* Tests of the all-reduce bucketing pass (passes/buckets.c) through the whole plan pipeline:
 * which all-reduces share a bucket (the threshold, dtype grouping, the order the operands are
 * computed in, 0 and infinity), where each bucket starts and is waited on, its values laid
 * end to end by memory planning, and the plan's printout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "test_util.h"

static loom_allocator sys;

/* Gradients g5..g0 computed in that order (backward: the last layer's first), all-reduced
 * (sum, scale 0.5) in the user's order ar0..ar5, each read by a kernel in that order.
 * Sizes: f32 g0 1 KiB, g1 2 KiB, g3 4 KiB, g5 1 KiB; bf16 g2 1 KiB, g4 512 B. When
 * interleaved, each gradient's all-reduce and its reader come right after it. */
static void build(loom_ir_graph *g, bool interleaved) {
    loom_ir_graph_init(g, &sys);
    static const int64_t len[6] = {256, 512, 512, 1024, 256, 256};
    static const loom_dtype dt[6] = {LOOM_DTYPE_F32, LOOM_DTYPE_F32,  LOOM_DTYPE_BF16,
                                     LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F32};
    int32_t x[6], gr[6], ar[6];
    for (int i = 0; i < 6; i++)
        x[i] = tu_input(g, dt[i], 1, &len[i]);
    loom_ir_attrs sum = {.index = LOOM_REDUCE_SUM, .value = 0.5};
    for (int i = 5; i >= 0; i--) {
        gr[i] = tu_add(g, LOOM_IR_OP_NEG, 1, &x[i], dt[i], 1, &len[i], (loom_ir_attrs){0});
        if (interleaved) {
            ar[i] = tu_add(g, LOOM_IR_OP_ALL_REDUCE, 1, &gr[i], dt[i], 1, &len[i], sum);
            tu_output(
                g, tu_add(g, LOOM_IR_OP_EXP, 1, &ar[i], dt[i], 1, &len[i], (loom_ir_attrs){0}), -1);
        }
    }
    if (interleaved)
        return;
    for (int i = 0; i < 6; i++)
        ar[i] = tu_add(g, LOOM_IR_OP_ALL_REDUCE, 1, &gr[i], dt[i], 1, &len[i], sum);
    for (int i = 0; i < 6; i++)
        tu_output(g, tu_add(g, LOOM_IR_OP_EXP, 1, &ar[i], dt[i], 1, &len[i], (loom_ir_attrs){0}),
                  -1);
}

/* The gradient (0..5) an all-reduce node reduces: its operand's input index. */
static int grad_of(const loom_ir_graph *g, int32_t ar) {
    const loom_ir_node *neg = &g->nodes[g->nodes[ar].inputs[0]];
    return (int)g->nodes[neg->inputs[0]].attrs.index;
}

/* "3:[g3 g5]<12 5:[g2 g4]<11": each collective kernel's position, its gradients in
 * layout order (the all-reduces' graph order) and the kernel it is waited on before; also checks
 * that a bucket's values lie end to end in the arena. */
static const char *describe(const loom_ir_graph *g, const loom_ir_plan *p) {
    static char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        if (kn->kind != LOOM_IR_KERNEL_COLLECTIVE)
            continue;
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d:[", n ? " " : "", (int)k);
        for (int32_t j = 0; j < kn->n_results; j++) {
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%sg%d", j ? " " : "",
                                  grad_of(g, kn->results[j]));
            if (j > 0) {
                const loom_ir_placement *a = &p->placement[kn->results[j - 1]],
                                        *b = &p->placement[kn->results[j]];
                assert_int_equal(a->kind, LOOM_IR_BUFFER_ARENA);
                assert_int_equal(b->offset, a->offset + (a->bytes + 63) / 64 * 64);
            }
        }
        n += (size_t)snprintf(buf + n, sizeof buf - n, "]<%d", (int)kn->wait_before);
    }
    return buf;
}

static void plan_with(loom_ir_graph *g, loom_ir_plan *p, double mb) {
    loom_ir_plan_init(p, &sys);
    loom_pass_options o = {.verify_each = true, .allreduce_bucket_mb = mb};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_pass_build_plan(g, &o, p, &d) != LOOM_OK)
        fail_msg("build plan: %s", d.msg);
}

static void expect_buckets(bool interleaved, double mb, const char *want) {
    loom_ir_graph g;
    build(&g, interleaved);
    loom_ir_plan p;
    plan_with(&g, &p, mb);
    const char *got = describe(&g, &p);
    if (strcmp(got, want) != 0)
        fail_msg("%s, %g MB: buckets \"%s\", expected \"%s\"",
                 interleaved ? "interleaved" : "after backward", mb, got, want);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
}

/* Kernels: neg g5..g0 at 0..5 before bucketing, exp readers of ar0..ar5 after. A bucket
 * starts right after the kernel computing its last gradient and is waited on before the
 * first exp reading one of its values. */
static void test_buckets_close_at_the_threshold_grouped_by_dtype_in_backward_order(void **state) {
    (void)state;
    /* 3 KiB: f32 g5+g3 (5 KiB) closes, g1+g0 (3 KiB) closes; bf16 g4+g2 stays open */
    expect_buckets(false, 3.0 / 1024, "3:[g3 g5]<12 5:[g2 g4]<11 8:[g0 g1]<9");
    /* 25 MB (the default) and infinity: one bucket per dtype */
    expect_buckets(false, 0, "4:[g2 g4]<10 7:[g0 g1 g3 g5]<8");
    expect_buckets(false, INFINITY, "4:[g2 g4]<10 7:[g0 g1 g3 g5]<8");
    /* 1 KiB: a bucket closes as soon as it holds 1 KiB */
    expect_buckets(false, 1.0 / 1024, "1:[g5]<16 4:[g3]<14 6:[g2 g4]<13 8:[g1]<12 10:[g0]<11");
}

static void test_a_threshold_of_zero_gives_one_bucket_per_gradient(void **state) {
    (void)state;
    expect_buckets(false, -1, "1:[g5]<17 3:[g4]<16 5:[g3]<15 7:[g2]<14 9:[g1]<13 11:[g0]<12");
}

/* A bucket never starts after a reader of one of its values: when each all-reduce is read
 * right after it, every gradient gets a bucket of its own, waited on by its reader. */
static void test_a_bucket_never_starts_after_a_reader_of_its_values(void **state) {
    (void)state;
    expect_buckets(true, INFINITY, "1:[g5]<2 4:[g4]<5 7:[g3]<8 10:[g2]<11 13:[g1]<14 16:[g0]<17");
}

static void write_sbuf(const char *chunk, size_t len, void *ud) {
    loom_ir_sbuf_append(ud, chunk, len);
}

static void test_the_plan_printout_lists_each_bucket(void **state) {
    (void)state;
    loom_ir_graph g;
    build(&g, false);
    loom_ir_plan p;
    plan_with(&g, &p, 3.0 / 1024);
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_plan_print(&p, &g, write_sbuf, &sb), LOOM_OK);
    loom_ir_sbuf_append(&sb, "", 1);
    const char *want[] = {"kernel 3: collective", "    bucket: 2 all_reduces, 5120 bytes\n",
                          "    starts here, waited on before kernel 12\n",
                          "    bucket: 2 all_reduces, 1536 bytes\n",
                          "    starts here, waited on before kernel 11\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(sb.data, want[i]))
            fail_msg("plan printout lacks \"%s\":\n%s", want[i], sb.data);
    loom_ir_sbuf_deinit(&sb);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
}

/* The verifier catches what the pass must never produce. */
static void test_the_verifier_refuses_a_reader_before_the_wait(void **state) {
    (void)state;
    loom_ir_graph g;
    build(&g, false);
    loom_ir_plan p;
    plan_with(&g, &p, 3.0 / 1024);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    p.kernels[3].wait_before = 13; /* its first reader is kernel 12 */
    assert_int_equal(loom_ir_plan_verify(&p, &g, &d), LOOM_STATUS_VERIFY_FAILED);
    assert_non_null(
        strstr(d.msg, "is read before collective kernel 3 completes (before kernel 13)"));
    p.kernels[3].wait_before = 3;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_plan_verify(&p, &g, &d), LOOM_STATUS_VERIFY_FAILED);
    assert_non_null(strstr(d.msg, "waited on before kernel 3, which is not after it"));
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_close_at_the_threshold_grouped_by_dtype_in_backward_order),
        cmocka_unit_test(test_a_threshold_of_zero_gives_one_bucket_per_gradient),
        cmocka_unit_test(test_a_bucket_never_starts_after_a_reader_of_its_values),
        cmocka_unit_test(test_the_plan_printout_lists_each_bucket),
        cmocka_unit_test(test_the_verifier_refuses_a_reader_before_the_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
