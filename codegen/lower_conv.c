/* Lowering of convolution kernels: conv2d and its two gradients, each an implicit GEMM per
 * group on the packed microkernel of lower_matmul.c (cg_mk_tiles), with the root's fused
 * elementwise epilogue (bias, activation, cast) as a matmul's. NCHW at the API; no im2col
 * in memory: the window operand is packed from the activations block by block.
 *
 * The GEMMs, per group g (Cg = C/G input and Og = O/G output channels, KK = KH*KW):
 *  - conv2d:             y[n, o, p]    = sum_(c,kh,kw)  w[o, (c,kh,kw)] * X[(c,kh,kw), (n,p)]
 *  - conv2d_grad_input:  dx[n, c, p']  = sum_(o,kh,kw)  w[o, c, kh, kw] * D[(o,kh,kw), (n,p')]
 *  - conv2d_grad_weight: dw[o, (c,kh,kw)]^T = sum_(n,p) X[(c,kh,kw), (n,p)] * dy[n, o, p]^T
 * where p runs over output pixels, p' over input pixels, X is x's window matrix (im2col)
 * and D the windows of dy that reach each input pixel (the transposed convolution's). The
 * weight gradient is computed transposed, [Cg*KK, Og], so that its big operand, X, packs
 * as A along pixels (rows of x, contiguous) and only dy, Og per pixel, is transposed.
 *
 * X and D are one thing, a "window matrix": row (ch, kh, kw), column (n, y, q) holds the
 * source (x or dy) at channel ch where the pixel relation big = small * stride - pad + k *
 * dilation holds, 0 where it holds for no source pixel. For X the destination is the
 * small coordinate (the output pixel) and the source the big one (x's); for D the other
 * way round (dy's pixels are the small ones). A row of destination pixels is then one
 * strided copy between bounds computed per (kh, kw): for stride 1 a contiguous copy.
 * Windows are staged row-major (f32, the compute type) and repacked into panels or pairs.
 *
 * Tasks: (group, row block, column block); each packs and multiplies its K in chunks that
 * fit the caches, accumulating in an f32 block of C, then runs the epilogue over the block.
 * Column blocks of conv2d and its input gradient are whole rows of destination pixels
 * (of one image or several), so the epilogue and the staging need no division per pixel. */
#include <string.h>

#include "lower_internal.h"

enum {
    CV_COLS = 256,        /* columns (pixels, or a weight gradient's output channels) of a task */
    CV_ROWS = 256,        /* rows of a task at most */
    CV_KC = 256,          /* K of a packed chunk (window rows; pixels for the weight gradient) */
    CV_TASKS_MIN = 4,     /* fewer tasks than this: split the rows */
    CV_TABLE_BELOW = 16,  /* destination rows narrower than this: stage through a table */
    CV_TAPS_MAX = 16,     /* taps of a phase along an axis (larger windows are not phased) */
    CV_A_CACHE = 8 << 20, /* bytes of packed weights a thread keeps across its tasks */
};

typedef enum cv_role { CV_FWD, CV_GRAD_INPUT, CV_GRAD_WEIGHT } cv_role;

typedef struct cv_plan {
    cv_role role;
    loom_dtype dt;
    /* the convolution in forward terms: x [N, C, H, W], w [O, Cg, KH, KW], y [N, O, OH, OW] */
    int64_t N, C, H, W, O, OH, OW, KH, KW, G, Cg, Og, KK;
    int64_t st[2], pd[2], dl[2];
    /* the window matrix: source node and its channels (per group, in all), spatial extents
     * of source and destination, and which of them is the big coordinate */
    int32_t win, plain; /* nodes: the window's source, the other operand */
    int64_t wch, wC, sH, sW, dH, dW;
    bool dst_big;
    bool tab; /* stage through a pixel table (build_table) of ldt pixels a tap */
    int64_t ldt;
    /* a strided input gradient is computed per phase: the destination pixels (ph[0] + st[0]
     * y, ph[1] + st[1] q) and the taps that reach them, tap[a][t] along axis a, which read
     * the source at the destination's y or q plus off[a][t]; KH, KW, KK, dH, dW, K are the
     * phase's, KWf and KKf the whole window's */
    bool phased;
    int64_t ph[2], ntap[2], tap[2][CV_TAPS_MAX], off[2][CV_TAPS_MAX], KWf, KKf;
    /* conv2d and the input gradient: the weights' packed rows for all of K (a block of
     * mbp x kp per chunk) are kept across a thread's consecutive tasks of one row block */
    bool a_cache;
    /* the GEMM per group, C [M, NC] = A [M, K] x B [K, NC], and its blocks */
    int64_t M, K, NC;
    int64_t rows, nbm, cols, nbn, kc, nbk;
    int64_t pix_rows; /* destination pixel rows per column block (FWD, GI) or K chunk (GW) */
    int64_t mbp;
    cg_mk mk;
    sink epi[64];
    int32_t n_epi;
    nest ns;
} cv_plan;

static MlirValue idiv(cg_b *b, MlirValue x, int64_t c) {
    return c == 1 ? x : cg_bin(b, "arith.divui", x, cg_idx(b, c));
}

static MlirValue irem(cg_b *b, MlirValue x, int64_t c) {
    return c == 1 ? cg_idx(b, 0) : cg_bin(b, "arith.remui", x, cg_idx(b, c));
}

static MlirValue isub(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.subi", x, y);
}

static MlirValue imax_s(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.maxsi", x, y);
}

static MlirValue imin_s(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.minsi", x, y);
}

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

static MlirValue and_i1(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.andi", x, y);
}

