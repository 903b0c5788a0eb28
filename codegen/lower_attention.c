/* Lowering of the fused attention ops (ops.def: attention, attention_lse, attention_grad_q,
 * _k, _v): the root of a kernel of its own whose operands are read from buffers, with the
 * root's fused elementwise epilogue (a cast) as a pool's. No L x S matrix is ever in memory:
 * a block of AT_BM rows meets the blocks of AT_BN columns of its scores in turn (the
 * FlashAttention recurrence), in scratch a task reuses.
 *
 * A task is one (batch, head): it packs the panels of every block of columns once (k^T and
 * v, say), then runs its blocks of rows in turn.
 * Query side (attention, attention_lse, grad_q): a block of query rows i. Its q rows are
 * packed, scaled (s = (scale q) k^T: the scale costs no pass over the scores). For each
 * block of keys (causal: only those at or left of the block's last row, the diagonal block
 * masked per element): S = Qs K^T on the packed microkernel (K^T in 16-key panels); then
 * per row, in 16-lane vectors,
 *  - attention, lse: the online softmax: the running max m and sum l, the weights
 *    p = exp(s - m) in place of the scores, the accumulated output rescaled by
 *    exp(m_old - m_new), then O += P V (V packed in panels);
 *  - grad_q: p = exp(s - lse) from the forward's statistic, dP = dO V^T, and
 *    dS = p (dP - delta) in place of the scores, then dQ += dS K.
 * At the end: o = O / l, lse = m + log l, dq = scale dQ.
 * Key side (grad_k, grad_v): a block of key rows j; the blocks of queries (causal:
 * from row j0 on) give S^T = K Qs^T and P^T = exp(S^T - lse) by columns, then dV += P^T dO,
 * or dP^T = V dO^T, dS^T = P^T (dP^T - delta) and dK += dS^T Qs.
 * A mask (ops.def) is read 16 lanes at a time where its scores are, each time (forward and
 * recomputed backward; one element, a masked load of a run, or a gather, by its stride
 * along the lanes): added to them, or -inf where a bool mask is false. It skips no tile.
 * Dropout (ops.def): each weight's draw is made from its (query, key) index where the weight
 * is made, 16 lanes at once, and the weight (forward, grad_v) or dP (grad_q, grad_k) scaled
 * by its keep factor; the forward's running sum l takes the undropped weights.
 * f32, bf16 and f16 (16-bit operands widened to f32 while packing; scores, softmax and sums in
 * f32) multiply on the f32 FMA microkernel (microkernel.c); f64 by plain loops over the same
 * packed blocks, in f64. */
#include <math.h>

#include "lower_internal.h"

enum {
    AT_BM = 64, /* rows of a task's block (queries, or keys on the key side) */
    AT_BN = 64, /* columns of a block of scores (keys, or queries on the key side); equal to
                 * AT_BM, so the key side's causal start (a row block's first key) begins a
                 * column block */
    AT_LANES = 16,
};

typedef struct at_plan {
    loom_ir_op op;
    loom_dtype dt; /* the operands' (lse and delta are f32) */
    bool key_side; /* grad_k, grad_v: tasks over blocks of keys */
    bool causal;
    double scale;
    double dropout; /* the weights' dropout probability (0: none) */
    loom_dtype mdt; /* the mask's dtype */
    int64_t mstride[LOOM_MAX_RANK]; /* its element strides along the scores' [..., L, S] */
    int32_t r;
    int64_t B, L, S, E, Ev;
    int64_t rows;  /* L or S: the task side's length */
    int64_t cols;  /* the result's columns: Ev, E, or 1 for lse */
    int64_t nbo;   /* the accumulator's columns, padded to whole microkernel tiles */
    int32_t in[8]; /* operand buffers: q, k, v, do, lse, delta, seed, mask (-1: none) */
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns;
} at_plan;

enum { IN_Q, IN_K, IN_V, IN_DO, IN_LSE, IN_DELTA, IN_SEED, IN_MASK, IN_COUNT };

/* Columns padded to whole tiles of the microkernel (16, or multiples of 32). */
static int64_t pad_cols(int64_t n) {
    return n <= MK_PANEL ? MK_PANEL : ceil_div(n, 2 * MK_PANEL) * 2 * MK_PANEL;
}

