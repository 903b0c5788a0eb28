/* The epilogue of a convolution's block (lower_conv.c, conv_winograd.c, conv_taps.c): C's
 * values through the root's fused sinks, the weight gradient's stored alone by transposes. */
#include "conv_internal.h"

/* dw[g Og + o, i] = C (i - i0, o - c0) rounded to the root's dtype, for i in [ia, ib) and
 * o - c0 in [oa, ob), one by one. */
static void store_dw_scalar(kc *c, const cv_plan *cp, MlirValue cs, MlirValue dw, MlirValue g,
                            MlirValue i0, MlirValue ia, MlirValue ib, MlirValue c0, MlirValue oa,
                            MlirValue ob) {
    cg_b *b = c->b;
    cg_for lo, li;
    cg_for_begin(b, &lo, oa, ob, 0, NULL);
    MlirValue drow =
        cg_imul_c(b, cg_iadd(b, cg_iadd(b, cg_imul_c(b, g, cp->Og), c0), lo.iv), cp->M);
    cg_for_begin(b, &li, ia, ib, 0, NULL);
    MlirValue v = cg_load(b, cs, cg_iadd(b, cg_imul_c(b, isub(b, li.iv, i0), cp->mk.nbp), lo.iv));
    cg_store_val(b, cp->dt, is_16(cp->dt) ? cg_round16(b, cp->dt, v) : v, dw,
                 cg_iadd(b, drow, li.iv));
    cg_for_end(b, &li, 0, NULL);
    cg_for_end(b, &lo, 0, NULL);
}

/* The weight gradient's block stored alone (no fused op reads it): C's 16 x 16 blocks
 * transposed in registers and stored 16 rows of dw at a time (the generic epilogue reads C
 * down its columns, one element at a time), the edges one by one. */
static void store_dw(kc *c, const cv_plan *cp, MlirValue cs, MlirValue g, MlirValue i0,
                     MlirValue i1, MlirValue c0, MlirValue c1) {
    cg_b *b = c->b;
    MlirValue dw = c->bufs[c->s->res_of[c->k->root]], z = cg_idx(b, 0);
    MlirType vf = cg_vec_t(16, b->f32);
    MlirValue nr = isub(b, i1, i0), nc = isub(b, c1, c0);
    MlirValue nr16 = cg_imul_c(b, idiv(b, nr, 16), 16), nc16 = cg_imul_c(b, idiv(b, nc, 16), 16);
    cg_for lob, lib;
    cg_for_begin(b, &lob, z, idiv(b, nc, 16), 0, NULL);
    MlirValue o16 = cg_imul_c(b, lob.iv, 16);
    MlirValue drow = cg_imul_c(b, cg_iadd(b, cg_iadd(b, cg_imul_c(b, g, cp->Og), c0), o16), cp->M);
    cg_for_begin(b, &lib, z, idiv(b, nr, 16), 0, NULL);
    MlirValue r16 = cg_imul_c(b, lib.iv, 16), v[16];
    MlirValue from = cg_iadd(b, cg_imul_c(b, r16, cp->mk.nbp), o16);
    for (int t = 0; t < 16; t++)
        v[t] = cg_vload(b, vf, cs, cg_iadd(b, from, cg_idx(b, t * cp->mk.nbp)));
    cg_vtranspose16(b, v);
    MlirValue to = cg_iadd(b, drow, cg_iadd(b, i0, r16));
    for (int t = 0; t < 16; t++) {
        MlirValue x = is_16(cp->dt) ? cg_narrow16(b, cp->dt, cg_round16(b, cp->dt, v[t])) : v[t];
        cg_vstore(b, x, dw, cg_iadd(b, to, cg_idx(b, t * cp->M)));
    }
    cg_for_end(b, &lib, 0, NULL);
    /* the block's last rows, past the whole 16s */
    store_dw_scalar(c, cp, cs, dw, g, i0, cg_iadd(b, i0, nr16), i1, c0, o16,
                    cg_iadd(b, o16, cg_idx(b, 16)));
    cg_for_end(b, &lob, 0, NULL);
    store_dw_scalar(c, cp, cs, dw, g, i0, i0, i1, c0, nc16, nc); /* the last columns */
}

/* Whether the root's own store is the whole epilogue (store_dw). */
static bool root_stored_alone(const kc *c, const cv_plan *cp) {
    return cp->n_epi == 1 && cp->epi[0].node == c->k->root && cp->epi[0].store;
}

/* One element of conv2d's or the input gradient's epilogue at the nest indices set: the
 * root's value C (cs[at]) rounded to its dtype, or 0 where no tap reaches (`taps` false),
 * through the fused sinks. */
static loom_status emit_element(kc *c, const cv_plan *cp, MlirValue cs, MlirValue at, bool taps) {
    cg_b *b = c->b;
    MlirValue acc = taps ? cg_load(b, cs, at) : cg_cf(b, b->f32, 0.0);
    c->bound_v = is_16(cp->dt) ? cg_round16(b, cp->dt, acc) : acc;
    return cg_emit_sinks(c, cp->n_epi, cp->epi);
}

