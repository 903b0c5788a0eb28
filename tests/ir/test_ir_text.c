/* Tests of the IR text format (print/parse round trips, errors with positions, out of
 * memory), the structural hash as seen through text, and DOT export. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- helpers ----------------------------------------------------------------------------- */

static char *print_to_string(const loom_ir_graph *g) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_graph_print(g, loom_ir_sbuf_write, &sb), LOOM_OK);
    assert_false(sb.oom);
    char *s = strdup(sb.data ? sb.data : "");
    loom_ir_sbuf_deinit(&sb);
    return s;
}

static char *dot_to_string(const loom_ir_graph *g) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_graph_dot(g, loom_ir_sbuf_write, &sb), LOOM_OK);
    char *s = strdup(sb.data ? sb.data : "");
    loom_ir_sbuf_deinit(&sb);
    return s;
}

/* Parses text from an exactly-sized heap copy without a terminator, so a sanitizer build
 * catches any read past len. */
static loom_status parse_text(loom_ir_graph *g, const char *text, loom_ir_diag *d) {
    size_t len = strlen(text);
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    loom_ir_diag_init(d);
    loom_status st = loom_ir_graph_parse(g, copy, len, d);
    free(copy);
    return st;
}

static void parse_ok(loom_ir_graph *g, const char *text) {
    loom_ir_diag d;
    loom_status st = parse_text(g, text, &d);
    if (st != LOOM_OK)
        print_error("parse failed at %d:%d: %s\n", (int)d.line, (int)d.col, d.msg);
    assert_int_equal(st, LOOM_OK);
}

static int32_t add(loom_ir_graph *g, loom_ir_op op, int32_t n_inputs, const int32_t *inputs,
                   loom_dtype dt, int32_t rank, const int64_t *shape, loom_ir_attrs attrs,
                   const char *file, int32_t line) {
    loom_ir_node_desc desc = {.op = op, .n_inputs = n_inputs, .inputs = inputs, .dtype = dt,
                              .rank = rank, .shape = shape, .attrs = attrs,
                              .loc = {file, line}};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id = -1;
    loom_status st = loom_ir_graph_add(g, &desc, &id, &d);
    if (st != LOOM_OK)
        print_error("add %s: %s\n", loom_ir_op_name(op), d.msg);
    assert_int_equal(st, LOOM_OK);
    return id;
}

static int32_t input(loom_ir_graph *g, int64_t index, loom_dtype dt, int32_t rank,
                     const int64_t *shape) {
    return add(g, LOOM_IR_OP_INPUT, 0, NULL, dt, rank, shape, (loom_ir_attrs){.index = index},
               "model.c", (int32_t)(10 + index));
}

static bool same_type(const loom_ir_node *a, const loom_ir_node *b) {
    return a->dtype == b->dtype && a->rank == b->rank &&
           memcmp(a->shape, b->shape, (size_t)a->rank * sizeof a->shape[0]) == 0;
}

/* A small valid graph exercising `op`: its operands are graph inputs of a dtype the op
 * accepts; the op's result is an output, aliased to input 0 when their types agree. */
