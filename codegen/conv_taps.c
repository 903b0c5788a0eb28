/* 3x3 convolutions (conv2d and its two gradients, stride 1 or 2) of small images by taps.
 *
 * A 3x3 of padding 1 at 4x4 (ResNet-50's layer3 at 64x64) reads padding at 31% of its taps,
 * at 2x2 (layer4) 56%. The direct kernel (lower_conv.c) multiplies those zeros: its columns
 * are an image's pixels, a vector of them, some lanes of which a tap finds in the padding.
 * Border classes skip them but pack each class's own weights (49 taps' worth for every 9 at
 * 4x4) into GEMMs too small to run at speed.
 *
 * Here the columns are pixel-major: for destination pixel p, C_p [rows, images] is a sum
 * over only the taps t that reach a source pixel of A_t [rows, K] x B [K, images of that
 * source pixel] (src_of: conv2d's p st + t - pad, where layer4's first 3x3, 4x4 to 2x2, reads
 * padding at 31% of its taps; the input gradient's (p + pad - t) / st where st divides it,
 * its 4x4 dx reached by 25 of 144 taps, which phases would run as GEMMs of 4 pixels), where
 *  - A_t is tap t of the weights (conv2d: w[o, c, t], rows o; the input gradient: w[o, c, t],
 *    rows c, K o), all 9 packed once per row block and kept across the thread's tasks of
 *    that block (cv_pack_taps, as Winograd's U);
 *  - the source's block of images is staged as [K (bf16 pairs of channels, or f32
 *    channels), pixel, image]: each image's channel (pair) one load of its at most 16 pixels,
 *    16 images' of them turned into 16 pixels' vectors of images by a 16 x 16 transpose, so
 *    that each (tap, pixel) GEMM reads its B as rows of one source pixel's images;
 *  - each GEMM adds into C_p (zeroed first) on the packed microkernel.
 * Then C [rows, pixel, image] is transposed into the destination's layout [rows, image,
 * pixel], and the convolution's own epilogue runs over it as over a direct convolution's.
 *
 * A task is (row block, block of 16 or 32 images); the K chunks are whole channels.
 *
 * The weight gradient likewise (emit_gw): for each destination pixel p and tap t that reaches
 * source pixel s, dw_t^T [x's channels, dy's] += x_s [channels, images] dy_p [images,
 * channels], K the images (bf16 pairs of images, as both operands are staged by the same
 * transposes), each tap's sums in the rows of the direct weight gradient's C that its
 * epilogue reads. At 4x4 and 2x2 the direct weight gradient's window rows of a tap in the
 * padding were zeros it multiplied too. */
#include <string.h>

#include "conv_internal.h"

enum {
    TP_HW_MAX = 16,     /* pixels of the source and of the destination, at most (one vector) */
    TP_WASTE_PCT = 25,  /* the taps on padding, at least (fewer: the direct kernel) */
    TP_ROWS = 128,      /* rows of a row block, at most */
    TP_TASKS_MIN = 4,   /* tasks at least, the rows split down to 16 where there are too few */
    TP_KC = 256,        /* channels of a K chunk, at most */
    TP_GW_IMAGES = 128, /* the weight gradient's images of a K chunk, at most */
};

/* Along axis a, the source coordinate of tap k at destination coordinate d: conv2d's d st +
 * k - pad; the input gradient's (d + pad - k) / st where st divides it. -1: none. */
static int64_t src_of(const cv_plan *cp, int a, int64_t d, int64_t k) {
    int64_t S = a == 0 ? cp->sH : cp->sW, st = cp->st[a], s = d * st + k - cp->pd[a];
    if (cp->dst_big) {
        int64_t num = d + cp->pd[a] - k;
        s = num >= 0 && num % st == 0 ? num / st : -1;
    }
    return s >= 0 && s < S ? s : -1;
}

/* Taps that reach a source pixel, summed over the destination's pixels. */
static int64_t valid_taps(const cv_plan *cp) {
    int64_t n = 0;
    for (int64_t y = 0; y < cp->dH; y++)
        for (int64_t x = 0; x < cp->dW; x++)
            for (int64_t kh = 0; kh < cp->KH; kh++)
                for (int64_t kw = 0; kw < cp->KW; kw++)
                    n += src_of(cp, 0, y, kh) >= 0 && src_of(cp, 1, x, kw) >= 0;
    return n;
}

