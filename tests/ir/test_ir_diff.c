/* Unit tests of the structural graph diff (ir/diff.c): node matching across shifted ids,
 * each kind of difference with its exact text, ordering, truncation, the sketch distance,
 * allocation failures, and a generated graph of 10k nodes. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "test_util.h"

static loom_allocator sys;

/* Parses text into g (initialized here), failing the test with the parser's message. */
static void parse(loom_ir_graph *g, const char *text) {
    loom_ir_graph_init(g, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_ir_graph_parse(g, text, strlen(text), &d);
    if (st != LOOM_OK)
        fail_msg("parse: %s at %d:%d: %s", loom_status_name(st), (int)d.line, (int)d.col, d.msg);
}

/* The diff of two texts, computed into df (initialized here); fails the test on error. */
static void diff_texts(loom_ir_diff *df, loom_ir_graph *a, loom_ir_graph *b, const char *ta,
                       const char *tb) {
    parse(a, ta);
    parse(b, tb);
    loom_ir_diff_init(df, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_ir_diff_compute(df, a, b, &d);
    if (st != LOOM_OK)
        fail_msg("diff: %s: %s", loom_status_name(st), d.msg);
}

static const char *item_text(const loom_ir_diff *df, int32_t i) {
    static char buf[512];
    return loom_ir_diff_format_item(df, i, buf, sizeof buf);
}

static void release(loom_ir_diff *df, loom_ir_graph *a, loom_ir_graph *b) {
    loom_ir_diff_deinit(df);
    loom_ir_graph_deinit(a);
    loom_ir_graph_deinit(b);
}

/* y = relu(x @ w + broadcast(b)) at train.c, batch `batch`; the forward of a linear layer. */
#define LINEAR(batch)                                                                              \
    "loom.graph {\n"                                                                               \
    "  %x = input {index = 0} : f32[" batch ",784] loc(\"/src/train.c\":80)\n"                     \
    "  %w = input {index = 1} : f32[784,512] loc(\"/src/train.c\":70)\n"                           \
    "  %b = input {index = 2} : f32[512] loc(\"/src/train.c\":71)\n"                               \
    "  %m = matmul %x, %w : f32[" batch ",512] loc(\"/src/train.c\":88)\n"                         \
    "  %bb = broadcast %b : f32[" batch ",512] loc(\"/src/train.c\":88)\n"                         \
    "  %s = add %m, %bb : f32[" batch ",512] loc(\"/src/train.c\":88)\n"                           \
    "  %r = relu %s : f32[" batch ",512] loc(\"/src/train.c\":89)\n"                               \
    "  return %r\n"                                                                                \
    "}\n"

static void test_identical_graphs_have_no_differences(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, LINEAR("64"), LINEAR("64"));
    assert_int_equal(df.n_items, 0);
    for (int32_t i = 0; i < a.n_nodes; i++)
        assert_int_equal(df.a_to_b[i], i);
    assert_int_equal(loom_ir_graph_distance(&a, &b), 0);
    release(&df, &a, &b);
}

/* The same graph with its nodes in another topological order: every id differs, nothing
 * else does. */
static void test_permuted_node_ids_are_not_differences(void **state) {
    (void)state;
    const char *ta = "loom.graph {\n"
                     "  %0 = input {index = 0} : f32[4]\n"
                     "  %1 = input {index = 1} : f32[4]\n"
                     "  %2 = exp %0 : f32[4]\n"
                     "  %3 = log %1 : f32[4]\n"
                     "  %4 = constant {value = 2} : f32[]\n"
                     "  %5 = broadcast %4 : f32[4]\n"
                     "  %6 = sub %2, %3 : f32[4]\n"
                     "  %7 = mul %6, %5 : f32[4]\n"
                     "  return %7, %2\n"
                     "}\n";
    const char *tb = "loom.graph {\n"
                     "  %c = constant {value = 2} : f32[]\n"
                     "  %q = input {index = 1} : f32[4]\n"
                     "  %l = log %q : f32[4]\n"
                     "  %cb = broadcast %c : f32[4]\n"
                     "  %p = input {index = 0} : f32[4]\n"
                     "  %e = exp %p : f32[4]\n"
                     "  %d = sub %e, %l : f32[4]\n"
                     "  %m = mul %d, %cb : f32[4]\n"
                     "  return %m, %e\n"
                     "}\n";
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, ta, tb);
    assert_int_equal(df.n_items, 0);
    /* exp is %2 in a and %5 in b; sub %6 and %6; the constant %4 and %0 */
    assert_int_equal(df.a_to_b[2], 5);
    assert_int_equal(df.a_to_b[6], 6);
    assert_int_equal(df.a_to_b[4], 0);
    assert_int_equal(df.b_to_a[2], 3);
    assert_false(loom_ir_graph_equal(&a, &b)); /* ids differ, so equality by id says no */
    assert_int_equal(loom_ir_graph_distance(&a, &b), 0);
    release(&df, &a, &b);
}

