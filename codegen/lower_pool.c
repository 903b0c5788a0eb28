/* Lowering of max pooling kernels (ops.def: max_pool2d and max_pool2d_grad): the root of a
 * MATMUL-kind kernel whose operands are read from buffers, with the root's fused elementwise
 * epilogue (a cast, the ReLU's gradient) as a convolution's.
 *
 * A task is one plane (image, channel) of x. A row of windows is scanned 16 windows at a
 * time: for each tap (kh, kw), a vector of the 16 windows' pixels under that tap, read by a
 * masked load (at a column stride of 2, 32 lanes with the even ones kept; above 2, pixel by
 * pixel), a tap in the padding read as -inf. The taps combine by PyTorch's rule (a later tap
 * wins where it is greater or NaN) as a balanced tree; a window whose pixels are all -inf
 * takes its first pixel, as PyTorch's does. Masked loads train no prefetcher (Zen 5: a
 * plane from memory ran 3x slower than from the cache), so each row of windows prefetches
 * the rows of the row after next.
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
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns;
} pl_plan;

/* What a row block's scan reads: x, the plane's offset in it, the window row, the first
 * window's column, and scratch for taps read pixel by pixel. */
typedef struct pl_row {
    MlirValue x, xbase, oh, ow0, scratch;
} pl_row;

static MlirValue splat_i32(cg_b *b, MlirValue x, int64_t n) {
    return cg_vbroadcast(b, cg_conv(b, "arith.index_cast", x, b->i32), cg_vec_t(n, b->i32));
}

static MlirValue lanes_i32(cg_b *b, int64_t step) {
    int32_t l[PL_LANES];
    for (int32_t i = 0; i < PL_LANES; i++)
        l[i] = (int32_t)(i * step);
    return cg_vconst_i32(b, PL_LANES, l);
}

/* -inf in dt's storage type (bf16 as its i16 bits). */
static MlirValue neg_inf(cg_b *b, loom_dtype dt) {
    if (dt == LOOM_DTYPE_BF16)
        return cg_ci(b, b->i16, (int16_t)0xff80);
    return cg_cf(b, cg_storage_type(b, dt), -INFINITY);
}

/* n lanes of x from column c0 of a row (an index value, negative or past the row where the
 * row is in the padding: every lane off): columns in [0, W) are loaded, the others read as
 * -inf and touch no memory. */
static MlirValue row_lanes(kc *c, const pl_plan *pp, const pl_row *r, MlirValue row, MlirValue c0,
                           int64_t n) {
    cg_b *b = c->b;
    MlirType vt = cg_vec_t(n, b->i32);
    int32_t iota[2 * PL_LANES];
    for (int32_t j = 0; j < n; j++)
        iota[j] = j;
    MlirValue col = cg_bin(b, "arith.addi", cg_vconst_i32(b, n, iota), splat_i32(b, c0, n));
    MlirValue ok =
        and_i1(b, cg_vcmpi(b, CG_I_SGE, col, cg_vbroadcast(b, cg_ci(b, b->i32, 0), vt)),
               cg_vcmpi(b, CG_I_SLT, col, cg_vbroadcast(b, cg_ci(b, b->i32, pp->W), vt)));
    return cg_vmaskload_or(b, cg_vec_t(n, cg_storage_type(b, pp->dt)), r->x, cg_iadd(b, row, c0),
                           ok, neg_inf(b, pp->dt));
}

/* Tap (ih, c0 + s l) of lane l's window as a vector of the compute type, -inf where it is
 * not a pixel of x (rowok false: the row is in the padding). */
