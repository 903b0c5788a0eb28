/* Lowering of one plan kernel to an MLIR function: iteration spaces, index maps and loop
 * nests for elementwise, reduction and matmul kernels, and the per-element evaluation of
 * their fused nodes.
 *
 * How a kernel becomes loops
 *  - Every value is evaluated "at an index" of a loop nest. A node's index is described by
 *    a map from its axes to the nest's iteration dims (or -1: index 0). Elementwise ops pass
 *    their map to their operands; a broadcast drops or zeroes axes; a transpose permutes
 *    them. So broadcasts and transposes cost nothing but index arithmetic, and a value read
 *    through two different maps is computed twice (memoized per map).
 *  - A leaf (an arg read from its buffer) is then an affine function of the iteration dims:
 *    offset = sum_d iter[d] * S[d]. Adjacent dims merge into one loop when every leaf (and
 *    every stored result) is contiguous across them, S[d] == S[d+1] * ext[d+1]: a plain
 *    chain over [64,1000] becomes one loop of 64000, a bias broadcast over [64,1000] stays
 *    two loops. Extent-1 dims vanish.
 *  - ELEMENTWISE: the outer loop [lo, hi) runs over the outer dims times blocks of the
 *    innermost dim (blocks of BLOCK elements once it exceeds BLOCK_MAX), the inner loop is
 *    contiguous for LLVM's loop vectorizer. A nest reading some leaf transposed (strided
 *    along the innermost loop, contiguous along an outer group) runs in tiles of that group
 *    instead, the tile innermost (transposed_group).
 *  - REDUCTION: the nest is the reduce operand's dims. When its innermost dim is reduced,
 *    the outer loop runs over the kept elements and nested loops accumulate in a scalar
 *    (vectorized as a reduction after jit.c marks the add reassociable); a max over a few
 *    elements (a pool's window) is instead unrolled under a loop over the innermost kept
 *    dim, which LLVM vectorizes across outputs. When the innermost dim is kept (column
 *    sums), a tile of RED_TILE outputs accumulates in a stack buffer and the innermost
 *    loop runs across the tile, contiguous. Float sums accumulate in f64 (the
 *    interpreter's order differs, its precision does not: results match to the last bit
 *    or so), max in the compute type, integers in their own width (wrapping, as the
 *    interpreter's int64 sums stored narrow). Prologue results are stored inside the
 *    accumulation loop (each operand element is visited exactly once), epilogue results
 *    after it.
 *  - MATMUL: the outer loop runs over (batch, block of 32..128 rows, block of columns); each
 *    block computes C[rows, cols] = A rows x B[:, cols] (i, k, j order: the j loop is
 *    contiguous), or, with use_linalg, a static-shape linalg.matmul on memref views for the
 *    matmul schedule. Columns are split only when there are few row blocks and N is large
 *    (conv1's W[32,9] x cols[9,43264] would otherwise be one task on one thread; splitting
 *    the MLP's N = 512 made it slower); a column block is
 *    a multiple of 16 dividing N when one is near, so most kernels keep one static shape.
 *    f32 accumulates in f32 (the interpreter uses double: differences ~sqrt(K) ulp),
 *    f16/bf16 in f32, integers wrap. The epilogue then runs over the block's rows and
 *    columns.
 *  - Results whose shape is not the kernel's iteration space (rare: a small value fused
 *    into a kernel over a larger one) are computed by a separate nest that only the task
 *    starting at lo == 0 runs.
 *  - Maps are affine per axis (index = off + scale * iteration dim), so a slice is free
 *    index arithmetic like a transpose. Values computed from the index itself register the
 *    affine function they need as a leaf while the nest is planned, which keeps the dims it
 *    reads unmerged: iota (the index along its axis), rand_uniform (its row-major index,
 *    hashed), pad (the index along each padded axis: the operand, an arg or a slice of one,
 *    is loaded at the clamped position and selected against the pad value). An elementwise
 *    nest's innermost loop is split where pads without interior padding enter or leave their
 *    operand along it: in each part such a pad is a plain contiguous load or its constant
 *    (the conv backward's sum of nine shifted pads vectorizes, ~3.5x faster).
 *  - A concat is always its kernel's root (fusion.c): one nest per operand over its part
 *    of the result, in which the concat reads that operand alone at an offset; the task
 *    range [lo, hi) runs over the nests one after the other.
 *
 * Values live in a compute type: f32 for f32, f16 and bf16 (16-bit results are rounded
 * after every node, as the interpreter stores them), f64, i32, i64, i1 for bool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/Dialect/Linalg.h>

#include "cg_internal.h"

enum {
    BLOCK_MAX = 16384, /* innermost elementwise extent above which it is split in blocks */
    BLOCK = 8192,
    RED_TILE = 1024,          /* outputs per tile of a reduction over outer dims */
    RED_UNROLL_MAX = 16,      /* reduced elements per output unrolled under a kept loop ... */
    RED_UNROLL_MIN_INNER = 8, /* ... when that loop is at least this long */
    MM_ROWS_MIN = 32,         /* output rows per matmul task: at least (unless M is smaller) */
    MM_ROWS_MAX = 128,        /* and at most (B streams once per block: bigger blocks reuse it) */
    MM_TASKS_MIN = 16,        /* fewer (batch, row block) tasks than this: split the columns too */
    MM_COLS_MIN = 256,        /* columns per matmul task: at least (the schedule's cache tile Nc) */
    MM_WIDE_N = 4096,       /* N from which columns are split (below: slower, the MLP's 512 15%) */
    MM_WIDE_ROWS_MAX = 512, /* rows per task when columns are split (the schedule's Mc max) */
    MM_B_STREAMS = 1 << 20, /* elements of B (4 MB of f32) above which B streams from memory */
    TASK_WORK = 32768,      /* elements (or multiply-adds) a task should do at least */
    PAD_CUTS_MAX = 64,      /* pad ranges recorded per nest (more: the rest are not split at) */
    PAD_PARTS_MAX = 16,     /* loops an innermost loop is split into at most */
    TRANSPOSE_TILE = 16,    /* a transposed nest's tile (a cache line of f32) */
    TRANSPOSE_UNROLL = 8,   /* its tile is unrolled in kernels of at most this many nodes */
};

#define R LOOM_MAX_RANK

/* Where a node's axes are read: axis i at off[i] + scale[i] * (nest dim dim[i]), or at
 * off[i] when dim[i] is -1 (then scale[i] is 0). Every field is always written (memo keys
 * compare whole maps). */
typedef struct imap {
    int8_t dim[R];
    int64_t off[R];
    int64_t scale[R];
} imap;

typedef struct memo_ent {
    int32_t node;
    uint32_t key;
    int32_t prev; /* the node's previous entry */
    imap map;
    MlirValue v;
} memo_ent;

typedef struct leaf {
    int64_t s[R];
} leaf;

struct cg_scratch {
    loom_allocator alloc;
    int32_t n_nodes;
    int32_t *buf_of; /* per node: its buffer index as an arg, -1 */
    int32_t *res_of; /* per node: its buffer index as a result, -1 */
    uint8_t *in_kernel;
    uint8_t *dep_root; /* depends on the kernel's root (reduction / matmul epilogue) */
    int32_t *memo_head;
    memo_ent *memo;
    int32_t n_memo, cap_memo;
    leaf *leaves;
    int32_t n_leaves, cap_leaves;
};

/* An iteration space and its loops: dims, and groups of merged dims (one loop each). */
typedef struct nest {
    int32_t n_dims;
    int64_t ext[R];
    bool red[R];
    bool no_merge; /* one group per dim (the matmul epilogue has fixed loops) */
    int32_t n_groups;
    int32_t g_last[R]; /* innermost dim of the group */
    int64_t g_ext[R];
    bool g_red[R];
    int32_t dim_group[R]; /* -1 for extent-1 dims */
} nest;

typedef struct kc {
    const loom_ir_graph *g;
    const loom_ir_kernel *k;
    int32_t kid;
    cg_scratch *s;
    loom_ir_diag *d;
    bool emit;    /* false: plan only (no MLIR) */
    bool collect; /* record leaves while walking */
    bool use_linalg;
    cg_b *b;
    MlirValue bufs[2 * 1024]; /* unused past n_args + n_results */
    MlirValue lo, hi;
    const nest *ns;  /* the nest values are evaluated in */
    MlirValue gv[R]; /* loop value of each group in scope */
    int32_t bound;   /* node whose value is supplied (reduced value, matmul product) */
    imap bound_map;
    MlirValue bound_v;
    int64_t extent, grain;
    /* Pads' ranges along the nest's dims, recorded while planning (pad_axis_range): nest
     * index j of dim cut_dim reads the operand where cut_lo <= j < cut_hi. The innermost
     * loop is split at them so each pad is wholly operand or wholly pad value in a part. */
    int32_t n_cuts;
    int8_t cut_dim[PAD_CUTS_MAX];
    int64_t cut_lo[PAD_CUTS_MAX], cut_hi[PAD_CUTS_MAX];
    /* While emitting one part of a split innermost loop: nest dim in_dim stays in
     * [in_lo, in_hi) (in_dim -1: no such knowledge). */
    int32_t in_dim;
    int64_t in_lo, in_hi;
} kc;