static void test_changed_input_shape_names_the_input_then_what_follows(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, LINEAR("64"), LINEAR("63"));
    assert_int_equal(df.n_items, 5);
    assert_string_equal(item_text(&df, 0),
                        "%0 input 0 at train.c:80 has f32[63,784] (was f32[64,784])");
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_TYPE);
    assert_false(df.items[0].derived);
    /* broadcast's shape is its own target: a cause, not a consequence */
    assert_string_equal(item_text(&df, 1),
                        "%4 broadcast at train.c:88 has f32[63,512] (was f32[64,512])");
    assert_false(df.items[1].derived);
    assert_string_equal(item_text(&df, 2), "%3 matmul at train.c:88 has f32[63,512] (was "
                                           "f32[64,512], following the changes above)");
    assert_true(df.items[2].derived);
    assert_int_equal(df.items[2].a, 3);
    assert_int_equal(df.items[2].b, 3);
    assert_string_equal(item_text(&df, 3), "%5 add at train.c:88 has f32[63,512] (was "
                                           "f32[64,512], following the changes above)");
    assert_string_equal(item_text(&df, 4), "%6 relu at train.c:89 has f32[63,512] (was "
                                           "f32[64,512], following the changes above)");
    /* five nodes changed type: each counts as it was and as it is */
    assert_int_equal(loom_ir_graph_distance(&a, &b), 10);
    release(&df, &a, &b);
}

/* The explainer's call: the first cause, one line, through loom_ir_graph_diff. */
static void test_graph_diff_writes_lines_and_counts_them(void **state) {
    (void)state;
    loom_ir_graph a, b;
    parse(&a, LINEAR("64"));
    parse(&b, LINEAR("63"));
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t n = -1;
    assert_int_equal(loom_ir_graph_diff(&a, &b, 1, loom_ir_sbuf_write, &sb, &n, &d), LOOM_OK);
    assert_int_equal(n, 5);
    assert_string_equal(sb.data, "%0 input 0 at train.c:80 has f32[63,784] (was f32[64,784])\n"
                                 "... and 4 more differences\n");
    sb.len = 0;
    assert_int_equal(loom_ir_graph_diff(&b, &b, -1, loom_ir_sbuf_write, &sb, &n, &d), LOOM_OK);
    assert_int_equal(n, 0);
    assert_int_equal(sb.len, 0);
    assert_int_equal(loom_ir_graph_diff(&a, &b, 0, loom_ir_sbuf_write, &sb, &n, &d), LOOM_OK);
    assert_string_equal(sb.data, "... and 5 more differences\n");
    assert_int_equal(loom_ir_graph_diff(&a, NULL, 0, loom_ir_sbuf_write, &sb, &n, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "diff: NULL argument");
    loom_ir_sbuf_deinit(&sb);
    loom_ir_graph_deinit(&a);
    loom_ir_graph_deinit(&b);
}

#define CHAIN_HEAD                                                                                 \
    "loom.graph {\n"                                                                               \
    "  %x = input {index = 0} : f32[4] loc(\"train.c\":1)\n"                                       \
    "  %e = exp %x : f32[4] loc(\"train.c\":2)\n"
#define CHAIN_TAIL                                                                                 \
    "  %t = tanh %l : f32[4] loc(\"train.c\":4)\n"                                                 \
    "  return %t\n"                                                                                \
    "}\n"
static const char chain[] = CHAIN_HEAD "  %l = log %e : f32[4] loc(\"train.c\":3)\n" CHAIN_TAIL;
static const char chain_with_neg[] =
    CHAIN_HEAD "  %n = neg %e : f32[4] loc(\"train.c\":5)\n"
               "  %l = log %n : f32[4] loc(\"train.c\":3)\n" CHAIN_TAIL;

/* Every node after the insertion has a new id; only the inserted node is reported. */
static void test_an_inserted_node_is_the_only_difference(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, chain, chain_with_neg);
    assert_int_equal(df.n_items, 1);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_ADDED);
    assert_string_equal(item_text(&df, 0), "%2 neg at train.c:5 is new: f32[4]");
    assert_int_equal(df.a_to_b[2], 3); /* log */
    assert_int_equal(df.a_to_b[3], 4); /* tanh */
    assert_int_equal(loom_ir_graph_distance(&a, &b), 1);
    loom_ir_diff_deinit(&df);

    /* and the other way round */
    loom_ir_diff_init(&df, &sys);
    assert_int_equal(loom_ir_diff_compute(&df, &b, &a, NULL), LOOM_OK);
    assert_int_equal(df.n_items, 1);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_REMOVED);
    assert_string_equal(item_text(&df, 0),
                        "%2 neg at train.c:5 was removed: f32[4] (an id of the first graph)");
    release(&df, &a, &b);
}