int64_t cv_row_len(const cv_plan *cp, int64_t nw) {
    return nw == 2 && cp->phased && cp->pst[1] == 2 ? 2 * ((cp->dW + 15) / 16 * 16) : 0;
}

/* Two phases' C rows (cs[0] and cs[1] from at, dW values each; NULL: zeros) interleaved into
 * row[0, 2 dW) by vectors of 16, so that the epilogue reads its destination row's pixels in
 * order. Element by element, with the zeros or the other phase's values between, LLVM left
 * the loop scalar: a quarter of the samples of ResNet-50's layer3 downsample input gradient
 * (bf16, 224x224, residual add and ReLU mask fused), whose kernel this makes 11% faster on a
 * Zen 4 (one thread, 13.3-13.7 -> 11.7-12.2 ms). Writes whole vectors up to cv_row_len. */
static void interleave_row(cg_b *b, const cv_plan *cp, const MlirValue *cs, MlirValue at,
                           MlirValue row) {
    MlirType vf = cg_vec_t(16, b->f32);
    MlirValue zero = cg_vbroadcast(b, cg_cf(b, b->f32, 0.0), vf);
    int64_t lo[16], hi[16];
    for (int l = 0; l < 8; l++) {
        lo[2 * l] = l, lo[2 * l + 1] = 16 + l;
        hi[2 * l] = 8 + l, hi[2 * l + 1] = 24 + l;
    }
    for (int64_t q = 0; q < cp->dW; q += 16) {
        int64_t n = cp->dW - q < 16 ? cp->dW - q : 16;
        MlirValue v[2], from = cg_iadd(b, at, cg_idx(b, q));
        for (int p = 0; p < 2; p++)
            v[p] = mlirValueIsNull(cs[p]) ? zero
                   : n == 16              ? cg_vload(b, vf, cs[p], from)
                                          : cg_vmaskload(b, vf, cs[p], from, cv_first_lanes(b, n));
        cg_vstore(b, cg_vshuffle(b, v[0], v[1], 16, lo), row, cg_idx(b, 2 * q));
        cg_vstore(b, cg_vshuffle(b, v[0], v[1], 16, hi), row, cg_idx(b, 2 * q + 16));
    }
}

/* The epilogue of a task's block: C's element (i, column) is the root's element at the
 * nest indices set here; the fused sinks evaluate and store from it. C is cs[0], NULL where
 * no tap reaches the block (zeros); but where the epilogue writes every phase along W of a
 * destination row (nw = st[1] > 1: cp->spread, or the phases run side by side), cs[b] is
 * phase b's, of the same layout, or NULL; two of them go through row (interleave_row)
 * where it is not NULL. */