static loom_status plan_attention(kc *c, at_plan *ap) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    ap->op = root->op;
    for (int32_t q = 0; q < root->n_inputs; q++)
        if (c->s->buf_of[root->inputs[q]] < 0)
            return cg_unsupported(c, root->inputs[q],
                                  "an attention operand computed inside its kernel (its operands "
                                  "are read from buffers)");
    const loom_ir_node *q = &g->nodes[root->inputs[0]], *k = &g->nodes[root->inputs[1]];
    bool gv = ap->op == LOOM_IR_OP_ATTENTION_GRAD_V, gq = ap->op == LOOM_IR_OP_ATTENTION_GRAD_Q;
    bool gk = ap->op == LOOM_IR_OP_ATTENTION_GRAD_K, lse = ap->op == LOOM_IR_OP_ATTENTION_LSE;
    for (int i = 0; i < IN_COUNT; i++)
        ap->in[i] = -1;
    ap->in[IN_Q] = root->inputs[0];
    ap->in[IN_K] = root->inputs[1];
    if (!lse && !gv)
        ap->in[IN_V] = root->inputs[2];
    if (gv) {
        ap->in[IN_DO] = root->inputs[2];
        ap->in[IN_LSE] = root->inputs[3];
    } else if (gq || gk) {
        ap->in[IN_DO] = root->inputs[3];
        ap->in[IN_LSE] = root->inputs[4];
        ap->in[IN_DELTA] = root->inputs[5];
    }
    ap->dt = q->dtype;
    ap->key_side = gk || gv;
    ap->causal = root->attrs.index != 0;
    ap->scale = root->attrs.value;
    ap->dropout = root->attrs.dropout;
    if (ap->dropout > 0)
        ap->in[IN_SEED] = root->inputs[loom_ir_attention_operands(ap->op)];
    int32_t mi = loom_ir_attention_mask(root);
    if (mi >= 0) {
        const loom_ir_node *m = &g->nodes[root->inputs[mi]];
        ap->in[IN_MASK] = root->inputs[mi];
        ap->mdt = m->dtype;
        if (loom_ir_broadcast_strides(m->rank, m->shape, q->rank, ap->mstride) >= INT32_MAX)
            return cg_unsupported(c, root->inputs[mi],
                                  "an attention mask of 2^31 elements or more");
    }
    ap->r = q->rank;
    int32_t r = ap->r;
    if (r < 2 || !loom_ir_dtype_is_float(ap->dt))
        return cg_bad_plan(c, c->k->root,
                           "an attention op whose operands are not float [..., T, D]");
    ap->B = loom_ir_numel(r - 2, q->shape);
    ap->L = q->shape[r - 2];
    ap->S = k->shape[r - 2];
    ap->E = q->shape[r - 1];
    ap->Ev = lse ? 1 : g->nodes[root->inputs[2]].shape[r - 1]; /* v's, or do's for grad_v */
    ap->rows = ap->key_side ? ap->S : ap->L;
    ap->cols = lse ? 1 : gq || gk ? ap->E : ap->Ev;
    ap->nbo = pad_cols(ap->cols);
    if (ap->L * ap->S >= INT32_MAX || ap->E * AT_BN >= INT32_MAX || ap->Ev * AT_BN >= INT32_MAX)
        return cg_unsupported(c, c->k->root, "attention over 2^31 (query, key) pairs or more");
    return cg_plan_epilogue(c, &ap->ns, ap->epi, &ap->n_epi, -1);
}

/* ---- packing (scalar loops: a block's packing is 1/AT_BM of its products' work) ---------- */

typedef struct at_kern {
    kc *c;
    const at_plan *ap;
    MlirType T; /* the compute type: f32, or f64 */
    bool f64;   /* T is f64 */
    MlirValue buf[IN_COUNT];
    MlirValue bh;    /* the (batch, head) index */
    MlirValue seedv; /* dropout: the seed in 16 i64 lanes */
    MlirValue mbase; /* the mask's offset for (batch, head) bh */
} at_kern;

/* Where row `row` of (batch, head) bh of operand `which` ([..., S or L, n]) starts. */
static MlirValue operand_row(at_kern *K, int which, int64_t n, MlirValue row) {
    cg_b *b = K->c->b;
    int64_t rows = which == IN_K || which == IN_V ? K->ap->S : K->ap->L;
    return cg_imul_c(b, cg_iadd(b, cg_imul_c(b, K->bh, rows), row), n);
}

/* Operand `which` element (row, col) of (batch, head) bh, times scale. */
static MlirValue operand_at(at_kern *K, int which, int64_t n, MlirValue row, MlirValue col,
                            double scale) {
    cg_b *b = K->c->b;
    MlirValue off = cg_iadd(b, operand_row(K, which, n, row), col);
    MlirValue v = cg_load_val(b, K->ap->dt, K->buf[which], off);
    return scale == 1.0 ? v : cg_bin(b, "arith.mulf", v, cg_cf(b, K->T, scale));
}

