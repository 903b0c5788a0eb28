/* Tests of fusion (exact kernel partitions), the plan verifier, and the whole JIT pipeline
 * (memory planning is tests/passes/test_memplan.c): random graphs must compute the
 * same bits after dce/cse/fold and when their plan is executed kernel by kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- helpers ----------------------------------------------------------------------------- */

/* ---- fusion: exact partitions ------------------------------------------------------------ */

static void test_fusion_makes_a_64_op_elementwise_chain_one_kernel(void **state) {
    (void)state;
    char text[8192];
    size_t n = (size_t)snprintf(text, sizeof text,
                                "loom.graph {\n  %%0 = input {index = 0} : f32[16,16]\n");
    static const char *const ops[] = {"exp", "neg", "tanh", "abs", "sigmoid", "relu"};
    for (int i = 1; i <= 64; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "  %%%d = %s %%%d : f32[16,16]\n", i,
                              ops[i % 6], i - 1);
    snprintf(text + n, sizeof text - n, "  return %%64\n}\n");
    loom_ir_graph g;
    tu_parse(&g, text);
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 1);
    const loom_ir_kernel *k = &p.kernels[0];
    assert_int_equal(k->kind, LOOM_IR_KERNEL_ELEMENTWISE);
    assert_int_equal(k->root, 64);
    assert_int_equal(k->n_nodes, 64);
    for (int32_t i = 0; i < 64; i++)
        assert_int_equal(k->nodes[i], i + 1);
    assert_int_equal(k->n_args, 1);
    assert_int_equal(k->args[0], 0);
    assert_int_equal(k->n_results, 1);
    assert_int_equal(k->results[0], 64);
    assert_int_equal(p.node_kernel[0], -1);
    assert_int_equal(p.node_kernel[33], 0);
    /* nothing intermediate is stored: no arena at all; the peak is the one output */
    assert_int_equal(p.arena_bytes, 0);
    assert_int_equal(p.peak_bytes, 16 * 16 * 4);
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %64:out0");
    tu_deinit_both(&g, &p);
}

static void test_fusion_gives_matmul_bias_relu_one_kernel_per_layer(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,8]\n"
                 "  %1 = input {index = 1} : f32[8,16]\n"
                 "  %2 = input {index = 2} : f32[16]\n"
                 "  %3 = input {index = 3} : f32[16,2]\n"
                 "  %4 = input {index = 4} : f32[2]\n"
                 "  %5 = broadcast %2 : f32[4,16]\n" /* the bias broadcast precedes the matmul */
                 "  %6 = matmul %0, %1 : f32[4,16]\n"
                 "  %7 = add %6, %5 : f32[4,16]\n"
                 "  %8 = relu %7 : f32[4,16]\n"
                 "  %9 = matmul %8, %3 : f32[4,2]\n"
                 "  %10 = broadcast %4 : f32[4,2]\n"
                 "  %11 = add %10, %9 : f32[4,2]\n"
                 "  %12 = relu %11 : f32[4,2]\n"
                 "  return %12\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "M{5 6 7 8}<-{0 1 2}->{8} | M{9 10 11 12}<-{3 4 8}->{12}");
    assert_int_equal(p.kernels[0].root, 6);
    assert_int_equal(p.kernels[1].root, 9);
    assert_int_equal(p.node_kernel[5], 0);
    /* the hidden activation lives in the arena between the layers */
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:in1 %2:in2 %3:in3 %4:in4 "
                                                  "%8:arena+0 %12:out0");
    assert_int_equal(p.arena_bytes, 256);
    assert_int_equal(p.peak_bytes, 256 + 32);
    tu_deinit_both(&g, &p);
}