/* ---- scratch ------------------------------------------------------------------------------ */

loom_status loom_cg_scratch_create(const loom_ir_graph *g, const loom_allocator *a,
                                   cg_scratch **out) {
    *out = NULL;
    cg_scratch *s = loom_ir_alloc(a, sizeof *s);
    if (!s)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->alloc = *a;
    s->n_nodes = g->n_nodes;
    size_t n = (size_t)(g->n_nodes > 0 ? g->n_nodes : 1);
    s->buf_of = loom_ir_alloc(a, n * sizeof(int32_t));
    s->res_of = loom_ir_alloc(a, n * sizeof(int32_t));
    s->memo_head = loom_ir_alloc(a, n * sizeof(int32_t));
    s->in_kernel = loom_ir_alloc(a, n);
    s->dep_root = loom_ir_alloc(a, n);
    if (!s->buf_of || !s->res_of || !s->memo_head || !s->in_kernel || !s->dep_root) {
        loom_cg_scratch_destroy(s);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        s->buf_of[i] = s->res_of[i] = s->memo_head[i] = -1;
    memset(s->in_kernel, 0, n);
    memset(s->dep_root, 0, n);
    *out = s;
    return LOOM_OK;
}

void loom_cg_scratch_destroy(cg_scratch *s) {
    if (!s)
        return;
    size_t n = (size_t)(s->n_nodes > 0 ? s->n_nodes : 1);
    loom_ir_free(&s->alloc, s->buf_of, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->res_of, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->memo_head, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->in_kernel, n);
    loom_ir_free(&s->alloc, s->dep_root, n);
    loom_ir_free(&s->alloc, s->memo, (size_t)s->cap_memo * sizeof(memo_ent));
    loom_ir_free(&s->alloc, s->leaves, (size_t)s->cap_leaves * sizeof(leaf));
    loom_allocator a = s->alloc;
    loom_ir_free(&a, s, sizeof *s);
}

/* ---- errors ------------------------------------------------------------------------------- */

static loom_status unsupported(kc *c, int32_t id, const char *why) {
    const loom_ir_node *n = &c->g->nodes[id];
    char t[LOOM_IR_TYPE_STR_MAX];
    return loom_ir_diag_set(c->d, LOOM_STATUS_UNSUPPORTED, "codegen: kernel %d: %%%d = %s : %s: %s",
                            (int)c->kid, (int)id, loom_ir_op_name(n->op),
                            loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape), why);
}

static loom_status bad_plan(kc *c, int32_t id, const char *why) {
    return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: kernel %d: %%%d: %s", (int)c->kid,
                            (int)id, why);
}

static loom_status oom(kc *c) {
    return loom_ir_diag_set(c->d, LOOM_STATUS_OUT_OF_MEMORY,
                            "codegen: out of memory lowering kernel %d", (int)c->kid);
}

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

static void map_none(imap *m) {
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
        return oom(c);
    s->memo[s->n_memo] =
        (memo_ent){.node = node, .key = key, .prev = s->memo_head[node], .map = *map, .v = v};
    s->memo_head[node] = s->n_memo++;
    return LOOM_OK;
}

static int32_t memo_mark(kc *c) {
    return c->s->n_memo;
}

static void memo_pop(kc *c, int32_t mark) {
    cg_scratch *s = c->s;
    while (s->n_memo > mark) {
        memo_ent *e = &s->memo[--s->n_memo];
        s->memo_head[e->node] = e->prev;
    }
}

/* ---- types and dtypes ------------------------------------------------------------------- */

