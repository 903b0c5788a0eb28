/* Compiled kernels against the reference interpreter, op by op: every op of ops.def in
 * f32 (with NaN, infinities and signed zeros among the inputs), and the vectorizable f32
 * math (exp, log, tanh, sigmoid, gelu) over dense sweeps against double-precision libm. */
#include "codegen_test_util.h"

/* ---- every op in f32 ------------------------------------------------------------------------ */

/* Builds a one-kernel graph exercising `op` in f32 and checks it. Every op has a case (the
 * switch has no default): a new op in ops.def fails the build here until it is tested. */
static void check_op_f32(loom_ir_op op) {
    fx f;
    fx_init(&f);
    const loom_dtype F = LOOM_DTYPE_F32;
    double rtol = 1e-6, atol = 0.0, lo = -3.0, hi = 3.0;
    bool specials = true;
    int32_t x, y, r;
    switch (op) {
    case LOOM_IR_OP_INPUT: /* read as an arg and copied through a kernel */
        x = input(&f, F, 1, S(33));
        r = op1(&f, LOOM_IR_OP_NEG, x);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_CONSTANT:
        r = cst(&f, F, 2, S(7, 3), 2.75);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_NEG:
    case LOOM_IR_OP_ABS:
    case LOOM_IR_OP_EXP:
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_RELU:
    case LOOM_IR_OP_GELU:
    case LOOM_IR_OP_GELU_TANH:
    case LOOM_IR_OP_ISFINITE:
        if (op == LOOM_IR_OP_LOG || op == LOOM_IR_OP_SQRT || op == LOOM_IR_OP_RSQRT) {
            lo = 1e-3;
            hi = 1e3;
        } else if (op == LOOM_IR_OP_EXP) {
            lo = -80.0;
            hi = 80.0;
        } else if (op == LOOM_IR_OP_TANH || op == LOOM_IR_OP_SIGMOID) {
            lo = -12.0;
            hi = 12.0;
        } else if (op == LOOM_IR_OP_GELU || op == LOOM_IR_OP_GELU_TANH) {
            lo = -5.5;
            hi = 5.5;
        }
        if (op == LOOM_IR_OP_EXP || op == LOOM_IR_OP_LOG || op == LOOM_IR_OP_TANH ||
            op == LOOM_IR_OP_SIGMOID || op == LOOM_IR_OP_GELU)
            rtol = 2e-6;
        if (op == LOOM_IR_OP_GELU_TANH) /* its tail exp(-2u): u's f32 rounding times |2u| ~ 30 */
            rtol = 1e-5;
        x = input(&f, F, 1, S(1000));
        r = op1(&f, op, x);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_ADD:
    case LOOM_IR_OP_SUB:
    case LOOM_IR_OP_MUL:
    case LOOM_IR_OP_DIV:
    case LOOM_IR_OP_POW:
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM:
        if (op == LOOM_IR_OP_POW)
            rtol = 2e-6;
        x = input(&f, F, 2, S(33, 7));
        y = input(&f, F, 2, S(33, 7));
        r = op2(&f, op, x, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE:
        lo = -2.0; /* small range: x == y happens, on top of the specials' NaNs */
        hi = 2.0;
        x = input(&f, F, 1, S(1000));
        y = op1(&f, LOOM_IR_OP_RELU, input(&f, F, 1, S(1000)));
        r = op2(&f, op, x, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 2, (int32_t[]){y, r});
        break;
    case LOOM_IR_OP_SELECT: {
        int32_t c = input(&f, LOOM_DTYPE_BOOL, 1, S(1000));
        x = input(&f, F, 1, S(1000));
        y = input(&f, F, 1, S(1000));
        r = op3(&f, op, c, x, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    }
    case LOOM_IR_OP_CAST:
        lo = -1e10;
        hi = 1e10;
        x = input(&f, F, 1, S(1000));
        r = cast(&f, x, LOOM_DTYPE_I32);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_BROADCAST:
        x = input(&f, F, 2, S(1, 7));
        r = shaped(&f, op, x, 3, S(5, 33, 7));
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_RESHAPE: /* a kernel reads a reshape of an input with its own shape */
        x = input(&f, F, 2, S(7, 33));
        y = shaped(&f, op, x, 3, S(3, 11, 7));
        r = transpose(&f, y, 3, (int32_t[]){2, 0, 1});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_TRANSPOSE:
        x = input(&f, F, 3, S(5, 33, 7));
        r = transpose(&f, x, 3, (int32_t[]){1, 2, 0});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        break;
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
        x = input(&f, F, 2, S(33, 70));
        r = reduce(&f, op, x, 1u << 1, false);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_REDUCTION, r, 1, &r);
        specials = op == LOOM_IR_OP_REDUCE_MAX; /* NaN, inf in a sum is all NaN */
        break;
    case LOOM_IR_OP_MATMUL:
        rtol = 1e-5;
        atol = 1e-5;
        specials = false;
        x = input(&f, F, 2, S(7, 13));
        y = input(&f, F, 2, S(13, 5));
        r = op2(&f, op, x, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ROOTED, r, 1, &r);
        break;
    case LOOM_IR_OP_SLICE: /* strided rows and columns, fused into a neg */
        x = input(&f, F, 2, S(33, 70));
        y = add(&f, (loom_ir_node_desc){.op = op,
                                        .n_inputs = 1,
                                        .inputs = &x,
                                        .rank = 2,
                                        .shape = S(16, 22),
                                        .attrs = {.start = {1, 3}, .step = {2, 3}}});
        r = op1(&f, LOOM_IR_OP_NEG, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 2, (int32_t[]){y, r});
        break;
    case LOOM_IR_OP_PAD: /* low 1 / high 1 rows, low 2 / interior 1 / high 1 columns */
        x = input(&f, F, 2, S(33, 7));
        y = add(&f, (loom_ir_node_desc){.op = op,
                                        .n_inputs = 1,
                                        .inputs = &x,
                                        .rank = 2,
                                        .shape = S(35, 16),
                                        .attrs = {.start = {1, 2}, .step = {0, 1}, .value = 0.5}});
        r = op1(&f, LOOM_IR_OP_NEG, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 2, (int32_t[]){y, r});
        break;
    case LOOM_IR_OP_CONCAT: { /* three operands along the inner axis, one computed */
        int32_t in[3] = {input(&f, F, 2, S(5, 7)), input(&f, F, 2, S(5, 3)), -1};
        in[2] = op1(&f, LOOM_IR_OP_NEG, input(&f, F, 2, S(5, 11)));
        r = add(&f,
                (loom_ir_node_desc){.op = op, .n_inputs = 3, .inputs = in, .attrs = {.index = 1}});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 2, (int32_t[]){in[2], r});
        break;
    }
    case LOOM_IR_OP_IOTA: /* along axis 0, added to an input */
        x = input(&f, F, 2, S(33, 7));
        y = add(&f, (loom_ir_node_desc){
                        .op = op, .dtype = F, .rank = 2, .shape = S(33, 7), .attrs = {.index = 0}});
        r = op2(&f, LOOM_IR_OP_ADD, x, y);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 2, (int32_t[]){y, r});
        break;
    case LOOM_IR_OP_RAND_UNIFORM:
        x = input(&f, LOOM_DTYPE_I64, 0, NULL);
        r = add(
            &f,
            (loom_ir_node_desc){
                .op = op, .n_inputs = 1, .inputs = &x, .dtype = F, .rank = 2, .shape = S(33, 70)});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        rtol = 0.0;
        break;
    case LOOM_IR_OP_ALL_REDUCE:     /* no kernel's work: fusion refuses graphs with collectives */
    case LOOM_IR_OP_BROADCAST_FROM: /* (UNSUPPORTED; test_conformance checks it) */
    case LOOM_IR_OP_ALL_GATHER: fx_deinit(&f); return;
    case LOOM_IR_OP_CONV2D: /* their kernels have tests of their own (test_conv) */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT: fx_deinit(&f); return;
    case LOOM_IR_OP_MAX_POOL2D: /* ResNet's stem pool on a 9x8 plane: padding, NaN, inf */
    case LOOM_IR_OP_MAX_POOL2D_GRAD: {
        const loom_ir_attrs w = {.conv = {{2, 2}, {1, 1}, {1, 1}, 0, {3, 3}}};
        x = input(&f, F, 4, S(2, 3, 9, 8));
        y = op == LOOM_IR_OP_MAX_POOL2D ? -1 : input(&f, F, 4, S(2, 3, 5, 4));
        r = add(&f,
                (loom_ir_node_desc){
                    .op = op, .n_inputs = y < 0 ? 1 : 2, .inputs = (int32_t[]){x, y}, .attrs = w});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ROOTED, r, 1, &r);
        break;
    }
    case LOOM_IR_OP_GATHER: /* embedding rows: a table f32[7,33] at i32 indices [70,33] */
    case LOOM_IR_OP_SCATTER_ADD: {
        x = input(&f, F, 2, S(7, 33));
        y = input(&f, LOOM_DTYPE_I32, 2, S(70, 33));
        int32_t src = op == LOOM_IR_OP_GATHER ? -1 : input(&f, F, 2, S(70, 33));
        r = add(&f, (loom_ir_node_desc){.op = op,
                                        .n_inputs = src < 0 ? 2 : 3,
                                        .inputs = (int32_t[]){x, y, src},
                                        .attrs = {.index = 0}});
        output(&f, r);
        kernel(&f, op == LOOM_IR_OP_GATHER ? LOOM_IR_KERNEL_ELEMENTWISE : LOOM_IR_KERNEL_ROOTED, r,
               1, &r);
        rtol = op == LOOM_IR_OP_GATHER ? 0.0 : 1e-5; /* f32 sums of 10 per element, in order */
        break;
    }
    case LOOM_IR_OP_ATTENTION:     /* [2,1] heads of 70 queries (two blocks) against 67 keys, */
    case LOOM_IR_OP_ATTENTION_LSE: /* E 20, Ev 17, causal; test_attention has the rest */
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V: {
        const loom_ir_attrs at = {.index = 1, .value = 0.25};
        int32_t q = input(&f, F, 4, S(2, 1, 70, 20)), k = input(&f, F, 4, S(2, 1, 67, 20));
        int32_t v = input(&f, F, 4, S(2, 1, 67, 17)), dout = input(&f, F, 4, S(2, 1, 70, 17));
        int32_t lse = input(&f, F, 3, S(2, 1, 70)), delta = input(&f, F, 3, S(2, 1, 70));
        int32_t all[6] = {q, k, v, dout, lse, delta}, gv[4] = {q, k, dout, lse};
        r = add(&f, (loom_ir_node_desc){.op = op,
                                        .n_inputs = loom_ir_attention_operands(op),
                                        .inputs = op == LOOM_IR_OP_ATTENTION_GRAD_V ? gv : all,
                                        .attrs = at});
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ROOTED, r, 1, &r);
        rtol = 1e-5; /* f32 sums over 67 keys against the interpreter's f64 */
        atol = 1e-5;
        specials = false; /* NaN orders differ between a max and a running max */
        lo = -1.0;
        hi = 1.0;
        break;
    }
    case LOOM_IR_OP_COUNT_: fail();
    }
    fill_all(&f, lo, hi, specials);
    if (op == LOOM_IR_OP_POW)
        fill(&f, 0, 0.1, 3.0, true);
    check(&f, rtol, atol, loom_ir_op_name(op));
    fx_deinit(&f);
}

