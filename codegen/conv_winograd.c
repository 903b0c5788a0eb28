/* Winograd F(2x2, 3x3) for the stride-1 3x3 convolutions' forwards and input gradients
 * (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016); LOOM_CONV=direct
 * keeps them on lower_conv.c's direct kernels.
 *
 * Each 2 x 2 tile of y comes from the 4 x 4 tile d of x that covers its windows:
 *     Y = A^T [ sum_c (G w_c G^T) . (B^T d_c B) ] A
 * with the 4 x 4 transforms U = G w G^T of each (o, c)'s 3 x 3 weights and V = B^T d B of each
 * (c, tile)'s input, multiplied element by element and summed over the channels: 16 GEMMs
 * M_x [O, tiles] = U_x [O, C] x V_x [C, tiles], one per element x of the 4 x 4, on the packed
 * microkernel (cg_mk_tiles). That is 16 multiplies per tile of 4 pixels against 36 in the
 * direct form: 2.25x fewer. The transforms are additions (and halvings in G), done in
 * vectors of 16 tiles or 16 channels:
 *  - U for a thread's row block of output channels, all channels, once per row block (the
 *    weights, gathered 16 channels at a time), kept across its tasks as lower_conv.c keeps
 *    packed weights;
 *  - V per block of tiles and chunk of channels, the input read as the 4 x 4 window of
 *    stride 2 whose destination grid is the tiles (conv_stage.c's masked loads,
 *    cv_stage_winograd), straight into the 16 GEMMs' B;
 *  - Y from the 16 GEMMs' C into one block of C in the destination's layout (whole pixel
 *    rows, two per tile row), which the convolution's own epilogue (bias, activation, cast,
 *    fused consumers) then runs over as it runs over a direct convolution's.
 * With bf16 operands (vdpbf16ps) U and V are rounded to bf16: their sums of 2-4 values keep
 * 8 bits, where the direct form multiplies the values themselves.
 *
 * A task is (row block, block of whole tile rows); the tile rows' two pixel rows never
 * straddle images (the output's height is even). */
#include <string.h>

#include "conv_internal.h"

enum {
    WN_ROWS = 128,          /* rows of a row block (y's channels, or dx's), at most */
    WN_KP = 64,             /* packed elements along K (channels / pk) of a chunk, at most */
    WN_C_BYTES = 512 << 10, /* the 16 GEMMs' C blocks of a task, at most (else fewer tiles) */
    WN_TASKS_MIN = 4,       /* tasks at least, where there are the tile rows */
};

static MlirValue fadd(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.addf", x, y);
}

static MlirValue fsub(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.subf", x, y);
}

static MlirValue fhalf(cg_b *b, MlirValue x) {
    MlirType t = mlirValueGetType(x);
    MlirValue h = cg_cf(b, b->f32, 0.5);
    return cg_bin(b, "arith.mulf", x, mlirTypeIsAVector(t) ? cg_vbroadcast(b, h, t) : h);
}

/* o[0..3 * os] = B^T (x[0], x[xs], x[2 xs], x[3 xs]) */
static void bt4(cg_b *b, const MlirValue *x, int64_t xs, MlirValue *o, int64_t os) {
    o[0] = fsub(b, x[0], x[2 * xs]);
    o[os] = fadd(b, x[xs], x[2 * xs]);
    o[2 * os] = fsub(b, x[2 * xs], x[xs]);
    o[3 * os] = fsub(b, x[xs], x[3 * xs]);
}

/* A transform's 1-D product T x: n values x[0], x[xs], ... in, m out at o[0], o[os], ... */
typedef void (*wn_1d)(cg_b *b, const MlirValue *x, int64_t xs, MlirValue *o, int64_t os);

/* T X T^T of an n x n X (row-major) as an m x m o (row-major): T down each column of X, then
 * along each row of the result. */
static void both_axes(cg_b *b, wn_1d f, int64_t n, int64_t m, const MlirValue *x, MlirValue *o) {
    MlirValue t[16]; /* m x n */
    for (int64_t j = 0; j < n; j++)
        f(b, x + j, n, t + j, n);
    for (int64_t i = 0; i < m; i++)
        f(b, t + n * i, 1, o + m * i, 1);
}