/* buf[at + i] = 0 for i in [lo, hi) */
static void zero_range(cg_b *b, MlirValue zero, MlirValue buf, MlirValue at, MlirValue lo,
                       MlirValue hi) {
    cg_for l;
    cg_for_begin(b, &l, lo, hi, 0, NULL);
    cg_store(b, zero, buf, cg_iadd(b, at, l.iv));
    cg_for_end(b, &l, 0, NULL);
}

/* The source coordinate along axis a (0: rows, 1: columns) of destination coordinate dst
 * for kernel tap k, and in *ok whether the window reaches a source pixel there. */
static MlirValue src_coord(cg_b *b, const cv_plan *cp, int a, MlirValue dst, MlirValue k,
                           MlirValue *ok) {
    MlirValue z = cg_idx(b, 0);
    int64_t ext = a == 0 ? cp->sH : cp->sW;
    MlirValue s;
    if (cp->phased) { /* s = dst + off[a][k] */
        MlirValue off = cg_idx(b, cp->off[a][0]);
        for (int64_t t = 1; t < cp->ntap[a]; t++)
            off = cg_select(b, cg_cmpi(b, CG_I_EQ, k, cg_idx(b, t)), cg_idx(b, cp->off[a][t]), off);
        s = cg_iadd(b, dst, off);
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

/* Stages window rows [j0, j1) x destination pixel rows [r0, r1) of group g into buf (f32):
 * buf[(j - j0) * ld + (r - r0) * dW + q] for q in [0, dW), and zeros in each row from
 * (r1 - r0) * dW up to width (the block's padding). */
static void stage_window(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                         MlirValue rtab, MlirValue g, MlirValue j0, MlirValue j1, MlirValue r0,
                         MlirValue r1) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirValue zf = cg_cf(b, b->f32, 0.0), z = cg_idx(b, 0), one = cg_idx(b, 1);
    /* along the width: small in [0, SMALL), big in [0, BIG) */
    int64_t SMALL = cp->dst_big ? cp->sW : cp->dW, BIG = cp->dst_big ? cp->dW : cp->sW;
    int64_t s1 = cp->st[1];
    cg_for lj, lr, lt;
    cg_for_begin(b, &lj, j0, j1, 0, NULL);
    MlirValue ch = idiv(b, lj.iv, cp->KK), kk = irem(b, lj.iv, cp->KK);
    MlirValue kh = idiv(b, kk, cp->KW), kw = irem(b, kk, cp->KW);
    /* e = pad - kw * dil: big = small * s - e */
    MlirValue e = isub(b, cg_idx(b, cp->pd[1]), cg_imul_c(b, kw, cp->dl[1]));
    MlirValue slo = imax_s(b, z, ceildiv_s(b, e, s1));
    MlirValue shi = imin_s(b, cg_idx(b, SMALL),
                           cg_iadd(b, floordiv_s(b, cg_iadd(b, e, cg_idx(b, BIG - 1)), s1), one));
    MlirValue T = imax_s(b, isub(b, shi, slo), z);
    MlirValue big0 = isub(b, cg_imul_c(b, slo, s1), e);
    MlirValue d0 = cp->dst_big ? big0 : slo, s0 = cp->dst_big ? slo : big0;
    int64_t dstep = cp->dst_big ? s1 : 1, sstep = cp->dst_big ? 1 : s1;
    MlirValue chan = cg_iadd(b, cg_imul_c(b, g, cp->wch), ch);
    MlirValue jrow = cg_imul_c(b, isub(b, lj.iv, j0), ld), trow = cg_imul_c(b, kh, cp->pix_rows);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    /* the source row, if any (build_rows) */
    MlirValue roff = cg_load(b, rtab, cg_iadd(b, trow, isub(b, lr.iv, r0)));
    MlirValue vok = cg_cmpi(b, CG_I_SGE, roff, cg_ci(b, b->i64, 0));
    MlirValue ok = and_i1(b, vok, cg_cmpi(b, CG_I_SGT, T, z));
    MlirValue at = cg_iadd(b, jrow, cg_imul_c(b, isub(b, lr.iv, r0), cp->dW));
    cg_if fz, fc;
    cg_if_begin(b, &fz, cg_bin(b, "arith.xori", ok, cg_ci(b, b->i1, 1)));
    zero_range(b, zf, buf, at, z, cg_idx(b, cp->dW));
    cg_if_end(b, &fz);
    cg_if_begin(b, &fc, ok);
    if (cp->dst_big && s1 > 1) {
        zero_range(b, zf, buf, at, z, cg_idx(b, cp->dW));
    } else {
        zero_range(b, zf, buf, at, z, d0);
        zero_range(b, zf, buf, at, cg_iadd(b, d0, cg_imul_c(b, T, dstep)), cg_idx(b, cp->dW));
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
    zero_range(b, zf, buf, jrow, used, cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* The source rows of destination pixel rows [r0, r1) for stage_window, per kernel row kh:
 * rtab[kh * pix_rows + r - r0] = the offset of row sy of image n in a channel's (n wC sH sW +
 * sy sW), or -1 where the window reads padding rows. Built once per block of pixel rows for
 * all its window rows (saves a division and the row's bounds per copied row). */
static void build_rows(kc *c, const cv_plan *cp, MlirValue rtab, MlirValue r0, MlirValue r1) {
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
static void build_table(kc *c, const cv_plan *cp, MlirValue tab, int64_t ldt, MlirValue r0,
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
static void stage_window_tab(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
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
    zero_range(b, zf, buf, row, npix, cg_idx(b, width));
    cg_for_end(b, &lj, 0, NULL);
}

/* B from staged rows stg[k * b_ld + j] (k in [0, kp * pk): rows past the chunk's K are
 * zero) in pairs of rows 2 kk, 2 kk + 1, row-major: bp[kk * b_ld + j] (f32 B is read from
 * the staged rows themselves). */
static void panelize(kc *c, const cv_plan *cp, MlirValue stg, MlirValue bp) {
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
static void zero_rows_at(cg_b *b, MlirValue buf, MlirValue base, MlirValue from, int64_t to,
                         int64_t ld, MlirValue zero) {
    cg_for l;
    cg_for_begin(b, &l, cg_imul_c(b, from, ld), cg_idx(b, to * ld), 0, NULL);
    cg_store(b, zero, buf, cg_iadd(b, base, l.iv));
    cg_for_end(b, &l, 0, NULL);
}

static void zero_rows(cg_b *b, MlirValue buf, MlirValue from, int64_t to, int64_t ld,
                      MlirValue zero) {
    cg_for l;
    cg_for_begin(b, &l, cg_imul_c(b, from, ld), cg_idx(b, to * ld), 0, NULL);
    cg_store(b, zero, buf, l.iv);
    cg_for_end(b, &l, 0, NULL);
}

/* 16 values of dtype dt at mem[off] as a vector of f32. */
static MlirValue vload_f32(cg_b *b, loom_dtype dt, MlirValue mem, MlirValue off) {
    MlirType vf = cg_vec_t(16, b->f32), vi = cg_vec_t(16, b->i32);
    if (dt == LOOM_DTYPE_F16)
        return cg_conv(b, "arith.extf", cg_vload(b, cg_vec_t(16, b->f16), mem, off), vf);
    if (dt != LOOM_DTYPE_BF16)
        return cg_vload(b, vf, mem, off);
    MlirValue w = cg_conv(b, "arith.extui", cg_vload(b, cg_vec_t(16, b->i16), mem, off), vi);
    w = cg_bin(b, "arith.shli", w, cg_vbroadcast(b, cg_ci(b, b->i32, 16), vi));
    return cg_conv(b, "arith.bitcast", w, vf);
}

static MlirValue shuffle16(cg_b *b, MlirValue x, MlirValue y, const int64_t *mask) {
    MlirType t = mlirValueGetType(x);
    MlirAttribute lanes[16]; /* MLIR 19: an ArrayAttr of i64 */
    for (int l = 0; l < 16; l++)
        lanes[l] = mlirIntegerAttrGet(b->i64, mask[l]);
    MlirNamedAttribute at = cg_named(b, "mask", mlirArrayAttrGet(b->ctx, 16, lanes));
    MlirValue ops[2] = {x, y};
    return mlirOperationGetResult(cg_op(b, "vector.shuffle", 2, ops, 1, &t, 1, &at), 0);
}

/* Transposes the 16 x 16 matrix of rows r[0..15] in place: for block sizes 8, 4, 2, 1,
 * rows i and i + s (bit s of i clear) swap their off-diagonal s x s blocks (64 shuffles). */
static void transpose16(cg_b *b, MlirValue *r) {
    for (int s = 8; s >= 1; s /= 2) {
        int64_t mi[16], mj[16];
        for (int l = 0; l < 16; l++) {
            mi[l] = (l & s) ? 16 + l - s : l;
            mj[l] = (l & s) ? 16 + l : l + s;
        }
        for (int i = 0; i < 16; i++)
            if (!(i & s)) {
                MlirValue x = r[i], y = r[i + s];
                r[i] = shuffle16(b, x, y, mi);
                r[i + s] = shuffle16(b, x, y, mj);
            }
    }
}

/* Stages A = the weights' rows [i0, i1) x K [k0, k1) of group g as stg[base + (i - i0) * ld
 * + k - k0] (f32; zeros past k1 up to ld and in the rows up to mbp): conv2d's w[g Og + i, k], a
 * contiguous run per row; the input gradient's w[g Og + o, i, kh, kw] for k = (o, kh, kw),
 * runs of KK (its chunks are whole o's). */
static void stage_weights(kc *c, const cv_plan *cp, MlirValue stg, MlirValue base, int64_t ld,
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
        transpose16(b, v);
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
            zero_range(b, zf, stg, cg_iadd(b, row0, cg_idx(b, t * ld)), n, cg_idx(b, ld));
        cg_for_end(b, &lib, 0, NULL);
        i_rest = cg_iadd(b, i0, cg_imul_c(b, nib, 16));
    }
    cg_for_begin(b, &li, i_rest, i1, 0, NULL);
    MlirValue row = cg_iadd(b, base, cg_imul_c(b, isub(b, li.iv, i0), ld));
    if (cp->role == CV_FWD) {
        MlirValue src =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, g, cp->Og), li.iv), cp->K), k0);
        cg_for_begin(b, &lt, z, n, 0, NULL);
        cg_store(b, cg_load_val(b, wdt, wbuf, cg_iadd(b, src, lt.iv)), stg, cg_iadd(b, row, lt.iv));
        cg_for_end(b, &lt, 0, NULL);
    } else {
        MlirValue o0 = idiv(b, k0, cp->KK);
        cg_for_begin(b, &lo, o0, idiv(b, k1, cp->KK), 0, NULL);
        MlirValue o = cg_iadd(b, cg_imul_c(b, g, cp->Og), lo.iv);
        MlirValue src = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, o, cp->Cg), li.iv), cp->KKf);
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
    zero_range(b, zf, stg, row, n, cg_idx(b, ld));
    cg_for_end(b, &li, 0, NULL);
    zero_rows_at(b, stg, base, isub(b, i1, i0), cp->mbp, ld, zf);
}