static void test_fusion_joins_casts_and_transposes_into_a_16_bit_matmul(void **state) {
    (void)state;
    /* autocast's linear: x and W cast to bf16, W transposed: the casts and the transpose
     * are evaluated while the matmul packs its operands (no bf16 copy is written) */
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,8]\n"
                 "  %1 = input {index = 1} : f32[16,8]\n"
                 "  %2 = cast %0 : bf16[4,8]\n"
                 "  %3 = cast %1 : bf16[16,8]\n"
                 "  %4 = transpose %3 {perm = [1, 0]} : bf16[8,16]\n"
                 "  %5 = matmul %2, %4 : bf16[4,16]\n"
                 "  %6 = relu %5 : bf16[4,16]\n"
                 "  return %6\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "M{2 3 4 5 6}<-{0 1}->{6}");
    tu_deinit_both(&g, &p);

    /* an f32 matmul reads its operands from buffers; so does a bf16 one whose cast is
     * also an output, and one whose operand is any other op (the exp is computed once) */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,8]\n"
                 "  %1 = input {index = 1} : f32[8,16]\n"
                 "  %2 = transpose %1 {perm = [1, 0]} : f32[16,8]\n"
                 "  %3 = matmul %0, %1 : f32[4,16]\n"
                 "  %4 = cast %0 : bf16[4,8]\n"
                 "  %5 = cast %1 : bf16[8,16]\n"
                 "  %6 = matmul %4, %5 : bf16[4,16]\n"
                 "  %7 = exp %5 : bf16[8,16]\n"
                 "  %8 = matmul %4, %7 : bf16[4,16]\n"
                 "  return %3, %4, %6, %8, %2\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{2}<-{1}->{2} | M{3}<-{0 1}->{3} | E{4}<-{0}->{4} | "
                                         "E{5}<-{1}->{5} | M{6}<-{4 5}->{6} | E{7}<-{5}->{7} | "
                                         "M{8}<-{4 7}->{8}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_keeps_a_matmul_whose_result_is_needed_elsewhere_apart(void **state) {
    (void)state;
    /* the pre-activation %4 is needed by the sum too: the matmul takes no epilogue, %4 is
     * materialized, relu and the sum read it */
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,8]\n"
                 "  %1 = input {index = 1} : f32[8,3]\n"
                 "  %2 = matmul %0, %1 : f32[4,3]\n"
                 "  %3 = relu %2 : f32[4,3]\n"
                 "  %4 = reduce_sum %2 {axes = [0, 1], keepdim = false} : f32[]\n"
                 "  return %3, %4\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "M{2}<-{0 1}->{2} | E{3}<-{2}->{3} | R{4}<-{2}->{4}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_puts_the_chain_feeding_a_reduction_in_its_prologue(void **state) {
    (void)state;
    loom_ir_graph g; /* sum(x * x) */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8,32]\n"
                 "  %1 = mul %0, %0 : f32[8,32]\n"
                 "  %2 = reduce_sum %1 {axes = [1], keepdim = false} : f32[8]\n"
                 "  return %2\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "R{1 2}<-{0}->{2}");
    assert_int_equal(p.kernels[0].root, 2);
    assert_int_equal(p.kernels[0].kind, LOOM_IR_KERNEL_REDUCTION);
    tu_deinit_both(&g, &p);
}

static void test_fusion_puts_ops_on_a_reduced_value_in_its_epilogue(void **state) {
    (void)state;
    loom_ir_graph g; /* sqrt(mean(x)), and a second epilogue exp(mean(x)) * 2 */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8,32]\n"
                 "  %1 = reduce_mean %0 {axes = [1], keepdim = false} : f32[8]\n"
                 "  %2 = sqrt %1 : f32[8]\n"
                 "  %3 = exp %1 : f32[8]\n"
                 "  %4 = constant {value = 2} : f32[8]\n"
                 "  %5 = mul %3, %4 : f32[8]\n"
                 "  return %2, %5\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "R{1 2 3 4 5}<-{0}->{2 5}");
    assert_int_equal(p.kernels[0].root, 1);
    assert_int_equal(p.node_kernel[4], -1); /* the constant is recomputed, owned by none */
    tu_deinit_both(&g, &p);
}

