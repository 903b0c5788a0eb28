/* Tests of memory planning: arena placement and reuse, outputs written in place into
 * donated inputs, and the copies that fill outputs after the kernels. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- memory planning --------------------------------------------------------------------- */

static void test_memplan_reuses_the_arena_along_a_chain_of_matmuls(void **state) {
    (void)state;
    /* ten chained matmuls: each product lives from its kernel to the next, so two buffers
     * of 64x64 f32 (16 KiB) serve all nine intermediates */
    char text[4096];
    size_t n = (size_t)snprintf(text, sizeof text,
                                "loom.graph {\n  %%0 = input {index = 0} : f32[64,64]\n"
                                "  %%1 = input {index = 1} : f32[64,64]\n"
                                "  %%2 = matmul %%0, %%1 : f32[64,64]\n");
    for (int i = 3; i <= 11; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "  %%%d = matmul %%%d, %%1 : f32[64,64]\n",
                              i, i - 1);
    snprintf(text + n, sizeof text - n, "  return %%11\n}\n");
    loom_ir_graph g;
    tu_parse(&g, text);
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 10);
    assert_int_equal(p.arena_bytes, 2 * 16384);
    assert_int_equal(p.peak_bytes, 2 * 16384 + 16384);
    size_t sum = 0;
    for (int32_t i = 2; i <= 10; i++) {
        assert_int_equal(p.placement[i].kind, LOOM_IR_BUFFER_ARENA);
        assert_int_equal(p.placement[i].offset, (size_t)(i % 2 ? 16384 : 0));
        sum += p.placement[i].bytes;
    }
    assert_true(sum == 9 * 16384);
    assert_true(p.arena_bytes * 4 < sum);
    tu_deinit_both(&g, &p);
}

static void test_memplan_fits_freed_ranges_best_first(void **state) {
    (void)state;
    /* Matmuls only, so that every value is its own kernel's result. Kernel k computes %k+2.
     * big (256 B) and small (64 B) die at kernel 3, leaving holes [0,256) and [320,384)
     * around keep; the 64 B value x then takes the small hole (first fit would take 0) and
     * the 256 B value y the big one. */
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = input {index = 1} : f32[4,16]\n"
                 "  %2 = matmul %0, %1 : f32[4,16]\n" /* big   [0,256)   kernels 0..3 */
                 "  %3 = matmul %0, %0 : f32[4,4]\n"  /* keep  [256,320) kernels 1..6 */
                 "  %4 = matmul %0, %0 : f32[4,4]\n"  /* small [320,384) kernels 2..3 */
                 "  %5 = matmul %4, %2 : f32[4,16]\n" /* r     [384,640) kernels 3..7 */
                 "  %6 = matmul %0, %0 : f32[4,4]\n"  /* x     [320,384) kernels 4..8 */
                 "  %7 = matmul %0, %1 : f32[4,16]\n" /* y     [0,256)   kernels 5..8 */
                 "  %8 = matmul %3, %6 : f32[4,4]\n"  /* z     [640,704) kernels 6..7 */
                 "  %9 = matmul %8, %5 : f32[4,16]\n"
                 "  %10 = matmul %6, %7 : f32[4,16]\n"
                 "  return %9, %10\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 9);
    assert_string_equal(tu_placement_str(&p, &g),
                        "%0:in0 %1:in1 %2:arena+0 %3:arena+256 %4:arena+320 %5:arena+384 "
                        "%6:arena+320 %7:arena+0 %8:arena+640 %9:out0 %10:out1");
    assert_int_equal(p.arena_bytes, 704);
    assert_int_equal(p.peak_bytes, 704 + 2 * 256);
    tu_deinit_both(&g, &p);
}