/* ap[base + p] = the bf16 pair (stg[2 p], stg[2 p + 1]) for p in [0, n): 16 at a time, the
 * two f32 of a pair being one i64 lane (the first in its low half), then one by one. */
static void pair_up(kc *c, MlirValue stg, MlirValue ap, MlirValue base, int64_t n) {
    cg_b *b = c->b;
    MlirType v32 = cg_vec_t(32, b->f32), v16l = cg_vec_t(16, b->i64), v16i = cg_vec_t(16, b->i32);
    cg_for lv, ls;
    cg_for_begin(b, &lv, cg_idx(b, 0), cg_idx(b, n / 16), 0, NULL);
    MlirValue at = cg_imul_c(b, lv.iv, 16);
    MlirValue l = cg_vbitcast(b, cg_vload(b, v32, stg, cg_imul_c(b, at, 2)), v16l);
    MlirValue lo = cg_bin(b, "arith.andi",
                          cg_bin(b, "arith.shrui", l, cg_vbroadcast(b, cg_ci(b, b->i64, 16), v16l)),
                          cg_vbroadcast(b, cg_ci(b, b->i64, 0xffff), v16l));
    MlirValue hi = cg_bin(b, "arith.andi",
                          cg_bin(b, "arith.shrui", l, cg_vbroadcast(b, cg_ci(b, b->i64, 32), v16l)),
                          cg_vbroadcast(b, cg_ci(b, b->i64, 0xffff0000ll), v16l));
    cg_vstore(b, cg_conv(b, "arith.trunci", cg_bin(b, "arith.ori", lo, hi), v16i), ap,
              cg_iadd(b, base, at));
    cg_for_end(b, &lv, 0, NULL);
    cg_for_begin(b, &ls, cg_idx(b, n / 16 * 16), cg_idx(b, n), 0, NULL);
    MlirValue e = cg_imul_c(b, ls.iv, 2);
    cg_store(b, cg_bf16_pair(b, cg_load(b, stg, e), cg_load(b, stg, cg_iadd(b, e, cg_idx(b, 1)))),
             ap, cg_iadd(b, base, ls.iv));
    cg_for_end(b, &ls, 0, NULL);
}