bool cv_taps_ok(const kc *c, const cv_plan *cp) {
    bool gw = cp->role == CV_GRAD_WEIGHT;
    if (loom_cg_conv_mode() != CG_CONV_AUTO || cp->phased || cp->G != 1 || cp->KH != 3 ||
        cp->KW != 3 || cp->st[0] > 2 || cp->st[1] > 2 || cp->dl[0] != 1 || cp->dl[1] != 1 ||
        cp->dH <= 0 || cp->dW <= 0 || cp->dH * cp->dW > TP_HW_MAX || cp->sH * cp->sW > TP_HW_MAX ||
        cp->N <= 0 || cp->N % 16 != 0 || cp->M <= 0 || (gw ? cp->Og % 16 != 0 : cp->wch % 16 != 0))
        return false;
    loom_dtype sdt = c->g->nodes[cp->win].dtype, wdt = c->g->nodes[cp->plain].dtype;
    bool dtypes = cp->mk.pk == 2 ? sdt == LOOM_DTYPE_BF16 && wdt == LOOM_DTYPE_BF16
                                 : sdt == LOOM_DTYPE_F32 && wdt == LOOM_DTYPE_F32;
    const loom_ir_node *w = &c->g->nodes[cp->plain];
    int64_t all = cp->KK * cp->dH * cp->dW;
    return dtypes && loom_ir_numel(w->rank, w->shape) < INT32_MAX &&
           valid_taps(cp) * 100 <= all * (100 - TP_WASTE_PCT);
}

/* Images of a column block: 32 (tiles of 8 rows x 32 columns) where they divide the batch. */
static int64_t images_of(const cv_plan *cp) {
    return cp->N % 32 == 0 ? 32 : 16;
}

/* The most of n's divisors in 16s up to max (16 where none is). */
static int64_t divisor16(int64_t n, int64_t max) {
    int64_t d = 16;
    for (int64_t k = 16; k <= max && k <= n; k += 16)
        if (n % k == 0)
            d = k;
    return d;
}

/* n split into nb blocks of equal 16s (the last shorter): their size, at most n. */
static int64_t block16(int64_t n, int64_t nb) {
    int64_t r = ceil_div(ceil_div(n, nb), 16) * 16;
    return r < n ? r : n;
}

/* The weight gradient's blocks: x's channels (rows of C: 9 a channel) by dy's (columns), at
 * least TP_TASKS_MIN tasks where the channels allow, and K chunks of the most images up to
 * TP_GW_IMAGES that divide the batch. */
static void plan_gw(kc *c, cv_plan *cp) {
    int64_t nbo = ceil_div(cp->Og, TP_ROWS), nbc = ceil_div(cp->Cg, TP_ROWS);
    if (nbc * nbo < TP_TASKS_MIN)
        nbc = ceil_div(TP_TASKS_MIN, nbo);
    int64_t rc = block16(cp->Cg, nbc), co = block16(cp->Og, nbo);
    cp->rows = 9 * rc, cp->nbm = ceil_div(cp->Cg, rc);
    cp->cols = co, cp->nbn = ceil_div(cp->Og, co);
    cp->kc = divisor16(cp->N, TP_GW_IMAGES);
    cp->nbk = cp->N / cp->kc;
    cg_mk *m = &cp->mk;
    cg_mk_shape(m, co);
    m->kp = cp->kc / m->pk;
    m->nbp = cv_row_ld(ceil_div(co, m->nv * MK_PANEL) * m->nv * MK_PANEL); /* dw^T's rows */
    m->b_ld = m->nbp;
    cp->mbp = ceil_div(rc, m->mr) * m->mr; /* A's rows: x's channels */
    c->extent = cp->nbm * cp->nbn;
    c->grain = cg_grain_for(rc * co * cp->N * valid_taps(cp));
}

