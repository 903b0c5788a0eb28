/* Convolution decomposition: codegen compiles conv2d and its gradients as convolution
 * kernels of their own (codegen/lower_conv.c) in f32, bf16 and f16; this pass rewrites the
 * others (f64), and every convolution when LOOM_CONV=im2col (to compare the two), into ops
 * codegen compiles: im2col built from a pad, KH*KW strided
 * slices and a concat, then one matmul (per group), for the forward; for the gradients the
 * graph that autograd derived from that im2col (matmul VJPs, the concat's slices, the
 * windows padded back and summed, i.e. col2im). CSE then merges the im2col that a forward
 * and its weight gradient both rebuild, so the step is the one the frontend recorded when
 * conv2d was composed of these ops (for the Fashion-MNIST CNN, node for node). The reference
 * interpreter runs the conv ops directly.
 *
 * Layouts (x [N,C,H,W], w [O,Cg,KH,KW], G groups, Cg = C/G, Og = O/G, L = N*OH*OW, KK =
 * KH*KW): with x as [C,N,H,W], window (i, j) is the strided slice [C,N,OH,OW] at (i*dil,
 * j*dil) of the padded x; the windows concatenate into cols [KK*C,N,OH,OW], which is
 * [KK,C,L] in memory, and w laid out as [O,KH,KW,Cg] matches it, so y = w [Og,KK*Cg] x cols
 * [KK*Cg,L] per group (grouped: cols regrouped to [G,KK*Cg,L], one more pass), then [O,N,OH,
 * OW] back to NCHW.
 *
 * Two neighbours of a conv are rewritten with it, because their layout decides the passes
 * over memory: loom_conv2d's bias add (conv2d + broadcast of [1,O,1,1]) goes into the
 * matmul's [O, L] result, where it fuses as the matmul's epilogue and where the transposes
 * around a following activation cancel; and the bias gradient (a sum of dy over N, H, W)
 * reads dy in the [O, L] layout that the gradients' matmuls read, so dy is materialized
 * once. In 16 bits the input gradient's window sum adds in f32 and rounds once, as oneDNN's
 * bf16 convolution backward accumulates (rounding after each of the KH*KW adds would also
 * cost more in fused code than the sum). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* Whether conv node n is rewritten here (else a convolution kernel computes it); all:
 * LOOM_CONV=im2col, read once per run. */
static bool decomposes(const loom_ir_node *n, bool all) {
    if (!loom_ir_op_traits(n->op)->im2col)
        return false;
    return all || (n->dtype != LOOM_DTYPE_F32 && n->dtype != LOOM_DTYPE_BF16 &&
                   n->dtype != LOOM_DTYPE_F16);
}

typedef struct cd_state {
    loom_ir_graph out;
    loom_ir_loc loc; /* of the conv node being rewritten */
    loom_ir_diag *d;
    loom_status st;
} cd_state;

static int32_t emit(cd_state *s, loom_ir_op op, int32_t n_in, const int32_t *in, loom_dtype dt,
                    int32_t rank, const int64_t *shape, const loom_ir_attrs *attrs) {
    if (s->st != LOOM_OK)
        return -1;
    for (int32_t k = 0; k < n_in; k++)
        if (in[k] < 0)
            return -1;
    loom_ir_node_desc desc = {.op = op,
                              .n_inputs = n_in,
                              .inputs = in,
                              .dtype = dt,
                              .rank = rank,
                              .shape = shape,
                              .loc = s->loc};
    if (attrs)
        desc.attrs = *attrs;
    int32_t id;
    s->st = loom_ir_graph_add(&s->out, &desc, &id, s->d);
    return s->st == LOOM_OK ? id : -1;
}

static const loom_ir_node *nd(const cd_state *s, int32_t x) {
    return &s->out.nodes[x];
}