static void build_op_graph(loom_ir_graph *g, loom_ir_op op) {
    const loom_ir_op_info *info = &loom_ir_op_table[op];
    loom_dtype dt = info->dtypes == LOOM_IR_DT_FLOAT ? LOOM_DTYPE_F32
                    : info->dtypes == LOOM_IR_DT_NUM ? LOOM_DTYPE_I64
                                                     : LOOM_DTYPE_BF16;
    const int64_t s23[] = {2, 3}, s32[] = {3, 2}, s34[] = {3, 4}, s423[] = {4, 2, 3};
    loom_ir_attrs none = {0};
    loom_ir_graph_reset(g);
    int32_t x = input(g, 0, dt, 2, s23);
    int32_t r = -1;
    switch (info->kind) {
    case LOOM_IR_KIND_SOURCE:
        if (info->attrs == LOOM_IR_ATTRS_INDEX)
            r = x;
        else
            r = add(g, op, 0, NULL, dt, 2, s23, (loom_ir_attrs){.value = -0.1}, NULL, 0);
        break;
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
        r = add(g, op, 1, &x, dt, 0, NULL, none, "model.c", 20);
        break;
    case LOOM_IR_KIND_CAST:
        r = add(g, op, 1, &x, LOOM_DTYPE_F16, 0, NULL, none, "model.c", 20);
        break;
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE: {
        int32_t ins[2] = {x, input(g, 1, dt, 2, s23)};
        r = add(g, op, 2, ins, dt, 0, NULL, none, "layers/attn.c", 21);
        break;
    }
    case LOOM_IR_KIND_SELECT: {
        int32_t ins[3] = {input(g, 1, LOOM_DTYPE_BOOL, 2, s23), x, input(g, 2, dt, 2, s23)};
        r = add(g, op, 3, ins, dt, 0, NULL, none, "model.c", 22);
        break;
    }
    case LOOM_IR_KIND_BROADCAST:
        r = add(g, op, 1, &x, dt, 3, s423, none, "model.c", 23);
        break;
    case LOOM_IR_KIND_RESHAPE:
        r = add(g, op, 1, &x, dt, 2, s32, none, NULL, 0);
        break;
    case LOOM_IR_KIND_TRANSPOSE:
        r = add(g, op, 1, &x, dt, 0, NULL, (loom_ir_attrs){.perm = {1, 0}}, "model.c", 24);
        break;
    case LOOM_IR_KIND_REDUCTION:
        r = add(g, op, 1, &x, dt, 0, NULL, (loom_ir_attrs){.axes = 1u << 1, .keepdim = true},
                "model.c", 25);
        break;
    case LOOM_IR_KIND_CONTRACTION: {
        int32_t ins[2] = {x, input(g, 1, dt, 2, s34)};
        r = add(g, op, 2, ins, dt, 0, NULL, none, "model.c", 26);
        break;
    }
    case LOOM_IR_KIND_SLICE:
        r = add(g, op, 1, &x, dt, 2, (const int64_t[]){1, 2},
                (loom_ir_attrs){.start = {1, 0}, .step = {1, 2}}, "model.c", 27);
        break;
    case LOOM_IR_KIND_PAD:
        r = add(g, op, 1, &x, dt, 2, (const int64_t[]){4, 7},
                (loom_ir_attrs){.start = {1, 0}, .step = {0, 1}, .value = -0.25}, "model.c", 28);
        break;
    case LOOM_IR_KIND_CONCAT: {
        int32_t ins[3] = {x, input(g, 1, dt, 2, s23), x};
        r = add(g, op, 3, ins, dt, 0, NULL, (loom_ir_attrs){.index = 1}, "model.c", 29);
        break;
    }
    case LOOM_IR_KIND_IOTA:
        r = add(g, op, 0, NULL, LOOM_DTYPE_I32, 2, s23, (loom_ir_attrs){.index = 1}, NULL, 0);
        break;
    case LOOM_IR_KIND_RAND: {
        int32_t seed = input(g, 1, LOOM_DTYPE_I64, 0, NULL);
        r = add(g, op, 1, &seed, LOOM_DTYPE_F32, 2, s423 + 1, none, "model.c", 30);
        break;
    }
    case LOOM_IR_KIND_COLLECTIVE: /* min-reduce scaled by 0.25, root 2, or world 3 */
        r = add(g, op, 1, &x, dt, 0, NULL,
                (loom_ir_attrs){.index = op == LOOM_IR_OP_ALL_REDUCE   ? LOOM_REDUCE_MIN
                                         : op == LOOM_IR_OP_ALL_GATHER ? 3
                                                                       : 2,
                                .value = op == LOOM_IR_OP_ALL_REDUCE ? 0.25 : 0.0},
                "model.c", 31);
        break;
    case LOOM_IR_KIND_CONV: { /* every attribute off its default: groups 2, 7x6 -> 4x4 */
        const int64_t sx[] = {1, 4, 7, 6}, sw[] = {6, 2, 3, 2}, sy[] = {1, 6, 4, 4};
        loom_ir_attrs cv = {.conv = {{2, 1}, {1, 0}, {1, 2}, 2, {0, 0}}};
        int32_t ins[2] = {-1, input(g, 1, dt, 4, sw)};
        ins[0] = input(g, 2, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? sy : sx);
        if (op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT)
            ins[1] = input(g, 3, dt, 4, sy);
        r = op == LOOM_IR_OP_CONV2D
                ? add(g, op, 2, ins, dt, 0, NULL, cv, "model.c", 32)
                : add(g, op, 2, ins, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? sx : sw, cv,
                      "model.c", 32);
        break;
    }
    case LOOM_IR_KIND_POOL: { /* every attribute off its default: 7x6 -> 3x3 */
        const int64_t sx[] = {1, 4, 7, 6}, sy[] = {1, 4, 3, 3};
        loom_ir_attrs cv = {.conv = {{2, 2}, {1, 0}, {2, 1}, 0, {3, 2}}};
        int32_t ins[2] = {input(g, 1, dt, 4, sx), input(g, 2, dt, 4, sy)};
        r = add(g, op, op == LOOM_IR_OP_MAX_POOL2D ? 1 : 2, ins, dt, 0, NULL, cv, "model.c", 33);
        break;
    }
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER: { /* i64 indices [2,5] along axis 1 of x [2,3] */
        int32_t ins[3] = {x, input(g, 1, LOOM_DTYPE_I64, 2, (const int64_t[]){2, 5}), -1};
        if (op == LOOM_IR_OP_SCATTER_ADD)
            ins[2] = input(g, 2, dt, 2, (const int64_t[]){2, 5});
        r = add(g, op, ins[2] >= 0 ? 3 : 2, ins, dt, 0, NULL, (loom_ir_attrs){.index = 1},
                "model.c", 34);
        break;
    }
    case LOOM_IR_KIND_ATTENTION: { /* q [2,3] against 4 keys, Ev 5; causal, scale 0.375;
                                    * dropout 0.125 but in attention_lse */
        bool drop = op != LOOM_IR_OP_ATTENTION_LSE;
        loom_ir_attrs at = {.index = 1, .value = 0.375, .dropout = drop ? 0.125 : 0};
        int32_t k = input(g, 1, dt, 2, (const int64_t[]){4, 3});
        int32_t v = input(g, 2, dt, 2, (const int64_t[]){4, 5});
        int32_t dout = input(g, 3, dt, 2, (const int64_t[]){2, 5});
        int32_t lse = input(g, 4, LOOM_DTYPE_F32, 1, (const int64_t[]){2});
        int32_t delta = input(g, 5, LOOM_DTYPE_F32, 1, (const int64_t[]){2});
        int32_t ins[7] = {x, k, v, dout, lse, delta};
        if (op == LOOM_IR_OP_ATTENTION_GRAD_V) {
            ins[2] = dout;
            ins[3] = lse;
        }
        int32_t own = loom_ir_attention_operands(op);
        if (drop)
            ins[own] = input(g, 6, LOOM_DTYPE_I64, 0, NULL);
        r = add(g, op, own + drop, ins, dt, 0, NULL, at, "model.c", 35);
        break;
    }
    case LOOM_IR_KIND_COUNT_:
        fail();
    }
    assert_true(r >= 0);
    assert_int_equal(g->nodes[r].op, op);
    int32_t alias = r != x && same_type(&g->nodes[r], &g->nodes[x]) ? 0 : -1;
    assert_int_equal(loom_ir_graph_add_output(g, r, alias), LOOM_OK);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_graph_verify(g, &d), LOOM_OK);
}

static void assert_same_locations(const loom_ir_graph *a, const loom_ir_graph *b) {
    assert_int_equal(a->n_nodes, b->n_nodes);
    for (int32_t i = 0; i < a->n_nodes; i++) {
        const loom_ir_loc *x = &a->nodes[i].loc, *y = &b->nodes[i].loc;
        assert_int_equal(x->file == NULL, y->file == NULL);
        if (x->file)
            assert_string_equal(x->file, y->file);
        assert_int_equal(x->line, y->line);
    }
}