/* A = rows [r0, r0 + m) of operand `which` (n columns) row-major, AT_BM rows (zeros past m). */
static void pack_rows(at_kern *K, MlirValue A, int which, int64_t n, MlirValue r0, MlirValue m,
                      double scale) {
    cg_b *b = K->c->b;
    cg_for li, le;
    cg_for_begin(b, &li, cg_idx(b, 0), m, 0, NULL);
    cg_for_begin(b, &le, cg_idx(b, 0), cg_idx(b, n), 0, NULL);
    cg_store(b, operand_at(K, which, n, cg_iadd(b, r0, li.iv), le.iv, scale), A,
             cg_iadd(b, cg_imul_c(b, li.iv, n), le.iv));
    cg_for_end(b, &le, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
    cg_zero_range(b, A, cg_imul_c(b, m, n), isub(b, cg_idx(b, AT_BM * n), cg_imul_c(b, m, n)),
                  cg_cf(b, K->T, 0.0));
}

/* Bt[b0..] = rows [r0, r0 + m) of operand `which` (n columns) as the columns of a B operand:
 * panels of 16 of its rows, Bt[b0 + (p n + e) 16 + l] = x[r0 + 16 p + l, e]; AT_BN columns
 * (zeros past m). */
static void pack_panels_t(at_kern *K, MlirValue Bt, MlirValue b0, int which, int64_t n,
                          MlirValue r0, MlirValue m, double scale) {
    cg_b *b = K->c->b;
    cg_zero_range(b, Bt, b0, cg_idx(b, AT_BN * n), cg_cf(b, K->T, 0.0));
    cg_for lj, le;
    cg_for_begin(b, &lj, cg_idx(b, 0), m, 0, NULL);
    MlirValue p = idiv(b, lj.iv, AT_LANES), l = irem(b, lj.iv, AT_LANES);
    MlirValue at0 = cg_iadd(b, b0, cg_iadd(b, cg_imul_c(b, cg_imul_c(b, p, n), AT_LANES), l));
    cg_for_begin(b, &le, cg_idx(b, 0), cg_idx(b, n), 0, NULL);
    cg_store(b, operand_at(K, which, n, cg_iadd(b, r0, lj.iv), le.iv, scale), Bt,
             cg_iadd(b, at0, cg_imul_c(b, le.iv, AT_LANES)));
    cg_for_end(b, &le, 0, NULL);
    cg_for_end(b, &lj, 0, NULL);
}

/* Bp[b0..] = rows [r0, r0 + m) of operand `which` (n columns) as a B operand of AT_BN rows
 * (its K): panels of 16 columns, Bp[b0 + (p AT_BN + kk) 16 + l] = x[r0 + kk, 16 p + l], nbo
 * columns; zeros past m rows and n columns. A row's 16 columns of a panel are one vector
 * when n is a multiple of 16 (and the operand f32 or f64). */
static void pack_panels(at_kern *K, MlirValue Bp, MlirValue b0, int which, int64_t n, MlirValue r0,
                        MlirValue m, double scale) {
    cg_b *b = K->c->b;
    cg_zero_range(b, Bp, b0, cg_idx(b, AT_BN * K->ap->nbo), cg_cf(b, K->T, 0.0));
    cg_for lk, le;
    cg_for_begin(b, &lk, cg_idx(b, 0), m, 0, NULL);
    if (n % AT_LANES == 0 && !is_16(K->ap->dt)) {
        MlirValue row = operand_row(K, which, n, cg_iadd(b, r0, lk.iv));
        MlirType vt = cg_vec_t(AT_LANES, K->T);
        for (int64_t p = 0; p < n / AT_LANES; p++) {
            MlirValue v = cg_vload(b, vt, K->buf[which], cg_iadd(b, row, cg_idx(b, p * AT_LANES)));
            if (scale != 1.0)
                v = cg_bin(b, "arith.mulf", v, cg_vbroadcast(b, cg_cf(b, K->T, scale), vt));
            cg_vstore(
                b, v, Bp,
                cg_iadd(b, b0, cg_imul_c(b, cg_iadd(b, lk.iv, cg_idx(b, p * AT_BN)), AT_LANES)));
        }
        cg_for_end(b, &lk, 0, NULL);
        return;
    }
    cg_for_begin(b, &le, cg_idx(b, 0), cg_idx(b, n), 0, NULL);
    MlirValue p = idiv(b, le.iv, AT_LANES), l = irem(b, le.iv, AT_LANES);
    MlirValue at = cg_iadd(
        b, b0, cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, AT_BN), lk.iv), AT_LANES), l));
    cg_store(b, operand_at(K, which, n, cg_iadd(b, r0, lk.iv), le.iv, scale), Bp, at);
    cg_for_end(b, &le, 0, NULL);
    cg_for_end(b, &lk, 0, NULL);
}

/* C[i nbp + j] (+)= sum_kk A[i kp + kk] B(kk, j) for i < mb, j < nb (B at Bp[b0..] in
 * 16-column panels of kp rows): the f32 microkernel, or f64 loops. */
static void product(at_kern *K, MlirValue A, MlirValue Bp, MlirValue b0, MlirValue C, MlirValue mb,
                    MlirValue nb, int64_t kp, int64_t nbp, bool accumulate) {
    kc *c = K->c;
    cg_b *b = c->b;
    if (!K->f64) {
        cg_mk mk = {.pk = 1, .kp = kp, .nbp = nbp};
        cg_mk_shape(&mk, nbp);
        MlirValue z = cg_idx(b, 0);
        cg_mk_tiles_at(c, &mk, A, z, Bp, b0, C, z, mb, nb, accumulate, (MlirValue){NULL}, NULL);
        return;
    }
    cg_for li, lj, lk;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    cg_for_begin(b, &lj, cg_idx(b, 0), nb, 0, NULL);
    MlirValue at = cg_iadd(b, cg_imul_c(b, li.iv, nbp), lj.iv);
    MlirValue init = accumulate ? cg_load(b, C, at) : cg_cf(b, K->T, 0.0);
    MlirValue bcol = cg_iadd(b, b0,
                             cg_iadd(b, cg_imul_c(b, idiv(b, lj.iv, AT_LANES), kp * AT_LANES),
                                     irem(b, lj.iv, AT_LANES)));
    cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, kp), 1, &init);
    MlirValue x = cg_load(b, A, cg_iadd(b, cg_imul_c(b, li.iv, kp), lk.iv));
    MlirValue y = cg_load(b, Bp, cg_iadd(b, bcol, cg_imul_c(b, lk.iv, AT_LANES)));
    MlirValue s = cg_fma(b, x, y, lk.iter[0]);
    cg_for_end(b, &lk, 1, &s);
    cg_store(b, cg_for_result(&lk, 0), C, at);
    cg_for_end(b, &lj, 0, NULL);
    cg_for_end(b, &li, 0, NULL);
}