void cv_taps_plan(kc *c, cv_plan *cp) {
    if (cp->role == CV_GRAD_WEIGHT) {
        plan_gw(c, cp);
        return;
    }
    int64_t nb = images_of(cp), hw = cp->dH * cp->dW;
    cp->nbn = cp->N / nb;
    cp->pix_rows = nb * cp->dH;
    cp->cols = nb * hw;
    int64_t nbm = ceil_div(cp->M, TP_ROWS);
    if (nbm * cp->nbn < TP_TASKS_MIN)
        nbm = ceil_div(TP_TASKS_MIN, cp->nbn);
    cp->rows = block16(cp->M, nbm);
    cp->nbm = ceil_div(cp->M, cp->rows);
    cp->kc = divisor16(cp->wch, TP_KC); /* K chunks of whole channels */
    cp->nbk = cp->wch / cp->kc;
    cg_mk *m = &cp->mk;
    m->nv = nb / MK_PANEL;
    m->mr = cg_mk_rows(m->nv);
    m->kp = cp->kc / m->pk;
    m->nbp = cv_row_ld(cp->cols); /* C's rows, pixel-major and in the destination's layout */
    m->b_ld = cv_row_ld(cp->sH * cp->sW * nb);
    cp->mbp = ceil_div(cp->rows, m->mr) * m->mr;
    c->extent = cp->nbm * cp->nbn;
    c->grain = cg_grain_for(cp->rows * cp->cols * cp->K * valid_taps(cp) / (cp->KK * hw));
}

/* Source channels [k0, k0 + kc) of images [n0, n0 + nb) as B's rows (bf16 pairs of
 * channels, or f32 channels): bw[kk b_ld + s nb + n - n0] for source pixel s. */
static void stage_source(kc *c, const cv_plan *cp, MlirValue bw, MlirValue n0, MlirValue k0) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    loom_dtype sdt = c->g->nodes[cp->win].dtype;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]];
    int64_t shw = cp->sH * cp->sW, nb = images_of(cp);
    bool pairs = m->pk == 2;
    MlirType et = cg_storage_type(b, sdt);
    /* one image's row: its channel pair's 2 shw values (or its channel's shw), then as 16
     * lanes of pairs (zeros past shw) */
    MlirType rt = cg_vec_t(pairs ? 2 * shw : shw, et);
    MlirValue zrow = cg_vbroadcast(b, pairs ? cg_ci(b, et, 0) : cg_cf(b, et, 0.0), rt);
    int64_t lanes[2 * TP_HW_MAX];
    for (int64_t s = 0; s < TP_HW_MAX; s++) {
        if (pairs) {
            lanes[2 * s] = s < shw ? s : 2 * shw;
            lanes[2 * s + 1] = s < shw ? shw + s : 2 * shw;
        } else {
            lanes[s] = s < shw ? s : shw;
        }
    }
    cg_for lg, lk;
    cg_for_begin(b, &lg, cg_idx(b, 0), cg_idx(b, nb / 16), 0, NULL);
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, m->kp), 0, NULL);
    MlirValue ch = cg_iadd(b, k0, cg_imul_c(b, lk.iv, m->pk));
    MlirValue img = cg_iadd(b, n0, cg_imul_c(b, lg.iv, 16)), r[16];
    for (int64_t l = 0; l < 16; l++) {
        MlirValue n = cg_iadd(b, img, cg_idx(b, l));
        MlirValue at = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, n, cp->wC), ch), shw);
        MlirValue v = cg_vload(b, rt, src, at);
        if (pairs)
            r[l] = cg_vbitcast(b, cg_vshuffle(b, v, zrow, 32, lanes), cg_vec_t(16, b->i32));
        else
            r[l] = shw == 16 ? v : cg_vshuffle(b, v, zrow, 16, lanes);
    }
    cg_vtranspose16(b, r);
    MlirValue at = cg_iadd(b, cg_imul_c(b, lk.iv, m->b_ld), cg_imul_c(b, lg.iv, 16));
    for (int64_t s = 0; s < shw; s++)
        cg_vstore(b, r[s], bw, cg_iadd(b, at, cg_idx(b, s * nb)));
    cg_for_end(b, &lk, 0, NULL);
    cg_for_end(b, &lg, 0, NULL);
}

