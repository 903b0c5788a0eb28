/* Winograd F(2x2, 3x3) for the stride-1 3x3 convolutions: forwards, input gradients and
 * weight gradients (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
 * 2016); LOOM_CONV=direct keeps them on lower_conv.c's direct kernels.
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
 * A task is (row block, block of whole tile rows). An odd destination's last tile row and
 * column overhang it by a pixel: their input reads as padding (zeros), their outputs there
 * are not stored, and the weight gradient reads dy there as zeros. At 7x7 (ResNet-50's
 * layer4) that is 64 multiplies a pixel for 49: the saving falls to 1.7x.
 *
 * The weight gradient differentiates the same product with respect to U: per tile, dM =
 * A dY A^T (dY the tile's 2 x 2 of dy) and dU = dM . V, summed over the tiles of every image,
 * and dw = G^T dU G. The sums are 16 GEMMs dU_x^T [C, O] = V_x [C, tiles] x dM_x^T [tiles,
 * O], 2.25x fewer multiplies than the direct [C 9, pixels] x [pixels, O]. A task is (block of
 * x's channels, block of dy's), over all the tiles in K chunks of whole tile rows: V staged
 * as A by the forward's input transform (f32; rounded to bf16 and paired along the tiles for
 * vdpbf16ps), dy^T staged as the direct weight gradient stages it and transformed into B
 * 16 channels at a time (so that no transform's output needs transposing: dy has a quarter
 * as many values). dw^T leaves in the direct weight gradient's C layout, so its epilogue
 * (the store, or fused consumers) runs unchanged. */
#include <string.h>

#include "conv_internal.h"