/* parse(print(g)) equals g, prints the same, hashes the same, keeps the locations. */
static void assert_round_trips(const loom_ir_graph *g) {
    char *text = print_to_string(g);
    loom_ir_graph h;
    loom_ir_graph_init(&h, &sys);
    parse_ok(&h, text);
    assert_true(loom_ir_graph_equal(g, &h));
    assert_int_equal(loom_ir_graph_hash(g), loom_ir_graph_hash(&h));
    assert_int_equal(h.n_graph_inputs, g->n_graph_inputs);
    assert_same_locations(g, &h);
    char *again = print_to_string(&h);
    assert_string_equal(text, again);
    free(again);
    free(text);
    loom_ir_graph_deinit(&h);
}

/* Returns a fresh copy of s with every occurrence of from replaced by to. */
static char *replace_all(const char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from))
        n++;
    assert_true(n > 0); /* a variant that changes nothing would make its test vacuous */
    char *out = malloc(strlen(s) + n * tl + 1), *o = out;
    assert_non_null(out);
    for (const char *p; (p = strstr(s, from)); s = p + fl) {
        memcpy(o, s, (size_t)(p - s));
        o += p - s;
        memcpy(o, to, tl);
        o += tl;
    }
    strcpy(o, s);
    return out;
}

static const char golden[] =
    "loom.graph {\n"
    "  %0 = input {index = 0} : f32[2,3] loc(\"x.c\":4)\n"
    "  %1 = constant {value = 0.5} : f32[]\n"
    "  %2 = broadcast %1 : f32[2,3]\n"
    "  %3 = add %0, %2 : f32[2,3] loc(\"x.c\":5)\n"
    "  %4 = transpose %3 {perm = [1, 0]} : f32[3,2]\n"
    "  %5 = reduce_sum %3 {axes = [1], keepdim = false} : f32[2] loc(\"x.c\":7)\n"
    "  return %3 {alias = 0}, %5\n"
    "}\n";

/* ---- round trips ------------------------------------------------------------------------- */

static void test_every_op_round_trips_through_text(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        build_op_graph(&g, (loom_ir_op)op);
        assert_round_trips(&g);
    }
    loom_ir_graph_deinit(&g);
}

static void test_print_matches_golden_text(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    const int64_t s23[] = {2, 3};
    int32_t x = add(&g, LOOM_IR_OP_INPUT, 0, NULL, LOOM_DTYPE_F32, 2, s23,
                    (loom_ir_attrs){.index = 0}, "x.c", 4);
    int32_t c = add(&g, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_F32, 0, NULL,
                    (loom_ir_attrs){.value = 0.5}, NULL, 0);
    int32_t b = add(&g, LOOM_IR_OP_BROADCAST, 1, &c, LOOM_DTYPE_F32, 2, s23, (loom_ir_attrs){0},
                    NULL, 0);
    int32_t s = add(&g, LOOM_IR_OP_ADD, 2, (int32_t[]){x, b}, LOOM_DTYPE_F32, 0, NULL,
                    (loom_ir_attrs){0}, "x.c", 5);
    add(&g, LOOM_IR_OP_TRANSPOSE, 1, &s, LOOM_DTYPE_F32, 0, NULL,
        (loom_ir_attrs){.perm = {1, 0}}, NULL, 0);
    int32_t r = add(&g, LOOM_IR_OP_REDUCE_SUM, 1, &s, LOOM_DTYPE_F32, 0, NULL,
                    (loom_ir_attrs){.axes = 1u << 1}, "x.c", 7);
    assert_int_equal(loom_ir_graph_add_output(&g, s, 0), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(&g, r, -1), LOOM_OK);
    char *text = print_to_string(&g);
    assert_string_equal(text, golden);
    free(text);
    assert_round_trips(&g);
    loom_ir_graph_deinit(&g);
}

static void test_graph_without_outputs_prints_bare_return(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    char *text = print_to_string(&g);
    assert_string_equal(text, "loom.graph {\n  return\n}\n");
    parse_ok(&g, text);
    assert_int_equal(g.n_nodes, 0);
    assert_int_equal(g.n_outputs, 0);
    free(text);
    loom_ir_graph_deinit(&g);
}

static void test_special_constants_round_trip_bit_exactly(void **state) {
    (void)state;
    const double values[] = {INFINITY, -INFINITY, NAN, -0.0, 0.1, 1e300, 4.9406564584124654e-324,
                             -123456789.125, 1.0 / 3.0};
    const char *const spelled[] = {"inf", "-inf", "nan", "-0", "0.10000000000000001",
                                   "1.0000000000000001e+300",
                                   "4.9406564584124654e-324", "-123456789.125",
                                   "0.33333333333333331"};
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        loom_ir_graph_reset(&g);
        int32_t c = add(&g, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_F64, 0, NULL,
                        (loom_ir_attrs){.value = values[i]}, NULL, 0);
        assert_int_equal(loom_ir_graph_add_output(&g, c, -1), LOOM_OK);
        char *text = print_to_string(&g);
        char want[128];
        snprintf(want, sizeof want, "%%0 = constant {value = %s} : f64[]", spelled[i]);
        if (!strstr(text, want))
            print_error("want %s in:\n%s", want, text ? text : "(null)");
        assert_non_null(strstr(text, want));
        free(text);
        assert_round_trips(&g);
    }
    loom_ir_graph_deinit(&g);
}

static void test_file_names_with_quotes_and_control_bytes_round_trip(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    add(&g, LOOM_IR_OP_INPUT, 0, NULL, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0},
        "dir\\sub/\"odd\"\tname\n.c", 9);
    char *text = print_to_string(&g);
    assert_non_null(strstr(text, "loc(\"dir\\\\sub/\\\"odd\\\"\\x09name\\x0a.c\":9)"));
    free(text);
    assert_round_trips(&g);
    loom_ir_graph_deinit(&g);
}