static MlirType storage_type(cg_b *b, loom_dtype dt) {
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

static bool is_16(loom_dtype dt) {
    return dt == LOOM_DTYPE_F16 || dt == LOOM_DTYPE_BF16;
}

/* f32 compute type (f32, f16, bf16) */
static bool is_f32c(loom_dtype dt) {
    return dt == LOOM_DTYPE_F32 || is_16(dt);
}

static MlirType compute_type(cg_b *b, loom_dtype dt) {
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

/* Rounds an f32 value to the 16-bit dtype's precision (and back to f32). bf16 follows
 * loom_ir_f32_to_bf16 bit for bit: round to nearest even, NaN kept quiet. */
static MlirValue round16(cg_b *b, loom_dtype dt, MlirValue v) {
    if (dt == LOOM_DTYPE_F16)
        return cg_conv(b, "arith.extf", cg_conv(b, "arith.truncf", v, b->f16), b->f32);
    MlirValue u = cg_conv(b, "arith.bitcast", v, b->i32);
    MlirValue absu = cg_bin(b, "arith.andi", u, cg_ci(b, b->i32, 0x7fffffff));
    MlirValue nan = cg_cmpi(b, CG_I_UGT, absu, cg_ci(b, b->i32, 0x7f800000));
    MlirValue odd = cg_bin(b, "arith.andi", cg_bin(b, "arith.shrui", u, cg_ci(b, b->i32, 16)),
                           cg_ci(b, b->i32, 1));
    MlirValue r =
        cg_bin(b, "arith.addi", u, cg_bin(b, "arith.addi", odd, cg_ci(b, b->i32, 0x7fff)));
    MlirValue quiet = cg_bin(b, "arith.ori", u, cg_ci(b, b->i32, 0x400000));
    r = cg_select(b, nan, quiet, r);
    r = cg_bin(b, "arith.andi", r, cg_ci(b, b->i32, (int32_t)0xffff0000u));
    return cg_conv(b, "arith.bitcast", r, b->f32);
}

static MlirValue load_val(cg_b *b, loom_dtype dt, MlirValue mem, MlirValue off) {
    MlirValue raw = cg_load(b, mem, off);
    switch (dt) {
    case LOOM_DTYPE_F16: return cg_conv(b, "arith.extf", raw, b->f32);
    case LOOM_DTYPE_BF16: {
        MlirValue w = cg_conv(b, "arith.extui", raw, b->i32);
        w = cg_bin(b, "arith.shli", w, cg_ci(b, b->i32, 16));
        return cg_conv(b, "arith.bitcast", w, b->f32);
    }
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
static void store_val(cg_b *b, loom_dtype dt, MlirValue v, MlirValue mem, MlirValue off) {
    switch (dt) {
    case LOOM_DTYPE_F16: v = cg_conv(b, "arith.truncf", v, b->f16); break;
    case LOOM_DTYPE_BF16: {
        MlirValue u = cg_conv(b, "arith.bitcast", v, b->i32);
        u = cg_bin(b, "arith.shrui", u, cg_ci(b, b->i32, 16));
        v = cg_conv(b, "arith.trunci", u, b->i16);
        break;
    }
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
    MlirType t = compute_type(b, n->dtype);
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
    MlirType tt = compute_type(b, to);
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
    return is_16(to) ? round16(b, to, f) : f;
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
        return oom(c);
    memcpy(s->leaves[s->n_leaves++].s, S, sizeof(int64_t) * R);
    return LOOM_OK;
}

static loom_status add_leaf(kc *c, const loom_ir_node *n, const imap *map) {
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
            return bad_plan(c, id, "an index of this value is not in scope (codegen bug)");
        off = cg_iadd(c->b, off, cg_imul_c(c->b, c->gv[gi], st));
    }
    *out = off;
    return LOOM_OK;
}

/* The flat offset of node n at `map` in the current nest's loops. */
static loom_status offset_of(kc *c, int32_t id, const imap *map, MlirValue *out) {
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
    map_none(out);
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
static loom_status eval(kc *c, int32_t id, const imap *map, MlirValue *out);
static MlirValue cast_val(cg_b *b, loom_dtype from, loom_dtype to, MlirValue v);

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

/* rand_uniform: SplitMix64 of seed + (i + 1) * golden gamma at the row-major index i, top 24
 * bits times 2^-24 (loom_ir_rand_uniform), exact in f32, rounded to 16-bit floats after. */
static loom_status eval_rand(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    imap sm;
    map_none(&sm);
    MlirValue seed = {NULL};
    loom_status st = eval(c, n->inputs[0], &sm, &seed);
    if (st != LOOM_OK)
        return st;
    if (c->collect && (st = add_leaf(c, n, map)) != LOOM_OK)
        return st;
    if (!c->emit)
        return LOOM_OK;
    cg_b *b = c->b;
    MlirValue i;
    if ((st = offset_of(c, id, map, &i)) != LOOM_OK)
        return st;
    i = cg_conv(b, "arith.index_cast", i, b->i64);
    MlirValue z = cg_bin(b, "arith.muli", cg_bin(b, "arith.addi", i, cg_ci(b, b->i64, 1)),
                         cg_ci(b, b->i64, (int64_t)LOOM_IR_RAND_GAMMA));
    z = cg_bin(b, "arith.addi", seed, z);
    static const uint64_t mul[2] = {LOOM_IR_RAND_M1, LOOM_IR_RAND_M2};
    static const int64_t shift[3] = {LOOM_IR_RAND_S1, LOOM_IR_RAND_S2, LOOM_IR_RAND_S3};
    for (int r = 0; r < 3; r++) {
        z = cg_bin(b, "arith.xori", z, cg_bin(b, "arith.shrui", z, cg_ci(b, b->i64, shift[r])));
        if (r < 2)
            z = cg_bin(b, "arith.muli", z, cg_ci(b, b->i64, (int64_t)mul[r]));
    }
    z = cg_bin(b, "arith.shrui", z, cg_ci(b, b->i64, 64 - LOOM_IR_RAND_BITS));
    bool f64 = n->dtype == LOOM_DTYPE_F64;
    MlirType ft = f64 ? b->f64 : b->f32;
    MlirValue v = cg_conv(b, "arith.uitofp", z, ft);
    v = cg_bin(b, "arith.mulf", v, cg_cf(b, ft, ldexp(1.0, -LOOM_IR_RAND_BITS)));
    *out = is_16(n->dtype) ? round16(b, n->dtype, v) : v;
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
            return bad_plan(c, id,
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
    map_none(&xm);
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
        if (!empty && (st = add_leaf(c, src, &xm)) != LOOM_OK)
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
    MlirType ct = compute_type(b, n->dtype);
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
    if ((st = offset_of(c, sid, &xm, &off)) != LOOM_OK)
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
    MlirValue v = load_val(b, x->dtype, c->bufs[c->s->buf_of[sid]], off);
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
            return eval(c, n->inputs[k], &m, out);
        }
        at += e;
    }
    return unsupported(c, id,
                       "a concat read across the boundary of its operands (codegen "
                       "lowers a concat only as its kernel's root)");
}

/* Evaluates node id at map (emit), or walks it recording leaves (plan). */
static loom_status eval(kc *c, int32_t id, const imap *map, MlirValue *out) {
    const loom_ir_node *n = &c->g->nodes[id];
    uint32_t key = map_key(map);
    MlirValue v = {NULL};
    if (memo_find(c, id, key, map, &v)) {
        *out = v;
        return LOOM_OK;
    }
    loom_status st = LOOM_OK;
    if (id == c->bound) {
        if (!map_equal(map, &c->bound_map))
            return unsupported(c, id,
                               "the reduced or multiplied value is read through a "
                               "broadcast, transpose or slice inside its own kernel");
        v = c->bound_v;
    } else if (c->s->buf_of[id] >= 0) {
        if (c->collect && (st = add_leaf(c, n, map)) != LOOM_OK)
            return st;
        if (c->emit) {
            MlirValue off;
            if ((st = offset_of(c, id, map, &off)) != LOOM_OK)
                return st;
            v = load_val(c->b, n->dtype, c->bufs[c->s->buf_of[id]], off);
        }
    } else if (!c->s->in_kernel[id]) {
        return bad_plan(c, id, "read by the kernel but neither computed in it nor an arg");
    } else if (n->op == LOOM_IR_OP_IOTA || n->op == LOOM_IR_OP_RAND_UNIFORM ||
               n->op == LOOM_IR_OP_PAD || n->op == LOOM_IR_OP_CONCAT) {
        st = n->op == LOOM_IR_OP_IOTA           ? eval_iota(c, id, map, &v)
             : n->op == LOOM_IR_OP_RAND_UNIFORM ? eval_rand(c, id, map, &v)
             : n->op == LOOM_IR_OP_PAD          ? eval_pad(c, id, map, &v)
                                                : eval_concat(c, id, map, &v);
        if (st != LOOM_OK)
            return st;
    } else {
        MlirValue xs[3] = {{NULL}, {NULL}, {NULL}};
        if (n->n_inputs > 3)
            return unsupported(c, id, "more than three operands");
        for (int32_t k = 0; k < n->n_inputs; k++) {
            imap m;
            operand_map(c->g, n, k, map, &m);
            if ((st = eval(c, n->inputs[k], &m, &xs[k])) != LOOM_OK)
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
        return bad_plan(c, id, "an input inside a kernel (inputs are read as args)");
    case LOOM_IR_OP_RESHAPE:
        return unsupported(c, id, "a reshape inside a kernel (plans read reshapes as args)");
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX:
        return unsupported(c, id, "a reduction that is not its kernel's root");
    case LOOM_IR_OP_MATMUL: return unsupported(c, id, "a matmul that is not its kernel's root");
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_RAND_UNIFORM: return bad_plan(c, id, "evaluated by eval, not apply");
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
    case LOOM_IR_OP_COUNT_: return bad_plan(c, id, "unknown op");
    }
    if (!loom_ir_dtype_valid(dt) || !loom_ir_dtype_valid(xdt))
        return bad_plan(c, id, "invalid dtype");
    if (!c->emit)
        return LOOM_OK;

    cg_b *b = c->b;
    MlirType ct = compute_type(b, dt);
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
    case LOOM_IR_OP_COUNT_: return bad_plan(c, id, "unreachable op");
    }
    *out = round ? round16(b, dt, v) : v;
    return LOOM_OK;
}

/* ---- nests ------------------------------------------------------------------------------ */

static void nest_init(nest *ns, int32_t rank, const int64_t *shape) {
    memset(ns, 0, sizeof *ns);
    ns->n_dims = rank;
    for (int32_t d = 0; d < rank; d++)
        ns->ext[d] = shape[d];
}

/* Identity map of a node over the nest (its dims are the nest's), extent-1 dims -> -1. */
static void identity_map(const nest *ns, imap *map) {
    map_none(map);
    for (int32_t d = 0; d < R; d++) {
        map->dim[d] = (int8_t)(d < ns->n_dims && ns->ext[d] != 1 ? d : -1);
        map->scale[d] = map->dim[d] >= 0;
    }
}

typedef struct sink {
    int32_t node;
    imap map;
    bool store; /* written to its result buffer (otherwise only evaluated) */
} sink;

/* Walks every sink recording the leaves, then merges dims into groups. */
static loom_status plan_nest(kc *c, nest *ns, int32_t n_sinks, const sink *sinks) {
    bool emit = c->emit;
    const nest *saved = c->ns;
    c->emit = false;
    c->collect = true;
    c->ns = ns; /* its extents (concat reads them); its groups are what is planned here */
    c->s->n_leaves = 0;
    c->n_cuts = 0;
    int32_t mark = memo_mark(c);
    loom_status st = LOOM_OK;
    MlirValue unused;
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++) {
        st = eval(c, sinks[i].node, &sinks[i].map, &unused);
        if (st == LOOM_OK && sinks[i].store)
            st = add_leaf(c, &c->g->nodes[sinks[i].node], &sinks[i].map);
    }
    memo_pop(c, mark);
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
static loom_status emit_sinks(kc *c, int32_t n_sinks, const sink *sinks) {
    int32_t mark = memo_mark(c);
    loom_status st = LOOM_OK;
    MlirValue vals[64];
    if (n_sinks > 64)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: more than 64 sinks");
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++)
        st = eval(c, sinks[i].node, &sinks[i].map, &vals[i]);
    /* stores after all evaluation: a result may share its buffer with the value being
     * read for another (the matmul accumulator) */
    for (int32_t i = 0; i < n_sinks && st == LOOM_OK; i++) {
        if (!sinks[i].store)
            continue;
        MlirValue v = vals[i];
        const loom_ir_node *n = &c->g->nodes[sinks[i].node];
        MlirValue off;
        if ((st = offset_of(c, sinks[i].node, &sinks[i].map, &off)) != LOOM_OK)
            break;
        store_val(c->b, n->dtype, v, c->bufs[c->s->res_of[sinks[i].node]], off);
    }
    memo_pop(c, mark);
    return st;
}

/* Splits a flat index over groups first..last-1 (row-major), setting their loop values. */
static void delinearize(kc *c, MlirValue q, int32_t n, const int32_t *groups) {
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

static void clear_gv(kc *c) {
    for (int32_t i = 0; i < R; i++)
        c->gv[i] = (MlirValue){NULL};
}

/* A whole nest run serially (side nests, under lo == 0). */
static loom_status emit_serial_nest(kc *c, int32_t n_sinks, const sink *sinks, int32_t gi) {
    if (gi == c->ns->n_groups)
        return emit_sinks(c, n_sinks, sinks);
    cg_for l;
    cg_for_begin(c->b, &l, cg_idx(c->b, 0), cg_idx(c->b, c->ns->g_ext[gi]), 0, NULL);
    c->gv[gi] = l.iv;
    loom_status st = emit_serial_nest(c, n_sinks, sinks, gi + 1);
    cg_for_end(c->b, &l, 0, NULL);
    return st;
}

static bool same_shape(const loom_ir_node *a, const loom_ir_node *b) {
    return a->rank == b->rank && memcmp(a->shape, b->shape, (size_t)a->rank * sizeof(int64_t)) == 0;
}

/* Which results the main nest stores; the others get a side nest each. */
typedef enum side_mode {
    SIDE_ELEMENTWISE, /* results not of the root's shape */
    SIDE_REDUCTION,   /* results that are neither epilogue nor of the operand's shape */
    SIDE_MATMUL,      /* results that do not depend on the product */
    SIDE_CONCAT,      /* results but the concat root */
} side_mode;

/* Plans (check) or emits (under lo == 0) the side nests. space: the root (elementwise) or
 * the reduced operand. */
static loom_status side_nests(kc *c, const loom_ir_node *space, side_mode mode) {
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
        nest_init(&ns, n->rank, n->shape);
        sink sk = {.node = id, .store = true};
        identity_map(&ns, &sk.map);
        int32_t saved_bound = c->bound;
        c->bound = -1;
        loom_status st = plan_nest(c, &ns, 1, &sk);
        if (st == LOOM_OK && c->emit) {
            const nest *saved = c->ns;
            c->ns = &ns;
            clear_gv(c);
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

static int64_t ceil_div(int64_t a, int64_t b) {
    return b > 0 ? (a + b - 1) / b : 0;
}

static int64_t grain_for(int64_t work_per_iter) {
    int64_t w = work_per_iter > 0 ? work_per_iter : 1;
    int64_t gr = ceil_div(TASK_WORK, w);
    return gr > 0 ? gr : 1;
}

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

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

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
    qsort(at, (size_t)n, sizeof at[0], cmp_i64);
    int32_t u = 0;
    for (int32_t i = 0; i < n; i++)
        if (u == 0 || at[i] != at[u - 1])
            at[u++] = at[i];
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
    loom_status st = plan_nest(c, &e->ns, e->n_sinks, e->sinks);
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
    clear_gv(c);
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
        delinearize(c, cg_bin(b, "arith.divui", l.iv, ntv), n_rest, rest);
        MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, TRANSPOSE_TILE)), cg_idx(b, ext));
        cg_for lj, li;
        cg_for_begin(b, &lj, cg_idx(b, 0), cg_idx(b, e->inner), 0, NULL);
        c->gv[ng - 1] = lj.iv;
        if (ext % TRANSPOSE_TILE == 0 && c->k->n_nodes <= TRANSPOSE_UNROLL) {
            /* unrolled: as a loop, LLVM vectorizes the tile with scatters (3x slower) */
            st = LOOM_OK;
            for (int64_t t = 0; t < TRANSPOSE_TILE && st == LOOM_OK; t++) {
                c->gv[tg] = cg_iadd(b, i0, cg_idx(b, t));
                st = emit_sinks(c, e->n_sinks, e->sinks);
            }
        } else {
            cg_for_begin(b, &li, i0, i1, 0, NULL);
            c->gv[tg] = li.iv;
            st = emit_sinks(c, e->n_sinks, e->sinks);
            cg_for_end(b, &li, 0, NULL);
        }
        cg_for_end(b, &lj, 0, NULL);
    } else if (ng == 0) {
        st = emit_sinks(c, e->n_sinks, e->sinks);
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
        delinearize(c, q, ng - 1, outer_groups);
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
            st = emit_sinks(c, e->n_sinks, e->sinks);
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
    loom_status st = side_nests(c, root, SIDE_CONCAT);
    if (st != LOOM_OK)
        return st;
    int32_t a = (int32_t)root->attrs.index, n = root->n_inputs;
    ew_nest *parts = loom_ir_alloc(&c->s->alloc, (size_t)n * sizeof *parts);
    if (!parts)
        return oom(c);
    int64_t total = 0, blk = 1, at = 0;
    for (int32_t k = 0; k < n && st == LOOM_OK; k++) {
        ew_nest *e = &parts[k];
        int64_t shape[R];
        memcpy(shape, root->shape, sizeof(int64_t) * (size_t)root->rank);
        shape[a] = c->g->nodes[root->inputs[k]].shape[a];
        nest_init(&e->ns, root->rank, shape);
        e->n_sinks = 0;
        if (c->s->res_of[c->k->root] >= 0) {
            e->sinks[0] = (sink){.node = c->k->root, .store = true};
            identity_map(&e->ns, &e->sinks[0].map);
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
    c->grain = grain_for(blk);
    int64_t base = 0;
    for (int32_t k = 0; k < n && st == LOOM_OK && c->emit; k++) {
        st = emit_ew_nest(c, &parts[k], base);
        base += parts[k].count;
    }
    loom_ir_free(&c->s->alloc, parts, (size_t)n * sizeof *parts);
    return st;
}

static loom_status lower_elementwise(kc *c) {
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    if (root->op == LOOM_IR_OP_CONCAT)
        return lower_concat(c);
    loom_status st = side_nests(c, root, SIDE_ELEMENTWISE);
    if (st != LOOM_OK)
        return st;
    ew_nest *e = loom_ir_alloc(&c->s->alloc, sizeof *e);
    if (!e)
        return oom(c);
    nest_init(&e->ns, root->rank, root->shape);
    e->n_sinks = 0;
    for (int32_t r = 0; r < c->k->n_results && st == LOOM_OK; r++) {
        int32_t id = c->k->results[r];
        if (!same_shape(&c->g->nodes[id], root))
            continue;
        if (e->n_sinks == 64) {
            st = unsupported(c, id, "more than 64 results of one shape in a kernel");
            break;
        }
        e->sinks[e->n_sinks] = (sink){.node = id, .store = true};
        identity_map(&e->ns, &e->sinks[e->n_sinks++].map);
    }
    if (st == LOOM_OK)
        st = plan_ew_nest(c, e);
    if (st == LOOM_OK) {
        c->extent = e->count > 0 ? e->count : 1;
        c->grain = grain_for(e->work);
        if (c->emit)
            st = emit_ew_nest(c, e, 0);
    }
    loom_ir_free(&c->s->alloc, e, sizeof *e);
    return st;
}

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
    return is_16(r->dt) ? round16(b, r->dt, f) : f;
}

typedef struct red_plan {
    red_ops ops;
    int32_t x;     /* the reduced operand */
    int64_t n_red; /* reduced elements per output */
    sink pro[64];  /* prologue: x itself (not stored) and results of x's shape */
    int32_t n_pro;
    sink epi[64]; /* epilogue results (maps into the nest's kept dims) */
    int32_t n_epi;
} red_plan;

static loom_status emit_red_loops(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr,
                                  int32_t i, MlirValue acc, MlirValue *out);

/* Inner body: evaluates x and the prologue sinks at the current index (storing those that
 * are results), folds x into acc. */
static loom_status emit_red_body(kc *c, red_plan *rp, MlirValue acc, MlirValue *out) {
    int32_t mark = memo_mark(c);
    MlirValue v;
    loom_status st = eval(c, rp->x, &rp->pro[0].map, &v);
    if (st == LOOM_OK)
        st = emit_sinks(c, rp->n_pro, rp->pro); /* x itself is a memo hit */
    if (st == LOOM_OK)
        *out = red_combine(c->b, &rp->ops, acc, v);
    memo_pop(c, mark);
    return st;
}

static loom_status emit_red_loops(kc *c, red_plan *rp, const int32_t *rgroups, int32_t nr,
                                  int32_t i, MlirValue acc, MlirValue *out) {
    if (i == nr)
        return emit_red_body(c, rp, acc, out);
    cg_for l;
    cg_for_begin(c->b, &l, cg_idx(c->b, 0), cg_idx(c->b, c->ns->g_ext[rgroups[i]]), 1, &acc);
    c->gv[rgroups[i]] = l.iv;
    MlirValue next;
    loom_status st = emit_red_loops(c, rp, rgroups, nr, i + 1, l.iter[0], &next);
    if (st != LOOM_OK)
        return st;
    cg_for_end(c->b, &l, 1, &next);
    *out = cg_for_result(&l, 0);
    return LOOM_OK;
}

/* Epilogue at the current output index: binds the root's value, evaluates and stores. */
static loom_status emit_red_epilogue(kc *c, red_plan *rp, MlirValue acc) {
    c->bound_v = red_finish(c->b, &rp->ops, acc, rp->n_red);
    return emit_sinks(c, rp->n_epi, rp->epi);
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
    delinearize(c, lo.iv, nk - 1, kgroups);
    cg_for_begin(b, &li, cg_idx(b, 0), cg_idx(b, ns->g_ext[tg]), 0, NULL);
    c->gv[tg] = li.iv;
    MlirValue acc = red_init(b, &rp->ops);
    loom_status st = LOOM_OK;
    for (int64_t r = 0; r < rp->n_red && st == LOOM_OK; r++) {
        int64_t q = r;
        for (int32_t i = nr - 1; i >= 0; i--) {
            int64_t e = ns->g_ext[rgroups[i]];
            c->gv[rgroups[i]] = cg_idx(b, q % e);
            q /= e;
        }
        st = emit_red_body(c, rp, acc, &acc);
    }
    for (int32_t i = 0; i < nr; i++)
        c->gv[rgroups[i]] = (MlirValue){NULL};
    if (st == LOOM_OK)
        st = emit_red_epilogue(c, rp, acc);
    cg_for_end(b, &li, 0, NULL);
    cg_for_end(b, &lo, 0, NULL);
    return st;
}

static loom_status lower_reduction(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 1)
        return bad_plan(c, root_id, "a reduction without one operand");
    red_plan *rp = loom_ir_alloc(&c->s->alloc, sizeof *rp);
    if (!rp)
        return oom(c);
    memset(rp, 0, sizeof *rp);
    loom_status st = LOOM_OK;
    rp->x = root->inputs[0];
    const loom_ir_node *x = &g->nodes[rp->x];
    rp->ops.op = root->op;
    rp->ops.dt = root->dtype;
    if (root->op == LOOM_IR_OP_REDUCE_MEAN && !loom_ir_dtype_is_float(root->dtype)) {
        st = unsupported(c, root_id, "an integer mean");
        goto done;
    }

    nest ns;
    nest_init(&ns, x->rank, x->shape);
    rp->n_red = 1;
    for (int32_t d = 0; d < x->rank; d++) {
        ns.red[d] = (root->attrs.axes >> d) & 1u;
        if (ns.red[d])
            rp->n_red *= x->shape[d];
    }
    /* the root's canonical map: its dims onto x's kept dims */
    imap rmap;
    map_none(&rmap);
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

    rp->pro[0] = (sink){.node = rp->x, .store = c->s->res_of[rp->x] >= 0};
    identity_map(&ns, &rp->pro[0].map);
    rp->n_pro = 1;
    for (int32_t r = 0; r < c->k->n_results; r++) {
        int32_t id = c->k->results[r];
        const loom_ir_node *n = &g->nodes[id];
        if (c->s->dep_root[id]) {
            if (!same_shape(n, root)) {
                st = unsupported(c, id,
                                 "an epilogue result whose shape is not the reduced "
                                 "value's");
                goto done;
            }
            if (rp->n_epi == 64) {
                st = unsupported(c, id, "more than 64 epilogue results");
                goto done;
            }
            rp->epi[rp->n_epi] = (sink){.node = id, .store = true};
            rp->epi[rp->n_epi++].map = rmap;
        } else if (same_shape(n, x) && id != rp->x) {
            if (rp->n_pro == 64) {
                st = unsupported(c, id, "more than 64 prologue results");
                goto done;
            }
            rp->pro[rp->n_pro] = (sink){.node = id, .store = true};
            identity_map(&ns, &rp->pro[rp->n_pro++].map);
        }
    }
    if ((st = side_nests(c, x, SIDE_REDUCTION)) != LOOM_OK)
        goto done;
    {
        /* one plan over prologue and epilogue: merged dims must suit both */
        sink all[128];
        memcpy(all, rp->pro, (size_t)rp->n_pro * sizeof(sink));
        memcpy(all + rp->n_pro, rp->epi, (size_t)rp->n_epi * sizeof(sink));
        if ((st = plan_nest(c, &ns, rp->n_pro + rp->n_epi, all)) != LOOM_OK)
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
    int64_t n_out = loom_ir_numel(root->rank, root->shape);
    int64_t tile = 1, ntiles = 1, outer = 1;
    /* A max over a few elements per output under a kept dim (a max pool's windows): the
     * kept dim becomes the inner loop and the reduction is unrolled inside it
     * (small_reduction). Not for sums: their loop per output is cheap, and vectorized
     * across outputs they read through gathers (the 2x2 pool's tie counts: 400 us as loops,
     * 650 us as gathers; the max pool itself: 1200 us as loops, 540 us as gathers). */
    bool small = !inner_kept && nk > 0 && root->op == LOOM_IR_OP_REDUCE_MAX &&
                 rp->n_red <= RED_UNROLL_MAX && ns.g_ext[kgroups[nk - 1]] >= RED_UNROLL_MIN_INNER;
    if (small) {
        for (int32_t i = 0; i + 1 < nk; i++)
            outer *= ns.g_ext[kgroups[i]];
        c->extent = n_out > 0 ? outer : 1;
        c->grain = grain_for(rp->n_red * ns.g_ext[kgroups[nk - 1]]);
    } else if (inner_kept) {
        int64_t t = ns.g_ext[kgroups[nk - 1]];
        tile = t < RED_TILE ? t : RED_TILE;
        ntiles = ceil_div(t, tile);
        for (int32_t i = 0; i + 1 < nk; i++)
            outer *= ns.g_ext[kgroups[i]];
        c->extent = n_out > 0 ? outer * ntiles : 1;
        c->grain = grain_for(rp->n_red * tile);
    } else {
        c->extent = n_out > 0 ? n_out : 1;
        c->grain = grain_for(rp->n_red);
    }
    if (!c->emit || n_out == 0)
        goto done;

    cg_b *b = c->b;
    c->ns = &ns;
    clear_gv(c);
    rp->ops.fsum = root->op != LOOM_IR_OP_REDUCE_MAX && loom_ir_dtype_is_float(root->dtype);
    rp->ops.acc_t = rp->ops.fsum ? b->f64 : compute_type(b, root->dtype);
    if (small) {
        st = small_reduction(c, rp, kgroups, nk, rgroups, nr);
        goto done;
    }
    if (!inner_kept) {
        cg_for lo;
        cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
        delinearize(c, lo.iv, nk, kgroups);
        MlirValue acc;
        st = emit_red_loops(c, rp, rgroups, nr, 0, red_init(b, &rp->ops), &acc);
        if (st == LOOM_OK)
            st = emit_red_epilogue(c, rp, acc);
        cg_for_end(b, &lo, 0, NULL);
        goto done;
    }
    /* inner dim kept: a tile of accumulators in a stack buffer (allocated once, at entry) */
    MlirType buf_t = mlirMemRefTypeContiguousGet(rp->ops.acc_t, 1, &tile, mlirAttributeGetNull());
    MlirNamedAttribute seg =
        cg_named(b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){0, 0}));
    MlirValue accbuf =
        mlirOperationGetResult(cg_op(b, "memref.alloca", 0, NULL, 1, &buf_t, 1, &seg), 0);
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
    delinearize(c, q, nk - 1, kgroups);
    cg_for li;
    cg_for_begin(b, &li, cg_idx(b, 0), tn, 0, NULL);
    cg_store(b, red_init(b, &rp->ops), accbuf, li.iv);
    cg_for_end(b, &li, 0, NULL);
    /* reduced loops, then the tile innermost */
    cg_for loops[R];
    for (int32_t i = 0; i < nr; i++) {
        cg_for_begin(b, &loops[i], cg_idx(b, 0), cg_idx(b, ns.g_ext[rgroups[i]]), 0, NULL);
        c->gv[rgroups[i]] = loops[i].iv;
    }
    cg_for lt;
    cg_for_begin(b, &lt, cg_idx(b, 0), tn, 0, NULL);
    c->gv[tg] = cg_iadd(b, t0, lt.iv);
    MlirValue next;
    st = emit_red_body(c, rp, cg_load(b, accbuf, lt.iv), &next);
    if (st == LOOM_OK)
        cg_store(b, next, accbuf, lt.iv);
    cg_for_end(b, &lt, 0, NULL);
    for (int32_t i = nr - 1; i >= 0; i--) {
        cg_for_end(b, &loops[i], 0, NULL);
        c->gv[rgroups[i]] = (MlirValue){NULL};
    }
    if (st == LOOM_OK) {
        cg_for le;
        cg_for_begin(b, &le, cg_idx(b, 0), tn, 0, NULL);
        c->gv[tg] = cg_iadd(b, t0, le.iv);
        st = emit_red_epilogue(c, rp, cg_load(b, accbuf, le.iv));
        cg_for_end(b, &le, 0, NULL);
    }
    cg_for_end(b, &lo, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, rp, sizeof *rp);
    return st;
}

/* ---- MATMUL ------------------------------------------------------------------------------- */

typedef struct mm_plan {
    int64_t P, M, K, N, nbm, rows, nbn, cols;
    int64_t cstride; /* elements between rows of C: N, or cols in the scratch block */
    loom_dtype dt;
    MlirType acc_t;
    int32_t acc_res; /* result node whose buffer holds the products, -1: scratch */
    sink epi[64];
    int32_t n_epi;
    nest ns; /* the root's dims, one group per dim */
    bool linalg;
} mm_plan;

static bool mm_linalg_ok(const loom_ir_node *root, int64_t M, int64_t K, int64_t N) {
    return root->dtype == LOOM_DTYPE_F32 && M >= 8 && K >= 8 && N >= 8;
}

/* Columns per task for a matmul of N columns whose (batch, row block) tasks number tasks:
 * N unless the tasks are too few to share among threads. */
static int64_t mm_cols(int64_t tasks, int64_t N) {
    if (tasks >= MM_TASKS_MIN || N < MM_WIDE_N)
        return N > 0 ? N : 1;
    int64_t nbn = ceil_div(MM_TASKS_MIN, tasks);
    if (nbn > N / MM_COLS_MIN)
        nbn = N / MM_COLS_MIN;
    int64_t start = ceil_div(ceil_div(N, nbn), 16) * 16;
    /* a divisor of N (no remainder block: one static linalg.matmul instead of two) */
    for (int64_t c = start; c >= start / 2 && c >= MM_COLS_MIN; c -= 16)
        if (N % c == 0)
            return c;
    return ceil_div(start, 64) * 64 < N ? ceil_div(start, 64) * 64 : N;
}

/* A rows x cols view of flat at off whose rows are stride elements apart. */
static MlirValue view2d(cg_b *b, MlirValue flat, MlirValue off, int64_t rows, int64_t cols,
                        int64_t stride) {
    int64_t strides[2] = {stride, 1}, shape[2] = {rows, cols};
    MlirAttribute layout =
        mlirStridedLayoutAttrGet(b->ctx, mlirShapedTypeGetDynamicStrideOrOffset(), 2, strides);
    MlirType elem = mlirShapedTypeGetElementType(mlirValueGetType(flat));
    MlirType t = mlirMemRefTypeGet(elem, 2, shape, layout, mlirAttributeGetNull());
    int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset();
    MlirNamedAttribute attrs[4] = {
        cg_named(b, "operandSegmentSizes",
                 mlirDenseI32ArrayGet(b->ctx, 4, (int32_t[]){1, 1, 0, 0})),
        cg_named(b, "static_offsets", mlirDenseI64ArrayGet(b->ctx, 1, &dyn)),
        cg_named(b, "static_sizes", mlirDenseI64ArrayGet(b->ctx, 2, shape)),
        cg_named(b, "static_strides", mlirDenseI64ArrayGet(b->ctx, 2, strides)),
    };
    MlirValue ops[2] = {flat, off};
    return mlirOperationGetResult(cg_op(b, "memref.reinterpret_cast", 2, ops, 1, &t, 4, attrs), 0);
}

/* A named linalg op on memrefs (no results), its body region filled by MLIR. */
static void linalg_named(cg_b *b, const char *name, int32_t n_in, const MlirValue *ops,
                         int32_t n_ops) {
    MlirNamedAttribute seg = cg_named(
        b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){n_in, n_ops - n_in}));
    MlirRegion region = mlirRegionCreate();
    MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), b->loc);
    mlirOperationStateAddOperands(&st, n_ops, ops);
    mlirOperationStateAddAttributes(&st, 1, &seg);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    MlirOperation op = mlirOperationCreate(&st);
    mlirLinalgFillBuiltinNamedOpRegion(op);
    mlirBlockAppendOwnedOperation(b->block, op);
}