enum {
    WN_ROWS = 128,          /* rows of a row block (y's channels, or dx's), at most */
    WN_KP = 64,             /* packed elements along K (channels / pk) of a chunk, at most */
    WN_C_BYTES = 512 << 10, /* the 16 GEMMs' C blocks of a task, at most (else fewer tiles) */
    WN_TASKS_MIN = 4,       /* tasks at least, where there are the tile rows */
    /* tiles along a row at least (all three): the input transforms run on vectors of 16 of a
     * row's tiles, and fewer filled them too thinly to pay (ResNet-50 at 64x64, bf16, over 11
     * steps: layer4's 2x2 (1 tile a row) weight gradients 82 -> 118 ms as Winograd, layer3's
     * 4x4 (2) 125 -> 142 ms; layer2's 8x8 (4) 74 -> 67 ms) */
    WN_TW_MIN = 4,
    /* the weight gradient's */
    WG_MIN = 16,      /* x's and dy's channels at least (fewer: the transforms dominate) */
    WG_ROWS = 128,    /* x's channels of a row block, at most */
    WG_COLS = 128,    /* dy's channels of a column block, at most */
    WG_TILES = 128,   /* tiles of a K chunk, about (whole tile rows) */
    WG_TASKS_MIN = 2, /* tasks at least, the rows split first (which repeats dy's transform only) */
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

/* o[0..3 * os] = S A (d[0], d[ds]): the weight gradient's dM = A dY A^T with A's last row's
 * sign turned by S = diag(1, 1, 1, -1) on both axes (no negation); gt3 turns it back. */
static void a2s(cg_b *b, const MlirValue *d, int64_t ds, MlirValue *o, int64_t os) {
    o[0] = d[0];
    o[os] = fadd(b, d[0], d[ds]);
    o[2 * os] = fsub(b, d[0], d[ds]);
    o[3 * os] = d[ds];
}

/* o[0..2 * os] = (S G)^T (u[0], u[us], u[2 us], u[3 us]): dw = G^T dU G of the sums of
 * dM . V, dM's signs turned back. */
static void gt3(cg_b *b, const MlirValue *u, int64_t us, MlirValue *o, int64_t os) {
    MlirValue h = fhalf(b, fadd(b, u[us], u[2 * us]));
    o[0] = fadd(b, u[0], h);
    o[os] = fhalf(b, fsub(b, u[us], u[2 * us]));
    o[2 * os] = fsub(b, h, u[3 * us]);
}

/* o[0..1 * os] = A^T (m[0], m[ms], m[2 ms], m[3 ms]) */
static void at4(cg_b *b, const MlirValue *m, int64_t ms, MlirValue *o, int64_t os) {
    o[0] = fadd(b, fadd(b, m[0], m[ms]), m[2 * ms]);
    o[os] = fsub(b, fsub(b, m[ms], m[2 * ms]), m[3 * ms]);
}

bool cv_wino_ok(const kc *c, const cv_plan *cp) {
    if (loom_cg_conv_mode() == CG_CONV_DIRECT || cp->phased || cp->G != 1 || cp->KH != 3 ||
        cp->KW != 3 || cp->st[0] != 1 || cp->st[1] != 1 || cp->dl[0] != 1 || cp->dl[1] != 1 ||
        cp->pd[0] > 2 || cp->pd[1] > 2 || cp->dH <= 0 || ceil_div(cp->dW, 2) < WN_TW_MIN ||
        cp->N <= 0)
        return false;
    if (cp->role == CV_GRAD_WEIGHT)
        return cp->Cg >= WG_MIN && cp->Og >= WG_MIN;
    const loom_ir_node *w = &c->g->nodes[cp->plain];
    return cp->wch > 0 && cp->wch % 16 == 0 && loom_ir_numel(w->rank, w->shape) < INT32_MAX;
}

/* The weight gradient's blocks: row blocks of x's channels, column blocks of dy's (tasks:
 * (row block, column block), the rows split first where there are too few: a task stages
 * V for its rows and dy^T for its columns, and dy's transform is the cheaper to repeat),
 * and K chunks of about WG_TILES tiles, whole tile rows. */
static void plan_gw(cv_plan *cp, cv_wino *wn) {
    cg_mk *m = &wn->mk;
    int64_t nth = cp->N * wn->TH;
    int64_t tr = ceil_div(WG_TILES, wn->TW);
    tr = tr < nth ? tr : nth;
    wn->nbk = ceil_div(nth, tr);
    wn->tr = ceil_div(nth, wn->nbk);
    wn->kc = ceil_div(wn->tr * wn->TW, 2) * 2;
    int64_t nbm = ceil_div(cp->Cg, WG_ROWS), nbn = ceil_div(cp->Og, WG_COLS);
    if (nbm * nbn < WG_TASKS_MIN)
        nbm = ceil_div(WG_TASKS_MIN, nbn);
    wn->rows = ceil_div(cp->Cg, nbm);
    nbm = ceil_div(cp->Cg, wn->rows);
    int64_t cols = ceil_div(ceil_div(cp->Og, nbn), MK_PANEL) * MK_PANEL;
    cols = cols < cp->Og ? cols : cp->Og;
    nbn = ceil_div(cp->Og, cols);
    m->pk = cp->mk.pk;
    m->kp = wn->kc / m->pk;
    m->nv = cols <= MK_PANEL ? 1 : 2;
    m->mr = MK_ACC / m->nv;
    m->nbp = ceil_div(cols, m->nv * MK_PANEL) * m->nv * MK_PANEL;
    m->b_ld = cv_row_ld(m->nbp);
    /* A staged in f32, [rows up to mbp, kc tiles] per GEMM */
    wn->amk =
        (cg_mk){.pk = 1, .kp = ceil_div(wn->rows, m->mr) * m->mr, .nbp = wn->kc, .b_ld = wn->kc};
    /* dy^T: the chunk's pixels (two pixel rows a tile row) x the block's columns in 16s */
    wn->dyp = *cp;
    int64_t dcols = ceil_div(cols, 16) * 16;
    wn->dyp.mk = (cg_mk){.pk = 1, .kp = 0, .nbp = dcols, .b_ld = cv_row_ld(dcols)};
    /* the epilogue's blocks: C (rows (c, kh, kw), columns o) */
    cp->rows = 9 * wn->rows, cp->nbm = nbm;
    cp->cols = cols, cp->nbn = nbn;
    cp->mk.nbp = m->nbp;
    cp->a_cache = false;
}

/* The 4 x 4 window of stride 2 over x (or, for the input gradient, dy) whose destination
 * grid is the tiles, tr tile rows a block: the forward's padding, the input gradient's 2 - pad
 * (dx[y] = sum_k w[2 - k] dy[y - (2 - pad) + k]: the forward's over dy, the weights turned). */
static void plan_window(const cv_plan *cp, cv_wino *wn) {
    cv_plan *wp = &wn->win;
    *wp = *cp;
    if (cp->role == CV_GRAD_INPUT)
        wp->pd[0] = 2 - cp->pd[0], wp->pd[1] = 2 - cp->pd[1];
    wp->KH = wp->KW = wp->KWf = 4;
    wp->KK = wp->KKf = 16;
    wp->st[0] = wp->st[1] = 2;
    wp->dH = wn->TH, wp->dW = wn->TW;
    wp->pix_rows = wn->tr;
    wp->identity = wp->tab = wp->pairs_win = wp->phased = wp->dst_big = false;
    wp->lanes_win = true;
}

void cv_wino_plan(cv_plan *cp, cv_wino *wn) {
    cg_mk *m = &wn->mk;
    memset(wn, 0, sizeof *wn);
    wn->TH = ceil_div(cp->dH, 2), wn->TW = ceil_div(cp->dW, 2);
    if (cp->role == CV_GRAD_WEIGHT) {
        plan_gw(cp, wn);
        plan_window(cp, wn);
        return;
    }
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
    m->b_ld = cv_row_ld(m->nbp);
    plan_window(cp, wn);
    /* the epilogue's blocks: two pixel rows per tile row */
    cp->rows = rows, cp->nbm = nbm;
    cp->pix_rows = 2 * btr, cp->cols = cp->pix_rows * cp->dW, cp->nbn = bnb;
    cp->mbp = ceil_div(rows, m->mr) * m->mr;
    cp->mk.nbp = ceil_div(cp->cols, MK_PANEL) * MK_PANEL;
    cp->a_cache = false;
}

/* Frees the kernel's n buffers, but bufs[skip] where it is another one (alias). */
static void dealloc_bufs(cg_b *b, MlirValue *bufs, int n, int skip, bool alias) {
    for (int q = 0; q < n; q++)
        if (q != skip || !alias)
            cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
}

/* Block k of blocks of `size` over [0, end): [*lo, *hi). */
static void block_of(cg_b *b, MlirValue k, int64_t size, int64_t end, MlirValue *lo,
                     MlirValue *hi) {
    *lo = cg_imul_c(b, k, size);
    *hi = cg_imin(b, cg_iadd(b, *lo, cg_idx(b, size)), cg_idx(b, end));
}

/* The destination pixel row (n dH + y) of tile row t's first: an odd height's last tile row
 * has one. */
static MlirValue tile_row_pixel(cg_b *b, const cv_wino *wn, int64_t dH, MlirValue t) {
    return cg_iadd(b, cg_imul_c(b, idiv(b, t, wn->TH), dH), cg_imul_c(b, irem(b, t, wn->TH), 2));
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
            cg_vstore(b, u[x], ut, /* paired and rounded by cv_pair_up */
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

/* Y of the block's rows [0, mb) and tile rows [t0, t0 + ntr) from the 16 GEMMs' C (cw,
 * GEMM x's at x cblk) into C in the destination's layout (cs, rows cp->mk.nbp apart): per 16
 * tiles of a tile row, its two pixel rows' 32 pixels (Y's columns interleaved). Of an odd
 * destination, a last column's second pixel is not stored, and an image's last tile row's
 * second pixel row lands on the next tile row's first, which is stored after it (or past
 * the block's rows, which the epilogue does not read). */
static void transform_output(kc *c, const cv_plan *cp, const cv_wino *wn, MlirValue cw,
                             MlirValue cs, MlirValue mb, MlirValue t0, MlirValue ntr) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    MlirType vf = cg_vec_t(16, b->f32);
    int64_t cblk = cp->mbp * m->nbp, lo[16], hi[16];
    for (int l = 0; l < 16; l++) {
        lo[l] = l % 2 == 0 ? l / 2 : 16 + l / 2;
        hi[l] = lo[l] + 8;
    }
    MlirValue p0 = tile_row_pixel(b, wn, cp->dH, t0);
    cg_for li, lr;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    MlirValue crow = cg_imul_c(b, li.iv, cp->mk.nbp), mrow = cg_imul_c(b, li.iv, m->nbp);
    cg_for_begin(b, &lr, cg_idx(b, 0), ntr, 0, NULL);
    MlirValue tcol = cg_iadd(b, mrow, cg_imul_c(b, lr.iv, wn->TW));
    MlirValue py = isub(b, tile_row_pixel(b, wn, cp->dH, cg_iadd(b, t0, lr.iv)), p0);
    MlirValue prow = cg_iadd(b, crow, cg_imul_c(b, py, cp->dW));
    for (int64_t s = 0; s < wn->TW; s += 16) {
        /* pixels from 2 s to store in the row: of a row's last 16 tiles, to its end */
        int64_t n = wn->TW - s < 16 ? wn->TW - s : 16;
        int64_t px = cp->dW - 2 * s < 2 * n ? cp->dW - 2 * s : 2 * n;
        MlirValue mv[16], y[4];
        for (int x = 0; x < 16; x++)
            mv[x] = cg_vload(b, vf, cw, cg_iadd(b, tcol, cg_idx(b, x * cblk + s)));
        both_axes(b, at4, 4, 2, mv, y); /* Y = A^T M A */
        for (int a = 0; a < 2; a++) {
            MlirValue at = cg_iadd(b, prow, cg_idx(b, a * cp->dW + 2 * s));
            cv_store_lanes(b, cg_vshuffle(b, y[2 * a], y[2 * a + 1], 16, lo), cs, at,
                           px < 16 ? px : 16);
            if (px > 16)
                cv_store_lanes(b, cg_vshuffle(b, y[2 * a], y[2 * a + 1], 16, hi), cs,
                               cg_iadd(b, at, cg_idx(b, 16)), px - 16);
        }
    }
    cg_for_end(b, &lr, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

/* The weight gradient's B, dM^T of the chunk's nt tiles (from tile row t0) for the 16 GEMMs
 * (GEMM x's at bw[x kp b_ld]: row = tile, or pairs of tiles (2 kk, 2 kk + 1) rounded to
 * bf16; zeros past the tiles up to kp and past dy^T's columns up to nbp), from dy^T staged
 * as cv_stage_dy_t stages it from tile row t0's first pixel row: a tile's four pixels, rows
 * py OW + 2 tx + (0, 1, OW, OW + 1) of stg (py its first pixel row's, from t0's), 16 of dy's
 * channels at a time. Of an odd dy, the pixels past a row's end or an image's last row (an
 * overhanging tile's) are zeros. */
static void transform_dy(kc *c, const cv_wino *wn, MlirValue stg, MlirValue bw, MlirValue t0,
                         MlirValue nt) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    int64_t pk = m->pk, dl = wn->dyp.mk.b_ld, ow = wn->dyp.dW, oh = wn->dyp.dH;
    int64_t xs = m->kp * m->b_ld;
    int64_t np = wn->dyp.mk.nbp / MK_PANEL;
    MlirType vf = cg_vec_t(MK_PANEL, b->f32), vi = cg_vec_t(MK_PANEL, b->i32);
    MlirValue z = cg_idx(b, 0), zf = cg_vbroadcast(b, cg_cf(b, b->f32, 0.0), vf);
    MlirValue zero = pk == 2 ? cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi) : zf;
    MlirValue nrow = idiv(b, cg_iadd(b, nt, cg_idx(b, pk - 1)), pk);
    MlirValue p0 = tile_row_pixel(b, wn, oh, t0);
    cg_for lk, lp;
    cg_for_begin(b, &lk, z, nrow, 0, NULL);
    MlirValue px[2], has[2] = {{NULL}, {NULL}}, right[2] = {{NULL}, {NULL}},
                     below[2] = {{NULL}, {NULL}};
    for (int64_t e = 0; e < pk; e++) {
        MlirValue t = cg_iadd(b, cg_imul_c(b, lk.iv, pk), cg_idx(b, e));
        if (e > 0) { /* an odd count's last pair: its second tile zeros */
            has[e] = cg_cmpi(b, CG_I_ULT, t, nt);
            t = cg_select(b, has[e], t, isub(b, t, cg_idx(b, 1)));
        }
        MlirValue ty = cg_iadd(b, t0, idiv(b, t, wn->TW)), tx = irem(b, t, wn->TW);
        MlirValue py = isub(b, tile_row_pixel(b, wn, oh, ty), p0);
        px[e] = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, py, ow), cg_imul_c(b, tx, 2)), dl);
        if (ow % 2 != 0) /* the tile's second column inside dy */
            right[e] = cg_cmpi(b, CG_I_ULT, cg_imul_c(b, tx, 2), cg_idx(b, ow - 1));
        if (oh % 2 != 0) /* and its second row */
            below[e] =
                cg_cmpi(b, CG_I_ULT, cg_imul_c(b, irem(b, ty, wn->TH), 2), cg_idx(b, oh - 1));
    }
    MlirValue row = cg_imul_c(b, lk.iv, m->b_ld);
    cg_for_begin(b, &lp, z, cg_idx(b, np), 0, NULL);
    MlirValue col = cg_imul_c(b, lp.iv, MK_PANEL), v[2][16];
    for (int64_t e = 0; e < pk; e++) {
        MlirValue at = cg_iadd(b, px[e], col), d[4];
        for (int q = 0; q < 4; q++) {
            d[q] = cg_vload(b, vf, stg, cg_iadd(b, at, cg_idx(b, ((q / 2) * ow + q % 2) * dl)));
            if (q % 2 == 1 && !mlirValueIsNull(right[e]))
                d[q] = cg_select(b, right[e], d[q], zf);
            if (q / 2 == 1 && !mlirValueIsNull(below[e]))
                d[q] = cg_select(b, below[e], d[q], zf);
        }
        both_axes(b, a2s, 2, 4, d, v[e]);
        for (int x = 0; x < 16 && e > 0; x++)
            v[e][x] = cg_select(b, has[e], v[e][x], zf);
    }
    for (int x = 0; x < 16; x++) {
        MlirValue val = pk == 2 ? cg_cvt_bf16x32(b, v[0][x], v[1][x], true) : v[0][x];
        cg_vstore(b, val, bw, cg_iadd(b, cg_idx(b, x * xs), cg_iadd(b, row, col)));
    }
    cg_for_end(b, &lp, 0, NULL);
    for (int64_t p = np; p < m->nbp / MK_PANEL; p++) /* the GEMMs' columns past dy^T's */
        for (int x = 0; x < 16; x++)
            cg_vstore(b, zero, bw, cg_iadd(b, row, cg_idx(b, x * xs + p * MK_PANEL)));
    cg_for_end(b, &lk, 0, NULL);
    MlirValue zs = pk == 2 ? cg_ci(b, b->i32, 0) : cg_cf(b, b->f32, 0.0);
    for (int x = 0; x < 16; x++) /* the rows past the tiles */
        cv_zero_rows_at(b, bw, cg_idx(b, x * xs), nrow, m->kp, m->b_ld, zs);
}