static MlirValue tap_lanes(kc *c, const pl_plan *pp, const pl_row *r, MlirValue row,
                           MlirValue rowok, MlirValue c0) {
    cg_b *b = c->b;
    int64_t s = pp->st[1];
    MlirValue off = cg_select(b, rowok, c0, cg_idx(b, -((int64_t)1 << 30)));
    MlirValue v;
    if (s <= 2) { /* 16 s lanes from column c0, every s-th kept */
        v = row_lanes(c, pp, r, row, off, s * PL_LANES);
        if (s == 2) {
            int64_t keep[PL_LANES];
            for (int64_t l = 0; l < PL_LANES; l++)
                keep[l] = 2 * l;
            v = cg_vshuffle(b, v, v, PL_LANES, keep);
        }
        return cg_widen16(b, pp->dt, v);
    }
    /* wider strides: pixel by pixel through scratch (a tap off the row: -inf) */
    MlirValue ninf = neg_inf(b, pp->dt);
    for (int64_t l = 0; l < PL_LANES; l++) {
        MlirValue col = cg_iadd(b, off, cg_idx(b, l * s));
        MlirValue in = and_i1(b, cg_cmpi(b, CG_I_SGE, col, cg_idx(b, 0)),
                              cg_cmpi(b, CG_I_SLT, col, cg_idx(b, pp->W)));
        MlirValue at = cg_select(b, in, cg_iadd(b, row, col), r->xbase);
        cg_store(b, cg_select(b, in, cg_load(b, r->x, at), ninf), r->scratch, cg_idx(b, l));
    }
    return cg_widen16(
        b, pp->dt,
        cg_vload(b, cg_vec_t(PL_LANES, cg_storage_type(b, pp->dt)), r->scratch, cg_idx(b, 0)));
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
 * the gradient, its pixel (ih W + iw within the plane, i32). A tap off x reads -inf, which
 * never wins; a window whose pixels are all -inf takes its first pixel, as PyTorch's does. */
static void scan_windows(kc *c, const pl_plan *pp, const pl_row *r, MlirValue *val,
                         MlirValue *pix) {
    cg_b *b = c->b;
    MlirType vi = cg_vec_t(PL_LANES, b->i32);
    MlirValue h0 = isub(b, cg_imul_c(b, r->oh, pp->st[0]), cg_idx(b, pp->pd[0]));
    MlirValue w0 = isub(b, cg_imul_c(b, r->ow0, pp->st[1]), cg_idx(b, pp->pd[1]));
    MlirValue w0v = cg_bin(b, "arith.addi", splat_i32(b, w0, PL_LANES), lanes_i32(b, pp->st[1]));
    MlirValue v[LOOM_IR_POOL_TAPS_MAX], p[LOOM_IR_POOL_TAPS_MAX];
    int64_t k = 0;
    for (int64_t kh = 0; kh < pp->KH; kh++) {
        MlirValue ih = cg_iadd(b, h0, cg_idx(b, kh * pp->dl[0]));
        MlirValue rowok = and_i1(b, cg_cmpi(b, CG_I_SGE, ih, cg_idx(b, 0)),
                                 cg_cmpi(b, CG_I_SLT, ih, cg_idx(b, pp->H)));
        MlirValue ihc = cg_select(b, rowok, ih, cg_idx(b, 0));
        MlirValue row = cg_iadd(b, r->xbase, cg_imul_c(b, ihc, pp->W));
        MlirValue rowpix =
            cg_bin(b, "arith.addi", splat_i32(b, cg_imul_c(b, ihc, pp->W), PL_LANES), w0v);
        for (int64_t kw = 0; kw < pp->KW; kw++, k++) {
            MlirValue c0 = cg_iadd(b, w0, cg_idx(b, kw * pp->dl[1]));
            v[k] = tap_lanes(c, pp, r, row, rowok, c0);
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
            cg_bin(b, "arith.addi", splat_i32(b, cg_imul_c(b, ih, pp->W), PL_LANES), iw);
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
    return cg_plan_epilogue(c, &pp->ns, pp->epi, &pp->n_epi, -1);
}

/* One plane (task p): its rows of windows, then (gradient) its pixels. */
static loom_status emit_plane(kc *c, const pl_plan *pp, MlirValue p, MlirValue *args,
                              MlirValue rowbuf, MlirValue acc, MlirValue pixbuf,
                              MlirValue scratch) {
    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, pp->dt);
    MlirValue n = idiv(b, p, pp->C), ch = irem(b, p, pp->C);
    MlirValue xbase = cg_imul_c(b, p, pp->H * pp->W);
    loom_status st = LOOM_OK;
    if (pp->grad) {
        cg_for lz;
        cg_for_begin(b, &lz, cg_idx(b, 0), cg_idx(b, pp->H * pp->W), 0, NULL);
        cg_store(b, cg_cf(b, ct, 0.0), acc, lz.iv);
        cg_for_end(b, &lz, 0, NULL);
    }
    cg_for lh, lb, lw;
    cg_for_begin(b, &lh, cg_idx(b, 0), cg_idx(b, pp->OH), 0, NULL);
    /* the rows of the row of windows after next, line by line: masked loads train no
     * prefetcher (a plane from memory ran 3x slower than from the cache) */
    int64_t line = 64 / loom_dtype_size(pp->dt);
    for (int64_t kh = 0; kh < pp->KH; kh++) {
        MlirValue ih = cg_iadd(b, cg_imul_c(b, lh.iv, pp->st[0]),
                               cg_idx(b, 2 * pp->st[0] - pp->pd[0] + kh * pp->dl[0]));
        ih = imax_s(b, cg_imin(b, ih, cg_idx(b, pp->H - 1)), cg_idx(b, 0));
        MlirValue row = cg_iadd(b, xbase, cg_imul_c(b, ih, pp->W));
        for (int64_t j = 0; j < pp->W; j += line)
            cg_prefetch(b, args[0], cg_iadd(b, row, cg_idx(b, j)), false, true);
    }
    cg_for_begin(b, &lb, cg_idx(b, 0), cg_idx(b, ceil_div(pp->OW, PL_LANES)), 0, NULL);
    MlirValue ow0 = cg_imul_c(b, lb.iv, PL_LANES);
    MlirValue nl = cg_imin(b, cg_idx(b, PL_LANES), isub(b, cg_idx(b, pp->OW), ow0));
    pl_row r = {args[0], xbase, lh.iv, ow0, scratch};
    MlirValue val, pix;
    scan_windows(c, pp, &r, &val, &pix);
    if (!pp->grad) {
        cg_vstore(b, val, rowbuf, ow0);
    } else { /* dy's lanes, then each window's dy to its pixel */
        MlirValue at =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, pp->OH), lh.iv), pp->OW), ow0);
        MlirValue lane_ok = cg_vcmpi(b, CG_I_SLT, lanes_i32(b, 1), splat_i32(b, nl, PL_LANES));
        /* two rows ahead */
        cg_prefetch(b, args[1], cg_iadd(b, at, cg_idx(b, 2 * pp->OW)), false, true);
        MlirValue dy =
            cg_vmaskload(b, cg_vec_t(PL_LANES, cg_storage_type(b, pp->dt)), args[1], at, lane_ok);
        cg_vstore(b, cg_widen16(b, pp->dt, dy), rowbuf, ow0);
        cg_vstore(b, pix, pixbuf, ow0);
    }
    cg_for_end(b, &lb, 0, NULL);
    if (pp->grad) { /* the row's windows in order, read back after the vector stores retire */
        cg_for_begin(b, &lw, cg_idx(b, 0), cg_idx(b, pp->OW), 0, NULL);
        MlirValue q = cg_conv(b, "arith.index_cast", cg_load(b, pixbuf, lw.iv), b->index);
        cg_store(b, cg_bin(b, "arith.addf", cg_load(b, acc, q), cg_load(b, rowbuf, lw.iv)), acc, q);
        cg_for_end(b, &lw, 0, NULL);
    }
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
    MlirValue rowbuf = cg_alloc_buf(b, ct, ceil_div(pp->OW, PL_LANES) * PL_LANES);
    MlirValue acc = cg_alloc_buf(b, ct, pp->grad ? pp->H * pp->W : 1);
    MlirValue pixbuf =
        cg_alloc_buf(b, b->i32, pp->grad ? ceil_div(pp->OW, PL_LANES) * PL_LANES : 1);
    MlirValue scratch = cg_alloc_buf(b, cg_storage_type(b, pp->dt), PL_LANES);
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    st = emit_plane(c, pp, lo.iv, args, rowbuf, acc, pixbuf, scratch);
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[4] = {rowbuf, acc, pixbuf, scratch};
    for (int q = 0; q < 4; q++)
        cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, pp, sizeof *pp);
    return st;
}
