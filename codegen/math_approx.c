/* Vectorizable f32 math: exp, log, tanh, sigmoid and gelu as polynomial approximations
 * built from arith ops. Calls to libm would keep LLVM's loop vectorizer from widening the
 * loops they sit in (TOOLCHAIN.md: ~7 GB/s scalar exp), so nothing here calls anything.
 *
 * exp and log are Cephes' expf/logf (range reduction by ln 2 split into an exact high part
 * and a small low part, minimax polynomials); tanh is Cephes' tanhf. The erf/erfc
 * polynomials for gelu are Chebyshev fits made for Loom (mpmath, 40 digits):
 *   erf(z) = z * P(z^2)                        on [0, 0.75]      rel. error 1.5e-9
 *   erfc(z) = exp(-z^2) * Q(1 / (1 + z))      on [0.75, 10.5]   rel. error 6e-9
 * Accuracy measured against double libm over dense sweeps of the f32 range is stated in
 * cg_internal.h. Every approximation keeps libm's NaN and infinity behaviour: NaN inputs
 * are passed through by a final select, so intermediate poison (fptosi of NaN) never
 * reaches a result. */
#include <math.h>

#include "cg_internal.h"

#define ADD(x, y) cg_bin(b, "arith.addf", (x), (y))
#define SUB(x, y) cg_bin(b, "arith.subf", (x), (y))
#define MUL(x, y) cg_bin(b, "arith.mulf", (x), (y))
#define DIV(x, y) cg_bin(b, "arith.divf", (x), (y))
#define K(v) cg_cf(b, b->f32, (v))

/* A constant of type t (f32 or i32, or a vector of them: splat), and the type of t's shape
 * with elements e. */
static MlirValue const_like(cg_b *b, MlirType t, double v) {
    if (!mlirTypeIsAVector(t))
        return mlirTypeIsAFloat(t) ? cg_cf(b, t, v) : cg_ci(b, t, (int64_t)v);
    MlirType e = mlirShapedTypeGetElementType(t);
    return cg_vbroadcast(b, mlirTypeIsAFloat(e) ? cg_cf(b, e, v) : cg_ci(b, e, (int64_t)v), t);
}

static MlirType shaped_like(MlirType t, MlirType e) {
    return mlirTypeIsAVector(t) ? cg_vec_t(mlirShapedTypeGetDimSize(t, 0), e) : e;
}

static MlirValue cmpf_like(cg_b *b, cg_fpred p, MlirValue x, MlirValue y) {
    return mlirTypeIsAVector(mlirValueGetType(x)) ? cg_vcmpf(b, p, x, y) : cg_cmpf(b, p, x, y);
}

/* Polynomials by Horner's rule, each step one fma where the host has it (fewer
 * instructions, and at least as accurate as a rounded product and sum); x a scalar or a
 * vector. */
static MlirValue horner(cg_b *b, MlirValue x, int n, const double *c) {
    MlirType t = mlirValueGetType(x);
    MlirValue p = const_like(b, t, c[0]);
    for (int i = 1; i < n; i++)
        p = cg_muladd(b, p, x, const_like(b, t, c[i]));
    return p;
}

/* The rounding error of hi = x * x, exactly: x * x == hi + lo. An fma where there is one,
 * else Dekker's product of x split in two 12-bit halves (each partial product exact). */
static MlirValue square_lo(cg_b *b, MlirValue x, MlirValue hi) {
    if (b->fma)
        return cg_fma(b, x, x, cg_un(b, "arith.negf", hi));
    MlirValue bits = cg_conv(b, "arith.bitcast", x, b->i32);
    bits = cg_bin(b, "arith.andi", bits, cg_ci(b, b->i32, (int32_t)0xfffff000u));
    MlirValue xh = cg_conv(b, "arith.bitcast", bits, b->f32);
    MlirValue xl = SUB(x, xh);
    MlirValue lo = SUB(MUL(xh, xh), hi);
    lo = ADD(lo, MUL(K(2.0), MUL(xh, xl)));
    return ADD(lo, MUL(xl, xl));
}

/* 2^n for an i32 n in [-126, 127] (or a vector of them), as a float. */
static MlirValue pow2i(cg_b *b, MlirValue n) {
    MlirType t = mlirValueGetType(n);
    MlirValue e = cg_bin(b, "arith.addi", n, const_like(b, t, 127));
    e = cg_bin(b, "arith.shli", e, const_like(b, t, 23));
    return cg_conv(b, "arith.bitcast", e, shaped_like(t, b->f32));
}

