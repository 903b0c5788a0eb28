/* Kernels of the same structure share compiled code (ir/plan_share.c, codegen/compile.c):
 * which kernels share, that their functions are one, that each still computes its own
 * buffers' values, and that LOOM_CG_SHARE=0 compiles every kernel on its own. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "targets/targets.h"
#include "passes/passes.h"
#include "runtime/kernel.h"

static tu_runtime H;

static int setup(void **state) {
    (void)state;
    return tu_runtime_setup(&H);
}

static int teardown(void **state) {
    (void)state;
    tu_runtime_teardown(&H);
    return 0;
}

/* exp(x) + x, then its sum over axis 1: an elementwise and a reduction kernel. */
static int32_t block(loom_ir_graph *g, int32_t x, loom_ir_op op, int32_t *sum) {
    int32_t e = tu_add(g, LOOM_IR_OP_EXP, 1, &x, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
    int32_t y = tu_add(g, op, 2, (int32_t[]){e, x}, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
    tu_output(g, y, -1);
    *sum = tu_add(g, LOOM_IR_OP_REDUCE_SUM, 1, &y, LOOM_DTYPE_F32, 0, NULL,
                  (loom_ir_attrs){.axes = 2});
    tu_output(g, *sum, -1);
    return y;
}

static int32_t kernel_of(const loom_ir_plan *p, int32_t root) {
    for (int32_t k = 0; k < p->n_kernels; k++)
        if (p->kernels[k].root == root)
            return k;
    fail_msg("no kernel has root %%%d", (int)root);
    return -1;
}

/* opt: a copy of g (initialized here), planned into p (initialized here). */
static void plan_copy(const loom_ir_graph *g, loom_ir_graph *opt, loom_ir_plan *p) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_graph_init(opt, &H.alloc);
    assert_int_equal(loom_ir_graph_copy(opt, g), LOOM_OK);
    loom_ir_plan_init(p, &H.alloc);
    loom_pass_options po = {.verify_each = true};
    if (loom_pass_build_plan(opt, &po, p, &d) != LOOM_OK)
        fail_msg("%s", d.msg);
}

/* g compiled (its kernels sharing code) against the reference interpreter, then freed. */
static void check_and_free(loom_ir_graph *g, uint64_t seed) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_sample s = {.lo = -2, .hi = 2, .rel_tol = 1e-5, .abs_tol = 1e-6};
    if (loom_tg_check_against_ref(g, &s, &seed, H.pool, H.dev, &H.metrics, &d) != LOOM_OK)
        fail_msg("%s", d.msg);
    loom_ir_graph_deinit(g);
}

static void test_kernels_of_one_structure_share_their_code(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &H.alloc);
    int64_t s33[2] = {4, 33}, s34[2] = {4, 34};
    int32_t x1 = tu_input(&g, LOOM_DTYPE_F32, 2, s33), x2 = tu_input(&g, LOOM_DTYPE_F32, 2, s33);
    int32_t x3 = tu_input(&g, LOOM_DTYPE_F32, 2, s34), x4 = tu_input(&g, LOOM_DTYPE_F32, 2, s33);
    int32_t r1, r2, r3, r4;
    int32_t y1 = block(&g, x1, LOOM_IR_OP_ADD, &r1);
    int32_t y2 = block(&g, x2, LOOM_IR_OP_ADD, &r2); /* the same as 1 on other buffers */
    int32_t y3 = block(&g, x3, LOOM_IR_OP_ADD, &r3); /* another shape */
    int32_t y4 = block(&g, x4, LOOM_IR_OP_MUL, &r4); /* another op */
    /* x1 scaled by constants 2 and 3: equal but for an attribute */
    int32_t c[2], m[2];
    for (int i = 0; i < 2; i++) {
        int32_t k = tu_add(&g, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_F32, 2, s33,
                           (loom_ir_attrs){.value = 2.0 + i});
        c[i] = k;
        m[i] = tu_add(&g, LOOM_IR_OP_MUL, 2, (int32_t[]){i ? x2 : x1, c[i]}, LOOM_DTYPE_F32, 0,
                      NULL, (loom_ir_attrs){0});
        tu_output(&g, m[i], -1);
    }
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_graph opt;
    loom_ir_plan p;
    plan_copy(&g, &opt, &p);
    /* the plan's graph keeps these node ids: nothing folds or merges here */
    int32_t k1 = kernel_of(&p, y1), k2 = kernel_of(&p, y2), k3 = kernel_of(&p, y3),
            k4 = kernel_of(&p, y4), s1 = kernel_of(&p, r1), s2 = kernel_of(&p, r2),
            s3 = kernel_of(&p, r3), s4 = kernel_of(&p, r4), m1 = kernel_of(&p, m[0]),
            m2 = kernel_of(&p, m[1]);
    int32_t *rep = calloc((size_t)p.n_kernels, sizeof *rep);
    int32_t distinct = -1;
    assert_int_equal(loom_ir_plan_share_kernels(&p, &opt, rep, &distinct), LOOM_OK);
    int32_t lo = k1 < k2 ? k1 : k2, los = s1 < s2 ? s1 : s2;
    assert_int_equal(rep[k1], lo);
    assert_int_equal(rep[k2], lo);
    assert_int_equal(rep[s1], los);
    assert_int_equal(rep[s2], los);
    assert_int_equal(rep[k3], k3);
    assert_int_equal(rep[k4], k4);
    assert_int_equal(rep[s3], s3);
    assert_int_equal(rep[s4], los); /* the sum reads y4 from a buffer: the same code */
    assert_int_equal(rep[m1], m1);
    assert_int_equal(rep[m2], m2);
    assert_int_equal(distinct, p.n_kernels - 3);

    /* compiled: one function for each shared pair */
    loom_rt_kernel *kern = calloc((size_t)p.n_kernels, sizeof *kern);
    loom_cg_code *code = NULL;
    assert_int_equal(loom_cg_compile(&opt, &p, NULL, &code, kern, &d), LOOM_OK);
    assert_ptr_equal(kern[k1].fn, kern[k2].fn);
    assert_ptr_equal(kern[s1].fn, kern[s2].fn);
    assert_ptr_equal(kern[s1].fn, kern[s4].fn);
    assert_ptr_not_equal(kern[s1].fn, kern[s3].fn);
    assert_ptr_not_equal(kern[k1].fn, kern[k3].fn);
    assert_ptr_not_equal(kern[k1].fn, kern[k4].fn);
    assert_ptr_not_equal(kern[m1].fn, kern[m2].fn);
    /* through the disk cache's blob: the shared kernels find their one function again */
    loom_ir_sbuf blob;
    loom_ir_sbuf_init(&blob, &H.alloc);
    assert_int_equal(loom_cg_code_serialize(code, &blob, &d), LOOM_OK);
    loom_cg_code_destroy(code);
    memset(kern, 0, (size_t)p.n_kernels * sizeof *kern);
    assert_int_equal(loom_cg_code_load(blob.data, blob.len, &p, &code, kern, &d), LOOM_OK);
    assert_ptr_equal(kern[k1].fn, kern[k2].fn);
    assert_ptr_equal(kern[s1].fn, kern[s4].fn);
    assert_ptr_not_equal(kern[k1].fn, kern[k3].fn);
    loom_ir_sbuf_deinit(&blob);
    loom_cg_code_destroy(code);
    /* LOOM_CG_SHARE=0: every kernel its own function */
    setenv("LOOM_CG_SHARE", "0", 1);
    assert_int_equal(loom_cg_compile(&opt, &p, NULL, &code, kern, &d), LOOM_OK);
    unsetenv("LOOM_CG_SHARE");
    assert_ptr_not_equal(kern[k1].fn, kern[k2].fn);
    assert_ptr_not_equal(kern[s1].fn, kern[s2].fn);
    loom_cg_code_destroy(code);
    free(kern);
    free(rep);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&opt);

    /* and each shared function computes its own buffers' values */
    check_and_free(&g, 3);
}

