/* Per-element evaluation of a kernel's fused nodes at an index of its loop nest: the memo of
 * values per (node, map), dtypes and their conversions, leaves and their offsets, and every
 * elementwise op (see lower_kernel.c for how maps and nests work). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"

/* ---- memo: (node, map) -> value, scoped like the loops it was built in ---------------------- */

static uint32_t map_key(const imap *m) {
    uint64_t k = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < R; i++) {
        k = (k ^ (uint64_t)(m->dim[i] + 1)) * 0x100000001b3ull;
        k = (k ^ (uint64_t)m->off[i]) * 0x100000001b3ull;
        k = (k ^ (uint64_t)m->scale[i]) * 0x100000001b3ull;
    }
    return (uint32_t)(k ^ (k >> 32));
}

static bool map_equal(const imap *a, const imap *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

void cg_map_none(imap *m) {
    memset(m, 0, sizeof *m);
    for (int32_t i = 0; i < R; i++)
        m->dim[i] = -1;
}

static bool memo_find(kc *c, int32_t node, uint32_t key, const imap *map, MlirValue *out) {
    for (int32_t e = c->s->memo_head[node]; e >= 0; e = c->s->memo[e].prev)
        if (c->s->memo[e].key == key && map_equal(&c->s->memo[e].map, map)) {
            *out = c->s->memo[e].v;
            return true;
        }
    return false;
}

static loom_status memo_push(kc *c, int32_t node, uint32_t key, const imap *map, MlirValue v) {
    cg_scratch *s = c->s;
    if (!loom_ir_grow(&s->alloc, (void **)&s->memo, &s->cap_memo, s->n_memo + 1, sizeof(memo_ent)))
        return cg_oom(c);
    s->memo[s->n_memo] =
        (memo_ent){.node = node, .key = key, .prev = s->memo_head[node], .map = *map, .v = v};
    s->memo_head[node] = s->n_memo++;
    return LOOM_OK;
}

int32_t cg_memo_mark(kc *c) {
    return c->s->n_memo;
}

void cg_memo_pop(kc *c, int32_t mark) {
    cg_scratch *s = c->s;
    while (s->n_memo > mark) {
        memo_ent *e = &s->memo[--s->n_memo];
        s->memo_head[e->node] = e->prev;
    }
}

/* ---- types and dtypes ------------------------------------------------------------------- */

MlirType cg_storage_type(cg_b *b, loom_dtype dt) {
    switch (dt) {
    case LOOM_DTYPE_F32: return b->f32;
    case LOOM_DTYPE_F16: return b->f16;
    case LOOM_DTYPE_BF16: return b->i16; /* converted by bit manipulation: portable, exact */
    case LOOM_DTYPE_F64: return b->f64;
    case LOOM_DTYPE_I32: return b->i32;
    case LOOM_DTYPE_I64: return b->i64;
    case LOOM_DTYPE_BOOL: return b->i8;
    case LOOM_DTYPE_COUNT_: break;
    }
    return b->i8;
}

/* f32 compute type (f32, f16, bf16) */
static bool is_f32c(loom_dtype dt) {
    return dt == LOOM_DTYPE_F32 || is_16(dt);
}

MlirType cg_compute_type(cg_b *b, loom_dtype dt) {
    switch (dt) {
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16: return b->f32;
    case LOOM_DTYPE_F64: return b->f64;
    case LOOM_DTYPE_I32: return b->i32;
    case LOOM_DTYPE_I64: return b->i64;
    case LOOM_DTYPE_BOOL: return b->i1;
    case LOOM_DTYPE_COUNT_: break;
    }
    return b->i1;
}

/* An integer constant of type it in v's shape (a scalar, or a vector of v's lanes). */
static MlirValue int_like(cg_b *b, MlirValue v, MlirType it, int64_t x) {
    MlirType t = mlirValueGetType(v);
    MlirValue s = cg_ci(b, it, x);
    return mlirTypeIsAVector(t) ? cg_vbroadcast(b, s, cg_vec_t(mlirShapedTypeGetDimSize(t, 0), it))
                                : s;
}

static MlirValue i32_like(cg_b *b, MlirValue v, int64_t x) {
    return int_like(b, v, b->i32, x);
}

static MlirType like(cg_b *b, MlirValue v, MlirType elem) {
    MlirType t = mlirValueGetType(v);
    return mlirTypeIsAVector(t) ? cg_vec_t(mlirShapedTypeGetDimSize(t, 0), elem) : elem;
}

/* Rounds an f32 value to the 16-bit dtype's precision (and back to f32). bf16 follows
 * loom_ir_f32_to_bf16 bit for bit: round to nearest even, NaN kept quiet. */
MlirValue cg_round16(cg_b *b, loom_dtype dt, MlirValue v) {
    MlirType ft = mlirValueGetType(v);
    if (dt == LOOM_DTYPE_F16)
        return cg_conv(b, "arith.extf", cg_conv(b, "arith.truncf", v, like(b, v, b->f16)), ft);
    MlirValue u = cg_conv(b, "arith.bitcast", v, like(b, v, b->i32));
    MlirValue absu = cg_bin(b, "arith.andi", u, i32_like(b, v, 0x7fffffff));
    MlirValue nan = mlirTypeIsAVector(ft) ? cg_vcmpi(b, CG_I_UGT, absu, i32_like(b, v, 0x7f800000))
                                          : cg_cmpi(b, CG_I_UGT, absu, i32_like(b, v, 0x7f800000));
    MlirValue odd =
        cg_bin(b, "arith.andi", cg_bin(b, "arith.shrui", u, i32_like(b, v, 16)), i32_like(b, v, 1));
    MlirValue r = cg_bin(b, "arith.addi", u, cg_bin(b, "arith.addi", odd, i32_like(b, v, 0x7fff)));
    MlirValue quiet = cg_bin(b, "arith.ori", u, i32_like(b, v, 0x400000));
    r = cg_select(b, nan, quiet, r);
    r = cg_bin(b, "arith.andi", r, i32_like(b, v, (int32_t)0xffff0000u));
    return cg_conv(b, "arith.bitcast", r, ft);
}

MlirValue cg_widen16(cg_b *b, loom_dtype dt, MlirValue v) {
    if (dt == LOOM_DTYPE_F16)
        return cg_conv(b, "arith.extf", v, like(b, v, b->f32));
    if (dt != LOOM_DTYPE_BF16)
        return v;
    MlirValue w = cg_conv(b, "arith.extui", v, like(b, v, b->i32));
    w = cg_bin(b, "arith.shli", w, i32_like(b, v, 16));
    return cg_conv(b, "arith.bitcast", w, like(b, v, b->f32));
}

MlirValue cg_narrow16(cg_b *b, loom_dtype dt, MlirValue v) {
    if (dt == LOOM_DTYPE_F16)
        return cg_conv(b, "arith.truncf", v, like(b, v, b->f16));
    if (dt != LOOM_DTYPE_BF16)
        return v;
    MlirValue u = cg_conv(b, "arith.bitcast", v, like(b, v, b->i32));
    u = cg_bin(b, "arith.shrui", u, i32_like(b, v, 16));
    return cg_conv(b, "arith.trunci", u, like(b, v, b->i16));
}

MlirValue cg_load_val(cg_b *b, loom_dtype dt, MlirValue mem, MlirValue off) {
    MlirValue raw = cg_load(b, mem, off);
    switch (dt) {
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16: return cg_widen16(b, dt, raw);
    case LOOM_DTYPE_BOOL: return cg_cmpi(b, CG_I_NE, raw, cg_ci(b, b->i8, 0));
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_F64:
    case LOOM_DTYPE_I32:
    case LOOM_DTYPE_I64:
    case LOOM_DTYPE_COUNT_: break;
    }
    return raw;
}

/* v is in the compute type and already rounded to dt. */
void cg_store_val(cg_b *b, loom_dtype dt, MlirValue v, MlirValue mem, MlirValue off) {
    switch (dt) {
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16: v = cg_narrow16(b, dt, v); break;
    case LOOM_DTYPE_BOOL: v = cg_conv(b, "arith.extui", v, b->i8); break;
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_F64:
    case LOOM_DTYPE_I32:
    case LOOM_DTYPE_I64:
    case LOOM_DTYPE_COUNT_: break;
    }
    cg_store(b, v, mem, off);
}

/* A constant node's value, computed on the host exactly as the interpreter fills it. */
static MlirValue const_val(cg_b *b, const loom_ir_node *n) {
    unsigned char buf[8];
    loom_ir_store_f64(buf, n->dtype, 0, n->attrs.value);
    MlirType t = cg_compute_type(b, n->dtype);
    if (loom_ir_dtype_is_float(n->dtype))
        return cg_cf(b, t, loom_ir_load_f64(buf, n->dtype, 0));
    return cg_ci(b, t, loom_ir_load_i64(buf, n->dtype, 0));
}

/* float -> integer: truncation toward zero, saturating, NaN -> 0 (never poison). */
static MlirValue fptosi_sat(cg_b *b, MlirValue v, MlirType to, int bits) {
    MlirType ft = mlirValueGetType(v);
    double lim = ldexp(1.0, bits - 1);
    int64_t max = bits == 32 ? INT32_MAX : INT64_MAX, min = bits == 32 ? INT32_MIN : INT64_MIN;
    MlirValue r = cg_conv(b, "arith.fptosi", v, to);
    r = cg_select(b, cg_cmpf(b, CG_F_OGE, v, cg_cf(b, ft, lim)), cg_ci(b, to, max), r);
    r = cg_select(b, cg_cmpf(b, CG_F_OLT, v, cg_cf(b, ft, -lim)), cg_ci(b, to, min), r);
    return cg_select(b, cg_cmpf(b, CG_F_UNO, v, v), cg_ci(b, to, 0), r);
}

/* The interpreter's cast: floats through double, integers and bool through int64. */
static MlirValue cast_val(cg_b *b, loom_dtype from, loom_dtype to, MlirValue v) {
    if (from == to)
        return v;
    MlirType tt = cg_compute_type(b, to);
    bool ffloat = loom_ir_dtype_is_float(from), tfloat = loom_ir_dtype_is_float(to);
    if (to == LOOM_DTYPE_BOOL) {
        if (ffloat)
            return cg_cmpf(b, CG_F_UNE, v, cg_cf(b, mlirValueGetType(v), 0.0));
        return cg_cmpi(b, CG_I_NE, v, cg_ci(b, mlirValueGetType(v), 0));
    }
    if (from == LOOM_DTYPE_BOOL) {
        if (tfloat)
            return cg_select(b, v, cg_cf(b, tt, 1.0), cg_cf(b, tt, 0.0));
        return cg_conv(b, "arith.extui", v, tt);
    }
    if (!ffloat && !tfloat) { /* i32 <-> i64 */
        return to == LOOM_DTYPE_I64 ? cg_conv(b, "arith.extsi", v, tt)
                                    : cg_conv(b, "arith.trunci", v, tt);
    }
    if (ffloat && !tfloat)
        return fptosi_sat(b, v, tt, to == LOOM_DTYPE_I32 ? 32 : 64);
    MlirValue f;
    if (!ffloat) {
        /* int -> float: through double, as the interpreter (i64 -> f32 rounds twice) */
        if (from == LOOM_DTYPE_I32 && to == LOOM_DTYPE_F32)
            return cg_conv(b, "arith.sitofp", v, b->f32); /* exact in double: one rounding */
        f = cg_conv(b, "arith.sitofp", v, b->f64);
    } else {
        f = v;
    }
    /* float -> float */
    MlirType ft = mlirValueGetType(f);
    if (to == LOOM_DTYPE_F64)
        return mlirTypeEqual(ft, b->f64) ? f : cg_conv(b, "arith.extf", f, b->f64);
    if (mlirTypeEqual(ft, b->f64))
        f = cg_conv(b, "arith.truncf", f, b->f32);
    return is_16(to) ? cg_round16(b, to, f) : f;
}

/* ---- walking the fused nodes ------------------------------------------------------------ */

static void row_major(const loom_ir_node *n, int64_t *st) {
    int64_t s = 1;
    for (int32_t i = n->rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= n->shape[i];
    }
}

/* A leaf's flat offset is base + sum_d iter[d] * S[d] (row-major strides times scales). */
static int64_t leaf_strides(const loom_ir_node *n, const imap *map, int64_t *S) {
    int64_t st[R], base = 0;
    row_major(n, st);
    for (int32_t d = 0; d < R; d++)
        S[d] = 0;
    for (int32_t k = 0; k < n->rank; k++) {
        base += st[k] * map->off[k];
        if (map->dim[k] >= 0)
            S[map->dim[k]] += st[k] * map->scale[k];
    }
    return base;
}

/* Records an affine function of the iteration dims that will be computed from the loop
 * values: dims merge into one loop only where it stays affine in the merged index. */
static loom_status add_leaf_s(kc *c, const int64_t *S) {
    cg_scratch *s = c->s;
    if (!loom_ir_grow(&s->alloc, (void **)&s->leaves, &s->cap_leaves, s->n_leaves + 1,
                      sizeof(leaf)))
        return cg_oom(c);
    memcpy(s->leaves[s->n_leaves++].s, S, sizeof(int64_t) * R);
    return LOOM_OK;
}

loom_status cg_add_leaf(kc *c, const loom_ir_node *n, const imap *map) {
    int64_t S[R];
    leaf_strides(n, map, S);
    return add_leaf_s(c, S);
}

/* base + sum_d iter[d] * S[d] in the current nest's loops (an index value); the function
 * was recorded with add_leaf_s when the nest was planned. */
static loom_status affine_of(kc *c, int32_t id, int64_t base, const int64_t *S, MlirValue *out) {
    MlirValue off = cg_idx(c->b, base);
    for (int32_t gi = 0; gi < c->ns->n_groups; gi++) {
        int64_t st = S[c->ns->g_last[gi]];
        if (st == 0)
            continue;
        if (mlirValueIsNull(c->gv[gi]))
            return cg_bad_plan(c, id, "an index of this value is not in scope (codegen bug)");
        off = cg_iadd(c->b, off, cg_imul_c(c->b, c->gv[gi], st));
    }
    *out = off;
    return LOOM_OK;
}

/* The flat offset of node n at `map` in the current nest's loops. */
loom_status cg_offset_of(kc *c, int32_t id, const imap *map, MlirValue *out) {
    int64_t S[R];
    int64_t base = leaf_strides(&c->g->nodes[id], map, S);
    return affine_of(c, id, base, S, out);
}

/* The index along axis k of a node read at map: one iteration dim, scaled and offset. */
static void axis_strides(const imap *map, int32_t k, int64_t *S) {
    for (int32_t d = 0; d < R; d++)
        S[d] = 0;
    if (map->dim[k] >= 0)
        S[map->dim[k]] = map->scale[k];
}

/* Where operand q of concat n starts along its axis. */
static int64_t concat_start(const loom_ir_graph *g, const loom_ir_node *n, int32_t q) {
    int64_t at = 0;
    for (int32_t k = 0; k < q; k++)
        at += g->nodes[n->inputs[k]].shape[n->attrs.index];
    return at;
}

/* The map of operand `k` of node n, given n's map (ops that read operands at an affine
 * index: elementwise, broadcast, transpose, slice, concat; for concat only valid inside
 * operand k's part of the result). */
static void operand_map(const loom_ir_graph *g, const loom_ir_node *n, int32_t k, const imap *map,
                        imap *out) {
    const loom_ir_node *x = &g->nodes[n->inputs[k]];
    cg_map_none(out);
    if (n->op == LOOM_IR_OP_BROADCAST) {
        int32_t off = n->rank - x->rank;
        for (int32_t i = 0; i < x->rank; i++) {
            out->dim[i] = map->dim[off + i];
            out->off[i] = map->off[off + i];
            out->scale[i] = map->scale[off + i];
        }
    } else if (n->op == LOOM_IR_OP_TRANSPOSE) {
        for (int32_t i = 0; i < n->rank; i++) {
            out->dim[n->attrs.perm[i]] = map->dim[i];
            out->off[n->attrs.perm[i]] = map->off[i];
            out->scale[n->attrs.perm[i]] = map->scale[i];
        }
    } else if (n->op == LOOM_IR_OP_SLICE) {
        for (int32_t i = 0; i < n->rank; i++) {
            out->dim[i] = map->dim[i];
            out->off[i] = n->attrs.start[i] + n->attrs.step[i] * map->off[i];
            out->scale[i] = n->attrs.step[i] * map->scale[i];
        }
    } else {
        for (int32_t i = 0; i < x->rank; i++) {
            out->dim[i] = map->dim[i];
            out->off[i] = map->off[i];
            out->scale[i] = map->scale[i];
        }
        if (n->op == LOOM_IR_OP_CONCAT)
            out->off[n->attrs.index] -= concat_start(g, n, k);
    }
    for (int32_t i = 0; i < x->rank; i++) /* an extent of 1 is only ever read at index 0 */
        if (x->shape[i] == 1) {
            out->dim[i] = -1;
            out->off[i] = out->scale[i] = 0;
        }
}

static loom_status apply(kc *c, int32_t id, const MlirValue *x, MlirValue *out);

/* iota: the index along its axis, converted as the interpreter stores an int64. */
static loom_status eval_iota(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    int32_t a = (int32_t)n->attrs.index;
    int64_t S[R];
    axis_strides(map, a, S);
    if (c->collect)
        return add_leaf_s(c, S);
    if (!c->emit)
        return LOOM_OK;
    MlirValue i;
    loom_status st = affine_of(c, id, map->off[a], S, &i);
    if (st == LOOM_OK)
        *out = cast_val(c->b, LOOM_DTYPE_I64, n->dtype,
                        cg_conv(c->b, "arith.index_cast", i, c->b->i64));
    return st;
}

static MlirValue i64_like(cg_b *b, MlirValue v, int64_t x) {
    return int_like(b, v, b->i64, x);
}

MlirValue cg_rand_draw(cg_b *b, MlirValue seed, MlirValue i, MlirType ft) {
    MlirValue z = cg_bin(b, "arith.muli", cg_bin(b, "arith.addi", i, i64_like(b, i, 1)),
                         i64_like(b, i, (int64_t)LOOM_IR_RAND_GAMMA));
    z = cg_bin(b, "arith.addi", seed, z);
    static const uint64_t mul[2] = {LOOM_IR_RAND_M1, LOOM_IR_RAND_M2};
    static const int64_t shift[3] = {LOOM_IR_RAND_S1, LOOM_IR_RAND_S2, LOOM_IR_RAND_S3};
    for (int r = 0; r < 3; r++) {
        z = cg_bin(b, "arith.xori", z, cg_bin(b, "arith.shrui", z, i64_like(b, i, shift[r])));
        if (r < 2)
            z = cg_bin(b, "arith.muli", z, i64_like(b, i, (int64_t)mul[r]));
    }
    z = cg_bin(b, "arith.shrui", z, i64_like(b, i, 64 - LOOM_IR_RAND_BITS));
    MlirType vt = like(b, i, ft);
    MlirValue v = cg_conv(b, "arith.uitofp", z, vt),
              s = cg_cf(b, ft, ldexp(1.0, -LOOM_IR_RAND_BITS));
    return cg_bin(b, "arith.mulf", v, mlirTypeIsAVector(vt) ? cg_vbroadcast(b, s, vt) : s);
}

/* rand_uniform: SplitMix64 of seed + (i + 1) * golden gamma at the row-major index i, top 24
 * bits times 2^-24 (loom_ir_rand_uniform), exact in f32, rounded to 16-bit floats after. */
static loom_status eval_rand(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    imap sm;
    cg_map_none(&sm);
    MlirValue seed = {NULL};
    loom_status st = cg_eval(c, n->inputs[0], &sm, &seed);
    if (st != LOOM_OK)
        return st;
    if (c->collect && (st = cg_add_leaf(c, n, map)) != LOOM_OK)
        return st;
    if (!c->emit)
        return LOOM_OK;
    cg_b *b = c->b;
    MlirValue i;
    if ((st = cg_offset_of(c, id, map, &i)) != LOOM_OK)
        return st;
    i = cg_conv(b, "arith.index_cast", i, b->i64);
    MlirValue v = cg_rand_draw(b, seed, i, n->dtype == LOOM_DTYPE_F64 ? b->f64 : b->f32);
    *out = is_16(n->dtype) ? cg_round16(b, n->dtype, v) : v;
    return LOOM_OK;
}

/* Where along the nest dim of pad n's axis k (read at map) the operand is read, [*lo, *hi),
 * when that axis has no interior padding and moves one per step of its dim; false else.
 * (Interior pads, the max pool's backward, are left to the selects: split by parity their
 * stride-2 stores became scatters, 1.5-2x slower.) */
static bool pad_axis_range(const loom_ir_node *n, const loom_ir_node *x, const imap *map, int32_t k,
                           int64_t *lo, int64_t *hi) {
    if (map->dim[k] < 0 || map->scale[k] != 1 || n->attrs.step[k] != 0)
        return false;
    if (lo) { /* result index j + off, operand index j + off - low */
        *lo = n->attrs.start[k] - map->off[k];
        *hi = *lo + x->shape[k];
    }
    return true;
}

/* off + (start + step * q) * stride: index q of a view at start, step along a buffer axis
 * `stride` elements apart. */
static MlirValue add_view_index(cg_b *b, MlirValue off, MlirValue q, int64_t start, int64_t step,
                                int64_t stride) {
    return cg_iadd(b, off, cg_iadd(b, cg_imul_c(b, q, step * stride), cg_idx(b, start * stride)));
}

/* pad: the operand at a clamped index where the result index lands on an operand element,
 * the pad value elsewhere. Unpadded axes stay affine. The operand is read from its buffer,
 * or it is a slice in the kernel (fusion.c: a pad view) and its own operand's buffer is
 * read at start + step * the clamped index. */
static loom_status eval_pad(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    int32_t xid = n->inputs[0], sid = xid; /* sid: the node whose buffer is read */
    const loom_ir_node *x = &c->g->nodes[xid];
    int64_t vstart[R], vstep[R]; /* x index k is buffer index vstart[k] + vstep[k] * it */
    for (int32_t k = 0; k < R; k++) {
        vstart[k] = 0;
        vstep[k] = 1;
    }
    if (c->s->buf_of[xid] < 0) {
        if (x->op != LOOM_IR_OP_SLICE || c->s->buf_of[x->inputs[0]] < 0)
            return cg_bad_plan(c, id,
                               "a pad whose operand is neither read from a buffer nor a "
                               "slice of one");
        sid = x->inputs[0];
        for (int32_t k = 0; k < x->rank; k++) {
            vstart[k] = x->attrs.start[k];
            vstep[k] = x->attrs.step[k];
        }
    }
    const loom_ir_node *src = &c->g->nodes[sid];
    bool padded[R];
    imap xm; /* the buffer's index along the operand's unpadded axes */
    cg_map_none(&xm);
    loom_status st = LOOM_OK;
    for (int32_t k = 0; k < n->rank; k++) {
        padded[k] = n->attrs.start[k] != 0 || n->shape[k] != x->shape[k];
        if (padded[k])
            continue;
        if (x->shape[k] != 1) {
            xm.dim[k] = map->dim[k];
            xm.off[k] = vstart[k] + vstep[k] * map->off[k];
            xm.scale[k] = vstep[k] * map->scale[k];
        } else {
            xm.off[k] = vstart[k];
        }
    }
    bool empty = loom_ir_numel(x->rank, x->shape) == 0;
    if (c->collect) {
        if (!empty && (st = cg_add_leaf(c, src, &xm)) != LOOM_OK)
            return st;
        for (int32_t k = 0; k < n->rank && st == LOOM_OK; k++) {
            int64_t S[R];
            axis_strides(map, k, S);
            if (!padded[k])
                continue;
            st = add_leaf_s(c, S);
            if (pad_axis_range(n, x, map, k, NULL, NULL) && c->n_cuts < PAD_CUTS_MAX) {
                int32_t i = c->n_cuts++;
                c->cut_dim[i] = map->dim[k];
                pad_axis_range(n, x, map, k, &c->cut_lo[i], &c->cut_hi[i]);
            }
        }
        return st;
    }
    if (!c->emit)
        return LOOM_OK;
    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, n->dtype);
    unsigned char buf[8];
    loom_ir_store_f64(buf, n->dtype, 0, n->attrs.value);
    MlirValue fill = loom_ir_dtype_is_float(n->dtype)
                         ? cg_cf(b, ct, loom_ir_load_f64(buf, n->dtype, 0))
                         : cg_ci(b, ct, loom_ir_load_i64(buf, n->dtype, 0));
    /* in the part of a split innermost loop, the innermost axis is known in or out of range */
    bool known_in[R] = {false};
    for (int32_t k = 0; k < n->rank && !empty; k++) {
        int64_t jlo, jhi;
        if (!padded[k] || c->in_dim < 0 || map->dim[k] != c->in_dim ||
            !pad_axis_range(n, x, map, k, &jlo, &jhi))
            continue;
        if (c->in_hi <= jlo || c->in_lo >= jhi)
            empty = true; /* the pad value all along this part */
        known_in[k] = c->in_lo >= jlo && c->in_hi <= jhi;
    }
    if (empty) {
        *out = fill;
        return LOOM_OK;
    }
    int64_t xst[R];
    row_major(src, xst);
    MlirValue off, hit = {NULL};
    if ((st = cg_offset_of(c, sid, &xm, &off)) != LOOM_OK)
        return st;
    for (int32_t k = 0; k < n->rank; k++) {
        if (!padded[k])
            continue;
        int64_t S[R];
        axis_strides(map, k, S);
        MlirValue o;
        if ((st = affine_of(c, id, map->off[k] - n->attrs.start[k], S, &o)) != LOOM_OK)
            return st;
        /* o = result index - low; an operand element where o >= 0, o % (interior + 1) == 0
         * and o / (interior + 1) < extent */
        int64_t step = n->attrs.step[k] + 1, ext = x->shape[k];
        if (known_in[k]) { /* o is the operand index: contiguous along the loop, no clamp */
            off = add_view_index(b, off, o, vstart[k], vstep[k], xst[k]);
            continue;
        }
        MlirValue zero = cg_idx(b, 0);
        MlirValue q = step > 1 ? cg_bin(b, "arith.divsi", o, cg_idx(b, step)) : o;
        MlirValue h = cg_bin(b, "arith.andi", cg_cmpi(b, CG_I_SGE, o, zero),
                             cg_cmpi(b, CG_I_SLT, q, cg_idx(b, ext)));
        if (step > 1)
            h = cg_bin(b, "arith.andi", h,
                       cg_cmpi(b, CG_I_EQ, cg_bin(b, "arith.remsi", o, cg_idx(b, step)), zero));
        hit = mlirValueIsNull(hit) ? h : cg_bin(b, "arith.andi", hit, h);
        q = cg_select(b, cg_cmpi(b, CG_I_SLT, q, zero), zero, q);
        q = cg_select(b, cg_cmpi(b, CG_I_SGT, q, cg_idx(b, ext - 1)), cg_idx(b, ext - 1), q);
        off = add_view_index(b, off, q, vstart[k], vstep[k], xst[k]);
    }
    MlirValue v = cg_load_val(b, x->dtype, c->bufs[c->s->buf_of[sid]], off);
    *out = mlirValueIsNull(hit) ? v : cg_select(b, hit, v, fill);
    return LOOM_OK;
}