static void test_memplan_updates_a_donated_input_in_place_when_safe(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    /* an SGD-like update: the root reads its donated input only at the index it writes
     * (the broadcast is of a constant), and nothing reads the input afterwards */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = input {index = 1} : f32[8]\n"
                 "  %2 = constant {value = 0.5} : f32[]\n"
                 "  %3 = broadcast %2 : f32[8]\n"
                 "  %4 = mul %1, %3 : f32[8]\n"
                 "  %5 = sub %0, %4 : f32[8]\n"
                 "  return %5 {alias = 0}\n}\n");
    tu_fuse_ok(&g, &p);
    assert_true(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:in1 %5:out0");
    assert_string_equal(tu_copies_str(&p), "");
    assert_int_equal(p.arena_bytes, 0);
    assert_int_equal(p.peak_bytes, 0); /* the update needs no memory of its own */
    tu_deinit_both(&g, &p);

    /* a transpose of the input would read other elements than it writes: copy */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = transpose %0 {perm = [1, 0]} : f32[4,4]\n"
                 "  %2 = add %0, %1 : f32[4,4]\n"
                 "  return %2 {alias = 0}\n}\n");
    tu_fuse_ok(&g, &p);
    assert_false(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_copies_str(&p), "%2->out0");
    tu_deinit_both(&g, &p);

    /* a later kernel still reads the input: copy */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = neg %0 : f32[8]\n"
                 "  %2 = reduce_sum %0 {axes = [0], keepdim = false} : f32[]\n"
                 "  return %1 {alias = 0}, %2\n}\n");
    tu_fuse_ok(&g, &p);
    assert_false(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_copies_str(&p), "%1->out0");
    tu_deinit_both(&g, &p);
}

static void test_memplan_copies_aliased_and_duplicate_outputs(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = input {index = 1} : f32[8]\n"
                 "  %2 = sub %0, %1 : f32[8]\n"
                 "  %3 = abs %2 : f32[8]\n"
                 "  return %2 {alias = 0}, %3, %2, %1\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{2 3}<-{0 1}->{2 3}");
    /* %2 is donated into input 0, which its kernel reads only at the index it writes: it
     * is written there in place, and a copy fills output 2, the same value; the input
     * returned as output 3 is a copy too */
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:in1 %2:out0 %3:out1");
    assert_string_equal(tu_copies_str(&p), "%2->out2 %1->out3");
    assert_int_equal(p.arena_bytes, 0);
    assert_int_equal(p.peak_bytes, 3 * 32); /* outputs 1, 2, 3; output 0 is input 0 */
    tu_deinit_both(&g, &p);

    /* only aliased, and a later kernel reads the input: the value lives in the arena
     * until the copy */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = neg %0 : f32[8]\n"
                 "  %2 = exp %0 : f32[8]\n"
                 "  return %1 {alias = 0}, %2\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{2}<-{0}->{2}");
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:arena+0 %2:out1");
    assert_string_equal(tu_copies_str(&p), "%1->out0");
    assert_int_equal(p.arena_bytes, 64);
    tu_deinit_both(&g, &p);
}

