/* Lowering of REDUCTION kernels: sums, means and maxima with their prologue and epilogue
 * (see lower_kernel.c for the loop forms). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"

enum {
    RED_TILE = 1024,          /* outputs per tile of a reduction over outer dims */
    RED_RUN = 32768,          /* elements a blocked reduction reads in one run, at least */
    RED_TASKS = 16,           /* ... while it has this many tasks, or a tile of one output */
    RED_UNROLL_MAX = 16,      /* reduced elements per output unrolled under a kept loop ... */
    RED_UNROLL_MIN_INNER = 8, /* ... when that loop is at least this long */
    RED_COLS_RUN_MAX = 64,    /* a blocked reduction's inner runs this short or shorter ... */
    RED_COLS_ACC = 2048,      /* ... accumulate per element of the run: tile x run at most */
    RED_COLS_UNROLL = 4,      /* images (outer reduced elements) per accumulator store */
};

/* ---- REDUCTION ---------------------------------------------------------------------------- */

typedef struct red_ops {
    loom_ir_op op;
    loom_dtype dt;
    MlirType acc_t;
    bool fsum; /* float sum/mean: f64 accumulator */
} red_ops;

static MlirValue red_init(cg_b *b, const red_ops *r) {
    bool fl = loom_ir_dtype_is_float(r->dt);
    if (r->op == LOOM_IR_OP_REDUCE_MAX) {
        if (fl)
            return cg_cf(b, r->acc_t, -INFINITY);
        return cg_ci(b, r->acc_t, r->dt == LOOM_DTYPE_I32 ? INT32_MIN : INT64_MIN);
    }
    return fl ? cg_cf(b, r->acc_t, 0.0) : cg_ci(b, r->acc_t, 0);
}

static MlirValue red_combine(cg_b *b, const red_ops *r, MlirValue acc, MlirValue v) {
    bool fl = loom_ir_dtype_is_float(r->dt);
    if (r->op == LOOM_IR_OP_REDUCE_MAX)
        return cg_bin(b, fl ? "arith.maximumf" : "arith.maxsi", acc, v);
    if (!fl)
        return cg_bin(b, "arith.addi", acc, v);
    if (!mlirTypeEqual(mlirValueGetType(v), r->acc_t))
        v = cg_conv(b, "arith.extf", v, r->acc_t);
    return cg_bin(b, "arith.addf", acc, v);
}

/* The reduced value in the root's compute type, rounded to its dtype. */
static MlirValue red_finish(cg_b *b, const red_ops *r, MlirValue acc, int64_t n_red) {
    if (!r->fsum)
        return acc;
    if (r->op == LOOM_IR_OP_REDUCE_MEAN) /* 0 / 0 is NaN for an empty mean, as interpreted */
        acc = cg_bin(b, "arith.divf", acc, cg_cf(b, b->f64, (double)n_red));
    if (r->dt == LOOM_DTYPE_F64)
        return acc;
    MlirValue f = cg_conv(b, "arith.truncf", acc, b->f32);
    return is_16(r->dt) ? cg_round16(b, r->dt, f) : f;
}

/* A REDUCTION kernel's reductions (its root first, then, in a multi-output kernel, the
 * others of its nodes, each over an operand of the root's operand's shape along the same
 * axes): one loop nest, an accumulator each. In a staged kernel (fusion's rows rule) a
 * reduction whose operand reads the reduced value of another is of a later stage: per
 * output, the reduced loops run once per stage, a stage's values bound before the next;
 * results of x's shape that read the last stage's values (softmax's output) are a final
 * stage of their own, a loop over the row with no accumulator. */
typedef struct red_plan {
    int32_t n;                      /* reductions */
    int32_t root[CG_RED_ROOTS_MAX]; /* the reduction nodes */
    red_ops ops[CG_RED_ROOTS_MAX];
    int32_t x[CG_RED_ROOTS_MAX]; /* their reduced operands */
    int8_t stage[CG_RED_ROOTS_MAX];
    int64_t n_red; /* reduced elements per output */
    sink pro[64];  /* prologue: the operands (pro[i] is x[i]) and results of their shape */
    int8_t pro_stage[64];
    int32_t n_pro;
    sink epi[64]; /* epilogue results (maps into the nest's kept dims) */
    int32_t n_epi;
    int8_t n_stages; /* 1 unless staged */
    bool final;      /* results of x's shape read the last stage's values: a stage n_stages */
    int8_t cur;      /* the stage being emitted, or -1: all of them */
} red_plan;

