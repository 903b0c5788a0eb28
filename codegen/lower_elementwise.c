/* Lowering of ELEMENTWISE kernels: loop nests over the root's shape, blocked, tiled where a
 * leaf is read transposed, split where pads start and end; concat roots (lower_kernel.c). */
#include <string.h>

#include "lower_internal.h"

enum {
    BLOCK_MAX = 16384, /* innermost elementwise extent above which it is split in blocks */
    BLOCK = 8192,
    PAD_PARTS_MAX = 16,   /* loops an innermost loop is split into at most */
    TRANSPOSE_TILE = 16,  /* a transposed nest's tile (a cache line of f32) */
    TRANSPOSE_UNROLL = 8, /* its tile is unrolled in kernels of at most this many nodes */
};

/* ---- ELEMENTWISE -------------------------------------------------------------------------- */

/* One loop nest of an elementwise kernel, as a flat range of task indices: outer dims times
 * blocks of the innermost group. */
typedef struct ew_nest {
    nest ns;
    sink sinks[64];
    int32_t n_sinks;
    int64_t inner, blk, nb, count; /* count: task indices (outer * nb), 0 when empty */
    /* the innermost loop's parts [part[i], part[i + 1]) (n_parts 0: one loop, unsplit) */
    int32_t n_parts;
    int64_t part[PAD_PARTS_MAX + 1];
    int32_t tile_g; /* transposed nest: the group tiled by TRANSPOSE_TILE, else -1 */
    int64_t work;   /* elements per task index */
} ew_nest;

/* Splits the innermost loop (when unblocked) where pads read along it enter or leave their
 * operand: in each part every such pad is all operand (a contiguous load, no clamp, no
 * select) or all pad value. The conv backward's sum of nine pads is then a plain vector
 * sum over the middle part. */
static void plan_pad_parts(kc *c, ew_nest *e) {
    e->n_parts = 0;
    int32_t ng = e->ns.n_groups;
    if (ng == 0 || e->nb != 1 || c->n_cuts == 0)
        return;
    int32_t d = e->ns.g_last[ng - 1];
    int64_t at[2 * PAD_CUTS_MAX + 2];
    int32_t n = 0;
    at[n++] = 0;
    at[n++] = e->inner;
    for (int32_t i = 0; i < c->n_cuts; i++) {
        if (c->cut_dim[i] != d)
            continue;
        if (c->cut_lo[i] > 0 && c->cut_lo[i] < e->inner)
            at[n++] = c->cut_lo[i];
        if (c->cut_hi[i] > 0 && c->cut_hi[i] < e->inner)
            at[n++] = c->cut_hi[i];
    }
    int32_t u = cg_sort_unique(at, n);
    if (u - 1 > PAD_PARTS_MAX)
        return; /* too many parts: one loop with per-element selects */
    e->n_parts = u - 1;
    memcpy(e->part, at, (size_t)u * sizeof at[0]);
}

/* A transposed nest: some leaf is read with a stride along the innermost loop but
 * contiguously along an outer group. Looping in output order would then touch a new cache
 * line (often a new page) per element; instead each task takes a tile of TRANSPOSE_TILE
 * indices of that group and runs it innermost, under the loop over the innermost group:
 * the strided leaf is read a line at a time and the results are written to TRANSPOSE_TILE
 * rows that stay in L1. A [64,36864] transpose ran 4x faster. Returns the group, or -1. */
static int32_t transposed_group(const kc *c, const ew_nest *e) {
    const nest *ns = &e->ns;
    int32_t ng = ns->n_groups, gl = ng - 1;
    if (ng < 2 || e->nb != 1 || e->n_parts > 0 || ns->g_ext[gl] < TRANSPOSE_TILE)
        return -1;
    for (int32_t l = 0; l < c->s->n_leaves; l++) {
        const int64_t *S = c->s->leaves[l].s;
        if (S[ns->g_last[gl]] <= 1)
            continue;
        for (int32_t gi = 0; gi < gl; gi++)
            if (S[ns->g_last[gi]] == 1 && ns->g_ext[gi] >= TRANSPOSE_TILE)
                return gi;
    }
    return -1;
}

