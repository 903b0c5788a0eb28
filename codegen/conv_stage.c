/* Staging of the direct convolution kernels' operands (lower_conv.c; Winograd's input
 * transform is conv_winograd.c's): each block's window rows read from the activations 16
 * pixels at a time by masked loads (source steps 1 and 2), or copied and gathered element by
 * element (other steps), the weights as A, dy^T for the weight gradient, and the bf16 pairs
 * the vdpbf16ps microkernel reads; and the lane and row helpers the other kernels share. */
#include "conv_internal.h"

/* floor(x / s) for signed x and s > 0 (arith.floordivsi would need the arith-expand pass) */
static MlirValue floordiv_s(cg_b *b, MlirValue x, int64_t s) {
    if (s == 1)
        return x;
    MlirValue z = cg_idx(b, 0);
    MlirValue neg = isub(b, z,
                         cg_bin(b, "arith.divsi", isub(b, cg_idx(b, s - 1), x),
                                cg_idx(b, s))); /* -ceil(-x / s) for x < 0 */
    return cg_select(b, cg_cmpi(b, CG_I_SLT, x, z), neg, cg_bin(b, "arith.divsi", x, cg_idx(b, s)));
}

static MlirValue ceildiv_s(cg_b *b, MlirValue x, int64_t s) {
    MlirValue z = cg_idx(b, 0);
    return isub(b, z, floordiv_s(b, isub(b, z, x), s));
}

void cv_zero_span(cg_b *b, MlirValue zero, MlirValue buf, MlirValue at, MlirValue lo,
                  MlirValue hi) {
    cg_zero_range(b, buf, cg_iadd(b, at, lo), isub(b, hi, lo), zero);
}

/* A phase's offset off[a][k] of tap k along axis a. */
static MlirValue phase_off(cg_b *b, const cv_plan *cp, int a, MlirValue k) {
    MlirValue off = cg_idx(b, cp->off[a][0]);
    for (int64_t t = 1; t < cp->ntap[a]; t++)
        off = cg_select(b, cg_cmpi(b, CG_I_EQ, k, cg_idx(b, t)), cg_idx(b, cp->off[a][t]), off);
    return off;
}

/* The source coordinate along axis a (0: rows, 1: columns) of destination coordinate dst
 * for kernel tap k, and in *ok whether the window reaches a source pixel there. */
static MlirValue src_coord(cg_b *b, const cv_plan *cp, int a, MlirValue dst, MlirValue k,
                           MlirValue *ok) {
    MlirValue z = cg_idx(b, 0);
    int64_t ext = a == 0 ? cp->sH : cp->sW;
    MlirValue s;
    if (cp->phased) { /* s = dst + off[a][k] */
        s = cg_iadd(b, dst, phase_off(b, cp, a, k));
        *ok = and_i1(b, cg_cmpi(b, CG_I_SGE, s, z), cg_cmpi(b, CG_I_SLT, s, cg_idx(b, ext)));
        return s;
    }
    MlirValue e = isub(b, cg_idx(b, cp->pd[a]), cg_imul_c(b, k, cp->dl[a])); /* pad - k dil */
    if (!cp->dst_big) { /* s = dst * stride - e */
        s = isub(b, cg_imul_c(b, dst, cp->st[a]), e);
        *ok = and_i1(b, cg_cmpi(b, CG_I_SGE, s, z), cg_cmpi(b, CG_I_SLT, s, cg_idx(b, ext)));
        return s;
    }
    /* dst = s * stride - e: s = (dst + e) / stride when exact */
    MlirValue num = cg_iadd(b, dst, e);
    s = floordiv_s(b, num, cp->st[a]);
    *ok = and_i1(b, cg_cmpi(b, CG_I_SGE, num, z), cg_cmpi(b, CG_I_SLT, s, cg_idx(b, ext)));
    if (cp->st[a] > 1)
        *ok = and_i1(b, *ok,
                     cg_cmpi(b, CG_I_EQ, cg_bin(b, "arith.remsi", num, cg_idx(b, cp->st[a])), z));
    return s;
}

/* Where window column tap kw reaches along a row of destination pixels: T pixels from
 * column d0 on, every dstep-th, read the source row's columns from s0 on, every sstep-th. */
typedef struct win_span {
    MlirValue T, d0, s0;
    int64_t dstep, sstep;
} win_span;

static win_span row_span(cg_b *b, const cv_plan *cp, MlirValue kw) {
    win_span sp;
    MlirValue z = cg_idx(b, 0), one = cg_idx(b, 1);
    if (cp->phased) { /* source column q + off */
        MlirValue off = phase_off(b, cp, 1, kw);
        sp.d0 = imax_s(b, z, isub(b, z, off));
        MlirValue hi = imin_s(b, cg_idx(b, cp->dW), isub(b, cg_idx(b, cp->sW), off));
        sp.T = imax_s(b, isub(b, hi, sp.d0), z);
        sp.s0 = cg_iadd(b, sp.d0, off);
        sp.dstep = sp.sstep = 1;
        return sp;
    }
    /* along the width: small in [0, SMALL), big in [0, BIG) */
    int64_t SMALL = cp->dst_big ? cp->sW : cp->dW, BIG = cp->dst_big ? cp->dW : cp->sW;
    int64_t s1 = cp->st[1];
    /* e = pad - kw * dil: big = small * s - e */
    MlirValue e = isub(b, cg_idx(b, cp->pd[1]), cg_imul_c(b, kw, cp->dl[1]));
    MlirValue slo = imax_s(b, z, ceildiv_s(b, e, s1));
    MlirValue shi = imin_s(b, cg_idx(b, SMALL),
                           cg_iadd(b, floordiv_s(b, cg_iadd(b, e, cg_idx(b, BIG - 1)), s1), one));
    sp.T = imax_s(b, isub(b, shi, slo), z);
    MlirValue big0 = isub(b, cg_imul_c(b, slo, s1), e);
    sp.d0 = cp->dst_big ? big0 : slo, sp.s0 = cp->dst_big ? slo : big0;
    sp.dstep = cp->dst_big ? s1 : 1, sp.sstep = cp->dst_big ? 1 : s1;
    return sp;
}

/* Stages window rows [j0, j1) x destination pixel rows [r0, r1) of group g into buf (f32):
 * buf[(j - j0) * ld + (r - r0) * dW + q] for q in [0, dW), and zeros in each row from
 * (r1 - r0) * dW up to width (the block's padding). Not for phases. */
