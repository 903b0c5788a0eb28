/* Lowering of max pooling kernels (ops.def: max_pool2d and max_pool2d_grad): the root of a
 * MATMUL-kind kernel whose operands are read from buffers, with the root's fused elementwise
 * epilogue (a cast, the ReLU's gradient) as a convolution's.
 *
 * A task is one plane (image, channel) of x. A row of windows is scanned 16 windows at a
 * time: for each tap (kh, kw), a vector of the 16 windows' pixels under that tap, read by a
 * masked load (at a column stride of 2, 32 lanes with the even ones kept; above 2, pixel by
 * pixel), lanes whose pixel is in the padding or past the row's last window masked off.
 * PyTorch's rule then applies lane by lane: the tap becomes the window's value and pixel
 * where it is the window's first pixel, greater than the value so far, or NaN.
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

/* What a row block's scan reads and keeps: the plane's offset in x, the window row, the
 * first window's column and how many of the 16 lanes are windows. */
typedef struct pl_row {
    MlirValue x, xbase, oh, ow0, nl, nl_v, scratch;
} pl_row;

static MlirValue splat_i32(cg_b *b, MlirValue x) {
    return cg_vbroadcast(b, cg_conv(b, "arith.index_cast", x, b->i32), cg_vec_t(PL_LANES, b->i32));
}

static MlirValue lanes_i32(cg_b *b, int64_t step) {
    int32_t l[PL_LANES];
    for (int32_t i = 0; i < PL_LANES; i++)
        l[i] = (int32_t)(i * step);
    return cg_vconst_i32(b, PL_LANES, l);
}

/* Tap (ih, c0 + s l) of lane l's window, in the storage type, where `ok` (lane by lane: the
 * tap is a pixel of a window) is set; c0 may be negative (lanes before the row are off and
 * touch no memory). */
static MlirValue tap_lanes(kc *c, const pl_plan *pp, const pl_row *r, MlirValue row,
                           MlirValue rowok, MlirValue c0, MlirValue ok) {
    cg_b *b = c->b;
    MlirType et = cg_storage_type(b, pp->dt);
    int64_t s = pp->st[1];
    MlirValue at = cg_iadd(b, row, c0);
    if (s == 1)
        return cg_vmaskload(b, cg_vec_t(PL_LANES, et), r->x, at, ok);
    if (s == 2) { /* 32 lanes: lane 2 l holds lane l's tap, odd lanes off */
        int64_t even[PL_LANES], spread[2 * PL_LANES];
        for (int64_t l = 0; l < PL_LANES; l++)
            even[l] = 2 * l;
        for (int64_t l = 0; l < 2 * PL_LANES; l++)
            spread[l] = l % 2 ? PL_LANES : l / 2;
        MlirValue none = cg_vbroadcast(b, cg_ci(b, b->i1, 0), cg_vec_t(PL_LANES, b->i1));
        MlirValue ok32 = cg_vshuffle(b, ok, none, 2 * PL_LANES, spread);
        MlirValue v = cg_vmaskload(b, cg_vec_t(2 * PL_LANES, et), r->x, at, ok32);
        return cg_vshuffle(b, v, v, PL_LANES, even);
    }
    /* wider strides: pixel by pixel through scratch; a lane off reads the plane's start */
    for (int64_t l = 0; l < PL_LANES; l++) {
        MlirValue col = cg_iadd(b, c0, cg_idx(b, l * s));
        MlirValue in = and_i1(b, and_i1(b, rowok, cg_cmpi(b, CG_I_SGE, col, cg_idx(b, 0))),
                              cg_cmpi(b, CG_I_SLT, col, cg_idx(b, pp->W)));
        MlirValue off = cg_select(b, in, cg_iadd(b, row, col), r->xbase);
        cg_store(b, cg_load(b, r->x, off), r->scratch, cg_idx(b, l));
    }
    return cg_vload(b, cg_vec_t(PL_LANES, et), r->scratch, cg_idx(b, 0));
}

/* The 16 windows of a row block: each one's value (vector of the compute type) and pixel
 * (ih W + iw within the plane, i32). */