/* src_of for d and k values: the source coordinate, and in *in whether there is one. */
static MlirValue src_at(cg_b *b, const cv_plan *cp, int a, MlirValue d, MlirValue k,
                        MlirValue *in) {
    int64_t S = a == 0 ? cp->sH : cp->sW, st = cp->st[a];
    MlirValue z = cg_idx(b, 0), pd = cg_idx(b, cp->pd[a]), s;
    if (!cp->dst_big) {
        s = isub(b, cg_iadd(b, cg_imul_c(b, d, st), k), pd);
        *in = and_i1(b, cg_cmpi(b, CG_I_SGE, s, z), cg_cmpi(b, CG_I_SLT, s, cg_idx(b, S)));
        return s;
    }
    MlirValue num = isub(b, cg_iadd(b, d, pd), k);
    s = idiv(b, num, st); /* unsigned: what a negative num gives is not used */
    *in = and_i1(b, cg_cmpi(b, CG_I_SGE, num, z), cg_cmpi(b, CG_I_ULT, s, cg_idx(b, S)));
    if (st > 1)
        *in = and_i1(b, *in, cg_cmpi(b, CG_I_EQ, irem(b, num, st), z));
    return s;
}

/* The GEMMs of chunk lk: for each destination pixel p, C_p += A_t B_(source of p by t) over
 * the taps t that reach a source pixel. */
static void emit_gemms(kc *c, const cv_plan *cp, MlirValue uw, MlirValue bw, MlirValue cw,
                       MlirValue lk, MlirValue mb) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    int64_t nb = images_of(cp), ablk = cp->mbp * m->kp;
    MlirValue z = cg_idx(b, 0), iny, inx;
    cg_for lp, lh, lw;
    cg_for_begin(b, &lp, z, cg_idx(b, cp->dH * cp->dW), 0, NULL);
    MlirValue y = idiv(b, lp.iv, cp->dW), x = irem(b, lp.iv, cp->dW);
    cg_for_begin(b, &lh, z, cg_idx(b, cp->KH), 0, NULL);
    MlirValue sy = src_at(b, cp, 0, y, lh.iv, &iny);
    cg_for_begin(b, &lw, z, cg_idx(b, cp->KW), 0, NULL);
    MlirValue sx = src_at(b, cp, 1, x, lw.iv, &inx);
    cg_if f;
    cg_if_begin(b, &f, and_i1(b, iny, inx));
    MlirValue t = cg_iadd(b, cg_imul_c(b, lh.iv, cp->KW), lw.iv);
    MlirValue a0 = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk, cp->KK), t), ablk);
    MlirValue s = cg_iadd(b, cg_imul_c(b, sy, cp->sW), sx);
    cg_mk_tiles_at(c, m, uw, a0, bw, cg_imul_c(b, s, nb), cw, cg_imul_c(b, lp.iv, nb), mb,
                   cg_idx(b, nb), true, (MlirValue){NULL}, NULL);
    cg_if_end(b, &f);
    cg_for_end(b, &lw, 0, NULL);
    cg_for_end(b, &lh, 0, NULL);
    cg_for_end(b, &lp, 0, NULL);
}

/* C's rows [0, mb) from pixel-major cw [p nb + image] into the destination's layout cs
 * [image dH dW + p], 16 images at a time by a 16 x 16 transpose. */
