/* Internals of the convolution kernels shared by their files (lower_conv.c: the plan and its
 * tasks; conv_epilogue.c: a block's epilogue; conv_stage.c: how each block's operands are
 * staged from the activations and the weights; conv_winograd.c, conv_taps.c: the Winograd and
 * by-taps kernels). How a convolution becomes GEMMs is described at the top of lower_conv.c. */
#ifndef LOOM_CODEGEN_CONV_INTERNAL_H
#define LOOM_CODEGEN_CONV_INTERNAL_H

#include "lower_internal.h"

enum {
    CV_TAPS_MAX = 16, /* taps of a phase along an axis (larger windows are not phased) */
    WN_NX = 36,       /* Winograd's GEMMs, at most: F(4x4, 3x3)'s 6 x 6 */
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
    bool tab;       /* stage through a pixel table (cv_build_table) of ldt pixels a tap */
    bool identity;  /* 1x1, stride 1, no padding: a window row is its channel's pixels */
    bool pairs_win; /* B's bf16 pairs staged straight from the window (cv_stage_window_pairs) */
    bool img_win;   /* ... a whole image at a time (cv_stage_window_pairs_img) */
    bool lanes_win; /* else its rows staged in f32 by masked loads (cv_stage_window_lanes) */
    int64_t ldt;
    /* a strided input gradient is computed per phase, and a stride-1 convolution of a small
     * image per border class: the destination pixels (ph[0] + pst[0] y, ph[1] + pst[1] q)
     * (pst: the stride for a phase, 1 for a class, a range of rows and columns) and the taps
     * that reach them all, tap[a][t] along axis a, which read the source at the
     * destination's y or q plus off[a][t]; KH, KW, KK, dH, dW, K are the phase's, KWf and
     * KKf the whole window's */
    bool phased;
    int64_t ph[2], pst[2], ntap[2], tap[2][CV_TAPS_MAX], off[2][CV_TAPS_MAX], KWf, KKf;
    /* the only phase with taps, all phases of one size (a strided 1x1's): its epilogue runs
     * over every phase's pixels, the others' value 0, a destination row at a time */
    bool spread;
    /* an unphased epilogue whose values are all contiguous across a destination row's end:
     * the nest's dims y and q are one group, and a task's rows of one image one loop over
     * their pixels (merge_pixels) */
    bool flat;
    /* conv2d and the input gradient: the weights' packed rows for all of K (a block of
     * mbp x kp per chunk) are kept across a thread's consecutive tasks of one row block */
    bool a_cache;
    /* the GEMM per group, C [M, NC] = A [M, K] x B [K, NC], and its blocks */
    int64_t M, K, NC;
    int64_t rows, nbm, cols, nbn, kc, nbk;
    int64_t pix_rows; /* destination pixel rows per column block (FWD, GI) or K chunk (GW) */
    int64_t mbp;
    cg_mk mk;
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns;
} cv_plan;

/* The row stride of a staged B (or other row-major block) of n columns: a stride of a
 * multiple of 128 floats made the weight gradient's tiles (loading two rows 1 KB apart per
 * step) 1.9x slower, so such rows get a panel more. */
static inline int64_t cv_row_ld(int64_t n) {
    return n % 128 == 0 ? n + MK_PANEL : n;
}

/* ---- staging (conv_stage.c) ---- */
/* Window rows [j0, j1) x destination pixel rows [r0, r1) of group g, staged in f32 as
 * buf[(j - j0) * ld + (r - r0) * dW + q], zeros up to width: a strided copy per row between
 * bounds computed per tap, element by element (source steps above 2), the rows' sources
 * from cv_build_rows' table rtab. Not for phases. */
void cv_stage_window(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                     MlirValue rtab, MlirValue g, MlirValue j0, MlirValue j1, MlirValue r0,
                     MlirValue r1);
void cv_build_rows(kc *c, const cv_plan *cp, MlirValue rtab, MlirValue r0, MlirValue r1);
/* The same by masked loads, 16 pixels of a row at a time, any source dtype converted to f32,
 * where cv_window_lanes_ok: source steps 1 and 2, a strided input gradient's phases too. */
bool cv_window_lanes_ok(const cv_plan *cp);
void cv_stage_window_lanes(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                           MlirValue rtab, MlirValue g, MlirValue j0, MlirValue j1, MlirValue r0,
                           MlirValue r1);