static void test_fusion_does_not_fuse_a_broadcast_of_a_reduction_as_epilogue(void **state) {
    (void)state;
    loom_ir_graph g; /* x - mean(x): the subtraction loops over x's shape, not the mean's */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8,32]\n"
                 "  %1 = reduce_mean %0 {axes = [1], keepdim = true} : f32[8,1]\n"
                 "  %2 = broadcast %1 : f32[8,32]\n"
                 "  %3 = sub %0, %2 : f32[8,32]\n"
                 "  return %3\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "R{1}<-{0}->{1} | E{2 3}<-{0 1}->{3}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_materializes_a_node_used_by_two_kernels(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = exp %0 : f32[4,4]\n"
                 "  %2 = neg %1 : f32[4,4]\n"
                 "  %3 = reduce_sum %1 {axes = [0], keepdim = false} : f32[4]\n"
                 "  %4 = abs %2 : f32[4,4]\n"
                 "  return %4, %3\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* exp is read by the elementwise kernel and the reduction: computed once, stored */
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | R{3}<-{1}->{3} | E{2 4}<-{1}->{4}");
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:arena+0 %3:out1 %4:out0");
    tu_deinit_both(&g, &p);

    /* used twice by one kernel at the same index: stays fused */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = exp %0 : f32[4,4]\n"
                 "  %2 = neg %1 : f32[4,4]\n"
                 "  %3 = mul %1, %2 : f32[4,4]\n"
                 "  return %3\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1 2 3}<-{0}->{3}");
    tu_deinit_both(&g, &p);

    /* used by one kernel at two different indices (x and its transpose): materialized */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = exp %0 : f32[4,4]\n"
                 "  %2 = transpose %1 {perm = [1, 0]} : f32[4,4]\n"
                 "  %3 = add %1, %2 : f32[4,4]\n"
                 "  return %3\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{2 3}<-{1}->{3}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_writes_outputs_in_the_middle_of_a_chain(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = exp %0 : f32[4,4]\n"
                 "  %2 = neg %1 : f32[4,4]\n"
                 "  %3 = abs %2 : f32[4,4]\n"
                 "  %4 = reduce_sum %3 {axes = [1], keepdim = false} : f32[4]\n"
                 "  %5 = mul %3, %3 : f32[4,4]\n"
                 "  return %1, %5, %4\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* %1 is an output and keeps fusing: written and used in the same kernel. %3 is read by
     * the reduction too, so it ends the first kernel. */
    assert_string_equal(tu_plan_str(&p), "E{1 2 3}<-{0}->{1 3} | R{4}<-{3}->{4} | E{5}<-{3}->{5}");
    tu_deinit_both(&g, &p);

    /* an output inside a prologue is not fused (prologue nodes are never stored) */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = exp %0 : f32[4,4]\n"
                 "  %2 = neg %1 : f32[4,4]\n"
                 "  %3 = reduce_max %2 {axes = [0, 1], keepdim = false} : f32[]\n"
                 "  return %3, %2\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1 2}<-{0}->{2} | R{3}<-{2}->{3}");
    tu_deinit_both(&g, &p);

    /* an output read through a broadcast would be written many times: not fused */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4]\n"
                 "  %1 = exp %0 : f32[4]\n"
                 "  %2 = broadcast %1 : f32[3,4]\n"
                 "  %3 = neg %2 : f32[3,4]\n"
                 "  return %3, %1\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{2 3}<-{1}->{3}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_gives_a_constant_output_its_own_kernel(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[2,3]\n"
                 "  %1 = constant {value = 1.5} : f32[2,3]\n"
                 "  %2 = add %0, %1 : f32[2,3]\n"
                 "  return %2, %1, %1\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* the add recomputes the fill; the output gets a kernel that writes it once, the
     * duplicate output a copy */
    assert_string_equal(tu_plan_str(&p), "E{1}<-{}->{1} | E{1 2}<-{0}->{2}");
    assert_int_equal(p.kernels[0].root, 1);
    assert_int_equal(p.node_kernel[1], -1);
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:out1 %2:out0");
    assert_string_equal(tu_copies_str(&p), "%1->out2");
    tu_deinit_both(&g, &p);

    /* a constant read by a matmul or a reshape is materialized the same way */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[3,3]\n"
                 "  %1 = constant {value = 0.5} : f32[3,3]\n"
                 "  %2 = matmul %0, %1 : f32[3,3]\n"
                 "  %3 = add %2, %1 : f32[3,3]\n"
                 "  %4 = reshape %1 : f32[9]\n"
                 "  %5 = neg %4 : f32[9]\n"
                 "  return %3, %5\n}\n");
    tu_fuse_ok(&g, &p);
    /* the matmul reads %1 from its buffer, its epilogue too (one name, one role) */
    assert_string_equal(tu_plan_str(&p), "E{1}<-{}->{1} | M{2 3}<-{0 1}->{3} | E{5}<-{4}->{5}");
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:arena+0 %3:out0 %4:arena+0 %5:out1");
    tu_deinit_both(&g, &p);
}

