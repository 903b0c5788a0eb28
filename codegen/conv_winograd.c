/* Winograd F(2x2, 3x3) and F(4x4, 3x3) for the stride-1 3x3 convolutions: forwards, input
 * gradients and weight gradients (Lavin and Gray, "Fast Algorithms for Convolutional Neural
 * Networks", 2016); LOOM_CONV=direct keeps them on lower_conv.c's direct kernels.
 *
 * Each m x m tile of y (m = 2 or 4) comes from the a x a tile d of x (a = m + 2) that covers
 * its windows:
 *     Y = A^T [ sum_c (G w_c G^T) . (B^T d_c B) ] A
 * with the a x a transforms U = G w G^T of each (o, c)'s 3 x 3 weights and V = B^T d B of each
 * (c, tile)'s input, multiplied element by element and summed over the channels: a^2 GEMMs
 * M_x [O, tiles] = U_x [O, C] x V_x [C, tiles], one per element x of the a x a, on the packed
 * microkernel (cg_mk_tiles). F(2x2, 3x3) takes 16 multiplies per tile of 4 pixels against 36
 * in the direct form (2.25x fewer), F(4x4, 3x3) 36 per 16 pixels against 144 (4x fewer), with
 * transforms whose constants (up to 5, and 1/24) lose more bits: it runs where the GEMMs
 * multiply f32 (wino_tile). The transforms are additions and multiplies by constants, done in
 * vectors of 16 tiles or 16 channels:
 *  - U for a thread's row block of output channels, all channels, once per row block (the
 *    weights, gathered 16 channels at a time), kept across its tasks as lower_conv.c keeps
 *    packed weights;
 *  - V per block of tiles and chunk of channels, the input read as the a x a window of
 *    stride m whose destination grid is the tiles (cv_stage_winograd: a window row's span
 *    for 16 tiles in m + 1 masked loads, its a taps by shuffles), straight into the a^2
 *    GEMMs' B;
 *  - Y from the a^2 GEMMs' C into one block of C in the destination's layout (whole pixel
 *    rows, m per tile row), which the convolution's own epilogue (bias, activation, cast,
 *    fused consumers) then runs over as it runs over a direct convolution's.
 * With bf16 operands (vdpbf16ps) U and V are rounded to bf16: their sums of 2-4 values keep
 * 8 bits, where the direct form multiplies the values themselves.
 *
 * A task is (row block, block of whole tile rows). Where m does not divide the destination,
 * its last tile row and column overhang it by up to m - 1 pixels: their input reads as
 * padding (zeros), their outputs there are not stored, and the weight gradient reads dy
 * there as zeros. At 7x7 (ResNet-50's layer4, F(2x2, 3x3)) that is 64 multiplies a pixel for
 * 49: the saving falls to 1.7x; at 14x14 by F(4x4, 3x3), 2.9 a pixel against 9.
 *
 * The weight gradient differentiates the same product with respect to U: per tile, dM =
 * A dY A^T (dY the tile's m x m of dy) and dU = dM . V, summed over the tiles of every image,
 * and dw = G^T dU G. The sums are a^2 GEMMs dU_x^T [C, O] = V_x [C, tiles] x dM_x^T [tiles,
 * O], 2.25x (4x) fewer multiplies than the direct [C 9, pixels] x [pixels, O]. A task is (block of
 * x's channels, block of dy's), over all the tiles in K chunks of whole tile rows: V staged
 * as A by the forward's input transform (f32; rounded to bf16 and paired along the tiles for
 * vdpbf16ps), dy^T staged as the direct weight gradient stages it and transformed into B
 * 16 channels at a time (so that no transform's output needs transposing: dy has fewer
 * values than V). dw^T leaves in the direct weight gradient's C layout, so its epilogue
 * (the store, or fused consumers) runs unchanged. */
#include <string.h>

#include "conv_internal.h"

enum {
    /* rows of a row block (y's channels, or dx's), at most: WN_ROWS_MAX where its tiles fill
     * the microkernel's column tiles as well as WN_ROWS's (each task transforms its tiles'
     * input, V, for its row block alone, so fewer row blocks transform it fewer times), else
     * WN_ROWS. A Zen 4, bf16, batch 8 at 224x224, forward / input gradient: one thread,
     * layer3's 3x3 at 14x14 6.3-7.4 / 6.5-7.1 -> 5.8-6.7 / 5.8-6.7 ms, layer4's at 7x7
     * 8.8-10.6 / 9.0-10.8 -> 8.0-9.8 / 8.3-10.2; two threads, where each thread took one of
     * layer3's two row blocks before, layer4's 5.1-5.2 / 5.3-5.5 -> 4.8-4.9 / 4.4-4.8 and
     * layer3's within noise; f32's at 7x7 7.5 / 8.3 -> 6.9 / 7.3; but f32's at 14x14 by
     * F(4x4, 3x3), whose C blocks of 256 rows would hold a tile row of 4 tiles alone,
     * 5.2 -> 15.3 ms: WN_ROWS there */
    WN_ROWS = 128,
    WN_ROWS_MAX = 256,
    WN_KP = 64,             /* packed elements along K (channels / pk) of a chunk, at most */
    WN_C_BYTES = 512 << 10, /* the a^2 GEMMs' C blocks of a task, at most (else fewer tiles) */
    WN_TASKS_MIN = 4,       /* tasks at least, where there are the tile rows */
    /* tiles along a row at least (all three): the input transforms run on vectors of 16 of a
     * row's tiles, and fewer filled them too thinly to pay (ResNet-50 at 64x64, bf16, over 11
     * steps: layer4's 2x2 (1 tile a row) weight gradients 82 -> 118 ms as Winograd, layer3's
     * 4x4 (2) 125 -> 142 ms; layer2's 8x8 (4) 74 -> 67 ms) */
    WN_TW_MIN = 4,
    /* where the GEMMs multiply f32, whose products cost twice bf16 pairs' and so leave the
     * transforms a smaller share: 2 (a Zen 4, one thread, batch 32, a 3x3 of 256 channels at
     * 4x4: forward and input gradient 6.5-6.8 -> 4.9-5.5 ms each, the weight gradient 6.3-6.7
     * -> 5.9-6.3; under bf16 pairs the forward went 4.1 -> 4.3) */
    WN_TW_MIN_F32 = 2,
    /* the weight gradient's */
    WG_MIN = 16,   /* x's and dy's channels at least (fewer: the transforms dominate) */
    WG_ROWS = 128, /* x's channels of a row block, at most */
    WG_COLS = 128, /* dy's channels of a column block, at most */
    /* both, where blocks of this many channels still make WG_BIG_TASKS tasks: each task
     * transforms x for its rows and dy for its columns, so bigger blocks transform each fewer
     * times. Layer4's 3x3 (512 channels at 7x7) in 4 blocks of 256 against 16 of 128, a Zen 5,
     * bench_conv --pass grad_weight --best, two rounds: bf16 batch 8 6.5-6.6 -> 4.6-4.7 ms on
     * one thread, 3.3-3.4 -> 2.4-2.6 on two; batch 32 24.8-24.9 -> 17.2-17.3, 12.5-12.7 ->
     * 8.7-8.9; f32 batch 8 8.7-8.9 -> 7.0-7.1, 4.5 -> 3.4-3.5. Layer3's 256 channels in one
     * such block a side ran 1.2 -> 2.2-3.6 ms (bf16, two threads): not there. */
    WG_BIG = 256,
    WG_BIG_TASKS = 4,
    WG_TILES = 128,   /* tiles of a K chunk, about (whole tile rows) */
    WG_TASKS_MIN = 2, /* tasks at least, the rows split first (which repeats dy's transform only) */
    /* F(4x4, 3x3): tiles of 4 a row at least, in every pass. Its rounding is 6.5x F(2x2)'s
     * (1.7e-6 relative against 2.6e-7): a training step at 64x64, whose layer1 maps are 16
     * wide, then let a ReLU input near zero fall the other way from PyTorch-f32's (issue 48:
     * ResNet-18's update off float64 by 64x PyTorch-f32's on one step, medians 2.7x; F(2x2):
     * 1.0x and 1.3x). Cost where it no longer runs (Intel family 6 model 207, two threads,
     * f32): layer1's 3x3 at 16x16, batch 32, 1.4 -> 3.2 ms a pass (forward, input gradient);
     * layer3's at 14x14, batch 8, forward 11.1 -> 8.0 ms, input gradient 5.8-9.9 -> 8.8-9.3.
     * The weight gradient took it from 7 tiles before (a Zen 4, one thread: at 14x14, 4
     * tiles, 8.7 -> 9.6 ms against F(2x2); at 28x28, 7 tiles, 9.1 -> 5.7). */
    F4_TW_MIN = 7,
    /* F(4x4, 3x3)'s weight gradient: K chunks of half WG_TILES (its 36 GEMMs' operands:
     * 56x56, 7.5 -> 6.3 ms) */
};