/* For a bf16 source under the pairing microkernel (where cv_window_pairs_ok), straight into
 * bf16 pairs: conv2d's and the input gradient's B as pairs of window rows (2 kk, 2 kk + 1),
 * bp[kk * b_ld + column] (zeros past the block); the weight gradient's A, window rows
 * [i0, i1) x pixel rows [r0, r1), as pairs of pixels along K, ap[(j - i0) kp + (r - r0)
 * ceil(dW / 2) + p] (zeros past the block and in the rows up to mbp; cv_panelize pairs dy^T's
 * pixels alike, and the plan's kp holds pix_rows ceil(dW / 2) pairs). */
bool cv_window_pairs_ok(const kc *c, const cv_plan *cp);
void cv_stage_window_pairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue rtab, MlirValue g,
                           MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1);
void cv_stage_window_kpairs(kc *c, const cv_plan *cp, MlirValue ap, MlirValue rtab, MlirValue g,
                            MlirValue i0, MlirValue i1, MlirValue r0, MlirValue r1);
/* The same pairs for conv2d and the input gradient where the source image is 64 pixels or
 * fewer, the destination 16 or fewer, and the blocks whole images (cv_window_img_ok, after
 * pairs_win): each image's channel read once into a vector, each tap's window row of it one
 * shuffle (taps[]: cv_img_taps_len i16, the chunk's rows for one image), then paired from
 * there. */
bool cv_window_img_ok(const cv_plan *cp);
int64_t cv_img_taps_len(const cv_plan *cp);
void cv_stage_window_pairs_img(kc *c, const cv_plan *cp, MlirValue bp, MlirValue taps, MlirValue g,
                               MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1);
/* The weight gradient's A likewise (as cv_stage_window_kpairs pairs it), each tap's pixel
 * pairs of an image one shuffle of its channel. */
bool cv_window_kpairs_img_ok(const cv_plan *cp);
void cv_stage_window_kpairs_img(kc *c, const cv_plan *cp, MlirValue ap, MlirValue g, MlirValue i0,
                                MlirValue i1, MlirValue r0, MlirValue r1);
/* cv_stage_window through a table of every pixel's source (narrow images and phases of
 * source steps above 2): cv_build_table for pixel rows [r0, r1), then cv_stage_window_tab
 * for its npix pixels. */
void cv_build_table(kc *c, const cv_plan *cp, MlirValue tab, int64_t ldt, MlirValue r0,
                    MlirValue r1);
void cv_stage_window_tab(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width,
                         MlirValue tab, int64_t ldt, MlirValue g, MlirValue j0, MlirValue j1,
                         MlirValue npix);
/* The same for an identity window (cv_plan.identity): contiguous runs, one per image; and,
 * for a bf16 source under the pairing microkernel, B's bf16 pairs of rows (2 kk, 2 kk + 1)
 * built straight from the source as bp[kk * b_ld + column] (zeros past the block). */
void cv_stage_runs(kc *c, const cv_plan *cp, MlirValue buf, int64_t ld, int64_t width, MlirValue g,
                   MlirValue j0, MlirValue j1, MlirValue r0, MlirValue r1);
void cv_stage_runs_pairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue g, MlirValue j0,
                         MlirValue j1, MlirValue r0, MlirValue r1);
/* The weights' rows [i0, i1) x K [k0, k1) of group g as A, staged in f32 at stg[base]. */
void cv_stage_weights(kc *c, const cv_plan *cp, MlirValue stg, MlirValue base, int64_t ld,
                      MlirValue g, MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1);
/* The weight gradient's B = dy^T for output channels [j0, j1) and pixel rows [r0, r1). */
void cv_stage_dy_t(kc *c, const cv_plan *cp, MlirValue stg, MlirValue g, MlirValue j0, MlirValue j1,
                   MlirValue r0, MlirValue r1);
/* The same for a bf16 dy straight into B's bf16 pairs, as cv_stage_window_kpairs pairs A's
 * pixels (where the window is staged so, cv_plan.pairs_win): per pixel row and segment of 32
 * pixels, the pairs of 16 channels at a time transposed in registers as 32-bit lanes (no f32
 * copy, no cv_panelize). */
void cv_stage_dy_t_kpairs(kc *c, const cv_plan *cp, MlirValue bp, MlirValue g, MlirValue j0,
                          MlirValue j1, MlirValue r0, MlirValue r1);