/* C[rows i0..i0+mb, cols j0..j0+nb) = A x B for one block, with static shapes (linalg
 * path); crow0 is the block's first element in C. */
static void emit_mm_block_linalg(kc *c, const mm_plan *mp, MlirValue a, MlirValue bm, MlirValue cm,
                                 MlirValue p, MlirValue i0, MlirValue j0, MlirValue crow0,
                                 int64_t mb, int64_t nb) {
    cg_b *b = c->b;
    MlirValue aoff = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, mp->M), i0), mp->K);
    MlirValue boff = cg_iadd(b, cg_imul_c(b, p, mp->K * mp->N), j0);
    MlirValue av = view2d(b, a, aoff, mb, mp->K, mp->K);
    MlirValue bv = view2d(b, bm, boff, mp->K, nb, mp->N);
    MlirValue cv = view2d(b, cm, crow0, mb, nb, mp->cstride);
    MlirValue fill[2] = {cg_cf(b, b->f32, 0.0), cv};
    linalg_named(b, "linalg.fill", 1, fill, 2);
    MlirValue mm[3] = {av, bv, cv};
    linalg_named(b, "linalg.matmul", 2, mm, 3);
}

/* The linalg block for a task's rows (full or the last, shorter block), nb columns. */
static void emit_mm_rows_linalg(kc *c, const mm_plan *mp, MlirValue a, MlirValue bm, MlirValue cm,
                                MlirValue p, MlirValue ib, MlirValue i0, MlirValue j0,
                                MlirValue crow0, int64_t nb) {
    cg_b *b = c->b;
    int64_t full = mp->M / mp->rows, rem = mp->M % mp->rows;
    if (!rem) {
        emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, mp->rows, nb);
        return;
    }
    cg_if f;
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_ULT, ib, cg_idx(b, full)));
    emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, mp->rows, nb);
    cg_if_end(b, &f);
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_EQ, ib, cg_idx(b, full)));
    emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, rem, nb);
    cg_if_end(b, &f);
}