static MlirValue fadd(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.addf", x, y);
}

static MlirValue fsub(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.subf", x, y);
}

static MlirValue fscale(cg_b *b, MlirValue x, double k) {
    MlirType t = mlirValueGetType(x);
    MlirValue h = cg_cf(b, b->f32, k);
    return cg_bin(b, "arith.mulf", x, mlirTypeIsAVector(t) ? cg_vbroadcast(b, h, t) : h);
}

static MlirValue fhalf(cg_b *b, MlirValue x) {
    return fscale(b, x, 0.5);
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
    MlirValue t[WN_NX]; /* m x n */
    for (int64_t j = 0; j < n; j++)
        f(b, x + j, n, t + j, n);
    for (int64_t i = 0; i < m; i++)
        f(b, t + n * i, 1, o + m * i, 1);
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

/* F(4x4, 3x3)'s, of the points 0, 1, -1, 2, -2 and infinity (Lavin and Gray's matrices). */

/* o[0..5 * os] = B^T (x[0], ..., x[5 xs]) */
static void bt6(cg_b *b, const MlirValue *x, int64_t xs, MlirValue *o, int64_t os) {
    MlirValue x1 = x[xs], x2 = x[2 * xs], x3 = x[3 * xs], x4 = x[4 * xs];
    MlirValue s = fadd(b, x1, x2), d = fsub(b, x1, x2), e = fsub(b, x4, x2);
    MlirValue f = fscale(b, fsub(b, x3, x1), 2.0);
    o[0] = fadd(b, fsub(b, fscale(b, x[0], 4.0), fscale(b, x2, 5.0)), x4);
    o[os] = fsub(b, fadd(b, x3, x4), fscale(b, s, 4.0));
    o[2 * os] = fadd(b, fsub(b, x4, x3), fscale(b, d, 4.0));
    o[3 * os] = fadd(b, e, f);
    o[4 * os] = fsub(b, e, f);
    o[5 * os] = fadd(b, fsub(b, fscale(b, x1, 4.0), fscale(b, x3, 5.0)), x[5 * xs]);
}

/* o[0..5 * os] = G (g[0], g[gs], g[2 gs]) */
static void g6(cg_b *b, const MlirValue *g, int64_t gs, MlirValue *o, int64_t os) {
    MlirValue s = fadd(b, g[0], g[2 * gs]);
    MlirValue p = fadd(b, fscale(b, g[0], 1.0 / 24.0), fscale(b, g[2 * gs], 1.0 / 6.0));
    MlirValue q = fscale(b, g[gs], 1.0 / 12.0);
    o[0] = fscale(b, g[0], 0.25);
    o[os] = fscale(b, fadd(b, s, g[gs]), -1.0 / 6.0);
    o[2 * os] = fscale(b, fsub(b, s, g[gs]), -1.0 / 6.0);
    o[3 * os] = fadd(b, p, q);
    o[4 * os] = fsub(b, p, q);
    o[5 * os] = g[2 * gs];
}

/* o[0..3 * os] = A^T (m[0], ..., m[5 ms]) */
static void at6(cg_b *b, const MlirValue *m, int64_t ms, MlirValue *o, int64_t os) {
    MlirValue s12 = fadd(b, m[ms], m[2 * ms]), d12 = fsub(b, m[ms], m[2 * ms]);
    MlirValue s34 = fadd(b, m[3 * ms], m[4 * ms]), d34 = fsub(b, m[3 * ms], m[4 * ms]);
    o[0] = fadd(b, fadd(b, m[0], s12), s34);
    o[os] = fadd(b, d12, fscale(b, d34, 2.0));
    o[2 * os] = fadd(b, s12, fscale(b, s34, 4.0));
    o[3 * os] = fadd(b, fadd(b, d12, fscale(b, d34, 8.0)), m[5 * ms]);
}

/* o[0..5 * os] = A (d[0], ..., d[3 ds]): the weight gradient's dM = A dY A^T */
static void a4(cg_b *b, const MlirValue *d, int64_t ds, MlirValue *o, int64_t os) {
    MlirValue e = fadd(b, d[0], d[2 * ds]), f = fadd(b, d[ds], d[3 * ds]);
    MlirValue e2 = fadd(b, d[0], fscale(b, d[2 * ds], 4.0));
    MlirValue f2 = fadd(b, fscale(b, d[ds], 2.0), fscale(b, d[3 * ds], 8.0));
    o[0] = d[0];
    o[os] = fadd(b, e, f);
    o[2 * os] = fsub(b, e, f);
    o[3 * os] = fadd(b, e2, f2);
    o[4 * os] = fsub(b, e2, f2);
    o[5 * os] = d[3 * ds];
}

/* o[0..2 * os] = G^T (u[0], ..., u[5 us]): dw = G^T dU G */
static void gt6(cg_b *b, const MlirValue *u, int64_t us, MlirValue *o, int64_t os) {
    MlirValue s12 = fadd(b, u[us], u[2 * us]), d12 = fsub(b, u[2 * us], u[us]);
    MlirValue s34 = fadd(b, u[3 * us], u[4 * us]), d34 = fsub(b, u[3 * us], u[4 * us]);
    o[0] = fadd(b, fsub(b, fscale(b, u[0], 0.25), fscale(b, s12, 1.0 / 6.0)),
                fscale(b, s34, 1.0 / 24.0));
    o[os] = fadd(b, fscale(b, d12, 1.0 / 6.0), fscale(b, d34, 1.0 / 12.0));
    o[2 * os] = fadd(b, fscale(b, fsub(b, s34, s12), 1.0 / 6.0), u[5 * us]);
}

/* A tile size's transforms: input (a -> a, a = m + 2), weights (3 -> a), output (a -> m), and
 * the weight gradient's dy (m -> a) and dw (a -> 3). */
typedef struct wn_fns {
    wn_1d bt, g, at, ad, gt;
} wn_fns;

static const wn_fns *fns_of(int64_t m) {
    static const wn_fns f2 = {bt4, g3, at4, a2s, gt3}, f4 = {bt6, g6, at6, a4, gt6};
    return m == 4 ? &f4 : &f2;
}

/* V = B^T d B of F(m x m, 3x3)'s (m + 2) x (m + 2) tile d (row-major; vectors or scalars). */
static void cv_wino_input(cg_b *b, int64_t m, const MlirValue *d, MlirValue *v) {
    both_axes(b, fns_of(m)->bt, m + 2, m + 2, d, v);
}

/* One row of a Winograd window (stride tm, tm + 2 taps) for 16 tiles: tap[kw] lane t the
 * source column tm t + kw of the span from column c0 (an index, negative over the padding),
 * at the source index `at` of column 0; zeros outside the source's sW columns and where ok
 * (i1) is false. The span's 16 tm + 2 columns come in tm + 1 masked loads and the taps out
 * of them by shuffles (F(2x2, 3x3)'s four taps, each read with a source step of 2 as 32
 * lanes, took 8 masked loads a row; F(4x4, 3x3)'s so spilled most of its 144 vectors). */
static void wino_row_taps(cg_b *b, const cv_plan *wp, MlirValue src, loom_dtype sdt, MlirValue at,
                          MlirValue ok, MlirValue c0, MlirValue *tap) {
    int64_t tm = wp->st[1];
    MlirType vi = cg_vec_t(16, b->i32), vs = cg_vec_t(16, cg_storage_type(b, sdt));
    int32_t ln[16];
    for (int l = 0; l < 16; l++)
        ln[l] = l;
    MlirValue col = cg_bin(b, "arith.addi", cg_vconst_i32(b, 16, ln),
                           cg_vbroadcast(b, cg_conv(b, "arith.index_cast", c0, b->i32), vi));
    MlirValue zero = cg_vbroadcast(b, cg_ci(b, b->i32, 0), vi);
    MlirValue width = cg_vbroadcast(b, cg_ci(b, b->i32, wp->sW), vi), v[5];
    MlirValue from = cg_iadd(b, at, c0);
    for (int64_t q = 0; q <= tm; q++) {
        MlirValue cq =
            q == 0 ? col
                   : cg_bin(b, "arith.addi", col, cg_vbroadcast(b, cg_ci(b, b->i32, 16 * q), vi));
        MlirValue mask =
            and_i1(b, cg_vcmpi(b, CG_I_SGE, cq, zero), cg_vcmpi(b, CG_I_SLT, cq, width));
        MlirValue fq = cg_iadd(b, from, cg_idx(b, 16 * q));
        /* the next channel's same columns, which the next window row of this tap row reads */
        cg_prefetch(b, src, cg_iadd(b, fq, cg_idx(b, wp->sH * wp->sW)), false, true);
        v[q] = cg_widen16(b, sdt, cv_maskload_if(b, vs, src, fq, mask, ok));
    }
    int64_t idx[16];
    for (int64_t kw = 0; kw < tm; kw++) {
        if (tm == 2) {
            for (int t = 0; t < 16; t++)
                idx[t] = 2 * t + kw;
            tap[kw] = cg_vshuffle(b, v[0], v[1], 16, idx);
            continue;
        }
        int64_t hi[16]; /* tiles 0-7 from v[0], v[1]; 8-15 from v[2], v[3] */
        for (int t = 0; t < 16; t++) {
            idx[t] = t < 8 ? 4 * t + kw : 0;
            hi[t] = t < 8 ? 0 : 4 * (t - 8) + kw;
        }
        MlirValue lo = cg_vshuffle(b, v[0], v[1], 16, idx), up = cg_vshuffle(b, v[2], v[3], 16, hi);
        for (int t = 0; t < 16; t++)
            idx[t] = t < 8 ? t : 16 + t;
        tap[kw] = cg_vshuffle(b, lo, up, 16, idx);
    }
    for (int64_t j = 0; j < 2; j++) { /* taps tm, tm + 1: taps 0, 1 a tile on */
        for (int t = 0; t < 16; t++)
            idx[t] = t < 15 ? t + 1 : 16 + j;
        tap[tm + j] = cg_vshuffle(b, tap[j], v[tm], 16, idx);
    }
}

/* Winograd F(m x m, 3x3)'s input transform for channels [k0, k1) and tile rows [r0, r1), wp
 * being the a x a window (a = m + 2) of stride m over x whose destination grid is the tiles
 * (cv_wino.win; rtab from cv_build_rows on it): each tile's V = B^T d B, its a^2 values the
 * B operands of the a^2 GEMMs, GEMM x's at bw[x kp b_ld]: row (k - k0) / pk, column (r - r0)
 * dW + tile (f32, or bf16 pairs of channels rounded to nearest); zeros past the block's
 * tiles up to nbp and past the chunk's channels up to kp. */
static void cv_stage_winograd(kc *c, const cv_plan *wp, const cg_mk *m, MlirValue bw,
                              MlirValue rtab, MlirValue k0, MlirValue k1, MlirValue r0,
                              MlirValue r1) {
    cg_b *b = c->b;
    MlirValue src = c->bufs[c->s->buf_of[wp->win]], z = cg_idx(b, 0);
    loom_dtype sdt = c->g->nodes[wp->win].dtype;
    int64_t pk = m->pk, xs = m->kp * m->b_ld; /* elements from one GEMM's B to the next's */
    MlirValue zero = pk == 2 ? cg_ci(b, b->i32, 0) : cg_cf(b, b->f32, 0.0);
    MlirValue nk = idiv(b, cg_iadd(b, isub(b, k1, k0), cg_idx(b, pk - 1)), pk);
    cg_for lk, lr;
    cg_for_begin(b, &lk, z, nk, 0, NULL);
    int64_t nx = wp->KK, a = wp->KW, tm = wp->st[1]; /* the GEMMs (the window's taps) */
    /* the pair's channels (a second past k1: an empty window, zeros) */
    MlirValue coff[2], has[2];
    for (int64_t e = 0; e < pk; e++) {
        MlirValue ch = cg_iadd(b, k0, cg_iadd(b, cg_imul_c(b, lk.iv, pk), cg_idx(b, e)));
        has[e] = e > 0 ? cg_cmpi(b, CG_I_ULT, ch, k1) : cg_ci(b, b->i1, 1);
        coff[e] = cg_imul_c(b, cg_select(b, has[e], ch, k0), wp->sH * wp->sW);
    }
    MlirValue prow = cg_imul_c(b, lk.iv, m->b_ld);
    cg_for_begin(b, &lr, r0, r1, 0, NULL);
    /* each tap row's source row (cv_build_rows; -1: padding) */
    MlirValue rat[2][6], rok[2][6];
    for (int64_t kh = 0; kh < a; kh++) {
        MlirValue roff =
            cg_load(b, rtab, cg_iadd(b, cg_idx(b, kh * wp->pix_rows), isub(b, lr.iv, r0)));
        MlirValue ok = cg_cmpi(b, CG_I_SGE, roff, cg_ci(b, b->i64, 0));
        MlirValue ro = cg_conv(b, "arith.index_cast", roff, b->index);
        for (int64_t e = 0; e < pk; e++)
            rat[e][kh] = cg_iadd(b, ro, coff[e]), rok[e][kh] = and_i1(b, ok, has[e]);
    }
    MlirValue dst = cg_iadd(b, prow, cg_imul_c(b, isub(b, lr.iv, r0), wp->dW));
    cv_lane_blocks lb;
    for (MlirValue q0 = cv_lanes_begin(b, &lb, wp->dW, 16); lb.at < lb.end;
         q0 = cv_lanes_next(b, &lb)) {
        MlirValue v[2][WN_NX];
        MlirValue c0 = isub(b, cg_imul_c(b, q0, tm), cg_idx(b, wp->pd[1]));
        for (int64_t e = 0; e < pk; e++) {
            MlirValue d[WN_NX];
            for (int64_t kh = 0; kh < a; kh++)
                wino_row_taps(b, wp, src, sdt, rat[e][kh], rok[e][kh], c0, d + kh * a);
            cv_wino_input(b, tm, d, v[e]);
        }
        for (int64_t x = 0; x < nx; x++) {
            MlirValue val = pk == 2 ? cg_cvt_bf16x32(b, v[0][x], v[1][x], true) : v[0][x];
            cv_store_lanes(b, val, bw, cg_iadd(b, cg_idx(b, x * xs), cg_iadd(b, dst, q0)),
                           lb.lanes);
        }
    }
    cg_for_end(b, &lr, 0, NULL);
    /* the rows' columns past the block's tiles */
    MlirValue used = cg_imul_c(b, isub(b, r1, r0), wp->dW);
    for (int64_t x = 0; x < nx; x++)
        cv_zero_span(b, zero, bw, cg_iadd(b, prow, cg_idx(b, x * xs)), used, cg_idx(b, m->nbp));
    cg_for_end(b, &lk, 0, NULL);
    for (int64_t x = 0; x < nx; x++) /* and the rows past the chunk's channels */
        cv_zero_rows_at(b, bw, cg_idx(b, x * xs), nk, m->kp, m->b_ld, zero);
}

/* The tile: 4 where the GEMMs multiply f32 (F(4x4, 3x3)'s transforms scale by up to 5 and
 * 1/24, which bf16's 8 bits carry less well, and under bf16 pairs it gained less (51155e8);
 * LOOM_CONV=winograd4 takes it there too, to compare) and the destination is F4_TW_MIN
 * tiles of 4 wide (25 pixels); else 2 (LOOM_CONV=winograd2: everywhere). */
static int64_t wino_tile(const cv_plan *cp) {
    cg_conv_mode mode = loom_cg_conv_mode();
    if (mode == CG_CONV_WINO2 || ceil_div(cp->dW, 4) < F4_TW_MIN)
        return 2;
    return cp->mk.pk == 1 || mode == CG_CONV_WINO4 ? 4 : 2;
}

bool cv_wino_ok(const kc *c, const cv_plan *cp) {
    int64_t tw_min = cp->mk.pk == 1 ? WN_TW_MIN_F32 : WN_TW_MIN;
    if (loom_cg_conv_mode() == CG_CONV_DIRECT || cp->phased || cp->G != 1 || cp->KH != 3 ||
        cp->KW != 3 || cp->st[0] != 1 || cp->st[1] != 1 || cp->dl[0] != 1 || cp->dl[1] != 1 ||
        cp->pd[0] > 2 || cp->pd[1] > 2 || cp->dH <= 0 || ceil_div(cp->dW, 2) < tw_min || cp->N <= 0)
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
    int64_t tr = ceil_div(wn->m == 4 ? WG_TILES / 2 : WG_TILES, wn->TW);
    tr = tr < nth ? tr : nth;
    wn->nbk = ceil_div(nth, tr);
    wn->tr = ceil_div(nth, wn->nbk);
    wn->kc = ceil_div(wn->tr * wn->TW, 2) * 2;
    bool big = ceil_div(cp->Cg, WG_BIG) * ceil_div(cp->Og, WG_BIG) >= WG_BIG_TASKS;
    int64_t nbm = ceil_div(cp->Cg, big ? WG_BIG : WG_ROWS);
    int64_t nbn = ceil_div(cp->Og, big ? WG_BIG : WG_COLS);
    if (nbm * nbn < WG_TASKS_MIN)
        nbm = ceil_div(WG_TASKS_MIN, nbn);
    wn->rows = ceil_div(cp->Cg, nbm);
    nbm = ceil_div(cp->Cg, wn->rows);
    int64_t cols = ceil_div(ceil_div(cp->Og, nbn), MK_PANEL) * MK_PANEL;
    cols = cols < cp->Og ? cols : cp->Og;
    nbn = ceil_div(cp->Og, cols);
    m->pk = cp->mk.pk;
    m->kp = wn->kc / m->pk;
    cg_mk_shape(m, cols);
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
    wp->KH = wp->KW = wp->KWf = wn->a;
    wp->KK = wp->KKf = wn->nx;
    wp->st[0] = wp->st[1] = wn->m;
    wp->dH = wn->TH, wp->dW = wn->TW;
    wp->pix_rows = wn->tr;
    wp->identity = wp->tab = wp->pairs_win = wp->phased = wp->dst_big = false;
    wp->lanes_win = true;
}

/* The forward's and the input gradient's blocks: nbm row blocks of rows each, and nb blocks of
 * tr tile rows each, whose tiles fill the microkernel's column tiles by `fill` (the tiles over
 * their panels' columns). */
typedef struct wn_blocks {
    int64_t rows, nbm, tr, nb;
    double fill;
} wn_blocks;

/* Row blocks of at most most_rows rows, and blocks of equal tile rows that fill the panels
 * best, at least WN_TASKS_MIN tasks, their C blocks within WN_C_BYTES (fewer blocks on a
 * tie). */
static wn_blocks row_blocks(const cv_plan *cp, const cv_wino *wn, int64_t most_rows) {
    int64_t nth = cp->N * wn->TH; /* tile rows of all images */
    wn_blocks bl = {.nbm = ceil_div(cp->M, most_rows), .tr = 1, .nb = nth, .fill = -1.0};
    bl.rows = ceil_div(ceil_div(cp->M, bl.nbm), 16) * 16;
    bl.rows = bl.rows < cp->M ? bl.rows : cp->M;
    bl.nbm = ceil_div(cp->M, bl.rows);
    for (int64_t n = 1; n <= nth; n++) {
        int64_t t = ceil_div(nth, n);
        if (ceil_div(nth, t) != n)
            continue;
        int64_t tiles = t * wn->TW;
        cg_mk tile;
        cg_mk_shape(&tile, tiles);
        int64_t np = ceil_div(tiles, tile.nv * MK_PANEL) * tile.nv * MK_PANEL;
        int64_t mbp = ceil_div(bl.rows, tile.mr) * tile.mr;
        if ((t > 1 && wn->nx * mbp * np * 4 > WN_C_BYTES) || (n * bl.nbm < WN_TASKS_MIN && n < nth))
            continue;
        double fill = (double)(nth * wn->TW) / (double)(n * np);
        if (fill > bl.fill + 1e-9)
            bl.fill = fill, bl.tr = t, bl.nb = n;
    }
    return bl;
}

void cv_wino_plan(cv_plan *cp, cv_wino *wn) {
    cg_mk *m = &wn->mk;
    memset(wn, 0, sizeof *wn);
    wn->m = wino_tile(cp);
    wn->a = wn->m + 2, wn->nx = wn->a * wn->a;
    wn->TH = ceil_div(cp->dH, wn->m), wn->TW = ceil_div(cp->dW, wn->m);
    if (cp->role == CV_GRAD_WEIGHT) {
        plan_gw(cp, wn);
        plan_window(cp, wn);
        return;
    }
    m->pk = cp->mk.pk;
    /* K chunks: the most channels up to WN_KP packed elements that divide K's channels */
    wn->kc = 16;
    for (int64_t k = 16; k <= WN_KP * m->pk && k <= cp->wch; k += 16)
        if (cp->wch % k == 0)
            wn->kc = k;
    wn->nbk = cp->wch / wn->kc;
    m->kp = wn->kc / m->pk;
    wn_blocks bl = row_blocks(cp, wn, WN_ROWS_MAX), small = row_blocks(cp, wn, WN_ROWS);
    if (small.fill > bl.fill + 1e-9)
        bl = small;
    wn->tr = bl.tr;
    int64_t tiles = bl.tr * wn->TW;
    cg_mk_shape(m, tiles);
    m->nbp = ceil_div(tiles, m->nv * MK_PANEL) * m->nv * MK_PANEL;
    m->b_ld = cv_row_ld(m->nbp);
    plan_window(cp, wn);
    /* the epilogue's blocks: m pixel rows per tile row */
    cp->rows = bl.rows, cp->nbm = bl.nbm;
    cp->pix_rows = wn->m * bl.tr, cp->cols = cp->pix_rows * cp->dW, cp->nbn = bl.nb;
    cp->mbp = ceil_div(bl.rows, m->mr) * m->mr;
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
    return cg_iadd(b, cg_imul_c(b, idiv(b, t, wn->TH), dH),
                   cg_imul_c(b, irem(b, t, wn->TH), wn->m));
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

/* Tap t of 16 consecutive channels' 3x3 windows (16-bit or f32), which lie contiguous from w[base]
 * (144 values, 9 a channel): a gather of 16 lanes became 16 element inserts, and conv2d's
 * weight transform was a fifth of a layer4 3x3's Winograd forward (bf16, 7x7). Each 8 lanes
 * instead are a window of 64 values at base + t (+ 72) read as two vectors, whose every 9th
 * one shuffle picks; all reads stay within the 144 values. */
static MlirValue taps16(cg_b *b, MlirValue mem, MlirType et, MlirValue base, MlirValue t) {
    MlirType v32 = cg_vec_t(32, et);
    int64_t pick[8], both[16];
    for (int l = 0; l < 8; l++)
        pick[l] = 9 * l;
    for (int l = 0; l < 16; l++)
        both[l] = l;
    MlirValue half[2];
    for (int h = 0; h < 2; h++) {
        MlirValue at = cg_iadd(b, cg_iadd(b, base, t), cg_idx(b, 72 * h));
        MlirValue lo = cg_vload(b, v32, mem, at);
        MlirValue hi = cg_vload(b, v32, mem, cg_iadd(b, at, cg_idx(b, 32)));
        half[h] = cg_vshuffle(b, lo, hi, 8, pick);
    }
    return cg_vshuffle(b, half[0], half[1], 16, both);
}

/* cv_pack_taps' chunk lk for the input gradient's taps themselves (tm = 0) where its row
 * blocks are whole 16s of channels: for 16 rows (channels c) and 16 of K (output channels
 * o), tap t of w[o, c0..c0 + 16, t] for each o by taps16 (lanes: rows), turned by a 16 x 16
 * transpose into each row's 16 of K (layer4's 2x2 input gradient by taps, bf16, batch 32:
 * 1.54-1.69 ms with a gather per row and tap, 1.04-1.10 so). */
static void pack_taps_by_rows(kc *c, const cv_plan *cp, const cg_mk *m, int64_t kch, MlirValue lk,
                              MlirValue uw, MlirValue ut, MlirValue i0) {
    cg_b *b = c->b;
    MlirValue wbuf = c->bufs[c->s->buf_of[cp->plain]], z = cg_idx(b, 0);
    loom_dtype wdt = c->g->nodes[cp->plain].dtype;
    int64_t blk = cp->mbp * m->kp;
    cg_for lr, lv, lt;
    cg_for_begin(b, &lr, z, cg_idx(b, cp->mbp / 16), 0, NULL);
    MlirValue c0 = cg_iadd(b, i0, cg_imul_c(b, lr.iv, 16));
    cg_for_begin(b, &lv, z, cg_idx(b, kch / 16), 0, NULL);
    MlirValue o0 = cg_iadd(b, cg_imul_c(b, lk, kch), cg_imul_c(b, lv.iv, 16));
    MlirValue col = cg_imul_c(b, lv.iv, 16), h[16];
    cg_for_begin(b, &lt, z, cg_idx(b, 9), 0, NULL);
    for (int64_t q = 0; q < 16; q++) {
        MlirValue o = cg_iadd(b, o0, cg_idx(b, q));
        MlirValue base = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, o, cp->C), c0), 9);
        h[q] = taps16(b, wbuf, cg_storage_type(b, wdt), base, lt.iv);
    }
    cg_vtranspose16(b, h);
    for (int64_t r = 0; r < 16; r++) {
        MlirValue row = cg_iadd(b, cg_imul_c(b, lr.iv, 16), cg_idx(b, r));
        MlirValue u = cg_widen16(b, wdt, h[r]);
        if (m->pk == 2)
            cg_vstore(b, u, ut,
                      cg_iadd(b, cg_imul_c(b, lt.iv, cp->mbp * kch),
                              cg_iadd(b, cg_imul_c(b, row, kch), col)));
        else
            cg_vstore(b, u, uw,
                      cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk, 9), lt.iv), blk),
                              cg_iadd(b, cg_imul_c(b, row, m->kp), col)));
    }
    cg_for_end(b, &lt, 0, NULL);
    cg_for_end(b, &lv, 0, NULL);
    cg_for_end(b, &lr, 0, NULL);
}

