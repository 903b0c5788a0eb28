/* Lowering of max pooling kernels (ops.def: max_pool2d and max_pool2d_grad): the root of a
 * MATMUL-kind kernel whose operands are read from buffers, with the root's fused elementwise
 * epilogue (a cast, the ReLU's gradient) as a convolution's.
 *
 * A task is one plane (image, channel) of x. Its plane is first copied into a plane of
 * scratch with its padding around it, -inf there (and past the row, where the last block's
 * lanes reach), so that no tap needs a bound check: with masks computed per tap and masked
 * loads from x, the stem's pool ran at a third of a pass over memory. While a plane is
 * scanned, its rows of windows prefetch the next plane for its copy. A row of windows is
 * scanned 16 windows at a time: for each tap (kh, kw), a vector of the 16 windows' pixels
 * under that tap, one load at a column stride of 1 or 2 (32 lanes, the even ones kept), pixel
 * by pixel above. The taps combine by PyTorch's rule (a later tap wins where it is greater or
 * NaN) as a balanced tree; a window whose pixels are all -inf takes its first pixel, as
 * PyTorch's does.
 *  - max_pool2d: the row's values go to a row of scratch, the epilogue runs per window.
 *  - max_pool2d_grad: each window's dy is added to its pixel in a plane of scratch (f32;
 *    f64 for f64), window after window, then the epilogue runs per pixel of the plane. */
#include <math.h>

#include "lower_internal.h"

enum { PL_LANES = 16 };

typedef struct pl_plan {
    bool grad;
    loom_dtype dt;
    int64_t planes, C, H, W, OH, OW, KH, KW, st[2], pd[2], dl[2];
    /* the padded plane: x's row ih is its row ih + pd[0], column iw its column iw + pd[1];
     * PH rows reach the last row of windows' taps, PW columns the last block's lanes' */
    int64_t PH, PW;
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns;
} pl_plan;

/* What a row block's scan reads: the padded plane, the window row, the first window's
 * column, and scratch for taps gathered pixel by pixel. */
typedef struct pl_row {
    MlirValue pad, oh, ow0, scratch;
} pl_row;

/* -inf in dt's storage type (bf16 as its i16 bits). */
static MlirValue neg_inf(cg_b *b, loom_dtype dt) {
    if (dt == LOOM_DTYPE_BF16)
        return cg_ci(b, b->i16, (int16_t)0xff80);
    return cg_cf(b, cg_storage_type(b, dt), -INFINITY);
}

/* The 16 windows' pixels under one tap as a vector of the compute type, from the padded
 * plane at `at` (the first window's pixel): one load at column strides 1 and 2 (32 lanes,
 * the even ones kept), else pixel by pixel through scratch. */
static MlirValue tap_lanes(kc *c, const pl_plan *pp, const pl_row *r, MlirValue at) {
    cg_b *b = c->b;
    int64_t s = pp->st[1];
    MlirType st = cg_storage_type(b, pp->dt);
    MlirValue v;
    if (s <= 2) {
        v = cg_vload(b, cg_vec_t(s * PL_LANES, st), r->pad, at);
        if (s == 2) {
            int64_t keep[PL_LANES];
            for (int64_t l = 0; l < PL_LANES; l++)
                keep[l] = 2 * l;
            v = cg_vshuffle(b, v, v, PL_LANES, keep);
        }
    } else {
        for (int64_t l = 0; l < PL_LANES; l++)
            cg_store(b, cg_load(b, r->pad, cg_iadd(b, at, cg_idx(b, l * s))), r->scratch,
                     cg_idx(b, l));
        v = cg_vload(b, cg_vec_t(PL_LANES, st), r->scratch, cg_idx(b, 0));
    }
    return cg_widen16(b, pp->dt, v);
}