/* The weight gradient's B = dy^T: rows the pixels of destination rows [r0, r1), columns
 * the output channels [j0, j1) of group g, staged as stg[k * b_ld + (j - j0)] (zeros in the
 * columns up to nbp and the rows up to kp * pk): blocks of 16 x 16 transposed in registers
 * (element by element, the strided stores cost as much as the product they feed). */
static void stage_dy_t(kc *c, const cv_plan *cp, MlirValue stg, MlirValue g, MlirValue j0,
                       MlirValue j1, MlirValue r0, MlirValue r1) {
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
    transpose16(b, v);
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
    zero_range(b, zf, stg, cg_imul_c(b, lk.iv, m->b_ld), ncol, cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    zero_rows(b, stg, nk, m->kp * m->pk, m->b_ld, zf);
}

/* The epilogue of a task's block: C's element (i, column) is the root's element at the
 * nest indices set here; the fused sinks evaluate and store from it. */
static loom_status emit_epilogue(kc *c, const cv_plan *cp, MlirValue cs, MlirValue g, MlirValue i0,
                                 MlirValue i1, MlirValue c0, MlirValue c1) {
    cg_b *b = c->b;
    const nest *ns = &cp->ns;
    loom_status st;
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
        MlirValue acc = cg_load(b, cs, at);
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
        cg_for_begin(b, &lr, c0, c1, 0, NULL);
        SET_DIM(0, idiv(b, lr.iv, cp->dH));
        MlirValue y = irem(b, lr.iv, cp->dH);
        SET_DIM(2, cp->phased ? cg_iadd(b, cg_imul_c(b, y, cp->st[0]), cg_idx(b, cp->ph[0])) : y);
        MlirValue at = cg_iadd(b, crow, cg_imul_c(b, isub(b, lr.iv, c0), cp->dW));
        cg_for_begin(b, &lq, cg_idx(b, 0), cg_idx(b, cp->dW), 0, NULL);
        SET_DIM(3, cp->phased ? cg_iadd(b, cg_imul_c(b, lq.iv, cp->st[1]), cg_idx(b, cp->ph[1]))
                              : lq.iv);
        /* a phase no tap reaches is zero (its C never written) */
        MlirValue acc = cp->K > 0 ? cg_load(b, cs, cg_iadd(b, at, lq.iv)) : cg_cf(b, b->f32, 0.0);
        c->bound_v = is_16(cp->dt) ? cg_round16(b, cp->dt, acc) : acc;
        st = cg_emit_sinks(c, cp->n_epi, cp->epi);
        cg_for_end(b, &lq, 0, NULL);
        cg_for_end(b, &lr, 0, NULL);
        cg_for_end(b, &li, 0, NULL);
    }
#undef SET_DIM
    return st;
}