static void to_destination(kc *c, const cv_plan *cp, MlirValue cw, MlirValue cs, MlirValue mb) {
    cg_b *b = c->b;
    int64_t hw = cp->dH * cp->dW, nb = images_of(cp);
    MlirType vf = cg_vec_t(16, b->f32);
    MlirValue zero = cg_vbroadcast(b, cg_cf(b, b->f32, 0.0), vf);
    cg_for li, lg;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    cg_for_begin(b, &lg, cg_idx(b, 0), cg_idx(b, nb / 16), 0, NULL);
    MlirValue row = cg_imul_c(b, li.iv, cp->mk.nbp), r[16];
    MlirValue from = cg_iadd(b, row, cg_imul_c(b, lg.iv, 16));
    for (int64_t p = 0; p < 16; p++)
        r[p] = p < hw ? cg_vload(b, vf, cw, cg_iadd(b, from, cg_idx(b, p * nb))) : zero;
    cg_vtranspose16(b, r);
    MlirValue to = cg_iadd(b, row, cg_imul_c(b, lg.iv, 16 * hw));
    for (int64_t l = 0; l < 16; l++)
        cv_store_lanes(b, r[l], cs, cg_iadd(b, to, cg_idx(b, l * hw)), hw);
    cg_for_end(b, &lg, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

/* 16 vectors of (at most 16) pixels, rows [row0 + l rs] of mem (l < 16), as vectors of 16
 * lanes (zeros past the pixels), then turned: r[p] = the 16 rows' pixel p. */
static void load_turned(cg_b *b, MlirValue mem, MlirType et, int64_t hw, MlirValue row0, int64_t rs,
                        MlirValue *r) {
    MlirType rt = cg_vec_t(hw, et);
    MlirValue zrow =
        cg_vbroadcast(b, mlirTypeIsAFloat(et) ? cg_cf(b, et, 0.0) : cg_ci(b, et, 0), rt);
    int64_t lanes[16];
    for (int64_t p = 0; p < 16; p++)
        lanes[p] = p < hw ? p : hw;
    for (int64_t l = 0; l < 16; l++) {
        MlirValue v = cg_vload(b, rt, mem, cg_iadd(b, row0, cg_idx(b, l * rs)));
        r[l] = hw == 16 ? v : cg_vshuffle(b, v, zrow, 16, lanes);
    }
    cg_vtranspose16(b, r);
}

/* The weight gradient's A for x's channels [c0, c1) and images [n0, n0 + kc): per source
 * pixel s, aw[(s mbp + c - c0) kp + k] holding images' pairs (bf16) or images (f32) along K
 * (the rows past c1 up to mbp, zeros, emit_gw's). */
static void stage_gw_x(kc *c, const cv_plan *cp, MlirValue aw, MlirValue n0, MlirValue c0,
                       MlirValue c1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->win]], z = cg_idx(b, 0);
    MlirType et = cg_storage_type(b, c->g->nodes[cp->win].dtype);
    int64_t shw = cp->sH * cp->sW, per = 16 / m->pk; /* packed elements of 16 images */
    cg_for lc, lg;
    cg_for_begin(b, &lc, c0, c1, 0, NULL);
    cg_for_begin(b, &lg, z, cg_idx(b, cp->kc / 16), 0, NULL);
    MlirValue n = cg_iadd(b, n0, cg_imul_c(b, lg.iv, 16)), r[16];
    load_turned(b, src, et, shw, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, n, cp->wC), lc.iv), shw),
                cp->wC * shw, r);
    MlirValue at = cg_iadd(b, cg_imul_c(b, isub(b, lc.iv, c0), m->kp), cg_imul_c(b, lg.iv, per));
    for (int64_t p = 0; p < shw; p++) {
        MlirValue v = m->pk == 2 ? cg_vbitcast(b, r[p], cg_vec_t(8, b->i32)) : r[p];
        cg_vstore(b, v, aw, cg_iadd(b, at, cg_idx(b, p * cp->mbp * m->kp)));
    }
    cg_for_end(b, &lg, 0, NULL);
    cg_for_end(b, &lc, 0, NULL);
}

/* The weight gradient's B for dy's channels [o0, o1) (16s) and images [n0, n0 + kc): per
 * destination pixel p, bw[(p kp + k) b_ld + o - o0], K images' pairs (bf16: the pair's
 * first image in the low half) or images (f32). */