static MlirValue pass_nan(cg_b *b, MlirValue x, MlirValue res) {
    return cg_select(b, cmpf_like(b, CG_F_UNO, x, x), x, res);
}

MlirValue cg_exp_f32(cg_b *b, MlirValue x) {
    static const double P[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                               4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
    /* Clamped so that n = round(x / ln 2) stays in [-150, 128]: beyond, the result is inf
     * or 0 anyway, and 2^n below splits into two normal factors (subnormal results). */
    MlirType t = mlirValueGetType(x); /* f32, or a vector of f32 */
#define KT(v) const_like(b, t, (v))
    MlirValue xc = cg_select(b, cmpf_like(b, CG_F_OGT, x, KT(89.0)), KT(89.0), x);
    xc = cg_select(b, cmpf_like(b, CG_F_OLT, xc, KT(-104.0)), KT(-104.0), xc);
    /* round to nearest even by adding and removing 1.5 * 2^23 (exact for |t| < 2^22) */
    MlirValue magic = KT(12582912.0);
    MlirValue nf = SUB(ADD(MUL(xc, KT(1.44269504088896341)), magic), magic);
    /* r = x - n ln2 in two steps; n * 0.693359375 is exact (the constant has 9 bits) */
    MlirValue r = cg_muladd(b, nf, KT(-0.693359375), xc);
    r = cg_muladd(b, nf, KT(2.12194440e-4), r);
    MlirValue z = MUL(r, r);
    MlirValue p = horner(b, r, 6, P);
    p = ADD(cg_muladd(b, p, z, r), KT(1.0));
#undef KT
    MlirType it = shaped_like(t, b->i32);
    MlirValue n = cg_conv(b, "arith.fptosi", nf, it);
    MlirValue n1 = cg_bin(b, "arith.shrsi", n, const_like(b, it, 1));
    MlirValue n2 = cg_bin(b, "arith.subi", n, n1);
    MlirValue res = MUL(MUL(p, pow2i(b, n1)), pow2i(b, n2));
    return pass_nan(b, x, res);
}

MlirValue cg_log_f32(cg_b *b, MlirValue x) {
    static const double P[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                               -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                               2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
    MlirType i32 = b->i32;
    /* subnormals: scale by 2^23 first so the exponent field is meaningful */
    MlirValue sub = cg_cmpf(b, CG_F_OLT, x, K(1.17549435e-38));
    MlirValue xs = cg_select(b, sub, MUL(x, K(8388608.0)), x);
    MlirValue u = cg_conv(b, "arith.bitcast", xs, i32);
    MlirValue e = cg_bin(b, "arith.shrui", u, cg_ci(b, i32, 23));
    e = cg_bin(b, "arith.andi", e, cg_ci(b, i32, 0xff));
    e = cg_bin(b, "arith.subi", e, cg_ci(b, i32, 126));
    e = cg_select(b, sub, cg_bin(b, "arith.subi", e, cg_ci(b, i32, 23)), e);
    /* mantissa in [0.5, 1) */
    MlirValue mb = cg_bin(b, "arith.andi", u, cg_ci(b, i32, (int32_t)0x807fffff));
    mb = cg_bin(b, "arith.ori", mb, cg_ci(b, i32, 0x3f000000));
    MlirValue m = cg_conv(b, "arith.bitcast", mb, b->f32);
    MlirValue lt = cg_cmpf(b, CG_F_OLT, m, K(0.707106781186547524));
    e = cg_select(b, lt, cg_bin(b, "arith.subi", e, cg_ci(b, i32, 1)), e);
    MlirValue xm = cg_select(b, lt, SUB(ADD(m, m), K(1.0)), SUB(m, K(1.0)));
    MlirValue fe = cg_conv(b, "arith.sitofp", e, b->f32);
    MlirValue z = MUL(xm, xm);
    MlirValue y = MUL(MUL(horner(b, xm, 9, P), xm), z);
    y = ADD(y, MUL(fe, K(-2.12194440e-4)));
    y = SUB(y, MUL(K(0.5), z));
    MlirValue res = ADD(ADD(xm, y), MUL(fe, K(0.693359375)));
    res = cg_select(b, cg_cmpf(b, CG_F_OEQ, x, K(INFINITY)), K(INFINITY), res);
    res = cg_select(b, cg_cmpf(b, CG_F_OEQ, x, K(0.0)), K(-INFINITY), res);
    res = cg_select(b, cg_cmpf(b, CG_F_OLT, x, K(0.0)), K(NAN), res);
    return pass_nan(b, x, res);
}

MlirValue cg_tanh_f32(cg_b *b, MlirValue x) {
    static const double P[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                               1.33314422036E-1, -3.33332819422E-1};
    MlirValue a = cg_un(b, "math.absf", x);
    MlirValue s = MUL(x, x);
    MlirValue small = ADD(MUL(MUL(horner(b, s, 5, P), s), x), x);
    /* |x| >= 0.625: 1 - 2 / (exp(2|x|) + 1), which saturates to 1 once exp overflows */
    MlirValue e = cg_exp_f32(b, ADD(a, a));
    MlirValue big = SUB(K(1.0), DIV(K(2.0), ADD(e, K(1.0))));
    big = cg_bin(b, "math.copysign", big, x);
    return cg_select(b, cg_cmpf(b, CG_F_OLT, a, K(0.625)), small, big);
}

MlirValue cg_sigmoid_f32(cg_b *b, MlirValue x) {
    /* exp(-|x|) never overflows, and e / (1 + e) keeps full relative accuracy for the
     * tiny results of very negative x (1 / (1 + exp(-x)) would give 0 there). */
    MlirValue e = cg_exp_f32(b, cg_un(b, "arith.negf", cg_un(b, "math.absf", x)));
    MlirValue d = DIV(K(1.0), ADD(K(1.0), e));
    return cg_select(b, cg_cmpf(b, CG_F_OGE, x, K(0.0)), d, MUL(e, d));
}

MlirValue cg_gelu_f32(cg_b *b, MlirValue x) {
    static const double ERF[] = {-0.000675647956868, 0.00511533211253, -0.0268351145686,
                                 0.112833865384,     -0.376126194694,  1.12837916558};
    static const double ERFC[] = {2.64617296732, -11.753540283, 22.8339099389,  -24.747690777,
                                  15.3811540144, -4.6406942244, 0.298377878804, -0.437223315895,
                                  0.29845663805, 0.56306775165, 0.564234521171, -7.95271065467e-7};
    MlirValue a = cg_un(b, "math.absf", x);
    MlirValue z = MUL(a, K(0.707106781186547524));
    /* small |x|: 0.5 x (1 + erf(x / sqrt 2)) */
    MlirValue erfz = MUL(z, horner(b, MUL(z, z), 6, ERF));
    erfz = cg_bin(b, "math.copysign", erfz, x);
    MlirValue small = MUL(MUL(K(0.5), x), ADD(K(1.0), erfz));
    /* large |x|: through erfc, which has no cancellation for negative x. exp(-x^2 / 2) is
     * taken from x^2 split exactly into hi + lo (fma), since rounding x^2 alone would cost
     * x^2 * 2^-24 of relative accuracy. */
    MlirValue zc = cg_select(b, cg_cmpf(b, CG_F_OGT, z, K(10.5)), K(10.5), z);
    MlirValue q = horner(b, DIV(K(1.0), ADD(K(1.0), zc)), 12, ERFC);
    MlirValue xa = cg_select(b, cg_cmpf(b, CG_F_OGT, a, K(15.0)), K(15.0), a);
    MlirValue hi = MUL(xa, xa);
    MlirValue lo = square_lo(b, xa, hi);
    MlirValue ex = MUL(cg_exp_f32(b, MUL(K(-0.5), hi)), SUB(K(1.0), MUL(K(0.5), lo)));
    MlirValue erfc = MUL(ex, q);
    MlirValue pos = MUL(x, SUB(K(1.0), MUL(K(0.5), erfc)));
    MlirValue neg = MUL(MUL(K(0.5), x), erfc);
    MlirValue big = cg_select(b, cg_cmpf(b, CG_F_OGT, x, K(0.0)), pos, neg);
    return cg_select(b, cg_cmpf(b, CG_F_OLT, z, K(0.75)), small, big);
}