/* One constant node in two kernels (as CSE leaves the ReLU mask's zeros for all of a ResNet's
 * blocks) stands after the first kernel's root in the graph and before the second's: the
 * signatures take the nodes in an order of the kernels' own structure, so the two share. */
static void test_kernels_share_whatever_their_nodes_order_in_the_graph(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &H.alloc);
    int64_t s33[2] = {4, 33};
    int32_t x1 = tu_input(&g, LOOM_DTYPE_F32, 2, s33), x2 = tu_input(&g, LOOM_DTYPE_F32, 2, s33);
    int32_t e1 = tu_add(&g, LOOM_IR_OP_EXP, 1, &x1, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
    int32_t c = tu_add(&g, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_F32, 2, s33,
                       (loom_ir_attrs){.value = 3.0});
    int32_t m1 = tu_add(&g, LOOM_IR_OP_MUL, 2, (int32_t[]){e1, c}, LOOM_DTYPE_F32, 0, NULL,
                        (loom_ir_attrs){0});
    tu_output(&g, m1, -1);
    int32_t e2 = tu_add(&g, LOOM_IR_OP_EXP, 1, &x2, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
    int32_t m2 = tu_add(&g, LOOM_IR_OP_MUL, 2, (int32_t[]){e2, c}, LOOM_DTYPE_F32, 0, NULL,
                        (loom_ir_attrs){0});
    tu_output(&g, m2, -1);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_graph opt;
    loom_ir_plan p;
    plan_copy(&g, &opt, &p);
    int32_t k1 = kernel_of(&p, m1), k2 = kernel_of(&p, m2);
    /* the premise: each kernel holds exp, the constant and mul, in the graph's order */
    const loom_ir_kernel *a = &p.kernels[k1], *b = &p.kernels[k2];
    assert_int_equal(a->n_nodes, 3);
    assert_int_equal(b->n_nodes, 3);
    assert_int_equal(a->nodes[0], e1);
    assert_int_equal(a->nodes[1], c);
    assert_int_equal(b->nodes[0], c);
    assert_int_equal(b->nodes[1], e2);
    int32_t *rep = calloc((size_t)p.n_kernels, sizeof *rep);
    int32_t distinct = -1;
    assert_int_equal(loom_ir_plan_share_kernels(&p, &opt, rep, &distinct), LOOM_OK);
    assert_int_equal(rep[k2], k1 < k2 ? k1 : k2);
    assert_int_equal(rep[k1], k1 < k2 ? k1 : k2);
    assert_int_equal(distinct, p.n_kernels - 1);
    loom_rt_kernel *kern = calloc((size_t)p.n_kernels, sizeof *kern);
    loom_cg_code *code = NULL;
    assert_int_equal(loom_cg_compile(&opt, &p, NULL, &code, kern, &d), LOOM_OK);
    assert_ptr_equal(kern[k1].fn, kern[k2].fn);
    loom_cg_code_destroy(code);
    free(kern);
    free(rep);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&opt);
    /* and the one function computes both kernels' values */
    check_and_free(&g, 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_of_one_structure_share_their_code),
        cmocka_unit_test(test_kernels_share_whatever_their_nodes_order_in_the_graph),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
