/* Internals of the kernel lowering shared by its files, from the top: lower_kernel.c (scratch,
 * entry points, dispatch), one kernel kind each (lower_elementwise.c, lower_reduction.c,
 * lower_matmul.c, lower_pool.c, lower_conv.c with the conv_*.c of conv_internal.h), then what
 * they call: microkernel.c (the packed microkernel), loop_nest.c (nests), lower_eval.c (dtypes
 * and per-element evaluation of fused nodes), lower_errors.c (errors). How a kernel becomes
 * loops is described at the top of lower_kernel.c. */
#ifndef LOOM_CODEGEN_LOWER_INTERNAL_H
#define LOOM_CODEGEN_LOWER_INTERNAL_H

#include <string.h>

#include "cg_internal.h"

enum {
    TASK_WORK = 32768, /* elements (or multiply-adds) a task should do at least */
    PAD_CUTS_MAX = 64, /* pad ranges recorded per nest (more: the rest are not split at) */
    CG_RED_ROOTS_MAX = LOOM_IR_KERNEL_REDUCTIONS_MAX, /* reductions of a REDUCTION kernel */
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
    /* a multi-output reduction's other reduced values, read through bound_map too */
    int32_t n_more;
    int32_t more[CG_RED_ROOTS_MAX - 1];
    MlirValue more_v[CG_RED_ROOTS_MAX - 1];
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

typedef struct sink {
    int32_t node;
    imap map;
    bool store; /* written to its result buffer (otherwise only evaluated) */
} sink;

/* Which results the main nest stores; the others get a side nest each. */
typedef enum side_mode {
    SIDE_ELEMENTWISE, /* results not of the root's shape */
    SIDE_REDUCTION,   /* results that are neither epilogue nor of the operand's shape */
    SIDE_MATMUL,      /* results that do not depend on the product */
    SIDE_CONCAT,      /* results but the concat root */
} side_mode;

static inline bool is_16(loom_dtype dt) {
    return dt == LOOM_DTYPE_F16 || dt == LOOM_DTYPE_BF16;
}

static inline int64_t ceil_div(int64_t a, int64_t b) {
    return b > 0 ? (a + b - 1) / b : 0;
}

static inline bool same_shape(const loom_ir_node *a, const loom_ir_node *b) {
    return loom_ir_same_shape(a, b);
}

/* Index arithmetic on values known non-negative (div, rem), and on i1 (and). */
static inline MlirValue idiv(cg_b *b, MlirValue x, int64_t c) {
    return c == 1 ? x : cg_bin(b, "arith.divui", x, cg_idx(b, c));
}

static inline MlirValue irem(cg_b *b, MlirValue x, int64_t c) {
    return c == 1 ? cg_idx(b, 0) : cg_bin(b, "arith.remui", x, cg_idx(b, c));
}

static inline MlirValue isub(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.subi", x, y);
}

static inline MlirValue imax_s(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.maxsi", x, y);
}

static inline MlirValue imin_s(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.minsi", x, y);
}

/* A gather's or scatter_add's index t (i32 or i64) as an index clamped into [0, len), as
 * ops.def defines them (never out of bounds). */
static inline MlirValue index_clamped(cg_b *b, MlirValue t, int64_t len) {
    MlirValue q = cg_conv(b, "arith.index_cast", t, b->index);
    return imin_s(b, imax_s(b, q, cg_idx(b, 0)), cg_idx(b, len - 1));
}

static inline MlirValue and_i1(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.andi", x, y);
}

/* Index x as a vector of n i32 lanes, and the 16 lanes 0, step, 2 step, ... */
static inline MlirValue cg_splat_i32(cg_b *b, MlirValue x, int64_t n) {
    return cg_vbroadcast(b, cg_conv(b, "arith.index_cast", x, b->i32), cg_vec_t(n, b->i32));
}

static inline MlirValue cg_lanes_i32(cg_b *b, int64_t step) {
    int32_t l[16];
    for (int32_t i = 0; i < 16; i++)
        l[i] = (int32_t)(i * step);
    return cg_vconst_i32(b, 16, l);
}

/* rand_uniform's draw (ir.h) at i64 index i with i64 seed (scalars, or both vectors of i64),
 * as ft (f32 or f64; a vector of it for vector i) (lower_eval.c). */
MlirValue cg_rand_draw(cg_b *b, MlirValue seed, MlirValue i, MlirType ft);

/* ---- errors (lower_errors.c) ---- */
loom_status cg_unsupported(kc *c, int32_t id, const char *why);
loom_status cg_bad_plan(kc *c, int32_t id, const char *why);
loom_status cg_oom(kc *c);

/* ---- nests (loop_nest.c) ---- */
void cg_nest_init(nest *ns, int32_t rank, const int64_t *shape);
void cg_identity_map(const nest *ns, imap *map);
loom_status cg_plan_nest(kc *c, nest *ns, int32_t n_sinks, const sink *sinks);
loom_status cg_emit_sinks(kc *c, int32_t n_sinks, const sink *sinks);
void cg_delinearize(kc *c, MlirValue q, int32_t n, const int32_t *groups);
void cg_clear_gv(kc *c);
loom_status cg_side_nests(kc *c, const loom_ir_node *space, side_mode mode);
int64_t cg_grain_for(int64_t work_per_iter);
/* Sorts v[0..n) ascending and drops repeats; returns how many values remain (cut points of a
 * loop split into parts: pads' ranges, a convolution's border classes). */
int32_t cg_sort_unique(int64_t *v, int32_t n);
enum { CG_EPI_MAX = 64 }; /* epilogue results of a matmul or convolution kernel */
/* The epilogue of a matmul or convolution kernel (root bound to the product): its nest over
 * the root's shape (one group per dim), the results that depend on the root as stored sinks
 * but `skip` (-1: none), the side nests of the others, then the plan of the nest (planned
 * last: on return c->s->leaves holds its leaves, which lower_conv.c's merge_pixels reads). */
loom_status cg_plan_epilogue(kc *c, nest *ns, sink *epi, int32_t *n_epi, int32_t skip);
/* Sets the epilogue nest's (c->ns) index of root dims [lo, hi) from their row-major flat
 * index q. */
void cg_set_dims(kc *c, const loom_ir_node *root, int32_t lo, int32_t hi, MlirValue q);

/* ---- memo, dtypes, evaluation of fused nodes (lower_eval.c) ---- */
void cg_map_none(imap *m);
int32_t cg_memo_mark(kc *c);
void cg_memo_pop(kc *c, int32_t mark);
MlirType cg_storage_type(cg_b *b, loom_dtype dt);
MlirType cg_compute_type(cg_b *b, loom_dtype dt);
/* f32 v (a scalar or a vector) rounded to dt (bf16: to nearest even, NaN kept quiet), as f32. */
MlirValue cg_round16(cg_b *b, loom_dtype dt, MlirValue v);
/* A 16-bit dtype's storage value (bf16 as i16 bits, f16; a scalar or a vector) as f32, and an
 * f32 value already rounded to dt as its storage value; other dtypes pass through. */
MlirValue cg_widen16(cg_b *b, loom_dtype dt, MlirValue v);
MlirValue cg_narrow16(cg_b *b, loom_dtype dt, MlirValue v);
MlirValue cg_load_val(cg_b *b, loom_dtype dt, MlirValue mem, MlirValue off);
void cg_store_val(cg_b *b, loom_dtype dt, MlirValue v, MlirValue mem, MlirValue off);
loom_status cg_add_leaf(kc *c, const loom_ir_node *n, const imap *map);
loom_status cg_offset_of(kc *c, int32_t id, const imap *map, MlirValue *out);
loom_status cg_eval(kc *c, int32_t id, const imap *map, MlirValue *out);

/* ---- the packed microkernel (microkernel.c), of lower_matmul.c and the convolutions ----
 * A block's product C = A x B from packed operands: A row-major, ap[i * kp + kk]; B in
 * panels of 16 columns, bp[(pn * kp + kk) * 16 + l] holding element kk of column 16 pn + l
 * (or, with b_ld, row-major: bp[kk * b_ld + 16 pn + l]);
 * an element is a pair of bf16 along K (pk 2, for vdpbf16ps: B in the VNNI layout) or one
 * f32 (pk 1, for FMAs). C is f32, cs[i * nbp + j]. */
enum {
    MK_ACC = 16,   /* most accumulators (vectors of 16 f32) of a C tile (cg_mk_shape) */
    MK_PANEL = 16, /* columns of a packed B panel (one vector of 16 f32 / bf16 pairs) */
};

typedef struct cg_mk {
    int64_t mr, nv; /* rows and 16-column panels of the C tile (mr * nv = MK_ACC) */
    int64_t pk;     /* elements of K per packed element: 2 (bf16 pairs) or 1 (f32) */
    int64_t kp;     /* packed elements along K of a block */
    int64_t nbp;    /* columns of a block padded to whole tiles: C's row stride */
    int64_t b_ld;   /* B row-major with rows b_ld apart (>= nbp) instead of in panels: 0 */
} cg_mk;

/* The C tile of a block of cols columns: on AVX-512 (loom_cg_mk_acc 16) 8 rows x 32
 * columns, or 16 x 16 for at most 16 columns (a classifier's N = 10 would waste 22); on AVX2
 * (6) always 6 x 16, its loads of B fewest per FMA. */
static inline void cg_mk_shape(cg_mk *m, int64_t cols) {
    int64_t acc = loom_cg_mk_acc();
    m->nv = cols <= MK_PANEL || acc < MK_ACC ? 1 : 2;
    m->mr = acc / m->nv;
}
/* The rows of a C tile of nv panels, where nv is set by the layout (at least one). */
static inline int64_t cg_mk_rows(int64_t nv) {
    int64_t r = loom_cg_mk_acc() / nv;
    return r > 0 ? r : 1;
}

/* Whether 16-bit dtype dt packs bf16 pairs for vdpbf16ps (else its values convert to f32). */
static inline bool cg_mk_pairs(loom_dtype dt) {
    return dt == LOOM_DTYPE_BF16 && loom_cg_mm16_path() == CG_MM16_AVX512BF16;
}
/* Emitted at the start of each tile of cg_mk_tiles (its column tile jt and row tile it),
 * before the tile's product: lower_conv.c prefetches there what the block's epilogue will
 * read and write, so that memory traffic overlaps the multiply-adds. */
typedef struct cg_mk_hook {
    void (*emit)(kc *c, const void *arg, MlirValue jt, MlirValue it);
    const void *arg;
} cg_mk_hook;
/* cs = A x bp over tiles of mr x 16 nv for the block's mb rows and nb columns (padded to
 * whole tiles in the packing), A packed at ap[a0]; accumulate: cs += instead, unless first
 * (an i1, or a NULL value: never) holds, so that a chunked K's first chunk needs no zeroed
 * C; hook: NULL or emitted in every tile. */
void cg_mk_tiles(kc *c, const cg_mk *m, MlirValue ap, MlirValue a0, MlirValue bp, MlirValue cs,
                 MlirValue mb, MlirValue nb, bool accumulate, MlirValue first,
                 const cg_mk_hook *hook);
/* The same with B from bp[b0] and C at cs[cs0] (several products in one buffer each). */
void cg_mk_tiles_at(kc *c, const cg_mk *m, MlirValue ap, MlirValue a0, MlirValue bp, MlirValue b0,
                    MlirValue cs, MlirValue cs0, MlirValue mb, MlirValue nb, bool accumulate,
                    MlirValue first, const cg_mk_hook *hook);
/* Two bf16 (f32 values already rounded to bf16; scalars or vectors) as one i32 each: lo in
 * the low half. */
MlirValue cg_bf16_pair(cg_b *b, MlirValue lo, MlirValue hi);

/* ---- one kernel kind each (lower_elementwise.c, lower_reduction.c, lower_matmul.c,
 * lower_conv.c, lower_pool.c, lower_index.c) ---- */
loom_status cg_lower_elementwise(kc *c);
loom_status cg_lower_reduction(kc *c);
loom_status cg_lower_matmul(kc *c);
loom_status cg_lower_conv(kc *c);
loom_status cg_lower_pool(kc *c);
loom_status cg_lower_scatter(kc *c);
loom_status cg_lower_attention(kc *c);

#endif