void cv_stage_window(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                     MlirValue rtab, MlirValue g, MlirValue j0, MlirValue j1, MlirValue r0,
                     MlirValue r1) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0);
    int64_t s1 = cp->st[1];
    cg_for lj, lr, lt;
    cg_for_begin(b, &lj, j0, j1, 0, NULL);
    MlirValue ch = idiv(b, lj.iv, cp->KK), kk = irem(b, lj.iv, cp->KK);
    MlirValue kh = idiv(b, kk, cp->KW), kw = irem(b, kk, cp->KW);
    win_span sp = row_span(b, cp, kw);
    MlirValue T = sp.T, d0 = sp.d0, s0 = sp.s0;
    int64_t dstep = sp.dstep, sstep = sp.sstep;
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), ch);
    MlirValue jrow = cg_imul_c(b, isub(b, lj.iv, j0), ld), trow = cg_imul_c(b, kh, cp->pix_rows);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    /* the source row, if any (cv_build_rows) */
    MlirValue roff = cg_load(b, rtab, cg_iadd(b, trow, isub(b, lr.iv, r0)));
    MlirValue vok = cg_cmpi(b, CG_I_SGE, roff, cg_ci(b, b->i64, 0));
    MlirValue ok = and_i1(b, vok, cg_cmpi(b, CG_I_SGT, T, z));
    MlirValue at = cg_iadd(b, jrow, cg_imul_c(b, isub(b, lr.iv, r0), cp->dW));
    cg_if fz, fc;
    cg_if_begin(b, &fz, cg_bin(b, "arith.xori", ok, cg_ci(b, b->i1, 1)));
    cv_zero_span(b, zf, buf, at, z, cg_idx(b, cp->dW));
    cg_if_end(b, &fz);
    cg_if_begin(b, &fc, ok);
    if (cp->dst_big && s1 > 1) {
        cv_zero_span(b, zf, buf, at, z, cg_idx(b, cp->dW));
    } else {
        cv_zero_span(b, zf, buf, at, z, d0);
        cv_zero_span(b, zf, buf, at, cg_iadd(b, d0, cg_imul_c(b, T, dstep)), cg_idx(b, cp->dW));
    }
    /* src row (clamped reads never happen: the branch holds only where sy exists) */
    MlirValue srow = cg_iadd(b, cg_conv(b, "arith.index_cast", roff, b->index),
                             cg_imul_c(b, chan, cp->sH * cp->sW));
    MlirValue sat = cg_iadd(b, srow, s0), dat = cg_iadd(b, at, d0);
    cg_for_begin(b, &lt, z, T, 0, NULL);
    MlirValue v = cg_load_val(b, sdt, src, cg_iadd(b, sat, cg_imul_c(b, lt.iv, sstep)));
    cg_store(b, v, buf, cg_iadd(b, dat, cg_imul_c(b, lt.iv, dstep)));
    cg_for_end(b, &lt, 0, NULL);
    cg_if_end(b, &fc);
    cg_for_end(b, &lr, 0, NULL);
    /* the row's padding past the block's pixels */
    MlirValue used = cg_imul_c(b, isub(b, r1, r0), cp->dW);
    cv_zero_span(b, zf, buf, jrow, used, cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* Channels ahead of the one an identity window's run copies whose same pixels it prefetches:
 * a run is a task's pixels of one image (280 at 56x56 in 5 rows), too short for the hardware
 * prefetcher to follow before the copy jumps to the next channel, a plane away, so the copy
 * waited on every line of x from memory. */
enum { RUN_AHEAD = 8 };

/* 16 values of dtype dt at mem[off] as a vector of f32. */
static MlirValue vload_f32(cg_b *b, loom_dtype dt, MlirValue mem, MlirValue off) {
    return cg_widen16(b, dt, cg_vload(b, cg_vec_t(16, cg_storage_type(b, dt)), mem, off));
}

/* An identity window's rows [j0, j1) x pixel rows [r0, r1): channel g wch + j of each image
 * in the block, a contiguous run, copied 16 at a time (converted to f32). */
void cv_stage_runs(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width, MlirValue g,
                   MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0);
    int64_t HW = cp->dH * cp->dW;
    MlirValue P0 = cg_imul_c(b, r0, cp->dW), P1 = cg_imul_c(b, r1, cp->dW);
    cg_for lj, ln, lv, lt;
    cg_for_begin(b, &lj, j0, j1, 0, NULL);
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), lj.iv);
    MlirValue row = cg_imul_c(b, isub(b, lj.iv, j0), ld);
    cg_for_begin(b, &ln, idiv(b, r0, cp->dH),
                 cg_iadd(b, idiv(b, isub(b, r1, cg_idx(b, 1)), cp->dH), cg_idx(b, 1)), 0, NULL);
    MlirValue nHW = cg_imul_c(b, ln.iv, HW);
    MlirValue plo = imax_s(b, P0, nHW), phi = imin_s(b, P1, cg_iadd(b, nHW, cg_idx(b, HW)));
    MlirValue cnt = isub(b, phi, plo), nv = idiv(b, cnt, 16);
    MlirValue from = cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, ln.iv, cp->wC), chan), HW),
                             isub(b, plo, nHW));
    MlirValue to = cg_iadd(b, row, isub(b, plo, P0));
    cg_for_begin(b, &lv, z, nv, 0, NULL);
    MlirValue o16 = cg_imul_c(b, lv.iv, 16);
    cg_prefetch(b, src, cg_iadd(b, cg_iadd(b, from, o16), cg_idx(b, RUN_AHEAD * HW)), false, true);
    cg_vstore(b, vload_f32(b, sdt, src, cg_iadd(b, from, o16)), buf, cg_iadd(b, to, o16));
    cg_for_end(b, &lv, 0, NULL);
    cg_for_begin(b, &lt, cg_imul_c(b, nv, 16), cnt, 0, NULL);
    cg_store(b, cg_load_val(b, sdt, src, cg_iadd(b, from, lt.iv)), buf, cg_iadd(b, to, lt.iv));
    cg_for_end(b, &lt, 0, NULL);
    cg_for_end(b, &ln, 0, NULL);
    cv_zero_span(b, zf, buf, row, isub(b, P1, P0), cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* bf16 values a and hi (i16 bits: scalars, or vectors of 16) as pairs, a in the low halves. */
static MlirValue pair16(cg_b *b, MlirValue a, MlirValue hi) {
    bool vec = mlirTypeIsAVector(mlirValueGetType(a));
    MlirType it = vec ? cg_vec_t(16, b->i32) : b->i32;
    MlirValue sh = cg_ci(b, b->i32, 16);
    if (vec)
        sh = cg_vbroadcast(b, sh, it);
    return cg_bin(b, "arith.ori", cg_conv(b, "arith.extui", a, it),
                  cg_bin(b, "arith.shli", cg_conv(b, "arith.extui", hi, it), sh));
}

void cv_stage_runs_pairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue g, MlirValue j0,
                         MlirValue j1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    MlirValue z = cg_idx(b, 0), zi = cg_ci(b, b->i32, 0);
    MlirType vh = cg_vec_t(16, b->i16);
    MlirValue zh = cg_ci(b, b->i16, 0), zv = cg_vbroadcast(b, zh, vh);
    int64_t HW = cp->dH * cp->dW;
    MlirValue P0 = cg_imul_c(b, r0, cp->dW), P1 = cg_imul_c(b, r1, cp->dW);
    MlirValue npair = idiv(b, cg_iadd(b, isub(b, j1, j0), cg_idx(b, 1)), 2);
    cg_for lk, ln, lv, lt;
    cg_for_begin(b, &lk, z, npair, 0, NULL);
    MlirValue ja = cg_iadd(b, j0, cg_imul_c(b, lk.iv, 2)), jb = cg_iadd(b, ja, cg_idx(b, 1));
    MlirValue has_b = cg_cmpi(b, CG_I_ULT, jb, j1); /* an odd chunk's last row pairs with 0 */
    MlirValue ca = cg_iadd(b, cg_imul_c(b, g, cp->wch), ja);
    MlirValue cb = cg_select(b, has_b, cg_iadd(b, ca, cg_idx(b, 1)), ca);
    MlirValue row = cg_imul_c(b, lk.iv, m->b_ld);
    cg_for_begin(b, &ln, idiv(b, r0, cp->dH),
                 cg_iadd(b, idiv(b, isub(b, r1, cg_idx(b, 1)), cp->dH), cg_idx(b, 1)), 0, NULL);
    MlirValue nHW = cg_imul_c(b, ln.iv, HW);
    MlirValue plo = imax_s(b, P0, nHW), phi = imin_s(b, P1, cg_iadd(b, nHW, cg_idx(b, HW)));
    MlirValue cnt = isub(b, phi, plo), nv = idiv(b, cnt, 16), in0 = isub(b, plo, nHW);
    MlirValue img = cg_imul_c(b, ln.iv, cp->wC);
    MlirValue fa = cg_iadd(b, cg_imul_c(b, cg_iadd(b, img, ca), HW), in0);
    MlirValue fb = cg_iadd(b, cg_imul_c(b, cg_iadd(b, img, cb), HW), in0);
    MlirValue to = cg_iadd(b, row, isub(b, plo, P0));
    cg_for_begin(b, &lv, z, nv, 0, NULL);
    MlirValue o16 = cg_imul_c(b, lv.iv, 16);
    for (int ab = 0; ab < 2; ab++) /* the pair RUN_AHEAD / 2 pairs on */
        cg_prefetch(b, src, cg_iadd(b, cg_iadd(b, ab ? fb : fa, o16), cg_idx(b, RUN_AHEAD * HW)),
                    false, true);
    MlirValue hi = cg_select(b, has_b, cg_vload(b, vh, src, cg_iadd(b, fb, o16)), zv);
    cg_vstore(b, pair16(b, cg_vload(b, vh, src, cg_iadd(b, fa, o16)), hi), bp, cg_iadd(b, to, o16));
    cg_for_end(b, &lv, 0, NULL);
    cg_for_begin(b, &lt, cg_imul_c(b, nv, 16), cnt, 0, NULL);
    MlirValue h1 = cg_select(b, has_b, cg_load(b, src, cg_iadd(b, fb, lt.iv)), zh);
    cg_store(b, pair16(b, cg_load(b, src, cg_iadd(b, fa, lt.iv)), h1), bp, cg_iadd(b, to, lt.iv));
    cg_for_end(b, &lt, 0, NULL);
    cg_for_end(b, &ln, 0, NULL);
    cv_zero_span(b, zi, bp, row, isub(b, P1, P0), cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    cv_zero_rows(b, bp, npair, m->kp, m->b_ld, zi);
}

MlirValue cv_first_lanes(cg_b *b, int64_t n) {
    int32_t lanes[16], lim[16];
    for (int l = 0; l < 16; l++)
        lanes[l] = l, lim[l] = (int32_t)n;
    return cg_vcmpi(b, CG_I_SLT, cg_vconst_i32(b, 16, lanes), cg_vconst_i32(b, 16, lim));
}

void cv_store_lanes(cg_b *b, MlirValue v, MlirValue mem, MlirValue at, int64_t n) {
    if (n >= 16)
        cg_vstore(b, v, mem, at);
    else
        cg_vmaskstore(b, v, mem, at, cv_first_lanes(b, n));
}

MlirValue cv_maskload_if(cg_b *b, MlirType vt, MlirValue mem, MlirValue at, MlirValue mask,
                         MlirValue ok) {
    MlirType et = mlirShapedTypeGetElementType(vt);
    MlirValue zero =
        cg_vbroadcast(b, mlirTypeIsAFloat(et) ? cg_cf(b, et, 0.0) : cg_ci(b, et, 0), vt);
    cg_if f;
    cg_ifv_begin(b, &f, ok, 1, &vt);
    MlirValue v = cg_vmaskload(b, vt, mem, at, mask);
    cg_ifv_else(b, &f, 1, &v);
    cg_ifv_end(b, &f, 1, &zero);
    return cg_if_result(&f, 0);
}

/* One window row j (of group g) as its lanes read it: the source index of destination
 * column 0 less the source row's offset (base), the columns [lo, hi) it reaches (vectors of
 * 16 sstep i32; an empty range where has is false), and its kernel row's entries in rtab. */
typedef struct win_row {
    MlirValue base, lo, hi, trow;
    int64_t sstep, ahead; /* ahead: the next channel's offset, prefetched */
} win_row;

static win_row window_row(cg_b *b, const cv_plan *cp, MlirValue g, MlirValue j, MlirValue has) {
    win_row w;
    MlirValue ch = idiv(b, j, cp->KK), kk = irem(b, j, cp->KK);
    MlirValue kh = idiv(b, kk, cp->KW), kw = irem(b, kk, cp->KW);
    win_span sp = row_span(b, cp, kw);
    w.sstep = sp.sstep;
    w.ahead = cp->sH * cp->sW;
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), ch);
    w.base = isub(b, cg_iadd(b, cg_imul_c(b, chan, cp->sH * cp->sW), sp.s0),
                  cg_imul_c(b, sp.d0, sp.sstep));
    MlirValue end = cg_iadd(b, sp.d0, sp.T);
    if (!mlirValueIsNull(has))
        end = cg_select(b, has, end, sp.d0);
    MlirType vt = cg_vec_t(16 * sp.sstep, b->i32);
    w.lo = cg_vbroadcast(b, cg_conv(b, "arith.index_cast", sp.d0, b->i32), vt);
    w.hi = cg_vbroadcast(b, cg_conv(b, "arith.index_cast", end, b->i32), vt);
    w.trow = cg_imul_c(b, kh, cp->pix_rows);
    return w;
}