static void test_memplan_updates_in_place_beside_the_root_and_in_a_matmul_epilogue(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    /* a result beside the root, of its shape: stored with it after both are evaluated */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = neg %0 : f32[8]\n"
                 "  %2 = exp %1 : f32[8]\n"
                 "  return %1 {alias = 0}, %2\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1 2}<-{0}->{1 2}");
    assert_true(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:out0 %2:out1");
    assert_string_equal(tu_copies_str(&p), "");
    assert_int_equal(p.arena_bytes, 0);
    tu_deinit_both(&g, &p);

    /* SGD fused into the weight gradient's epilogue: w - 0.5 * (x^T dy), and the momentum
     * beside it; both written into their inputs (no copies, no arena) */
    const char *sgd = "loom.graph {\n"
                      "  %0 = input {index = 0} : f32[3,4]\n"
                      "  %1 = input {index = 1} : f32[3,5]\n"
                      "  %2 = input {index = 2} : f32[4,5]\n"
                      "  %3 = input {index = 3} : f32[4,5]\n"
                      "  %4 = transpose %0 {perm = [1, 0]} : f32[4,3]\n"
                      "  %5 = matmul %4, %1 : f32[4,5]\n"
                      "  %6 = add %5, %3 : f32[4,5]\n"
                      "  %7 = constant {value = 0.5} : f32[4,5]\n"
                      "  %8 = mul %6, %7 : f32[4,5]\n"
                      "  %9 = sub %2, %8 : f32[4,5]\n"
                      "  return %9 {alias = 2}, %6 {alias = 3}\n}\n";
    tu_parse(&g, sgd);
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 2); /* the transpose, then the matmul and its epilogue */
    assert_int_equal(p.kernels[1].kind, LOOM_IR_KERNEL_ROOTED);
    assert_true(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_true(loom_ir_plan_can_update_in_place(&p, &g, 1));
    assert_string_equal(tu_copies_str(&p), "");
    tu_deinit_both(&g, &p);

    /* the product itself is never written into a donated input (codegen may accumulate
     * it there before the epilogue reads the input) */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = matmul %0, %0 : f32[4,4]\n"
                 "  return %1 {alias = 0}\n}\n");
    tu_fuse_ok(&g, &p);
    assert_false(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_copies_str(&p), "%1->out0");
    tu_deinit_both(&g, &p);

    /* a result of a matmul kernel that does not come from the product is stored by a loop
     * of its own, while the epilogue may still read the input: copy */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = input {index = 1} : f32[4,4]\n"
                 "  %2 = matmul %0, %0 : f32[4,4]\n"
                 "  %3 = neg %1 : f32[4,4]\n"
                 "  %4 = add %2, %3 : f32[4,4]\n"
                 "  return %4, %3 {alias = 1}\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "M{2 3 4}<-{0 1}->{3 4}");
    assert_false(loom_ir_plan_can_update_in_place(&p, &g, 1));
    assert_string_equal(tu_copies_str(&p), "%3->out1");
    tu_deinit_both(&g, &p);

    /* nor may the epilogue's result go into a donated input that such a loop reads: that
     * loop runs in the kernel's first task, while the other tasks' epilogues overwrite the
     * input (a race: found by the multi-step audit, 1 to 4 runs in 10 wrong at 2048x512) */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = input {index = 1} : f32[4,4]\n"
                 "  %2 = matmul %1, %1 : f32[4,4]\n"
                 "  %3 = constant {value = 2} : f32[4,4]\n"
                 "  %4 = mul %0, %3 : f32[4,4]\n"
                 "  %5 = add %2, %4 : f32[4,4]\n"
                 "  return %5 {alias = 0}, %4\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "M{2 3 4 5}<-{0 1}->{4 5}");
    assert_false(loom_ir_plan_can_update_in_place(&p, &g, 0));
    assert_string_equal(tu_copies_str(&p), "%5->out0");
    tu_deinit_both(&g, &p);
}

static void test_memplan_orders_copies_before_donated_inputs_are_overwritten(void **state) {
    (void)state;
    /* output 0 is written into input 1, which output 1 returns unchanged: the copy reading
     * input 1 must run first */
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[2,4]\n"
                 "  %1 = input {index = 1} : f32[8]\n"
                 "  %2 = reshape %0 : f32[8]\n"
                 "  %3 = add %2, %1 : f32[8]\n"
                 "  %4 = reshape %1 : f32[2,4]\n"
                 "  return %3 {alias = 1}, %4 {alias = 0}\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:in1 %2:in0 %3:arena+0 %4:in1");
    assert_string_equal(tu_copies_str(&p), "%4->out1 %3->out0");
    tu_deinit_both(&g, &p);

    /* exchanging two donated inputs cannot be ordered: memory planning says so, and
     * build_plan copies one of them aside in a kernel first */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8]\n"
                 "  %1 = input {index = 1} : f32[8]\n"
                 "  return %1 {alias = 0}, %0 {alias = 1}\n}\n");
    loom_ir_plan_init(&p, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_fuse(&g, &p, &d), LOOM_OK);
    assert_int_equal(loom_pass_plan_memory(&g, &p, &d), LOOM_STATUS_UNSUPPORTED);
    assert_non_null(strstr(d.msg, "cycle"));
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_build_plan(&g, NULL, &p, &d), LOOM_OK);
    /* one cast breaks the cycle: output 0 now reads the arena copy of input 1 */
    assert_int_equal(g.n_nodes, 3);
    assert_int_equal(g.nodes[2].op, LOOM_IR_OP_CAST);
    assert_int_equal(g.nodes[2].inputs[0], 1);
    assert_string_equal(tu_plan_str(&p), "E{2}<-{1}->{2}");
    assert_string_equal(tu_copies_str(&p), "%0->out1 %2->out0");
    tu_deinit_both(&g, &p);
}