static loom_status lower_matmul(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 2 || root->rank < 2)
        return bad_plan(c, root_id, "a matmul without two operands of rank >= 2");
    for (int32_t i = 0; i < 2; i++)
        if (c->s->buf_of[root->inputs[i]] < 0)
            return unsupported(c, root->inputs[i],
                               "a matmul operand computed inside the matmul's kernel (codegen "
                               "reads matmul operands from buffers: fuse producers elsewhere)");
    if (root->dtype == LOOM_DTYPE_BOOL)
        return unsupported(c, root_id, "a bool matmul");
    mm_plan *mp = loom_ir_alloc(&c->s->alloc, sizeof *mp);
    if (!mp)
        return oom(c);
    memset(mp, 0, sizeof *mp);
    loom_status st = LOOM_OK;
    const loom_ir_node *an = &g->nodes[root->inputs[0]];
    int32_t r = root->rank;
    mp->P = loom_ir_numel(r - 2, root->shape);
    mp->M = an->shape[r - 2];
    mp->K = an->shape[r - 1];
    mp->N = root->shape[r - 1];
    mp->dt = root->dtype;
    /* about 8 blocks per batch when M allows (tasks for the pool), in multiples of 8 */
    int64_t rows = mp->M / 8 / 8 * 8;
    rows = rows < MM_ROWS_MIN ? MM_ROWS_MIN : rows > MM_ROWS_MAX ? MM_ROWS_MAX : rows;
    /* wide products get their tasks from column blocks: then rows as tall as allowed, in
     * blocks of about equal height (each row block streams and packs all of B once; the
     * schedule tiles the rows for the caches itself). conv2's W[64,288] x cols[288,36864]
     * ran 25% faster in one 64-row block than in two of 32, the gradient of its columns
     * [288,64] x [64,36864] 15% faster in one 288-row block than in three of 96. Only
     * when the columns do get split (a scratch accumulator holds rows x cols). */
    if (mp->N >= MM_WIDE_N && mp->M > 0 &&
        mp->P * ceil_div(mp->M, MM_WIDE_ROWS_MAX) < MM_TASKS_MIN) {
        rows = ceil_div(ceil_div(mp->M, ceil_div(mp->M, MM_WIDE_ROWS_MAX)), 8) * 8;
    } else if (mp->K * mp->N >= MM_B_STREAMS && mp->M > 0) {
        /* a B bigger than the caches streams from memory once per row block: fewer, taller
         * blocks, still 4 (tasks for 4 threads). conv2's weight gradient [288,36864] x
         * [36864,64] (B 9 MB) ran 8% faster in 4 blocks than in 9 of 32 rows (18% in 2). */
        int64_t quarter = ceil_div(ceil_div(mp->M, 4), 8) * 8;
        quarter = quarter > MM_WIDE_ROWS_MAX ? MM_WIDE_ROWS_MAX : quarter;
        rows = quarter > rows ? quarter : rows;
    }
    mp->rows = mp->M < rows ? (mp->M > 0 ? mp->M : 1) : rows;
    mp->nbm = ceil_div(mp->M, mp->rows);
    mp->cols = mm_cols(mp->P * mp->nbm, mp->N);
    mp->nbn = ceil_div(mp->N, mp->cols);
    mp->linalg = c->use_linalg && mm_linalg_ok(root, mp->M, mp->K, mp->N);

    nest_init(&mp->ns, root->rank, root->shape);
    mp->ns.no_merge = true;
    c->bound = root_id;
    identity_map(&mp->ns, &c->bound_map);
    /* the accumulator: the root's own buffer when it has the accumulator's type, else an
     * epilogue result's of the same type and shape (overwritten in place), else scratch */
    bool own = mp->dt == LOOM_DTYPE_F32 || mp->dt == LOOM_DTYPE_F64 || mp->dt == LOOM_DTYPE_I32 ||
               mp->dt == LOOM_DTYPE_I64;
    mp->acc_res = own && c->s->res_of[root_id] >= 0 ? root_id : -1;
    for (int32_t i = 0; i < c->k->n_results; i++) {
        int32_t id = c->k->results[i];
        const loom_ir_node *n = &g->nodes[id];
        if (!c->s->dep_root[id])
            continue;
        if (!same_shape(n, root)) {
            st = unsupported(c, id, "a matmul epilogue result whose shape is not the product's");
            goto done;
        }
        if (mp->acc_res < 0 && own && n->dtype == mp->dt)
            mp->acc_res = id;
        if (id == root_id && mp->acc_res == root_id)
            continue; /* written by the product loop itself */
        if (mp->n_epi == 64) {
            st = unsupported(c, id, "more than 64 epilogue results");
            goto done;
        }
        mp->epi[mp->n_epi] = (sink){.node = id, .store = true};
        identity_map(&mp->ns, &mp->epi[mp->n_epi++].map);
    }
    if ((st = side_nests(c, root, SIDE_MATMUL)) != LOOM_OK)
        goto done;
    if ((st = plan_nest(c, &mp->ns, mp->n_epi, mp->epi)) != LOOM_OK)
        goto done;
    int64_t numel = loom_ir_numel(root->rank, root->shape);
    c->extent = numel > 0 ? mp->P * mp->nbm * mp->nbn : 1;
    c->grain = grain_for(mp->rows * mp->cols * (mp->K > 0 ? mp->K : 1));
    if (!c->emit || numel == 0)
        goto done;

    cg_b *b = c->b;
    c->ns = &mp->ns;
    clear_gv(c);
    mp->acc_t = is_16(mp->dt) ? b->f32 : compute_type(b, mp->dt);
    MlirValue A = c->bufs[c->s->buf_of[root->inputs[0]]];
    MlirValue B = c->bufs[c->s->buf_of[root->inputs[1]]];
    MlirValue C;
    bool scratch = mp->acc_res < 0;
    mp->cstride = scratch ? mp->cols : mp->N;
    if (scratch) { /* one malloc'd block of rows x cols per call, freed at the end */
        int64_t n = mp->rows * mp->cols;
        MlirType t = mlirMemRefTypeContiguousGet(mp->acc_t, 1, &n, mlirAttributeGetNull());
        MlirNamedAttribute seg =
            cg_named(b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){0, 0}));
        C = mlirOperationGetResult(cg_op(b, "memref.alloc", 0, NULL, 1, &t, 1, &seg), 0);
    } else {
        C = c->bufs[c->s->res_of[mp->acc_res]];
    }
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    /* task = (p * nbm + ib) * nbn + jb: a row block's column blocks are adjacent tasks */
    MlirValue nbnv = cg_idx(b, mp->nbn), nbmv = cg_idx(b, mp->nbm);
    MlirValue pib = mp->nbn > 1 ? cg_bin(b, "arith.divui", lo.iv, nbnv) : lo.iv;
    MlirValue jb = mp->nbn > 1 ? cg_bin(b, "arith.remui", lo.iv, nbnv) : cg_idx(b, 0);
    MlirValue p = mp->nbm > 1 ? cg_bin(b, "arith.divui", pib, nbmv) : pib;
    MlirValue ib = mp->nbm > 1 ? cg_bin(b, "arith.remui", pib, nbmv) : cg_idx(b, 0);
    MlirValue i0 = cg_imul_c(b, ib, mp->rows);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, mp->rows)), cg_idx(b, mp->M));
    MlirValue j0 = cg_imul_c(b, jb, mp->cols);
    MlirValue j1 = cg_imin(b, cg_iadd(b, j0, cg_idx(b, mp->cols)), cg_idx(b, mp->N));
    /* C[i, j] is at crow(i) + j - jc: the block's columns start at 0 in scratch */
    MlirValue cbase = scratch ? cg_idx(b, 0) : cg_imul_c(b, cg_imul_c(b, p, mp->M), mp->N);
    MlirValue jc = j0;
    if (mp->linalg) {
        MlirValue crow0 =
            scratch ? cbase : cg_iadd(b, cg_iadd(b, cbase, cg_imul_c(b, i0, mp->N)), j0);
        int64_t nfull = mp->N / mp->cols, nrem = mp->N % mp->cols;
        if (nrem) {
            cg_if f;
            cg_if_begin(b, &f, cg_cmpi(b, CG_I_ULT, jb, cg_idx(b, nfull)));
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, mp->cols);
            cg_if_end(b, &f);
            cg_if_begin(b, &f, cg_cmpi(b, CG_I_EQ, jb, cg_idx(b, nfull)));
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, nrem);
            cg_if_end(b, &f);
        } else {
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, mp->cols);
        }
    } else {
        /* for i: C[i,:] = 0; for k: C[i,:] += A[i,k] * B[k,:] */
        cg_b *bb = b;
        cg_for li, lk, lj;
        cg_for_begin(bb, &li, i0, i1, 0, NULL);
        MlirValue crow =
            scratch ? cg_bin(bb, "arith.subi",
                             cg_imul_c(bb, cg_bin(bb, "arith.subi", li.iv, i0), mp->cols), jc)
                    : cg_iadd(bb, cbase, cg_imul_c(bb, li.iv, mp->N));
        cg_for_begin(bb, &lj, j0, j1, 0, NULL);
        MlirValue zero =
            loom_ir_dtype_is_float(mp->dt) ? cg_cf(bb, mp->acc_t, 0.0) : cg_ci(bb, mp->acc_t, 0);
        cg_store(bb, zero, C, cg_iadd(bb, crow, lj.iv));
        cg_for_end(bb, &lj, 0, NULL);
        MlirValue arow = cg_imul_c(bb, cg_iadd(bb, cg_imul_c(bb, p, mp->M), li.iv), mp->K);
        MlirValue bbase = cg_imul_c(bb, p, mp->K * mp->N);
        cg_for_begin(bb, &lk, cg_idx(bb, 0), cg_idx(bb, mp->K), 0, NULL);
        MlirValue av = load_val(bb, an->dtype, A, cg_iadd(bb, arow, lk.iv));
        MlirValue brow = cg_iadd(bb, bbase, cg_imul_c(bb, lk.iv, mp->N));
        cg_for_begin(bb, &lj, j0, j1, 0, NULL);
        MlirValue bv = load_val(bb, g->nodes[root->inputs[1]].dtype, B, cg_iadd(bb, brow, lj.iv));
        MlirValue ci = cg_iadd(bb, crow, lj.iv);
        bool fl = loom_ir_dtype_is_float(mp->dt);
        MlirValue prod = cg_bin(bb, fl ? "arith.mulf" : "arith.muli", av, bv);
        cg_store(bb, cg_bin(bb, fl ? "arith.addf" : "arith.addi", cg_load(bb, C, ci), prod), C, ci);
        cg_for_end(bb, &lj, 0, NULL);
        cg_for_end(bb, &lk, 0, NULL);
        cg_for_end(bb, &li, 0, NULL);
    }
    if (mp->n_epi > 0) {
        /* epilogue over the block's rows: batch indices from p, then i, j */
        int32_t bgroups[R], nbg = 0;
        for (int32_t d = 0; d < r - 2; d++)
            if (mp->ns.dim_group[d] >= 0)
                bgroups[nbg++] = mp->ns.dim_group[d];
        if (nbg > 0)
            delinearize(c, p, nbg, bgroups);
        cg_for li, lj;
        cg_for_begin(b, &li, i0, i1, 0, NULL);
        if (mp->ns.dim_group[r - 2] >= 0)
            c->gv[mp->ns.dim_group[r - 2]] = li.iv;
        MlirValue crow =
            scratch ? cg_bin(b, "arith.subi",
                             cg_imul_c(b, cg_bin(b, "arith.subi", li.iv, i0), mp->cols), jc)
                    : cg_iadd(b, cbase, cg_imul_c(b, li.iv, mp->N));
        cg_for_begin(b, &lj, j0, j1, 0, NULL);
        if (mp->ns.dim_group[r - 1] >= 0)
            c->gv[mp->ns.dim_group[r - 1]] = lj.iv;
        MlirValue acc = cg_load(b, C, cg_iadd(b, crow, lj.iv));
        c->bound_v = is_16(mp->dt) ? round16(b, mp->dt, acc) : acc;
        st = emit_sinks(c, mp->n_epi, mp->epi);
        cg_for_end(b, &lj, 0, NULL);
        cg_for_end(b, &li, 0, NULL);
    }
    cg_for_end(b, &lo, 0, NULL);
    if (scratch)
        cg_op(b, "memref.dealloc", 1, &C, 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, mp, sizeof *mp);
    return st;
}