static void test_parse_accepts_names_comments_and_free_layout(void **state) {
    (void)state;
    const char *text = "// a hand-written graph\n"
                       "loom.graph{%x=input{index=1}:f32[2] // the second input\n"
                       "\t%y = input {index = 0} : f32[2]   loc(\"a.c\":3)\n"
                       "  %sum.1 = add %x,\n   %y : f32[2]\n"
                       "  %m = reduce_max %sum.1 {keepdim = true, axes = []} : f32[2]\n"
                       "  return %m, %sum.1 {alias = 1} }  // done\n";
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    parse_ok(&g, text);
    assert_int_equal(g.n_nodes, 4);
    assert_int_equal(g.n_graph_inputs, 2);
    assert_int_equal(g.nodes[0].attrs.index, 1);
    assert_int_equal(g.nodes[2].op, LOOM_IR_OP_ADD);
    assert_int_equal(g.nodes[2].inputs[0], 0);
    assert_int_equal(g.nodes[2].inputs[1], 1);
    assert_string_equal(g.nodes[1].loc.file, "a.c");
    assert_int_equal(g.nodes[1].loc.line, 3);
    assert_null(g.nodes[0].loc.file);
    assert_int_equal(g.nodes[3].attrs.axes, 0);
    assert_true(g.nodes[3].attrs.keepdim);
    assert_int_equal(g.n_outputs, 2);
    assert_int_equal(g.outputs[0].node, 3);
    assert_int_equal(g.outputs[0].alias, -1);
    assert_int_equal(g.outputs[1].node, 2);
    assert_int_equal(g.outputs[1].alias, 1);
    char *printed = print_to_string(&g);
    assert_string_equal(printed, "loom.graph {\n"
                                 "  %0 = input {index = 1} : f32[2]\n"
                                 "  %1 = input {index = 0} : f32[2] loc(\"a.c\":3)\n"
                                 "  %2 = add %0, %1 : f32[2]\n"
                                 "  %3 = reduce_max %2 {axes = [], keepdim = true} : f32[2]\n"
                                 "  return %3, %2 {alias = 1}\n"
                                 "}\n");
    free(printed);
    loom_ir_graph_deinit(&g);
}

/* ---- hashing through text ---------------------------------------------------------------- */

static const char hash_base[] = "loom.graph {\n"
                                "  %0 = input {index = 0} : f32[2,3]\n"
                                "  %1 = input {index = 1} : f32[2,3]\n"
                                "  %2 = sub %0, %1 : f32[2,3]\n"
                                "  %3 = constant {value = 2} : f32[2,3]\n"
                                "  %4 = mul %2, %3 : f32[2,3]\n"
                                "  %5 = reduce_sum %4 {axes = [1], keepdim = false} : f32[2]\n"
                                "  return %4 {alias = 0}, %5\n"
                                "}\n";

/* A textual edit of a graph that must change its structure: from -> to, everywhere. */
typedef struct hash_variant {
    const char *what, *from, *to;
} hash_variant;

/* Each variant of base_text parses to a graph that hashes and compares differently from base
 * (base_text parsed). */
static void expect_variants_change_the_hash(const loom_ir_graph *base, const char *base_text,
                                            const hash_variant *variants, size_t n) {
    uint64_t h0 = loom_ir_graph_hash(base);
    loom_ir_graph other;
    loom_ir_graph_init(&other, &sys);
    for (size_t i = 0; i < n; i++) {
        char *text = replace_all(base_text, variants[i].from, variants[i].to);
        parse_ok(&other, text);
        if (loom_ir_graph_hash(&other) == h0 || loom_ir_graph_equal(base, &other))
            print_error("variant '%s' did not change the hash\n", variants[i].what);
        assert_int_not_equal(loom_ir_graph_hash(&other), h0);
        assert_false(loom_ir_graph_equal(base, &other));
        free(text);
    }
    loom_ir_graph_deinit(&other);
}

static void test_hash_changes_with_every_structural_difference(void **state) {
    (void)state;
    static const hash_variant variants[] = {
        {"shape", "[2,3]", "[2,4]"},
        {"dtype", "f32", "f64"},
        {"constant value", "value = 2}", "value = 3}"},
        {"keepdim", "keepdim = false} : f32[2]", "keepdim = true} : f32[2,1]"},
        {"reduced axis", "axes = [1], keepdim = false} : f32[2]",
         "axes = [0], keepdim = false} : f32[3]"},
        {"alias target", "return %4 {alias = 0}", "return %4 {alias = 1}"},
        {"edge", "sub %0, %1", "sub %1, %0"},
        {"op", "sub %0", "add %0"},
        {"output", "return %4 {alias = 0}, %5", "return %4 {alias = 0}, %4"},
        {"output count", "return %4 {alias = 0}, %5", "return %4 {alias = 0}"},
        {"alias", "return %4 {alias = 0}", "return %4"},
        {"autocast tag", "sub %0, %1 :", "sub %0, %1 {autocast = bf16} :"},
        {"autocast tag on an op with attributes", "keepdim = false}",
         "keepdim = false, autocast = f16}"},
    };
    loom_ir_graph base;
    loom_ir_graph_init(&base, &sys);
    parse_ok(&base, hash_base);
    expect_variants_change_the_hash(&base, hash_base, variants,
                                    sizeof variants / sizeof variants[0]);
    loom_ir_graph_deinit(&base);
}

/* Prefix hashes (what ranks compare to find where their steps part) agree up to the first
 * changed node and differ from there on; a node's text is its printed line. */
static void test_prefix_hashes_part_at_the_first_changed_node(void **state) {
    (void)state;
    loom_ir_graph a, b;
    loom_ir_graph_init(&a, &sys);
    loom_ir_graph_init(&b, &sys);
    parse_ok(&a, hash_base);
    char *text = replace_all(hash_base, "value = 2}", "value = 3}"); /* node %3 */
    parse_ok(&b, text);
    free(text);
    uint64_t ha[6], hb[6];
    assert_int_equal(a.n_nodes, 6);
    loom_ir_graph_prefix_hashes(&a, ha);
    loom_ir_graph_prefix_hashes(&b, hb);
    for (int i = 0; i < 6; i++) {
        if (i < 3)
            assert_true(ha[i] == hb[i]);
        else
            assert_true(ha[i] != hb[i]);
    }
    char line[128];
    assert_string_equal(loom_ir_format_node(line, sizeof line, &b.nodes[3], 3),
                        "%3 = constant {value = 3} : f32[2,3]");
    assert_string_equal(loom_ir_format_node(line, sizeof line, &a.nodes[5], 5),
                        "%5 = reduce_sum %4 {axes = [1], keepdim = false} : f32[2]");
    assert_string_equal(loom_ir_format_node(line, 12, &a.nodes[5], 5), "%5 = reduce");
    loom_ir_graph_deinit(&a);
    loom_ir_graph_deinit(&b);
}