/* A scatter_add's sums take the arena block of the base they start from where the base dies
 * at the scatter (an embedding's gradient onto the tied lm_head's), not where a later kernel
 * reads the base, nor where the scatter's own epilogue does. */
static void test_memplan_sums_a_scatter_in_its_dying_base(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8,4]\n"
                 "  %1 = input {index = 1} : f32[4,4]\n"
                 "  %2 = input {index = 2} : i64[2,4]\n"
                 "  %3 = input {index = 3} : f32[2,4]\n"
                 "  %4 = matmul %0, %1 : f32[8,4]\n"                     /* dies at %5 */
                 "  %5 = scatter_add %4, %2, %3 {axis = 0} : f32[8,4]\n" /* in %4's block */
                 "  %6 = matmul %0, %1 : f32[8,4]\n"                     /* read by %12 */
                 "  %7 = scatter_add %6, %2, %3 {axis = 0} : f32[8,4]\n"
                 "  %8 = matmul %0, %1 : f32[8,4]\n" /* read by %9's epilogue %10 */
                 "  %9 = scatter_add %8, %2, %3 {axis = 0} : f32[8,4]\n"
                 "  %10 = add %9, %8 : f32[8,4]\n"
                 "  %11 = matmul %5, %1 : f32[8,4]\n"
                 "  %12 = matmul %6, %1 : f32[8,4]\n"
                 "  %13 = matmul %7, %1 : f32[8,4]\n"
                 "  %14 = matmul %10, %1 : f32[8,4]\n"
                 "  return %11, %12, %13, %14\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    int32_t k5 = p.node_kernel[5], k7 = p.node_kernel[7], k9 = p.node_kernel[9];
    assert_int_equal(loom_ir_plan_scatter_base(&p, &g, k5), 4);
    assert_int_equal(loom_ir_plan_scatter_base(&p, &g, k7), 6); /* may, but %6 lives on */
    assert_int_equal(loom_ir_plan_scatter_base(&p, &g, k9), -1);
    assert_int_equal(p.placement[5].kind, LOOM_IR_BUFFER_ARENA);
    assert_int_equal(p.placement[5].offset, p.placement[4].offset);
    assert_true(p.placement[7].offset != p.placement[6].offset);
    assert_true(p.placement[10].offset != p.placement[8].offset);
    tu_deinit_both(&g, &p);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memplan_reuses_the_arena_along_a_chain_of_matmuls),
        cmocka_unit_test(test_memplan_fits_freed_ranges_best_first),
        cmocka_unit_test(test_memplan_updates_a_donated_input_in_place_when_safe),
        cmocka_unit_test(test_memplan_copies_aliased_and_duplicate_outputs),
        cmocka_unit_test(test_memplan_updates_in_place_beside_the_root_and_in_a_matmul_epilogue),
        cmocka_unit_test(test_memplan_orders_copies_before_donated_inputs_are_overwritten),
        cmocka_unit_test(test_memplan_sums_a_scatter_in_its_dying_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