/* A learning rate baked into the graph as a constant: the value differs, nothing else. The
 * values print in the fewest digits that read back exactly (0.0099, not %.17g's
 * 0.0099000000000000008). */
static void test_a_changed_constant_is_named_as_such(void **state) {
    (void)state;
#define SGD(lr)                                                                                    \
    "loom.graph {\n"                                                                               \
    "  %w = input {index = 0} : f32[8] loc(\"train.c\":50)\n"                                      \
    "  %g = input {index = 1} : f32[8] loc(\"train.c\":51)\n"                                      \
    "  %lr = constant {value = " lr "} : f32[] loc(\"train.c\":61)\n"                              \
    "  %lrb = broadcast %lr : f32[8] loc(\"train.c\":61)\n"                                        \
    "  %u = mul %g, %lrb : f32[8] loc(\"train.c\":62)\n"                                           \
    "  %w2 = sub %w, %u : f32[8] loc(\"train.c\":62)\n"                                            \
    "  return %w2 {alias = 0}\n"                                                                   \
    "}\n"
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, SGD("0.01"), SGD("0.0099"));
    assert_int_equal(df.n_items, 1);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_CONSTANT);
    assert_int_equal(df.items[0].a, 2);
    assert_int_equal(df.items[0].b, 2);
    assert_string_equal(item_text(&df, 0), "%2 constant at train.c:61 is a constant that changes "
                                           "between graphs: value = 0.0099 (was value = 0.01)");
    assert_int_equal(loom_ir_graph_distance(&a, &b), 2);
    release(&df, &a, &b);
#undef SGD
}

/* Constants nothing uses cannot be paired through users; leftovers of one type pair in
 * order, so the change still reads as a changed constant (and one of another type as new). */
static void test_unused_constants_pair_in_order_of_their_type(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b,
               "loom.graph {\n"
               "  %0 = constant {value = 1.5} : f32[] loc(\"c.c\":1)\n"
               "  %1 = constant {value = 2} : f32[] loc(\"c.c\":2)\n"
               "  %2 = input {index = 0} : f32[4]\n"
               "  return %2\n"
               "}\n",
               "loom.graph {\n"
               "  %0 = constant {value = 1} : i32[] loc(\"c.c\":3)\n"
               "  %1 = constant {value = 2} : f32[] loc(\"c.c\":2)\n"
               "  %2 = constant {value = 7} : f32[] loc(\"c.c\":1)\n"
               "  %3 = input {index = 0} : f32[4]\n"
               "  return %3\n"
               "}\n");
    assert_int_equal(df.n_items, 2);
    assert_string_equal(item_text(&df, 0), "%0 constant at c.c:3 is new: i32[]");
    assert_string_equal(item_text(&df, 1), "%2 constant at c.c:1 is a constant that changes "
                                           "between graphs: value = 7 (was value = 1.5)");
    release(&df, &a, &b);
}

