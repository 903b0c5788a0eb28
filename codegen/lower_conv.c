/* Lowering of convolution kernels: conv2d and its two gradients, each an implicit GEMM per
 * group on the packed microkernel (microkernel.c's cg_mk_tiles), with the root's fused
 * elementwise epilogue (bias, activation, cast) as a matmul's. NCHW at the API; no im2col
 * in memory: the window operand is packed from the activations block by block. The stride-1
 * 3x3s (of an output at least 7 wide; 3 where the GEMMs multiply f32) run as Winograd
 * F(2x2, 3x3) or F(4x4, 3x3) instead (conv_winograd.c), all three, with the same epilogue;
 * the 3x3s of images of at most 16 pixels, whose padding is a quarter of their taps or more,
 * by taps (conv_taps.c: a GEMM per destination pixel over only the taps that reach it).
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
 * strided run between bounds computed per (kh, kw), read 16 pixels at a time by masked
 * loads (lanes outside the run or on a padding row masked off: zeros) where the source step
 * is 1 or 2. Other steps copy element by element (narrow images through a table of every
 * pixel's source, gathered 16 at a time), and a 1x1 stride-1 window is its channels' pixels
 * (copied a run per image). A strided input gradient runs per phase of the destination
 * pixels (ph0 + s y, ph1 + s q): each a GEMM over the taps that reach that phase, so no zero
 * is multiplied; when one phase alone has taps (a strided 1x1), its epilogue also writes
 * the other phases' pixels (zeros, through the fused ops), a destination row at a time;
 * when all have taps, a task runs the phases (ph0, every ph1) side by side, each into its
 * own C, and their one epilogue writes whole destination rows. A stride-1 convolution of an
 * image small enough that its window overhangs it much runs per border class the same way:
 * ranges of destination rows and columns, each a GEMM over the taps that reach it (below).
 * Windows are staged row-major in f32 for the FMA microkernel (conv_stage.c); for
 * vdpbf16ps a bf16 window goes straight into bf16 pairs along K: pairs of window rows
 * (conv2d, input gradient: B), or of a window row's pixels (weight gradient: A, and dy^T's
 * rows paired alike); where the source image is 64 pixels or fewer and the destination 16
 * (4x4), a whole image at a time: its channel one vector, each tap's row (or pixel pairs) a
 * shuffle of it, where a row of 4 pixels took two masked loads and a masked store of 4 lanes.
 *
 * Tasks: (group, row block, column block); each stages and multiplies its K in chunks that
 * fit the caches, accumulating in an f32 block of C, then runs the epilogue over the block
 * (whose operands and results the last chunk's tiles prefetch as they go). Column blocks of conv2d
 * and its input gradient are whole rows of destination pixels (of one image or several), so the
 * epilogue and the staging need no division per pixel; their weights, packed for all of K, serve a
 * thread's consecutive tasks of one row block. */
#include <string.h>

#include "conv_internal.h"

enum {
    CV_COLS = 256,        /* columns (pixels, or a weight gradient's output channels) of a task */
    CV_ROWS = 256,        /* rows of a task at most (a weight gradient's: twice, to deal out
                           * its channels evenly) */
    CV_KC = 256,          /* K of a packed chunk (window rows; pixels for the weight gradient) */
    CV_TASKS_MIN = 4,     /* fewer tasks than this: split the rows */
    CV_TASKS_EVEN = 8,    /* an odd count below this: rows in twice the blocks (two threads
                           * shared 7 tasks 4 and 3: layer3's 3x3s at 14x14) */
    CV_TABLE_BELOW = 16,  /* destination rows narrower than this: stage through a table */
    CV_A_CACHE = 8 << 20, /* bytes of packed weights a thread keeps across its tasks */
    CV_PHASES_MAX = 16,   /* phases of a strided input gradient, at most (else not phased) */
    CV_WIDE_MAX = 4,      /* phases along W run side by side in a task, at most */
};

/* An unphased epilogue of conv2d or its input gradient runs over a task's pixels of one
 * image in one loop, (y, q) as one group of its nest, when every value it reads or writes
 * (the nest's leaves, just planned) is contiguous from one row's end to the next row (no
 * transposed read, no pad split at a row): a row's loop of 7 to 56 pixels left its last
 * 7 or 8 to scalar code, a layer4 row all of it. Sets cp->flat. */