/* dw^T of the block's rows [0, mb) from the 16 GEMMs' sums (cw, GEMM x's at x cblk), G^T dU
 * G each, into C as the direct weight gradient's (cs: row (c, kh, kw), column o, rows nbp
 * apart), for the epilogue. */
static void transform_filter(kc *c, const cv_wino *wn, MlirValue cw, MlirValue cs, MlirValue mb) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    MlirType vf = cg_vec_t(MK_PANEL, b->f32);
    int64_t cblk = wn->amk.kp * m->nbp;
    cg_for li, lp;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    cg_for_begin(b, &lp, cg_idx(b, 0), cg_idx(b, m->nbp / MK_PANEL), 0, NULL);
    MlirValue at = cg_iadd(b, cg_imul_c(b, li.iv, m->nbp), cg_imul_c(b, lp.iv, MK_PANEL));
    MlirValue to = cg_iadd(b, cg_imul_c(b, li.iv, 9 * m->nbp), cg_imul_c(b, lp.iv, MK_PANEL));
    MlirValue u[16], g[9];
    for (int x = 0; x < 16; x++)
        u[x] = cg_vload(b, vf, cw, cg_iadd(b, at, cg_idx(b, x * cblk)));
    both_axes(b, gt3, 4, 3, u, g);
    for (int k = 0; k < 9; k++)
        cg_vstore(b, g[k], cs, cg_iadd(b, to, cg_idx(b, k * m->nbp)));
    cg_for_end(b, &lp, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

/* The weight gradient's tasks: per K chunk, V of the block's channels as A (staged in f32,
 * paired along the tiles for vdpbf16ps), dy^T of its columns and their dM^T as B, the 16
 * GEMMs summed into cw; then dw from the sums and the epilogue. */
static loom_status emit_gw(kc *c, const cv_plan *cp, const cv_wino *wn) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    bool pairs = m->pk == 2;
    MlirValue z = cg_idx(b, 0);
    int64_t mbp = wn->amk.kp, ablk = mbp * m->kp, bblk = m->kp * m->b_ld, cblk = mbp * m->nbp;
    int64_t nth = cp->N * wn->TH;
    MlirValue rtab = cg_alloc_buf(b, b->i64, 4 * wn->tr);
    MlirValue stga = cg_alloc_buf(b, b->f32, 16 * mbp * wn->kc);
    MlirValue ap = pairs ? cg_alloc_buf(b, b->i32, 16 * ablk) : stga;
    /* + a pixel row: an odd dy's overhanging tiles read a pixel past the chunk's rows */
    MlirValue stgd = cg_alloc_buf(b, b->f32, (2 * wn->tr + 1) * cp->dW * wn->dyp.mk.b_ld);
    MlirValue bw = cg_alloc_buf(b, pairs ? b->i32 : b->f32, 16 * bblk);
    MlirValue cw = cg_alloc_buf(b, b->f32, 16 * cblk);
    MlirValue cs = cg_alloc_buf(b, b->f32, cp->rows * m->nbp);
    cg_for lo, lk, lx;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue i0, i1, j0, j1, t0, t1;
    block_of(b, idiv(b, lo.iv, cp->nbn), wn->rows, cp->Cg, &i0, &i1);
    block_of(b, irem(b, lo.iv, cp->nbn), cp->cols, cp->Og, &j0, &j1);
    MlirValue mb = isub(b, i1, i0);
    if (wn->nbk == 0) /* no tiles (an empty batch): dw = 0 */
        cv_zero_rows(b, cw, z, 16 * mbp, m->nbp, cg_cf(b, b->f32, 0.0));
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    block_of(b, lk.iv, wn->tr, nth, &t0, &t1);
    cv_build_rows(c, &wn->win, rtab, t0, t1);
    cv_stage_winograd(c, &wn->win, &wn->amk, stga, rtab, i0, i1, t0, t1);
    if (pairs)
        cv_pair_up(c, stga, ap, z, 16 * ablk);
    cv_stage_dy_t(c, &wn->dyp, stgd, z, j0, j1, tile_row_pixel(b, wn, cp->dH, t0),
                  tile_row_pixel(b, wn, cp->dH, t1));
    transform_dy(c, wn, stgd, bw, t0, cg_imul_c(b, isub(b, t1, t0), wn->TW));
    /* the first chunk starts C, the others add to it */
    MlirValue first = wn->nbk > 1 ? cg_cmpi(b, CG_I_EQ, lk.iv, z) : (MlirValue){NULL};
    cg_for_begin(b, &lx, z, cg_idx(b, 16), 0, NULL);
    cg_mk_tiles_at(c, m, ap, cg_imul_c(b, lx.iv, ablk), bw, cg_imul_c(b, lx.iv, bblk), cw,
                   cg_imul_c(b, lx.iv, cblk), mb, isub(b, j1, j0), wn->nbk > 1, first, NULL);
    cg_for_end(b, &lx, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    transform_filter(c, wn, cw, cs, mb);
    loom_status st = LOOM_OK;
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, z, cg_imul_c(b, i0, 9), cg_imul_c(b, i1, 9), j0, j1);
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[7] = {rtab, stga, ap, stgd, bw, cw, cs};
    dealloc_bufs(b, bufs, 7, 2, !pairs); /* ap is stga in f32 */
    return st;
}