static void test_changed_attributes_are_shown_as_the_text_format_spells_them(void **state) {
    (void)state;
    const char *ta = "loom.graph {\n"
                     "  %0 = input {index = 0} : f32[4,4]\n"
                     "  %1 = reduce_sum %0 {axes = [0], keepdim = false} : f32[4] loc(\"m.c\":7)\n"
                     "  %2 = transpose %0 {perm = [1, 0]} : f32[4,4] loc(\"m.c\":8)\n"
                     "  return %1, %2\n"
                     "}\n";
    const char *tb = "loom.graph {\n"
                     "  %0 = input {index = 0} : f32[4,4]\n"
                     "  %1 = reduce_sum %0 {axes = [1], keepdim = false} : f32[4] loc(\"m.c\":7)\n"
                     "  %2 = transpose %0 {perm = [0, 1], autocast = bf16} : f32[4,4] "
                     "loc(\"m.c\":8)\n"
                     "  return %1, %2\n"
                     "}\n";
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, ta, tb);
    assert_int_equal(df.n_items, 2);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_ATTRS);
    assert_string_equal(item_text(&df, 0), "%1 reduce_sum at m.c:7 has {axes = [1], keepdim = "
                                           "false} (was {axes = [0], keepdim = false})");
    assert_string_equal(item_text(&df, 1), "%2 transpose at m.c:8 has {perm = [0, 1], autocast "
                                           "= bf16} (was {perm = [1, 0]})");
    release(&df, &a, &b);
}

/* An attribute change that changes the type too: the attribute is the cause, the node's and
 * its user's types follow from it. */
static void test_a_type_change_caused_by_attributes_is_derived(void **state) {
    (void)state;
    const char *ta = "loom.graph {\n"
                     "  %0 = input {index = 0} : f32[2,3]\n"
                     "  %1 = reduce_max %0 {axes = [0], keepdim = false} : f32[3] loc(\"m.c\":7)\n"
                     "  %2 = exp %1 : f32[3] loc(\"m.c\":8)\n"
                     "  return %2\n"
                     "}\n";
    const char *tb = "loom.graph {\n"
                     "  %0 = input {index = 0} : f32[2,3]\n"
                     "  %1 = reduce_max %0 {axes = [1], keepdim = false} : f32[2] loc(\"m.c\":7)\n"
                     "  %2 = exp %1 : f32[2] loc(\"m.c\":8)\n"
                     "  return %2\n"
                     "}\n";
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, ta, tb);
    assert_int_equal(df.n_items, 3);
    assert_string_equal(item_text(&df, 0), "%1 reduce_max at m.c:7 has {axes = [1], keepdim = "
                                           "false} (was {axes = [0], keepdim = false})");
    assert_string_equal(item_text(&df, 1), "%1 reduce_max at m.c:7 has f32[2] (was f32[3], "
                                           "following the changes above)");
    assert_string_equal(item_text(&df, 2),
                        "%2 exp at m.c:8 has f32[2] (was f32[3], following the changes above)");
    release(&df, &a, &b);
}

#define TWO_OUT_HEAD                                                                               \
    "loom.graph {\n"                                                                               \
    "  %0 = input {index = 0} : f32[4] loc(\"o.c\":1)\n"                                           \
    "  %1 = input {index = 1} : f32[4] loc(\"o.c\":2)\n"                                           \
    "  %2 = exp %0 : f32[4] loc(\"o.c\":3)\n"                                                      \
    "  %3 = sub %0, %1 : f32[4] loc(\"o.c\":4)\n"

static void test_different_outputs_are_listed_by_index(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    /* one more output */
    diff_texts(&df, &a, &b, TWO_OUT_HEAD "  return %3\n}\n", TWO_OUT_HEAD "  return %3, %2\n}\n");
    assert_int_equal(df.n_items, 1);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_OUTPUT);
    assert_int_equal(df.items[0].output, 1);
    assert_string_equal(item_text(&df, 0), "output 1 is new: %2 exp at o.c:3");
    release(&df, &a, &b);

    /* one fewer */
    diff_texts(&df, &a, &b, TWO_OUT_HEAD "  return %3, %2\n}\n", TWO_OUT_HEAD "  return %3\n}\n");
    assert_int_equal(df.n_items, 1);
    assert_string_equal(item_text(&df, 0), "output 1 was removed: %2 exp at o.c:3");
    release(&df, &a, &b);

    /* another node, another alias */
    diff_texts(&df, &a, &b, TWO_OUT_HEAD "  return %3, %2 {alias = 0}\n}\n",
               TWO_OUT_HEAD "  return %2, %3 {alias = 1}\n}\n");
    assert_int_equal(df.n_items, 2);
    assert_string_equal(item_text(&df, 0), "output 0 is %2 exp at o.c:3 (was %3 sub at o.c:4)");
    assert_string_equal(item_text(&df, 1), "output 1 is %3 sub at o.c:4 (was %2 exp at o.c:3)");
    release(&df, &a, &b);

    diff_texts(&df, &a, &b, TWO_OUT_HEAD "  return %3, %2 {alias = 0}\n}\n",
               TWO_OUT_HEAD "  return %3, %2\n}\n");
    assert_int_equal(df.n_items, 1);
    assert_string_equal(item_text(&df, 0),
                        "output 1 (%2 exp at o.c:3) has no alias (was alias = 0)");
    release(&df, &a, &b);
}