/* Window row w at destination pixel row r (of the block from r0): the source index of column
 * 0 in *at, and in *ok (an i1) whether the row reads a source row (cv_build_rows). */
static void window_row_at(cg_b *b, const win_row *w, MlirValue rtab, MlirValue r, MlirValue r0,
                          MlirValue *at, MlirValue *ok) {
    MlirValue roff = cg_load(b, rtab, cg_iadd(b, w->trow, isub(b, r, r0)));
    *ok = cg_cmpi(b, CG_I_SGE, roff, cg_ci(b, b->i64, 0));
    *at = cg_iadd(b, cg_conv(b, "arith.index_cast", roff, b->index), w->base);
}

/* Window row w's source values at destination columns [q0, q0 + 16) of a pixel row (q0 an
 * index value), as a
 * vector of 16 of the source's storage type et: masked loads of the lanes whose column is in
 * [lo, hi) where the row is ok (an i1; zeros elsewhere, no memory touched); at is the source index
 * of column 0 (lanes before lo may point before the buffer: they are never read). A source
 * step of 2 loads 32 lanes and keeps the even ones. */
static MlirValue row_lanes(cg_b *b, MlirType et, const win_row *w, MlirValue src, MlirValue at,
                           MlirValue ok, MlirValue q0) {
    int64_t sstep = w->sstep, n = 16 * sstep;
    int32_t qv[32], even[32];
    int64_t keep[16];
    for (int64_t l = 0; l < n; l++) {
        qv[l] = (int32_t)(l / sstep);
        even[l] = l % sstep == 0 ? 1 : 0;
    }
    for (int64_t l = 0; l < 16; l++)
        keep[l] = l * sstep;
    MlirType vt = cg_vec_t(n, b->i32);
    MlirValue q = cg_bin(b, "arith.addi", cg_vconst_i32(b, n, qv),
                         cg_vbroadcast(b, cg_conv(b, "arith.index_cast", q0, b->i32), vt));
    MlirValue mask = and_i1(b, cg_vcmpi(b, CG_I_SGE, q, w->lo), cg_vcmpi(b, CG_I_SLT, q, w->hi));
    if (sstep > 1)
        mask = and_i1(b, mask,
                      cg_vcmpi(b, CG_I_EQ, cg_vconst_i32(b, n, even),
                               cg_vbroadcast(b, cg_ci(b, b->i32, 1), vt)));
    MlirValue from = cg_iadd(b, at, cg_imul_c(b, q0, sstep));
    /* masked loads train no prefetcher: the same lanes of the next channel, which a later
     * window row reads (from memory, a conv's staging waited on each line) */
    cg_prefetch(b, src, cg_iadd(b, from, cg_idx(b, w->ahead)), false, true);
    MlirValue v = cv_maskload_if(b, cg_vec_t(n, et), src, from, mask, ok);
    return sstep > 1 ? cg_vshuffle(b, v, v, 16, keep) : v;
}

static MlirValue lanes_block(cg_b *b, cv_lane_blocks *lb) {
    if (lb->at >= lb->end)
        return cg_idx(b, 0);
    bool in_loop = lb->looped && lb->at < lb->full;
    lb->lanes = in_loop                                ? lb->step
                : lb->n - lb->at * lb->step < lb->step ? lb->n - lb->at * lb->step
                                                       : lb->step;
    if (in_loop) {
        cg_for_begin(b, &lb->l, cg_idx(b, 0), cg_idx(b, lb->full), 0, NULL);
        return cg_imul_c(b, lb->l.iv, lb->step);
    }
    return cg_idx(b, lb->at * lb->step);
}

MlirValue cv_lanes_begin(cg_b *b, cv_lane_blocks *lb, int64_t n, int64_t step) {
    lb->n = n, lb->step = step, lb->full = n / step, lb->at = 0;
    lb->end = ceil_div(n, step);
    lb->looped = lb->full >= 3;
    return lanes_block(b, lb);
}

MlirValue cv_lanes_next(cg_b *b, cv_lane_blocks *lb) {
    if (lb->looped && lb->at < lb->full) {
        cg_for_end(b, &lb->l, 0, NULL);
        lb->at = lb->full;
    } else {
        lb->at++;
    }
    return lanes_block(b, lb);
}

/* Whether window rows can be read by masked loads: a source step of 1 or 2, written to
 * consecutive destination columns. */
static bool rows_by_lanes(const cv_plan *cp) {
    if (cp->phased)
        return true;
    if (cp->role == CV_GRAD_WEIGHT)
        return cp->st[1] <= 2;
    return cp->dst_big ? cp->st[1] == 1 : cp->st[1] <= 2;
}

bool cv_window_pairs_ok(const kc *c, const cv_plan *cp) {
    if (cp->mk.pk != 2 || c->g->nodes[cp->win].dtype != LOOM_DTYPE_BF16)
        return false;
    if (cp->identity && cp->role != CV_GRAD_WEIGHT) /* cv_stage_runs_pairs */
        return false;
    return rows_by_lanes(cp);
}

bool cv_window_lanes_ok(const cv_plan *cp) {
    return !cp->identity && rows_by_lanes(cp);
}

void cv_stage_window_pairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue rtab, MlirValue g,
                           MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    MlirValue z = cg_idx(b, 0), zi = cg_ci(b, b->i32, 0), none = {NULL};
    MlirValue npair = idiv(b, cg_iadd(b, isub(b, j1, j0), cg_idx(b, 1)), 2);
    cg_for lk, lr;
    cg_for_begin(b, &lk, z, npair, 0, NULL);
    /* the pair's two window rows (an odd chunk's last row pairs with zeros) */
    MlirValue ja = cg_iadd(b, j0, cg_imul_c(b, lk.iv, 2)), jb = cg_iadd(b, ja, cg_idx(b, 1));
    MlirValue has_b = cg_cmpi(b, CG_I_ULT, jb, j1);
    win_row w[2] = {window_row(b, cp, g, ja, none),
                    window_row(b, cp, g, cg_select(b, has_b, jb, ja), has_b)};
    MlirValue prow = cg_imul_c(b, lk.iv, m->b_ld);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    MlirValue at[2], ok[2];
    for (int q = 0; q < 2; q++)
        window_row_at(b, &w[q], rtab, lr.iv, r0, &at[q], &ok[q]);
    MlirValue dst = cg_iadd(b, prow, cg_imul_c(b, isub(b, lr.iv, r0), cp->dW));
    cv_lane_blocks lb;
    for (MlirValue q0 = cv_lanes_begin(b, &lb, cp->dW, 16); lb.at < lb.end;
         q0 = cv_lanes_next(b, &lb)) {
        MlirValue va = row_lanes(b, b->i16, &w[0], src, at[0], ok[0], q0);
        MlirValue vb = row_lanes(b, b->i16, &w[1], src, at[1], ok[1], q0);
        cv_store_lanes(b, pair16(b, va, vb), bp, cg_iadd(b, dst, q0), lb.lanes);
    }
    cg_for_end(b, &lr, 0, NULL);
    /* the row's padding past the block's pixels */
    cv_zero_span(b, zi, bp, prow, cg_imul_c(b, isub(b, r1, r0), cp->dW), cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    cv_zero_rows(b, bp, npair, m->kp, m->b_ld, zi);
}

/* Whole images: a source image of 64 pixels or fewer (8x8: one vector of 16, 32 or 64 lanes), a
 * destination of 16 or fewer (4x4; a strided input gradient's phase, or a border class, on its
 * own grid and taps), blocks of whole images, at most 16 taps, and not a 1x1 of stride 1 (whose
 * window is its channels' runs) or a strided input gradient taken whole (whose window reads
 * through its phases). Row by row, a 4x4's 4-pixel rows cost two masked loads, a pairing and a
 * 4-lane masked store each, a quarter of the kernel's time (perf annotate). ResNet-50's layer3
 * 3x3 at 4x4 (bench_conv --image-size 64, batch 32, bf16 pairs, 2 threads on a Zen 4, best of
 * 15, in turns): forward 1.67-1.95 -> 1.44 ms, input gradient 1.70-1.98 -> 1.47; layer4's
 * stride-2 3x3 from 4x4 to 2x2, forward 2.4-3.9 -> 1.8-2.1. From 8x8 sources (64 lanes),
 * layer3's first block: the stride-2 3x3's forward 1.85-2.18 -> 1.51-1.55 ms and weight
 * gradient 2.09-2.21 -> 1.56-1.71, the 1x1 downsample's forward 1.67-2.10 -> 1.36-1.46 and
 * weight gradient 1.63-1.84 -> 1.38-1.40. The stride-2 3x3's input gradient by phases of 4x4
 * (from dy 4x4 to dx 8x8): 1.91-2.26 -> 1.62-1.75. */
