/* The per-element semantics of the elementwise ops, defined once: the reference interpreter
 * runs them and constant folding evaluates them, so a folded value is what running gives.
 *
 * Floats are computed in double (16-bit floats therefore via their exact f32 values) and
 * rounded to the node's dtype by loom_ir_store_f64. Integers are computed in int64 with
 * wrap-around: the arithmetic is done on uint64_t and converted back with wrap(), so no
 * path has signed-overflow UB; i32 results wrap when stored. Unary rules ignore b. */
#include <math.h>

#include "ir.h"

/* uint64 -> int64 modulo 2^64, without relying on implementation-defined conversion. */
static int64_t wrap(uint64_t u) {
    return u <= (uint64_t)INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1;
}

static double neg_f(double x, double b) {
    return -x;
}
static int64_t neg_i(int64_t x, int64_t b) {
    return wrap(0u - (uint64_t)x);
}
static double abs_f(double x, double b) {
    return fabs(x);
}
/* abs(INT_MIN) wraps to INT_MIN, as in torch */
static int64_t abs_i(int64_t x, int64_t b) {
    return x < 0 ? neg_i(x, 0) : x;
}
static double exp_f(double x, double b) {
    return exp(x);
}
static double log_f(double x, double b) {
    return log(x);
}
static double sqrt_f(double x, double b) {
    return sqrt(x);
}
static double rsqrt_f(double x, double b) {
    return 1.0 / sqrt(x);
}
static double tanh_f(double x, double b) {
    return tanh(x);
}
static double sigmoid_f(double x, double b) {
    return 1.0 / (1.0 + exp(-x));
}
static double relu_f(double x, double b) {
    return isnan(x) ? x : x > 0.0 ? x : 0.0;
}
static int64_t relu_i(int64_t x, int64_t b) {
    return x > 0 ? x : 0;
}
static double gelu_f(double x, double b) {
    return 0.5 * x * (1.0 + erf(x / M_SQRT2));
}
static double gelu_tanh_f(double x, double b) {
    double u = LOOM_IR_GELU_TANH_C * (x + LOOM_IR_GELU_TANH_K * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}
static double isfinite_f(double x, double b) {
    return isfinite(x) ? 1.0 : 0.0;
}

static double add_f(double a, double b) {
    return a + b;
}
static int64_t add_i(int64_t a, int64_t b) {
    return wrap((uint64_t)a + (uint64_t)b);
}
static double sub_f(double a, double b) {
    return a - b;
}
static int64_t sub_i(int64_t a, int64_t b) {
    return wrap((uint64_t)a - (uint64_t)b);
}
static double mul_f(double a, double b) {
    return a * b;
}
static int64_t mul_i(int64_t a, int64_t b) {
    return wrap((uint64_t)a * (uint64_t)b);
}
static double div_f(double a, double b) {
    return a / b;
}
/* Truncates toward zero. x / 0 is 0 and INT_MIN / -1 wraps to INT_MIN: no SIGFPE, ever
 * (i32's INT32_MIN / -1 is 2^31 in int64, which wraps to INT32_MIN when stored). */
static int64_t div_i(int64_t a, int64_t b) {
    if (b == 0)
        return 0;
    if (b == -1)
        return neg_i(a, 0);
    return a / b;
}
static double pow_f(double a, double b) {
    return pow(a, b);
}
/* NaN-propagating, as torch.maximum/minimum; +0 is greater than -0. */
static double maximum_f(double a, double b) {
    if (isnan(a) || isnan(b))
        return isnan(a) ? a : b;
    if (a != b)
        return a > b ? a : b;
    return signbit(a) ? b : a;
}
static int64_t maximum_i(int64_t a, int64_t b) {
    return a > b ? a : b;
}
static double minimum_f(double a, double b) {
    if (isnan(a) || isnan(b))
        return isnan(a) ? a : b;
    if (a != b)
        return a < b ? a : b;
    return signbit(a) ? a : b;
}
static int64_t minimum_i(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* C semantics: every comparison with NaN is false except !=. */
static double eq_f(double a, double b) {
    return a == b;
}
static int64_t eq_i(int64_t a, int64_t b) {
    return a == b;
}
static double ne_f(double a, double b) {
    return a != b;
}
static int64_t ne_i(int64_t a, int64_t b) {
    return a != b;
}
static double lt_f(double a, double b) {
    return a < b;
}
static int64_t lt_i(int64_t a, int64_t b) {
    return a < b;
}
static double le_f(double a, double b) {
    return a <= b;
}
static int64_t le_i(int64_t a, int64_t b) {
    return a <= b;
}
static double gt_f(double a, double b) {
    return a > b;
}
static int64_t gt_i(int64_t a, int64_t b) {
    return a > b;
}
static double ge_f(double a, double b) {
    return a >= b;
}
static int64_t ge_i(int64_t a, int64_t b) {
    return a >= b;
}

loom_ir_scalar_f64_fn loom_ir_scalar_rule_f64(loom_ir_op op) {
    switch (op) {
    case LOOM_IR_OP_NEG: return neg_f;
    case LOOM_IR_OP_ABS: return abs_f;
    case LOOM_IR_OP_EXP: return exp_f;
    case LOOM_IR_OP_LOG: return log_f;
    case LOOM_IR_OP_SQRT: return sqrt_f;
    case LOOM_IR_OP_RSQRT: return rsqrt_f;
    case LOOM_IR_OP_TANH: return tanh_f;
    case LOOM_IR_OP_SIGMOID: return sigmoid_f;
    case LOOM_IR_OP_RELU: return relu_f;
    case LOOM_IR_OP_GELU: return gelu_f;
    case LOOM_IR_OP_GELU_TANH: return gelu_tanh_f;
    case LOOM_IR_OP_ISFINITE: return isfinite_f;
    case LOOM_IR_OP_ADD: return add_f;
    case LOOM_IR_OP_SUB: return sub_f;
    case LOOM_IR_OP_MUL: return mul_f;
    case LOOM_IR_OP_DIV: return div_f;
    case LOOM_IR_OP_POW: return pow_f;
    case LOOM_IR_OP_MAXIMUM: return maximum_f;
    case LOOM_IR_OP_MINIMUM: return minimum_f;
    case LOOM_IR_OP_EQ: return eq_f;
    case LOOM_IR_OP_NE: return ne_f;
    case LOOM_IR_OP_LT: return lt_f;
    case LOOM_IR_OP_LE: return le_f;
    case LOOM_IR_OP_GT: return gt_f;
    case LOOM_IR_OP_GE: return ge_f;
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_SELECT: /* moves its operand's bytes: nothing to compute */
    case LOOM_IR_OP_CAST:   /* a load in one dtype and a store in another */
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_RESHAPE:
    case LOOM_IR_OP_TRANSPOSE:
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
    case LOOM_IR_OP_MATMUL:
    case LOOM_IR_OP_SLICE: /* index maps: nothing to compute per element */
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA: /* computed from the index, not from operands */
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_ALL_REDUCE: /* across ranks, not per element */
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_CONV2D: /* a contraction over a window */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
    case LOOM_IR_OP_MAX_POOL2D: /* a max over a window */
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
    case LOOM_IR_OP_GATHER: /* reads at indices from a tensor */
    case LOOM_IR_OP_SCATTER_ADD:
    case LOOM_IR_OP_ATTENTION: /* contractions with a softmax */
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V:
    case LOOM_IR_OP_COUNT_: break;
    }
    return NULL;
}

loom_ir_scalar_i64_fn loom_ir_scalar_rule_i64(loom_ir_op op) {
    switch (op) {
    case LOOM_IR_OP_NEG: return neg_i;
    case LOOM_IR_OP_ABS: return abs_i;
    case LOOM_IR_OP_RELU: return relu_i;
    case LOOM_IR_OP_ADD: return add_i;
    case LOOM_IR_OP_SUB: return sub_i;
    case LOOM_IR_OP_MUL: return mul_i;
    case LOOM_IR_OP_DIV: return div_i;
    case LOOM_IR_OP_MAXIMUM: return maximum_i;
    case LOOM_IR_OP_MINIMUM: return minimum_i;
    case LOOM_IR_OP_EQ: return eq_i;
    case LOOM_IR_OP_NE: return ne_i;
    case LOOM_IR_OP_LT: return lt_i;
    case LOOM_IR_OP_LE: return le_i;
    case LOOM_IR_OP_GT: return gt_i;
    case LOOM_IR_OP_GE: return ge_i;
    case LOOM_IR_OP_EXP: /* float-only ops (LOOM_IR_DT_FLOAT) */
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_GELU:
    case LOOM_IR_OP_GELU_TANH:
    case LOOM_IR_OP_ISFINITE:
    case LOOM_IR_OP_POW:
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_SELECT:
    case LOOM_IR_OP_CAST:
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_RESHAPE:
    case LOOM_IR_OP_TRANSPOSE:
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
    case LOOM_IR_OP_MATMUL:
    case LOOM_IR_OP_SLICE: /* index maps: nothing to compute per element */
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA: /* computed from the index, not from operands */
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_ALL_REDUCE: /* across ranks, not per element */
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_CONV2D: /* a contraction over a window */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
    case LOOM_IR_OP_MAX_POOL2D: /* a max over a window */
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
    case LOOM_IR_OP_GATHER: /* reads at indices from a tensor */
    case LOOM_IR_OP_SCATTER_ADD:
    case LOOM_IR_OP_ATTENTION: /* contractions with a softmax */
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V:
    case LOOM_IR_OP_COUNT_: break;
    }
    return NULL;
}

double loom_ir_rand_uniform(int64_t seed, int64_t i) {
    uint64_t z = (uint64_t)seed + ((uint64_t)i + 1u) * LOOM_IR_RAND_GAMMA;
    z = (z ^ (z >> LOOM_IR_RAND_S1)) * LOOM_IR_RAND_M1;
    z = (z ^ (z >> LOOM_IR_RAND_S2)) * LOOM_IR_RAND_M2;
    z ^= z >> LOOM_IR_RAND_S3;
    return ldexp((double)(z >> (64 - LOOM_IR_RAND_BITS)), -LOOM_IR_RAND_BITS);
}