/* i + d ceil(max(-i, 0) / d): the first tap at or after index i on a grid of step d. */
static MlirValue first_on_grid(cg_b *b, MlirValue i, MlirValue zero, int64_t d) {
    MlirValue t = cg_bin(b, "arith.maxsi", cg_bin(b, "arith.subi", zero, i), zero);
    if (d == 1)
        return cg_bin(b, "arith.addi", i, t);
    MlirType ty = mlirValueGetType(i);
    bool vec = mlirTypeIsAVector(ty);
    MlirValue dv = vec ? cg_vbroadcast(b, cg_ci(b, b->i32, d), ty) : cg_idx(b, d);
    MlirValue dm1 = vec ? cg_vbroadcast(b, cg_ci(b, b->i32, d - 1), ty) : cg_idx(b, d - 1);
    MlirValue q = cg_bin(b, "arith.divsi", cg_bin(b, "arith.addi", t, dm1), dv);
    return cg_bin(b, "arith.addi", i, cg_bin(b, "arith.muli", q, dv));
}

/* Taps [lo, hi) of a row block's windows combined in tap order: a later part replaces an
 * earlier one where it is greater or NaN (PyTorch's rule, associative: a balanced tree
 * keeps the chain of dependent compares at log2 of the taps). */
static void combine_taps(cg_b *b, const MlirValue *v, const MlirValue *p, int64_t lo, int64_t hi,
                         MlirValue *val, MlirValue *pix) {
    if (hi - lo == 1) {
        *val = v[lo];
        *pix = p[lo];
        return;
    }
    MlirValue va, pa, vb, pb;
    int64_t mid = lo + (hi - lo) / 2;
    combine_taps(b, v, p, lo, mid, &va, &pa);
    combine_taps(b, v, p, mid, hi, &vb, &pb);
    MlirValue up =
        cg_bin(b, "arith.ori", cg_vcmpf(b, CG_F_OGT, vb, va), cg_vcmpf(b, CG_F_UNO, vb, vb));
    *val = cg_select(b, up, vb, va);
    *pix = mlirValueIsNull(pa) ? pa : cg_select(b, up, pb, pa);
}

/* The 16 windows of a row block: each one's value (a vector of the compute type) and, for
 * the gradient, its pixel (ih W + iw within the plane, i32). A tap in the padding reads
 * -inf, which never wins, so its pixel (off the plane) is never kept: a window whose pixels
 * are all -inf takes its first pixel, as PyTorch's does. */
static void scan_windows(kc *c, const pl_plan *pp, const pl_row *r, MlirValue *val,
                         MlirValue *pix) {
    cg_b *b = c->b;
    MlirType vi = cg_vec_t(PL_LANES, b->i32);
    MlirValue h0 = isub(b, cg_imul_c(b, r->oh, pp->st[0]), cg_idx(b, pp->pd[0]));
    MlirValue w0 = isub(b, cg_imul_c(b, r->ow0, pp->st[1]), cg_idx(b, pp->pd[1]));
    MlirValue w0v =
        cg_bin(b, "arith.addi", cg_splat_i32(b, w0, PL_LANES), cg_lanes_i32(b, pp->st[1]));
    /* the padded plane's row oh s0 + kh dl0 and column ow0 s1 + kw dl1 */
    MlirValue base = cg_iadd(b, cg_imul_c(b, cg_imul_c(b, r->oh, pp->st[0]), pp->PW),
                             cg_imul_c(b, r->ow0, pp->st[1]));
    MlirValue v[LOOM_IR_POOL_TAPS_MAX], p[LOOM_IR_POOL_TAPS_MAX];
    int64_t k = 0;
    for (int64_t kh = 0; kh < pp->KH; kh++) {
        MlirValue row = cg_iadd(b, base, cg_idx(b, kh * pp->dl[0] * pp->PW));
        MlirValue rowpix = {NULL};
        if (pp->grad) {
            MlirValue ih = cg_iadd(b, h0, cg_idx(b, kh * pp->dl[0]));
            rowpix =
                cg_bin(b, "arith.addi", cg_splat_i32(b, cg_imul_c(b, ih, pp->W), PL_LANES), w0v);
        }
        for (int64_t kw = 0; kw < pp->KW; kw++, k++) {
            v[k] = tap_lanes(c, pp, r, cg_iadd(b, row, cg_idx(b, kw * pp->dl[1])));
            p[k] = !pp->grad ? (MlirValue){NULL}
                             : cg_bin(b, "arith.addi", rowpix,
                                      cg_vbroadcast(b, cg_ci(b, b->i32, kw * pp->dl[1]), vi));
        }
    }
    combine_taps(b, v, p, 0, k, val, pix);
    if (pp->grad) { /* all -inf: the first pixel (a tap off x may have kept the lead) */
        MlirValue ih = first_on_grid(b, h0, cg_idx(b, 0), pp->dl[0]);
        MlirValue iw = first_on_grid(b, w0v, cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi), pp->dl[1]);
        MlirValue first =
            cg_bin(b, "arith.addi", cg_splat_i32(b, cg_imul_c(b, ih, pp->W), PL_LANES), iw);
        MlirType ct = cg_compute_type(b, pp->dt);
        MlirValue ninf = cg_vbroadcast(b, cg_cf(b, ct, -INFINITY), cg_vec_t(PL_LANES, ct));
        *pix = cg_select(b, cg_vcmpf(b, CG_F_OEQ, *val, ninf), first, *pix);
    }
}