static void scan_windows(kc *c, const pl_plan *pp, const pl_row *r, MlirValue *val,
                         MlirValue *pix) {
    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, pp->dt);
    MlirType vt = cg_vec_t(PL_LANES, ct), vi = cg_vec_t(PL_LANES, b->i32);
    MlirValue m = cg_vbroadcast(b, cg_cf(b, ct, -INFINITY), vt);
    MlirValue p = cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi);
    MlirValue seen = cg_vbroadcast(b, cg_ci(b, b->i1, 0), cg_vec_t(PL_LANES, b->i1));
    MlirValue lane_ok = cg_vcmpi(b, CG_I_SLT, lanes_i32(b, 1), r->nl_v);
    MlirValue step = lanes_i32(b, pp->st[1]);
    MlirValue h0 = isub(b, cg_imul_c(b, r->oh, pp->st[0]), cg_idx(b, pp->pd[0]));
    MlirValue w0 = isub(b, cg_imul_c(b, r->ow0, pp->st[1]), cg_idx(b, pp->pd[1]));
    MlirValue zero_v = cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi);
    MlirValue w_v = cg_vbroadcast(b, cg_ci(b, b->i32, pp->W), vi);
    for (int64_t kh = 0; kh < pp->KH; kh++) {
        MlirValue ih = cg_iadd(b, h0, cg_idx(b, kh * pp->dl[0]));
        MlirValue rowok = and_i1(b, cg_cmpi(b, CG_I_SGE, ih, cg_idx(b, 0)),
                                 cg_cmpi(b, CG_I_SLT, ih, cg_idx(b, pp->H)));
        /* a row in the padding reads at the plane's start, every lane off */
        MlirValue ihc = cg_select(b, rowok, ih, cg_idx(b, 0));
        MlirValue row = cg_iadd(b, r->xbase, cg_imul_c(b, ihc, pp->W));
        MlirValue rowok_v = cg_vbroadcast(b, rowok, cg_vec_t(PL_LANES, b->i1));
        MlirValue rowpix = splat_i32(b, cg_imul_c(b, ihc, pp->W));
        for (int64_t kw = 0; kw < pp->KW; kw++) {
            MlirValue c0 = cg_iadd(b, w0, cg_idx(b, kw * pp->dl[1]));
            MlirValue col = cg_bin(b, "arith.addi", splat_i32(b, c0), step);
            MlirValue ok = and_i1(
                b, and_i1(b, cg_vcmpi(b, CG_I_SGE, col, zero_v), cg_vcmpi(b, CG_I_SLT, col, w_v)),
                and_i1(b, lane_ok, rowok_v));
            MlirValue v = cg_widen16(b, pp->dt, tap_lanes(c, pp, r, row, rowok, c0, ok));
            MlirValue up =
                cg_bin(b, "arith.ori", cg_vcmpf(b, CG_F_OGT, v, m), cg_vcmpf(b, CG_F_UNO, v, v));
            MlirValue first =
                cg_bin(b, "arith.xori", seen,
                       cg_vbroadcast(b, cg_ci(b, b->i1, 1), cg_vec_t(PL_LANES, b->i1)));
            up = and_i1(b, ok, cg_bin(b, "arith.ori", up, first));
            m = cg_select(b, up, v, m);
            p = cg_select(b, up, cg_bin(b, "arith.addi", rowpix, col), p);
            seen = cg_bin(b, "arith.ori", seen, ok);
        }
    }
    *val = m;
    *pix = p;
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
    c->bound_v = is_16(pp->dt) ? cg_round16(c->b, pp->dt, v) : v;
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
    if (pp->H * pp->W >= INT32_MAX || pp->KH * pp->KW > 256)
        return cg_unsupported(c, c->k->root,
                              "a max pool of a plane of 2^31 pixels or more, or a window of "
                              "more than 256 taps");
    return cg_plan_epilogue(c, &pp->ns, pp->epi, &pp->n_epi, -1);
}

/* One plane (task p): its rows of windows, then (gradient) its pixels. */
static loom_status emit_plane(kc *c, const pl_plan *pp, MlirValue p, MlirValue *args,
                              MlirValue rowbuf, MlirValue acc, MlirValue pixbuf, MlirValue dybuf,
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
    cg_for_begin(b, &lb, cg_idx(b, 0), cg_idx(b, ceil_div(pp->OW, PL_LANES)), 0, NULL);
    MlirValue ow0 = cg_imul_c(b, lb.iv, PL_LANES);
    MlirValue nl = cg_imin(b, cg_idx(b, PL_LANES), isub(b, cg_idx(b, pp->OW), ow0));
    pl_row r = {args[0], xbase, lh.iv, ow0, nl, splat_i32(b, nl), scratch};
    MlirValue val, pix;
    scan_windows(c, pp, &r, &val, &pix);
    if (!pp->grad) {
        cg_vstore(b, val, rowbuf, ow0);
    } else { /* dy's lanes, then each window's dy to its pixel */
        MlirValue at =
            cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, pp->OH), lh.iv), pp->OW), ow0);
        MlirValue lane_ok = cg_vcmpi(b, CG_I_SLT, lanes_i32(b, 1), r.nl_v);
        MlirValue dy =
            cg_vmaskload(b, cg_vec_t(PL_LANES, cg_storage_type(b, pp->dt)), args[1], at, lane_ok);
        cg_vstore(b, cg_widen16(b, pp->dt, dy), dybuf, cg_idx(b, 0));
        cg_vstore(b, pix, pixbuf, cg_idx(b, 0));
        cg_for ll;
        cg_for_begin(b, &ll, cg_idx(b, 0), nl, 0, NULL);
        MlirValue q = cg_conv(b, "arith.index_cast", cg_load(b, pixbuf, ll.iv), b->index);
        cg_store(b, cg_bin(b, "arith.addf", cg_load(b, acc, q), cg_load(b, dybuf, ll.iv)), acc, q);
        cg_for_end(b, &ll, 0, NULL);
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
    MlirValue rowbuf = cg_alloc_buf(b, ct, ceil_div(pp->OW, PL_LANES) * PL_LANES);
    MlirValue acc = cg_alloc_buf(b, ct, pp->grad ? pp->H * pp->W : 1);
    MlirValue pixbuf = cg_alloc_buf(b, b->i32, PL_LANES);
    MlirValue dybuf = cg_alloc_buf(b, ct, PL_LANES);
    MlirValue scratch = cg_alloc_buf(b, cg_storage_type(b, pp->dt), PL_LANES);
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    st = emit_plane(c, pp, lo.iv, args, rowbuf, acc, pixbuf, dybuf, scratch);
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[5] = {rowbuf, acc, pixbuf, dybuf, scratch};
    for (int q = 0; q < 5; q++)
        cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, pp, sizeof *pp);
    return st;
}