/* bf16 pairs for vdpbf16ps from staged f32, rounded to nearest (cg_cvt_bf16x32): of A's
 * rows (ap[base + p] = (stg[2p], stg[2p + 1]), n of them) and of B's (rows 2 kk and
 * 2 kk + 1). */
void cv_pair_up(kc *c, MlirValue stg, MlirValue ap, MlirValue base, int64_t n);
void cv_panelize(kc *c, const cv_plan *cp, MlirValue stg, MlirValue bp);
/* Blocks of `step` columns of a row of n: the whole ones (an scf.for when there are three or
 * more, which spares LLVM unrolled copies to compile; one by one otherwise), then the last
 * partial one. cv_lanes_begin/cv_lanes_next give each block's first column (an index value)
 * with lb.lanes its width; the loop stops at lb.at == lb.end. */
typedef struct cv_lane_blocks {
    int64_t n, step, full, at, end, lanes;
    bool looped;
    cg_for l;
} cv_lane_blocks;
MlirValue cv_lanes_begin(cg_b *b, cv_lane_blocks *lb, int64_t n, int64_t step);
MlirValue cv_lanes_next(cg_b *b, cv_lane_blocks *lb);
/* buf[at + i] = 0 for i in [lo, hi) */
void cv_zero_span(cg_b *b, MlirValue zero, MlirValue buf, MlirValue at, MlirValue lo, MlirValue hi);
/* The mask of a vector of 16's first n lanes. */
MlirValue cv_first_lanes(cg_b *b, int64_t n);
/* The first n (1..16) of v's 16 lanes to mem[at] (a masked store below 16). */
void cv_store_lanes(cg_b *b, MlirValue v, MlirValue mem, MlirValue at, int64_t n);
/* A masked load of vt from mem[at] (zeros in the lanes off mask) where ok (an i1) holds, and
 * zeros where it does not: a branch, not ok folded into the mask. LLVM 19's AVX2 lowering
 * (llc -mcpu=haswell, znver2, x86-64-v3) turns a 512-bit masked load whose mask folds to
 * select(ok, C, 0), C constant with a 256-bit half all false, into a plain load of that half:
 * the lanes past a window row's end read their neighbours (test_conformance's conv2d f32
 * case 0 and test_conv2d_wino on a Zen 2). */
MlirValue cv_maskload_if(cg_b *b, MlirType vt, MlirValue mem, MlirValue at, MlirValue mask,
                         MlirValue ok);
/* Zeros rows [from, to) of a row-major buffer of ld columns (at buf[base]). */
void cv_zero_rows(cg_b *b, MlirValue buf, MlirValue from, int64_t to, int64_t ld, MlirValue zero);
/* Whether a border class's weights pair straight from w (cv_pack_weight_pairs): bf16 pairs
 * along K = (channel, row tap, column tap) whose two column taps are adjacent in w. */
bool cv_weight_pairs_ok(const kc *c, const cv_plan *cp);
/* The weights' rows [i0, i1) x K [k0, k1) (whole channels) as A's bf16 pairs at ap[base],
 * each pair one 32-bit load from w: staged as f32 and paired, a 2x2 image's four classes
 * packed 16 taps of weights for every 9 the direct kernel packs, and took half their time
 * doing it. */
void cv_pack_weight_pairs(kc *c, const cv_plan *cp, MlirValue ap, MlirValue base, MlirValue g,
                          MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1);
void cv_zero_rows_at(cg_b *b, MlirValue buf, MlirValue base, MlirValue from, int64_t to, int64_t ld,
                     MlirValue zero);

/* ---- the epilogue (conv_epilogue.c), of lower_conv.c, conv_winograd.c and conv_taps.c ---- */
/* The epilogue of a task's block (rows [i0, i1), destination pixel rows [c0, c1)) from C
 * cs[0] (cs[b]: phase b's, nw of them, where phases along W share a row; row: f32 scratch of
 * cv_row_len(cp, nw) values where that is not 0, else NULL). */
loom_status cv_emit_epilogue(kc *c, const cv_plan *cp, const MlirValue *cs, int64_t nw,
                             MlirValue row, MlirValue g, MlirValue i0, MlirValue i1, MlirValue c0,
                             MlirValue c1);
/* The scratch row cv_emit_epilogue needs to interleave two phases along W (0: none). */
int64_t cv_row_len(const cv_plan *cp, int64_t nw);