/* The epilogue at one element of the root: its value v, its indices (n, ch, i, j). */
static loom_status epilogue_at(kc *c, const pl_plan *pp, MlirValue v, MlirValue n, MlirValue ch,
                               MlirValue i, MlirValue j) {
    const nest *ns = &pp->ns;
    MlirValue at[4] = {n, ch, i, j};
    c->ns = ns;
    cg_clear_gv(c);
    for (int32_t d = 0; d < 4; d++)
        if (ns->dim_group[d] >= 0)
            c->gv[ns->dim_group[d]] = at[d];
    /* a window's value is one of x's; a gradient's sum is rounded to its dtype */
    c->bound_v = pp->grad && is_16(pp->dt) ? cg_round16(c->b, pp->dt, v) : v;
    return cg_emit_sinks(c, pp->n_epi, pp->epi);
}

static loom_status plan_pool(kc *c, pl_plan *pp) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    const loom_ir_node *x = &g->nodes[root->inputs[0]];
    const loom_ir_conv *cv = &root->attrs.conv;
    pp->grad = root->op == LOOM_IR_OP_MAX_POOL2D_GRAD;
    pp->dt = root->dtype;
    if (x->rank != 4 || root->rank != 4 || root->n_inputs != (pp->grad ? 2 : 1))
        return cg_bad_plan(c, c->k->root, "a max pool whose operands are not 4-D NCHW");
    if (!loom_ir_dtype_is_float(pp->dt))
        return cg_unsupported(c, c->k->root, "a max pool of a dtype other than a float");
    for (int32_t q = 0; q < root->n_inputs; q++)
        if (c->s->buf_of[root->inputs[q]] < 0)
            return cg_unsupported(c, root->inputs[q],
                                  "a max pool operand computed inside the pool's kernel (its "
                                  "operands are read from buffers)");
    pp->planes = x->shape[0] * x->shape[1];
    pp->C = x->shape[1], pp->H = x->shape[2], pp->W = x->shape[3];
    pp->KH = cv->kernel[0], pp->KW = cv->kernel[1];
    for (int i = 0; i < 2; i++) {
        pp->st[i] = cv->stride[i];
        pp->pd[i] = cv->padding[i];
        pp->dl[i] = cv->dilation[i];
    }
    const loom_ir_node *y = pp->grad ? &g->nodes[root->inputs[1]] : root;
    pp->OH = y->shape[2], pp->OW = y->shape[3];
    if (pp->KH * pp->KW > LOOM_IR_POOL_TAPS_MAX) /* inference refuses them */
        return cg_bad_plan(c, c->k->root, "a max pool window of too many taps");
    if (pp->H * pp->W >= INT32_MAX)
        return cg_unsupported(c, c->k->root, "a max pool of a plane of 2^31 pixels or more");
    pp->PH = (pp->OH - 1) * pp->st[0] + (pp->KH - 1) * pp->dl[0] + 1;
    pp->PW = (ceil_div(pp->OW, PL_LANES) * PL_LANES - 1) * pp->st[1] + (pp->KW - 1) * pp->dl[1] +
             1 + (pp->st[1] == 2 ? 1 : 0); /* a stride of 2 loads the last lane's odd neighbour */
    return cg_plan_epilogue(c, &pp->ns, pp->epi, &pp->n_epi, -1);
}

