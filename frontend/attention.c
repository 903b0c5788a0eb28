/* Scaled dot-product attention (nn.h): PyTorch's F.scaled_dot_product_attention semantics
 * (bool or additive mask, causal, scale, dropout on the weights, [B, H, T, D] or
 * [B, T, H, D]) as the fused attention op (ops.def: the mask read by its kernels where they
 * read the scores, dropout drawn inside them from the key loom_dropout would use; its
 * gradients recompute the weights and their draws by tiles: no L x S matrix in memory), in
 * q's dtype (not autocast: its scores and softmax are f32 whatever the operands). An
 * additive mask's gradient, where asked for, is the one thing that materializes the scores
 * (frontend/autograd.c). */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "loom/nn.h"

static const char op[] = "scaled_dot_product_attention";

typedef struct operand {
    loom_dtype dt;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
} operand;

static bool type_of(loom_context *ctx, loom_tensor *t, const char *what, operand *o,
                    const char *file, int line) {
    return loom_fe_type_of(ctx, t, what, file, line, op, &o->dt, &o->rank, o->shape);
}

static bool bad(loom_context *ctx, const char *file, int line, const char *why, const operand *q,
                const operand *k, const operand *v) {
    char tq[LOOM_IR_TYPE_STR_MAX], tk[LOOM_IR_TYPE_STR_MAX], tv[LOOM_IR_TYPE_STR_MAX];
    loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "%s: q %s, k %s, v %s", why,
                  loom_ir_format_type(tq, sizeof tq, q->dt, q->rank, q->shape),
                  loom_ir_format_type(tk, sizeof tk, k->dt, k->rank, k->shape),
                  loom_ir_format_type(tv, sizeof tv, v->dt, v->rank, v->shape));
    return false;
}

/* q [..., L, E], k [..., S, E], v [..., S, Ev] in the canonical (heads before tokens) layout:
 * one float dtype, equal leading axes. */
static bool check_qkv(loom_context *ctx, const operand *q, const operand *k, const operand *v,
                      const char *file, int line) {
    if (!loom_ir_dtype_is_float(q->dt) || k->dt != q->dt || v->dt != q->dt)
        return bad(ctx, file, line, "q, k and v need one float dtype", q, k, v);
    int32_t r = q->rank;
    if (r < 2 || k->rank != r || v->rank != r)
        return bad(ctx, file, line, "q, k and v need one rank >= 2", q, k, v);
    if (memcmp(q->shape, k->shape, (size_t)(r - 2) * sizeof *q->shape) != 0 ||
        memcmp(q->shape, v->shape, (size_t)(r - 2) * sizeof *q->shape) != 0)
        return bad(ctx, file, line, "q, k and v need equal leading (batch, head) extents", q, k, v);
    if (k->shape[r - 1] != q->shape[r - 1])
        return bad(ctx, file, line, "q and k need one head size E ([..., L, E], [..., S, E])", q, k,
                   v);
    if (v->shape[r - 2] != k->shape[r - 2])
        return bad(ctx, file, line, "k and v need one key length S ([..., S, E], [..., S, Ev])", q,
                   k, v);
    return true;
}

/* The mask must broadcast to the scores [..., L, S]: numpy rules, aligned right. */
static bool check_mask(loom_context *ctx, loom_tensor *mask, int32_t rank, const int64_t *scores,
                       loom_dtype dt, const char *file, int line) {
    operand m;
    if (!type_of(ctx, mask, "mask", &m, file, line))
        return false;
    char tm[LOOM_IR_TYPE_STR_MAX], ts[LOOM_IR_TYPE_STR_MAX];
    bool ok = m.rank <= rank && (m.dt == LOOM_DTYPE_BOOL || m.dt == dt);
    for (int32_t i = 0; ok && i < m.rank; i++) {
        int64_t e = m.shape[m.rank - 1 - i];
        ok = e == 1 || e == scores[rank - 1 - i];
    }
    if (!ok)
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "mask must be bool (true: attend) or q's dtype (added to the scores) and "
                      "broadcast to the scores %s, got %s",
                      loom_ir_format_type(ts, sizeof ts, dt, rank, scores),
                      loom_ir_format_type(tm, sizeof tm, m.dt, m.rank, m.shape));
    return ok;
}

/* [B, T, H, D] <-> [B, H, T, D]: the same permutation both ways. */
static loom_tensor *swap_tokens_heads(loom_context *ctx, loom_tensor *t, const char *file,
                                      int line) {
    static const int32_t perm[4] = {0, 2, 1, 3};
    return loom_permute_at(ctx, t, perm, file, line);
}