bool cv_window_img_ok(const cv_plan *cp) {
    return cp->pairs_win && cp->role != CV_GRAD_WEIGHT && !cp->identity &&
           (cp->phased || !cp->dst_big || (cp->st[0] == 1 && cp->st[1] == 1)) &&
           cp->sH * cp->sW <= 64 && cp->dH * cp->dW <= 16 && cp->pix_rows % cp->dH == 0 &&
           cp->KK <= 16;
}

/* taps[]'s i16 values: the window rows of a chunk's channels (one more: a chunk may start
 * and end inside a channel) for one image. */
int64_t cv_img_taps_len(const cv_plan *cp) {
    return (ceil_div(cp->kc, cp->KK) + 1) * cp->KK * 16;
}

/* Along axis a, the source coordinate of destination coordinate d at tap k, or -1 where
 * the window reads padding (src_coord with constants). */
static int64_t img_src(const cv_plan *cp, int a, int64_t d, int64_t k) {
    int64_t ext = a == 0 ? cp->sH : cp->sW, e = cp->pd[a] - k * cp->dl[a], s;
    if (cp->phased) { /* a phase's or border class's own grid and taps */
        s = d + cp->off[a][k];
    } else if (!cp->dst_big) {
        s = d * cp->st[a] - e;
    } else {
        int64_t num = d + e;
        if (num < 0 || num % cp->st[a] != 0)
            return -1;
        s = num / cp->st[a];
    }
    return s >= 0 && s < ext ? s : -1;
}

/* The source image's lane that destination pixel (y, q) reads at tap k, or zero_lane where
 * the window reads padding there. */
static int64_t img_lane(const cv_plan *cp, int64_t y, int64_t q, int64_t k, int64_t zero_lane) {
    int64_t sy = img_src(cp, 0, y, k / cp->KW), sx = sy >= 0 ? img_src(cp, 1, q, k % cp->KW) : -1;
    return sx >= 0 ? sy * cp->sW + sx : zero_lane;
}

/* The lanes of a source image's vector: 16, 32 or 64, its sH sW pixels and zeros past them. */
static int64_t img_lanes(const cv_plan *cp) {
    int64_t ns = cp->sH * cp->sW;
    return ns <= 16 ? 16 : ns <= 32 ? 32 : 64;
}

/* The source image at src[from] as a vector of img_lanes (bf16 bits, zeros past its pixels),
 * and in *zero a zero vector of its type (a shuffle's lanes img_lanes and on). */
static MlirValue img_vector(cg_b *b, const cv_plan *cp, MlirValue src, MlirValue from,
                            MlirValue *zero) {
    int64_t ns = cp->sH * cp->sW, n = img_lanes(cp);
    MlirType vt = cg_vec_t(n, b->i16);
    *zero = cg_vbroadcast(b, cg_ci(b, b->i16, 0), vt);
    if (ns == n)
        return cg_vload(b, vt, src, from);
    int32_t lane[64], lim[64];
    for (int64_t l = 0; l < n; l++)
        lane[l] = (int32_t)l, lim[l] = (int32_t)ns;
    MlirValue mask = cg_vcmpi(b, CG_I_SLT, cg_vconst_i32(b, n, lane), cg_vconst_i32(b, n, lim));
    return cg_vmaskload(b, vt, src, from, mask);
}

void cv_stage_window_pairs_img(kc *c, const cv_plan *cp, MlirValue bp, MlirValue taps, MlirValue g,
                               MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    MlirValue z = cg_idx(b, 0), zi = cg_ci(b, b->i32, 0);
    MlirType v16 = cg_vec_t(16, b->i16);
    int64_t ns = cp->sH * cp->sW, nd = cp->dH * cp->dW, nl = img_lanes(cp);
    MlirValue zero16 = cg_vbroadcast(b, cg_ci(b, b->i16, 0), v16);
    /* lane l of destination pixel l's tap k: its source pixel's lane, or a zero's (nl) */
    int64_t lanes[16][16];
    for (int64_t k = 0; k < cp->KK; k++)
        for (int64_t l = 0; l < 16; l++)
            lanes[k][l] = l < nd ? img_lane(cp, l / cp->dW, l % cp->dW, k, nl) : nl;
    MlirValue ch0 = idiv(b, j0, cp->KK),
              ch1 = idiv(b, cg_iadd(b, j1, cg_idx(b, cp->KK - 1)), cp->KK);
    MlirValue npair = idiv(b, cg_iadd(b, isub(b, j1, j0), cg_idx(b, 1)), 2);
    MlirValue jbase = cg_imul_c(b, ch0, cp->KK); /* taps[] row of window row j: j - jbase */
    cg_for ln, lc, lk;
    cg_for_begin(b, &ln, idiv(b, r0, cp->dH), idiv(b, r1, cp->dH), 0, NULL);
    /* the image's channels [ch0, ch1), every tap's row into taps[] */
    cg_for_begin(b, &lc, ch0, ch1, 0, NULL);
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), lc.iv);
    MlirValue from = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, ln.iv, cp->wC), chan), ns);
    MlirValue zimg, img = img_vector(b, cp, src, from, &zimg);
    MlirValue trow = cg_imul_c(b, isub(b, lc.iv, ch0), cp->KK * 16);
    for (int64_t k = 0; k < cp->KK; k++)
        cg_vstore(b, cg_vshuffle(b, img, zimg, 16, lanes[k]), taps,
                  cg_iadd(b, trow, cg_idx(b, k * 16)));
    cg_for_end(b, &lc, 0, NULL);
    /* its columns of every pair (a chunk of odd rows: the last pairs with zeros) */
    MlirValue col = cg_imul_c(b, isub(b, ln.iv, idiv(b, r0, cp->dH)), nd);
    cg_for_begin(b, &lk, z, npair, 0, NULL);
    MlirValue ja = cg_iadd(b, j0, cg_imul_c(b, lk.iv, 2)), jb = cg_iadd(b, ja, cg_idx(b, 1));
    MlirValue va = cg_vload(b, v16, taps, cg_imul_c(b, isub(b, ja, jbase), 16));
    MlirValue has_b = cg_cmpi(b, CG_I_ULT, jb, j1);
    MlirValue vb =
        cg_vload(b, v16, taps, cg_imul_c(b, isub(b, cg_select(b, has_b, jb, ja), jbase), 16));
    vb = cg_select(b, has_b, vb, zero16);
    cv_store_lanes(b, pair16(b, va, vb), bp, cg_iadd(b, cg_imul_c(b, lk.iv, m->b_ld), col), nd);
    cg_for_end(b, &lk, 0, NULL);
    cg_for_end(b, &ln, 0, NULL);
    /* the rows' padding past the block's pixels, and the rows past the chunk */
    MlirValue ncol = cg_imul_c(b, isub(b, r1, r0), cp->dW);
    cg_for lz;
    cg_for_begin(b, &lz, z, npair, 0, NULL);
    cv_zero_span(b, zi, bp, cg_imul_c(b, lz.iv, m->b_ld), ncol, cg_idx(b, m->nbp));
    cg_for_end(b, &lz, 0, NULL);
    cv_zero_rows(b, bp, npair, m->kp, m->b_ld, zi);
}

void cv_stage_window_lanes(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                           MlirValue rtab, MlirValue g, MlirValue j0, MlirValue j1, MlirValue r0,
                           MlirValue r1) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]], none = {NULL};
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirType et = cg_storage_type(b, sdt);
    cg_for lj, lr;
    cg_for_begin(b, &lj, j0, j1, 0, NULL);
    win_row w = window_row(b, cp, g, lj.iv, none);
    MlirValue row = cg_imul_c(b, isub(b, lj.iv, j0), ld);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    MlirValue at, ok;
    window_row_at(b, &w, rtab, lr.iv, r0, &at, &ok);
    MlirValue dst = cg_iadd(b, row, cg_imul_c(b, isub(b, lr.iv, r0), cp->dW));
    cv_lane_blocks lb;
    for (MlirValue q0 = cv_lanes_begin(b, &lb, cp->dW, 16); lb.at < lb.end;
         q0 = cv_lanes_next(b, &lb))
        cv_store_lanes(b, cg_widen16(b, sdt, row_lanes(b, et, &w, src, at, ok, q0)), buf,
                       cg_iadd(b, dst, q0), lb.lanes);
    cg_for_end(b, &lr, 0, NULL);
    /* the row's padding past the block's pixels */
    cv_zero_span(b, cg_cf(b, b->f32, 0.0), buf, row, cg_imul_c(b, isub(b, r1, r0), cp->dW),
                 cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* The weight gradient's pairs along K (pixels): a destination row's pixels in segments of
 * 32 (the last one shorter), segment [s, s + R) paired (s + l, s + h + l) for l < h =
 * ceil(R / 2) at pair s / 2 + l of the row's ceil(dW / 2); A (the window,
 * cv_stage_window_kpairs) and B (dy^T, cv_panelize) pair the same pixels. */