static void red_init_all(cg_b *b, const red_plan *rp, MlirValue *acc) {
    for (int32_t i = 0; i < rp->n; i++)
        acc[i] = red_init(b, &rp->ops[i]);
}

static loom_status emit_red_loops(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr,
                                  int32_t i, MlirValue *acc);

static bool in_stage(const red_plan *rp, int32_t stage) {
    return rp->cur < 0 || stage == rp->cur;
}

/* Inner body: evaluates the operands and the prologue sinks (of the stage being emitted) at
 * the current index (storing those that are results), folds each operand into its
 * accumulator (acc, updated). */

static loom_status emit_red_body(kc *c, red_plan *rp, MlirValue *acc) {
    int32_t mark = cg_memo_mark(c);
    MlirValue v[CG_RED_ROOTS_MAX];
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < rp->n && st == LOOM_OK; i++)
        if (in_stage(rp, rp->stage[i]))
            st = cg_eval(c, rp->x[i], &rp->pro[i].map, &v[i]);
    if (st == LOOM_OK && rp->cur < 0) {
        st = cg_emit_sinks(c, rp->n_pro, rp->pro); /* the operands are memo hits */
    } else if (st == LOOM_OK) {                    /* the stage's sinks */
        sink sk[64];
        int32_t n = 0;
        for (int32_t i = 0; i < rp->n_pro; i++)
            if (rp->pro_stage[i] == rp->cur)
                sk[n++] = rp->pro[i];
        st = cg_emit_sinks(c, n, sk);
    }
    for (int32_t i = 0; i < rp->n && st == LOOM_OK; i++)
        if (in_stage(rp, rp->stage[i]))
            acc[i] = red_combine(c->b, &rp->ops[i], acc[i], v[i]);
    cg_memo_pop(c, mark);
    return st;
}

/* The reduced loops from group i in, carrying the accumulators (acc: in, then out). */
static loom_status emit_red_loops(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr,
                                  int32_t i, MlirValue *acc) {
    if (i == nr)
        return emit_red_body(c, rp, acc);
    cg_for l;
    cg_for_begin(c->b, &l, cg_idx(c->b, 0), cg_idx(c->b, c->ns->g_ext[rgroups[i]]), rp->n, acc);
    c->gv[rgroups[i]] = l.iv;
    MlirValue next[CG_RED_ROOTS_MAX];
    memcpy(next, l.iter, (size_t)rp->n * sizeof next[0]);
    loom_status st = emit_red_loops(c, rp, rgroups, nr, i + 1, next);
    if (st != LOOM_OK)
        return st;
    cg_for_end(c->b, &l, rp->n, next);
    for (int32_t j = 0; j < rp->n; j++)
        acc[j] = cg_for_result(&l, j);
    return LOOM_OK;
}

/* The column-wise blocked form's inner reduced loops from group i in: each element of the
 * tile's runs folds into its own accumulator, accbuf[j][at] (at: the tile element's index,
 * then the run's linearized), loaded and stored around the body: no value is carried from
 * one element to the next, so the run vectorizes whatever its length. The body runs u_n
 * times per load and store, with the outer reduced group ug at u0, u0 + 1, ... (ug < 0:
 * once, as set): with one body per load and store, batch norm's two sums over bf16
 * [32,512,8,8] took 150 us, with four 118 (a Zen 4, 2 threads, from the caches). */
typedef struct red_unroll {
    int32_t ug, u_n;
    MlirValue u0;
} red_unroll;