/* The rows and columns of x that the windows reach (floor mode may leave out the last):
 * the ones copied into the padded plane. */
static int64_t copied_rows(const pl_plan *pp) {
    return pp->H < pp->PH - pp->pd[0] ? pp->H : pp->PH - pp->pd[0];
}

static int64_t copied_cols(const pl_plan *pp) {
    return pp->W < pp->PW - pp->pd[1] ? pp->W : pp->PW - pp->pd[1];
}

/* -inf into the padded plane wherever no pixel of x is copied: once per call, since every
 * plane's copy writes the same places. */
static void fill_padding(cg_b *b, const pl_plan *pp, MlirValue pad) {
    int64_t HC = copied_rows(pp), WC = copied_cols(pp);
    MlirValue ninf = neg_inf(b, pp->dt);
    /* rows above and below x's, then the columns left and right of x's in x's rows */
    struct {
        int64_t r0, r1, c0, c1;
    } parts[4] = {{0, pp->pd[0], 0, pp->PW},
                  {pp->pd[0] + HC, pp->PH, 0, pp->PW},
                  {pp->pd[0], pp->pd[0] + HC, 0, pp->pd[1]},
                  {pp->pd[0], pp->pd[0] + HC, pp->pd[1] + WC, pp->PW}};
    for (int i = 0; i < 4; i++) {
        if (parts[i].r0 >= parts[i].r1 || parts[i].c0 >= parts[i].c1)
            continue;
        cg_for lr, lc;
        cg_for_begin(b, &lr, cg_idx(b, parts[i].r0), cg_idx(b, parts[i].r1), 0, NULL);
        MlirValue row = cg_imul_c(b, lr.iv, pp->PW);
        cg_for_begin(b, &lc, cg_idx(b, parts[i].c0), cg_idx(b, parts[i].c1), 0, NULL);
        cg_store(b, ninf, pad, cg_iadd(b, row, lc.iv));
        cg_for_end(b, &lc, 0, NULL);
        cg_for_end(b, &lr, 0, NULL);
    }
}

/* Plane p of x into the padded plane, row by row: 16 pixels a vector, the row's last ones
 * one by one. */
static void copy_plane(cg_b *b, const pl_plan *pp, MlirValue x, MlirValue p, MlirValue pad) {
    int64_t WC = copied_cols(pp), W16 = WC / PL_LANES * PL_LANES;
    MlirType vt = cg_vec_t(PL_LANES, cg_storage_type(b, pp->dt));
    MlirValue xbase = cg_imul_c(b, p, pp->H * pp->W);
    cg_for lh, lw;
    cg_for_begin(b, &lh, cg_idx(b, 0), cg_idx(b, copied_rows(pp)), 0, NULL);
    MlirValue from = cg_iadd(b, xbase, cg_imul_c(b, lh.iv, pp->W));
    MlirValue to = cg_iadd(b, cg_imul_c(b, cg_iadd(b, lh.iv, cg_idx(b, pp->pd[0])), pp->PW),
                           cg_idx(b, pp->pd[1]));
    if (W16 > 0) {
        cg_for_begin(b, &lw, cg_idx(b, 0), cg_idx(b, W16 / PL_LANES), 0, NULL);
        MlirValue j = cg_imul_c(b, lw.iv, PL_LANES);
        cg_vstore(b, cg_vload(b, vt, x, cg_iadd(b, from, j)), pad, cg_iadd(b, to, j));
        cg_for_end(b, &lw, 0, NULL);
    }
    if (W16 < WC) {
        cg_for_begin(b, &lw, cg_idx(b, W16), cg_idx(b, WC), 0, NULL);
        cg_store(b, cg_load(b, x, cg_iadd(b, from, lw.iv)), pad, cg_iadd(b, to, lw.iv));
        cg_for_end(b, &lw, 0, NULL);
    }
    cg_for_end(b, &lh, 0, NULL);
}