static void test_fusion_fuses_a_transpose_into_its_consumer(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[3,5]\n"
                 "  %1 = input {index = 1} : f32[5,3]\n"
                 "  %2 = transpose %0 {perm = [1, 0]} : f32[5,3]\n"
                 "  %3 = add %2, %1 : f32[5,3]\n"
                 "  return %3\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{2 3}<-{0 1}->{3}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_fuses_slices_and_iota_into_their_consumer(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[8,6]\n"
                 "  %1 = slice %0 {start = [0, 0], stride = [2, 2]} : f32[4,3]\n"
                 "  %2 = slice %0 {start = [1, 1], stride = [2, 2]} : f32[4,3]\n"
                 "  %3 = maximum %1, %2 : f32[4,3]\n"
                 "  %4 = iota {axis = 1} : f32[4,3]\n"
                 "  %5 = add %3, %4 : f32[4,3]\n"
                 "  return %5\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1 2 3 4 5}<-{0}->{5}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_reads_a_pads_operand_from_a_buffer_and_recomputes_the_pad(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = neg %0 : f32[4,4]\n"
                 "  %2 = pad %1 {low = [1, 1], interior = [0, 0], value = 0} : f32[6,6]\n"
                 "  %3 = slice %2 {start = [0, 0], stride = [1, 1]} : f32[4,4]\n"
                 "  %4 = slice %2 {start = [2, 2], stride = [1, 1]} : f32[4,4]\n"
                 "  %5 = add %3, %4 : f32[4,4]\n"
                 "  return %5\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* the neg is materialized; the pad, read at two offsets, joins the add */
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{2 3 4 5}<-{1}->{5}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_lets_pads_read_through_slices_of_a_buffer(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[6,8]\n"
                 "  %1 = exp %0 : f32[6,8]\n"
                 "  %2 = slice %1 {start = [0, 0], stride = [1, 1]} : f32[3,8]\n"
                 "  %3 = slice %1 {start = [3, 1], stride = [1, 2]} : f32[3,4]\n"
                 "  %4 = pad %2 {low = [1, 0], interior = [0, 0], value = 0} : f32[5,8]\n"
                 "  %5 = pad %3 {low = [1, 0], interior = [0, 1], value = 0} : f32[5,8]\n"
                 "  %6 = add %4, %5 : f32[5,8]\n"
                 "  %7 = slice %1 {start = [0, 0], stride = [1, 1]} : f32[2,8]\n"
                 "  %8 = pad %7 {low = [0, 0], interior = [0, 0], value = 0} : f32[5,8]\n"
                 "  %9 = neg %7 : f32[2,8]\n"
                 "  return %6, %8, %9\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* %2 and %3 are read only by pads: they join them as views of %1's buffer; %7 is also
     * read by the neg, so it is materialized and the pad reads its buffer */
    assert_string_equal(tu_plan_str(&p),
                        "E{1}<-{0}->{1} | E{2 3 4 5 6}<-{1}->{6} | E{7}<-{1}->{7} | "
                        "E{8}<-{7}->{8} | E{9}<-{7}->{9}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_makes_a_concat_the_root_of_its_own_kernel(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,2]\n"
                 "  %1 = input {index = 1} : f32[4,3]\n"
                 "  %2 = neg %0 : f32[4,2]\n"
                 "  %3 = concat %2, %1, %0 {axis = 1} : f32[4,7]\n"
                 "  %4 = relu %3 : f32[4,7]\n"
                 "  return %4\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    /* the neg joins the concat, which never joins the relu: the relu reads its buffer */
    assert_string_equal(tu_plan_str(&p), "E{2 3}<-{0 1}->{3} | E{4}<-{3}->{4}");
    tu_deinit_both(&g, &p);
}

static void test_fusion_treats_a_reshape_as_a_view_between_kernels(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,6]\n"
                 "  %1 = exp %0 : f32[4,6]\n"
                 "  %2 = reshape %1 : f32[24]\n"
                 "  %3 = neg %2 : f32[24]\n"
                 "  %4 = reshape %0 : f32[6,4]\n"
                 "  %5 = abs %4 : f32[6,4]\n"
                 "  return %3, %5, %2\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{3}<-{2}->{3} | E{5}<-{4}->{5}");
    assert_int_equal(p.node_kernel[2], -1);
    /* the reshape is a view: it shares its operand's placement; as an output, a copy */
    assert_string_equal(tu_placement_str(&p, &g),
                        "%0:in0 %1:arena+0 %2:arena+0 %3:out0 %4:in0 %5:out1");
    assert_string_equal(tu_copies_str(&p), "%2->out2");
    tu_deinit_both(&g, &p);
}