loom_status cv_wino_emit(kc *c, const cv_plan *cp, const cv_wino *wn) {
    if (cp->role == CV_GRAD_WEIGHT)
        return emit_gw(c, cp, wn);
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
    MlirValue ib = idiv(b, lo.iv, cp->nbn), i0, i1, t0, t1;
    block_of(b, ib, cp->rows, cp->M, &i0, &i1);
    block_of(b, irem(b, lo.iv, cp->nbn), wn->tr, nth, &t0, &t1);
    MlirValue mb = isub(b, i1, i0), ntr = isub(b, t1, t0);
    MlirValue key = cg_conv(b, "arith.index_cast", ib, b->i64);
    cg_if f;
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, akey, z), key));
    transform_weights(c, cp, wn, uw, ut, i0, i1);
    cg_store(b, key, akey, z);
    cg_if_end(b, &f);
    cv_build_rows(c, &wn->win, rtab, t0, t1);
    /* chunks accumulate into C, the first starting it */
    bool acc = wn->nbk > 1;
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    MlirValue first = acc ? cg_cmpi(b, CG_I_EQ, lk.iv, z) : (MlirValue){NULL};
    MlirValue k0 = cg_imul_c(b, lk.iv, wn->kc);
    cv_stage_winograd(c, &wn->win, m, bw, rtab, k0, cg_iadd(b, k0, cg_idx(b, wn->kc)), t0, t1);
    cg_for_begin(b, &lx, z, cg_idx(b, 16), 0, NULL);
    MlirValue a0 = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk.iv, 16), lx.iv), blk);
    cg_mk_tiles_at(c, m, uw, a0, bw, cg_imul_c(b, lx.iv, m->kp * m->b_ld), cw,
                   cg_imul_c(b, lx.iv, cblk), mb, cg_imul_c(b, ntr, wn->TW), acc, first, NULL);
    cg_for_end(b, &lx, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    transform_output(c, cp, wn, cw, cs, mb, t0, ntr);
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, z, i0, i1, tile_row_pixel(b, wn, cp->dH, t0),
                              tile_row_pixel(b, wn, cp->dH, t1));
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[7] = {rtab, bw, cw, cs, uw, ut, akey};
    dealloc_bufs(b, bufs, 7, 5, !pairs); /* ut is uw in f32 */
    return st;
}