static int64_t kpair_half(const cv_plan *cp, int64_t s) {
    int64_t len = cp->dW - s < 32 ? cp->dW - s : 32;
    return (len + 1) / 2;
}

void cv_stage_window_kpairs(kc *c, const cv_plan *cp, MlirValue ap, MlirValue rtab, MlirValue g,
                            MlirValue i0, MlirValue i1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    MlirValue zi = cg_ci(b, b->i32, 0), none = {NULL};
    int64_t P = ceil_div(cp->dW, 2);
    cg_for lj, lr;
    cg_for_begin(b, &lj, i0, i1, 0, NULL);
    win_row w = window_row(b, cp, g, lj.iv, none);
    MlirValue row = cg_imul_c(b, isub(b, lj.iv, i0), m->kp);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    MlirValue at, ok;
    window_row_at(b, &w, rtab, lr.iv, r0, &at, &ok);
    MlirValue dst = cg_iadd(b, row, cg_imul_c(b, isub(b, lr.iv, r0), P));
    cv_lane_blocks lb; /* segments of 32 pixels: h = lb.lanes / 2 rounded up */
    for (MlirValue s = cv_lanes_begin(b, &lb, cp->dW, 32); lb.at < lb.end;
         s = cv_lanes_next(b, &lb)) {
        int64_t h = (lb.lanes + 1) / 2;
        MlirValue va = row_lanes(b, b->i16, &w, src, at, ok, s);
        MlirValue vb = row_lanes(b, b->i16, &w, src, at, ok, cg_iadd(b, s, cg_idx(b, h)));
        cv_store_lanes(b, pair16(b, va, vb), ap, cg_iadd(b, dst, idiv(b, s, 2)), h);
    }
    cg_for_end(b, &lr, 0, NULL);
    cv_zero_span(b, zi, ap, row, cg_imul_c(b, isub(b, r1, r0), P), cg_idx(b, m->kp));
    cg_for_end(b, &lj, 0, NULL);
    cv_zero_rows(b, ap, isub(b, i1, i0), cp->mbp, m->kp, zi);
}

/* Whole images, as cv_window_img_ok, for the weight gradient: a row block of whole channels,
 * an image's pixel pairs (a row's q and q + ceil(dW / 2), as kpair_half pairs a segment) 16 or
 * fewer. Layer3's 3x3 at 4x4 as above: 1.75-1.77 -> 1.57-1.63 ms; layer4's at 2x2 2.15 ->
 * 1.90; layer3's 1x1 from 256 to 1024 at 4x4 0.77 -> 0.70-0.74. */
bool cv_window_kpairs_img_ok(const cv_plan *cp) {
    return cp->pairs_win && cp->role == CV_GRAD_WEIGHT && !cp->phased && cp->dW <= 32 &&
           cp->sH * cp->sW <= 64 && cp->dH * ceil_div(cp->dW, 2) <= 16 &&
           cp->pix_rows % cp->dH == 0 && cp->KK <= 16 && cp->rows % cp->KK == 0;
}

void cv_stage_window_kpairs_img(kc *c, const cv_plan *cp, MlirValue ap, MlirValue g, MlirValue i0,
                                MlirValue i1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    MlirValue zi = cg_ci(b, b->i32, 0);
    MlirType v16i = cg_vec_t(16, b->i32);
    int64_t P = ceil_div(cp->dW, 2), np = P * cp->dH, nl = img_lanes(cp);
    /* lane 2i + half of tap k: pair i = (y, p)'s pixel q = p (+ P for the high half) of row y,
     * its source pixel's lane, or a zero's (nl) */
    int64_t lanes[16][32];
    for (int64_t k = 0; k < cp->KK; k++)
        for (int64_t l = 0; l < 32; l++) {
            int64_t i = l / 2, q = i % P + (l % 2) * P;
            lanes[k][l] = i < np && q < cp->dW ? img_lane(cp, i / P, q, k, nl) : nl;
        }
    MlirValue n0 = idiv(b, r0, cp->dH);
    cg_for lc, ln, lj;
    cg_for_begin(b, &lc, idiv(b, i0, cp->KK), idiv(b, i1, cp->KK), 0, NULL);
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), lc.iv);
    MlirValue row = cg_imul_c(b, isub(b, cg_imul_c(b, lc.iv, cp->KK), i0), m->kp);
    cg_for_begin(b, &ln, n0, idiv(b, r1, cp->dH), 0, NULL);
    MlirValue from = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, ln.iv, cp->wC), chan), cp->sH * cp->sW);
    MlirValue zimg, img = img_vector(b, cp, src, from, &zimg);
    MlirValue at = cg_iadd(b, row, cg_imul_c(b, isub(b, ln.iv, n0), np));
    for (int64_t k = 0; k < cp->KK; k++) {
        MlirValue v = cg_vbitcast(b, cg_vshuffle(b, img, zimg, 32, lanes[k]), v16i);
        cv_store_lanes(b, v, ap, cg_iadd(b, at, cg_idx(b, k * m->kp)), np);
    }
    cg_for_end(b, &ln, 0, NULL);
    cg_for_end(b, &lc, 0, NULL);
    /* the rows' pairs past the chunk's pixels, and the rows past the block up to mbp */
    cg_for_begin(b, &lj, cg_idx(b, 0), isub(b, i1, i0), 0, NULL);
    cv_zero_span(b, zi, ap, cg_imul_c(b, lj.iv, m->kp), cg_imul_c(b, isub(b, r1, r0), P),
                 cg_idx(b, m->kp));
    cg_for_end(b, &lj, 0, NULL);
    cv_zero_rows(b, ap, isub(b, i1, i0), cp->mbp, m->kp, zi);
}

/* B = dy^T's pairs from its staged rows (pixels) as cv_stage_window_kpairs pairs them. */
static void panelize_kpairs(kc *c, const cv_plan *cp, MlirValue stg, MlirValue bp) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirType vf = cg_vec_t(MK_PANEL, b->f32);
    MlirValue zf = cg_vbroadcast(b, cg_cf(b, b->f32, 0.0), vf);
    int64_t P = ceil_div(cp->dW, 2);
    cg_for lr, ll, lp;
    cg_for_begin(b, &lr, cg_idx(b, 0), cg_idx(b, cp->pix_rows), 0, NULL);
    for (int64_t s = 0; s < cp->dW; s += 32) {
        int64_t len = cp->dW - s < 32 ? cp->dW - s : 32, h = kpair_half(cp, s);
        MlirValue pa0 = cg_iadd(b, cg_imul_c(b, lr.iv, cp->dW), cg_idx(b, s));
        MlirValue kk0 = cg_iadd(b, cg_imul_c(b, lr.iv, P), cg_idx(b, s / 2));
        for (int odd = 0; odd < 2; odd++) { /* pairs (l, l + h); an odd len's last l alone */
            if (odd && len % 2 == 0)
                break;
            cg_for_begin(b, &ll, cg_idx(b, odd ? h - 1 : 0), cg_idx(b, odd ? h : len - h), 0, NULL);
            MlirValue pa = cg_imul_c(b, cg_iadd(b, pa0, ll.iv), m->b_ld);
            MlirValue to = cg_imul_c(b, cg_iadd(b, kk0, ll.iv), m->b_ld);
            cg_for_begin(b, &lp, cg_idx(b, 0), cg_idx(b, m->nbp / MK_PANEL), 0, NULL);
            MlirValue col = cg_imul_c(b, lp.iv, MK_PANEL);
            MlirValue va = cg_vload(b, vf, stg, cg_iadd(b, pa, col));
            MlirValue vb =
                odd ? zf
                    : cg_vload(b, vf, stg, cg_iadd(b, cg_iadd(b, pa, cg_idx(b, h * m->b_ld)), col));
            cg_vstore(b, cg_bf16_pair(b, va, vb), bp, cg_iadd(b, to, col));
            cg_for_end(b, &lp, 0, NULL);
            cg_for_end(b, &ll, 0, NULL);
        }
    }
    cg_for_end(b, &lr, 0, NULL);
    cv_zero_rows(b, bp, cg_idx(b, cp->pix_rows * P), m->kp, m->b_ld, cg_ci(b, b->i32, 0));
}

/* 16 bf16 values (i16 bits) of a row at mem[at], its first n (1..16) lanes; zeros in the
 * others, which no load touches. */
static MlirValue load_lanes16(cg_b *b, MlirValue mem, MlirValue at, int64_t n) {
    MlirType vt = cg_vec_t(16, b->i16);
    return n == 16 ? cg_vload(b, vt, mem, at) : cg_vmaskload(b, vt, mem, at, cv_first_lanes(b, n));
}

/* Rows of dy ahead of the one cv_stage_dy_t_kpairs reads that it prefetches, channel by
 * channel: 1, 2 and 4 ran alike (l1_1x1_64_256's weight gradient 8% faster, one thread). */
enum { DY_AHEAD = 2 };