/* ---- per-row steps on a block of scores, 16 columns a vector -------------------------------- */

static MlirValue vsplat(at_kern *K, MlirValue x) {
    return cg_vbroadcast(K->c->b, x, cg_vec_t(AT_LANES, K->T));
}

static MlirValue vexp(at_kern *K, MlirValue x) {
    return K->f64 ? cg_un(K->c->b, "math.exp", x) : cg_exp_f32(K->c->b, x);
}

/* An f32 statistic (lse, delta) of rows [at, at + 16) as a vector of T, 0 where not valid. */
static MlirValue stat_lanes(at_kern *K, int which, MlirValue at, MlirValue valid) {
    cg_b *b = K->c->b;
    MlirValue v = cg_vmaskload(b, cg_vec_t(AT_LANES, b->f32), K->buf[which], at, valid);
    return !K->f64 ? v : cg_conv(b, "arith.extf", v, cg_vec_t(AT_LANES, K->T));
}

/* Dropout's factors (ops.def) for the 16 weights of rows (query side) or columns (key side)
 * of block t of a row: 1 / (1 - p) where the weight's draw is >= p, else 0. The weight
 * (query i, key j) is element (bh L + i) S + j of the [..., L, S] weights. */
static MlirValue keep_lanes(at_kern *K, MlirValue row, MlirValue col0) {
    cg_b *b = K->c->b;
    const at_plan *ap = K->ap;
    MlirValue query = ap->key_side ? col0 : row, key = ap->key_side ? row : col0;
    MlirValue e0 =
        cg_iadd(b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, K->bh, ap->L), query), ap->S), key);
    MlirType vi = cg_vec_t(AT_LANES, b->i64);
    MlirValue lanes = cg_conv(b, "arith.extsi", cg_lanes_i32(b, ap->key_side ? ap->S : 1), vi);
    MlirValue e = cg_bin(b, "arith.addi",
                         cg_vbroadcast(b, cg_conv(b, "arith.index_cast", e0, b->i64), vi), lanes);
    MlirValue u = cg_rand_draw(b, K->seedv, e, K->T);
    MlirValue keep = cg_vcmpf(b, CG_F_OGE, u, vsplat(K, cg_cf(b, K->T, ap->dropout)));
    return cg_select(b, keep, vsplat(K, cg_cf(b, K->T, 1.0 / (1.0 - ap->dropout))),
                     vsplat(K, cg_cf(b, K->T, 0.0)));
}

/* Scores s of 16 lanes of a row (query side: query `row`, keys col0 + lane; key side: key
 * `row`, queries col0 + lane) with the mask applied: + its value, or -inf where a bool mask
 * is false; lanes not `ok` are not read. */
static MlirValue masked(at_kern *K, MlirValue s, MlirValue row, MlirValue col0, MlirValue ok) {
    const at_plan *ap = K->ap;
    if (ap->in[IN_MASK] < 0)
        return s;
    cg_b *b = K->c->b;
    int32_t r = ap->r;
    int64_t s_row = ap->key_side ? ap->mstride[r - 1] : ap->mstride[r - 2];
    int64_t s_col = ap->key_side ? ap->mstride[r - 2] : ap->mstride[r - 1];
    MlirValue at =
        cg_iadd(b, K->mbase, cg_iadd(b, cg_imul_c(b, row, s_row), cg_imul_c(b, col0, s_col)));
    MlirType et = cg_storage_type(b, ap->mdt), vt = cg_vec_t(AT_LANES, et);
    MlirValue m; /* the lanes' mask: one element, a run of 16 (a masked load), or a gather */
    if (s_col == 0)
        m = cg_vbroadcast(b, cg_load(b, K->buf[IN_MASK], at), vt);
    else if (s_col == 1)
        m = cg_vmaskload(b, vt, K->buf[IN_MASK], at, ok);
    else
        m = cg_vgather(
            b, vt, K->buf[IN_MASK],
            cg_bin(b, "arith.addi", cg_splat_i32(b, at, AT_LANES), cg_lanes_i32(b, s_col)), ok);
    if (ap->mdt == LOOM_DTYPE_BOOL)
        return cg_select(b, cg_vcmpi(b, CG_I_NE, m, cg_vbroadcast(b, cg_ci(b, b->i8, 0), vt)), s,
                         vsplat(K, cg_cf(b, K->T, -INFINITY)));
    return cg_bin(b, "arith.addf", s, cg_widen16(b, ap->mdt, m));
}

/* Query side, the online softmax of row i (block rows i0 + i) over the keys [j0, j0 + nb):
 * the weights in place of the scores (dropped: row is query i0 + i), m and l updated, the
 * accumulator's row rescaled. */