void cv_wino_input(cg_b *b, const MlirValue *d, MlirValue *v) {
    both_axes(b, bt4, 4, 4, d, v);
}

/* o[0..3 * os] = G (g[0], g[gs], g[2 gs]) */
static void g3(cg_b *b, const MlirValue *g, int64_t gs, MlirValue *o, int64_t os) {
    MlirValue s = fadd(b, g[0], g[2 * gs]);
    o[0] = g[0];
    o[os] = fhalf(b, fadd(b, s, g[gs]));
    o[2 * os] = fhalf(b, fsub(b, s, g[gs]));
    o[3 * os] = g[2 * gs];
}

/* o[0..1 * os] = A^T (m[0], m[ms], m[2 ms], m[3 ms]) */
static void at4(cg_b *b, const MlirValue *m, int64_t ms, MlirValue *o, int64_t os) {
    o[0] = fadd(b, fadd(b, m[0], m[ms]), m[2 * ms]);
    o[os] = fsub(b, fsub(b, m[ms], m[2 * ms]), m[3 * ms]);
}

bool cv_wino_ok(const kc *c, const cv_plan *cp) {
    if (loom_cg_conv_mode() == CG_CONV_DIRECT)
        return false;
    const loom_ir_node *w = &c->g->nodes[cp->plain];
    return cp->role != CV_GRAD_WEIGHT && !cp->phased && cp->G == 1 && cp->KH == 3 && cp->KW == 3 &&
           cp->st[0] == 1 && cp->st[1] == 1 && cp->dl[0] == 1 && cp->dl[1] == 1 && cp->pd[0] <= 2 &&
           cp->pd[1] <= 2 && cp->dH > 0 && cp->dW > 0 && cp->dH % 2 == 0 && cp->dW % 2 == 0 &&
           cp->wch > 0 && cp->wch % 16 == 0 && cp->N > 0 &&
           loom_ir_numel(w->rank, w->shape) < INT32_MAX;
}