/* The plan's shapes and blocks from the root and its operands. */
static loom_status plan_conv(kc *c, cv_plan *cp) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    const loom_ir_node *a = &g->nodes[root->inputs[0]], *bn = &g->nodes[root->inputs[1]];
    const loom_ir_conv *cv = &root->attrs.conv;
    cp->role = root->op == LOOM_IR_OP_CONV2D              ? CV_FWD
               : root->op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? CV_GRAD_INPUT
                                                          : CV_GRAD_WEIGHT;
    cp->dt = root->dtype;
    if (cp->dt != LOOM_DTYPE_F32 && !is_16(cp->dt))
        return cg_unsupported(c, c->k->root,
                              "a convolution in a dtype other than f32, bf16 and f16 (the "
                              "conv-decompose pass rewrites those into matmuls)");
    if (root->rank != 4 || a->rank != 4 || bn->rank != 4 || cv->groups < 1)
        return cg_bad_plan(c, c->k->root, "a convolution whose operands are not 4-D NCHW");
    const loom_ir_node *x, *w, *y;
    x = cp->role == CV_GRAD_INPUT ? root : a;
    w = cp->role == CV_GRAD_WEIGHT ? root : bn;
    y = cp->role == CV_FWD ? root : cp->role == CV_GRAD_INPUT ? a : bn;
    cp->N = x->shape[0], cp->C = x->shape[1], cp->H = x->shape[2], cp->W = x->shape[3];
    cp->O = w->shape[0], cp->Cg = w->shape[1], cp->KH = w->shape[2], cp->KW = w->shape[3];
    cp->OH = y->shape[2], cp->OW = y->shape[3];
    cp->G = cv->groups, cp->Og = cp->O / cp->G, cp->KK = cp->KH * cp->KW;
    for (int i = 0; i < 2; i++) {
        cp->st[i] = cv->stride[i];
        cp->pd[i] = cv->padding[i];
        cp->dl[i] = cv->dilation[i];
    }
    for (int32_t q = 0; q < 2; q++)
        if (c->s->buf_of[root->inputs[q]] < 0)
            return cg_unsupported(c, root->inputs[q],
                                  "a convolution operand computed inside the convolution's "
                                  "kernel (its operands are read from buffers)");
    cp->win = root->inputs[0]; /* x, or dy for the input gradient */
    cp->plain = root->inputs[1];
    if (cp->role == CV_GRAD_INPUT) {
        cp->wch = cp->Og, cp->wC = cp->O, cp->sH = cp->OH, cp->sW = cp->OW;
        cp->dH = cp->H, cp->dW = cp->W, cp->dst_big = true;
        cp->M = cp->Cg, cp->K = cp->Og * cp->KK, cp->NC = cp->N * cp->H * cp->W;
    } else {
        cp->wch = cp->Cg, cp->wC = cp->C, cp->sH = cp->H, cp->sW = cp->W;
        cp->dH = cp->OH, cp->dW = cp->OW, cp->dst_big = false;
        if (cp->role == CV_FWD)
            cp->M = cp->Og, cp->K = cp->Cg * cp->KK, cp->NC = cp->N * cp->OH * cp->OW;
        else
            cp->M = cp->Cg * cp->KK, cp->K = cp->N * cp->OH * cp->OW, cp->NC = cp->Og;
    }
    cp->KWf = cp->KW, cp->KKf = cp->KK;
    return LOOM_OK;
}

static bool table_fits(const kc *c, const cv_plan *cp) {
    return loom_ir_numel(4, c->g->nodes[cp->win].shape) < INT32_MAX;
}

/* The blocks of the plan's GEMM (its shapes set). */
static void plan_blocks(const kc *c, cv_plan *cp) {
    int64_t prow = cp->role == CV_GRAD_WEIGHT ? CV_KC : CV_COLS, all_rows = cp->N * cp->dH;
    cp->pix_rows = (prow + cp->dW / 2) / (cp->dW > 0 ? cp->dW : 1);
    cp->pix_rows = cp->pix_rows < 1 ? 1 : cp->pix_rows > all_rows ? all_rows : cp->pix_rows;
    if (cp->role == CV_GRAD_WEIGHT) {
        cp->cols = cp->NC < CV_COLS ? cp->NC : CV_COLS;
        cp->kc = cp->pix_rows * cp->dW;
        cp->nbk = ceil_div(all_rows, cp->pix_rows);
    } else {
        cp->cols = cp->pix_rows * cp->dW;
        /* chunks of about equal size up to 1.5 CV_KC (conv2 of the CNN's K = 288 in chunks
         * of 256 and 32 spent a pass over C on 32 rows of K); the input gradient's are whole
         * output channels (runs of KK) */
        int64_t kch = ceil_div(cp->K, ceil_div(cp->K, CV_KC + CV_KC / 2));
        if (cp->role == CV_GRAD_INPUT && cp->KK > 0)
            kch = ceil_div(kch, cp->KK) * cp->KK;
        cp->kc = kch < cp->K ? kch : cp->K;
        cp->nbk = ceil_div(cp->K, cp->kc);
    }
    cp->nbn =
        cp->role == CV_GRAD_WEIGHT ? ceil_div(cp->NC, cp->cols) : ceil_div(all_rows, cp->pix_rows);
    cp->rows = cp->M < CV_ROWS ? cp->M : CV_ROWS;
    int64_t tasks = cp->G * cp->nbn * ceil_div(cp->M, cp->rows);
    if (tasks < CV_TASKS_MIN && cp->M > 16) {
        int64_t nbm = ceil_div(CV_TASKS_MIN, cp->G * cp->nbn);
        int64_t r = ceil_div(ceil_div(cp->M, nbm), 16) * 16;
        cp->rows = r < cp->rows ? r : cp->rows;
    }
    if (cp->role == CV_GRAD_WEIGHT && cp->rows < cp->M) /* blocks of whole channels */
        cp->rows = ceil_div(cp->rows, cp->KK) * cp->KK;
    if (cp->rows < 1)
        cp->rows = 1;
    cp->nbm = ceil_div(cp->M, cp->rows);
    cg_mk *m = &cp->mk;
    m->nv = cp->cols <= MK_PANEL ? 1 : 2;
    m->mr = MK_ACC / m->nv;
    m->pk = is_16(cp->dt) && cg_mk_pairs(cp->dt) ? 2 : 1;
    m->kp = ceil_div(cp->kc, m->pk);
    m->nbp = ceil_div(cp->cols, m->nv * MK_PANEL) * m->nv * MK_PANEL;
    /* staged B rows: a stride of a multiple of 128 floats made the weight gradient's tiles
     * (loading two rows 1 KB apart per step) 1.9x slower */
    m->b_ld = m->nbp % 128 == 0 ? m->nbp + MK_PANEL : m->nbp;
    /* rows narrower than this copy faster through a table (its i32 offsets must fit) */
    cp->tab = cp->phased || (cp->dW < CV_TABLE_BELOW && table_fits(c, cp));
    cp->ldt = cp->role == CV_GRAD_WEIGHT ? cp->kc : cp->cols;
    cp->mbp = ceil_div(cp->rows, m->mr) * m->mr;
    cp->a_cache =
        cp->role != CV_GRAD_WEIGHT && cp->nbn > 1 && cp->mbp * m->kp * cp->nbk * 4 <= CV_A_CACHE;
}