/* ---- entry points ----------------------------------------------------------------------- */

static loom_status kernel_begin(kc *c) {
    const loom_ir_kernel *k = c->k;
    cg_scratch *s = c->s;
    int32_t n = c->g->n_nodes;
    if (s->n_nodes != n)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL,
                                "codegen: scratch sized for another graph");
    if (k->n_args + k->n_results > 2 * 1024)
        return loom_ir_diag_set(c->d, LOOM_STATUS_UNSUPPORTED,
                                "codegen: kernel %d reads and writes %d buffers (limit 2048)",
                                (int)c->kid, (int)(k->n_args + k->n_results));
    if (k->root < 0 || k->root >= n)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: kernel %d: bad root %d",
                                (int)c->kid, (int)k->root);
    for (int32_t i = 0; i < k->n_nodes; i++) {
        if (k->nodes[i] < 0 || k->nodes[i] >= n)
            return bad_plan(c, k->root, "a node id out of range");
        s->in_kernel[k->nodes[i]] = 1;
    }
    for (int32_t i = 0; i < k->n_args; i++) {
        if (k->args[i] < 0 || k->args[i] >= n)
            return bad_plan(c, k->root, "an arg id out of range");
        s->buf_of[k->args[i]] = i;
    }
    for (int32_t i = 0; i < k->n_results; i++) {
        int32_t id = k->results[i];
        if (id < 0 || id >= n || !s->in_kernel[id])
            return bad_plan(c, k->root, "a result that is not computed in the kernel");
        s->res_of[id] = k->n_args + i;
    }
    if (!s->in_kernel[k->root])
        return bad_plan(c, k->root, "the root is not among the kernel's nodes");
    /* nodes depending on the root (graph order = topological order) */
    for (int32_t i = 0; i < k->n_nodes; i++) {
        int32_t id = k->nodes[i];
        const loom_ir_node *nd = &c->g->nodes[id];
        bool dep = id == k->root;
        for (int32_t j = 0; j < nd->n_inputs && !dep; j++)
            dep = nd->inputs[j] >= 0 && nd->inputs[j] < n && s->dep_root[nd->inputs[j]];
        s->dep_root[id] = dep;
    }
    c->bound = -1;
    return LOOM_OK;
}