void cv_wino_plan(cv_plan *cp, cv_wino *wn) {
    cg_mk *m = &wn->mk;
    memset(wn, 0, sizeof *wn);
    wn->TH = cp->dH / 2, wn->TW = cp->dW / 2;
    int64_t nth = cp->N * wn->TH; /* tile rows of all images */
    m->pk = cp->mk.pk;
    /* K chunks: the most channels up to WN_KP packed elements that divide K's channels */
    wn->kc = 16;
    for (int64_t k = 16; k <= WN_KP * m->pk && k <= cp->wch; k += 16)
        if (cp->wch % k == 0)
            wn->kc = k;
    wn->nbk = cp->wch / wn->kc;
    m->kp = wn->kc / m->pk;
    int64_t nbm = ceil_div(cp->M, WN_ROWS);
    int64_t rows = ceil_div(ceil_div(cp->M, nbm), 16) * 16;
    rows = rows < cp->M ? rows : cp->M;
    nbm = ceil_div(cp->M, rows);
    /* blocks of equal tile rows whose tiles fill the microkernel's column tiles best, at
     * least WN_TASKS_MIN tasks, their C blocks within WN_C_BYTES (fewer blocks on a tie) */
    double best = -1.0;
    int64_t btr = 1, bnb = nth;
    for (int64_t nb = 1; nb <= nth; nb++) {
        int64_t tr = ceil_div(nth, nb);
        if (ceil_div(nth, tr) != nb)
            continue;
        int64_t tiles = tr * wn->TW, nv = tiles <= MK_PANEL ? 1 : 2;
        int64_t np = ceil_div(tiles, nv * MK_PANEL) * nv * MK_PANEL;
        int64_t mbp = ceil_div(rows, MK_ACC / nv) * (MK_ACC / nv);
        if ((tr > 1 && 16 * mbp * np * 4 > WN_C_BYTES) || (nb * nbm < WN_TASKS_MIN && nb < nth))
            continue;
        double eff = (double)(nth * wn->TW) / (double)(nb * np);
        if (eff > best + 1e-9)
            best = eff, btr = tr, bnb = nb;
    }
    wn->tr = btr;
    int64_t tiles = btr * wn->TW;
    m->nv = tiles <= MK_PANEL ? 1 : 2;
    m->mr = MK_ACC / m->nv;
    m->nbp = ceil_div(tiles, m->nv * MK_PANEL) * m->nv * MK_PANEL;
    m->b_ld = m->nbp % 128 == 0 ? m->nbp + MK_PANEL : m->nbp;
    /* the source's window: 4 x 4 of stride 2, from the convolution's padding; the input
     * gradient's is the forward's over dy with the weights turned (dx[y] = sum_k w[2 - k]
     * dy[y - (2 - pad) + k]): padding 2 - pad */
    cv_plan *wp = &wn->win;
    *wp = *cp;
    if (cp->role == CV_GRAD_INPUT)
        wp->pd[0] = 2 - cp->pd[0], wp->pd[1] = 2 - cp->pd[1];
    wp->KH = wp->KW = wp->KWf = 4;
    wp->KK = wp->KKf = 16;
    wp->st[0] = wp->st[1] = 2;
    wp->dH = wn->TH, wp->dW = wn->TW;
    wp->pix_rows = btr;
    wp->identity = wp->tab = wp->pairs_win = wp->phased = wp->dst_big = false;
    wp->lanes_win = true;
    /* the epilogue's blocks: two pixel rows per tile row */
    cp->rows = rows, cp->nbm = nbm;
    cp->pix_rows = 2 * btr, cp->cols = cp->pix_rows * cp->dW, cp->nbn = bnb;
    cp->mbp = ceil_div(rows, m->mr) * m->mr;
    cp->mk.nbp = ceil_div(cp->cols, MK_PANEL) * MK_PANEL;
    cp->a_cache = false;
}

/* vector<16 x et> of mem[idx[l]] (idx a vector<16 x i32>), every lane read. */
static MlirValue gather16(cg_b *b, MlirValue mem, MlirType et, MlirValue idx) {
    MlirType vt = cg_vec_t(16, et), vb = cg_vec_t(16, b->i1);
    MlirValue all = cg_vbroadcast(b, cg_ci(b, b->i1, 1), vb);
    MlirValue pass =
        cg_vbroadcast(b, mlirTypeIsAFloat(et) ? cg_cf(b, et, 0.0) : cg_ci(b, et, 0), vt);
    MlirValue ops[5] = {mem, cg_idx(b, 0), idx, all, pass};
    return mlirOperationGetResult(cg_op(b, "vector.gather", 5, ops, 1, &vt, 0, NULL), 0);
}

/* U of rows [i0, i1) (rows past i1 up to mbp repeat its last), every chunk: GEMM x of chunk
 * k's A at uw[(k 16 + x) mbp kp], row-major [mbp, kp] (bf16 pairs of channels through ut,
 * rounded to nearest). Row i, channel k: conv2d's w[i, k], the input gradient's w[k, i]
 * turned by 180 degrees. */