/* Collectives hash by op, dtype, shape, reduce op, scale, root and world size, never by the
 * rank (which no graph holds: every rank's graph is the same text, so the same hash). */
static void test_collectives_round_trip_and_hash_by_their_attributes(void **state) {
    (void)state;
    static const char base_text[] =
        "loom.graph {\n"
        "  %0 = input {index = 0} : f32[2,3]\n"
        "  %1 = all_reduce %0 {reduce = sum, scale = 0.5} : f32[2,3] loc(\"dp.c\":7)\n"
        "  %2 = broadcast_from %1 {root = 0} : f32[2,3]\n"
        "  %3 = all_gather %2 {world = 2} : f32[4,3]\n"
        "  return %1 {alias = 0}, %3\n"
        "}\n";
    static const hash_variant variants[] = {
        {"reduce op", "reduce = sum", "reduce = max"},
        {"scale", "scale = 0.5", "scale = 0.25"},
        {"negative zero scale", "scale = 0.5", "scale = -0"},
        {"root", "root = 0", "root = 1"},
        {"world size", "{world = 2} : f32[4,3]", "{world = 3} : f32[6,3]"},
        {"dtype", "f32", "bf16"},
        {"shape", "3]", "5]"},
    };
    loom_ir_graph base, other;
    loom_ir_graph_init(&base, &sys);
    loom_ir_graph_init(&other, &sys);
    parse_ok(&base, base_text);
    assert_round_trips(&base);
    char *printed = print_to_string(&base);
    assert_non_null(strstr(printed, "all_reduce %0 {reduce = sum, scale = 0.5} : f32[2,3]"));
    free(printed);
    uint64_t h0 = loom_ir_graph_hash(&base);
    char *moved = replace_all(base_text, "\"dp.c\":7", "\"other.c\":99");
    parse_ok(&other, moved); /* locations are not hashed */
    assert_int_equal(loom_ir_graph_hash(&other), h0);
    free(moved);
    expect_variants_change_the_hash(&base, base_text, variants,
                                    sizeof variants / sizeof variants[0]);
    loom_ir_graph_deinit(&other);
    loom_ir_graph_deinit(&base);
}

/* The tag prints after the op's own attributes, parses back, and tags differ by dtype. */
static void test_autocast_tags_round_trip_and_hash_by_dtype(void **state) {
    (void)state;
    static const char text[] =
        "loom.graph {\n"
        "  %0 = input {index = 0} : f32[2,3]\n"
        "  %1 = transpose %0 {perm = [1, 0], autocast = bf16} : f32[3,2]\n"
        "  %2 = matmul %0, %1 {autocast = bf16} : f32[2,2]\n"
        "  %3 = reduce_sum %2 {axes = [1], keepdim = false, autocast = f16} : f32[2]\n"
        "  return %3\n"
        "}\n";
    loom_ir_graph g, other;
    loom_ir_graph_init(&g, &sys);
    loom_ir_graph_init(&other, &sys);
    parse_ok(&g, text);
    assert_int_equal(g.nodes[0].attrs.autocast, LOOM_DTYPE_F32);
    assert_int_equal(g.nodes[2].attrs.autocast, LOOM_DTYPE_BF16);
    assert_int_equal(g.nodes[3].attrs.autocast, LOOM_DTYPE_F16);
    char *printed = print_to_string(&g);
    assert_string_equal(printed, text);
    char *f16 =
        replace_all(text, "matmul %0, %1 {autocast = bf16}", "matmul %0, %1 {autocast = f16}");
    parse_ok(&other, f16);
    assert_int_not_equal(loom_ir_graph_hash(&g), loom_ir_graph_hash(&other));
    assert_false(loom_ir_graph_equal(&g, &other));
    free(f16);
    free(printed);
    loom_ir_graph_deinit(&other);
    loom_ir_graph_deinit(&g);
}

static void test_locations_do_not_change_the_hash(void **state) {
    (void)state;
    char *a = replace_all(hash_base, "%2 = sub %0, %1 : f32[2,3]",
                          "%2 = sub %0, %1 : f32[2,3] loc(\"train.c\":88)");
    char *b = replace_all(a, "%4 = mul %2, %3 : f32[2,3]",
                          "%4 = mul %2, %3 : f32[2,3] loc(\"other.c\":1)");
    loom_ir_graph g0, g1;
    loom_ir_graph_init(&g0, &sys);
    loom_ir_graph_init(&g1, &sys);
    parse_ok(&g0, hash_base);
    parse_ok(&g1, b);
    assert_string_equal(g1.nodes[2].loc.file, "train.c");
    assert_int_equal(g1.nodes[4].loc.line, 1);
    assert_int_equal(loom_ir_graph_hash(&g0), loom_ir_graph_hash(&g1));
    assert_true(loom_ir_graph_equal(&g0, &g1));
    free(a);
    free(b);
    loom_ir_graph_deinit(&g1);
    loom_ir_graph_deinit(&g0);
}

/* Scopes (module names) and the backward flag ride on a node's location: printed inside
 * loc(...), parsed back, with or without a file, and never part of the hash or of equality;
 * loom_ir_format_loc puts the scope first, ".grad" on backward nodes. */