/* Row of windows oh of plane p prefetches its share of the next plane's lines, so that
 * plane's copy finds x in the cache: the copy alone ran at a fifth of a pass over memory
 * (the scan leaves memory idle, and a prefetcher restarts at each plane). Past the last
 * plane the lines are clamped to x's last. */
static void prefetch_next_plane(cg_b *b, const pl_plan *pp, MlirValue x, MlirValue p,
                                MlirValue oh) {
    int64_t line = 64 / loom_dtype_size(pp->dt), plane = pp->H * pp->W;
    int64_t lines = ceil_div(ceil_div(plane, line), pp->OH); /* per row of windows */
    MlirValue first = cg_iadd(b, cg_imul_c(b, cg_iadd(b, p, cg_idx(b, 1)), plane),
                              cg_imul_c(b, oh, lines * line));
    MlirValue last = cg_idx(b, pp->planes * plane - 1);
    cg_for l;
    cg_for_begin(b, &l, cg_idx(b, 0), cg_idx(b, lines), 0, NULL);
    MlirValue at = cg_imin(b, cg_iadd(b, first, cg_imul_c(b, l.iv, line)), last);
    cg_prefetch(b, x, at, false, false);
    cg_for_end(b, &l, 0, NULL);
}

/* One plane (task p): its copy with padding, its rows of windows, then (gradient) its
 * pixels. */