static void kernel_end(kc *c) {
    const loom_ir_kernel *k = c->k;
    cg_scratch *s = c->s;
    int32_t n = c->g->n_nodes;
    for (int32_t i = 0; i < k->n_nodes; i++)
        if (k->nodes[i] >= 0 && k->nodes[i] < n)
            s->in_kernel[k->nodes[i]] = s->dep_root[k->nodes[i]] = 0;
    for (int32_t i = 0; i < k->n_args; i++)
        if (k->args[i] >= 0 && k->args[i] < n)
            s->buf_of[k->args[i]] = -1;
    for (int32_t i = 0; i < k->n_results; i++)
        if (k->results[i] >= 0 && k->results[i] < n)
            s->res_of[k->results[i]] = -1;
    memo_pop(c, 0);
}

static loom_status lower(kc *c) {
    loom_status st = kernel_begin(c);
    if (st == LOOM_OK) {
        const loom_ir_node *root = &c->g->nodes[c->k->root];
        switch (c->k->kind) {
        case LOOM_IR_KERNEL_ELEMENTWISE: st = lower_elementwise(c); break;
        case LOOM_IR_KERNEL_REDUCTION:
            st = root->op == LOOM_IR_OP_REDUCE_SUM || root->op == LOOM_IR_OP_REDUCE_MEAN ||
                         root->op == LOOM_IR_OP_REDUCE_MAX
                     ? lower_reduction(c)
                     : bad_plan(c, c->k->root, "a REDUCTION kernel whose root is no reduction");
            break;
        case LOOM_IR_KERNEL_MATMUL:
            st = root->op == LOOM_IR_OP_MATMUL
                     ? lower_matmul(c)
                     : bad_plan(c, c->k->root, "a MATMUL kernel whose root is no matmul");
            break;
        case LOOM_IR_KERNEL_COUNT_: st = bad_plan(c, c->k->root, "unknown kernel kind"); break;
        }
    }
    kernel_end(c);
    return st;
}