static void softmax_row(at_kern *K, MlirValue Sc, MlirValue O, MlirValue m, MlirValue l,
                        MlirValue i, MlirValue row, MlirValue j0, MlirValue jlim) {
    cg_b *b = K->c->b;
    MlirType vt = cg_vec_t(AT_LANES, K->T);
    /* keys j < jlim (the block's end, or causal: the row's diagonal + 1) */
    MlirValue lim = cg_splat_i32(b, jlim, AT_LANES), ninf = vsplat(K, cg_cf(b, K->T, -INFINITY));
    MlirValue s[AT_BN / AT_LANES], ok[AT_BN / AT_LANES], mx = ninf;
    MlirValue base = cg_imul_c(b, i, AT_BN);
    for (int t = 0; t < AT_BN / AT_LANES; t++) {
        MlirValue jv = cg_bin(b, "arith.addi",
                              cg_splat_i32(b, cg_iadd(b, j0, cg_idx(b, t * AT_LANES)), AT_LANES),
                              cg_lanes_i32(b, 1));
        ok[t] = cg_vcmpi(b, CG_I_SLT, jv, lim);
        MlirValue sc = cg_vload(b, vt, Sc, cg_iadd(b, base, cg_idx(b, t * AT_LANES)));
        sc = masked(K, sc, row, cg_iadd(b, j0, cg_idx(b, t * AT_LANES)), ok[t]);
        s[t] = cg_select(b, ok[t], sc, ninf);
        mx = cg_bin(b, "arith.maximumf", mx, s[t]);
    }
    MlirValue mold = cg_load(b, m, i);
    MlirValue mnew = cg_bin(b, "arith.maximumf", mold, cg_vreduce(b, "maximumf", mx));
    /* a row with no key yet keeps exp(-inf - 0) = 0 instead of NaN */
    MlirValue zero = cg_cf(b, K->T, 0.0);
    MlirValue msafe =
        cg_select(b, cg_cmpf(b, CG_F_OEQ, mnew, cg_cf(b, K->T, -INFINITY)), zero, mnew);
    MlirValue sum = vsplat(K, zero);
    for (int t = 0; t < AT_BN / AT_LANES; t++) {
        MlirValue p = vexp(K, cg_bin(b, "arith.subf", s[t], vsplat(K, msafe)));
        p = cg_select(b, ok[t], p, vsplat(K, zero));
        sum = cg_bin(b, "arith.addf", sum, p);
        if (K->ap->dropout > 0)
            p = cg_bin(b, "arith.mulf", p,
                       keep_lanes(K, row, cg_iadd(b, j0, cg_idx(b, t * AT_LANES))));
        cg_vstore(b, p, Sc, cg_iadd(b, base, cg_idx(b, t * AT_LANES)));
    }
    MlirValue a1 = vexp(K, cg_bin(b, "arith.subf", mold, msafe)), alpha = vsplat(K, a1);
    cg_store(b, cg_fma(b, cg_load(b, l, i), a1, cg_vreduce(b, "add", sum)), l, i);
    cg_store(b, mnew, m, i);
    if (mlirValueIsNull(O))
        return;
    MlirValue ob = cg_imul_c(b, i, K->ap->nbo);
    for (int64_t t = 0; t < K->ap->nbo / AT_LANES; t++) {
        MlirValue at = cg_iadd(b, ob, cg_idx(b, t * AT_LANES));
        cg_vstore(b, cg_bin(b, "arith.mulf", cg_vload(b, vt, O, at), alpha), O, at);
    }
}

/* The weights exp(s - lse) of a row of scores and, with dP, dS = p (dP - delta), in place of
 * the scores. Query side: row i is query `row`, lse and delta scalars, keys c0 + column
 * valid in [lo, hi). Key side: row i is key `row`, columns the queries c0 + column, valid in
 * [lo, hi) (lo causal: the key's index; else 0), their lse and delta as vectors. Dropout
 * scales the weight (no dP: grad_v) or dP by its keep factor. */
static void weights_row(at_kern *K, MlirValue Sc, MlirValue Dp, MlirValue i, MlirValue row,
                        MlirValue c0, MlirValue lo, MlirValue hi, MlirValue lse_s,
                        MlirValue delta_s) {
    cg_b *b = K->c->b;
    const at_plan *ap = K->ap;
    MlirType vt = cg_vec_t(AT_LANES, K->T);
    MlirValue base = cg_imul_c(b, i, AT_BN), zero = vsplat(K, cg_cf(b, K->T, 0.0));
    MlirValue vlo = cg_splat_i32(b, lo, AT_LANES), vhi = cg_splat_i32(b, hi, AT_LANES);
    for (int t = 0; t < AT_BN / AT_LANES; t++) {
        MlirValue col = cg_iadd(b, c0, cg_idx(b, t * AT_LANES));
        MlirValue cv = cg_bin(b, "arith.addi", cg_splat_i32(b, col, AT_LANES), cg_lanes_i32(b, 1));
        MlirValue ok = and_i1(b, cg_vcmpi(b, CG_I_SGE, cv, vlo), cg_vcmpi(b, CG_I_SLT, cv, vhi));
        MlirValue at = cg_iadd(b, base, cg_idx(b, t * AT_LANES));
        MlirValue lse = lse_s, delta = delta_s;
        if (ap->key_side) { /* the queries' statistics, rows bh L + col of lse and delta */
            MlirValue srow = cg_iadd(b, cg_imul_c(b, K->bh, ap->L), col);
            lse = stat_lanes(K, IN_LSE, srow, ok);
            if (!mlirValueIsNull(Dp))
                delta = stat_lanes(K, IN_DELTA, srow, ok);
        } else {
            lse = vsplat(K, lse_s);
            if (!mlirValueIsNull(Dp))
                delta = vsplat(K, delta_s);
        }
        MlirValue p =
            vexp(K, cg_bin(b, "arith.subf", masked(K, cg_vload(b, vt, Sc, at), row, col, ok), lse));
        MlirValue keep = ap->dropout > 0 ? keep_lanes(K, row, col) : (MlirValue){NULL};
        if (!mlirValueIsNull(Dp)) {
            MlirValue dp = cg_vload(b, vt, Dp, at);
            if (ap->dropout > 0)
                dp = cg_bin(b, "arith.mulf", dp, keep);
            p = cg_bin(b, "arith.mulf", p, cg_bin(b, "arith.subf", dp, delta));
        } else if (ap->dropout > 0) {
            p = cg_bin(b, "arith.mulf", p, keep);
        }
        cg_vstore(b, cg_select(b, ok, p, zero), Sc, at);
    }
}