static void test_fusion_plans_dead_code_graphs_without_outputs_and_empty_graphs(void **state) {
    (void)state;
    /* without dce first, dead nodes still get kernels (with nothing to write) */
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4]\n"
                 "  %1 = exp %0 : f32[4]\n"
                 "  %2 = neg %1 : f32[4]\n" /* dead */
                 "  %3 = reduce_sum %1 {axes = [0], keepdim = false} : f32[]\n"
                 "  %4 = sqrt %3 : f32[]\n" /* dead */
                 "  return %1\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{2}<-{1}->{} | R{3 4}<-{1}->{}");
    assert_string_equal(tu_placement_str(&p, &g), "%0:in0 %1:out0");
    tu_deinit_both(&g, &p);

    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4]\n"
                 "  return\n}\n");
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 0);
    assert_int_equal(p.peak_bytes, 0);
    tu_deinit_both(&g, &p);

    tu_parse(&g, "loom.graph {\n  return\n}\n");
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.n_kernels, 0);
    assert_int_equal(p.n_nodes, 0);
    tu_deinit_both(&g, &p);

    /* zero-element values are placed (0 bytes) like any other */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[0,3]\n"
                 "  %1 = exp %0 : f32[0,3]\n"
                 "  %2 = reduce_sum %1 {axes = [0], keepdim = false} : f32[3]\n"
                 "  %3 = transpose %1 {perm = [1, 0]} : f32[3,0]\n"
                 "  return %2, %3\n}\n");
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | R{2}<-{1}->{2} | E{3}<-{1}->{3}");
    assert_int_equal(p.arena_bytes, 0);
    tu_deinit_both(&g, &p);
}

/* ---- plan verifier ----------------------------------------------------------------------- */