static loom_status emit_red_cols(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr, int32_t i,
                                 const MlirValue *accbuf, MlirValue at, const red_unroll *un) {
    cg_b *b = c->b;
    if (i == nr) {
        MlirValue acc[CG_RED_ROOTS_MAX];
        for (int32_t j = 0; j < rp->n; j++)
            acc[j] = cg_load(b, accbuf[j], at);
        loom_status st = LOOM_OK;
        for (int32_t u = 0; u < un->u_n && st == LOOM_OK; u++) {
            if (un->ug >= 0)
                c->gv[un->ug] = cg_iadd(b, un->u0, cg_idx(b, u));
            st = emit_red_body(c, rp, acc);
        }
        for (int32_t j = 0; j < rp->n && st == LOOM_OK; j++)
            cg_store(b, acc[j], accbuf[j], at);
        return st;
    }
    int64_t e = c->ns->g_ext[rgroups[i]];
    cg_for l;
    cg_for_begin(b, &l, cg_idx(b, 0), cg_idx(b, e), 0, NULL);
    c->gv[rgroups[i]] = l.iv;
    loom_status st =
        emit_red_cols(c, rp, rgroups, nr, i + 1, accbuf, cg_iadd(b, cg_imul_c(b, at, e), l.iv), un);
    cg_for_end(b, &l, 0, NULL);
    return st;
}

/* Binds the reduced values of stage `stage` (-1: all) at the current output index. */
static void red_bind(kc *c, const red_plan *rp, const MlirValue *acc, int32_t stage) {
    for (int32_t i = 0; i < rp->n; i++) {
        if (stage >= 0 && rp->stage[i] != stage)
            continue;
        MlirValue v = red_finish(c->b, &rp->ops[i], acc[i], rp->n_red);
        if (i == 0)
            c->bound_v = v;
        else
            c->more_v[i - 1] = v;
    }
}

/* Epilogue at the current output index: binds the reduced values, evaluates and stores. */
static loom_status emit_red_epilogue(kc *c, red_plan *rp, const MlirValue *acc) {
    red_bind(c, rp, acc, -1);
    return cg_emit_sinks(c, rp->n_epi, rp->epi);
}

/* The form of a task per output, staged: per stage, the reduced loops (the row, from the
 * caches after the first) and that stage's values bound; the final stage's loop; then the
 * epilogue. */
static loom_status emit_red_staged(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr) {
    MlirValue acc[CG_RED_ROOTS_MAX];
    red_init_all(c->b, rp, acc);
    loom_status st = LOOM_OK;
    for (int32_t s = 0; s < rp->n_stages + rp->final && st == LOOM_OK; s++) {
        rp->cur = (int8_t)s;
        st = emit_red_loops(c, rp, rgroups, nr, 0, acc);
        if (st == LOOM_OK)
            red_bind(c, rp, acc, s);
    }
    rp->cur = -1;
    return st == LOOM_OK ? cg_emit_sinks(c, rp->n_epi, rp->epi) : st;
}

/* The small-reduction form: task = the kept groups but the innermost kept one, which is
 * the inner loop; per output the reduced elements are folded in unrolled, in row-major
 * order (as the loops would). LLVM then vectorizes the inner loop across outputs (with
 * gathers, x being strided along it): a 2x2 max pool over [64,64,24,24] ran 2.2x faster
 * than as a loop per output, whose NaN-propagating max does not vectorize. */
static loom_status small_reduction(kc *c, red_plan *rp, const int32_t *kgroups, int32_t nk,
                                   const int32_t *rgroups, int32_t nr) {
    cg_b *b = c->b;
    const nest *ns = c->ns;
    int32_t tg = kgroups[nk - 1];
    cg_for lo, li;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    cg_delinearize(c, lo.iv, nk - 1, kgroups);
    cg_for_begin(b, &li, cg_idx(b, 0), cg_idx(b, ns->g_ext[tg]), 0, NULL);
    c->gv[tg] = li.iv;
    MlirValue acc[CG_RED_ROOTS_MAX];
    red_init_all(b, rp, acc);
    loom_status st = LOOM_OK;
    for (int64_t r = 0; r < rp->n_red && st == LOOM_OK; r++) {
        int64_t q = r;
        for (int32_t i = nr - 1; i >= 0; i--) {
            int64_t e = ns->g_ext[rgroups[i]];
            c->gv[rgroups[i]] = cg_idx(b, q % e);
            q /= e;
        }
        st = emit_red_body(c, rp, acc);
    }
    for (int32_t i = 0; i < nr; i++)
        c->gv[rgroups[i]] = (MlirValue){NULL};
    if (st == LOOM_OK)
        st = emit_red_epilogue(c, rp, acc);
    cg_for_end(b, &li, 0, NULL);
    cg_for_end(b, &lo, 0, NULL);
    return st;
}