static void test_every_op_in_f32_matches_the_interpreter(void **state) {
    (void)state;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++)
        check_op_f32((loom_ir_op)op);
}

/* The polynomial exp, log, tanh, sigmoid and gelu over dense sweeps of their ranges
 * (subnormal results included), with and without fma, against double-precision libm. */
static void check_math_sweeps(void) {
    static const struct {
        loom_ir_op op;
        double lo, hi, rtol;
    } cases[] = {
        {LOOM_IR_OP_EXP, -103.0, 88.7, 2.5e-7},   {LOOM_IR_OP_EXP, -1.0, 1.0, 2.5e-7},
        {LOOM_IR_OP_LOG, 1e-44, 1e-30, 2.5e-7},   {LOOM_IR_OP_LOG, 1e-3, 3e38, 2.5e-7},
        {LOOM_IR_OP_LOG, 0.5, 2.0, 2.5e-7},       {LOOM_IR_OP_TANH, -10.0, 10.0, 3e-7},
        {LOOM_IR_OP_SIGMOID, -100.0, 30.0, 4e-7}, {LOOM_IR_OP_GELU, -5.5, 10.0, 1e-6},
    };
    for (size_t c = 0; c < LEN(cases); c++) {
        fx f;
        fx_init(&f);
        const int64_t n = 200003;
        int32_t x = input(&f, LOOM_DTYPE_F32, 1, &n);
        int32_t r = op1(&f, cases[c].op, x);
        output(&f, r);
        kernel(&f, LOOM_IR_KERNEL_ELEMENTWISE, r, 1, &r);
        float *xs = malloc((size_t)n * sizeof(float));
        bool geometric = cases[c].lo > 0 && cases[c].hi / cases[c].lo > 1e6;
        for (int64_t i = 0; i < n; i++) {
            double t = (double)i / (double)(n - 1);
            xs[i] = (float)(geometric ? cases[c].lo * pow(cases[c].hi / cases[c].lo, t)
                                      : cases[c].lo + (cases[c].hi - cases[c].lo) * t);
        }
        f.in[0] = xs;
        char what[64];
        snprintf(what, sizeof what, "%s sweep [%g, %g]", loom_ir_op_name(cases[c].op), cases[c].lo,
                 cases[c].hi);
        check(&f, cases[c].rtol, 1e-44, what);
        fx_deinit(&f);
    }
}

static void test_vector_math_is_accurate_over_dense_sweeps(void **state) {
    (void)state;
    check_math_sweeps();
    setenv("LOOM_CG_FMA", "0", 1);
    check_math_sweeps();
    unsetenv("LOOM_CG_FMA");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_in_f32_matches_the_interpreter),
        cmocka_unit_test(test_vector_math_is_accurate_over_dense_sweeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