LOOM_API void loom_attention_options_init(loom_attention_options *o) {
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->layout = LOOM_ATTENTION_BHTD;
}

LOOM_API loom_tensor *loom_scaled_dot_product_attention_ex_at(loom_context *ctx, loom_tensor *q,
                                                              loom_tensor *k, loom_tensor *v,
                                                              const loom_attention_options *o,
                                                              const char *file, int line) {
    LOOM_FE_USE(ctx, op, NULL);
    operand oq, ok, ov;
    if (!ctx || !type_of(ctx, q, "q", &oq, file, line) || !type_of(ctx, k, "k", &ok, file, line) ||
        !type_of(ctx, v, "v", &ov, file, line))
        return NULL;
    if (!o) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "options is NULL");
        return NULL;
    }
    bool bthd = o->layout == LOOM_ATTENTION_BTHD;
    if ((int)o->layout < 0 || o->layout >= LOOM_ATTENTION_LAYOUT_COUNT_) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "unknown layout %d",
                      (int)o->layout);
        return NULL;
    }
    if (bthd) {
        if (oq.rank != 4 || ok.rank != 4 || ov.rank != 4) {
            bad(ctx, file, line, "the [B, T, H, D] layout needs rank-4 q, k and v", &oq, &ok, &ov);
            return NULL;
        }
        /* check in the canonical layout, so messages and rules are the same for both */
        operand *all[3] = {&oq, &ok, &ov};
        for (int i = 0; i < 3; i++) {
            int64_t t = all[i]->shape[1];
            all[i]->shape[1] = all[i]->shape[2];
            all[i]->shape[2] = t;
        }
    }
    if (!check_qkv(ctx, &oq, &ok, &ov, file, line))
        return NULL;
    int32_t r = oq.rank;
    int64_t S = ok.shape[r - 2], E = oq.shape[r - 1];
    if (o->mask && o->causal) {
        /* as PyTorch: which of the two would win is not obvious, so neither does */
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "give a mask or causal, not both (fold the causal part into the mask)");
        return NULL;
    }
    int64_t scores_shape[LOOM_MAX_RANK];
    memcpy(scores_shape, oq.shape, (size_t)r * sizeof *scores_shape);
    scores_shape[r - 1] = S;
    if (o->mask && !check_mask(ctx, o->mask, r, scores_shape, oq.dt, file, line))
        return NULL;
    if (!(o->scale >= 0) || !isfinite(o->scale) || !(o->dropout_p >= 0 && o->dropout_p < 1)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs a finite scale >= 0 (0: 1/sqrt(E)) and dropout_p in [0, 1), got "
                      "scale %g, dropout_p %g",
                      o->scale, o->dropout_p);
        return NULL;
    }
    if (o->dropout_p > 0 && !o->seed) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "dropout_p %g needs a seed tensor (an i64 scalar)", o->dropout_p);
        return NULL;
    }

    if (bthd) {
        q = swap_tokens_heads(ctx, q, file, line);
        k = swap_tokens_heads(ctx, k, file, line);
        v = swap_tokens_heads(ctx, v, file, line);
    }
    double scale = o->scale != 0 ? o->scale : 1.0 / sqrt((double)E);
    /* the fused op (codegen/lower_attention.c): q, k, v, the dropout's key, the mask */
    loom_tensor *in[5] = {q, k, v};
    int32_t n = 3;
    if (o->dropout_p > 0 &&
        !(in[n++] = loom_fe_dropout_key(ctx, o->seed, o->stream, file, line, op)))
        return NULL;
    if (o->mask)
        in[n++] = o->mask;
    loom_tensor *out = loom_fe_record_op(
        ctx, LOOM_IR_OP_ATTENTION, n, in,
        (loom_ir_attrs){.index = o->causal ? 1 : 0, .value = scale, .dropout = o->dropout_p}, file,
        line, op);
    return bthd && out ? swap_tokens_heads(ctx, out, file, line) : out;
}

LOOM_API loom_tensor *loom_scaled_dot_product_attention_at(loom_context *ctx, loom_tensor *q,
                                                           loom_tensor *k, loom_tensor *v,
                                                           loom_tensor *mask, bool causal,
                                                           double scale, const char *file,
                                                           int line) {
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.mask = mask;
    o.causal = causal;
    o.scale = scale;
    return loom_scaled_dot_product_attention_ex_at(ctx, q, k, v, &o, file, line);
}