static void transform_weights(kc *c, const cv_plan *cp, const cv_wino *wn, MlirValue uw,
                              MlirValue ut, MlirValue i0, MlirValue i1) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    MlirValue wbuf = c->bufs[c->s->buf_of[cp->plain]], z = cg_idx(b, 0);
    loom_dtype wdt = c->g->nodes[cp->plain].dtype;
    MlirType vi = cg_vec_t(16, b->i32);
    int64_t blk = cp->mbp * m->kp, kch = wn->kc;
    bool fwd = cp->role == CV_FWD;
    int64_t rs = fwd ? 9 * cp->C : 9, ks = fwd ? 9 : 9 * cp->C; /* w's steps per row, channel */
    int32_t step[16];
    for (int l = 0; l < 16; l++)
        step[l] = (int32_t)(ks * l);
    MlirValue lanes = cg_vconst_i32(b, 16, step);
    cg_for lk, li, lv;
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    cg_for_begin(b, &li, z, cg_idx(b, cp->mbp), 0, NULL);
    MlirValue i = cg_imin(b, cg_iadd(b, i0, li.iv), isub(b, i1, cg_idx(b, 1)));
    cg_for_begin(b, &lv, z, cg_idx(b, kch / 16), 0, NULL);
    MlirValue ch = cg_iadd(b, cg_imul_c(b, lk.iv, kch), cg_imul_c(b, lv.iv, 16));
    MlirValue base = cg_iadd(b, cg_imul_c(b, i, rs), cg_imul_c(b, ch, ks)), g[9], u[16];
    for (int t = 0; t < 9; t++) {
        MlirValue at =
            cg_conv(b, "arith.index_cast", cg_iadd(b, base, cg_idx(b, fwd ? t : 8 - t)), b->i32);
        MlirValue idx = cg_bin(b, "arith.addi", cg_vbroadcast(b, at, vi), lanes);
        g[t] = cg_widen16(b, wdt, gather16(b, wbuf, cg_storage_type(b, wdt), idx));
    }
    both_axes(b, g3, 3, 4, g, u); /* U = G w G^T */
    MlirValue col = cg_imul_c(b, lv.iv, 16);
    for (int x = 0; x < 16; x++) {
        if (m->pk == 2)
            cg_vstore(b, cg_round16(b, LOOM_DTYPE_BF16, u[x]), ut,
                      cg_iadd(b, cg_idx(b, x * cp->mbp * kch),
                              cg_iadd(b, cg_imul_c(b, li.iv, kch), col)));
        else
            cg_vstore(b, u[x], uw,
                      cg_iadd(b,
                              cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk.iv, 16), cg_idx(b, x)), blk),
                              cg_iadd(b, cg_imul_c(b, li.iv, m->kp), col)));
    }
    cg_for_end(b, &lv, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
    if (m->pk == 2)
        cv_pair_up(c, ut, uw, cg_imul_c(b, lk.iv, 16 * blk), 16 * blk);
    cg_for_end(b, &lk, 0, NULL);
}

/* Y of the block's rows [0, mb) and tile rows [0, ntr) from the 16 GEMMs' C (cw, GEMM x's
 * at x cblk) into C in the destination's layout (cs, rows cp->mk.nbp apart): per 16 tiles
 * of a tile row, its two pixel rows' 32 pixels (Y's columns interleaved). */
