/* The packed microkernel of 16-bit and large f32 matmuls (lower_matmul.c) and of the
 * convolutions: C tiles of up to 16 accumulators (loom_cg_mk_acc: 16 on AVX-512, 6 on AVX2)
 * by FMAs or vdpbf16ps, and the bf16 pairs it reads. */
#include "lower_internal.h"

MlirValue cg_bf16_pair(cg_b *b, MlirValue lo, MlirValue hi) {
    MlirType t = mlirValueGetType(lo), it = b->i32;
    if (mlirTypeIsAVector(t))
        it = cg_vec_t(mlirShapedTypeGetDimSize(t, 0), b->i32);
    MlirValue sh = cg_ci(b, b->i32, 16), mask = cg_ci(b, b->i32, (int32_t)0xffff0000u);
    if (mlirTypeIsAVector(t)) {
        sh = cg_vbroadcast(b, sh, it);
        mask = cg_vbroadcast(b, mask, it);
    }
    MlirValue l = cg_bin(b, "arith.shrui", cg_conv(b, "arith.bitcast", lo, it), sh);
    MlirValue h = cg_bin(b, "arith.andi", cg_conv(b, "arith.bitcast", hi, it), mask);
    return cg_bin(b, "arith.ori", l, h);
}

void cg_mk_tiles(kc *c, const cg_mk *m, MlirValue ap, MlirValue a0, MlirValue bp, MlirValue cs,
                 MlirValue mb, MlirValue nb, bool accumulate, MlirValue first,
                 const cg_mk_hook *hook) {
    MlirValue z = cg_idx(c->b, 0);
    cg_mk_tiles_at(c, m, ap, a0, bp, z, cs, z, mb, nb, accumulate, first, hook);
}

void cg_mk_tiles_at(kc *c, const cg_mk *m, MlirValue ap, MlirValue a0, MlirValue bp, MlirValue b0,
                    MlirValue cs, MlirValue cs0, MlirValue mb, MlirValue nb, bool accumulate,
                    MlirValue first, const cg_mk_hook *hook) {
    cg_b *b = c->b;
    enum { NACC = MK_ACC };
    const int64_t MR = m->mr, NV = m->nv, NR = NV * MK_PANEL;
    MlirType vi = cg_vec_t(16, m->pk == 2 ? b->i32 : b->f32), vf = cg_vec_t(16, b->f32);
    MlirValue n_jt = cg_bin(b, "arith.divui", cg_iadd(b, nb, cg_idx(b, NR - 1)), cg_idx(b, NR));
    MlirValue n_it = cg_bin(b, "arith.divui", cg_iadd(b, mb, cg_idx(b, MR - 1)), cg_idx(b, MR));
    cg_for ljt, lit, lk;
    cg_for_begin(b, &ljt, cg_idx(b, 0), n_jt, 0, NULL);
    cg_for_begin(b, &lit, cg_idx(b, 0), n_it, 0, NULL);
    if (hook)
        hook->emit(c, hook->arg, ljt.iv, lit.iv);
    MlirValue zero = cg_vbroadcast(b, cg_cf(b, b->f32, 0.0), vf), init[NACC];
    MlirValue c0 =
        cg_iadd(b, cs0, cg_iadd(b, cg_imul_c(b, lit.iv, MR * m->nbp), cg_imul_c(b, ljt.iv, NR)));
    for (int i = 0; i < NACC; i++)
        init[i] = zero;
    cg_if f;
    if (accumulate && !mlirValueIsNull(first)) { /* zeros in the first chunk, else C */
        MlirType types[NACC];
        for (int i = 0; i < MR * NV; i++)
            types[i] = vf;
        cg_ifv_begin(b, &f, first, (int)(MR * NV), types);
        cg_ifv_else(b, &f, (int)(MR * NV), init);
    }
    for (int i = 0; i < MR && accumulate; i++)
        for (int v = 0; v < NV; v++)
            init[i * NV + v] =
                cg_vload(b, vf, cs, cg_iadd(b, c0, cg_idx(b, i * m->nbp + v * MK_PANEL)));
    if (accumulate && !mlirValueIsNull(first)) {
        cg_ifv_end(b, &f, (int)(MR * NV), init);
        for (int i = 0; i < MR * NV; i++)
            init[i] = cg_if_result(&f, i);
    }
    MlirValue arow0 = cg_iadd(b, a0, cg_imul_c(b, lit.iv, MR * m->kp));
    /* B's element (kk, column 16 pn + l) at kk * ks + pn * ps + l */
    int64_t ks = m->b_ld ? m->b_ld : MK_PANEL, ps = m->b_ld ? MK_PANEL : m->kp * MK_PANEL;
    MlirValue bpan0 = cg_iadd(b, b0, cg_imul_c(b, ljt.iv, NV * ps));
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, m->kp), (int)(MR * NV), init);
    MlirValue bv[2], acc[NACC];
    MlirValue brow = cg_iadd(b, bpan0, cg_imul_c(b, lk.iv, ks));
    for (int v = 0; v < NV; v++)
        bv[v] = cg_vload(b, vi, bp, cg_iadd(b, brow, cg_idx(b, v * ps)));
    for (int i = 0; i < MR; i++) {
        MlirValue a = cg_load(b, ap, cg_iadd(b, arow0, cg_iadd(b, lk.iv, cg_idx(b, i * m->kp))));
        MlirValue av = cg_vbroadcast(b, a, vi);
        for (int v = 0; v < NV; v++)
            acc[i * NV + v] = m->pk == 2 ? cg_dpbf16(b, lk.iter[i * NV + v], av, bv[v])
                                         : cg_fma(b, av, bv[v], lk.iter[i * NV + v]);
    }
    cg_for_end(b, &lk, (int)(MR * NV), acc);
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < NV; v++)
            cg_vstore(b, cg_for_result(&lk, i * NV + v), cs,
                      cg_iadd(b, c0, cg_idx(b, i * m->nbp + v * MK_PANEL)));
    cg_for_end(b, &lit, 0, NULL);
    cg_for_end(b, &ljt, 0, NULL);
}