/* ---- the epilogue ---------------------------------------------------------------------------- */

/* The root's element (bh, row, col) of value v through the epilogue. */
static loom_status epilogue_at(at_kern *K, MlirValue v, MlirValue row, MlirValue col) {
    kc *c = K->c;
    const at_plan *ap = K->ap;
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    c->ns = &ap->ns;
    cg_clear_gv(c);
    cg_set_dims(c, root, 0, ap->r - 2, K->bh);
    cg_set_dims(c, root, ap->r - 2, ap->r - 1, row);
    if (ap->op != LOOM_IR_OP_ATTENTION_LSE)
        cg_set_dims(c, root, ap->r - 1, ap->r, col);
    c->bound_v = is_16(root->dtype) ? cg_round16(c->b, root->dtype, v) : v;
    return cg_emit_sinks(c, ap->n_epi, ap->epi);
}

/* ---- one task ----------------------------------------------------------------------------------
 */

typedef struct at_bufs {
    MlirValue A, A2;   /* the task's rows packed: q (scaled) or k; do or v */
    MlirValue Bt, Bt2; /* a block's columns: k^T or q^T; v^T or do^T */
    MlirValue Bp;      /* a block's rows for the second product: v, k, do or q */
    MlirValue Sc, Dp;  /* the block's scores (then weights), dP */
    MlirValue acc, m, l;
} at_bufs;

/* The operand a block's product reads as B: the first (k^T, or qs^T), the second with dP
 * (v^T, or do^T) and the accumulated one (v, k, do or qs), with its scale. */
static int first_b(const at_plan *ap) {
    return ap->key_side ? IN_Q : IN_K;
}
static int dp_b(const at_plan *ap) {
    return ap->key_side ? IN_DO : IN_V;
}
static int acc_b(const at_plan *ap, double *scale) {
    *scale = ap->op == LOOM_IR_OP_ATTENTION_GRAD_K ? ap->scale : 1.0;
    return ap->op == LOOM_IR_OP_ATTENTION          ? IN_V
           : ap->op == LOOM_IR_OP_ATTENTION_GRAD_Q ? IN_K
           : ap->op == LOOM_IR_OP_ATTENTION_GRAD_V ? IN_DO
                                                   : IN_Q;
}