/* Phase (p0, p1) of a strided input gradient (plan_conv's plan in *cp): its taps, pixels and
 * GEMM. False when a window has more taps per phase than a phase holds. */
static bool plan_phase(const kc *c, cv_plan *cp, int64_t p0, int64_t p1) {
    int64_t ph[2] = {p0, p1}, k[2] = {cp->KH, cp->KW}, ext[2] = {cp->H, cp->W}, n[2];
    cp->phased = true;
    for (int a = 0; a < 2; a++) {
        cp->ph[a] = ph[a];
        cp->ntap[a] = 0;
        for (int64_t t = 0; t < k[a]; t++) {
            int64_t num = ph[a] + cp->pd[a] - t * cp->dl[a], s = cp->st[a];
            if (((num % s) + s) % s != 0)
                continue;
            if (cp->ntap[a] == CV_TAPS_MAX)
                return false;
            cp->tap[a][cp->ntap[a]] = t;
            cp->off[a][cp->ntap[a]++] = (num - ((num % s) + s) % s) / s; /* exact: floor */
        }
        n[a] = ph[a] < ext[a] ? ceil_div(ext[a] - ph[a], cp->st[a]) : 0;
    }
    cp->KH = cp->ntap[0], cp->KW = cp->ntap[1], cp->KK = cp->KH * cp->KW;
    cp->dH = n[0], cp->dW = n[1];
    cp->K = cp->Og * cp->KK, cp->NC = cp->N * cp->dH * cp->dW;
    plan_blocks(c, cp);
    return true;
}

/* The task's buffers (sized for every phase's blocks). */
typedef struct cv_bufs {
    MlirValue ap, bp, cs, stg, stga, tab, rtab;
    MlirValue afull, akey; /* a_cache: the packed weights, and whose they are (tag, row block) */
} cv_bufs;

/* Stages the weights' rows [i0, i1) x K [k0, k1) as A at ap[base] (paired through stga). */
static void pack_weights(kc *c, const cv_plan *cp, const cv_bufs *u, MlirValue ap, MlirValue base,
                         MlirValue g, MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1) {
    const cg_mk *m = &cp->mk;
    if (m->pk == 1) {
        stage_weights(c, cp, ap, base, m->kp, g, i0, i1, k0, k1);
        return;
    }
    stage_weights(c, cp, u->stga, cg_idx(c->b, 0), m->kp * m->pk, g, i0, i1, k0, k1);
    pair_up(c, u->stga, ap, base, cp->mbp * m->kp);
}

/* One task of plan cp (tag: its index among the kernel's plans): t = (g * nbm + ib) * nbn +
 * jb for conv2d and the input gradient (a row block's tasks are consecutive, sharing its
 * weights), (g * nbn + jb) * nbm + ib for the weight gradient. */