/* concat: the operand whose part of the result holds every index the map reaches (a concat
 * root is lowered as one nest per operand, so each nest reads one operand). */
static loom_status eval_concat(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    int32_t a = (int32_t)n->attrs.index;
    int64_t lo = map->off[a], hi = lo;
    if (map->dim[a] >= 0)
        hi = lo + map->scale[a] * (c->ns->ext[map->dim[a]] - 1);
    int64_t at = 0;
    for (int32_t k = 0; k < n->n_inputs; k++) {
        int64_t e = c->g->nodes[n->inputs[k]].shape[a];
        if (lo >= at && hi < at + e) {
            imap m;
            operand_map(c->g, n, k, map, &m);
            return cg_eval(c, n->inputs[k], &m, out);
        }
        at += e;
    }
    return cg_unsupported(c, id,
                          "a concat read across the boundary of its operands (codegen "
                          "lowers a concat only as its kernel's root)");
}

/* gather: idx read from its buffer at the map, clamped into [0, extent) (ops.def), and x read
 * from its buffer at the map with its axis's index replaced by it. Scalar, as every loop
 * op: LLVM vectorizes the row (x's rows at one index are contiguous off the axis). */
static loom_status eval_gather(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    int32_t xid = n->inputs[0], iid = n->inputs[1], a = (int32_t)n->attrs.index;
    const loom_ir_node *x = &c->g->nodes[xid];
    if (c->s->buf_of[xid] < 0 || c->s->buf_of[iid] < 0)
        return cg_bad_plan(c, id, "a gather whose operands are not read from buffers");
    imap xm = *map;
    xm.dim[a] = -1; /* the axis's index comes from idx */
    xm.off[a] = xm.scale[a] = 0;
    MlirValue t = {NULL};
    loom_status st = cg_eval(c, iid, map, &t);
    if (st != LOOM_OK)
        return st;
    if (c->collect && (st = cg_add_leaf(c, x, &xm)) != LOOM_OK)
        return st;
    if (!c->emit)
        return LOOM_OK;
    cg_b *b = c->b;
    MlirValue off;
    if ((st = cg_offset_of(c, xid, &xm, &off)) != LOOM_OK)
        return st;
    int64_t stride = loom_ir_numel(x->rank - a - 1, x->shape + a + 1);
    off = cg_iadd(b, off, cg_imul_c(b, index_clamped(b, t, x->shape[a]), stride));
    *out = cg_load_val(b, x->dtype, c->bufs[c->s->buf_of[xid]], off);
    return LOOM_OK;
}