static void expect_verify_error(const loom_ir_plan *p, const loom_ir_graph *g, const char *needle) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_plan_verify(p, g, &d), LOOM_STATUS_VERIFY_FAILED);
    if (!strstr(d.msg, needle))
        fail_msg("verify said '%s', expected it to mention '%s'", d.msg, needle);
}

static void test_plan_verify_rejects_broken_plans(void **state) {
    (void)state;
    static const char text[] = "loom.graph {\n"
                               "  %0 = input {index = 0} : f32[4]\n"
                               "  %1 = exp %0 : f32[4]\n"
                               "  %2 = reshape %1 : f32[2,2]\n"
                               "  %3 = neg %2 : f32[2,2]\n"
                               "  %4 = abs %3 : f32[2,2]\n"
                               "  %5 = reduce_sum %1 {axes = [0], keepdim = false} : f32[]\n"
                               "  return %4, %5\n}\n";
    loom_ir_graph g;
    tu_parse(&g, text);
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    assert_string_equal(tu_plan_str(&p), "E{1}<-{0}->{1} | E{3 4}<-{2}->{4} | R{5}<-{1}->{5}");

    /* kernels out of order: the reduction would read %1 before it is written */
    loom_ir_kernel k0 = p.kernels[0];
    p.kernels[0] = p.kernels[2];
    p.kernels[2] = k0;
    p.node_kernel[1] = 2;
    p.node_kernel[5] = 0;
    expect_verify_error(&p, &g, "not an input or the result of an earlier kernel");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.kernels[1].n_results = 0; /* %4 is an output: it must be written */
    expect_verify_error(&p, &g, "needed outside the kernel but is not a result");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.node_kernel[3] = 0;
    expect_verify_error(&p, &g, "node_kernel says 0");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.placement[2].offset += 64; /* the view no longer shares its operand's placement */
    expect_verify_error(&p, &g, "does not share the placement");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.kernels[1].n_args = 0; /* %3 reads %2 from nowhere */
    expect_verify_error(&p, &g, "neither computed nor an arg");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.has_placement[1] = false;
    expect_verify_error(&p, &g, "materialized but has no placement");
    tu_deinit_both(&g, &p);

    tu_parse(&g, text);
    tu_fuse_ok(&g, &p);
    p.n_copies = 0;
    p.placement[5].kind = LOOM_IR_BUFFER_ARENA; /* output 1 is filled by nothing */
    p.placement[5].offset = 0;
    expect_verify_error(&p, &g, "neither placed in its buffer nor copied");
    tu_deinit_both(&g, &p);

    /* two live arena values sharing bytes */
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,4]\n"
                 "  %1 = matmul %0, %0 : f32[4,4]\n"
                 "  %2 = matmul %0, %0 : f32[4,4]\n"
                 "  %3 = matmul %1, %2 : f32[4,4]\n"
                 "  return %3\n}\n");
    tu_fuse_ok(&g, &p);
    assert_int_equal(p.placement[2].offset, 64);
    p.placement[2].offset = 0;
    expect_verify_error(&p, &g, "are alive together");
    p.placement[2].offset = 32;
    expect_verify_error(&p, &g, "not 64-byte aligned");
    p.placement[2].offset = 128;
    expect_verify_error(&p, &g, "exceeds the 128-byte arena");
    tu_deinit_both(&g, &p);
}