static loom_status plan_ew_nest(kc *c, ew_nest *e) {
    loom_status st = cg_plan_nest(c, &e->ns, e->n_sinks, e->sinks);
    if (st != LOOM_OK)
        return st;
    int32_t ng = e->ns.n_groups;
    int64_t numel = 1;
    for (int32_t d = 0; d < e->ns.n_dims; d++)
        numel *= e->ns.ext[d];
    e->inner = ng > 0 ? e->ns.g_ext[ng - 1] : 1;
    e->blk = e->inner > BLOCK_MAX ? BLOCK : e->inner;
    e->nb = ng > 0 ? ceil_div(e->inner, e->blk) : 1;
    int64_t outer = 1;
    for (int32_t gi = 0; gi + 1 < ng; gi++)
        outer *= e->ns.g_ext[gi];
    e->count = numel > 0 && e->n_sinks > 0 ? outer * e->nb : 0;
    e->work = e->blk;
    plan_pad_parts(c, e);
    e->tile_g = transposed_group(c, e);
    if (e->tile_g >= 0 && e->count > 0) {
        int64_t ext = e->ns.g_ext[e->tile_g];
        e->count = outer / ext * ceil_div(ext, TRANSPOSE_TILE);
        e->work = e->inner * TRANSPOSE_TILE;
    }
    return LOOM_OK;
}

/* Emits the task indices [lo, hi) of the kernel that fall in [base, base + count). */
static loom_status emit_ew_nest(kc *c, ew_nest *e, int64_t base) {
    if (e->count == 0)
        return LOOM_OK;
    cg_b *b = c->b;
    c->ns = &e->ns;
    cg_clear_gv(c);
    MlirValue lo = c->lo, hi = c->hi;
    if (base != 0 || e->count != c->extent) { /* clip to this nest's part, rebased to 0 */
        MlirValue bv = cg_idx(b, base), ev = cg_idx(b, base + e->count);
        lo = cg_select(b, cg_cmpi(b, CG_I_ULT, lo, bv), bv, lo);
        hi = cg_imin(b, hi, ev);
        hi = cg_select(b, cg_cmpi(b, CG_I_ULT, hi, lo), lo, hi);
        lo = cg_bin(b, "arith.subi", lo, bv);
        hi = cg_bin(b, "arith.subi", hi, bv);
    }
    int32_t ng = e->ns.n_groups;
    loom_status st;
    cg_for l;
    cg_for_begin(b, &l, lo, hi, 0, NULL);
    if (e->tile_g >= 0) {
        /* task = (other outer groups, tile of tile_g); for j innermost: for i in tile */
        int32_t tg = e->tile_g, rest[R], n_rest = 0;
        for (int32_t gi = 0; gi + 1 < ng; gi++)
            if (gi != tg)
                rest[n_rest++] = gi;
        int64_t ext = e->ns.g_ext[tg], n_tiles = ceil_div(ext, TRANSPOSE_TILE);
        MlirValue ntv = cg_idx(b, n_tiles);
        MlirValue i0 = cg_imul_c(b, cg_bin(b, "arith.remui", l.iv, ntv), TRANSPOSE_TILE);
        cg_delinearize(c, cg_bin(b, "arith.divui", l.iv, ntv), n_rest, rest);
        MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, TRANSPOSE_TILE)), cg_idx(b, ext));
        cg_for lj, li;
        cg_for_begin(b, &lj, cg_idx(b, 0), cg_idx(b, e->inner), 0, NULL);
        c->gv[ng - 1] = lj.iv;
        if (ext % TRANSPOSE_TILE == 0 && c->k->n_nodes <= TRANSPOSE_UNROLL) {
            /* unrolled: as a loop, LLVM vectorizes the tile with scatters (3x slower) */
            st = LOOM_OK;
            for (int64_t t = 0; t < TRANSPOSE_TILE && st == LOOM_OK; t++) {
                c->gv[tg] = cg_iadd(b, i0, cg_idx(b, t));
                st = cg_emit_sinks(c, e->n_sinks, e->sinks);
            }
        } else {
            cg_for_begin(b, &li, i0, i1, 0, NULL);
            c->gv[tg] = li.iv;
            st = cg_emit_sinks(c, e->n_sinks, e->sinks);
            cg_for_end(b, &li, 0, NULL);
        }
        cg_for_end(b, &lj, 0, NULL);
    } else if (ng == 0) {
        st = cg_emit_sinks(c, e->n_sinks, e->sinks);
    } else {
        MlirValue q = l.iv, j0 = cg_idx(b, 0), j1 = cg_idx(b, e->inner);
        if (e->nb > 1) {
            MlirValue nbv = cg_idx(b, e->nb);
            MlirValue blkv = cg_bin(b, "arith.remui", q, nbv);
            q = cg_bin(b, "arith.divui", q, nbv);
            j0 = cg_imul_c(b, blkv, e->blk);
            j1 = cg_imin(b, cg_iadd(b, j0, cg_idx(b, e->blk)), cg_idx(b, e->inner));
        }
        int32_t outer_groups[R];
        for (int32_t gi = 0; gi + 1 < ng; gi++)
            outer_groups[gi] = gi;
        cg_delinearize(c, q, ng - 1, outer_groups);
        st = LOOM_OK;
        c->in_dim = e->n_parts > 0 ? e->ns.g_last[ng - 1] : -1;
        for (int32_t p = 0; p < (e->n_parts > 0 ? e->n_parts : 1) && st == LOOM_OK; p++) {
            if (e->n_parts > 0) {
                c->in_lo = e->part[p];
                c->in_hi = e->part[p + 1];
                j0 = cg_idx(b, c->in_lo);
                j1 = cg_idx(b, c->in_hi);
            }
            cg_for in;
            cg_for_begin(b, &in, j0, j1, 0, NULL);
            c->gv[ng - 1] = in.iv;
            st = cg_emit_sinks(c, e->n_sinks, e->sinks);
            cg_for_end(b, &in, 0, NULL);
        }
        c->in_dim = -1;
    }
    cg_for_end(b, &l, 0, NULL);
    return st;
}