/* cv_pack_taps' chunk lk otherwise: for each row, 16 of K at a time, its 9 taps (conv2d's 16
 * channels' by taps16, the input gradient's by gathers), then U where tm > 0. */
static void pack_taps_by_channels(kc *c, const cv_plan *cp, const cg_mk *m, int64_t kch, int64_t tm,
                                  MlirValue lk, MlirValue uw, MlirValue ut, MlirValue i0,
                                  MlirValue i1) {
    cg_b *b = c->b;
    MlirValue wbuf = c->bufs[c->s->buf_of[cp->plain]], z = cg_idx(b, 0);
    loom_dtype wdt = c->g->nodes[cp->plain].dtype;
    MlirType vi = cg_vec_t(16, b->i32);
    int64_t nx = tm > 0 ? (tm + 2) * (tm + 2) : 9, blk = cp->mbp * m->kp;
    bool fwd = cp->role == CV_FWD, turn = !fwd && tm > 0;
    int64_t rs = fwd ? 9 * cp->C : 9, ks = fwd ? 9 : 9 * cp->C; /* w's steps per row, channel */
    int32_t step[16];
    for (int l = 0; l < 16; l++)
        step[l] = (int32_t)(ks * l);
    MlirValue lanes = cg_vconst_i32(b, 16, step);
    cg_for li, lv;
    cg_for_begin(b, &li, z, cg_idx(b, cp->mbp), 0, NULL);
    MlirValue i = cg_imin(b, cg_iadd(b, i0, li.iv), isub(b, i1, cg_idx(b, 1)));
    cg_for_begin(b, &lv, z, cg_idx(b, kch / 16), 0, NULL);
    MlirValue ch = cg_iadd(b, cg_imul_c(b, lk, kch), cg_imul_c(b, lv.iv, 16));
    MlirValue base = cg_iadd(b, cg_imul_c(b, i, rs), cg_imul_c(b, ch, ks)), g[9], u[WN_NX];
    for (int t = 0; t < 9; t++) {
        if (fwd) { /* a tap's 16 lanes by taps16 */
            g[t] = cg_widen16(b, wdt, taps16(b, wbuf, cg_storage_type(b, wdt), base, cg_idx(b, t)));
            continue;
        }
        MlirValue at =
            cg_conv(b, "arith.index_cast", cg_iadd(b, base, cg_idx(b, turn ? 8 - t : t)), b->i32);
        MlirValue idx = cg_bin(b, "arith.addi", cg_vbroadcast(b, at, vi), lanes);
        g[t] = cg_widen16(b, wdt, gather16(b, wbuf, cg_storage_type(b, wdt), idx));
    }
    if (tm > 0)
        both_axes(b, fns_of(tm)->g, 3, tm + 2, g, u); /* U = G w G^T */
    else
        memcpy(u, g, sizeof g);
    MlirValue col = cg_imul_c(b, lv.iv, 16);
    for (int64_t x = 0; x < nx; x++) {
        if (m->pk == 2)
            cg_vstore(b, u[x], ut, /* paired and rounded by cv_pair_up */
                      cg_iadd(b, cg_idx(b, x * cp->mbp * kch),
                              cg_iadd(b, cg_imul_c(b, li.iv, kch), col)));
        else
            cg_vstore(b, u[x], uw,
                      cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk, nx), cg_idx(b, x)), blk),
                              cg_iadd(b, cg_imul_c(b, li.iv, m->kp), col)));
    }
    cg_for_end(b, &lv, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

void cv_pack_taps(kc *c, const cv_plan *cp, const cg_mk *m, int64_t kch, int64_t nbk, int64_t tm,
                  MlirValue uw, MlirValue ut, MlirValue i0, MlirValue i1) {
    cg_b *b = c->b;
    int64_t nx = tm > 0 ? (tm + 2) * (tm + 2) : 9, blk = cp->mbp * m->kp;
    /* the input gradient's taps themselves, its row blocks (and so its last) whole 16s */
    bool by_rows = cp->role != CV_FWD && tm == 0 && cp->rows % 16 == 0 && cp->M % 16 == 0 &&
                   cp->mbp == cp->rows;
    cg_for lk;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, nbk), 0, NULL);
    if (by_rows)
        pack_taps_by_rows(c, cp, m, kch, lk.iv, uw, ut, i0);
    else
        pack_taps_by_channels(c, cp, m, kch, tm, lk.iv, uw, ut, i0, i1);
    if (m->pk == 2)
        cv_pair_up(c, ut, uw, cg_imul_c(b, lk.iv, nx * blk), nx * blk);
    cg_for_end(b, &lk, 0, NULL);
}