static loom_status emit_plane(kc *c, const pl_plan *pp, MlirValue p, MlirValue *args, MlirValue pad,
                              MlirValue rowbuf, MlirValue acc, MlirValue scratch) {
    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, pp->dt);
    MlirValue n = idiv(b, p, pp->C), ch = irem(b, p, pp->C);
    loom_status st = LOOM_OK;
    copy_plane(b, pp, args[0], p, pad);
    if (pp->grad) {
        cg_for lz;
        cg_for_begin(b, &lz, cg_idx(b, 0), cg_idx(b, pp->H * pp->W), 0, NULL);
        cg_store(b, cg_cf(b, ct, 0.0), acc, lz.iv);
        cg_for_end(b, &lz, 0, NULL);
    }
    cg_for lh, lb, lw;
    cg_for_begin(b, &lh, cg_idx(b, 0), cg_idx(b, pp->OH), 0, NULL);
    prefetch_next_plane(b, pp, args[0], p, lh.iv);
    cg_for_begin(b, &lb, cg_idx(b, 0), cg_idx(b, ceil_div(pp->OW, PL_LANES)), 0, NULL);
    MlirValue ow0 = cg_imul_c(b, lb.iv, PL_LANES);
    MlirValue nl = cg_imin(b, cg_idx(b, PL_LANES), isub(b, cg_idx(b, pp->OW), ow0));
    pl_row r = {pad, lh.iv, ow0, scratch};
    MlirValue val, pix;
    scan_windows(c, pp, &r, &val, &pix);
    if (!pp->grad) {
        cg_vstore(b, val, rowbuf, ow0);
    } else { /* dy's lanes, then each window's dy to its pixel */
        MlirValue at =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, pp->OH), lh.iv), pp->OW), ow0);
        MlirValue lane_ok =
            cg_vcmpi(b, CG_I_SLT, cg_lanes_i32(b, 1), cg_splat_i32(b, nl, PL_LANES));
        /* two rows ahead */
        cg_prefetch(b, args[1], cg_iadd(b, at, cg_idx(b, 2 * pp->OW)), false, true);
        MlirValue dy = cg_widen16(
            b, pp->dt,
            cg_vmaskload(b, cg_vec_t(PL_LANES, cg_storage_type(b, pp->dt)), args[1], at, lane_ok));
        /* lanes past the row: 0 to pixel 0 (their windows' pixels may lie off the plane) */
        dy = cg_select(b, lane_ok, dy, cg_vbroadcast(b, cg_cf(b, ct, 0.0), cg_vec_t(PL_LANES, ct)));
        pix = cg_select(b, lane_ok, pix,
                        cg_vbroadcast(b, cg_ci(b, b->i32, 0), cg_vec_t(PL_LANES, b->i32)));
        /* window after window, straight from the registers: read back from memory, each
         * lane's load waited for a vector store to forward (42% of the kernel at 32x32) */
        for (int64_t l = 0; l < PL_LANES; l++) {
            MlirValue q = cg_conv(b, "arith.index_cast", cg_vextract(b, pix, l), b->index);
            cg_store(b, cg_bin(b, "arith.addf", cg_load(b, acc, q), cg_vextract(b, dy, l)), acc, q);
        }
    }
    cg_for_end(b, &lb, 0, NULL);
    if (!pp->grad) {
        cg_for_begin(b, &lw, cg_idx(b, 0), cg_idx(b, pp->OW), 0, NULL);
        st = epilogue_at(c, pp, cg_load(b, rowbuf, lw.iv), n, ch, lh.iv, lw.iv);
        cg_for_end(b, &lw, 0, NULL);
    }
    cg_for_end(b, &lh, 0, NULL);
    if (pp->grad && st == LOOM_OK) {
        cg_for_begin(b, &lh, cg_idx(b, 0), cg_idx(b, pp->H), 0, NULL);
        cg_for_begin(b, &lw, cg_idx(b, 0), cg_idx(b, pp->W), 0, NULL);
        MlirValue v = cg_load(b, acc, cg_iadd(b, cg_imul_c(b, lh.iv, pp->W), lw.iv));
        st = epilogue_at(c, pp, v, n, ch, lh.iv, lw.iv);
        cg_for_end(b, &lw, 0, NULL);
        cg_for_end(b, &lh, 0, NULL);
    }
    return st;
}

loom_status cg_lower_pool(kc *c) {
    pl_plan *pp = loom_ir_alloc(&c->s->alloc, sizeof *pp);
    if (!pp)
        return cg_oom(c);
    memset(pp, 0, sizeof *pp);
    loom_status st = plan_pool(c, pp);
    if (st != LOOM_OK)
        goto done;
    c->extent = pp->planes > 0 ? pp->planes : 1;
    c->grain = cg_grain_for(pp->OH * pp->OW * pp->KH * pp->KW);
    if (!c->emit || pp->planes == 0 || pp->OH * pp->OW == 0)
        goto done;
    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, pp->dt);
    MlirValue args[2] = {c->bufs[c->s->buf_of[c->g->nodes[c->k->root].inputs[0]]], {NULL}};
    if (pp->grad)
        args[1] = c->bufs[c->s->buf_of[c->g->nodes[c->k->root].inputs[1]]];
    MlirValue rowbuf = cg_alloc_buf(b, ct, pp->grad ? 1 : ceil_div(pp->OW, PL_LANES) * PL_LANES);
    MlirValue acc = cg_alloc_buf(b, ct, pp->grad ? pp->H * pp->W : 1);
    MlirValue scratch = cg_alloc_buf(b, cg_storage_type(b, pp->dt), PL_LANES);
    MlirValue pad = cg_alloc_buf(b, cg_storage_type(b, pp->dt), pp->PH * pp->PW);
    fill_padding(b, pp, pad);
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    st = emit_plane(c, pp, lo.iv, args, pad, rowbuf, acc, scratch);
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[4] = {rowbuf, acc, scratch, pad};
    for (int q = 0; q < 4; q++)
        cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, pp, sizeof *pp);
    return st;
}