static void merge_pixels(kc *c, cv_plan *cp) {
    nest *ns = &cp->ns;
    if (cp->role == CV_GRAD_WEIGHT || ns->n_dims != 4 || ns->ext[2] == 1 || ns->ext[3] == 1 ||
        c->n_cuts > 0 || ns->dim_group[3] != ns->n_groups - 1 ||
        ns->dim_group[2] != ns->n_groups - 2)
        return;
    for (int32_t l = 0; l < c->s->n_leaves; l++) {
        const int64_t *S = c->s->leaves[l].s;
        if (S[2] != S[3] * ns->ext[3])
            return;
    }
    int32_t g2 = ns->dim_group[2];
    ns->g_last[g2] = 3;
    ns->g_ext[g2] *= ns->ext[3];
    ns->dim_group[3] = g2;
    ns->n_groups--;
    cp->flat = true;
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

/* A weight gradient's row blocks: whole input channels (KK rows each), about CV_ROWS rows, at
 * least CV_TASKS_MIN tasks, and an even count of tasks when there are few. Each task stages
 * its own columns of dy^T and rows of the window, so equal tasks in an odd count left a
 * thread idle for one task's time: l2's and l3's 3x3s ran 9 (12-25% slower than 8 or 10).
 * Where whole channels cannot be dealt out evenly (the stem's 3), one row block and two
 * column blocks (9.1 -> 6.3 ms, f32). And where dy is the bigger operand, the columns split
 * instead of the rows (below). Sets rows, and cols and nbn where the columns split. */
static void plan_gw_blocks(cv_plan *cp) {
    int64_t kk = cp->KK > 0 ? cp->KK : 1, cg = ceil_div(cp->M, kk), other = cp->G * cp->nbn;
    int64_t per = CV_ROWS / kk > 1 ? CV_ROWS / kk : 1; /* channels a block */
    int64_t nbm = ceil_div(cg, per);
    if (other * nbm < CV_TASKS_MIN && cp->M > 16) { /* blocks of 16 rows or more */
        int64_t want = ceil_div(CV_TASKS_MIN, other), most = cg / ceil_div(16, kk);
        most = most > 1 ? most : 1;
        nbm = want < most ? want : most;
    }
    int64_t ch = ceil_div(cg, nbm);
    nbm = ceil_div(cg, ch);
    if (other * nbm < CV_TASKS_EVEN && (other * nbm) % 2 == 1 && cp->M > 16) {
        /* one block fewer or more, of whole channels, none short by over a quarter */
        bool even = false;
        for (int64_t cand = nbm - 1; cand <= nbm + 1 && !even; cand += 2) {
            int64_t c2 = cand > 0 ? ceil_div(cg, cand) : 0;
            if (cand < 1 || ceil_div(cg, c2) != cand || cand * c2 - cg > c2 / 4 ||
                c2 * kk > 2 * CV_ROWS)
                continue;
            ch = c2, nbm = cand, even = true;
        }
        if (!even && other == cp->G && cp->NC >= 2 * MK_PANEL && cp->M <= 2 * CV_ROWS) {
            ch = cg;
            cp->cols = ceil_div(ceil_div(cp->NC, 2), MK_PANEL) * MK_PANEL;
            cp->nbn = ceil_div(cp->NC, cp->cols);
        }
    }
    cp->rows = ch * kk < cp->M ? ch * kk : cp->M;
    /* Each row block reads all of its columns' dy, each column block all of its rows' x: a
     * split of the rows re-reads dy, of the columns x. Where dy is the bigger (a 1x1 from 64
     * to 256 channels: 4 row blocks read 51 MB of dy from memory per step at batch 8,
     * 224x224, and ran at half their speed from the caches), the columns split instead. */
    double dyb = (double)cp->NC * (double)(cp->N * cp->OH * cp->OW);
    double xb = (double)cg * (double)(cp->N * cp->H * cp->W);
    int64_t nbc = ceil_div(CV_TASKS_MIN, cp->G);
    nbc = nbc > cp->nbn ? nbc : cp->nbn;
    int64_t cols = ceil_div(ceil_div(cp->NC, nbc), MK_PANEL) * MK_PANEL;
    nbc = ceil_div(cp->NC, cols);
    if (cp->M <= 2 * CV_ROWS && cols >= 2 * MK_PANEL && cols <= CV_COLS && (cp->G * nbc) % 2 == 0 &&
        dyb + (double)nbc * xb <
            0.9 * ((double)ceil_div(cp->M, cp->rows) * dyb + (double)cp->nbn * xb)) {
        cp->rows = cp->M;
        cp->cols = cols;
        cp->nbn = nbc;
    }
}

/* Columns that blocks of p pixel rows of dW pixels (all_rows of them, the last block
 * shorter) take in whole tiles. */
static int64_t padded_columns(int64_t all_rows, int64_t dW, int64_t p) {
    int64_t tile = p * dW <= MK_PANEL ? MK_PANEL : 2 * MK_PANEL, rest = all_rows % p;
    return all_rows / p * ceil_div(p * dW, tile) * tile + ceil_div(rest * dW, tile) * tile;
}

/* The pixel rows of a column block: of the sizes that make as many blocks as p_eq rows do,
 * up to CV_COLS columns, the one whose blocks waste the fewest columns in whole tiles (the
 * smallest of those).
 * Layer4's 56 rows of 7 pixels at 224x224 ran in two blocks of 28 rows, 196 columns each in
 * 224; in blocks of 32 and 24 (224 and 168 columns, in 224 and 192) its stride-2 3x3's forward
 * and its 1x1s' forwards and input gradients took 5-8% less time (one thread, Zen 4); in the
 * bf16 step (ABBA, three rounds) the kernels whose blocks changed 7% less against the rest. */
static int64_t fewest_columns(int64_t all_rows, int64_t dW, int64_t p_eq) {
    if (all_rows <= 0 || dW <= 0 || p_eq <= 0) /* an empty destination */
        return p_eq;
    int64_t nb = ceil_div(all_rows, p_eq), best = p_eq;
    int64_t cost = padded_columns(all_rows, dW, p_eq);
    for (int64_t p = p_eq + 1; p <= all_rows && ceil_div(all_rows, p) == nb && p * dW <= CV_COLS;
         p++) {
        int64_t c = padded_columns(all_rows, dW, p);
        if (c < cost)
            best = p, cost = c;
    }
    return best;
}

/* The blocks of the plan's GEMM (its shapes set). */
static void plan_blocks(const kc *c, cv_plan *cp) {
    int64_t prow = cp->role == CV_GRAD_WEIGHT ? CV_KC : CV_COLS, all_rows = cp->N * cp->dH;
    cp->pix_rows = (prow + cp->dW / 2) / (cp->dW > 0 ? cp->dW : 1);
    cp->pix_rows = cp->pix_rows < 1 ? 1 : cp->pix_rows > all_rows ? all_rows : cp->pix_rows;
    if (cp->role == CV_GRAD_WEIGHT) {
        /* K chunks: as many, of equal rows (layer4's 56 rows of 7 pixels ran in chunks of 37
         * and 19 rows, 1.3x slower than two of 28; layer3's 112 rows of 14 in six of 18 and
         * one of 4, 1.1x slower than seven of 16) */
        cp->pix_rows = ceil_div(all_rows, ceil_div(all_rows, cp->pix_rows));
        cp->cols = cp->NC < CV_COLS ? cp->NC : CV_COLS;
        cp->kc = cp->pix_rows * cp->dW;
        cp->nbk = ceil_div(all_rows, cp->pix_rows);
    } else {
        /* column blocks of equal rows too: layer4's 56 rows of 7 pixels ran in blocks of 37
         * and 19 rows (259 and 133 pixels, each padded to whole panels of 32), and layer3's 112
         * rows of 14 in six of 18 and one of 4; in two of 28 and seven of 16 rows their forwards
         * and input gradients took 0-8% less time on one thread (Zen 4), 3% in all */
        cp->pix_rows = ceil_div(all_rows, ceil_div(all_rows, cp->pix_rows));
        cp->pix_rows = fewest_columns(all_rows, cp->dW, cp->pix_rows);
        cp->cols = cp->pix_rows * cp->dW;
        /* chunks of about equal size up to 1.5 CV_KC (conv2 of the CNN's K = 288 in chunks
         * of 256 and 32 spent a pass over C on 32 rows of K); the input gradient's are whole
         * output channels (runs of KK), a border class's whole input channels */
        int64_t kch = ceil_div(cp->K, ceil_div(cp->K, CV_KC + CV_KC / 2));
        if ((cp->role == CV_GRAD_INPUT || cp->phased) && cp->KK > 0)
            kch = ceil_div(kch, cp->KK) * cp->KK;
        cp->kc = kch < cp->K ? kch : cp->K;
        cp->nbk = ceil_div(cp->K, cp->kc);
    }
    cp->nbn =
        cp->role == CV_GRAD_WEIGHT ? ceil_div(cp->NC, cp->cols) : ceil_div(all_rows, cp->pix_rows);
    if (cp->role == CV_GRAD_WEIGHT) {
        plan_gw_blocks(cp);
    } else {
        cp->rows = cp->M < CV_ROWS ? cp->M : CV_ROWS;
        int64_t tasks = cp->G * cp->nbn * ceil_div(cp->M, cp->rows);
        if ((tasks < CV_TASKS_MIN || (tasks < CV_TASKS_EVEN && tasks % 2 == 1)) && cp->M > 16) {
            int64_t nbm = tasks < CV_TASKS_MIN ? ceil_div(CV_TASKS_MIN, cp->G * cp->nbn)
                                               : 2 * ceil_div(cp->M, cp->rows);
            int64_t r = ceil_div(ceil_div(cp->M, nbm), 16) * 16;
            cp->rows = r < cp->rows ? r : cp->rows;
        }
    }
    if (cp->rows < 1)
        cp->rows = 1;
    cp->nbm = ceil_div(cp->M, cp->rows);
    cg_mk *m = &cp->mk;
    cg_mk_shape(m, cp->cols);
    m->pk = is_16(cp->dt) && cg_mk_pairs(cp->dt) ? 2 : 1;
    m->kp = ceil_div(cp->kc, m->pk);
    m->nbp = ceil_div(cp->cols, m->nv * MK_PANEL) * m->nv * MK_PANEL;
    m->b_ld = cv_row_ld(m->nbp);
    /* rows narrower than this copy faster through a table (its i32 offsets must fit) */
    /* a window row is its channel's pixels: a 1x1 of stride 1 without padding, or the one
     * phase of a strided 1x1's input gradient that its tap reaches, on dy's own grid */
    if (cp->phased)
        cp->identity = cp->KK == 1 && cp->off[0][0] == 0 && cp->off[1][0] == 0 &&
                       cp->dH == cp->sH && cp->dW == cp->sW;
    else
        cp->identity = cp->KH == 1 && cp->KW == 1 && cp->st[0] == 1 && cp->st[1] == 1 &&
                       cp->pd[0] == 0 && cp->pd[1] == 0;
    cp->pairs_win = cv_window_pairs_ok(c, cp);
    cp->img_win = cv_window_img_ok(cp) || cv_window_kpairs_img_ok(cp);
    if (cp->pairs_win && cp->role == CV_GRAD_WEIGHT) /* whole pixel rows of pairs */
        m->kp = cp->pix_rows * ceil_div(cp->dW, 2);
    cp->lanes_win = !cp->pairs_win && cv_window_lanes_ok(cp);
    cp->tab = !cp->identity && !cp->pairs_win && !cp->lanes_win &&
              (cp->phased || (cp->dW < CV_TABLE_BELOW && table_fits(c, cp)));
    cp->ldt = cp->role == CV_GRAD_WEIGHT ? cp->kc : cp->cols;
    cp->mbp = ceil_div(cp->rows, m->mr) * m->mr;
    cp->a_cache =
        cp->role != CV_GRAD_WEIGHT && cp->nbn > 1 && cp->mbp * m->kp * cp->nbk * 4 <= CV_A_CACHE;
}

/* The GEMM of a phase or border class whose taps (ntap, tap, off) are set: dH x dW pixels. */
static void plan_taps(const kc *c, cv_plan *cp, int64_t dH, int64_t dW) {
    cp->KH = cp->ntap[0], cp->KW = cp->ntap[1], cp->KK = cp->KH * cp->KW;
    cp->dH = dH, cp->dW = dW;
    cp->K = (cp->role == CV_GRAD_INPUT ? cp->Og : cp->Cg) * cp->KK;
    cp->NC = cp->N * cp->dH * cp->dW;
    plan_blocks(c, cp);
}

/* Phase (p0, p1) of a strided input gradient (plan_conv's plan in *cp): its taps, pixels and
 * GEMM. False when a window has more taps per phase than a phase holds. */
static bool plan_phase(const kc *c, cv_plan *cp, int64_t p0, int64_t p1) {
    int64_t ph[2] = {p0, p1}, k[2] = {cp->KH, cp->KW}, ext[2] = {cp->H, cp->W}, n[2];
    cp->phased = true;
    for (int a = 0; a < 2; a++) {
        cp->ph[a] = ph[a];
        cp->pst[a] = cp->st[a];
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
    plan_taps(c, cp, n[0], n[1]);
    return true;
}

/* Border classes. A stride-1 convolution of a small image multiplies padding wherever its
 * window overhangs the image: a 3x3 of padding 1 at 4x4 (ResNet-50's layer3 at 64x64) reads
 * 31% zeros, at 2x2 (layer4) 56%. Along each axis its destination splits into ranges of
 * rows (columns) that the same taps reach (for that 3x3: the first, the middle ones, the
 * last), and each class, a range of rows by a range of columns, is a GEMM over only its
 * taps, as a strided input gradient's phases are (destination step 1 instead of the
 * stride). Each class packs the weights of its own taps, 16 taps' worth for every 9 at 2x2,
 * 49 at 4x4, which costs what the zeros did unless the packing is cheap. On a Zen 4 (one
 * thread, batch 32, bf16 pairs) the classes of a 2x2 whose pairs load straight from w
 * (cv_pack_weight_pairs) took 3.7 ms against the direct kernel's 5.2; a 4x4's nine classes
 * 5.3 against 4.4, and f32's (staged tap by tap) 12.5 against 6.8 at 4x4. So by default
 * only where half the taps are padding and the weights pair from w, and the convolution does
 * not run by taps (conv_taps.c, which skips the padding pixel by pixel with the weights
 * packed once: those 2x2s in 1.0 ms against the classes' 2.0, on two threads);
 * LOOM_CONV=border takes them wherever a quarter are (to compare, and for the tests). */
enum { BORDER_WASTE_PCT = 25, BORDER_WASTE_AUTO_PCT = 50 };

/* Along axis a, the source coordinate of tap t at destination coordinate d is d + off. */
static int64_t border_off(const cv_plan *cp, int a, int64_t t) {
    int64_t k = t * cp->dl[a];
    return cp->dst_big ? cp->pd[a] - k : k - cp->pd[a];
}

/* The border classes along axis a: [cut[i], cut[i + 1]) for i < the count returned, where
 * some tap starts or stops reaching the source; in *valid the taps' reach summed over the
 * destination (its extent times the taps where nothing is padding). */
static int border_cuts(const cv_plan *cp, int a, int64_t cut[2 * CV_TAPS_MAX + 2], int64_t *valid) {
    int64_t D = a == 0 ? cp->dH : cp->dW, S = a == 0 ? cp->sH : cp->sW;
    int64_t k = a == 0 ? cp->KH : cp->KW;
    int n = 0;
    cut[n++] = 0;
    cut[n++] = D;
    *valid = 0;
    for (int64_t t = 0; t < k; t++) {
        int64_t o = border_off(cp, a, t);
        int64_t lo = -o < 0 ? 0 : -o > D ? D : -o, hi = S - o < 0 ? 0 : S - o > D ? D : S - o;
        *valid += hi > lo ? hi - lo : 0;
        cut[n++] = lo;
        cut[n++] = hi;
    }
    return cg_sort_unique(cut, n) - 1;
}

/* Border class [lo[0], hi[0]) x [lo[1], hi[1]) of the destination (plan_conv's plan in
 * *cp): its taps, pixels and GEMM. False when it has more taps along an axis than a phase
 * holds. */
static bool plan_border(const kc *c, cv_plan *cp, const int64_t *lo, const int64_t *hi) {
    int64_t k[2] = {cp->KH, cp->KW}, S[2] = {cp->sH, cp->sW};
    cp->phased = true;
    for (int a = 0; a < 2; a++) {
        cp->ph[a] = lo[a];
        cp->pst[a] = 1;
        cp->ntap[a] = 0;
        for (int64_t t = 0; t < k[a]; t++) {
            int64_t o = border_off(cp, a, t);
            if (lo[a] + o < 0 || hi[a] - 1 + o >= S[a])
                continue; /* the class's cuts make a tap reach all of it or none */
            if (cp->ntap[a] == CV_TAPS_MAX)
                return false;
            cp->tap[a][cp->ntap[a]] = t;
            cp->off[a][cp->ntap[a]++] = lo[a] + o;
        }
    }
    plan_taps(c, cp, hi[0] - lo[0], hi[1] - lo[1]);
    return true;
}

/* The border classes of a stride-1 conv2d or input gradient (cps[0]'s plan) into cps[1..]
 * where their zeros are worth skipping: their count, else 0. */
static int32_t plan_borders(const kc *c, cv_plan *cps) {
    const cv_plan *cp = cps;
    cg_conv_mode mode = loom_cg_conv_mode();
    bool forced = mode == CG_CONV_BORDER;
    int64_t pct = forced ? BORDER_WASTE_PCT : BORDER_WASTE_AUTO_PCT;
    if (mode == CG_CONV_DIRECT || cp->role == CV_GRAD_WEIGHT || cp->st[0] != 1 || cp->st[1] != 1 ||
        cp->KK <= 1 || cp->KH > CV_TAPS_MAX || cp->KW > CV_TAPS_MAX || cp->dH <= 0 || cp->dW <= 0 ||
        !table_fits(c, cp))
        return 0;
    int64_t cut[2][2 * CV_TAPS_MAX + 2], valid[2];
    int nc[2] = {border_cuts(cp, 0, cut[0], &valid[0]), border_cuts(cp, 1, cut[1], &valid[1])};
    double all = (double)cp->KK * (double)cp->dH * (double)cp->dW;
    if (nc[0] * nc[1] > CV_PHASES_MAX ||
        (double)valid[0] * (double)valid[1] > all * (double)(100 - pct) / 100)
        return 0;
    int32_t n = 0;
    for (int i = 0; i < nc[0]; i++)
        for (int j = 0; j < nc[1]; j++) {
            int64_t lo[2] = {cut[0][i], cut[1][j]}, hi[2] = {cut[0][i + 1], cut[1][j + 1]};
            cps[1 + n] = *cp;
            if (!plan_border(c, &cps[1 + n], lo, hi) ||
                (!forced && !cv_weight_pairs_ok(c, &cps[1 + n])))
                return 0;
            n++;
        }
    return n;
}

/* The task's buffers (sized for every phase's blocks); C and the weights' cache once per
 * phase run side by side. */
typedef struct cv_bufs {
    MlirValue ap, bp, stg, stga, tab, rtab, img;
    MlirValue cs[CV_WIDE_MAX];
    MlirValue row; /* cv_emit_epilogue's, or NULL */
    /* a_cache: the packed weights, and whose they are (tag, row block): one per phase run
     * side by side (slot), or, where a_by_tag, one per phase (tag) */
    MlirValue afull[CV_PHASES_MAX], akey[CV_PHASES_MAX];
    bool a_by_tag;
} cv_bufs;

/* Stages the weights' rows [i0, i1) x K [k0, k1) as A at ap[base] (paired through stga). */
static void pack_weights(kc *c, const cv_plan *cp, const cv_bufs *u, MlirValue ap, MlirValue base,
                         MlirValue g, MlirValue i0, MlirValue i1, MlirValue k0, MlirValue k1) {
    const cg_mk *m = &cp->mk;
    if (cv_weight_pairs_ok(c, cp)) {
        cv_pack_weight_pairs(c, cp, ap, base, g, i0, i1, k0, k1);
        return;
    }
    if (m->pk == 1) {
        cv_stage_weights(c, cp, ap, base, m->kp, g, i0, i1, k0, k1);
        return;
    }
    cv_stage_weights(c, cp, u->stga, cg_idx(c->b, 0), m->kp * m->pk, g, i0, i1, k0, k1);
    cv_pair_up(c, u->stga, ap, base, cp->mbp * m->kp);
}

enum { CV_PF_MAX = 8 }; /* tensors a block's epilogue prefetches */

/* What the epilogue of a task's block reads and writes in the destination's layout (the
 * root's shape: a residual's addend, a ReLU mask's source, the results), prefetched tile by
 * tile into L2 while its last K chunk is multiplied, so that the traffic overlaps the
 * multiply-adds instead of following them. A tile of 8 rows x 32 columns prefetches those
 * rows' lines of its columns. The input gradients of ResNet-50's layer1 1x1s with the
 * residual add and ReLU mask fused (bf16, batch 8, 224x224), over 11 steps: 27-31 -> 19-23
 * ms each; f32's, whose products are twice as long, do not change. */
typedef struct cv_pf {
    const cv_plan *cp;
    int32_t n;
    MlirValue mem[CV_PF_MAX];
    bool write[CV_PF_MAX];
    int64_t step[CV_PF_MAX]; /* elements per cache line */
    /* a column (y, q) of the plan's destination grid covers the destination's rows
     * y sy + a + oy for a in [0, ny) and its pixels from q sx on, sx at a time */
    int64_t ny, sy, oy, sx;
    MlirValue g, i0, c0, last; /* last: whether this is the last K chunk (NULL: it is) */
} cv_pf;

/* The lines of tile (jt, it)'s rows and first columns in each of pf's tensors. */
static void emit_prefetch(kc *c, const void *arg, MlirValue jt, MlirValue it) {
    const cv_pf *pf = arg;
    const cv_plan *cp = pf->cp;
    cg_b *b = c->b;
    cg_if f;
    if (!mlirValueIsNull(pf->last))
        cg_if_begin(b, &f, pf->last);
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    int64_t nr = cp->mk.nv * MK_PANEL, H = root->shape[2], W = root->shape[3], hw = H * W;
    MlirValue col = cg_imul_c(b, jt, nr);
    MlirValue pr = cg_iadd(b, pf->c0, idiv(b, col, cp->dW));
    MlirValue q = cg_imul_c(b, irem(b, col, cp->dW), pf->sx);
    MlirValue y = cg_iadd(b, cg_imul_c(b, irem(b, pr, cp->dH), pf->sy), cg_idx(b, pf->oy));
    MlirValue ch =
        cg_iadd(b, cg_iadd(b, cg_imul_c(b, pf->g, cp->M), pf->i0), cg_imul_c(b, it, cp->mk.mr));
    MlirValue img = cg_iadd(b, cg_imul_c(b, idiv(b, pr, cp->dH), root->shape[1]), ch);
    MlirValue base = cg_iadd(b, cg_imul_c(b, img, hw), cg_iadd(b, cg_imul_c(b, y, W), q));
    MlirValue end = cg_idx(b, loom_ir_numel(root->rank, root->shape) - 1);
    for (int64_t r = 0; r < cp->mk.mr; r++)
        for (int64_t a = 0; a < pf->ny; a++) {
            MlirValue at = cg_iadd(b, base, cg_idx(b, r * hw + a * W));
            for (int32_t k = 0; k < pf->n; k++)
                for (int64_t l = 0; l < nr * pf->sx; l += pf->step[k])
                    cg_prefetch(b, pf->mem[k], cg_imin(b, cg_iadd(b, at, cg_idx(b, l)), end),
                                pf->write[k], false);
        }
    if (!mlirValueIsNull(pf->last))
        cg_if_end(b, &f);
}

/* The product of a task's block of plan cp into C (u->cs[slot], with the weights' cache of
 * that slot; tag: the plan's index among the kernel's). */
static void emit_product(kc *c, const cv_plan *cp, const cv_bufs *u, int32_t slot, int32_t tag,
                         MlirValue gi, MlirValue gib, MlirValue i0, MlirValue i1, MlirValue c0,
                         MlirValue c1, MlirValue ncols, const cv_pf *pf) {
    cg_b *b = c->b;
    const cg_mk *m = &cp->mk;
    bool gw = cp->role == CV_GRAD_WEIGHT;
    int64_t ld = m->kp * m->pk; /* row stride of A's staged rows */
    int32_t as = u->a_by_tag ? tag : slot;
    MlirValue zf = cg_cf(b, b->f32, 0.0), cs = u->cs[slot], afull = u->afull[as];
    if (cp->tab && !gw)
        cv_build_table(c, cp, u->tab, cp->ldt, c0, c1);
    else if (!gw && !cp->identity && !cp->img_win)
        cv_build_rows(c, cp, u->rtab, c0, c1);
    int64_t a_chunk = cp->mbp * m->kp;
    if (cp->a_cache) { /* all of K's weights, unless this thread's last task packed them */
        MlirValue key =
            cg_conv(b, "arith.index_cast", cg_iadd(b, cg_idx(b, (int64_t)tag << 40), gib), b->i64);
        cg_if f;
        cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, u->akey[as], cg_idx(b, 0)), key));
        cg_for la;
        cg_for_begin(b, &la, cg_idx(b, 0), cg_idx(b, cp->nbk), 0, NULL);
        MlirValue k0 = cg_imul_c(b, la.iv, cp->kc);
        MlirValue k1 = cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->kc)), cg_idx(b, cp->K));
        pack_weights(c, cp, u, afull, cg_imul_c(b, la.iv, a_chunk), gi, i0, i1, k0, k1);
        cg_for_end(b, &la, 0, NULL);
        cg_store(b, key, u->akey[as], cg_idx(b, 0));
        cg_if_end(b, &f);
    }
    /* bf16 windows read as pairs of rows straight into B (no f32 copy): a 1x1's channels, or
     * through masked loads */
    bool runs_pairs =
        !gw && cp->identity && m->pk == 2 && c->g->nodes[cp->win].dtype == LOOM_DTYPE_BF16;
    bool pairs_direct = runs_pairs || (!gw && cp->pairs_win);
    /* the weight gradient's bf16 dy^T likewise, paired as its window's pixels are */
    bool dy_pairs = gw && cp->pairs_win && c->g->nodes[cp->plain].dtype == LOOM_DTYPE_BF16;
    cg_for lk;
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, cp->nbk), 0, NULL);
    if (gw) { /* K chunk: destination pixel rows [k0, k1) */
        MlirValue k0 = cg_imul_c(b, lk.iv, cp->pix_rows);
        MlirValue k1 =
            cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->pix_rows)), cg_idx(b, cp->N * cp->dH));
        if (cp->img_win) {
            cv_stage_window_kpairs_img(c, cp, u->ap, gi, i0, i1, k0, k1);
        } else if (cp->pairs_win) {
            cv_build_rows(c, cp, u->rtab, k0, k1);
            cv_stage_window_kpairs(c, cp, u->ap, u->rtab, gi, i0, i1, k0, k1);
        } else if (cp->lanes_win) {
            cv_build_rows(c, cp, u->rtab, k0, k1);
            cv_stage_window_lanes(c, cp, u->stga, ld, ld, u->rtab, gi, i0, i1, k0, k1);
        } else if (cp->identity) {
            cv_stage_runs(c, cp, u->stga, ld, ld, gi, i0, i1, k0, k1);
        } else if (cp->tab) {
            cv_build_table(c, cp, u->tab, cp->ldt, k0, k1);
            cv_stage_window_tab(c, cp, u->stga, ld, ld, u->tab, cp->ldt, gi, i0, i1,
                                cg_imul_c(b, isub(b, k1, k0), cp->dW));
        } else {
            cv_build_rows(c, cp, u->rtab, k0, k1);
            cv_stage_window(c, cp, u->stga, ld, ld, u->rtab, gi, i0, i1, k0, k1);
        }
        if (!cp->pairs_win) {
            cv_zero_rows(b, u->stga, isub(b, i1, i0), cp->mbp, ld, zf);
            if (m->pk == 2)
                cv_pair_up(c, u->stga, u->ap, cg_idx(b, 0), cp->mbp * m->kp);
        }
        if (dy_pairs)
            cv_stage_dy_t_kpairs(c, cp, u->bp, gi, c0, c1, k0, k1);
        else
            cv_stage_dy_t(c, cp, u->stg, gi, c0, c1, k0, k1);
    } else { /* K chunk: window rows [k0, k1) */
        MlirValue k0 = cg_imul_c(b, lk.iv, cp->kc);
        MlirValue k1 = cg_imin(b, cg_iadd(b, k0, cg_idx(b, cp->kc)), cg_idx(b, cp->K));
        if (!cp->a_cache)
            pack_weights(c, cp, u, u->ap, cg_idx(b, 0), gi, i0, i1, k0, k1);
        if (runs_pairs)
            cv_stage_runs_pairs(c, cp, u->bp, gi, k0, k1, c0, c1);
        else if (cp->img_win)
            cv_stage_window_pairs_img(c, cp, u->bp, u->img, gi, k0, k1, c0, c1);
        else if (cp->pairs_win)
            cv_stage_window_pairs(c, cp, u->bp, u->rtab, gi, k0, k1, c0, c1);
        else if (cp->lanes_win)
            cv_stage_window_lanes(c, cp, u->stg, m->b_ld, m->nbp, u->rtab, gi, k0, k1, c0, c1);
        else if (cp->identity)
            cv_stage_runs(c, cp, u->stg, m->b_ld, m->nbp, gi, k0, k1, c0, c1);
        else if (cp->tab)
            cv_stage_window_tab(c, cp, u->stg, m->b_ld, m->nbp, u->tab, cp->ldt, gi, k0, k1, ncols);
        else
            cv_stage_window(c, cp, u->stg, m->b_ld, m->nbp, u->rtab, gi, k0, k1, c0, c1);
        if (!pairs_direct)
            cv_zero_rows(b, u->stg, isub(b, k1, k0), m->kp * m->pk, m->b_ld, zf);
    }
    if (m->pk == 2 && !pairs_direct && !dy_pairs)
        cv_panelize(c, cp, u->stg, u->bp);
    MlirValue a0 = cp->a_cache ? cg_imul_c(b, lk.iv, a_chunk) : cg_idx(b, 0);
    cv_pf pfl;
    cg_mk_hook hook = {emit_prefetch, &pfl};
    if (pf) {
        pfl = *pf;
        if (cp->nbk > 1)
            pfl.last = cg_cmpi(b, CG_I_EQ, lk.iv, cg_idx(b, cp->nbk - 1));
    }
    /* the first K chunk starts C (no zeroed C to load), the others add to it */
    bool chunks = cp->nbk > 1;
    MlirValue first = chunks ? cg_cmpi(b, CG_I_EQ, lk.iv, cg_idx(b, 0)) : (MlirValue){NULL};
    cg_mk_tiles(c, m, cp->a_cache ? afull : u->ap, a0, m->pk == 2 ? u->bp : u->stg, cs,
                isub(b, i1, i0), ncols, chunks, first, pf ? &hook : NULL);
    cg_for_end(b, &lk, 0, NULL);
}