/* The pixels of a pixel row of 16 tiles, y[j] the tiles' column j of m, in order: out[q] =
 * pixels [16 q, 16 q + 16), m of them. */
static void interleave(cg_b *b, int64_t m, const MlirValue *y, MlirValue *out) {
    int64_t lo[16], hi[16];
    for (int l = 0; l < 16; l++) {
        lo[l] = l % 2 == 0 ? l / 2 : 16 + l / 2;
        hi[l] = lo[l] + 8;
    }
    if (m == 2) {
        out[0] = cg_vshuffle(b, y[0], y[1], 16, lo);
        out[1] = cg_vshuffle(b, y[0], y[1], 16, hi);
        return;
    }
    /* columns 0, 1 and 2, 3 paired as m = 2 pairs them, then the pairs of 4 tiles a vector */
    MlirValue p[2][2];
    interleave(b, 2, y, p[0]);
    interleave(b, 2, y + 2, p[1]);
    for (int q = 0; q < 4; q++) {
        int64_t idx[16];
        for (int l = 0; l < 16; l++) /* tile 4 (q % 2) + l / 4 of the half, column l % 4 */
            idx[l] = 2 * (4 * (q % 2) + l / 4) + l % 2 + (l % 4 >= 2 ? 16 : 0);
        out[q] = cg_vshuffle(b, p[0][q / 2], p[1][q / 2], 16, idx);
    }
}