static bool is_operand(const red_plan *rp, int32_t id) {
    for (int32_t i = 0; i < rp->n; i++)
        if (rp->x[i] == id)
            return true;
    return false;
}

loom_status cg_lower_reduction(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 1)
        return cg_bad_plan(c, root_id, "a reduction without one operand");
    red_plan *rp = loom_ir_alloc(&c->s->alloc, sizeof *rp);
    if (!rp)
        return cg_oom(c);
    memset(rp, 0, sizeof *rp);
    loom_status st = LOOM_OK;
    const loom_ir_node *x = &g->nodes[root->inputs[0]];
    /* the root, then the kernel's other reductions, which must reduce an operand of x's
     * shape along the same axes; each node's stage: 1 + the latest stage of the reduced
     * values it reads (in graph order, which is topological) */
    int8_t *stage = loom_ir_alloc(&c->s->alloc, (size_t)g->n_nodes);
    if (!stage) {
        loom_ir_free(&c->s->alloc, rp, sizeof *rp);
        return cg_oom(c);
    }
    rp->root[rp->n++] = root_id;
    rp->n_stages = 1;
    rp->cur = -1;
    for (int32_t i = 0; i < c->k->n_nodes; i++) {
        int32_t id = c->k->nodes[i];
        const loom_ir_node *n = &g->nodes[id];
        bool reduces = loom_ir_op_traits(n->op)->reduces;
        stage[id] = 0;
        for (int32_t q = 0; q < n->n_inputs; q++) {
            int32_t o = n->inputs[q];
            if (!c->s->in_kernel[o] || g->nodes[o].op == LOOM_IR_OP_CONSTANT)
                continue;
            int32_t so = stage[o] + (loom_ir_op_traits(g->nodes[o].op)->reduces ? 1 : 0);
            stage[id] = (int8_t)(so > stage[id] ? so : stage[id]);
        }
        if (!reduces)
            continue;
        if (stage[id] + 1 > rp->n_stages)
            rp->n_stages = (int8_t)(stage[id] + 1);
        if (id == root_id)
            continue;
        if (rp->n == CG_RED_ROOTS_MAX || !loom_ir_reductions_share_loops(g, root_id, id)) {
            st = cg_unsupported(c, id,
                                "a second reduction in a kernel, unless over an operand of the "
                                "first's shape, along its axes (at most 4)");
            goto done;
        }
        rp->root[rp->n++] = id;
    }
    for (int32_t i = 0; i < rp->n; i++) {
        const loom_ir_node *ri = &g->nodes[rp->root[i]];
        rp->x[i] = ri->inputs[0];
        rp->stage[i] = stage[rp->root[i]];
        rp->ops[i].op = ri->op;
        rp->ops[i].dt = ri->dtype;
        if (ri->op == LOOM_IR_OP_REDUCE_MEAN && !loom_ir_dtype_is_float(ri->dtype)) {
            st = cg_unsupported(c, rp->root[i], "an integer mean");
            goto done;
        }
    }

    nest ns;
    cg_nest_init(&ns, x->rank, x->shape);
    rp->n_red = 1;
    for (int32_t d = 0; d < x->rank; d++) {
        ns.red[d] = (root->attrs.axes >> d) & 1u;
        if (ns.red[d])
            rp->n_red *= x->shape[d];
    }
    /* the root's canonical map: its dims onto x's kept dims */
    imap rmap;
    cg_map_none(&rmap);
    for (int32_t d = 0, j = 0; d < x->rank; d++) {
        if (ns.red[d]) {
            if (root->attrs.keepdim)
                j++;
            continue;
        }
        rmap.dim[j] = (int8_t)(x->shape[d] != 1 ? d : -1);
        rmap.scale[j] = rmap.dim[j] >= 0;
        j++;
    }
    c->bound = root_id;
    c->bound_map = rmap;
    c->n_more = rp->n - 1;
    memcpy(c->more, rp->root + 1, (size_t)c->n_more * sizeof c->more[0]);

    for (int32_t i = 0; i < rp->n; i++) {
        rp->pro[i] = (sink){.node = rp->x[i], .store = c->s->res_of[rp->x[i]] >= 0};
        rp->pro_stage[i] = rp->stage[i];
        cg_identity_map(&ns, &rp->pro[i].map);
    }
    rp->n_pro = rp->n;
    for (int32_t r = 0; r < c->k->n_results; r++) {
        int32_t id = c->k->results[r];
        const loom_ir_node *n = &g->nodes[id];
        /* (later stages and the last, elementwise, depend on reductions too, over x's
         * shape) */
        if (c->s->dep_root[id] && same_shape(n, root)) {
            if (rp->n_epi == 64) {
                st = cg_unsupported(c, id, "more than 64 epilogue results");
                goto done;
            }
            rp->epi[rp->n_epi] = (sink){.node = id, .store = true};
            rp->epi[rp->n_epi++].map = rmap;
        } else if (same_shape(n, x)) {
            if (is_operand(rp, id))
                continue; /* a prologue sink already */
            if (rp->n_pro == 64) {
                st = cg_unsupported(c, id, "more than 64 prologue results");
                goto done;
            }
            rp->final = rp->final || stage[id] == rp->n_stages;
            rp->pro_stage[rp->n_pro] = stage[id];
            rp->pro[rp->n_pro] = (sink){.node = id, .store = true};
            cg_identity_map(&ns, &rp->pro[rp->n_pro++].map);
        } else if (c->s->dep_root[id]) {
            st = cg_unsupported(c, id,
                                "an epilogue result whose shape is neither the reduced value's "
                                "nor the reduced operand's");
            goto done;
        }
    }
    if ((st = cg_side_nests(c, x, SIDE_REDUCTION)) != LOOM_OK)
        goto done;
    {
        /* one plan over prologue and epilogue: merged dims must suit both */
        sink all[128];
        memcpy(all, rp->pro, (size_t)rp->n_pro * sizeof(sink));
        memcpy(all + rp->n_pro, rp->epi, (size_t)rp->n_epi * sizeof(sink));
        if ((st = cg_plan_nest(c, &ns, rp->n_pro + rp->n_epi, all)) != LOOM_OK)
            goto done;
    }
    int32_t ng = ns.n_groups;
    bool inner_kept = ng > 0 && !ns.g_red[ng - 1];
    int32_t kgroups[R], rgroups[R], nk = 0, nr = 0;
    for (int32_t gi = 0; gi < ng; gi++) {
        if (ns.g_red[gi])
            rgroups[nr++] = gi;
        else
            kgroups[nk++] = gi;
    }
    /* reduced groups outside the innermost kept one (pre) and inside it (post) */
    int32_t n_pre = 0;
    while (n_pre < nr && nk > 0 && rgroups[n_pre] < kgroups[nk - 1])
        n_pre++;
    int64_t n_out = loom_ir_numel(root->rank, root->shape);
    int64_t tile = 1, ntiles = 1, outer = 1;
    /* A max over a few elements per output under a kept dim (a max pool's windows): the
     * kept dim becomes the inner loop and the reduction is unrolled inside it
     * (small_reduction). Not for sums: their loop per output is cheap, and vectorized
     * across outputs they read through gathers (the 2x2 pool's tie counts: 400 us as loops,
     * 650 us as gathers; the max pool itself: 1200 us as loops, 540 us as gathers). */
    bool small = !inner_kept && nk > 0 && rp->n == 1 && !rp->final &&
                 root->op == LOOM_IR_OP_REDUCE_MAX && rp->n_red <= RED_UNROLL_MAX &&
                 ns.g_ext[kgroups[nk - 1]] >= RED_UNROLL_MIN_INNER;
    /* Blocked: the innermost kept dim has reduced dims both outside and inside it (batch
     * norm's sums over batch and pixels of NCHW): a task takes a tile of it, and per
     * element of the outer reduced dims sums its tile's inner runs, one contiguous run
     * for the tile, into the tile's accumulators. Per output (a channel), the sum read a
     * run of pixels per image, a layer's size apart: 13-20 GB/s on ResNet-50's. Where the
     * inner runs are short (cols), each of their elements accumulates on its own and the
     * runs are summed once, after the outer reduced loops: a run of 16 pixels (a 4x4
     * image) was summed into one scalar per image and channel, a horizontal sum each.
     * Batch norm's two sums over bf16 [32,C,H,W], from the caches on a Zen 4 (2 threads):
     * [1024,4,4] 106 -> 60 us, [2048,2,2] 90 -> 44, [512,8,8] 153 -> 118; runs of 256 and
     * 1024 pixels gained nothing, and so stay as they were. */
    bool blocked = !small && !inner_kept && n_pre > 0;
    int64_t run = 1;
    for (int32_t i = n_pre; i < nr; i++)
        run *= ns.g_ext[rgroups[i]];
    bool cols = blocked && run <= RED_COLS_RUN_MAX;
    for (int32_t i = 0; i + 1 < nk; i++)
        outer *= ns.g_ext[kgroups[i]];
    if ((rp->n_stages > 1 || rp->final) && (small || inner_kept || blocked)) {
        st = cg_bad_plan(c, root_id,
                         "a staged reduction (one reading another's value, or an elementwise "
                         "stage over the operand) that does not reduce rows");
        goto done;
    }
    if (small) {
        c->extent = n_out > 0 ? outer : 1;
        c->grain = cg_grain_for(rp->n_red * ns.g_ext[kgroups[nk - 1]]);
    } else if (inner_kept || blocked) {
        int64_t t = ns.g_ext[kgroups[nk - 1]];
        tile = inner_kept ? RED_TILE : cols ? RED_COLS_ACC / run : ceil_div(RED_RUN, run);
        tile = tile < t ? tile : t;
        tile = tile < RED_TILE ? tile : RED_TILE;
        while (blocked && tile > 1 && outer * ceil_div(t, tile) < RED_TASKS)
            tile = ceil_div(tile, 2);
        ntiles = ceil_div(t, tile);
        c->extent = n_out > 0 ? outer * ntiles : 1;
        c->grain = cg_grain_for(rp->n_red * tile);
    } else {
        c->extent = n_out > 0 ? n_out : 1;
        c->grain = cg_grain_for(rp->n_red);
    }
    if (!c->emit || n_out == 0)
        goto done;

    cg_b *b = c->b;
    c->ns = &ns;
    cg_clear_gv(c);
    for (int32_t i = 0; i < rp->n; i++) {
        red_ops *o = &rp->ops[i];
        o->fsum = o->op != LOOM_IR_OP_REDUCE_MAX && loom_ir_dtype_is_float(o->dt);
        o->acc_t = o->fsum ? b->f64 : cg_compute_type(b, o->dt);
    }
    if (small) {
        st = small_reduction(c, rp, kgroups, nk, rgroups, nr);
        goto done;
    }
    if (!inner_kept && !blocked) {
        cg_for lo;
        cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
        cg_delinearize(c, lo.iv, nk, kgroups);
        st = emit_red_staged(c, rp, rgroups, nr);
        cg_for_end(b, &lo, 0, NULL);
        goto done;
    }
    /* inner dim kept, or blocked: a tile of accumulators per reduction in stack buffers
     * (allocated once, at entry) */
    MlirValue accbuf[CG_RED_ROOTS_MAX], acc[CG_RED_ROOTS_MAX];
    MlirNamedAttribute seg =
        cg_named(b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){0, 0}));
    int64_t n_acc = cols ? tile * run : tile; /* cols: an accumulator per run element */
    for (int32_t i = 0; i < rp->n; i++) {
        MlirType buf_t =
            mlirMemRefTypeContiguousGet(rp->ops[i].acc_t, 1, &n_acc, mlirAttributeGetNull());
        accbuf[i] =
            mlirOperationGetResult(cg_op(b, "memref.alloca", 0, NULL, 1, &buf_t, 1, &seg), 0);
    }
    int32_t tg = kgroups[nk - 1];
    int64_t text = ns.g_ext[tg];
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    MlirValue q = lo.iv, t0 = cg_idx(b, 0), tn = cg_idx(b, text);
    if (ntiles > 1) {
        MlirValue nt = cg_idx(b, ntiles);
        t0 = cg_imul_c(b, cg_bin(b, "arith.remui", q, nt), tile);
        q = cg_bin(b, "arith.divui", q, nt);
        tn = cg_imin(b, cg_idx(b, tile), cg_bin(b, "arith.subi", cg_idx(b, text), t0));
    }
    cg_delinearize(c, q, nk - 1, kgroups);
    cg_for li;
    cg_for_begin(b, &li, cg_idx(b, 0), cols ? cg_imul_c(b, tn, run) : tn, 0, NULL);
    for (int32_t i = 0; i < rp->n; i++)
        cg_store(b, red_init(b, &rp->ops[i]), accbuf[i], li.iv);
    cg_for_end(b, &li, 0, NULL);
    /* the outer reduced loops, then the tile, then (blocked) the inner reduced loops
     * summing into the tile's accumulator; cols: the innermost outer loop by u_n at a time,
     * then its remainder one by one */
    cg_for loops[R];
    int32_t ug = n_pre > 0 ? rgroups[n_pre - 1] : -1;
    int64_t ue = ug >= 0 ? ns.g_ext[ug] : 1;
    int32_t u_n = cols && ue >= RED_COLS_UNROLL ? RED_COLS_UNROLL : 1;
    for (int32_t i = 0; i < n_pre; i++) {
        int64_t e = ns.g_ext[rgroups[i]];
        cg_for_begin(b, &loops[i], cg_idx(b, 0), cg_idx(b, i == n_pre - 1 ? e / u_n : e), 0, NULL);
        c->gv[rgroups[i]] = loops[i].iv;
    }
    red_unroll un = {.ug = u_n > 1 ? ug : -1, .u_n = u_n};
    if (u_n > 1)
        un.u0 = cg_imul_c(b, loops[n_pre - 1].iv, u_n);
    for (int32_t part = 0; part < 2 && st == LOOM_OK; part++) {
        if (part == 1) { /* the remainder of the unrolled loop */
            if (u_n == 1 || ue % u_n == 0)
                break;
            cg_for_end(b, &loops[n_pre - 1], 0, NULL);
            cg_for_begin(b, &loops[n_pre - 1], cg_idx(b, ue / u_n * u_n), cg_idx(b, ue), 0, NULL);
            c->gv[ug] = loops[n_pre - 1].iv;
            un = (red_unroll){.ug = -1, .u_n = 1};
        }
        cg_for lt;
        cg_for_begin(b, &lt, cg_idx(b, 0), tn, 0, NULL);
        c->gv[tg] = cg_iadd(b, t0, lt.iv);
        if (cols) {
            st = emit_red_cols(c, rp, rgroups + n_pre, nr - n_pre, 0, accbuf, lt.iv, &un);
        } else {
            for (int32_t i = 0; i < rp->n; i++)
                acc[i] = cg_load(b, accbuf[i], lt.iv);
            st = emit_red_loops(c, rp, rgroups + n_pre, nr - n_pre, 0, acc);
            for (int32_t i = 0; i < rp->n && st == LOOM_OK; i++)
                cg_store(b, acc[i], accbuf[i], lt.iv);
        }
        cg_for_end(b, &lt, 0, NULL);
    }
    for (int32_t i = nr - 1; i >= 0; i--) {
        if (i < n_pre)
            cg_for_end(b, &loops[i], 0, NULL);
        c->gv[rgroups[i]] = (MlirValue){NULL};
    }
    if (st == LOOM_OK) {
        cg_for le;
        cg_for_begin(b, &le, cg_idx(b, 0), tn, 0, NULL);
        c->gv[tg] = cg_iadd(b, t0, le.iv);
        if (cols) { /* the element's run, summed: a loop-carried add, reassociable */
            cg_for lr;
            red_init_all(b, rp, acc);
            cg_for_begin(b, &lr, cg_idx(b, 0), cg_idx(b, run), rp->n, acc);
            MlirValue at = cg_iadd(b, cg_imul_c(b, le.iv, run), lr.iv), next[CG_RED_ROOTS_MAX];
            for (int32_t i = 0; i < rp->n; i++)
                next[i] = red_combine(b, &rp->ops[i], lr.iter[i], cg_load(b, accbuf[i], at));
            cg_for_end(b, &lr, rp->n, next);
            for (int32_t i = 0; i < rp->n; i++)
                acc[i] = cg_for_result(&lr, i);
        } else {
            for (int32_t i = 0; i < rp->n; i++)
                acc[i] = cg_load(b, accbuf[i], le.iv);
        }
        st = emit_red_epilogue(c, rp, acc);
        cg_for_end(b, &le, 0, NULL);
    }
    cg_for_end(b, &lo, 0, NULL);
done:
    c->n_more = 0;
    loom_ir_free(&c->s->alloc, stage, (size_t)g->n_nodes);
    loom_ir_free(&c->s->alloc, rp, sizeof *rp);
    return st;
}