static void test_swapped_operands_are_reported_in_the_second_graphs_ids(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b,
               "loom.graph {\n"
               "  %0 = input {index = 0} : f32[4]\n"
               "  %1 = input {index = 1} : f32[4]\n"
               "  %2 = sub %0, %1 : f32[4] loc(\"s.c\":9)\n"
               "  return %2\n"
               "}\n",
               "loom.graph {\n"
               "  %0 = input {index = 0} : f32[4]\n"
               "  %1 = input {index = 1} : f32[4]\n"
               "  %2 = sub %1, %0 : f32[4] loc(\"s.c\":9)\n"
               "  return %2\n"
               "}\n");
    assert_int_equal(df.n_items, 1);
    assert_int_equal(df.items[0].kind, LOOM_IR_DIFF_OPERANDS);
    assert_string_equal(item_text(&df, 0), "%2 sub at s.c:9 takes %1, %0 (was %0, %1)");
    release(&df, &a, &b);
}

static void test_format_item_cuts_to_the_buffer_and_ignores_bad_indices(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_diff df;
    diff_texts(&df, &a, &b, chain, chain_with_neg);
    char buf[8];
    assert_string_equal(loom_ir_diff_format_item(&df, 0, buf, sizeof buf), "%2 neg ");
    assert_string_equal(loom_ir_diff_format_item(&df, 1, buf, sizeof buf), "");
    assert_string_equal(loom_ir_diff_format_item(&df, -1, buf, sizeof buf), "");
    /* a second compute on the same diff replaces the first */
    assert_int_equal(loom_ir_diff_compute(&df, &a, &a, NULL), LOOM_OK);
    assert_int_equal(df.n_items, 0);
    release(&df, &a, &b);
}

/* Every allocation the diff makes can fail: the error is OUT_OF_MEMORY, nothing leaks, and
 * a later compute on the same diff works. */
static void test_diff_survives_every_allocation_failure(void **state) {
    (void)state;
    loom_ir_graph a, b;
    parse(&a, LINEAR("64"));
    parse(&b, LINEAR("63"));
    test_alloc ta = {0};
    loom_allocator alloc = test_alloc_make(&ta);
    int64_t failures = 0;
    for (int64_t k = 1;; k++) {
        loom_ir_diff df;
        loom_ir_diff_init(&df, &alloc);
        ta.fail_at = ta.n_allocs + k;
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_status st = loom_ir_diff_compute(&df, &a, &b, &d);
        ta.fail_at = 0;
        if (st == LOOM_OK) {
            assert_int_equal(df.n_items, 5);
            loom_ir_diff_deinit(&df);
            assert_int_equal(ta.live_blocks, 0);
            break;
        }
        failures++;
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_string_equal(d.msg, "diff: out of memory comparing graphs of 7 and 7 nodes");
        assert_int_equal(df.n_items, 0);
        assert_int_equal(loom_ir_diff_compute(&df, &a, &b, NULL), LOOM_OK);
        assert_int_equal(df.n_items, 5);
        loom_ir_diff_deinit(&df);
        assert_int_equal(ta.live_blocks, 0);
    }
    assert_true(failures >= 4); /* the two maps, the flags, the indexes, the items */
    loom_ir_graph_deinit(&a);
    loom_ir_graph_deinit(&b);
}

/* A generated chain of ~10k nodes (each step adds a fresh input to the running value and
 * applies an op); the second graph inserts one node in the middle, so every later id shifts.
 * The diff finds just that node; no timing is asserted, but a quadratic matcher would take
 * seconds here. */