static void test_scopes_round_trip_and_do_not_change_the_hash(void **state) {
    (void)state;
    char *a =
        replace_all(hash_base, "%2 = sub %0, %1 : f32[2,3]",
                    "%2 = sub %0, %1 : f32[2,3] loc(\"train.c\":88, scope = \"layer1.0.conv1\")");
    char *b = replace_all(a, "%4 = mul %2, %3 : f32[2,3]",
                          "%4 = mul %2, %3 : f32[2,3] loc(\"train.c\":90, scope = \"lay\\\"er\", "
                          "backward)");
    char *c = replace_all(b, "%3 = constant {value = 2} : f32[2,3]",
                          "%3 = constant {value = 2} : f32[2,3] loc(scope = \"fc\")");
    loom_ir_graph g0, g1, g2;
    loom_ir_graph_init(&g0, &sys);
    loom_ir_graph_init(&g1, &sys);
    loom_ir_graph_init(&g2, &sys);
    parse_ok(&g0, hash_base);
    parse_ok(&g1, c);
    assert_string_equal(g1.nodes[2].loc.scope, "layer1.0.conv1");
    assert_false(g1.nodes[2].loc.backward);
    assert_string_equal(g1.nodes[4].loc.scope, "lay\"er");
    assert_true(g1.nodes[4].loc.backward);
    assert_int_equal(g1.nodes[4].loc.line, 90);
    assert_null(g1.nodes[0].loc.scope);
    assert_string_equal(g1.nodes[3].loc.scope, "fc");
    assert_null(g1.nodes[3].loc.file);
    assert_int_equal(loom_ir_graph_hash(&g0), loom_ir_graph_hash(&g1));
    assert_true(loom_ir_graph_equal(&g0, &g1));
    char buf[LOOM_IR_LOC_STR_MAX];
    assert_string_equal(loom_ir_format_loc(buf, sizeof buf, g1.nodes[2].loc),
                        "layer1.0.conv1 (train.c:88)");
    assert_string_equal(loom_ir_format_loc(buf, sizeof buf, g1.nodes[4].loc),
                        "lay\"er.grad (train.c:90)");
    /* printed back as written, and that text parses to the same locations */
    char *text = print_to_string(&g1);
    assert_non_null(strstr(text, "loc(\"train.c\":88, scope = \"layer1.0.conv1\")\n"));
    assert_non_null(strstr(text, "loc(\"train.c\":90, scope = \"lay\\\"er\", backward)\n"));
    assert_non_null(strstr(text, "f32[2,3] loc(scope = \"fc\")\n"));
    parse_ok(&g2, text);
    for (int32_t i = 0; i < g1.n_nodes; i++) {
        const loom_ir_loc *x = &g1.nodes[i].loc, *y = &g2.nodes[i].loc;
        assert_true((x->scope == NULL) == (y->scope == NULL));
        if (x->scope)
            assert_string_equal(x->scope, y->scope);
        assert_int_equal(x->backward, y->backward);
    }
    free(text);
    free(a);
    free(b);
    free(c);
    loom_ir_graph_deinit(&g2);
    loom_ir_graph_deinit(&g1);
    loom_ir_graph_deinit(&g0);
}

/* ---- errors ------------------------------------------------------------------------------ */

#define PRE "loom.graph {\n  %x = input {index = 0} : f32[2,3]\n"