/* Y of the block's rows [0, mb) and tile rows [t0, t0 + ntr) from the nx GEMMs' C (cw,
 * GEMM x's at x cblk) into C in the destination's layout (cs, rows cp->mk.nbp apart): per 16
 * tiles of a tile row, its m pixel rows' 16 m pixels (Y's columns interleaved). Of a
 * destination whose size m does not divide, a last column's pixels past it are not stored,
 * and an image's last tile row's pixel rows past it land on the next tile row's first,
 * which are stored after them (or past the block's rows, which the epilogue does not
 * read). */
static void transform_output(kc *c, const cv_plan *cp, const cv_wino *wn, MlirValue cw,
                             MlirValue cs, MlirValue mb, MlirValue t0, MlirValue ntr) {
    cg_b *b = c->b;
    const cg_mk *m = &wn->mk;
    MlirType vf = cg_vec_t(16, b->f32);
    int64_t cblk = cp->mbp * m->nbp, tm = wn->m;
    MlirValue p0 = tile_row_pixel(b, wn, cp->dH, t0);
    cg_for li, lr;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    MlirValue crow = cg_imul_c(b, li.iv, cp->mk.nbp), mrow = cg_imul_c(b, li.iv, m->nbp);
    cg_for_begin(b, &lr, cg_idx(b, 0), ntr, 0, NULL);
    MlirValue tcol = cg_iadd(b, mrow, cg_imul_c(b, lr.iv, wn->TW));
    MlirValue py = isub(b, tile_row_pixel(b, wn, cp->dH, cg_iadd(b, t0, lr.iv)), p0);
    MlirValue prow = cg_iadd(b, crow, cg_imul_c(b, py, cp->dW));
    for (int64_t s = 0; s < wn->TW; s += 16) {
        /* pixels from m s to store in the row: of a row's last 16 tiles, to its end */
        int64_t n = wn->TW - s < 16 ? wn->TW - s : 16;
        int64_t px = cp->dW - tm * s < tm * n ? cp->dW - tm * s : tm * n;
        MlirValue mv[WN_NX], y[16], out[4];
        for (int64_t x = 0; x < wn->nx; x++)
            mv[x] = cg_vload(b, vf, cw, cg_iadd(b, tcol, cg_idx(b, x * cblk + s)));
        both_axes(b, fns_of(tm)->at, wn->a, tm, mv, y); /* Y = A^T M A */
        for (int64_t a = 0; a < tm; a++) {
            MlirValue at = cg_iadd(b, prow, cg_idx(b, a * cp->dW + tm * s));
            interleave(b, tm, y + tm * a, out);
            for (int64_t q = 0; q < tm && 16 * q < px; q++)
                cv_store_lanes(b, out[q], cs, cg_iadd(b, at, cg_idx(b, 16 * q)),
                               px - 16 * q < 16 ? px - 16 * q : 16);
        }
    }
    cg_for_end(b, &lr, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

/* The weight gradient's B, dM^T of the chunk's nt tiles (from tile row t0) for the nx GEMMs
 * (GEMM x's at bw[x kp b_ld]: row = tile, or pairs of tiles (2 kk, 2 kk + 1) rounded to
 * bf16; zeros past the tiles up to kp and past dy^T's columns up to nbp), from dy^T staged
 * as cv_stage_dy_t stages it from tile row t0's first pixel row: a tile's m x m pixels, rows
 * (py + i) OW + m tx + j of stg (py its first pixel row's, from t0's), 16 of dy's channels at
 * a time. Of a dy whose size m does not divide, the pixels past a row's end or an image's
 * last row (an overhanging tile's) are zeros. */
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
    int64_t tm = wn->m;
    MlirValue nrow = idiv(b, cg_iadd(b, nt, cg_idx(b, pk - 1)), pk);
    MlirValue p0 = tile_row_pixel(b, wn, oh, t0);
    cg_for lk, lp;
    cg_for_begin(b, &lk, z, nrow, 0, NULL);
    /* per tile of the pair: its pixel, whether it is (has), and whether its columns and rows
     * j > 0 lie inside dy (right, below; null where m divides dy's size) */
    MlirValue px[2], has[2] = {{NULL}, {NULL}}, right[2][4], below[2][4];
    memset(right, 0, sizeof right);
    memset(below, 0, sizeof below);
    for (int64_t e = 0; e < pk; e++) {
        MlirValue t = cg_iadd(b, cg_imul_c(b, lk.iv, pk), cg_idx(b, e));
        if (e > 0) { /* an odd count's last pair: its second tile zeros */
            has[e] = cg_cmpi(b, CG_I_ULT, t, nt);
            t = cg_select(b, has[e], t, isub(b, t, cg_idx(b, 1)));
        }
        MlirValue ty = cg_iadd(b, t0, idiv(b, t, wn->TW)), tx = irem(b, t, wn->TW);
        MlirValue py = isub(b, tile_row_pixel(b, wn, oh, ty), p0);
        px[e] = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, py, ow), cg_imul_c(b, tx, tm)), dl);
        for (int64_t j = 1; j < tm; j++) {
            if (ow % tm != 0)
                right[e][j] = cg_cmpi(b, CG_I_ULT, cg_imul_c(b, tx, tm), cg_idx(b, ow - j));
            if (oh % tm != 0)
                below[e][j] =
                    cg_cmpi(b, CG_I_ULT, cg_imul_c(b, irem(b, ty, wn->TH), tm), cg_idx(b, oh - j));
        }
    }
    MlirValue row = cg_imul_c(b, lk.iv, m->b_ld);
    cg_for_begin(b, &lp, z, cg_idx(b, np), 0, NULL);
    MlirValue col = cg_imul_c(b, lp.iv, MK_PANEL), v[2][WN_NX];
    for (int64_t e = 0; e < pk; e++) {
        MlirValue at = cg_iadd(b, px[e], col), d[16];
        for (int64_t q = 0; q < tm * tm; q++) {
            int64_t i = q / tm, j = q % tm;
            d[q] = cg_vload(b, vf, stg, cg_iadd(b, at, cg_idx(b, (i * ow + j) * dl)));
            if (j > 0 && !mlirValueIsNull(right[e][j]))
                d[q] = cg_select(b, right[e][j], d[q], zf);
            if (i > 0 && !mlirValueIsNull(below[e][i]))
                d[q] = cg_select(b, below[e][i], d[q], zf);
        }
        both_axes(b, fns_of(tm)->ad, tm, wn->a, d, v[e]);
        for (int64_t x = 0; x < wn->nx && e > 0; x++)
            v[e][x] = cg_select(b, has[e], v[e][x], zf);
    }
    for (int64_t x = 0; x < wn->nx; x++) {
        MlirValue val = pk == 2 ? cg_cvt_bf16x32(b, v[0][x], v[1][x], true) : v[0][x];
        cg_vstore(b, val, bw, cg_iadd(b, cg_idx(b, x * xs), cg_iadd(b, row, col)));
    }
    cg_for_end(b, &lp, 0, NULL);
    for (int64_t p = np; p < m->nbp / MK_PANEL; p++) /* the GEMMs' columns past dy^T's */
        for (int64_t x = 0; x < wn->nx; x++)
            cg_vstore(b, zero, bw, cg_iadd(b, row, cg_idx(b, x * xs + p * MK_PANEL)));
    cg_for_end(b, &lk, 0, NULL);
    MlirValue zs = pk == 2 ? cg_ci(b, b->i32, 0) : cg_cf(b, b->f32, 0.0);
    for (int64_t x = 0; x < wn->nx; x++) /* the rows past the tiles */
        cv_zero_rows_at(b, bw, cg_idx(b, x * xs), nrow, m->kp, m->b_ld, zs);
}