static int32_t shaped(cd_state *s, loom_ir_op op, int32_t x, int32_t rank, const int64_t *shape) {
    return x < 0 ? -1 : emit(s, op, 1, &x, nd(s, x)->dtype, rank, shape, NULL);
}

static int32_t reshape(cd_state *s, int32_t x, int32_t rank, const int64_t *shape) {
    return shaped(s, LOOM_IR_OP_RESHAPE, x, rank, shape);
}

static int32_t transpose(cd_state *s, int32_t x, const int32_t *perm) {
    if (x < 0)
        return -1;
    loom_ir_attrs at = {0};
    memcpy(at.perm, perm, (size_t)nd(s, x)->rank * sizeof *perm);
    return emit(s, LOOM_IR_OP_TRANSPOSE, 1, &x, nd(s, x)->dtype, 0, NULL, &at);
}

/* Swaps the last two axes. */
static int32_t mT(cd_state *s, int32_t x) {
    if (x < 0)
        return -1;
    int32_t r = nd(s, x)->rank, perm[LOOM_MAX_RANK];
    for (int32_t i = 0; i < r; i++)
        perm[i] = i;
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return transpose(s, x, perm);
}

static int32_t matmul(cd_state *s, int32_t a, int32_t b) {
    int32_t in[2] = {a, b};
    return a < 0 ? -1 : emit(s, LOOM_IR_OP_MATMUL, 2, in, nd(s, a)->dtype, 0, NULL, NULL);
}

/* A slice (start, stride) or a pad (low, interior; fill 0) of x of rank 4 to `shape`. */
static int32_t moved(cd_state *s, loom_ir_op op, int32_t x, const int64_t *shape,
                     const int64_t *start, const int64_t *step) {
    if (x < 0)
        return -1;
    loom_ir_attrs at = {0};
    memcpy(at.start, start, 4 * sizeof *start);
    memcpy(at.step, step, 4 * sizeof *step);
    return emit(s, op, 1, &x, nd(s, x)->dtype, 4, shape, &at);
}

static int64_t numel(const cd_state *s, int32_t x) {
    return loom_ir_numel(nd(s, x)->rank, nd(s, x)->shape);
}

/* One convolution's extents. */
typedef struct conv_dims {
    int64_t n, c, h, w, o, kh, kw, oh, ow, g, cg, og, kk, l, hp, wp;
    loom_ir_conv cv;
} conv_dims;

static conv_dims dims_of(const int64_t *xs, const int64_t *ws, const int64_t *ys,
                         const loom_ir_conv *cv) {
    conv_dims d = {.n = xs[0],
                   .c = xs[1],
                   .h = xs[2],
                   .w = xs[3],
                   .o = ws[0],
                   .kh = ws[2],
                   .kw = ws[3],
                   .oh = ys[2],
                   .ow = ys[3],
                   .g = cv->groups,
                   .cv = *cv};
    d.cg = d.c / d.g;
    d.og = d.o / d.g;
    d.kk = d.kh * d.kw;
    d.l = d.n * d.oh * d.ow;
    d.hp = d.h + 2 * cv->padding[0];
    d.wp = d.w + 2 * cv->padding[1];
    return d;
}

static const int32_t SWAP01[4] = {1, 0, 2, 3};