/* A block of task rows [r0, r0 + mb) of (batch, head) K->bh, its columns' blocks packed. */
static loom_status emit_rows(at_kern *K, const at_bufs *w, MlirValue r0) {
    kc *c = K->c;
    cg_b *b = c->b;
    const at_plan *ap = K->ap;
    loom_ir_op op = ap->op;
    MlirValue mb = cg_imin(b, cg_idx(b, AT_BM), isub(b, cg_idx(b, ap->rows), r0));
    MlirValue zero = cg_cf(b, K->T, 0.0);
    bool lse_op = op == LOOM_IR_OP_ATTENTION_LSE, fwd = op == LOOM_IR_OP_ATTENTION || lse_op;
    bool gq = op == LOOM_IR_OP_ATTENTION_GRAD_Q, gk = op == LOOM_IR_OP_ATTENTION_GRAD_K;
    int64_t E = ap->E, Ev = ap->Ev;

    if (!ap->key_side) {
        pack_rows(K, w->A, IN_Q, E, r0, mb, ap->scale);
        if (gq)
            pack_rows(K, w->A2, IN_DO, Ev, r0, mb, 1.0);
    } else {
        pack_rows(K, w->A, IN_K, E, r0, mb, 1.0);
        if (gk)
            pack_rows(K, w->A2, IN_V, Ev, r0, mb, 1.0);
    }
    if (!lse_op)
        cg_zero_range(b, w->acc, cg_idx(b, 0), cg_idx(b, AT_BM * ap->nbo), zero);
    if (fwd) {
        cg_zero_range(b, w->l, cg_idx(b, 0), cg_idx(b, AT_BM), zero);
        cg_for lz;
        cg_for_begin(b, &lz, cg_idx(b, 0), cg_idx(b, AT_BM), 0, NULL);
        cg_store(b, cg_cf(b, K->T, -INFINITY), w->m, lz.iv);
        cg_for_end(b, &lz, 0, NULL);
    }
    /* the blocks of columns: keys [0, cend) on the query side (causal: to the last row's
     * diagonal), queries [cbeg, L) on the key side (causal: from the first key's row) */
    MlirValue cbeg = cg_idx(b, 0), cend = cg_idx(b, ap->key_side ? ap->L : ap->S);
    if (ap->causal && !ap->key_side)
        cend = cg_imin(b, cend, cg_iadd(b, r0, mb));
    if (ap->causal && ap->key_side)
        cbeg = cg_imin(b, r0, cend);
    MlirValue nb_blocks = cg_bin(
        b, "arith.divui", cg_iadd(b, isub(b, cend, cbeg), cg_idx(b, AT_BN - 1)), cg_idx(b, AT_BN));
    cg_for lb;
    cg_for_begin(b, &lb, cg_idx(b, 0), nb_blocks, 0, NULL);
    MlirValue c0 = cg_iadd(b, cbeg, cg_imul_c(b, lb.iv, AT_BN));
    MlirValue nb = cg_imin(b, cg_idx(b, AT_BN), isub(b, cend, c0));
    /* the scores of the block (S, or S^T on the key side), and dP where needed: the column
     * blocks' panels are packed once per (batch, head), block c0 / AT_BN at c0 n */
    product(K, w->A, w->Bt, cg_imul_c(b, c0, E), w->Sc, mb, nb, E, AT_BN, false);
    if (gq || gk)
        product(K, w->A2, w->Bt2, cg_imul_c(b, c0, Ev), w->Dp, mb, nb, Ev, AT_BN, false);
    /* per row: the weights (or dS) in place of the scores */
    cg_for li;
    cg_for_begin(b, &li, cg_idx(b, 0), mb, 0, NULL);
    MlirValue row = cg_iadd(b, r0, li.iv), cend_blk = cg_iadd(b, c0, nb);
    /* query side: the row's keys end at the block's end (causal: at its diagonal + 1) */
    MlirValue jlim = ap->causal && !ap->key_side
                         ? cg_imin(b, cend_blk, cg_iadd(b, row, cg_idx(b, 1)))
                         : cend_blk;
    if (fwd) {
        softmax_row(K, w->Sc, lse_op ? (MlirValue){NULL} : w->acc, w->m, w->l, li.iv, row, c0,
                    jlim);
    } else if (!ap->key_side) { /* grad_q */
        MlirValue srow = cg_iadd(b, cg_imul_c(b, K->bh, ap->L), row);
        MlirValue lse = cg_load(b, K->buf[IN_LSE], srow), dl = cg_load(b, K->buf[IN_DELTA], srow);
        if (K->f64) {
            lse = cg_conv(b, "arith.extf", lse, K->T);
            dl = cg_conv(b, "arith.extf", dl, K->T);
        }
        weights_row(K, w->Sc, w->Dp, li.iv, row, c0, c0, jlim, lse, dl);
    } else { /* grad_k, grad_v: queries from the key's row (causal) to the block's end */
        MlirValue lo = ap->causal ? row : cg_idx(b, 0);
        weights_row(K, w->Sc, gk ? w->Dp : (MlirValue){NULL}, li.iv, row, c0, lo, cend_blk,
                    (MlirValue){NULL}, (MlirValue){NULL});
    }
    cg_for_end(b, &li, 0, NULL);
    /* the second product, accumulated: P V, dS K, P^T dO or dS^T Qs */
    if (!lse_op)
        product(K, w->Sc, w->Bp, cg_imul_c(b, c0, ap->nbo), w->acc, mb, cg_idx(b, ap->cols), AT_BN,
                ap->nbo, true);
    cg_for_end(b, &lb, 0, NULL);

    /* the results: o = O / l, lse = m + log l, dq = scale dQ, dk, dv */
    loom_status st = LOOM_OK;
    cg_for lr, lc;
    cg_for_begin(b, &lr, cg_idx(b, 0), mb, 0, NULL);
    MlirValue out_row = cg_iadd(b, r0, lr.iv);
    if (lse_op) {
        MlirValue lv = cg_load(b, w->l, lr.iv);
        MlirValue lg = K->f64 ? cg_un(b, "math.log", lv) : cg_log_f32(b, lv);
        MlirValue v = cg_bin(b, "arith.addf", cg_load(b, w->m, lr.iv), lg);
        if (K->f64)
            v = cg_conv(b, "arith.truncf", v, b->f32);
        st = epilogue_at(K, v, out_row, cg_idx(b, 0));
    } else {
        MlirValue f = op == LOOM_IR_OP_ATTENTION
                          ? cg_bin(b, "arith.divf", cg_cf(b, K->T, 1.0), cg_load(b, w->l, lr.iv))
                      : gq ? cg_cf(b, K->T, ap->scale)
                           : cg_cf(b, K->T, 1.0);
        cg_for_begin(b, &lc, cg_idx(b, 0), cg_idx(b, ap->cols), 0, NULL);
        MlirValue v = cg_load(b, w->acc, cg_iadd(b, cg_imul_c(b, lr.iv, ap->nbo), lc.iv));
        st = epilogue_at(K, cg_bin(b, "arith.mulf", v, f), out_row, lc.iv);
        cg_for_end(b, &lc, 0, NULL);
    }
    cg_for_end(b, &lr, 0, NULL);
    return st;
}