/* dw^T of the block's rows [0, mb) from the nx GEMMs' sums (cw, GEMM x's at x cblk), G^T dU
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
    MlirValue u[WN_NX], g[9];
    for (int64_t x = 0; x < wn->nx; x++)
        u[x] = cg_vload(b, vf, cw, cg_iadd(b, at, cg_idx(b, x * cblk)));
    both_axes(b, fns_of(wn->m)->gt, wn->a, 3, u, g);
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
    int64_t nx = wn->nx;
    MlirValue rtab = cg_alloc_buf(b, b->i64, wn->a * wn->tr);
    MlirValue stga = cg_alloc_buf(b, b->f32, nx * mbp * wn->kc);
    MlirValue ap = pairs ? cg_alloc_buf(b, b->i32, nx * ablk) : stga;
    /* + m pixel rows: the overhanging tiles of a dy whose size m does not divide read up to
     * m - 1 rows and columns past the chunk's rows (as zeros) */
    MlirValue stgd = cg_alloc_buf(b, b->f32, (wn->m * wn->tr + wn->m) * cp->dW * wn->dyp.mk.b_ld);
    MlirValue bw = cg_alloc_buf(b, pairs ? b->i32 : b->f32, nx * bblk);
    MlirValue cw = cg_alloc_buf(b, b->f32, nx * cblk);
    MlirValue cs = cg_alloc_buf(b, b->f32, cp->rows * m->nbp);
    cg_for lo, lk, lx;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue i0, i1, j0, j1, t0, t1;
    block_of(b, idiv(b, lo.iv, cp->nbn), wn->rows, cp->Cg, &i0, &i1);
    block_of(b, irem(b, lo.iv, cp->nbn), cp->cols, cp->Og, &j0, &j1);
    MlirValue mb = isub(b, i1, i0);
    if (wn->nbk == 0) /* no tiles (an empty batch): dw = 0 */
        cv_zero_rows(b, cw, z, nx * mbp, m->nbp, cg_cf(b, b->f32, 0.0));
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    block_of(b, lk.iv, wn->tr, nth, &t0, &t1);
    cv_build_rows(c, &wn->win, rtab, t0, t1);
    cv_stage_winograd(c, &wn->win, &wn->amk, stga, rtab, i0, i1, t0, t1);
    if (pairs)
        cv_pair_up(c, stga, ap, z, nx * ablk);
    cv_stage_dy_t(c, &wn->dyp, stgd, z, j0, j1, tile_row_pixel(b, wn, cp->dH, t0),
                  tile_row_pixel(b, wn, cp->dH, t1));
    transform_dy(c, wn, stgd, bw, t0, cg_imul_c(b, isub(b, t1, t0), wn->TW));
    /* the first chunk starts C, the others add to it */
    MlirValue first = wn->nbk > 1 ? cg_cmpi(b, CG_I_EQ, lk.iv, z) : (MlirValue){NULL};
    cg_for_begin(b, &lx, z, cg_idx(b, nx), 0, NULL);
    cg_mk_tiles_at(c, m, ap, cg_imul_c(b, lx.iv, ablk), bw, cg_imul_c(b, lx.iv, bblk), cw,
                   cg_imul_c(b, lx.iv, cblk), mb, isub(b, j1, j0), wn->nbk > 1, first, NULL);
    cg_for_end(b, &lx, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    transform_filter(c, wn, cw, cs, mb);
    loom_status st = LOOM_OK;
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, (MlirValue){NULL}, z, cg_imul_c(b, i0, 9),
                              cg_imul_c(b, i1, 9), j0, j1);
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
    int64_t nx = wn->nx;
    MlirValue rtab = cg_alloc_buf(b, b->i64, wn->a * wn->tr);
    MlirValue bw = cg_alloc_buf(b, et, nx * m->kp * m->b_ld);
    MlirValue cw = cg_alloc_buf(b, b->f32, nx * cblk + MK_PANEL); /* + a row's overread */
    MlirValue cs = cg_alloc_buf(b, b->f32, cp->mbp * cp->mk.nbp);
    MlirValue uw = cg_alloc_buf(b, et, nx * blk * wn->nbk);
    MlirValue ut = pairs ? cg_alloc_buf(b, b->f32, nx * cp->mbp * wn->kc) : uw;
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
    cv_pack_taps(c, cp, m, wn->kc, wn->nbk, wn->m, uw, ut, i0, i1);
    cg_store(b, key, akey, z);
    cg_if_end(b, &f);
    cv_build_rows(c, &wn->win, rtab, t0, t1);
    /* chunks accumulate into C, the first starting it */
    bool acc = wn->nbk > 1;
    cg_for_begin(b, &lk, z, cg_idx(b, wn->nbk), 0, NULL);
    MlirValue first = acc ? cg_cmpi(b, CG_I_EQ, lk.iv, z) : (MlirValue){NULL};
    MlirValue k0 = cg_imul_c(b, lk.iv, wn->kc);
    cv_stage_winograd(c, &wn->win, m, bw, rtab, k0, cg_iadd(b, k0, cg_idx(b, wn->kc)), t0, t1);
    cg_for_begin(b, &lx, z, cg_idx(b, nx), 0, NULL);
    MlirValue a0 = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lk.iv, nx), lx.iv), blk);
    cg_mk_tiles_at(c, m, uw, a0, bw, cg_imul_c(b, lx.iv, m->kp * m->b_ld), cw,
                   cg_imul_c(b, lx.iv, cblk), mb, cg_imul_c(b, ntr, wn->TW), acc, first, NULL);
    cg_for_end(b, &lx, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
    transform_output(c, cp, wn, cw, cs, mb, t0, ntr);
    if (cp->n_epi > 0)
        st = cv_emit_epilogue(c, cp, &cs, 1, (MlirValue){NULL}, z, i0, i1,
                              tile_row_pixel(b, wn, cp->dH, t0), tile_row_pixel(b, wn, cp->dH, t1));
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[7] = {rtab, bw, cw, cs, uw, ut, akey};
    dealloc_bufs(b, bufs, 7, 5, !pairs); /* ut is uw in f32 */
    return st;
}