/* im2col of x: cols as the matmul reads it, [KK*C, L] or [G, KK*Cg, L]. */
static int32_t im2col(cd_state *s, int32_t x, const conv_dims *d) {
    int32_t xt = transpose(s, x, SWAP01); /* [C,N,H,W] */
    const loom_ir_conv *cv = &d->cv;
    if (cv->padding[0] || cv->padding[1]) {
        loom_ir_attrs at = {.start = {0, 0, cv->padding[0], cv->padding[1]}};
        xt = emit(s, LOOM_IR_OP_PAD, 1, &xt, nd(s, x)->dtype, 4,
                  (const int64_t[]){d->c, d->n, d->hp, d->wp}, &at);
    }
    int32_t *win = loom_ir_alloc(&s->out.alloc, (size_t)d->kk * sizeof *win);
    if (!win) {
        s->st = loom_ir_diag_set(s->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < d->kh; i++)
        for (int64_t j = 0; j < d->kw; j++)
            win[i * d->kw + j] =
                moved(s, LOOM_IR_OP_SLICE, xt, (const int64_t[]){d->c, d->n, d->oh, d->ow},
                      (const int64_t[]){0, 0, i * cv->dilation[0], j * cv->dilation[1]},
                      (const int64_t[]){1, 1, cv->stride[0], cv->stride[1]});
    int32_t cols = win[0];
    if (d->kk > 1) {
        loom_ir_attrs at = {.index = 0};
        cols = emit(s, LOOM_IR_OP_CONCAT, (int32_t)d->kk, win, nd(s, x)->dtype, 0, NULL, &at);
    }
    loom_ir_free(&s->out.alloc, win, (size_t)d->kk * sizeof *win);
    if (d->g == 1)
        return reshape(s, cols, 2, (const int64_t[]){d->kk * d->c, d->l});
    cols = reshape(s, cols, 4, (const int64_t[]){d->kk, d->g, d->cg, d->l});
    cols = transpose(s, cols, SWAP01);
    return reshape(s, cols, 3, (const int64_t[]){d->g, d->kk * d->cg, d->l});
}

/* w as the matmul reads it: [O, KK*C] or [G, Og, KK*Cg]. */
static int32_t weight_matrix(cd_state *s, int32_t w, const conv_dims *d) {
    int32_t wt = transpose(s, w, (const int32_t[]){0, 2, 3, 1}); /* [O,KH,KW,Cg] */
    if (d->g == 1)
        return reshape(s, wt, 2, (const int64_t[]){d->o, d->kk * d->c});
    return reshape(s, wt, 3, (const int64_t[]){d->g, d->og, d->kk * d->cg});
}

/* dy [N,O,OH,OW] as the matmul's result gradient: [O, L] or [G, Og, L]. */
static int32_t dy_matrix(cd_state *s, int32_t dy, const conv_dims *d) {
    int32_t t = transpose(s, dy, SWAP01);
    if (d->g == 1)
        return reshape(s, t, 2, (const int64_t[]){d->o, d->l});
    return reshape(s, t, 3, (const int64_t[]){d->g, d->og, d->l});
}

/* conv2d(x, w) + broadcast(bias) when bias >= 0 (a node of O elements): the bias added in
 * the matmul's [(G,) Og, L] layout, where it fuses as the matmul's epilogue (and where a
 * following activation's transposes cancel), as the frontend's im2col had it. */
static int32_t forward(cd_state *s, int32_t x, int32_t w, int32_t bias, const conv_dims *d) {
    int32_t cols = im2col(s, x, d);
    int32_t y = matmul(s, weight_matrix(s, w, d), cols); /* [(G,) Og, L] */
    if (bias >= 0 && y >= 0) {
        int64_t col[3] = {d->g, d->og, 1}, full[3]; /* by value: emitting moves the nodes */
        memcpy(full, nd(s, y)->shape, sizeof full);
        int32_t r = nd(s, y)->rank;
        loom_dtype dt = nd(s, y)->dtype;
        int32_t b = reshape(s, bias, r, r == 2 ? col + 1 : col);
        b = shaped(s, LOOM_IR_OP_BROADCAST, b, r, full);
        int32_t in[2] = {y, b};
        y = b < 0 ? -1 : emit(s, LOOM_IR_OP_ADD, 2, in, dt, 0, NULL, NULL);
    }
    y = reshape(s, y, 4, (const int64_t[]){d->o, d->n, d->oh, d->ow});
    return transpose(s, y, SWAP01);
}

/* The matmul VJPs choose, as frontend/autograd.c's does, the form that transposes fewer
 * elements (its costs with no operand already a transpose). */
static int32_t grad_weight(cd_state *s, int32_t x, int32_t dy, const conv_dims *d) {
    int32_t cols = im2col(s, x, d);
    int32_t g = dy_matrix(s, dy, d);
    if (cols < 0 || g < 0)
        return -1;
    int64_t direct = numel(s, cols), flipped = numel(s, g) + d->o * d->kk * d->cg;
    int32_t dwm = direct <= flipped ? matmul(s, g, mT(s, cols)) : mT(s, matmul(s, cols, mT(s, g)));
    dwm = reshape(s, dwm, 4, (const int64_t[]){d->o, d->kh, d->kw, d->cg});
    return transpose(s, dwm, (const int32_t[]){0, 3, 1, 2});
}

static int32_t grad_input(cd_state *s, int32_t dy, int32_t w, loom_dtype dt, const conv_dims *d) {
    int32_t wm = weight_matrix(s, w, d);
    int32_t g = dy_matrix(s, dy, d);
    if (wm < 0 || g < 0)
        return -1;
    int64_t direct = numel(s, wm), flipped = numel(s, g) + d->kk * d->c * d->l;
    int32_t dc = direct <= flipped ? matmul(s, mT(s, wm), g) : mT(s, matmul(s, mT(s, g), wm));
    if (d->g > 1) { /* undo the regrouping */
        dc = reshape(s, dc, 4, (const int64_t[]){d->g, d->kk, d->cg, d->l});
        dc = transpose(s, dc, SWAP01);
    }
    dc = reshape(s, dc, 4, (const int64_t[]){d->kk * d->c, d->n, d->oh, d->ow});
    /* col2im: each window's slab of dc (the concat's VJP, in window order) back where its
     * slice read it, summed (in f32 for 16-bit types) in autograd's order, the last window
     * first */
    bool wide = dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16;
    const int64_t padded[4] = {d->c, d->n, d->hp, d->wp};
    int32_t *slab = loom_ir_alloc(&s->out.alloc, (size_t)d->kk * sizeof *slab);
    if (!slab) {
        s->st = loom_ir_diag_set(s->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        return -1;
    }
    for (int64_t k = 0; k < d->kk; k++)
        slab[k] = d->kk == 1
                      ? dc
                      : moved(s, LOOM_IR_OP_SLICE, dc, (const int64_t[]){d->c, d->n, d->oh, d->ow},
                              (const int64_t[]){k * d->c, 0, 0, 0}, (const int64_t[]){1, 1, 1, 1});
    int32_t sum = -1;
    for (int64_t k = d->kk - 1; k >= 0; k--) {
        int64_t i = k / d->kw, j = k % d->kw;
        int32_t p = moved(s, LOOM_IR_OP_PAD, slab[k], padded,
                          (const int64_t[]){0, 0, i * d->cv.dilation[0], j * d->cv.dilation[1]},
                          (const int64_t[]){0, 0, d->cv.stride[0] - 1, d->cv.stride[1] - 1});
        if (wide && p >= 0)
            p = emit(s, LOOM_IR_OP_CAST, 1, &p, LOOM_DTYPE_F32, 0, NULL, NULL);
        if (sum < 0) {
            sum = p;
        } else {
            int32_t in[2] = {sum, p};
            sum = p < 0 ? -1 : emit(s, LOOM_IR_OP_ADD, 2, in, nd(s, p)->dtype, 0, NULL, NULL);
        }
    }
    loom_ir_free(&s->out.alloc, slab, (size_t)d->kk * sizeof *slab);
    if (d->cv.padding[0] || d->cv.padding[1])
        sum = moved(s, LOOM_IR_OP_SLICE, sum, (const int64_t[]){d->c, d->n, d->h, d->w},
                    (const int64_t[]){0, 0, d->cv.padding[0], d->cv.padding[1]},
                    (const int64_t[]){1, 1, 1, 1});
    int32_t dx = transpose(s, sum, SWAP01);
    if (wide && dx >= 0)
        dx = emit(s, LOOM_IR_OP_CAST, 1, &dx, dt, 0, NULL, NULL);
    return dx;
}

/* Node n (a conv op of g) rewritten over its mapped operands a, b; bias: the mapped bias
 * of a conv2d whose add is being rewritten with it, or -1. */
static int32_t decompose(cd_state *s, const loom_ir_graph *g, const loom_ir_node *n,
                         const int32_t *map, int32_t bias) {
    int32_t a = map[n->inputs[0]], b = map[n->inputs[1]];
    const loom_ir_node *na = &g->nodes[n->inputs[0]], *nb = &g->nodes[n->inputs[1]];
    s->loc = n->loc;
    if (n->op == LOOM_IR_OP_CONV2D) {
        conv_dims d = dims_of(na->shape, nb->shape, n->shape, &n->attrs.conv);
        return forward(s, a, b, bias, &d);
    }
    if (n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT) {
        conv_dims d = dims_of(n->shape, nb->shape, na->shape, &n->attrs.conv);
        return grad_input(s, a, b, n->dtype, &d);
    }
    conv_dims d = dims_of(na->shape, n->shape, nb->shape, &n->attrs.conv); /* grad_weight */
    return grad_weight(s, a, b, &d);
}

/* Whether node i of g is conv2d(x, w) + broadcast(bias) with the conv2d read by nothing
 * else (loom_conv2d's bias): then *conv gets the conv2d and *bias the broadcast's operand,
 * whose extents are 1 but the channel axis's (O). uses[v]: how many operand slots and
 * outputs read v. */
static bool is_biased_conv(const loom_ir_graph *g, int32_t i, const int32_t *uses, bool all,
                           int32_t *conv, int32_t *bias) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op != LOOM_IR_OP_ADD)
        return false;
    for (int k = 0; k < 2; k++) {
        const loom_ir_node *c = &g->nodes[n->inputs[k]], *v = &g->nodes[n->inputs[1 - k]];
        if (c->op != LOOM_IR_OP_CONV2D || !decomposes(c, all) || uses[n->inputs[k]] != 1 ||
            v->op != LOOM_IR_OP_BROADCAST)
            continue;
        const loom_ir_node *b = &g->nodes[v->inputs[0]];
        bool channel_only = b->rank <= 4 && b->rank >= 3 && b->dtype == c->dtype;
        for (int32_t j = 0; j < b->rank && channel_only; j++) { /* right-aligned with c */
            int32_t axis = 4 - b->rank + j;
            channel_only = b->shape[j] == (axis == 1 ? c->shape[1] : 1);
        }
        if (channel_only) {
            *conv = n->inputs[k];
            *bias = v->inputs[0];
            return true;
        }
    }
    return false;
}