void cv_stage_dy_t_kpairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue g, MlirValue j0,
                          MlirValue j1, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue dy = c->bufs[c->s->buf_of[cp->plain]];
    MlirValue zi = cg_ci(b, b->i32, 0), z = cg_idx(b, 0);
    int64_t L = cp->OH * cp->OW, P = ceil_div(cp->dW, 2);
    MlirValue ncol = isub(b, j1, j0), nfo = idiv(b, ncol, 16);
    cg_for lr, lob, lj, ll;
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    /* row (n, y) of dy's channel g Og + o starts at (n O + g Og + o) L + y OW */
    MlirValue n = idiv(b, lr.iv, cp->dH), y = irem(b, lr.iv, cp->dH);
    MlirValue rbase =
        cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, n, cp->O), cg_imul_c(b, g, cp->Og)), L),
                cg_imul_c(b, y, cp->OW));
    MlirValue kr = cg_imul_c(b, isub(b, lr.iv, r0), P); /* the row's first pair */
    /* blocks of 16 channels: each channel's 16 pairs in a vector, transposed in registers */
    cg_for_begin(b, &lob, z, nfo, 0, NULL);
    MlirValue col0 = cg_imul_c(b, lob.iv, 16);
    MlirValue obase = cg_iadd(b, rbase, cg_imul_c(b, cg_iadd(b, j0, col0), L));
    for (int64_t s = 0; s < cp->dW; s += 32) {
        int64_t len = cp->dW - s < 32 ? cp->dW - s : 32, h = kpair_half(cp, s);
        MlirValue v[16];
        for (int i = 0; i < 16; i++) {
            MlirValue at = cg_iadd(b, obase, cg_idx(b, i * L + s));
            /* each channel's rows a later row of the chunk reads: a stream per channel, more
             * than the hardware prefetcher follows */
            cg_prefetch(b, dy, cg_iadd(b, at, cg_idx(b, DY_AHEAD * cp->OW)), false, true);
            MlirValue va = load_lanes16(b, dy, at, h);
            MlirValue vb = len - h > 0
                               ? load_lanes16(b, dy, cg_iadd(b, at, cg_idx(b, h)), len - h)
                               : cg_vbroadcast(b, cg_ci(b, b->i16, 0), cg_vec_t(16, b->i16));
            v[i] = pair16(b, va, vb);
        }
        cg_vtranspose16(b, v);
        for (int64_t t = 0; t < h; t++)
            cg_vstore(
                b, v[t], bp,
                cg_iadd(b, cg_imul_c(b, cg_iadd(b, kr, cg_idx(b, s / 2 + t)), m->b_ld), col0));
    }
    cg_for_end(b, &lob, 0, NULL);
    /* the last channels, one by one */
    cg_for_begin(b, &lj, cg_iadd(b, j0, cg_imul_c(b, nfo, 16)), j1, 0, NULL);
    MlirValue jrow = cg_iadd(b, rbase, cg_imul_c(b, lj.iv, L)), col = isub(b, lj.iv, j0);
    for (int64_t s = 0; s < cp->dW; s += 32) {
        int64_t len = cp->dW - s < 32 ? cp->dW - s : 32, h = kpair_half(cp, s);
        for (int odd = 0; odd < 2; odd++) { /* pairs (l, l + h); an odd len's last l alone */
            if (odd && len % 2 == 0)
                break;
            cg_for_begin(b, &ll, cg_idx(b, odd ? h - 1 : 0), cg_idx(b, odd ? h : len - h), 0, NULL);
            MlirValue at = cg_iadd(b, jrow, cg_iadd(b, cg_idx(b, s), ll.iv));
            MlirValue va = cg_load(b, dy, at);
            MlirValue vb = odd ? cg_ci(b, b->i16, 0) : cg_load(b, dy, cg_iadd(b, at, cg_idx(b, h)));
            cg_store(
                b, pair16(b, va, vb), bp,
                cg_iadd(b,
                        cg_imul_c(b, cg_iadd(b, kr, cg_iadd(b, cg_idx(b, s / 2), ll.iv)), m->b_ld),
                        col));
            cg_for_end(b, &ll, 0, NULL);
        }
    }
    cg_for_end(b, &lj, 0, NULL);
    cg_for_end(b, &lr, 0, NULL);
    /* the padding columns of the chunk's pairs, and the pairs past it */
    MlirValue nk = cg_imul_c(b, isub(b, r1, r0), P);
    cg_for lk;
    cg_for_begin(b, &lk, z, nk, 0, NULL);
    cv_zero_span(b, zi, bp, cg_imul_c(b, lk.iv, m->b_ld), ncol, cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    cv_zero_rows(b, bp, nk, m->kp, m->b_ld, zi);
}

/* The source rows of destination pixel rows [r0, r1) for stage_window, per kernel row kh:
 * rtab[kh * pix_rows + r - r0] = the offset of row sy of image n in a channel's (n wC sH sW +
 * sy sW), or -1 where the window reads padding rows. Built once per block of pixel rows for
 * all its window rows (saves a division and the row's bounds per copied row). */
void cv_build_rows(kc *c, const cv_plan *cp, MlirValue rtab, MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    cg_for lk, lr;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, cp->KH), 0, NULL);
    MlirValue trow = cg_imul_c(b, lk.iv, cp->pix_rows);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    MlirValue n = idiv(b, lr.iv, cp->dH), y = irem(b, lr.iv, cp->dH), vok;
    MlirValue sy = src_coord(b, cp, 0, y, lk.iv, &vok);
    MlirValue off = cg_iadd(b, cg_imul_c(b, n, cp->wC * cp->sH * cp->sW), cg_imul_c(b, sy, cp->sW));
    cg_store(b,
             cg_select(b, vok, cg_conv(b, "arith.index_cast", off, b->i64), cg_ci(b, b->i64, -1)),
             rtab, cg_iadd(b, trow, isub(b, lr.iv, r0)));
    cg_for_end(b, &lr, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
}

/* The window's pixel table for destination pixel rows [r0, r1) (narrow images, where a
 * row's copy is too short to pay for its set-up): tab[kk * ldt + (r - r0) * dW + q] = the
 * offset of the source pixel that tap kk reads there, less its channel's (n wC sH sW + sy sW
 * + sx), or -1 where the window reads padding. The same for every channel: built once per
 * block of pixels, used by all its window rows. */
void cv_build_table(kc *c, const cv_plan *cp, MlirValue tab, int64_t ldt, MlirValue r0,
                    MlirValue r1) {
    cg_b *b = c->b;
    cg_for lk, lr, lq;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, cp->KK), 0, NULL);
    MlirValue kh = idiv(b, lk.iv, cp->KW), kw = irem(b, lk.iv, cp->KW);
    MlirValue trow = cg_imul_c(b, lk.iv, ldt);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    MlirValue n = idiv(b, lr.iv, cp->dH), y = irem(b, lr.iv, cp->dH), vok, hok;
    MlirValue sy = src_coord(b, cp, 0, y, kh, &vok);
    MlirValue rowoff =
        cg_iadd(b, cg_imul_c(b, n, cp->wC * cp->sH * cp->sW), cg_imul_c(b, sy, cp->sW));
    MlirValue at = cg_iadd(b, trow, cg_imul_c(b, isub(b, lr.iv, r0), cp->dW));
    cg_for_begin(b, &lq, cg_idx(b, 0), cg_idx(b, cp->dW), 0, NULL);
    MlirValue sx = src_coord(b, cp, 1, lq.iv, kw, &hok);
    MlirValue off = cg_conv(b, "arith.index_cast", cg_iadd(b, rowoff, sx), b->i32);
    cg_store(b, cg_select(b, and_i1(b, vok, hok), off, cg_ci(b, b->i32, -1)), tab,
             cg_iadd(b, at, lq.iv));
    cg_for_end(b, &lq, 0, NULL);
    cg_for_end(b, &lr, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
}