/* Evaluates node id at map (emit), or walks it recording leaves (plan). */
loom_status cg_eval(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    uint32_t key = map_key(map);
    MlirValue v = {NULL};
    if (memo_find(c, id, key, map, &v)) {
        *out = v;
        return LOOM_OK;
    }
    loom_status st = LOOM_OK;
    int32_t more = -1;
    for (int32_t i = 0; i < c->n_more; i++)
        more = id == c->more[i] ? i : more;
    if (id == c->bound || more >= 0) {
        if (!map_equal(map, &c->bound_map))
            return cg_unsupported(c, id,
                                  "the reduced or multiplied value is read through a "
                                  "broadcast, transpose or slice inside its own kernel");
        v = more >= 0 ? c->more_v[more] : c->bound_v;
    } else if (c->s->buf_of[id] >= 0) {
        if (c->collect && (st = cg_add_leaf(c, n, map)) != LOOM_OK)
            return st;
        if (c->emit) {
            MlirValue off;
            if ((st = cg_offset_of(c, id, map, &off)) != LOOM_OK)
                return st;
            v = cg_load_val(c->b, n->dtype, c->bufs[c->s->buf_of[id]], off);
        }
    } else if (!c->s->in_kernel[id]) {
        return cg_bad_plan(c, id, "read by the kernel but neither computed in it nor an arg");
    } else if (n->op == LOOM_IR_OP_IOTA || n->op == LOOM_IR_OP_RAND_UNIFORM ||
               n->op == LOOM_IR_OP_PAD || n->op == LOOM_IR_OP_CONCAT ||
               n->op == LOOM_IR_OP_GATHER) {
        st = n->op == LOOM_IR_OP_IOTA           ? eval_iota(c, id, map, &v)
             : n->op == LOOM_IR_OP_RAND_UNIFORM ? eval_rand(c, id, map, &v)
             : n->op == LOOM_IR_OP_PAD          ? eval_pad(c, id, map, &v)
             : n->op == LOOM_IR_OP_GATHER       ? eval_gather(c, id, map, &v)
                                                : eval_concat(c, id, map, &v);
        if (st != LOOM_OK)
            return st;
    } else {
        MlirValue xs[3] = {{NULL}, {NULL}, {NULL}};
        if (n->n_inputs > 3)
            return cg_unsupported(c, id, "more than three operands");
        for (int32_t k = 0; k < n->n_inputs; k++) {
            imap m;
            operand_map(c->g, n, k, map, &m);
            if ((st = cg_eval(c, n->inputs[k], &m, &xs[k])) != LOOM_OK)
                return st;
        }
        if ((st = apply(c, id, xs, &v)) != LOOM_OK)
            return st;
    }
    if ((st = memo_push(c, id, key, map, v)) != LOOM_OK)
        return st;
    *out = v;
    return LOOM_OK;
}