/* A concat root: one nest per operand over its part of the result, where the concat reads
 * that operand alone at an offset (no selects: one pass over memory). */
static loom_status lower_concat(kc *c) {
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    loom_status st = cg_side_nests(c, root, SIDE_CONCAT);
    if (st != LOOM_OK)
        return st;
    int32_t a = (int32_t)root->attrs.index, n = root->n_inputs;
    ew_nest *parts = loom_ir_alloc(&c->s->alloc, (size_t)n * sizeof *parts);
    if (!parts)
        return cg_oom(c);
    int64_t total = 0, blk = 1, at = 0;
    for (int32_t k = 0; k < n && st == LOOM_OK; k++) {
        ew_nest *e = &parts[k];
        int64_t shape[R];
        memcpy(shape, root->shape, sizeof(int64_t) * (size_t)root->rank);
        shape[a] = c->g->nodes[root->inputs[k]].shape[a];
        cg_nest_init(&e->ns, root->rank, shape);
        e->n_sinks = 0;
        if (c->s->res_of[c->k->root] >= 0) {
            e->sinks[0] = (sink){.node = c->k->root, .store = true};
            cg_identity_map(&e->ns, &e->sinks[0].map);
            e->sinks[0].map.off[a] = at;
            e->n_sinks = 1;
        }
        at += shape[a];
        st = plan_ew_nest(c, e);
        total += e->count;
        if (e->work > blk)
            blk = e->work;
    }
    c->extent = total > 0 ? total : 1;
    c->grain = cg_grain_for(blk);
    int64_t base = 0;
    for (int32_t k = 0; k < n && st == LOOM_OK && c->emit; k++) {
        st = emit_ew_nest(c, &parts[k], base);
        base += parts[k].count;
    }
    loom_ir_free(&c->s->alloc, parts, (size_t)n * sizeof *parts);
    return st;
}

loom_status cg_lower_elementwise(kc *c) {
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    if (root->op == LOOM_IR_OP_CONCAT)
        return lower_concat(c);
    loom_status st = cg_side_nests(c, root, SIDE_ELEMENTWISE);
    if (st != LOOM_OK)
        return st;
    ew_nest *e = loom_ir_alloc(&c->s->alloc, sizeof *e);
    if (!e)
        return cg_oom(c);
    cg_nest_init(&e->ns, root->rank, root->shape);
    e->n_sinks = 0;
    for (int32_t r = 0; r < c->k->n_results && st == LOOM_OK; r++) {
        int32_t id = c->k->results[r];
        if (!same_shape(&c->g->nodes[id], root))
            continue;
        if (e->n_sinks == 64) {
            st = cg_unsupported(c, id, "more than 64 results of one shape in a kernel");
            break;
        }
        e->sinks[e->n_sinks] = (sink){.node = id, .store = true};
        cg_identity_map(&e->ns, &e->sinks[e->n_sinks++].map);
    }
    if (st == LOOM_OK)
        st = plan_ew_nest(c, e);
    if (st == LOOM_OK) {
        c->extent = e->count > 0 ? e->count : 1;
        c->grain = cg_grain_for(e->work);
        if (c->emit)
            st = emit_ew_nest(c, e, 0);
    }
    loom_ir_free(&c->s->alloc, e, sizeof *e);
    return st;
}