static void test_plan_print_summarizes_kernels_and_buffers(void **state) {
    (void)state;
    loom_ir_graph g;
    tu_parse(&g, "loom.graph {\n"
                 "  %0 = input {index = 0} : f32[4,8] loc(\"mlp.c\":31)\n"
                 "  %1 = input {index = 1} : f32[8,2] loc(\"mlp.c\":12)\n"
                 "  %2 = matmul %0, %1 : f32[4,2] loc(\"mlp.c\":40)\n"
                 "  %3 = relu %2 : f32[4,2] loc(\"mlp.c\":41)\n"
                 "  %4 = reduce_sum %3 {axes = [0, 1], keepdim = false} : f32[] loc(\"mlp.c\":42)\n"
                 "  return %4, %4\n}\n");
    loom_ir_plan p;
    tu_fuse_ok(&g, &p);
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_plan_print(&p, &g, loom_ir_sbuf_write, &sb), LOOM_OK);
    assert_string_equal(sb.data, "plan: 2 kernels, 1 copy, arena 64 bytes, peak 72 bytes\n"
                                 "memory: planned peak 72 bytes (0.00 MiB) = arena 64 + outputs 8\n"
                                 "  most alive at kernel 0 (matmul, root matmul at mlp.c:40): 40 "
                                 "bytes in 3 values:\n"
                                 "              32  %2 matmul f32[4,2] mlp.c:40\n"
                                 "               4  %4 reduce_sum f32[] (output 0) mlp.c:42\n"
                                 "               4  %4 reduce_sum f32[] (output 1) mlp.c:42\n"
                                 "kernel 0: matmul, root %2 (matmul)\n"
                                 "    %2 = matmul %0, %1 : f32[4,2]  mlp.c:40\n"
                                 "    args: %0, %1\n"
                                 "    results: %2\n"
                                 "    cost: 128 flops, 224 bytes moved\n"
                                 "kernel 1: reduction, root %4 (reduce_sum)\n"
                                 "    %3 = relu %2 : f32[4,2]  mlp.c:41\n"
                                 "    %4 = reduce_sum %3 : f32[]  mlp.c:42\n"
                                 "    args: %2\n"
                                 "    results: %4\n"
                                 "    cost: 16 flops, 36 bytes moved\n"
                                 "placements:\n"
                                 "    %0 input : f32[4,8] -> input 0 (128 bytes)\n"
                                 "    %1 input : f32[8,2] -> input 1 (64 bytes)\n"
                                 "    %2 matmul : f32[4,2] -> arena +0 (32 bytes)\n"
                                 "    %4 reduce_sum : f32[] -> output 0 (4 bytes)\n"
                                 "copies after the kernels:\n"
                                 "    %4 -> output 1\n"
                                 "arena: 64 bytes\n"
                                 "peak: 72 bytes\n"
                                 "total: 144 flops, 260 bytes moved\n");
    loom_ir_sbuf_deinit(&sb);
    tu_deinit_both(&g, &p);
}

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

/* ---- out of memory ------------------------------------------------------------------------- */