loom_status cv_emit_epilogue(kc *c, const cv_plan *cp, const MlirValue *cs, int64_t nw,
                             MlirValue row, MlirValue g, MlirValue i0, MlirValue i1, MlirValue c0,
                             MlirValue c1) {
    cg_b *b = c->b;
    if (cp->role == CV_GRAD_WEIGHT && root_stored_alone(c, cp)) {
        store_dw(c, cp, cs[0], g, i0, i1, c0, c1);
        return LOOM_OK;
    }
    const nest *ns = &cp->ns;
    loom_status st = LOOM_OK;
    c->ns = ns;
    cg_clear_gv(c);
#define SET_DIM(d, v)                                                                              \
    do {                                                                                           \
        if (ns->dim_group[d] >= 0)                                                                 \
            c->gv[ns->dim_group[d]] = (v);                                                         \
    } while (0)
    cg_for li, lr, lq;
    if (cp->role == CV_GRAD_WEIGHT) {
        /* C (i, o) = dw [g Og + o, c, kh, kw] for i = (c, kh, kw): o outer, so that dw is
         * written in order (the other way round each store would be a page away); the row
         * blocks are whole channels */
        cg_for lc, lh, lw;
        MlirValue ch0 = idiv(b, i0, cp->KK);
        cg_for_begin(b, &lq, c0, c1, 0, NULL);
        SET_DIM(0, cg_iadd(b, cg_imul_c(b, g, cp->Og), lq.iv));
        MlirValue col = isub(b, lq.iv, c0);
        cg_for_begin(b, &lc, ch0, idiv(b, i1, cp->KK), 0, NULL);
        SET_DIM(1, lc.iv);
        MlirValue crow = cg_imul_c(b, isub(b, lc.iv, ch0), cp->KK);
        cg_for_begin(b, &lh, cg_idx(b, 0), cg_idx(b, cp->KH), 0, NULL);
        SET_DIM(2, lh.iv);
        MlirValue hrow = cg_iadd(b, crow, cg_imul_c(b, lh.iv, cp->KW));
        cg_for_begin(b, &lw, cg_idx(b, 0), cg_idx(b, cp->KW), 0, NULL);
        SET_DIM(3, lw.iv);
        MlirValue at = cg_iadd(b, cg_imul_c(b, cg_iadd(b, hrow, lw.iv), cp->mk.nbp), col);
        MlirValue acc = cg_load(b, cs[0], at);
        c->bound_v = is_16(cp->dt) ? cg_round16(b, cp->dt, acc) : acc;
        st = cg_emit_sinks(c, cp->n_epi, cp->epi);
        cg_for_end(b, &lw, 0, NULL);
        cg_for_end(b, &lh, 0, NULL);
        cg_for_end(b, &lc, 0, NULL);
        cg_for_end(b, &lq, 0, NULL);
    } else { /* (i, (n, y, q)) of [N, M G, dH, dW] */
        cg_for_begin(b, &li, i0, i1, 0, NULL);
        MlirValue crow = cg_imul_c(b, isub(b, li.iv, i0), cp->mk.nbp);
        SET_DIM(1, cg_iadd(b, cg_imul_c(b, g, cp->M), li.iv));
        if (cp->flat) { /* (n, (y, q)): a task's pixels of one image in one loop */
            cg_for ln;
            /* the images the rows [c0, c1) of (n, y) reach, and in each its rows [ra, rb) */
            cg_for_begin(b, &ln, idiv(b, c0, cp->dH),
                         idiv(b, cg_iadd(b, c1, cg_idx(b, cp->dH - 1)), cp->dH), 0, NULL);
            SET_DIM(0, ln.iv);
            MlirValue first = cg_imul_c(b, ln.iv, cp->dH);
            MlirValue ra = imax_s(b, c0, first);
            MlirValue rb = imin_s(b, c1, cg_iadd(b, first, cg_idx(b, cp->dH)));
            MlirValue pa = cg_imul_c(b, isub(b, ra, first), cp->dW);
            MlirValue pb = cg_imul_c(b, isub(b, rb, first), cp->dW);
            /* C's column of pixel p of the image: (ra - c0) dW + p - pa */
            MlirValue at = isub(b, cg_iadd(b, crow, cg_imul_c(b, isub(b, ra, c0), cp->dW)), pa);
            cg_for_begin(b, &lq, pa, pb, 0, NULL);
            SET_DIM(3, lq.iv); /* y and q's group: y dW + q */
            st = emit_element(c, cp, cs[0], cg_iadd(b, at, lq.iv), !mlirValueIsNull(cs[0]));
            cg_for_end(b, &lq, 0, NULL);
            cg_for_end(b, &ln, 0, NULL);
        } else { /* ((n, y), q) row by row */
            cg_for_begin(b, &lr, c0, c1, 0, NULL);
            SET_DIM(0, idiv(b, lr.iv, cp->dH));
            MlirValue y = irem(b, lr.iv, cp->dH);
            MlirValue at = cg_iadd(b, crow, cg_imul_c(b, isub(b, lr.iv, c0), cp->dW));
            /* spread: destination rows y st + a and, in each, pixels q st + b for every phase
             * (a, b), so the epilogue reads and writes whole rows; side by side, the row of
             * the phases' own a and its pixels of every b; else the phase's own */
            int64_t na = cp->spread ? cp->st[0] : 1;
            for (int64_t a = 0; a < na && st == LOOM_OK; a++) {
                int64_t ya = cp->spread ? a : cp->ph[0];
                SET_DIM(2, cp->phased ? cg_iadd(b, cg_imul_c(b, y, cp->pst[0]), cg_idx(b, ya)) : y);
                if (ya != cp->ph[0]) { /* a row without taps: zeros through the epilogue */
                    cg_for_begin(b, &lq, cg_idx(b, 0), cg_idx(b, cp->dW * cp->st[1]), 0, NULL);
                    SET_DIM(3, lq.iv);
                    st = emit_element(c, cp, cs[0], at, false);
                    cg_for_end(b, &lq, 0, NULL);
                    continue;
                }
                /* both phases' pixels in order, from row */
                if (!mlirValueIsNull(row) && cv_row_len(cp, nw) > 0) {
                    interleave_row(b, cp, cs, at, row);
                    cg_for_begin(b, &lq, cg_idx(b, 0), cg_idx(b, 2 * cp->dW), 0, NULL);
                    SET_DIM(3, lq.iv);
                    st = emit_element(c, cp, row, lq.iv, true);
                    cg_for_end(b, &lq, 0, NULL);
                    continue;
                }
                cg_for_begin(b, &lq, cg_idx(b, 0), cg_idx(b, cp->dW), 0, NULL);
                for (int64_t bb = 0; bb < nw && st == LOOM_OK; bb++) {
                    int64_t xb = nw > 1 ? bb : cp->ph[1];
                    SET_DIM(3, cp->phased
                                   ? cg_iadd(b, cg_imul_c(b, lq.iv, cp->pst[1]), cg_idx(b, xb))
                                   : lq.iv);
                    /* a phase no tap reaches is zero (its C never written) */
                    st = emit_element(c, cp, cs[bb], cg_iadd(b, at, lq.iv),
                                      !mlirValueIsNull(cs[bb]));
                }
                cg_for_end(b, &lq, 0, NULL);
            }
            cg_for_end(b, &lr, 0, NULL);
        }
        cg_for_end(b, &li, 0, NULL);
    }
#undef SET_DIM
    return st;
}
