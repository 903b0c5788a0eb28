/* Loop nests of the kernel lowering, used by the kind files: dims merged into loops, sinks
 * evaluated and stored, side nests, a matmul's or convolution's epilogue nest, tasks' grain. */
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"

void cg_nest_init(nest *ns, int32_t rank, const int64_t *shape) {
    memset(ns, 0, sizeof *ns);
    ns->n_dims = rank;
    for (int32_t d = 0; d < rank; d++)
        ns->ext[d] = shape[d];
}

/* Identity map of a node over the nest (its dims are the nest's), extent-1 dims -> -1. */
void cg_identity_map(const nest *ns, imap *map) {
    cg_map_none(map);
    for (int32_t d = 0; d < R; d++) {
        map->dim[d] = (int8_t)(d < ns->n_dims && ns->ext[d] != 1 ? d : -1);
        map->scale[d] = map->dim[d] >= 0;
    }
}

/* Walks every sink recording the leaves, then merges dims into groups. */
loom_status cg_plan_nest(kc *c, nest *ns, int32_t n_sinks, const sink *sinks) {
    bool emit = c->emit;
    const nest *saved = c->ns;
    c->emit = false;
    c->collect = true;
    c->ns = ns; /* its extents (concat reads them); its groups are what is planned here */
    c->s->n_leaves = 0;
    c->n_cuts = 0;
    int32_t mark = cg_memo_mark(c);
    loom_status st = LOOM_OK;
    MlirValue unused;
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++) {
        st = cg_eval(c, sinks[i].node, &sinks[i].map, &unused);
        if (st == LOOM_OK && sinks[i].store)
            st = cg_add_leaf(c, &c->g->nodes[sinks[i].node], &sinks[i].map);
    }
    cg_memo_pop(c, mark);
    c->ns = saved;
    c->emit = emit;
    c->collect = false;
    if (st != LOOM_OK)
        return st;
    ns->n_groups = 0;
    for (int32_t d = 0; d < ns->n_dims; d++) {
        ns->dim_group[d] = -1;
        if (ns->ext[d] == 1)
            continue;
        int32_t gi = ns->n_groups - 1;
        bool merge = gi >= 0 && !ns->no_merge && ns->g_red[gi] == ns->red[d];
        for (int32_t l = 0; merge && l < c->s->n_leaves; l++) {
            const int64_t *S = c->s->leaves[l].s;
            merge = S[ns->g_last[gi]] == S[d] * ns->ext[d];
        }
        if (merge) {
            ns->g_last[gi] = d;
            ns->g_ext[gi] *= ns->ext[d];
        } else {
            gi = ns->n_groups++;
            ns->g_last[gi] = d;
            ns->g_ext[gi] = ns->ext[d];
            ns->g_red[gi] = ns->red[d];
        }
        ns->dim_group[d] = gi;
    }
    return LOOM_OK;
}

/* Evaluates every sink in the current scope and stores those that are results. */
loom_status cg_emit_sinks(kc *c, int32_t n_sinks, const sink *sinks) {
    int32_t mark = cg_memo_mark(c);
    loom_status st = LOOM_OK;
    MlirValue vals[64];
    if (n_sinks > 64)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: more than 64 sinks");
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++)
        st = cg_eval(c, sinks[i].node, &sinks[i].map, &vals[i]);
    /* stores after all evaluation: a result may share its buffer with the value being
     * read for another (the matmul accumulator) */
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++) {
        if (!sinks[i].store)
            continue;
        MlirValue v = vals[i];
        const loom_ir_node *n = &c->g->nodes[sinks[i].node];
        MlirValue off;
        if ((st = cg_offset_of(c, sinks[i].node, &sinks[i].map, &off)) != LOOM_OK)
            break;
        cg_store_val(c->b, n->dtype, v, c->bufs[c->s->res_of[sinks[i].node]], off);
    }
    cg_memo_pop(c, mark);
    return st;
}

/* Splits a flat index over groups first..last-1 (row-major), setting their loop values. */
void cg_delinearize(kc *c, MlirValue q, int32_t n, const int32_t *groups) {
    for (int32_t i = n - 1; i >= 0; i--) {
        int32_t gi = groups[i];
        int64_t e = c->ns->g_ext[gi];
        if (i == 0) {
            c->gv[gi] = q;
        } else {
            MlirValue ev = cg_idx(c->b, e);
            c->gv[gi] = cg_bin(c->b, "arith.remui", q, ev);
            q = cg_bin(c->b, "arith.divui", q, ev);
        }
    }
}