static loom_status emit_task(kc *c, const cv_plan *cp, const cv_bufs *u, MlirValue t, int32_t tag) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    bool gw = cp->role == CV_GRAD_WEIGHT;
    int64_t ld = m->kp * m->pk; /* row stride of A's staged rows */
    MlirValue gi, ib, jb, gib = {NULL};
    if (gw) {
        MlirValue gjb = idiv(b, t, cp->nbm);
        ib = irem(b, t, cp->nbm), gi = idiv(b, gjb, cp->nbn), jb = irem(b, gjb, cp->nbn);
    } else {
        gib = idiv(b, t, cp->nbn);
        jb = irem(b, t, cp->nbn), gi = idiv(b, gib, cp->nbm), ib = irem(b, gib, cp->nbm);
    }
    MlirValue i0 = cg_imul_c(b, ib, cp->rows);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, cp->rows)), cg_idx(b, cp->M));
    /* the block's columns: output channels [c0, c1) (weight gradient) or destination pixel
     * rows [c0, c1) */
    int64_t cstep = gw ? cp->cols : cp->pix_rows, cend = gw ? cp->NC : cp->N * cp->dH;
    MlirValue c0 = cg_imul_c(b, jb, cstep);
    MlirValue c1 = cg_imin(b, cg_iadd(b, c0, cg_idx(b, cstep)), cg_idx(b, cend));
    MlirValue ncols = gw ? isub(b, c1, c0) : cg_imul_c(b, isub(b, c1, c0), cp->dW);
    MlirValue zf = cg_cf(b, b->f32, 0.0);
    if (cp->K == 0) /* a phase no tap reaches: its epilogue alone (zeros), no product code */
        return cp->n_epi > 0 ? emit_epilogue(c, cp, u->cs, gi, i0, i1, c0, c1) : LOOM_OK;
    zero_rows(b, u->cs, cg_idx(b, 0), cp->mbp, m->nbp, zf);
    if (cp->tab && !gw)
        build_table(c, cp, u->tab, cp->ldt, c0, c1);
    else if (!gw)
        build_rows(c, cp, u->rtab, c0, c1);
    int64_t a_chunk = cp->mbp * m->kp;
    if (cp->a_cache) { /* all of K's weights, unless this thread's last task packed them */
        MlirValue key =
            cg_conv(b, "arith.index_cast", cg_iadd(b, cg_idx(b, (int64_t)tag << 40), gib), b->i64);
        cg_if f;
        cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, u->akey, cg_idx(b, 0)), key));
        cg_for la;
        cg_for_begin(b, &la, cg_idx(b, 0), cg_idx(b, cp->nbk), 0, NULL);
        MlirValue k0 = cg_imul_c(b, la.iv, cp->kc);
        MlirValue k1 = cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->kc)), cg_idx(b, cp->K));
        pack_weights(c, cp, u, u->afull, cg_imul_c(b, la.iv, a_chunk), gi, i0, i1, k0, k1);
        cg_for_end(b, &la, 0, NULL);
        cg_store(b, key, u->akey, cg_idx(b, 0));
        cg_if_end(b, &f);
    }
    cg_for lk;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, cp->nbk), 0, NULL);
    if (gw) { /* K chunk: destination pixel rows [k0, k1) */
        MlirValue k0 = cg_imul_c(b, lk.iv, cp->pix_rows);
        MlirValue k1 =
            cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->pix_rows)), cg_idx(b, cp->N * cp->dH));
        if (cp->tab) {
            build_table(c, cp, u->tab, cp->ldt, k0, k1);
            stage_window_tab(c, cp, u->stga, ld, ld, u->tab, cp->ldt, gi, i0, i1,
                             cg_imul_c(b, isub(b, k1, k0), cp->dW));
        } else {
            build_rows(c, cp, u->rtab, k0, k1);
            stage_window(c, cp, u->stga, ld, ld, u->rtab, gi, i0, i1, k0, k1);
        }
        zero_rows(b, u->stga, isub(b, i1, i0), cp->mbp, ld, zf);
        if (m->pk == 2)
            pair_up(c, u->stga, u->ap, cg_idx(b, 0), cp->mbp * m->kp);
        stage_dy_t(c, cp, u->stg, gi, c0, c1, k0, k1);
    } else { /* K chunk: window rows [k0, k1) */
        MlirValue k0 = cg_imul_c(b, lk.iv, cp->kc);
        MlirValue k1 = cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->kc)), cg_idx(b, cp->K));
        if (!cp->a_cache)
            pack_weights(c, cp, u, u->ap, cg_idx(b, 0), gi, i0, i1, k0, k1);
        if (cp->tab)
            stage_window_tab(c, cp, u->stg, m->b_ld, m->nbp, u->tab, cp->ldt, gi, k0, k1, ncols);
        else
            stage_window(c, cp, u->stg, m->b_ld, m->nbp, u->rtab, gi, k0, k1, c0, c1);
        zero_rows(b, u->stg, isub(b, k1, k0), m->kp * m->pk, m->b_ld, zf);
    }
    if (m->pk == 2)
        panelize(c, cp, u->stg, u->bp);
    MlirValue a0 = cp->a_cache ? cg_imul_c(b, lk.iv, a_chunk) : cg_idx(b, 0);
    cg_mk_tiles(c, m, cp->a_cache ? u->afull : u->ap, a0, m->pk == 2 ? u->bp : u->stg, u->cs,
                isub(b, i1, i0), ncols, true);
    cg_for_end(b, &lk, 0, NULL);
    return cp->n_epi > 0 ? emit_epilogue(c, cp, u->cs, gi, i0, i1, c0, c1) : LOOM_OK;
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static int64_t tasks_of(const cv_plan *cp) {
    return cp->G * cp->nbm * cp->nbn;
}