/* Task bh: its column blocks' panels, then its blocks of rows. */
static loom_status emit_task(at_kern *K, const at_bufs *w, MlirValue bh) {
    cg_b *b = K->c->b;
    const at_plan *ap = K->ap;
    K->bh = bh;
    if (ap->in[IN_MASK] >= 0) { /* the mask's offset for bh: its leading axes' strides */
        const int64_t *lead = K->c->g->nodes[ap->in[IN_Q]].shape;
        MlirValue rest = bh, off = cg_idx(b, 0);
        for (int32_t d = ap->r - 3; d >= 0; d--) {
            if (ap->mstride[d])
                off = cg_iadd(b, off, cg_imul_c(b, irem(b, rest, lead[d]), ap->mstride[d]));
            rest = idiv(b, rest, lead[d]);
        }
        K->mbase = off;
    }
    int64_t ncols = ap->key_side ? ap->L : ap->S;
    bool dp = ap->op == LOOM_IR_OP_ATTENTION_GRAD_Q || ap->op == LOOM_IR_OP_ATTENTION_GRAD_K;
    double s2;
    int acc = acc_b(ap, &s2);
    cg_for lc, lr;
    cg_for_begin(b, &lc, cg_idx(b, 0), cg_idx(b, ceil_div(ncols, AT_BN)), 0, NULL);
    MlirValue c0 = cg_imul_c(b, lc.iv, AT_BN);
    MlirValue nb = cg_imin(b, cg_idx(b, AT_BN), isub(b, cg_idx(b, ncols), c0));
    pack_panels_t(K, w->Bt, cg_imul_c(b, c0, ap->E), first_b(ap), ap->E, c0, nb,
                  ap->key_side ? ap->scale : 1.0);
    if (dp)
        pack_panels_t(K, w->Bt2, cg_imul_c(b, c0, ap->Ev), dp_b(ap), ap->Ev, c0, nb, 1.0);
    if (ap->op != LOOM_IR_OP_ATTENTION_LSE)
        pack_panels(K, w->Bp, cg_imul_c(b, c0, ap->nbo), acc, ap->cols, c0, nb, s2);
    cg_for_end(b, &lc, 0, NULL);
    cg_for_begin(b, &lr, cg_idx(b, 0), cg_idx(b, ceil_div(ap->rows, AT_BM)), 0, NULL);
    loom_status st = emit_rows(K, w, cg_imul_c(b, lr.iv, AT_BM));
    cg_for_end(b, &lr, 0, NULL);
    return st;
}

loom_status cg_lower_attention(kc *c) {
    at_plan *ap = loom_ir_alloc(&c->s->alloc, sizeof *ap);
    if (!ap)
        return cg_oom(c);
    memset(ap, 0, sizeof *ap);
    loom_status st = plan_attention(c, ap);
    if (st != LOOM_OK)
        goto done;
    /* a task per (batch, head): its columns' panels packed once for all its row blocks */
    int64_t ncols = ap->key_side ? ap->L : ap->S, ncb = ceil_div(ncols, AT_BN);
    c->extent = ap->B > 0 ? ap->B : 1;
    c->grain = cg_grain_for(ap->rows * ncols * (ap->E + ap->Ev));
    if (!c->emit || ap->B == 0 || ap->rows == 0)
        goto done;
    cg_b *b = c->b;
    at_kern K = {.c = c, .ap = ap};
    K.f64 = ap->dt == LOOM_DTYPE_F64;
    K.T = K.f64 ? b->f64 : b->f32;
    for (int i = 0; i < IN_COUNT; i++)
        if (ap->in[i] >= 0)
            K.buf[i] = c->bufs[c->s->buf_of[ap->in[i]]];
    if (ap->dropout > 0)
        K.seedv =
            cg_vbroadcast(b, cg_load(b, K.buf[IN_SEED], cg_idx(b, 0)), cg_vec_t(AT_LANES, b->i64));
    /* the blocks' rows rounded up to whole C tiles (6 rows on AVX2: tiles past AT_BM read
     * and write rows no one uses) */
    int64_t E = ap->E, Ev = ap->Ev, W = E > Ev ? E : Ev, BM = AT_BM + MK_ACC;
    at_bufs w = {
        .A = cg_alloc_buf(b, K.T, BM * W),
        .A2 = cg_alloc_buf(b, K.T, BM * W),
        .Bt = cg_alloc_buf(b, K.T, (ncb > 0 ? ncb : 1) * AT_BN * E),
        .Bt2 = cg_alloc_buf(b, K.T, (ncb > 0 ? ncb : 1) * AT_BN * Ev),
        .Bp = cg_alloc_buf(b, K.T, (ncb > 0 ? ncb : 1) * AT_BN * ap->nbo),
        .Sc = cg_alloc_buf(b, K.T, BM * AT_BN),
        .Dp = cg_alloc_buf(b, K.T, BM * AT_BN),
        .acc = cg_alloc_buf(b, K.T, BM * ap->nbo),
        .m = cg_alloc_buf(b, K.T, AT_BM),
        .l = cg_alloc_buf(b, K.T, AT_BM),
    };
    cg_for lt;
    cg_for_begin(b, &lt, c->lo, c->hi, 0, NULL);
    st = emit_task(&K, &w, lt.iv);
    cg_for_end(b, &lt, 0, NULL);
    MlirValue all[] = {w.A, w.A2, w.Bt, w.Bt2, w.Bp, w.Sc, w.Dp, w.acc, w.m, w.l};
    for (size_t q = 0; q < sizeof all / sizeof all[0]; q++)
        cg_op(b, "memref.dealloc", 1, &all[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, ap, sizeof *ap);
    return st;
}