/* ---- Winograd F(2x2, 3x3) and F(4x4, 3x3) for stride-1 3x3 convolutions (conv_winograd.c)
 * y's m x m tiles each from an a x a tile of x (a = m + 2): Y = A^T [(G w G^T) . (B^T d B)] A,
 * the a^2 products of the middle summed over channels as a^2 GEMMs [O, C] x [C, tiles]: for
 * the 9 multiplies a pixel of the direct form, 4 (m = 2: 2.25x fewer) or 2.25 (m = 4: 4x
 * fewer). The weight gradient's a^2 GEMMs are [C, tiles] x [tiles, O], of V = B^T d B and
 * (A dY A^T)^T, summed over the tiles. */
typedef struct cv_wino {
    int64_t m, a, nx;   /* the tile (2 or 4), its input's (m + 2), the GEMMs (a^2) */
    cv_plan win;        /* the a x a window of stride m over x, its destination grid the tiles */
    cg_mk mk;           /* each GEMM's blocks: rows x K (a chunk) x columns */
    int64_t TH, TW, tr; /* tiles along H and W of an image; tile rows of a block (K chunk) */
    int64_t kc, nbk;    /* channels of a K chunk (weight gradient: tiles, padded to pairs),
                         * chunks */
    /* the weight gradient's: rows (x's channels) of a block, A's f32 staging (kp: rows up
     * to mbp, b_ld: kc), and dy^T's (cv_stage_dy_t on dyp, rows its pixels, b_ld apart) */
    int64_t rows;
    cg_mk amk;
    cv_plan dyp;
} cv_wino;
/* Whether plan cp (planned) runs as Winograd: a 3x3 of stride 1, dilation 1 and padding up
 * to 2, one group, a destination (y, or dx; the weight gradient's y) at least 7 wide (4 tiles
 * a row, odd sizes overhanging; where the GEMMs multiply f32, 3 wide: 2 tiles); conv2d's and
 * the input gradient's channels summed over (x's, or dy's) in 16s, the weight gradient's x
 * and dy at least WG_MIN channels; not under LOOM_CONV=direct. */
bool cv_wino_ok(const kc *c, const cv_plan *cp);
/* Its tile (F(4x4, 3x3) where the GEMMs multiply f32 and the destination has the tiles a row;
 * LOOM_CONV=winograd2|winograd4) and blocks: cp's row and column blocks for the epilogue
 * (conv2d and the input gradient: whole tile rows, m pixel rows each; the weight gradient:
 * its rows (c, kh, kw) of whole channels), and wn's. */
void cv_wino_plan(cv_plan *cp, cv_wino *wn);
/* Every task of the kernel [c->lo, c->hi). */
loom_status cv_wino_emit(kc *c, const cv_plan *cp, const cv_wino *wn);
/* A 3x3's weights for rows [i0, i1) (rows past i1 up to cp->mbp repeat its last) in nbk
 * chunks of kch channels (a multiple of 16), each chunk's taps as nx GEMMs' A: chunk k's GEMM
 * x at uw[(k nx + x) mbp kp], row-major [mbp, kp] (bf16 pairs of channels through ut, f32
 * [nx mbp kch], rounded to nearest; ut unused in f32). Row i, channel k: conv2d's w[i, k],
 * the input gradient's w[k, i]. tm > 0: Winograd F(tm x tm, 3x3)'s U = G w G^T, nx = (tm +
 * 2)^2, the input gradient's taps turned by 180 degrees; tm = 0: the 9 taps themselves, in
 * w's order. */
void cv_pack_taps(kc *c, const cv_plan *cp, const cg_mk *m, int64_t kch, int64_t nbk, int64_t tm,
                  MlirValue uw, MlirValue ut, MlirValue i0, MlirValue i1);

/* ---- small images by taps (conv_taps.c) ------------------------------------------------
 * A 3x3 conv2d, input gradient or weight gradient (stride 1 or 2) of images of at most 16
 * pixels where a quarter or more of the taps read padding (4x4, 2x2) or fall between
 * strides: per destination pixel a GEMM over only the taps that reach a source pixel, its
 * columns (or, for the weight gradient, its K) the images, so no padding is multiplied. */
bool cv_taps_ok(const kc *c, const cv_plan *cp);
/* Its blocks (cp's rows and columns for the epilogue: whole images, or the weight gradient's
 * channels) and tasks; then every task of the kernel [c->lo, c->hi). */
void cv_taps_plan(kc *c, cv_plan *cp);
loom_status cv_taps_emit(kc *c, const cv_plan *cp);

#endif