static void stage_gw_dy(kc *c, const cv_plan *cp, MlirValue bw, MlirValue n0, MlirValue o0,
                        MlirValue o1) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    MlirValue src = c->bufs[c->s->buf_of[cp->plain]], z = cg_idx(b, 0);
    MlirType et = cg_storage_type(b, c->g->nodes[cp->plain].dtype);
    int64_t dhw = cp->dH * cp->dW;
    int64_t pair[32];
    for (int64_t l = 0; l < 16; l++)
        pair[2 * l] = l, pair[2 * l + 1] = 16 + l;
    cg_for lo, lk;
    cg_for_begin(b, &lo, z, idiv(b, isub(b, o1, o0), 16), 0, NULL);
    MlirValue o = cg_iadd(b, o0, cg_imul_c(b, lo.iv, 16));
    cg_for_begin(b, &lk, z, cg_idx(b, m->kp), 0, NULL);
    MlirValue n = cg_iadd(b, n0, cg_imul_c(b, lk.iv, m->pk)), r[2][16];
    for (int64_t e = 0; e < m->pk; e++) {
        MlirValue img = cg_iadd(b, n, cg_idx(b, e));
        load_turned(b, src, et, dhw, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, img, cp->O), o), dhw),
                    dhw, r[e]);
    }
    MlirValue at = cg_iadd(b, cg_imul_c(b, lk.iv, m->b_ld), cg_imul_c(b, lo.iv, 16));
    for (int64_t p = 0; p < dhw; p++) {
        MlirValue v = m->pk == 2 ? cg_vbitcast(b, cg_vshuffle(b, r[0][p], r[1][p], 32, pair),
                                               cg_vec_t(16, b->i32))
                                 : r[0][p];
        cg_vstore(b, v, bw, cg_iadd(b, at, cg_idx(b, p * m->kp * m->b_ld)));
    }
    cg_for_end(b, &lk, 0, NULL);
    cg_for_end(b, &lo, 0, NULL);
}

/* The weight gradient: per task (x's channels [c0, c1) by dy's [o0, o1)) and K chunk of
 * images, for each destination pixel p and tap t that reaches source pixel s, dw_t^T [c, o]
 * += x_s [c, images] dy_p [images, o], into C row (c - c0) 9 + t (the direct weight
 * gradient's layout, which its epilogue reads): the GEMM's C rows 9 nbp apart. */
static loom_status emit_gw(kc *c, const cv_plan *cp) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    bool pairs = m->pk == 2;
    MlirType et = pairs ? b->i32 : b->f32;
    MlirValue z = cg_idx(b, 0), iny, inx;
    int64_t shw = cp->sH * cp->sW, dhw = cp->dH * cp->dW, ablk = cp->mbp * m->kp;
    int64_t rc = cp->rows / 9;
    cg_mk gm = *m;
    gm.nbp = 9 * m->nbp;
    MlirValue aw = cg_alloc_buf(b, et, shw * ablk);
    MlirValue bw = cg_alloc_buf(b, et, dhw * m->kp * m->b_ld);
    MlirValue cs = cg_alloc_buf(b, b->f32, 9 * cp->mbp * m->nbp);
    loom_status st = LOOM_OK;
    cg_for lo, lk, lp, lh, lw;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue ib = idiv(b, lo.iv, cp->nbn), jb = irem(b, lo.iv, cp->nbn);
    MlirValue c0 = cg_imul_c(b, ib, rc), o0 = cg_imul_c(b, jb, cp->cols);
    MlirValue c1 = cg_imin(b, cg_iadd(b, c0, cg_idx(b, rc)), cg_idx(b, cp->Cg));
    MlirValue o1 = cg_imin(b, cg_iadd(b, o0, cg_idx(b, cp->cols)), cg_idx(b, cp->Og));
    cv_zero_rows(b, cs, z, 9 * cp->mbp, m->nbp, cg_cf(b, b->f32, 0.0));
    /* B's columns past the block's, which the last tile reads, stay zeros */
    MlirValue zs = pairs ? cg_ci(b, b->i32, 0) : cg_cf(b, b->f32, 0.0);
    cv_zero_rows(b, bw, z, dhw * m->kp, m->b_ld, zs);
    /* and A's rows past the block's, which its last row tile reads */
    cg_for lz;
    cg_for_begin(b, &lz, z, cg_idx(b, shw), 0, NULL);
    cv_zero_rows_at(b, aw, cg_imul_c(b, lz.iv, ablk), isub(b, c1, c0), cp->mbp, m->kp, zs);
    cg_for_end(b, &lz, 0, NULL);
    cg_for_begin(b, &lk, z, cg_idx(b, cp->nbk), 0, NULL);
    MlirValue n0 = cg_imul_c(b, lk.iv, cp->kc);
    stage_gw_x(c, cp, aw, n0, c0, c1);
    stage_gw_dy(c, cp, bw, n0, o0, o1);
    cg_for_begin(b, &lp, z, cg_idx(b, dhw), 0, NULL);
    MlirValue y = idiv(b, lp.iv, cp->dW), x = irem(b, lp.iv, cp->dW);
    cg_for_begin(b, &lh, z, cg_idx(b, 3), 0, NULL);
    MlirValue sy = src_at(b, cp, 0, y, lh.iv, &iny);
    cg_for_begin(b, &lw, z, cg_idx(b, 3), 0, NULL);
    MlirValue sx = src_at(b, cp, 1, x, lw.iv, &inx);
    cg_if f;
    cg_if_begin(b, &f, and_i1(b, iny, inx));
    MlirValue t = cg_iadd(b, cg_imul_c(b, lh.iv, 3), lw.iv);
    MlirValue s = cg_iadd(b, cg_imul_c(b, sy, cp->sW), sx);
    cg_mk_tiles_at(c, &gm, aw, cg_imul_c(b, s, ablk), bw, cg_imul_c(b, lp.iv, m->kp * m->b_ld), cs,
                   cg_imul_c(b, t, m->nbp), isub(b, c1, c0), isub(b, o1, o0), true,
                   (MlirValue){NULL}, NULL);
    cg_if_end(b, &f);
    cg_for_end(b, &lw, 0, NULL);
    cg_for_end(b, &lh, 0, NULL);
    cg_for_end(b, &lp, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, (MlirValue){NULL}, z, cg_imul_c(b, c0, 9),
                              cg_imul_c(b, c1, 9), o0, o1);
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[3] = {aw, bw, cs};
    for (int q = 0; q < 3; q++)
        cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
    return st;
}