/* The phases along W whose pixels a destination row of plan cp's epilogue writes: st[1]
 * where they run side by side (wide) or one spreads over the others, else 1. */
static int64_t row_phases(const cv_plan *cp, int32_t wide) {
    return wide > 1 || cp->spread ? cp->st[1] : 1;
}

/* One task of plan cps[0], or of the `wide` phases cps[0..wide) side by side, which share
 * their blocks (tag: the first plan's index among the kernel's): t = (g * nbm + ib) * nbn +
 * jb for conv2d and the input gradient (a row block's tasks are consecutive, sharing its
 * weights), (g * nbn + jb) * nbm + ib for the weight gradient. */
static loom_status emit_task(kc *c, const cv_plan *cps, int32_t wide, const cv_bufs *u, MlirValue t,
                             int32_t tag) {
    cg_b *b = c->b;
    const cv_plan *cp = cps;
    bool gw = cp->role == CV_GRAD_WEIGHT;
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
    /* C per phase along W that the epilogue writes (NULL: no tap reaches it, zeros) */
    MlirValue cs[CV_PHASES_MAX] = {{NULL}};
    int64_t nw = row_phases(cp, wide);
    cv_pf pf = {.cp = cp, .g = gi, .i0 = i0, .c0 = c0, .ny = 1, .sy = 1, .sx = 1};
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    if (cp->phased) { /* every phase's pixels along W; along H too where spread */
        pf.sy = cp->pst[0], pf.sx = cp->pst[1];
        pf.ny = cp->spread ? cp->st[0] : 1;
        pf.oy = cp->spread ? 0 : cp->ph[0];
    }
    /* not a weight gradient's (its dw is small) nor one phase's among others (its pixels,
     * every st-th, would be fetched once per phase) */
    bool want = !gw && (!cp->phased || nw > 1);
    for (int32_t q = 0; want && q < c->k->n_args + c->k->n_results; q++) {
        bool res = q >= c->k->n_args;
        int32_t id = res ? c->k->results[q - c->k->n_args] : c->k->args[q];
        const loom_ir_node *n = &c->g->nodes[id];
        if (id == root->inputs[0] || id == root->inputs[1] || !same_shape(n, root) ||
            pf.n == CV_PF_MAX)
            continue;
        pf.mem[pf.n] = c->bufs[res ? c->s->res_of[id] : c->s->buf_of[id]];
        pf.write[pf.n] = res;
        pf.step[pf.n++] = 64 / (int64_t)loom_dtype_size(n->dtype);
    }
    for (int32_t w = 0; w < wide; w++) {
        if (cps[w].K == 0)
            continue;
        emit_product(c, &cps[w], u, w, tag + w, gi, gib, i0, i1, c0, c1, ncols,
                     pf.n > 0 && w == wide - 1 ? &pf : NULL);
        cs[wide > 1 ? w : cp->spread ? cp->ph[1] : 0] = u->cs[w];
    }
    if (gw) { /* C is read even with no K (an empty batch's weight gradient: zeros) */
        if (cp->K == 0)
            cv_zero_rows(b, u->cs[0], cg_idx(b, 0), cp->mbp, cp->mk.nbp, cg_cf(b, b->f32, 0.0));
        cs[0] = u->cs[0];
    }
    return cp->n_epi > 0 ? cv_emit_epilogue(c, cp, cs, nw, u->row, gi, i0, i1, c0, c1) : LOOM_OK;
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static int64_t tasks_of(const cv_plan *cp) {
    return cp->G * cp->nbm * cp->nbn;
}

/* Whether each run of `wide` phases (a, 0..wide) of the n_ph in run[] shares its blocks, so
 * that they can run side by side in one task, into C buffers of one layout. */
static bool side_by_side(const cv_plan *run, int32_t n_ph, int32_t wide) {
    if (n_ph % wide != 0)
        return false;
    for (int32_t q = 0; q < n_ph; q++) {
        const cv_plan *a = &run[q], *l = &run[q - q % wide];
        if (a->K == 0 || a->nbm != l->nbm || a->nbn != l->nbn || a->rows != l->rows ||
            a->pix_rows != l->pix_rows || a->mbp != l->mbp || a->mk.nbp != l->mk.nbp ||
            a->ph[0] != l->ph[0])
            return false;
    }
    return true;
}

loom_status cg_lower_conv(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 2)
        return cg_bad_plan(c, root_id, "a convolution without two operands");
    /* cps[0]: the convolution's plan; a strided input gradient's phases in cps[1..] */
    size_t bytes = (1 + CV_PHASES_MAX) * sizeof(cv_plan);
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
    bool taps = cv_taps_ok(c, cp);
    if (!taps && cp->role == CV_GRAD_INPUT && (cp->st[0] > 1 || cp->st[1] > 1) &&
        cp->st[0] * cp->st[1] <= CV_PHASES_MAX && table_fits(c, cp)) {
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
    } else if (!taps && !cv_wino_ok(c, cp)) {
        n_ph = plan_borders(c, cps);
    }
    if ((st = cg_plan_epilogue(c, &cp->ns, cp->epi, &cp->n_epi, -1)) != LOOM_OK)
        goto done;
    if (n_ph == 0)
        merge_pixels(c, cp);
    for (int32_t q = 1; q <= n_ph; q++) { /* the epilogue is the same in every phase */
        cps[q].ns = cp->ns;
        cps[q].n_epi = cp->n_epi;
        memcpy(cps[q].epi, cp->epi, sizeof cp->epi);
    }
    if (taps) { /* a small image's 3x3 by taps */
        cv_taps_plan(c, cp);
        if (c->emit && loom_ir_numel(root->rank, root->shape) > 0)
            st = cv_taps_emit(c, cp);
        goto done;
    }
    if (n_ph == 0 && cv_wino_ok(c, cp)) { /* a stride-1 3x3 by Winograd */
        cv_wino wn;
        cv_wino_plan(cp, &wn);
        bool any = loom_ir_numel(root->rank, root->shape) > 0;
        c->extent = any ? tasks_of(cp) : 1;
        int64_t mults = cp->rows * cp->cols * cp->K; /* the direct form's; F(4x4): 1/4 */
        c->grain = cg_grain_for(wn.m == 4 ? mults / 4 : mults * 4 / 9);
        if (c->emit && any)
            st = cv_wino_emit(c, cp, &wn);
        goto done;
    }
    /* the plans that run: the convolution's, or its phases' one after the other; or the one
     * phase with taps when the others, all as large, are zeros (a strided 1x1): its
     * epilogue spreads over them, one pass over dx by whole rows instead of a pass per phase
     * at the phase's stride (ResNet-50's layer2 downsample with the residual add and ReLU
     * mask fused, bf16 at batch 8: 6.4 -> 4.6 ms; the product alone takes 2.7). Not border
     * classes (stride 1), whose classes without taps, where the padding reaches past the
     * window, are ranges of pixels, not phases: each writes its zeros through its own
     * epilogue. */
    cv_plan *run = n_ph > 0 ? cps + 1 : cps;
    int32_t n_run = n_ph > 0 ? n_ph : 1, n_taps = 0, tap_phase = 0, wide = 1;
    bool even = true;
    for (int32_t q = 0; q < n_ph; q++) {
        n_taps += cps[1 + q].K > 0;
        tap_phase = cps[1 + q].K > 0 ? q : tap_phase;
        even = even && cps[1 + q].dH == cps[1].dH && cps[1 + q].dW == cps[1].dW;
    }
    if (n_ph > 1 && n_taps == 1 && even && (cp->st[0] > 1 || cp->st[1] > 1)) {
        run = cps + 1 + tap_phase;
        run->spread = true;
        n_run = 1;
    } else if (n_ph > 1 && even && cp->st[1] > 1 && cp->st[1] <= CV_WIDE_MAX &&
               cp->role == CV_GRAD_INPUT && side_by_side(run, n_ph, (int32_t)cp->st[1])) {
        /* Side by side: a task runs the phases (a, b) of every b for its block, each into
         * its own C, and the epilogue writes whole destination rows (a row's pixels of one
         * phase alone are every st[1]-th, stored one by one), each row once. ResNet-50's
         * 3x3 of stride 2 at 56x56 with the ReLU mask fused, over 11 steps at batch 8:
         * bf16 47 / 45 -> 40 / 39 ms, f32 129 / 100 -> 75 / 72 ms. */
        wide = (int32_t)cp->st[1];
        n_run = n_ph / wide;
    }
    /* Phases' tasks interleave: task (g, ib, jb, q) of phase q, each phase over the largest
     * nbm and nbn (past its own: no work), so that the contiguous range of tasks the pool
     * gives a thread holds every phase's share of every row block's columns, and each phase
     * keeps its own packed weights (a_cache, a_by_tag), which a thread's next task of that
     * phase and row block reuses. In the order (g, ib, q, jb), with one row block, one
     * thread took the rows of one phase and the other those of the next: a 3x3 of stride 2
     * has 1 row tap in one and 2 in the other, and layer2's input gradient at 56x56 left a
     * thread idle a fifth of the time (in phase order, a strided 1x1's phase with taps went
     * to one thread and its zeros to the other: 2x slower). Where the phases' weights would
     * not all fit the cache, (g, ib, q, jb), sharing one cache. */
    int64_t numel = loom_ir_numel(root->rank, root->shape), nbm_max = 0, nbn_max = 0, work = 0;
    bool zero_phase = false;
    for (int32_t q = 0; q < n_run; q++) {
        const cv_plan *r = &run[q * wide];
        nbm_max = max64(nbm_max, r->nbm);
        nbn_max = max64(nbn_max, r->nbn);
        int64_t k = 0;
        for (int32_t w = 0; w < wide; w++) {
            zero_phase = zero_phase || r[w].K == 0;
            k += r[w].K;
        }
        work = max64(work, r->rows * r->cols * (k > 0 ? k : 1));
    }
    int64_t tasks = n_run == 1 ? tasks_of(&run[0]) : cp->G * nbm_max * n_run * nbn_max;
    c->extent = numel > 0 && tasks > 0 ? tasks : 1;
    c->grain = cg_grain_for(work);
    if (!c->emit || numel == 0)
        goto done;

    cg_b *b = c->b;
    /* buffers for the largest blocks of any plan that runs */
    int64_t n_ap = 0, n_bp = 0, n_cs = 0, n_stg = 0, n_stga = 0, n_tab = 0, n_afull = 0, n_rtab = 0,
            n_img = 0, n_row = 0;
    for (int32_t q = 0; q < n_run * wide; q++) {
        const cv_plan *r = &run[q];
        const cg_mk *m = &r->mk;
        n_ap = max64(n_ap, r->mbp * m->kp);
        n_bp = max64(n_bp, m->kp * m->b_ld);
        n_cs = max64(n_cs, r->mbp * m->nbp);
        n_stg = max64(n_stg, m->kp * m->pk * m->b_ld);
        n_stga = max64(n_stga, r->mbp * m->kp * m->pk);
        n_tab = max64(n_tab, r->tab ? r->KK * r->ldt : 0);
        n_rtab =
            max64(n_rtab,
                  r->tab || r->img_win || (r->identity && !r->pairs_win) ? 0 : r->KH * r->pix_rows);
        n_afull = max64(n_afull, r->a_cache ? r->mbp * m->kp * r->nbk : 0);
        n_img = max64(n_img, r->img_win && r->role != CV_GRAD_WEIGHT ? cv_img_taps_len(r) : 0);
        n_row = max64(n_row, cv_row_len(r, row_phases(r, wide)));
    }
    bool pairs = cp->mk.pk == 2;
    cv_bufs u;
    int32_t n_aslots = n_run * wide;
    u.a_by_tag = n_run > 1 && n_afull * 4 * n_aslots <= CV_A_CACHE;
    if (!u.a_by_tag)
        n_aslots = wide;
    u.ap = cg_alloc_buf(b, pairs ? b->i32 : b->f32, n_ap);
    u.bp = pairs ? cg_alloc_buf(b, b->i32, n_bp) : u.ap;
    for (int32_t w = 0; w < wide; w++)
        u.cs[w] = cg_alloc_buf(b, b->f32, n_cs);
    /* staged operands (f32): B's rows (windows for conv2d and the input gradient, dy^T for
     * the weight gradient) and A's when they pair (else staged into ap itself) */
    u.stg = cg_alloc_buf(b, b->f32, n_stg);
    u.stga = pairs ? cg_alloc_buf(b, b->f32, n_stga) : u.ap;
    u.tab = n_tab > 0 ? cg_alloc_buf(b, b->i32, n_tab) : u.stg;
    u.rtab = n_rtab > 0 ? cg_alloc_buf(b, b->i64, n_rtab) : u.stg;
    u.img = n_img > 0 ? cg_alloc_buf(b, b->i16, n_img) : u.stg;
    u.row = n_row > 0 ? cg_alloc_buf(b, b->f32, n_row) : (MlirValue){NULL};
    for (int32_t a = 0; a < n_aslots; a++) {
        u.afull[a] = n_afull > 0 ? cg_alloc_buf(b, pairs ? b->i32 : b->f32, n_afull) : u.ap;
        u.akey[a] = cg_alloc_buf(b, b->i64, 1);
        cg_store(b, cg_ci(b, b->i64, -1), u.akey[a], cg_idx(b, 0));
    }
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    if (n_run == 1) {
        st = emit_task(c, run, wide, &u, lo.iv, 0);
    } else {
        MlirValue q, jb, gib, r;
        if (zero_phase || u.a_by_tag) { /* (g, ib, jb, q) */
            q = irem(b, lo.iv, n_run), r = idiv(b, lo.iv, n_run);
            jb = irem(b, r, nbn_max), gib = idiv(b, r, nbn_max);
        } else { /* (g, ib, q, jb) */
            jb = irem(b, lo.iv, nbn_max), r = idiv(b, lo.iv, nbn_max);
            q = irem(b, r, n_run), gib = idiv(b, r, n_run);
        }
        MlirValue gi = idiv(b, gib, nbm_max), ib = irem(b, gib, nbm_max);
        for (int32_t k = 0; k < n_run && st == LOOM_OK; k++) {
            const cv_plan *ph = &run[k * wide];
            if (tasks_of(ph) == 0)
                continue;
            cg_if f;
            MlirValue in = and_i1(b, cg_cmpi(b, CG_I_EQ, q, cg_idx(b, k)),
                                  and_i1(b, cg_cmpi(b, CG_I_ULT, ib, cg_idx(b, ph->nbm)),
                                         cg_cmpi(b, CG_I_ULT, jb, cg_idx(b, ph->nbn))));
            cg_if_begin(b, &f, in);
            MlirValue t =
                cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, gi, ph->nbm), ib), ph->nbn), jb);
            st = emit_task(c, ph, wide, &u, t, k * wide);
            cg_if_end(b, &f);
        }
    }
    cg_for_end(b, &lo, 0, NULL);
    MlirValue bufs[8] = {u.ap, u.stg, u.bp, u.stga, u.tab, u.rtab, u.img, u.row};
    bool own[8] = {true, true, pairs, pairs, n_tab > 0, n_rtab > 0, n_img > 0, n_row > 0};
    for (int q = 0; q < 8; q++)
        if (own[q])
            cg_op(b, "memref.dealloc", 1, &bufs[q], 0, NULL, 0, NULL);
    for (int32_t w = 0; w < wide; w++)
        cg_op(b, "memref.dealloc", 1, &u.cs[w], 0, NULL, 0, NULL);
    for (int32_t a = 0; a < n_aslots; a++) {
        cg_op(b, "memref.dealloc", 1, &u.akey[a], 0, NULL, 0, NULL);
        if (n_afull > 0)
            cg_op(b, "memref.dealloc", 1, &u.afull[a], 0, NULL, 0, NULL);
    }
done:
    loom_ir_free(&c->s->alloc, cps, bytes);
    return st;
}