/* stage_window through the pixel table of the block's npix pixels. */
void cv_stage_window_tab(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                         MlirValue tab, int64_t ldt, MlirValue g, MlirValue j0, MlirValue j1,
                         MlirValue npix) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0);
    cg_for lj, lp;
    cg_for_begin(b, &lj, j0, j1, 0, NULL);
    MlirValue ch = idiv(b, lj.iv, cp->KK), kk = irem(b, lj.iv, cp->KK);
    MlirValue base = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, g, cp->wch), ch), cp->sH * cp->sW);
    MlirValue trow = cg_imul_c(b, kk, ldt), row = cg_imul_c(b, isub(b, lj.iv, j0), ld);
    MlirValue p_rest = z; /* pixels from here on one by one */
    if (sdt == LOOM_DTYPE_F32) {
        /* 16 at a time, a masked gather (vgatherdps): one by one, the conditional loads
         * took 5 cycles a pixel */
        MlirType vi = cg_vec_t(16, b->i32), vf = cg_vec_t(16, b->f32), vb = cg_vec_t(16, b->i1);
        MlirValue nv = idiv(b, npix, 16), vz = cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi);
        MlirValue vbase = cg_vbroadcast(b, cg_conv(b, "arith.index_cast", base, b->i32), vi);
        cg_for lv;
        cg_for_begin(b, &lv, z, nv, 0, NULL);
        MlirValue p0 = cg_imul_c(b, lv.iv, 16);
        MlirValue tv = cg_vload(b, vi, tab, cg_iadd(b, trow, p0));
        MlirNamedAttribute sge = cg_named(b, "predicate", mlirIntegerAttrGet(b->i64, CG_I_SGE));
        MlirValue cops[2] = {tv, vz};
        MlirValue okv = mlirOperationGetResult(cg_op(b, "arith.cmpi", 2, cops, 1, &vb, 1, &sge), 0);
        MlirValue idx = cg_bin(b, "arith.addi", cg_select(b, okv, tv, vz), vbase);
        MlirValue ops[5] = {src, z, idx, okv, cg_vbroadcast(b, zf, vf)};
        MlirValue v = mlirOperationGetResult(cg_op(b, "vector.gather", 5, ops, 1, &vf, 0, NULL), 0);
        cg_vstore(b, v, buf, cg_iadd(b, row, p0));
        cg_for_end(b, &lv, 0, NULL);
        p_rest = cg_imul_c(b, nv, 16);
    }
    cg_for_begin(b, &lp, p_rest, npix, 0, NULL);
    MlirValue t = cg_load(b, tab, cg_iadd(b, trow, lp.iv));
    MlirValue ok = cg_cmpi(b, CG_I_SGE, t, cg_ci(b, b->i32, 0));
    MlirValue at =
        cg_select(b, ok, cg_iadd(b, base, cg_conv(b, "arith.index_cast", t, b->index)), z);
    cg_store(b, cg_select(b, ok, cg_load_val(b, sdt, src, at), zf), buf, cg_iadd(b, row, lp.iv));
    cg_for_end(b, &lp, 0, NULL);
    cv_zero_span(b, zf, buf, row, npix, cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* B from staged rows stg[k * b_ld + j] (k in [0, kp * pk): rows past the chunk's K are
 * zero) in pairs of rows 2 kk, 2 kk + 1, row-major: bp[kk * b_ld + j] (f32 B is read from
 * the staged rows themselves). */
void cv_panelize(kc *c, const cv_plan *cp, MlirValue stg, MlirValue bp) {
    if (cp->role == CV_GRAD_WEIGHT && cp->pairs_win) {
        panelize_kpairs(c, cp, stg, bp);
        return;
    }
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirType vf = cg_vec_t(MK_PANEL, b->f32);
    cg_for lk, lp;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, m->kp), 0, NULL);
    MlirValue row = cg_imul_c(b, lk.iv, m->pk * m->b_ld);
    cg_for_begin(b, &lp, cg_idx(b, 0), cg_idx(b, m->nbp / MK_PANEL), 0, NULL);
    MlirValue from = cg_iadd(b, row, cg_imul_c(b, lp.iv, MK_PANEL));
    MlirValue v = cg_vload(b, vf, stg, from);
    v = cg_bf16_pair(b, v, cg_vload(b, vf, stg, cg_iadd(b, from, cg_idx(b, m->b_ld))));
    cg_vstore(b, v, bp, cg_iadd(b, cg_imul_c(b, lk.iv, m->b_ld), cg_imul_c(b, lp.iv, MK_PANEL)));
    cg_for_end(b, &lp, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
}

/* Zeros rows [from, to) of a row-major buffer of ld columns at buf[base]. */
void cv_zero_rows_at(cg_b *b, MlirValue buf, MlirValue base, MlirValue from, int64_t to, int64_t ld,
                     MlirValue zero) {
    MlirValue at = cg_imul_c(b, from, ld);
    cg_zero_range(b, buf, cg_iadd(b, base, at), isub(b, cg_idx(b, to * ld), at), zero);
}

void cv_zero_rows(cg_b *b, MlirValue buf, MlirValue from, int64_t to, int64_t ld, MlirValue zero) {
    cv_zero_rows_at(b, buf, cg_idx(b, 0), from, to, ld, zero); /* + 0 folds away */
}

/* Where w[o, c, 0, 0] starts for row `row` of A and channel `ch` of K: o the row and c the
 * channel for conv2d, the other way round for the input gradient (whose A is w^T). */
static MlirValue weight_window(cg_b *b, const cv_plan *cp, MlirValue g, MlirValue row,
                               MlirValue ch) {
    bool fwd = cp->role == CV_FWD;
    MlirValue o = cg_iadd(b, cg_imul_c(b, g, cp->Og), fwd ? row : ch);
    return cg_imul_c(b, cg_iadd(b, cg_imul_c(b, o, cp->Cg), fwd ? ch : row), cp->KKf);
}

/* Stages A = the weights' rows [i0, i1) x K [k0, k1) of group g as stg[base + (i - i0) * ld
 * + k - k0] (f32; zeros past k1 up to ld and in the rows up to mbp): conv2d's w[g Og + i, k], a
 * contiguous run per row; the input gradient's w[g Og + o, i, kh, kw] for k = (o, kh, kw),
 * runs of KK (its chunks are whole o's); a phase's or border class's, its own taps of each
 * channel one by one (chunks of whole channels). */
void cv_stage_weights(kc *c, const cv_plan *cp, MlirValue stg, MlirValue base, int64_t ld,
                      MlirValue g, MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1) {
    cg_b *b = c->b;
    MlirValue wbuf = c->bufs[c->s->buf_of[cp->plain]];
    loom_dtype wdt = c->g->nodes[cp->plain].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0), n = isub(b, k1, k0);
    cg_for li, lo, lt;
    MlirValue i_rest = i0; /* rows from here on element by element */
    if (cp->role == CV_GRAD_INPUT && cp->KKf == 1) {
        /* 1x1 weights: A = w^T, in 16 x 16 blocks transposed in registers (element by
         * element, each load was 4 KB from the last for 1024 input channels) */
        cg_for lib, lob;
        MlirValue nib = idiv(b, isub(b, i1, i0), 16), nob = idiv(b, n, 16);
        cg_for_begin(b, &lib, z, nib, 0, NULL);
        MlirValue c0 = cg_iadd(b, i0, cg_imul_c(b, lib.iv, 16));
        MlirValue row0 = cg_iadd(b, base, cg_imul_c(b, isub(b, c0, i0), ld));
        MlirValue wrow =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, g, cp->Og), k0), cp->Cg), c0);
        cg_for_begin(b, &lob, z, nob, 0, NULL);
        MlirValue src = cg_iadd(b, wrow, cg_imul_c(b, lob.iv, 16 * cp->Cg)), v[16];
        for (int t = 0; t < 16; t++)
            v[t] = vload_f32(b, wdt, wbuf, cg_iadd(b, src, cg_idx(b, t * cp->Cg)));
        cg_vtranspose16(b, v);
        MlirValue dst = cg_iadd(b, row0, cg_imul_c(b, lob.iv, 16));
        for (int t = 0; t < 16; t++)
            cg_vstore(b, v[t], stg, cg_iadd(b, dst, cg_idx(b, t * ld)));
        cg_for_end(b, &lob, 0, NULL);
        cg_for_begin(b, &lo, cg_imul_c(b, nob, 16), n, 0, NULL); /* the chunk's last o's */
        for (int t = 0; t < 16; t++)
            cg_store(b,
                     cg_load_val(
                         b, wdt, wbuf,
                         cg_iadd(b, wrow, cg_iadd(b, cg_imul_c(b, lo.iv, cp->Cg), cg_idx(b, t)))),
                     stg, cg_iadd(b, row0, cg_iadd(b, lo.iv, cg_idx(b, t * ld))));
        cg_for_end(b, &lo, 0, NULL);
        for (int t = 0; t < 16; t++)
            cv_zero_span(b, zf, stg, cg_iadd(b, row0, cg_idx(b, t * ld)), n, cg_idx(b, ld));
        cg_for_end(b, &lib, 0, NULL);
        i_rest = cg_iadd(b, i0, cg_imul_c(b, nib, 16));
    }
    cg_for_begin(b, &li, i_rest, i1, 0, NULL);
    MlirValue row = cg_iadd(b, base, cg_imul_c(b, isub(b, li.iv, i0), ld));
    if (cp->role == CV_FWD && !cp->phased) {
        MlirValue src =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, g, cp->Og), li.iv), cp->K), k0);
        cg_for_begin(b, &lt, z, n, 0, NULL);
        cg_store(b, cg_load_val(b, wdt, wbuf, cg_iadd(b, src, lt.iv)), stg, cg_iadd(b, row, lt.iv));
        cg_for_end(b, &lt, 0, NULL);
    } else { /* K in whole runs of KK: input channels (conv2d), output channels (the input
              * gradient, whose A is w^T) */
        MlirValue o0 = idiv(b, k0, cp->KK);
        cg_for_begin(b, &lo, o0, idiv(b, k1, cp->KK), 0, NULL);
        MlirValue src = weight_window(b, cp, g, li.iv, lo.iv);
        MlirValue dst = cg_iadd(b, row, cg_imul_c(b, isub(b, lo.iv, o0), cp->KK));
        if (cp->phased) { /* the phase's taps, one by one */
            for (int64_t th = 0; th < cp->ntap[0]; th++)
                for (int64_t tw = 0; tw < cp->ntap[1]; tw++) {
                    int64_t from = cp->tap[0][th] * cp->KWf + cp->tap[1][tw];
                    cg_store(b, cg_load_val(b, wdt, wbuf, cg_iadd(b, src, cg_idx(b, from))), stg,
                             cg_iadd(b, dst, cg_idx(b, th * cp->ntap[1] + tw)));
                }
        } else {
            cg_for_begin(b, &lt, z, cg_idx(b, cp->KK), 0, NULL);
            cg_store(b, cg_load_val(b, wdt, wbuf, cg_iadd(b, src, lt.iv)), stg,
                     cg_iadd(b, dst, lt.iv));
            cg_for_end(b, &lt, 0, NULL);
        }
        cg_for_end(b, &lo, 0, NULL);
    }
    cv_zero_span(b, zf, stg, row, n, cg_idx(b, ld));
    cg_for_end(b, &li, 0, NULL);
    cv_zero_rows_at(b, stg, base, isub(b, i1, i0), cp->mbp, ld, zf);
}