static void test_parse_errors_name_line_and_column(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int32_t line, col;
        const char *msg;
    } cases[] = {
        {PRE "  %1 = addd %x, %x : f32[2,3]\n  return\n}\n", 3, 8, "unknown op 'addd'"},
        {PRE "  %1 = neg %x : f33[2,3]\n  return\n}\n", 3, 17, "unknown dtype 'f33'"},
        {PRE "  %1 = neg %y : f32[2,3]\n  return\n}\n", 3, 12, "undefined value '%y'"},
        {PRE "  %1 = neg %x : f32[2,3]\n  return %1\n", 5, 1,
         "expected '}' to close the graph, got end of input"},
        {PRE "  %1 = neg %x : f32[3,2]\n  return\n}\n", 3, 17,
         "declared type f32[3,2] but the operands give f32[2,3]"},
        {PRE "  %1 = transpose %x {prem = [1, 0]} : f32[3,2]\n  return\n}\n", 3, 22,
         "unknown attribute 'prem' for transpose"},
        {PRE "  %1 = transpose %x : f32[3,2]\n  return\n}\n", 3, 8,
         "transpose needs attribute 'perm'"},
        {PRE "  %1 = neg %x {perm = [0]} : f32[2,3]\n  return\n}\n", 3, 16,
         "unknown attribute 'perm' for neg"},
        {PRE "  %1 = neg %x {autocast = f64} : f32[2,3]\n  return\n}\n", 3, 27,
         "expected bf16 or f16 as the autocast dtype, got 'f64'"},
        {PRE "  %1 = neg %x {autocast = bf16, autocast = f16} : f32[2,3]\n  return\n}\n", 3, 33,
         "attribute 'autocast' is given twice"},
        {PRE "  %1 = transpose %x {perm = [1]} : f32[3,2]\n  return\n}\n", 3, 29,
         "perm has 1 entries, but the operand has rank 2"},
        {PRE "  %1 = matmul %x, %x : f32[2,3]\n  return\n}\n", 3, 8,
         "matmul: inner dimensions differ: f32[2,3] x f32[2,3]"},
        {PRE "  %1 = all_reduce %x {reduce = mean, scale = 1} : f32[2,3]\n  return\n}\n", 3, 32,
         "expected sum, max or min as the reduce op, got 'mean'"},
        {PRE "  %1 = all_reduce %x {reduce = sum} : f32[2,3]\n  return\n}\n", 3, 8,
         "all_reduce needs attribute 'scale'"},
        {PRE "  %1 = all_reduce %x {reduce = sum, scale = inf} : f32[2,3]\n  return\n}\n", 3, 8,
         "all_reduce: scale inf is not finite"},
        {PRE "  %1 = all_gather %x {world = 0} : f32[0,3]\n  return\n}\n", 3, 8,
         "all_gather: world size 0 is out of range (>= 1)"},
        {PRE "  %1 = all_gather %x {world = 2} : f32[2,3]\n  return\n}\n", 3, 36,
         "declared type f32[2,3] but the operands give f32[4,3]"},
        {PRE "  %1 = broadcast_from %x {root = -1} : f32[2,3]\n  return\n}\n", 3, 34,
         "expected a root rank, got '-'"},
        {PRE "  %1 = neg %x : f32[2", 3, 22, "expected ',' or ']' in the shape, got end of input"},
        {"", 1, 1, "expected 'loom.graph', got end of input"},
        {"  \n// only a comment", 2, 18, "expected 'loom.graph', got end of input"},
        {PRE "  %1 = neg %x : f32[2,3] loc(\"a\\qb.c\":3)\n  return\n}\n", 3, 32,
         "bad escape '\\q' in string (use \\\", \\\\ or \\xHH)"},
        {PRE "  %1 = neg %x : f32[2,3] loc(\"ab.c:3)\n  return\n}\n", 3, 30, "unterminated string"},
        {PRE "  %1 = neg %x : f32[2,3] loc(\"a.c\":3, scope = 4)\n  return\n}\n", 3, 47,
         "expected a quoted scope, got '4'"},
        {PRE "  %1 = neg %x : f32[2,3] loc(\"a.c\":3, backward, backward)\n  return\n}\n", 3, 49,
         "expected a quoted file name, scope = \"...\" or backward (each once) in loc, got "
         "'backward'"},
        {PRE "  %1 = neg %x : f32[2,3] loc(\"a.c\":3 scope = \"s\")\n  return\n}\n", 3, 38,
         "expected ',' or ')' in loc, got 'scope'"},
        {PRE "  %1 = input {index = 1} : f32[99999999999999999999]\n  return\n}\n", 3, 32,
         "integer '99999999999999999999' is too large"},
        {PRE "  %1 = input {index = 1} : f32[1,1,1,1,1,1,1,1,1]\n  return\n}\n", 3, 48,
         "rank exceeds the maximum of 8"},
        {PRE "  %1 = input {index = 1} : f32[4611686018427387904]\n  return\n}\n", 3, 8,
         "input: shape has too many elements"},
        {PRE "  %x = neg %x : f32[2,3]\n  return\n}\n", 3, 3, "value '%x' is defined twice"},
        {PRE "  %1 = constant {value = 1.5e} : f32[]\n  return\n}\n", 3, 26,
         "malformed number '1.5e'"},
        {PRE "  %1 = constant {value = 1e999} : f32[]\n  return\n}\n", 3, 26,
         "number '1e999' is out of range"},
        {PRE "  %1 = neg %x : f32[2,3]\n  return %1\n} x\n", 5, 3,
         "unexpected 'x' after the graph"},
        {PRE "  %1 = neg %x : f32[2,3]\n  \xff\n", 4, 3, "unexpected byte 0xff"},
        {PRE "  }\n", 3, 3, "missing 'return' before '}'"},
        {PRE "  %1 = reduce_sum %x {axes = [1, 1], keepdim = true} : f32[2,1]\n  return\n}\n", 3,
         30, "axis 1 is listed twice"},
        {PRE "  %1 = input {index = 2147483648} : f32[]\n  return\n}\n", 3, 23,
         "2147483648 is out of range for an input index (0..2147483647)"},
    };
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parse_ok(&g, golden); /* a failed parse must empty a non-empty graph */
        loom_ir_diag d;
        loom_status st = parse_text(&g, cases[i].text, &d);
        if (st != LOOM_STATUS_PARSE_ERROR || d.code != st || d.line != cases[i].line ||
            d.col != cases[i].col || strcmp(d.msg, cases[i].msg) != 0) {
            print_error("case %zu: want %d:%d: %s\n         got %s at %d:%d: %s\n", i,
                        (int)cases[i].line, (int)cases[i].col, cases[i].msg,
                        loom_status_name(st), (int)d.line, (int)d.col, d.msg);
            wrong++;
        }
        assert_int_equal(g.n_nodes, 0);
        assert_int_equal(g.n_outputs, 0);
        assert_int_equal(g.n_graph_inputs, 0);
    }
    assert_int_equal(wrong, 0);
    loom_ir_graph_deinit(&g);
}

static void test_verify_failures_pass_through_the_parser(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    loom_ir_diag d;
    /* input 1 exists but input 0 does not */
    assert_int_equal(parse_text(&g, "loom.graph {\n  %0 = input {index = 1} : f32[]\n  return\n}",
                                &d),
                     LOOM_STATUS_VERIFY_FAILED);
    assert_string_equal(d.msg, "graph input 0 has no input node");
    /* an alias naming an input of another type */
    assert_int_equal(parse_text(&g, PRE "  %1 = reduce_sum %x {axes = [0], keepdim = false} : "
                                        "f32[3]\n  return %1 {alias = 0}\n}\n",
                                &d),
                     LOOM_STATUS_VERIFY_FAILED);
    assert_int_equal(d.node, 1);
    assert_string_equal(d.msg, "%1: output of type f32[3] cannot be written into f32[2,3]");
    assert_int_equal(g.n_nodes, 0);
    /* a huge index is refused before the verifier sizes its table by it */
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph small;
    loom_ir_graph_init(&small, &a);
    assert_int_equal(parse_text(&small, PRE "  %y = input {index = 2000000000} : f32[]\n"
                                            "  return\n}\n",
                                &d),
                     LOOM_STATUS_VERIFY_FAILED);
    assert_int_equal(d.node, 1);
    assert_string_equal(d.msg,
                        "%1: input index 2000000000 is out of range: the graph has 2 input nodes");
    assert_true(ta.peak_bytes < 1000000);
    loom_ir_graph_deinit(&small);
    assert_int_equal(ta.live_bytes, 0);
    loom_ir_graph_deinit(&g);
}

/* Every proper prefix of a valid text is an error, never a crash or a read past len. */
static void test_every_truncation_is_a_parse_error(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    size_t len = strlen(golden);
    for (size_t n = 0; n + 1 < len; n++) { /* golden minus its final '\n' is still valid */
        char *cut = malloc(n ? n : 1);
        assert_non_null(cut);
        memcpy(cut, golden, n);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        assert_int_equal(loom_ir_graph_parse(&g, cut, n, &d), LOOM_STATUS_PARSE_ERROR);
        assert_true(d.line >= 1 && d.col >= 1);
        assert_int_equal(g.n_nodes, 0);
        free(cut);
    }
    loom_ir_graph_deinit(&g);
}