loom_status cg_lower_conv(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 2)
        return cg_bad_plan(c, root_id, "a convolution without two operands");
    /* cps[0]: the convolution's plan; a strided input gradient's phases in cps[1..] */
    enum { PHASES_MAX = 16 };
    size_t bytes = (1 + PHASES_MAX) * sizeof(cv_plan);
    cv_plan *cps = loom_ir_alloc(&c->s->alloc, bytes), *cp = cps;
    if (!cps)
        return cg_oom(c);
    memset(cps, 0, bytes);
    int32_t n_ph = 0;
    loom_status st = plan_conv(c, cp);
    if (st != LOOM_OK)
        goto done;
    plan_blocks(c, cp);
    /* a strided input gradient reads a pixel of dy only at the taps that reach it: per
     * phase of the destination pixels, a GEMM over those taps (computing every tap at every
     * pixel would multiply zeros: 3/4 of the work of a stride 2) */
    if (cp->role == CV_GRAD_INPUT && (cp->st[0] > 1 || cp->st[1] > 1) &&
        cp->st[0] * cp->st[1] <= PHASES_MAX && table_fits(c, cp)) {
        for (int64_t p0 = 0; p0 < cp->st[0]; p0++)
            for (int64_t p1 = 0; p1 < cp->st[1]; p1++) {
                cps[1 + n_ph] = *cp;
                if (!plan_phase(c, &cps[1 + n_ph], p0, p1)) {
                    n_ph = 0;
                    p0 = cp->st[0];
                    break;
                }
                n_ph++;
            }
    }
    cg_nest_init(&cp->ns, root->rank, root->shape);
    cp->ns.no_merge = true;
    c->bound = root_id;
    cg_identity_map(&cp->ns, &c->bound_map);
    for (int32_t i = 0; i < c->k->n_results; i++) {
        int32_t id = c->k->results[i];
        const loom_ir_node *n = &g->nodes[id];
        if (!c->s->dep_root[id])
            continue;
        if (!same_shape(n, root)) {
            st = cg_unsupported(c, id,
                                "a convolution epilogue result whose shape is not the "
                                "convolution's");
            goto done;
        }
        if (cp->n_epi == 64) {
            st = cg_unsupported(c, id, "more than 64 epilogue results");
            goto done;
        }
        cp->epi[cp->n_epi] = (sink){.node = id, .store = true};
        cg_identity_map(&cp->ns, &cp->epi[cp->n_epi++].map);
    }
    if ((st = cg_side_nests(c, root, SIDE_MATMUL)) != LOOM_OK)
        goto done;
    if ((st = cg_plan_nest(c, &cp->ns, cp->n_epi, cp->epi)) != LOOM_OK)
        goto done;
    for (int32_t q = 1; q <= n_ph; q++) { /* the epilogue is the same in every phase */
        cps[q].ns = cp->ns;
        cps[q].n_epi = cp->n_epi;
        memcpy(cps[q].epi, cp->epi, sizeof cp->epi);
    }
    /* the plans that run: the convolution's, or its phases' one after the other */
    cv_plan *run = n_ph > 0 ? cps + 1 : cps;
    int32_t n_run = n_ph > 0 ? n_ph : 1;
    int64_t numel = loom_ir_numel(root->rank, root->shape), tasks = 0, work = 0;
    for (int32_t q = 0; q < n_run; q++) {
        tasks += tasks_of(&run[q]);
        work = max64(work, run[q].rows * run[q].cols * (run[q].K > 0 ? run[q].K : 1));
    }
    c->extent = numel > 0 && tasks > 0 ? tasks : 1;
    c->grain = cg_grain_for(work);
    if (!c->emit || numel == 0)
        goto done;

    cg_b *b = c->b;
    /* buffers for the largest blocks of any plan that runs */
    int64_t n_ap = 0, n_bp = 0, n_cs = 0, n_stg = 0, n_stga = 0, n_tab = 0, n_afull = 0, n_rtab = 0;
    for (int32_t q = 0; q < n_run; q++) {
        const cv_plan *r = &run[q];
        const cg_mk *m = &r->mk;
        n_ap = max64(n_ap, r->mbp * m->kp);
        n_bp = max64(n_bp, m->kp * m->b_ld);
        n_cs = max64(n_cs, r->mbp * m->nbp);
        n_stg = max64(n_stg, m->kp * m->pk * m->b_ld);
        n_stga = max64(n_stga, r->mbp * m->kp * m->pk);
        n_tab = max64(n_tab, r->tab ? r->KK * r->ldt : 0);
        n_rtab = max64(n_rtab, r->tab ? 0 : r->KH * r->pix_rows);
        n_afull = max64(n_afull, r->a_cache ? r->mbp * m->kp * r->nbk : 0);
    }
    bool pairs = cp->mk.pk == 2;
    cv_bufs u;
    u.ap = cg_alloc_buf(b, pairs ? b->i32 : b->f32, n_ap);
    u.bp = pairs ? cg_alloc_buf(b, b->i32, n_bp) : u.ap;
    u.cs = cg_alloc_buf(b, b->f32, n_cs);
    /* staged operands (f32): B's rows (windows for conv2d and the input gradient, dy^T for
     * the weight gradient) and A's when they pair (else staged into ap itself) */
    u.stg = cg_alloc_buf(b, b->f32, n_stg);
    u.stga = pairs ? cg_alloc_buf(b, b->f32, n_stga) : u.ap;
    u.tab = n_tab > 0 ? cg_alloc_buf(b, b->i32, n_tab) : u.stg;
    u.rtab = n_rtab > 0 ? cg_alloc_buf(b, b->i64, n_rtab) : u.stg;
    u.afull = n_afull > 0 ? cg_alloc_buf(b, pairs ? b->i32 : b->f32, n_afull) : u.ap;
    u.akey = cg_alloc_buf(b, b->i64, 1);
    cg_store(b, cg_ci(b, b->i64, -1), u.akey, cg_idx(b, 0));
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    int64_t first = 0;
    for (int32_t q = 0; q < n_run && st == LOOM_OK; q++) {
        int64_t n = tasks_of(&run[q]);
        if (n == 0)
            continue;
        if (n_run == 1) {
            st = emit_task(c, &run[q], &u, lo.iv, q);
            break;
        }
        cg_if f;
        MlirValue in = and_i1(b, cg_cmpi(b, CG_I_SGE, lo.iv, cg_idx(b, first)),
                              cg_cmpi(b, CG_I_SLT, lo.iv, cg_idx(b, first + n)));
        cg_if_begin(b, &f, in);
        st = emit_task(c, &run[q], &u, isub(b, lo.iv, cg_idx(b, first)), q);
        cg_if_end(b, &f);
        first += n;
    }
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[9] = {u.ap, u.cs, u.stg, u.bp, u.stga, u.tab, u.afull, u.akey, u.rtab};
    bool own[9] = {true, true, true, pairs, pairs, n_tab > 0, n_afull > 0, true, n_rtab > 0};
    for (int q = 0; q < 9; q++)
        if (own[q])
            cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, cps, bytes);
    return st;
}