static void test_build_plan_fails_cleanly_when_memory_runs_out(void **state) {
    (void)state;
    static const char text[] =
        "loom.graph {\n"
        "  %x = input {index = 0} : f32[4,8]\n"
        "  %w = input {index = 1} : f32[8,16]\n"
        "  %b = input {index = 2} : f32[16]\n"
        "  %w2 = input {index = 3} : f32[16,16]\n"
        "  %m = matmul %x, %w : f32[4,16]\n"
        "  %bb = broadcast %b : f32[4,16]\n"
        "  %h = add %m, %bb : f32[4,16]\n"
        "  %m2 = matmul %x, %w : f32[4,16]\n" /* cse */
        "  %h2 = add %m2, %bb : f32[4,16]\n"
        "  %r = relu %h2 : f32[4,16]\n"
        "  %one = constant {value = 1} : f32[4,16]\n"
        "  %r1 = mul %r, %one : f32[4,16]\n" /* fold */
        "  %dead = exp %h : f32[4,16]\n"     /* dce */
        "  %o = matmul %r1, %w2 : f32[4,16]\n"
        "  %s = reduce_sum %o {axes = [1], keepdim = false} : f32[4]\n"
        "  %q = sqrt %s : f32[4]\n"
        "  %v = reshape %o : f32[64]\n"
        "  %u = input {index = 4} : f32[4,16]\n"
        "  %p = input {index = 5} : f32[2]\n"
        "  %p2 = input {index = 6} : f32[2]\n"
        "  return %q, %v, %h {alias = 4}, %x, %u, %p2 {alias = 5}, %p {alias = 6}\n"
        "}\n";
    int failures = 0;
    char want[4096] = "";
    for (int64_t k = 1;; k++) {
        test_alloc ta = {0};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &a);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        assert_int_equal(loom_ir_graph_parse(&g, text, strlen(text), &d), LOOM_OK);
        loom_ir_plan p;
        loom_ir_plan_init(&p, &a);
        ta.fail_at = ta.n_allocs + k;
        loom_status st = loom_pass_build_plan(&g, NULL, &p, &d);
        ta.fail_at = 0;
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            loom_ir_sbuf sb;
            loom_ir_sbuf_init(&sb, &sys);
            loom_ir_plan_print(&p, &g, loom_ir_sbuf_write, &sb);
            snprintf(want, sizeof want, "%s", sb.data);
            loom_ir_sbuf_deinit(&sb);
            tu_deinit_both(&g, &p);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
        /* the graph is still valid after a failure */
        loom_ir_diag v;
        loom_ir_diag_init(&v);
        assert_int_equal(loom_ir_graph_verify(&g, &v), LOOM_OK);
        tu_deinit_both(&g, &p);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
        failures++;
    }
    assert_true(failures >= 10);
    /* mm+bias+relu (writing %h and %r), mm, sum+sqrt, and one cast breaking the exchange of
     * inputs 5 and 6; %u's copy of input 4 is ordered before %h's copy into input 4 */
    if (!strstr(want, "plan: 4 kernels") ||
        !strstr(want, "    %12 -> output 4\n    %13 -> output 6\n    %6 -> output 2\n"
                      "    %15 -> output 5\n"))
        fail_msg("unexpected plan:\n%s", want);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fusion_makes_a_64_op_elementwise_chain_one_kernel),
        cmocka_unit_test(test_fusion_gives_matmul_bias_relu_one_kernel_per_layer),
        cmocka_unit_test(test_fusion_joins_casts_and_transposes_into_a_16_bit_matmul),
        cmocka_unit_test(test_fusion_keeps_a_matmul_whose_result_is_needed_elsewhere_apart),
        cmocka_unit_test(test_fusion_puts_the_chain_feeding_a_reduction_in_its_prologue),
        cmocka_unit_test(test_fusion_puts_ops_on_a_reduced_value_in_its_epilogue),
        cmocka_unit_test(test_fusion_does_not_fuse_a_broadcast_of_a_reduction_as_epilogue),
        cmocka_unit_test(test_fusion_materializes_a_node_used_by_two_kernels),
        cmocka_unit_test(test_fusion_writes_outputs_in_the_middle_of_a_chain),
        cmocka_unit_test(test_fusion_gives_a_constant_output_its_own_kernel),
        cmocka_unit_test(test_fusion_fuses_a_transpose_into_its_consumer),
        cmocka_unit_test(test_fusion_treats_a_reshape_as_a_view_between_kernels),
        cmocka_unit_test(test_fusion_fuses_slices_and_iota_into_their_consumer),
        cmocka_unit_test(test_fusion_reads_a_pads_operand_from_a_buffer_and_recomputes_the_pad),
        cmocka_unit_test(test_fusion_lets_pads_read_through_slices_of_a_buffer),
        cmocka_unit_test(test_fusion_makes_a_concat_the_root_of_its_own_kernel),
        cmocka_unit_test(test_fusion_plans_dead_code_graphs_without_outputs_and_empty_graphs),
        cmocka_unit_test(test_plan_verify_rejects_broken_plans),
        cmocka_unit_test(test_plan_print_summarizes_kernels_and_buffers),
        cmocka_unit_test(test_pipeline_keeps_random_graphs_bit_exact_and_plans_them_validly),
        cmocka_unit_test(test_build_plan_fails_cleanly_when_memory_runs_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