loom_status cv_taps_emit(kc *c, const cv_plan *cp) {
    if (cp->role == CV_GRAD_WEIGHT)
        return emit_gw(c, cp);
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    bool pairs = m->pk == 2;
    MlirType et = pairs ? b->i32 : b->f32;
    MlirValue z = cg_idx(b, 0);
    int64_t nb = images_of(cp), ablk = cp->mbp * m->kp;
    MlirValue uw = cg_alloc_buf(b, et, cp->KK * ablk * cp->nbk);
    MlirValue ut = pairs ? cg_alloc_buf(b, b->f32, cp->KK * cp->mbp * cp->kc) : uw;
    MlirValue akey = cg_alloc_buf(b, b->i64, 1); /* the row block whose taps uw holds */
    MlirValue bw = cg_alloc_buf(b, et, m->kp * m->b_ld);
    MlirValue cw = cg_alloc_buf(b, b->f32, cp->mbp * m->nbp);
    MlirValue cs = cg_alloc_buf(b, b->f32, cp->mbp * m->nbp);
    cg_store(b, cg_ci(b, b->i64, -1), akey, z);
    loom_status st = LOOM_OK;
    cg_for lo, lk;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue ib = idiv(b, lo.iv, cp->nbn), jb = irem(b, lo.iv, cp->nbn);
    MlirValue i0 = cg_imul_c(b, ib, cp->rows);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, cp->rows)), cg_idx(b, cp->M));
    MlirValue mb = isub(b, i1, i0), n0 = cg_imul_c(b, jb, nb);
    MlirValue key = cg_conv(b, "arith.index_cast", ib, b->i64);
    cg_if f;
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, akey, z), key));
    cv_pack_taps(c, cp, m, cp->kc, cp->nbk, 0, uw, ut, i0, i1);
    cg_store(b, key, akey, z);
    cg_if_end(b, &f);
    cv_zero_rows(b, cw, z, cp->mbp, m->nbp, cg_cf(b, b->f32, 0.0));
    cg_for_begin(b, &lk, z, cg_idx(b, cp->nbk), 0, NULL);
    stage_source(c, cp, bw, n0, cg_imul_c(b, lk.iv, cp->kc));
    emit_gemms(c, cp, uw, bw, cw, lk.iv, mb);
    cg_for_end(b, &lk, 0, NULL);
    to_destination(c, cp, cw, cs, mb);
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, (MlirValue){NULL}, z, i0, i1, cg_imul_c(b, n0, cp->dH),
                              cg_imul_c(b, cg_iadd(b, n0, cg_idx(b, nb)), cp->dH));
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[6] = {uw, akey, bw, cw, cs, ut};
    for (int q = 0; q < (pairs ? 6 : 5); q++)
        cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
    return st;
}