static void transform_output(kc *c, const cv_plan *cp, const cv_wino *wn, MlirValue cw,
                             MlirValue cs, MlirValue mb, MlirValue ntr) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    MlirType vf = cg_vec_t(16, b->f32);
    int64_t cblk = cp->mbp * m->nbp, lo[16], hi[16];
    for (int l = 0; l < 16; l++) {
        lo[l] = l % 2 == 0 ? l / 2 : 16 + l / 2;
        hi[l] = lo[l] + 8;
    }
    cg_for li, lr;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    MlirValue crow = cg_imul_c(b, li.iv, cp->mk.nbp), mrow = cg_imul_c(b, li.iv, m->nbp);
    cg_for_begin(b, &lr, cg_idx(b, 0), ntr, 0, NULL);
    MlirValue tcol = cg_iadd(b, mrow, cg_imul_c(b, lr.iv, wn->TW));
    MlirValue prow = cg_iadd(b, crow, cg_imul_c(b, lr.iv, 2 * cp->dW));
    for (int64_t s = 0; s < wn->TW; s += 16) {
        int64_t n = wn->TW - s < 16 ? wn->TW - s : 16;
        MlirValue mv[16], y[4];
        for (int x = 0; x < 16; x++)
            mv[x] = cg_vload(b, vf, cw, cg_iadd(b, tcol, cg_idx(b, x * cblk + s)));
        both_axes(b, at4, 4, 2, mv, y); /* Y = A^T M A */
        for (int a = 0; a < 2; a++) {
            MlirValue at = cg_iadd(b, prow, cg_idx(b, a * cp->dW + 2 * s));
            cv_store_lanes(b, cg_vshuffle(b, y[2 * a], y[2 * a + 1], 16, lo), cs, at,
                           2 * n < 16 ? 2 * n : 16);
            if (2 * n > 16)
                cv_store_lanes(b, cg_vshuffle(b, y[2 * a], y[2 * a + 1], 16, hi), cs,
                               cg_iadd(b, at, cg_idx(b, 16)), 2 * n - 16);
        }
    }
    cg_for_end(b, &lr, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

loom_status cv_wino_emit(kc *c, const cv_plan *cp, const cv_wino *wn) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    bool pairs = m->pk == 2;
    MlirType et = pairs ? b->i32 : b->f32;
    MlirValue z = cg_idx(b, 0);
    int64_t blk = cp->mbp * m->kp, cblk = cp->mbp * m->nbp, nth = cp->N * wn->TH;
    MlirValue rtab = cg_alloc_buf(b, b->i64, 4 * wn->tr);
    MlirValue bw = cg_alloc_buf(b, et, 16 * m->kp * m->b_ld);
    MlirValue cw = cg_alloc_buf(b, b->f32, 16 * cblk + MK_PANEL); /* + a row's overread */
    MlirValue cs = cg_alloc_buf(b, b->f32, cp->mbp * cp->mk.nbp);
    MlirValue uw = cg_alloc_buf(b, et, 16 * blk * wn->nbk);
    MlirValue ut = pairs ? cg_alloc_buf(b, b->f32, 16 * cp->mbp * wn->kc) : uw;
    MlirValue akey = cg_alloc_buf(b, b->i64, 1); /* the row block whose U uw holds */
    cg_store(b, cg_ci(b, b->i64, -1), akey, z);
    loom_status st = LOOM_OK;
    cg_for lo, lk, lx;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue ib = idiv(b, lo.iv, cp->nbn), jb = irem(b, lo.iv, cp->nbn);
    MlirValue i0 = cg_imul_c(b, ib, cp->rows);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, cp->rows)), cg_idx(b, cp->M));
    MlirValue t0 = cg_imul_c(b, jb, wn->tr);
    MlirValue t1 = cg_imin(b, cg_iadd(b, t0, cg_idx(b, wn->tr)), cg_idx(b, nth));
    MlirValue mb = isub(b, i1, i0), ntr = isub(b, t1, t0);
    MlirValue key = cg_conv(b, "arith.index_cast", ib, b->i64);
    cg_if f;
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, akey, z), key));
    transform_weights(c, cp, wn, uw, ut, i0, i1);
    cg_store(b, key, akey, z);
    cg_if_end(b, &f);
    cv_build_rows(c, &wn->win, rtab, t0, t1);
    bool acc = wn->nbk > 1; /* chunks accumulate into C */
    if (acc)
        cv_zero_rows(b, cw, z, 16 * cp->mbp, m->nbp, cg_cf(b, b->f32, 0.0));
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    MlirValue k0 = cg_imul_c(b, lk.iv, wn->kc);
    cv_stage_winograd(c, &wn->win, m, bw, rtab, k0, cg_iadd(b, k0, cg_idx(b, wn->kc)), t0, t1);
    cg_for_begin(b, &lx, z, cg_idx(b, 16), 0, NULL);
    MlirValue a0 = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk.iv, 16), lx.iv), blk);
    cg_mk_tiles_at(c, m, uw, a0, bw, cg_imul_c(b, lx.iv, m->kp * m->b_ld), cw,
                   cg_imul_c(b, lx.iv, cblk), mb, cg_imul_c(b, ntr, wn->TW), acc, NULL);
    cg_for_end(b, &lx, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    transform_output(c, cp, wn, cw, cs, mb, ntr);
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, z, i0, i1, cg_imul_c(b, t0, 2), cg_imul_c(b, t1, 2));
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[7] = {rtab, bw, cw, cs, uw, ut, akey};
    for (int q = 0; q < 7; q++)
        if (q != 5 || pairs)
            cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
    return st;
}