/* Node id's op on its operands' values (already computed at the right index). In plan mode
 * only checks that the op can be lowered. */
static loom_status apply(kc *c, int32_t id, const MlirValue *x, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    loom_dtype dt = n->dtype;
    loom_dtype xdt = n->n_inputs > 0 ? c->g->nodes[n->inputs[0]].dtype : dt;
    bool fl = loom_ir_dtype_is_float(dt), xfl = loom_ir_dtype_is_float(xdt);
    bool f32c = is_f32c(dt);
    switch (n->op) {
    case LOOM_IR_OP_INPUT:
        return cg_bad_plan(c, id, "an input inside a kernel (inputs are read as args)");
    case LOOM_IR_OP_RESHAPE:
        return cg_unsupported(c, id, "a reshape inside a kernel (plans read reshapes as args)");
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
        return cg_unsupported(c, id, "a reduction that is not its kernel's root");
    case LOOM_IR_OP_MATMUL: return cg_unsupported(c, id, "a matmul that is not its kernel's root");
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_GATHER:
    case LOOM_IR_OP_RAND_UNIFORM: return cg_bad_plan(c, id, "evaluated by eval, not apply");
    case LOOM_IR_OP_ALL_REDUCE: /* fusion refuses graphs with collectives (UNSUPPORTED) */
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER: return cg_unsupported(c, id, "a collective");
    case LOOM_IR_OP_CONV2D: /* fusion refuses them: passes/conv_decompose.c rewrites them */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
        return cg_unsupported(c, id, "a convolution (no conv kernel yet: decomposed first)");
    case LOOM_IR_OP_SCATTER_ADD: /* fusion makes it a root */
        return cg_unsupported(c, id, "a scatter_add that is not its kernel's root");
    case LOOM_IR_OP_ATTENTION: /* likewise */
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V:
        return cg_unsupported(c, id, "an attention op that is not its kernel's root");
    case LOOM_IR_OP_MAX_POOL2D: /* fusion makes them roots */
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
        return cg_unsupported(c, id, "a max pool that is not its kernel's root");
    case LOOM_IR_OP_SLICE:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_NEG:
    case LOOM_IR_OP_ABS:
    case LOOM_IR_OP_EXP:
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_RELU:
    case LOOM_IR_OP_GELU:
    case LOOM_IR_OP_GELU_TANH:
    case LOOM_IR_OP_ISFINITE:
    case LOOM_IR_OP_ADD:
    case LOOM_IR_OP_SUB:
    case LOOM_IR_OP_MUL:
    case LOOM_IR_OP_DIV:
    case LOOM_IR_OP_POW:
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM:
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE:
    case LOOM_IR_OP_SELECT:
    case LOOM_IR_OP_CAST:
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_TRANSPOSE: break;
    case LOOM_IR_OP_COUNT_: return cg_bad_plan(c, id, "unknown op");
    }
    if (!loom_ir_dtype_valid(dt) || !loom_ir_dtype_valid(xdt))
        return cg_bad_plan(c, id, "invalid dtype");
    if (!c->emit)
        return LOOM_OK;

    cg_b *b = c->b;
    MlirType ct = cg_compute_type(b, dt);
    MlirValue v = {NULL};
    bool round = is_16(dt); /* arithmetic results of 16-bit floats are rounded below */
    switch (n->op) {
    case LOOM_IR_OP_CONSTANT:
        v = const_val(b, n);
        round = false;
        break;
    case LOOM_IR_OP_NEG:
        v = fl ? cg_un(b, "arith.negf", x[0]) : cg_bin(b, "arith.subi", cg_ci(b, ct, 0), x[0]);
        break;
    case LOOM_IR_OP_ABS:
        /* abs(INT_MIN) wraps to INT_MIN, as in the interpreter */
        v = fl ? cg_un(b, "math.absf", x[0])
               : cg_select(b, cg_cmpi(b, CG_I_SLT, x[0], cg_ci(b, ct, 0)),
                           cg_bin(b, "arith.subi", cg_ci(b, ct, 0), x[0]), x[0]);
        break;
    case LOOM_IR_OP_EXP: v = f32c ? cg_exp_f32(b, x[0]) : cg_un(b, "math.exp", x[0]); break;
    case LOOM_IR_OP_LOG: v = f32c ? cg_log_f32(b, x[0]) : cg_un(b, "math.log", x[0]); break;
    case LOOM_IR_OP_SQRT: v = cg_un(b, "math.sqrt", x[0]); break;
    case LOOM_IR_OP_RSQRT:
        v = cg_bin(b, "arith.divf", cg_cf(b, ct, 1.0), cg_un(b, "math.sqrt", x[0]));
        break;
    case LOOM_IR_OP_TANH:
        v = f32c ? cg_tanh_f32(b, x[0]) : cg_call_libm(b, CG_LIBM_TANH, x[0]);
        break;
    case LOOM_IR_OP_SIGMOID:
        if (f32c) {
            v = cg_sigmoid_f32(b, x[0]);
        } else { /* the interpreter's formula, exactly */
            MlirValue e = cg_un(b, "math.exp", cg_un(b, "arith.negf", x[0]));
            v = cg_bin(b, "arith.divf", cg_cf(b, ct, 1.0),
                       cg_bin(b, "arith.addf", cg_cf(b, ct, 1.0), e));
        }
        break;
    case LOOM_IR_OP_RELU:
        /* NaN stays NaN, -0 becomes +0 (x > 0 unordered: NaN selects x) */
        v = fl ? cg_select(b, cg_cmpf(b, CG_F_UGT, x[0], cg_cf(b, ct, 0.0)), x[0],
                           cg_cf(b, ct, 0.0))
               : cg_bin(b, "arith.maxsi", x[0], cg_ci(b, ct, 0));
        break;
    case LOOM_IR_OP_GELU:
        if (f32c) {
            v = cg_gelu_f32(b, x[0]);
        } else {
            MlirValue e =
                cg_call_libm(b, CG_LIBM_ERF, cg_bin(b, "arith.divf", x[0], cg_cf(b, ct, M_SQRT2)));
            v = cg_bin(b, "arith.mulf", cg_bin(b, "arith.mulf", cg_cf(b, ct, 0.5), x[0]),
                       cg_bin(b, "arith.addf", cg_cf(b, ct, 1.0), e));
        }
        break;
    case LOOM_IR_OP_GELU_TANH: { /* x sigmoid(2 u): no cancellation for negative x */
        MlirValue x3 = cg_bin(b, "arith.mulf", cg_bin(b, "arith.mulf", x[0], x[0]), x[0]);
        MlirValue u =
            cg_bin(b, "arith.mulf", cg_cf(b, ct, 2.0 * LOOM_IR_GELU_TANH_C),
                   cg_bin(b, "arith.addf", x[0],
                          cg_bin(b, "arith.mulf", cg_cf(b, ct, LOOM_IR_GELU_TANH_K), x3)));
        if (f32c) {
            v = cg_bin(b, "arith.mulf", x[0], cg_sigmoid_f32(b, u));
        } else {
            MlirValue e = cg_un(b, "math.exp", cg_un(b, "arith.negf", u));
            v = cg_bin(b, "arith.divf", x[0], cg_bin(b, "arith.addf", cg_cf(b, ct, 1.0), e));
        }
        break;
    }
    case LOOM_IR_OP_ISFINITE: {
        MlirType xt = mlirValueGetType(x[0]);
        v = cg_cmpf(b, CG_F_OLT, cg_un(b, "math.absf", x[0]), cg_cf(b, xt, INFINITY));
        round = false;
        break;
    }
    case LOOM_IR_OP_ADD: v = cg_bin(b, fl ? "arith.addf" : "arith.addi", x[0], x[1]); break;
    case LOOM_IR_OP_SUB: v = cg_bin(b, fl ? "arith.subf" : "arith.subi", x[0], x[1]); break;
    case LOOM_IR_OP_MUL: v = cg_bin(b, fl ? "arith.mulf" : "arith.muli", x[0], x[1]); break;
    case LOOM_IR_OP_DIV:
        if (fl) {
            v = cg_bin(b, "arith.divf", x[0], x[1]);
        } else {
            /* x / 0 = 0 and INT_MIN / -1 = INT_MIN (wrapping negation), without ever
             * executing a trapping division: the divisor is replaced by 1 first. */
            MlirValue zero = cg_ci(b, ct, 0), one = cg_ci(b, ct, 1), m1 = cg_ci(b, ct, -1);
            MlirValue is0 = cg_cmpi(b, CG_I_EQ, x[1], zero);
            MlirValue ism1 = cg_cmpi(b, CG_I_EQ, x[1], m1);
            MlirValue safe = cg_select(b, cg_bin(b, "arith.ori", is0, ism1), one, x[1]);
            v = cg_bin(b, "arith.divsi", x[0], safe);
            v = cg_select(b, ism1, cg_bin(b, "arith.subi", zero, x[0]), v);
            v = cg_select(b, is0, zero, v);
        }
        break;
    case LOOM_IR_OP_POW: v = cg_bin(b, "math.powf", x[0], x[1]); break;
    case LOOM_IR_OP_MAXIMUM: /* NaN-propagating, -0 < +0: arith.maximumf is exactly that */
        v = cg_bin(b, fl ? "arith.maximumf" : "arith.maxsi", x[0], x[1]);
        break;
    case LOOM_IR_OP_MINIMUM:
        v = cg_bin(b, fl ? "arith.minimumf" : "arith.minsi", x[0], x[1]);
        break;
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE: {
        static const cg_fpred fp[] = {CG_F_OEQ, CG_F_UNE, CG_F_OLT, CG_F_OLE, CG_F_OGT, CG_F_OGE};
        static const cg_ipred ip[] = {CG_I_EQ, CG_I_NE, CG_I_SLT, CG_I_SLE, CG_I_SGT, CG_I_SGE};
        _Static_assert(LOOM_IR_OP_NE == LOOM_IR_OP_EQ + 1 && LOOM_IR_OP_LT == LOOM_IR_OP_EQ + 2 &&
                           LOOM_IR_OP_LE == LOOM_IR_OP_EQ + 3 &&
                           LOOM_IR_OP_GT == LOOM_IR_OP_EQ + 4 && LOOM_IR_OP_GE == LOOM_IR_OP_EQ + 5,
                       "comparisons are contiguous in ops.def, in this order");
        int i = (int)n->op - (int)LOOM_IR_OP_EQ;
        v = xfl ? cg_cmpf(b, fp[i], x[0], x[1]) : cg_cmpi(b, ip[i], x[0], x[1]);
        round = false;
        break;
    }
    case LOOM_IR_OP_SELECT:
        v = cg_select(b, x[0], x[1], x[2]);
        round = false;
        break;
    case LOOM_IR_OP_CAST:
        v = cast_val(b, xdt, dt, x[0]);
        round = false; /* cast_val rounds */
        break;
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_TRANSPOSE:
    case LOOM_IR_OP_SLICE:
        v = x[0]; /* the operand was evaluated at the mapped index */
        round = false;
        break;
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_RESHAPE:
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
    case LOOM_IR_OP_MATMUL:
    case LOOM_IR_OP_ALL_REDUCE:
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_CONV2D:
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
    case LOOM_IR_OP_MAX_POOL2D:
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
    case LOOM_IR_OP_GATHER:
    case LOOM_IR_OP_SCATTER_ADD:
    case LOOM_IR_OP_ATTENTION:
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V:
    case LOOM_IR_OP_COUNT_: return cg_bad_plan(c, id, "unreachable op");
    }
    *out = round ? cg_round16(b, dt, v) : v;
    return LOOM_OK;
}