bool cv_weight_pairs_ok(const kc *c, const cv_plan *cp) {
    return cp->phased && cp->mk.pk == 2 && cp->KW == 2 && cp->tap[1][1] == cp->tap[1][0] + 1 &&
           c->g->nodes[cp->plain].dtype == LOOM_DTYPE_BF16;
}

void cv_pack_weight_pairs(kc *c, const cv_plan *cp, MlirValue ap, MlirValue base, MlirValue g,
                          MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1) {
    cg_b *b = c->b;
    MlirValue wbuf = c->bufs[c->s->buf_of[cp->plain]];
    MlirType v2 = cg_vec_t(2, cg_storage_type(b, LOOM_DTYPE_BF16)), v1 = cg_vec_t(1, b->i32);
    int64_t kp = cp->mk.kp;
    MlirValue zi = cg_ci(b, b->i32, 0);
    MlirValue ch0 = idiv(b, k0, cp->KK), np = idiv(b, isub(b, k1, k0), 2);
    cg_for li, lc;
    cg_for_begin(b, &li, i0, i1, 0, NULL);
    MlirValue row = cg_iadd(b, base, cg_imul_c(b, isub(b, li.iv, i0), kp));
    cg_for_begin(b, &lc, ch0, idiv(b, k1, cp->KK), 0, NULL);
    MlirValue src = weight_window(b, cp, g, li.iv, lc.iv);
    MlirValue dst = cg_iadd(b, row, cg_imul_c(b, isub(b, lc.iv, ch0), cp->KH));
    for (int64_t th = 0; th < cp->KH; th++) {
        int64_t from = cp->tap[0][th] * cp->KWf + cp->tap[1][0];
        MlirValue two = cg_vload(b, v2, wbuf, cg_iadd(b, src, cg_idx(b, from)));
        cg_store(b, cg_vextract(b, cg_vbitcast(b, two, v1), 0), ap, cg_iadd(b, dst, cg_idx(b, th)));
    }
    cg_for_end(b, &lc, 0, NULL);
    cg_zero_range(b, ap, cg_iadd(b, row, np), isub(b, cg_idx(b, kp), np), zi); /* K past it */
    cg_for_end(b, &li, 0, NULL);
    cv_zero_rows_at(b, ap, base, isub(b, i1, i0), cp->mbp, kp, zi);
}

/* ap[base + p] = the bf16 pair (stg[2 p], stg[2 p + 1]) for p in [0, n): 16 at a time, the
 * two f32 of a pair being one i64 lane (the first in its low half), then one by one. */
void cv_pair_up(kc *c, MlirValue stg, MlirValue ap, MlirValue base, int64_t n) {
    cg_b *b = c->b;
    MlirType vf = cg_vec_t(16, b->f32);
    cg_for lv, ls;
    cg_for_begin(b, &lv, cg_idx(b, 0), cg_idx(b, n / 16), 0, NULL);
    MlirValue at = cg_imul_c(b, lv.iv, 16), e = cg_imul_c(b, at, 2);
    MlirValue lo = cg_vload(b, vf, stg, e), hi = cg_vload(b, vf, stg, cg_iadd(b, e, cg_idx(b, 16)));
    cg_vstore(b, cg_cvt_bf16x32(b, lo, hi, false), ap, cg_iadd(b, base, at));
    cg_for_end(b, &lv, 0, NULL);
    cg_for_begin(b, &ls, cg_idx(b, n / 16 * 16), cg_idx(b, n), 0, NULL);
    MlirValue e2 = cg_imul_c(b, ls.iv, 2);
    MlirValue lo2 = cg_load(b, stg, e2), hi2 = cg_load(b, stg, cg_iadd(b, e2, cg_idx(b, 1)));
    cg_store(
        b,
        cg_bf16_pair(b, cg_round16(b, LOOM_DTYPE_BF16, lo2), cg_round16(b, LOOM_DTYPE_BF16, hi2)),
        ap, cg_iadd(b, base, ls.iv));
    cg_for_end(b, &ls, 0, NULL);
}

/* The weight gradient's B = dy^T: rows the pixels of destination rows [r0, r1), columns
 * the output channels [j0, j1) of group g, staged as stg[k * b_ld + (j - j0)] (zeros in the
 * columns up to nbp and the rows up to kp * pk): blocks of 16 x 16 transposed in registers
 * (element by element, the strided stores cost as much as the product they feed). */
void cv_stage_dy_t(kc *c, const cv_plan *cp, MlirValue stg, MlirValue g, MlirValue j0, MlirValue j1,
                   MlirValue r0, MlirValue r1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue dy = c->bufs[c->s->buf_of[cp->plain]];
    loom_dtype ddt = c->g->nodes[cp->plain].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0);
    int64_t L = cp->OH * cp->OW;
    /* the chunk's pixels P in [P0, P1) are image n's pixels n L + l: one run per image */
    MlirValue P0 = cg_imul_c(b, r0, cp->OW), P1 = cg_imul_c(b, r1, cp->OW);
    MlirValue ncol = isub(b, j1, j0), nfo = idiv(b, ncol, 16);
    cg_for ln, lob, lpb, lp, lj;
    cg_for_begin(b, &ln, idiv(b, r0, cp->OH),
                 cg_iadd(b, idiv(b, isub(b, r1, cg_idx(b, 1)), cp->OH), cg_idx(b, 1)), 0, NULL);
    MlirValue nL = cg_imul_c(b, ln.iv, L);
    MlirValue plo = imax_s(b, P0, nL), phi = imin_s(b, P1, cg_iadd(b, nL, cg_idx(b, L)));
    MlirValue kb = isub(b, plo, P0), l0 = isub(b, plo, nL), cnt = isub(b, phi, plo);
    MlirValue nfp = idiv(b, cnt, 16);
    MlirValue obase = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, ln.iv, cp->O), cg_imul_c(b, g, cp->Og)),
                                L); /* o = 0 */
    /* blocks of 16 channels x 16 pixels, transposed in registers */
    cg_for_begin(b, &lob, z, nfo, 0, NULL);
    MlirValue o0 = cg_iadd(b, j0, cg_imul_c(b, lob.iv, 16)), col0 = cg_imul_c(b, lob.iv, 16);
    MlirValue orow = cg_iadd(b, obase, cg_imul_c(b, o0, L));
    cg_for_begin(b, &lpb, z, nfp, 0, NULL);
    MlirValue p = cg_iadd(b, l0, cg_imul_c(b, lpb.iv, 16)), v[16];
    for (int i = 0; i < 16; i++)
        v[i] = vload_f32(b, ddt, dy, cg_iadd(b, orow, cg_iadd(b, p, cg_idx(b, i * L))));
    cg_vtranspose16(b, v);
    MlirValue k0 = cg_iadd(b, kb, cg_imul_c(b, lpb.iv, 16));
    for (int t = 0; t < 16; t++)
        cg_vstore(b, v[t], stg,
                  cg_iadd(b, cg_imul_c(b, cg_iadd(b, k0, cg_idx(b, t)), m->b_ld), col0));
    cg_for_end(b, &lpb, 0, NULL);
    cg_for_begin(b, &lp, cg_imul_c(b, nfp, 16), cnt, 0, NULL); /* the run's last pixels */
    MlirValue at = cg_iadd(b, cg_imul_c(b, cg_iadd(b, kb, lp.iv), m->b_ld), col0);
    for (int i = 0; i < 16; i++)
        cg_store(b,
                 cg_load_val(b, ddt, dy,
                             cg_iadd(b, orow, cg_iadd(b, cg_iadd(b, l0, lp.iv), cg_idx(b, i * L)))),
                 stg, cg_iadd(b, at, cg_idx(b, i)));
    cg_for_end(b, &lp, 0, NULL);
    cg_for_end(b, &lob, 0, NULL);
    /* the last channels, one by one */
    cg_for_begin(b, &lj, cg_iadd(b, j0, cg_imul_c(b, nfo, 16)), j1, 0, NULL);
    MlirValue jrow = cg_iadd(b, obase, cg_imul_c(b, lj.iv, L)), col = isub(b, lj.iv, j0);
    cg_for_begin(b, &lp, z, cnt, 0, NULL);
    cg_store(b, cg_load_val(b, ddt, dy, cg_iadd(b, jrow, cg_iadd(b, l0, lp.iv))), stg,
             cg_iadd(b, cg_imul_c(b, cg_iadd(b, kb, lp.iv), m->b_ld), col));
    cg_for_end(b, &lp, 0, NULL);
    cg_for_end(b, &lj, 0, NULL);
    cg_for_end(b, &ln, 0, NULL);
    /* the padding columns of the chunk's rows, and the rows past it */
    MlirValue nk = isub(b, P1, P0);
    cg_for lk;
    cg_for_begin(b, &lk, z, nk, 0, NULL);
    cv_zero_span(b, zf, stg, cg_imul_c(b, lk.iv, m->b_ld), ncol, cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    cv_zero_rows(b, stg, nk, m->kp * m->pk, m->b_ld, zf);
}