static void build_big(loom_ir_graph *g, int32_t steps, int32_t insert_at) {
    loom_ir_graph_init(g, &sys);
    const int64_t shape[] = {16};
    int32_t v = tu_input(g, LOOM_DTYPE_F32, 1, shape);
    static const loom_ir_op ops[] = {LOOM_IR_OP_TANH, LOOM_IR_OP_EXP, LOOM_IR_OP_RELU,
                                     LOOM_IR_OP_NEG};
    for (int32_t i = 0; i < steps; i++) {
        int32_t x = tu_input(g, LOOM_DTYPE_F32, 1, shape);
        v = tu_add(g, LOOM_IR_OP_ADD, 2, (int32_t[]){v, x}, LOOM_DTYPE_F32, 0, NULL,
                   (loom_ir_attrs){0});
        v = tu_add_desc(g, (loom_ir_node_desc){.op = ops[i % 4],
                                               .n_inputs = 1,
                                               .inputs = (int32_t[]){v},
                                               .loc = {"big.c", i + 1}});
        if (i == insert_at)
            v = tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_SQRT,
                                                   .n_inputs = 1,
                                                   .inputs = (int32_t[]){v},
                                                   .loc = {"big.c", 99999}});
    }
    tu_output(g, v, -1);
    tu_verify(g);
}

static void test_a_generated_graph_of_10k_nodes_diffs_to_its_one_insertion(void **state) {
    (void)state;
    loom_ir_graph a, b;
    build_big(&a, 3400, -1);
    build_big(&b, 3400, 1700);
    assert_int_equal(a.n_nodes, 1 + 3 * 3400);
    loom_ir_diff df;
    loom_ir_diff_init(&df, &sys);
    assert_int_equal(loom_ir_diff_compute(&df, &a, &b, NULL), LOOM_OK);
    assert_int_equal(df.n_items, 1);
    assert_string_equal(item_text(&df, 0), "%5104 sqrt at big.c:99999 is new: f32[16]");
    assert_int_equal(df.a_to_b[a.n_nodes - 1], b.n_nodes - 1);
    assert_int_equal(loom_ir_graph_distance(&a, &b), 1);
    /* the graph against itself */
    assert_int_equal(loom_ir_diff_compute(&df, &b, &b, NULL), LOOM_OK);
    assert_int_equal(df.n_items, 0);
    release(&df, &a, &b);
}

static void test_sketches_pick_the_nearest_graph(void **state) {
    (void)state;
    loom_ir_graph g64, g63, cur;
    parse(&g64, LINEAR("64"));
    parse(&g63, LINEAR("63"));
    parse(&cur, LINEAR("63"));
    loom_ir_sketch s64, s63, sc;
    loom_ir_graph_sketch(&g64, &s64);
    loom_ir_graph_sketch(&g63, &s63);
    loom_ir_graph_sketch(&cur, &sc);
    assert_int_equal(loom_ir_sketch_distance(&sc, &s63), 0);
    assert_int_equal(loom_ir_sketch_distance(&sc, &s64), 10);
    assert_int_equal(loom_ir_sketch_distance(&s64, &sc), 10);
    assert_int_equal(s64.n_outputs, 1);
    uint32_t total = 0;
    for (int i = 0; i < LOOM_IR_SKETCH_BUCKETS; i++)
        total += s64.count[i];
    assert_int_equal(total, 7);
    loom_ir_graph_deinit(&g64);
    loom_ir_graph_deinit(&g63);
    loom_ir_graph_deinit(&cur);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_graphs_have_no_differences),
        cmocka_unit_test(test_permuted_node_ids_are_not_differences),
        cmocka_unit_test(test_changed_input_shape_names_the_input_then_what_follows),
        cmocka_unit_test(test_graph_diff_writes_lines_and_counts_them),
        cmocka_unit_test(test_an_inserted_node_is_the_only_difference),
        cmocka_unit_test(test_a_changed_constant_is_named_as_such),
        cmocka_unit_test(test_unused_constants_pair_in_order_of_their_type),
        cmocka_unit_test(test_changed_attributes_are_shown_as_the_text_format_spells_them),
        cmocka_unit_test(test_a_type_change_caused_by_attributes_is_derived),
        cmocka_unit_test(test_different_outputs_are_listed_by_index),
        cmocka_unit_test(test_swapped_operands_are_reported_in_the_second_graphs_ids),
        cmocka_unit_test(test_format_item_cuts_to_the_buffer_and_ignores_bad_indices),
        cmocka_unit_test(test_diff_survives_every_allocation_failure),
        cmocka_unit_test(test_a_generated_graph_of_10k_nodes_diffs_to_its_one_insertion),
        cmocka_unit_test(test_sketches_pick_the_nearest_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