/* ---- out of memory ----------------------------------------------------------------------- */

/* 40 nodes over 3 files, named by strings, so that every growable structure grows. */
static char *fault_sample(void) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    loom_ir_sbuf_printf(&sb, "loom.graph {\n  %%in = input {index = 0} : f32[4,4] "
                             "loc(\"data/loader.c\":1)\n  %%v0 = neg %%in : f32[4,4]\n");
    static const char *const files[] = {"models/mlp.c", "models/mlp.c", "train.c"};
    for (int i = 1; i < 40; i++)
        loom_ir_sbuf_printf(&sb, "  %%v%d = %s %%v%d, %%in : f32[4,4] loc(\"%s\":%d)\n", i,
                            i % 2 ? "add" : "mul", i - 1, files[i % 3], 100 + i);
    loom_ir_sbuf_printf(&sb, "  return %%v39 {alias = 0}, %%v7\n}\n");
    assert_false(sb.oom);
    char *s = strdup(sb.data);
    loom_ir_sbuf_deinit(&sb);
    return s;
}

static void test_parse_survives_every_allocation_failure(void **state) {
    (void)state;
    char *text = fault_sample();
    loom_ir_graph want;
    loom_ir_graph_init(&want, &sys);
    parse_ok(&want, text);
    assert_int_equal(want.n_nodes, 41);
    int64_t n;
    for (n = 1;; n++) {
        test_alloc ta = {.fail_at = n};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &a);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_status st = loom_ir_graph_parse(&g, text, strlen(text), &d);
        if (st == LOOM_OK) {
            assert_int_equal(ta.n_failed, 0);
            assert_true(loom_ir_graph_equal(&g, &want));
            assert_same_locations(&g, &want);
            loom_ir_graph_deinit(&g);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(ta.n_failed, 1);
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(g.n_nodes, 0);
        assert_int_equal(g.n_outputs, 0);
        loom_ir_graph_deinit(&g);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
    }
    /* nodes (8 -> 64), the arena, the name table (64 -> 128), operands, scratch, outputs */
    assert_true(n >= 8);
    loom_ir_graph_deinit(&want);
    free(text);
}

/* ---- DOT --------------------------------------------------------------------------------- */

static void test_dot_lists_nodes_edges_and_outputs(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    parse_ok(&g, "loom.graph {\n"
                 "  %a = input {index = 0} : f32[2] loc(\"m\\\"q.c\":3)\n"
                 "  %b = input {index = 1} : f32[2]\n"
                 "  %c = sub %a, %b : f32[2]\n"
                 "  %d = exp %c : f32[2]\n"
                 "  return %d {alias = 1}, %c\n"
                 "}\n");
    char *dot = dot_to_string(&g);
    static const char *const lines[] = {
        "digraph loom {\n",
        "\n  n0 [label=\"%0 input 0\\nf32[2]\\nm\\\"q.c:3\"];\n",
        "\n  n1 [label=\"%1 input 1\\nf32[2]\"];\n",
        "\n  n2 [label=\"%2 sub\\nf32[2]\"];\n",
        "\n  n3 [label=\"%3 exp\\nf32[2]\"];\n",
        "\n  n0 -> n2 [label=\"0\"];\n",
        "\n  n1 -> n2 [label=\"1\"];\n",
        "\n  n2 -> n3;\n",
        "\n  out0 [shape=doublecircle, label=\"return 0\\nalias input 1\"];\n",
        "\n  n3 -> out0;\n",
        "\n  out1 [shape=doublecircle, label=\"return 1\"];\n",
        "\n  n2 -> out1;\n",
    };
    assert_memory_equal(dot, "digraph loom {\n", 15);
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        if (!strstr(dot, lines[i]))
            print_error("missing: %s\nin:\n%s", lines[i], dot);
        assert_non_null(strstr(dot, lines[i]));
    }
    size_t len = strlen(dot);
    assert_string_equal(dot + len - 3, "\n}\n");
    /* 3 operand edges (sub has two) and 2 output edges */
    int labels = 0, edges = 0;
    for (const char *p = dot; (p = strstr(p, "[label=")); p++)
        labels++;
    for (const char *p = dot; (p = strstr(p, " -> ")); p++)
        edges++;
    if (edges != 5)
        print_error("%s", dot);
    assert_int_equal(edges, 5);
    assert_int_equal(labels, 4 + 2); /* node boxes and the two labelled sub edges */
    free(dot);
    loom_ir_graph_deinit(&g);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_round_trips_through_text),
        cmocka_unit_test(test_print_matches_golden_text),
        cmocka_unit_test(test_graph_without_outputs_prints_bare_return),
        cmocka_unit_test(test_special_constants_round_trip_bit_exactly),
        cmocka_unit_test(test_file_names_with_quotes_and_control_bytes_round_trip),
        cmocka_unit_test(test_parse_accepts_names_comments_and_free_layout),
        cmocka_unit_test(test_hash_changes_with_every_structural_difference),
        cmocka_unit_test(test_prefix_hashes_part_at_the_first_changed_node),
        cmocka_unit_test(test_autocast_tags_round_trip_and_hash_by_dtype),
        cmocka_unit_test(test_locations_do_not_change_the_hash),
        cmocka_unit_test(test_scopes_round_trip_and_do_not_change_the_hash),
        cmocka_unit_test(test_parse_errors_name_line_and_column),
        cmocka_unit_test(test_collectives_round_trip_and_hash_by_their_attributes),
        cmocka_unit_test(test_verify_failures_pass_through_the_parser),
        cmocka_unit_test(test_every_truncation_is_a_parse_error),
        cmocka_unit_test(test_parse_survives_every_allocation_failure),
        cmocka_unit_test(test_dot_lists_nodes_edges_and_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