void cg_clear_gv(kc *c) {
    for (int32_t i = 0; i < R; i++)
        c->gv[i] = (MlirValue){NULL};
}

/* A whole nest run serially (side nests, under lo == 0). */
static loom_status emit_serial_nest(kc *c, int32_t n_sinks, const sink *sinks, int32_t gi) {
    if (gi == c->ns->n_groups)
        return cg_emit_sinks(c, n_sinks, sinks);
    cg_for l;
    cg_for_begin(c->b, &l, cg_idx(c->b, 0), cg_idx(c->b, c->ns->g_ext[gi]), 0, NULL);
    c->gv[gi] = l.iv;
    loom_status st = emit_serial_nest(c, n_sinks, sinks, gi + 1);
    cg_for_end(c->b, &l, 0, NULL);
    return st;
}

/* Plans (check) or emits (under lo == 0) the side nests. space: the root (elementwise) or
 * the reduced operand. */
loom_status cg_side_nests(kc *c, const loom_ir_node *space, side_mode mode) {
    for (int32_t r = 0; r < c->k->n_results; r++) {
        int32_t id = c->k->results[r];
        const loom_ir_node *n = &c->g->nodes[id];
        bool main = false;
        switch (mode) {
        case SIDE_ELEMENTWISE: main = same_shape(n, space); break;
        case SIDE_REDUCTION: main = c->s->dep_root[id] || same_shape(n, space); break;
        case SIDE_MATMUL: main = c->s->dep_root[id]; break;
        case SIDE_CONCAT: main = id == c->k->root; break;
        }
        if (main || loom_ir_numel(n->rank, n->shape) == 0)
            continue;
        nest ns;
        cg_nest_init(&ns, n->rank, n->shape);
        sink sk = {.node = id, .store = true};
        cg_identity_map(&ns, &sk.map);
        int32_t saved_bound = c->bound;
        c->bound = -1;
        loom_status st = cg_plan_nest(c, &ns, 1, &sk);
        if (st == LOOM_OK && c->emit) {
            const nest *saved = c->ns;
            c->ns = &ns;
            cg_clear_gv(c);
            cg_if f;
            cg_if_begin(c->b, &f, cg_cmpi(c->b, CG_I_EQ, c->lo, cg_idx(c->b, 0)));
            st = emit_serial_nest(c, 1, &sk, 0);
            cg_if_end(c->b, &f);
            c->ns = saved;
        }
        c->bound = saved_bound;
        if (st != LOOM_OK)
            return st;
    }
    return LOOM_OK;
}

loom_status cg_plan_epilogue(kc *c, nest *ns, sink *epi, int32_t *n_epi, int32_t skip) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    cg_nest_init(ns, root->rank, root->shape);
    ns->no_merge = true;
    c->bound = c->k->root;
    cg_identity_map(ns, &c->bound_map);
    *n_epi = 0;
    for (int32_t i = 0; i < c->k->n_results; i++) {
        int32_t id = c->k->results[i];
        if (!c->s->dep_root[id])
            continue;
        if (!same_shape(&g->nodes[id], root))
            return cg_unsupported(c, id,
                                  "an epilogue result whose shape is not its kernel's "
                                  "product's");
        if (id == skip)
            continue;
        if (*n_epi == CG_EPI_MAX)
            return cg_unsupported(c, id, "more than 64 epilogue results");
        epi[*n_epi] = (sink){.node = id, .store = true};
        cg_identity_map(ns, &epi[(*n_epi)++].map);
    }
    loom_status st = cg_side_nests(c, root, SIDE_MATMUL);
    return st != LOOM_OK ? st : cg_plan_nest(c, ns, *n_epi, epi);
}

void cg_set_dims(kc *c, const loom_ir_node *root, int32_t lo, int32_t hi, MlirValue q) {
    for (int32_t d = hi - 1; d >= lo; d--) {
        MlirValue at = d == lo ? q : irem(c->b, q, root->shape[d]);
        if (d > lo)
            q = idiv(c->b, q, root->shape[d]);
        if (c->ns->dim_group[d] >= 0)
            c->gv[c->ns->dim_group[d]] = at;
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int32_t cg_sort_unique(int64_t *v, int32_t n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_i64);
    int32_t u = 0;
    for (int32_t i = 0; i < n; i++)
        if (u == 0 || v[i] != v[u - 1])
            v[u++] = v[i];
    return u;
}

int64_t cg_grain_for(int64_t work_per_iter) {
    int64_t w = work_per_iter > 0 ? work_per_iter : 1;
    int64_t gr = ceil_div(TASK_WORK, w);
    return gr > 0 ? gr : 1;
}