/* Whether node n of g is the bias gradient of a conv whose gradients read dy: a sum of dy
 * (or of a cast of it) over N, H, W. It is rewritten over dy's channel-major layout [O, L],
 * the one the gradients' matmuls read, so that dy is materialized once, in that layout, by
 * the kernel producing it (as with the frontend's im2col, whose bias was added in it). */
static bool is_bias_grad(const loom_ir_graph *g, const loom_ir_node *n, const uint8_t *is_dy) {
    if (n->op != LOOM_IR_OP_REDUCE_SUM || n->attrs.axes != 0xDu)
        return false;
    int32_t v = n->inputs[0];
    if (g->nodes[v].op == LOOM_IR_OP_CAST)
        v = g->nodes[v].inputs[0];
    return is_dy[v] != 0;
}

static int32_t bias_grad(cd_state *s, const loom_ir_graph *g, const loom_ir_node *n,
                         const int32_t *map) {
    const loom_ir_node *c = &g->nodes[n->inputs[0]];
    bool cast = c->op == LOOM_IR_OP_CAST;
    int32_t v = cast ? c->inputs[0] : n->inputs[0];
    const int64_t *ys = g->nodes[v].shape;
    s->loc = n->loc;
    int32_t t = transpose(s, map[v], SWAP01);
    t = reshape(s, t, 2, (const int64_t[]){ys[1], ys[0] * ys[2] * ys[3]});
    if (cast && t >= 0)
        t = emit(s, LOOM_IR_OP_CAST, 1, &t, c->dtype, 0, NULL, NULL);
    loom_ir_attrs at = {.axes = 2u};
    int32_t r = t < 0 ? -1 : emit(s, LOOM_IR_OP_REDUCE_SUM, 1, &t, nd(s, t)->dtype, 0, NULL, &at);
    return n->rank == 1 ? r : reshape(s, r, n->rank, n->shape);
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    const char *how = getenv("LOOM_CONV");
    bool all = how && strcmp(how, "im2col") == 0, any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = decomposes(&g->nodes[i], all);
    if (!any)
        return LOOM_OK;
    cd_state s = {.d = d, .st = LOOM_OK};
    loom_ir_graph_init(&s.out, &g->alloc);
    /* map: g node -> out node; uses: readers per node, then for a conv2d whose bias add is
     * rewritten with it, -1 - that add (the conv2d itself is then emitted at the add) */
    size_t bytes = (size_t)g->n_nodes * sizeof(int32_t);
    int32_t *map = loom_ir_alloc(&g->alloc, bytes), *uses = loom_ir_alloc(&g->alloc, bytes);
    if (!map || !uses)
        s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++)
        uses[i] = 0;
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++)
        for (int32_t k = 0; k < g->nodes[i].n_inputs; k++)
            uses[g->nodes[i].inputs[k]]++;
    for (int32_t o = 0; o < g->n_outputs && s.st == LOOM_OK; o++)
        uses[g->outputs[o].node]++;
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        int32_t c, b;
        if (is_biased_conv(g, i, uses, all, &c, &b))
            uses[c] = -1 - i;
    }
    /* is_dy: the dy operands of the gradients */
    uint8_t *is_dy = s.st == LOOM_OK ? loom_ir_alloc(&g->alloc, (size_t)g->n_nodes) : NULL;
    if (!is_dy)
        s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++)
        is_dy[i] = 0;
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if ((n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT || n->op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT) &&
            decomposes(n, all))
            is_dy[n->inputs[n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? 0 : 1]] = 1;
    }
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (decomposes(n, all)) {
            map[i] = uses[i] < 0 ? -1 : decompose(&s, g, n, map, -1);
            continue;
        }
        if (is_bias_grad(g, n, is_dy)) {
            map[i] = bias_grad(&s, g, n, map);
            continue;
        }
        int32_t slot = -1; /* the operand slot of a conv2d rewritten here with its bias */
        for (int k = 0; k < 2 && n->op == LOOM_IR_OP_ADD && slot < 0; k++)
            if (uses[n->inputs[k]] == -1 - i)
                slot = k;
        if (slot >= 0) {
            int32_t bias = g->nodes[n->inputs[1 - slot]].inputs[0];
            map[i] = decompose(&s, g, &g->nodes[n->inputs[slot]], map, map[bias]);
            continue;
        }
        map[i] = loom_pass_add_mapped(&s.out, g, i, map, &s.st, d);
    }
    loom_pass_add_outputs(&s.out, g, map, &s.st, d);
    loom_ir_free(&g->alloc, map, bytes);
    loom_ir_free(&g->alloc, uses, bytes);
    loom_ir_free(&g->alloc, is_dy, (size_t)g->n_nodes);
    return loom_pass_replace_graph(g, &s.out, s.st, out_changed);
}

const loom_pass loom_pass_conv_decompose = {"conv-decompose", run};