static kc *kc_new(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k, cg_scratch *s,
                  loom_ir_diag *d) {
    kc *c = loom_ir_alloc(&s->alloc, sizeof *c);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->g = g;
    c->k = &plan->kernels[k];
    c->kid = k;
    c->s = s;
    c->d = d;
    c->bound = -1;
    c->in_dim = -1;
    return c;
}

loom_status loom_cg_kernel_check(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k,
                                 cg_scratch *s, int64_t *out_extent, int64_t *out_grain,
                                 loom_ir_diag *d) {
    kc *c = kc_new(g, plan, k, s, d);
    if (!c)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    loom_status st = lower(c);
    if (st == LOOM_OK) {
        *out_extent = c->extent > 0 ? c->extent : 1;
        *out_grain = c->grain > 0 ? c->grain : 1;
    }
    loom_ir_free(&s->alloc, c, sizeof *c);
    return st;
}

bool loom_cg_kernel_uses_linalg(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k) {
    const loom_ir_kernel *kr = &plan->kernels[k];
    if (kr->kind != LOOM_IR_KERNEL_MATMUL || kr->root < 0 || kr->root >= g->n_nodes)
        return false;
    const loom_ir_node *root = &g->nodes[kr->root];
    if (root->op != LOOM_IR_OP_MATMUL || root->rank < 2 || root->n_inputs != 2)
        return false;
    const loom_ir_node *an = &g->nodes[root->inputs[0]];
    return mm_linalg_ok(root, an->shape[root->rank - 2], an->shape[root->rank - 1],
                        root->shape[root->rank - 1]) &&
           loom_ir_numel(root->rank, root->shape) > 0;
}

loom_status loom_cg_kernel_emit(cg_b *b, const loom_ir_graph *g, const loom_ir_plan *plan,
                                int32_t k, const char *name, bool use_linalg, cg_scratch *s,
                                loom_ir_diag *d) {
    kc *c = kc_new(g, plan, k, s, d);
    if (!c)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    const loom_ir_kernel *kr = c->k;
    int32_t nb = kr->n_args + kr->n_results;
    if (nb > 2 * 1024) {
        loom_ir_free(&s->alloc, c, sizeof *c);
        return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                "codegen: kernel %d has %d buffers (limit 2048)", (int)k, (int)nb);
    }
    c->b = b;
    c->emit = true;
    c->use_linalg = use_linalg;
    /* func.func @name(memref<N x T>..., index, index) */
    size_t tbytes = (size_t)(nb + 2) * (sizeof(MlirType) + sizeof(MlirLocation));
    MlirType *types = loom_ir_alloc(&s->alloc, tbytes);
    if (!types) {
        loom_ir_free(&s->alloc, c, sizeof *c);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    }
    MlirLocation *locs = (MlirLocation *)(types + nb + 2);
    for (int32_t i = 0; i < nb; i++) {
        int32_t id = i < kr->n_args ? kr->args[i] : kr->results[i - kr->n_args];
        const loom_ir_node *n = &g->nodes[id >= 0 && id < g->n_nodes ? id : 0];
        int64_t numel = loom_ir_numel(n->rank, n->shape);
        types[i] = mlirMemRefTypeContiguousGet(storage_type(b, n->dtype), 1, &numel,
                                               mlirAttributeGetNull());
    }
    types[nb] = types[nb + 1] = b->index;
    for (int32_t i = 0; i < nb + 2; i++)
        locs[i] = b->loc;
    MlirType fty = mlirFunctionTypeGet(b->ctx, nb + 2, types, 0, NULL);
    MlirRegion region = mlirRegionCreate();
    MlirBlock entry = mlirBlockCreate(nb + 2, types, locs);
    mlirRegionAppendOwnedBlock(region, entry);
    MlirNamedAttribute attrs[2] = {
        cg_named(b, "sym_name", mlirStringAttrGet(b->ctx, mlirStringRefCreateFromCString(name))),
        cg_named(b, "function_type", mlirTypeAttrGet(fty)),
    };
    MlirOperationState fst =
        mlirOperationStateGet(mlirStringRefCreateFromCString("func.func"), b->loc);
    mlirOperationStateAddAttributes(&fst, 2, attrs);
    mlirOperationStateAddOwnedRegions(&fst, 1, &region);
    MlirOperation fn = mlirOperationCreate(&fst);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(b->module), fn);
    loom_ir_free(&s->alloc, types, tbytes);
    for (int32_t i = 0; i < nb; i++)
        c->bufs[i] = mlirBlockGetArgument(entry, i);
    c->lo = mlirBlockGetArgument(entry, nb);
    c->hi = mlirBlockGetArgument(entry, nb + 1);
    MlirBlock saved = b->block;
    b->block = entry;
    loom_status st = lower(c);
    cg_op(b, "func.return", 0, NULL, 0, NULL, 0, NULL);
    b->block = saved;
    loom_ir_free(&s->alloc, c, sizeof *c);
    return st;
}
