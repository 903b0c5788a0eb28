/* The matmul schedule: splits, tiles and vectorizes f32 linalg matmuls through MLIR's
 * transform dialect. The transform script is built with the C API op builders, per matmul. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/Transform.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>
#include <mlir-c/IR.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matmul_schedule.h"

/* How it works (TOOLCHAIN.md has the measurements behind the basic recipe; the numbers
 * below are single-thread GFLOP/s on the Zen 5 this was tuned on, AVX-512):
 *
 *  1. Every qualifying matmul (f32, static shapes, memrefs with unit innermost stride,
 *     inside a func.func) is tagged with a unique `loom.mm` attribute so the script can
 *     find exactly it. Anything else is left as it is, for the generic lowering.
 *  2. The op is split (transform.structured.split) into up to 12 static pieces so that every
 *     M and N tile of every later level divides its piece exactly: N into a multiple of the
 *     cache tile Nc, a multiple of the register tile RN, a multiple of the vector length
 *     and the rest; M into a multiple of Mc, a multiple of RM and the rest. K needs no
 *     split: its register tile is 1, so a partial cache tile along K stays static inside.
 *     Nothing is dynamic, so nothing needs masks or peeling, and every piece vectorizes
 *     with static vector shapes.
 *  3. Big pieces are tiled for the caches (loops n, k, m) and, with enough rows, B is
 *     packed per RN-wide panel into a stack buffer; when B's rows are far apart (a column
 *     block of a very wide B), its whole Kc x Nc tile is packed instead (plan_piece).
 *     Every piece is then tiled for registers ([RM, RN, 1]: an RM x RN block of C lives in
 *     vector registers over the whole k loop) and vectorized.
 *  4. Once per function: contractions become outer products (one broadcast of A and RM
 *     FMAs per k), memref aliases are folded, CSE runs (without it the C block's reads and
 *     writes are not recognised as loop invariant: 65 instead of 170 GFLOP/s), the C block's
 *     transfers are hoisted out of the k loop, and the vector ops are lowered to 1-D loads,
 *     stores and FMAs so that any standard vector-to-LLVM pipeline finishes the job.
 *  5. The packing buffers are hoisted to their function's entry (hoist_pack_buffers).
 *
 * The register tile follows the host's vector unit (LLVMGetHostCPUFeatures at run time):
 * 8x32 with AVX-512 (16 zmm accumulators), 6x16 with AVX2 (12 ymm), 8x8 on AArch64, 4x8
 * otherwise. LOOM_MATMUL_ISA=avx512|avx2|generic overrides the choice (for tests and
 * benchmarks; any choice is correct on any CPU, only speed differs).
 *
 * Thread-safe: no global state; concurrent calls on modules of different contexts are
 * fine (codegen compiles in several threads). */

#define MM_TAG "loom.mm"

/* Cache tiles (loops n, k, m): a Kc x Nc block of B and an Mc x Kc block of A stay in L2,
 * a packed Kc x RN panel of B in L1. Only "big" matmuls get them (see plan_matmul). */
enum {
    KC_TARGET = 256,
    NC_TARGET = 256,
    MC_TARGET = 256,
    MC_UNTILED_MAX = 512,
    BIG_K_OR_N = 512,     /* K or N above this: big */
    BIG_KN = 512 * 512,   /* or K x N at least this (B at least 1 MB, L2's size) ... */
    BIG_KN_MIN_M = 128,   /* ... with at least this many rows */
    PACK_MIN_M = 256,     /* rows that reuse a packed panel of B enough to pay for packing */
    PACK_TILE_LDB = 8192, /* B's rows this far apart: its whole cache tile is packed */
};

typedef struct mm_tiles {
    int64_t rm, rn; /* register tile */
    int64_t vl;     /* f32 lanes of a vector register */
} mm_tiles;

typedef struct mm_op {
    MlirOperation op;
    bool batch;
    int64_t m, n, k; /* the batch extent is irrelevant to the schedule */
    int64_t ldb;     /* elements between rows of B */
} mm_op;

/* ---- host ISA -------------------------------------------------------------------------- */

static bool has_feature(const char *features, const char *name) {
    size_t n = strlen(name);
    for (const char *p = features; (p = strstr(p, name)) != NULL; p += n) {
        bool starts = p > features && (p[-1] == '+') && (p - 1 == features || p[-2] == ',');
        bool ends = p[n] == ',' || p[n] == '\0';
        if (starts && ends)
            return true;
    }
    return false;
}

static mm_tiles choose_register_tile(void) {
    static const mm_tiles avx512 = {8, 32, 16}, avx2 = {6, 16, 8}, neon = {8, 8, 4},
                          generic = {4, 8, 4};
    const char *forced = getenv("LOOM_MATMUL_ISA");
    if (forced && strcmp(forced, "avx512") == 0)
        return avx512;
    if (forced && strcmp(forced, "avx2") == 0)
        return avx2;
    if (forced && strcmp(forced, "generic") == 0)
        return generic;
    char *features = LLVMGetHostCPUFeatures();
    mm_tiles t = generic;
    if (features && has_feature(features, "avx512f"))
        t = avx512;
    else if (features && has_feature(features, "avx2") && has_feature(features, "fma"))
        t = avx2;
    else if (features && has_feature(features, "neon"))
        t = neon;
    LLVMDisposeMessage(features);
    return t;
}

/* ---- finding the matmuls --------------------------------------------------------------- */

static bool op_named(MlirOperation op, const char *name) {
    MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
    return s.length == strlen(name) && memcmp(s.data, name, s.length) == 0;
}

/* A static-shaped f32 memref of the given rank whose innermost stride is 1 (else the
 * vector loads would be gathers: such a matmul is left to the generic lowering). */
static bool fast_memref(MlirType t, intptr_t rank, int64_t *shape, int64_t *ld) {
    if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t) ||
        mlirShapedTypeGetRank(t) != rank || !mlirTypeIsAF32(mlirShapedTypeGetElementType(t)))
        return false;
    int64_t strides[3], offset;
    if (mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)) ||
        strides[rank - 1] != 1)
        return false;
    *ld = strides[rank - 2];
    for (intptr_t i = 0; i < rank; i++) {
        shape[i] = mlirShapedTypeGetDimSize(t, i);
        if (shape[i] < 1)
            return false; /* empty: nothing to compute, nothing worth scheduling */
    }
    return true;
}

static bool inside_func(MlirOperation op) {
    for (MlirOperation p = mlirOperationGetParentOperation(op); !mlirOperationIsNull(p);
         p = mlirOperationGetParentOperation(p))
        if (op_named(p, "func.func"))
            return true;
    return false;
}

/* Fills *out if op is a matmul this schedule handles. */
static bool qualifies(MlirOperation op, mm_op *out) {
    bool batch = op_named(op, "linalg.batch_matmul");
    if (!batch && !op_named(op, "linalg.matmul"))
        return false;
    if (mlirOperationGetNumOperands(op) != 3 || mlirOperationGetNumResults(op) != 0)
        return false;
    intptr_t rank = batch ? 3 : 2;
    int64_t a[3], b[3], c[3], lda, ldb, ldc;
    if (!fast_memref(mlirValueGetType(mlirOperationGetOperand(op, 0)), rank, a, &lda) ||
        !fast_memref(mlirValueGetType(mlirOperationGetOperand(op, 1)), rank, b, &ldb) ||
        !fast_memref(mlirValueGetType(mlirOperationGetOperand(op, 2)), rank, c, &ldc))
        return false;
    intptr_t o = batch ? 1 : 0; /* index of the M dimension */
    if (batch && !(a[0] == b[0] && a[0] == c[0]))
        return false;
    if (a[o] != c[o] || a[o + 1] != b[o] || b[o + 1] != c[o + 1] || !inside_func(op))
        return false; /* the verifier would reject it; not ours to report */
    *out = (mm_op){op, batch, a[o], b[o + 1], a[o + 1], ldb};
    return true;
}

typedef struct mm_list {
    mm_op *ops;
    int32_t n, cap;
    bool oom;
} mm_list;

static MlirWalkResult collect(MlirOperation op, void *ud) {
    mm_list *l = ud;
    mm_op m;
    if (!qualifies(op, &m))
        return MlirWalkResultAdvance;
    if (l->n == l->cap) {
        int32_t cap = l->cap ? 2 * l->cap : 16;
        mm_op *ops = realloc(l->ops, sizeof *ops * (size_t)cap);
        if (!ops) {
            l->oom = true;
            return MlirWalkResultInterrupt;
        }
        l->ops = ops;
        l->cap = cap;
    }
    l->ops[l->n++] = m;
    return MlirWalkResultAdvance;
}

static MlirWalkResult untag(MlirOperation op, void *ud) {
    (void)ud;
    mlirOperationRemoveDiscardableAttributeByName(op, mlirStringRefCreateFromCString(MM_TAG));
    return MlirWalkResultAdvance;
}

/* ---- building the transform script ----------------------------------------------------- */

typedef struct tb {
    MlirContext ctx;
    MlirLocation loc;
    MlirType any;    /* !transform.any_op */
    MlirBlock block; /* where ops are appended */
} tb;

static MlirStringRef sr(const char *s) {
    return mlirStringRefCreateFromCString(s);
}

static MlirNamedAttribute named(tb *b, const char *name, MlirAttribute attr) {
    return mlirNamedAttributeGet(mlirIdentifierGet(b->ctx, sr(name)), attr);
}

static MlirAttribute i64_attr(tb *b, int64_t v) {
    return mlirIntegerAttrGet(mlirIntegerTypeGet(b->ctx, 64), v);
}

/* Appends `name`(operands) {attrs} with n_results (<= 6) !transform.any_op results to
 * block. */
static MlirOperation emit(tb *b, MlirBlock block, const char *name, intptr_t n_operands,
                          const MlirValue *operands, intptr_t n_attrs,
                          const MlirNamedAttribute *attrs, intptr_t n_results) {
    MlirOperationState st = mlirOperationStateGet(sr(name), b->loc);
    if (n_operands)
        mlirOperationStateAddOperands(&st, n_operands, operands);
    if (n_attrs)
        mlirOperationStateAddAttributes(&st, n_attrs, attrs);
    MlirType results[6];
    for (intptr_t i = 0; i < n_results; i++)
        results[i] = b->any;
    if (n_results)
        mlirOperationStateAddResults(&st, n_results, results);
    MlirOperation op = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(block, op);
    return op;
}

static MlirValue result(MlirOperation op, intptr_t i) {
    return mlirOperationGetResult(op, i);
}

/* transform.structured.match ops{[op_name]} attributes {loom.mm = tag} in root */
static MlirValue t_match(tb *b, MlirValue root, const char *op_name, int64_t tag) {
    MlirAttribute name = mlirStringAttrGet(b->ctx, sr(op_name));
    MlirNamedAttribute tag_attr = named(b, MM_TAG, i64_attr(b, tag));
    MlirNamedAttribute attrs[2] = {
        named(b, "ops", mlirArrayAttrGet(b->ctx, 1, &name)),
        named(b, "op_attrs", mlirDictionaryAttrGet(b->ctx, 1, &tag_attr)),
    };
    return result(emit(b, b->block, "transform.structured.match", 1, &root, 2, attrs, 1), 0);
}

/* transform.structured.match ops{[op_name]} in h */
static MlirValue t_match_in(tb *b, MlirValue h, const char *op_name) {
    MlirAttribute name = mlirStringAttrGet(b->ctx, sr(op_name));
    MlirNamedAttribute attr = named(b, "ops", mlirArrayAttrGet(b->ctx, 1, &name));
    return result(emit(b, b->block, "transform.structured.match", 1, &h, 1, &attr, 1), 0);
}

/* transform.get_parent_op h {op_name = "func.func", deduplicate} */
static MlirValue t_parent_func(tb *b, MlirValue h) {
    MlirNamedAttribute attrs[3] = {
        named(b, "op_name", mlirStringAttrGet(b->ctx, sr("func.func"))),
        named(b, "nth_parent", i64_attr(b, 1)),
        named(b, "deduplicate", mlirUnitAttrGet(b->ctx)),
    };
    return result(emit(b, b->block, "transform.get_parent_op", 1, &h, 3, attrs, 1), 0);
}

static MlirValue t_merge(tb *b, intptr_t n, const MlirValue *hs) {
    MlirNamedAttribute dedup = named(b, "deduplicate", mlirUnitAttrGet(b->ctx));
    return result(emit(b, b->block, "transform.merge_handles", n, hs, 1, &dedup, 1), 0);
}

/* transform.structured.split h after `at` {dimension = dim}: the first part has extent
 * `at` along dim, the second the rest (both relative to h's own iteration space). */
static void t_split(tb *b, MlirValue h, int64_t dim, int64_t at, MlirValue *first,
                    MlirValue *second) {
    MlirNamedAttribute attrs[2] = {
        named(b, "dimension", i64_attr(b, dim)),
        named(b, "static_chunk_sizes", i64_attr(b, at)),
    };
    MlirOperation op = emit(b, b->block, "transform.structured.split", 1, &h, 2, attrs, 2);
    *first = result(op, 0);
    *second = result(op, 1);
}

/* transform.structured.tile_using_for h tile_sizes [sizes] interchange = [interchange]:
 * results are the tiled op, then one loop per non-zero size (outermost first). */
static MlirOperation t_tile_op(tb *b, MlirValue h, intptr_t rank, const int64_t *sizes,
                               const int64_t *interchange) {
    int scalable[4] = {0, 0, 0, 0};
    intptr_t n_loops = 0;
    for (intptr_t i = 0; i < rank; i++)
        n_loops += sizes[i] != 0;
    MlirNamedAttribute attrs[3] = {
        named(b, "static_sizes", mlirDenseI64ArrayGet(b->ctx, rank, sizes)),
        named(b, "scalable_sizes", mlirDenseBoolArrayGet(b->ctx, rank, scalable)),
        named(b, "interchange", mlirDenseI64ArrayGet(b->ctx, interchange ? rank : 0, interchange)),
    };
    return emit(b, b->block, "transform.structured.tile_using_for", 1, &h, 3, attrs, 1 + n_loops);
}

static MlirValue t_tile(tb *b, MlirValue h, intptr_t rank, const int64_t *sizes,
                        const int64_t *interchange) {
    return result(t_tile_op(b, h, rank, sizes, interchange), 0);
}

static void t_vectorize(tb *b, MlirValue h) {
    emit(b, b->block, "transform.structured.vectorize", 1, &h, 0, NULL, 0);
}

typedef struct pattern {
    const char *name;
    intptr_t n_attrs;
    const char *attr_names[2];
    int64_t attr_values[2]; /* i64 attributes; with attr_bool a bool true instead */
    bool attr_bool[2];
} pattern;

/* transform.apply_patterns to h { patterns... } */
static void t_patterns(tb *b, MlirValue h, intptr_t n, const pattern *ps) {
    MlirRegion region = mlirRegionCreate();
    MlirBlock body = mlirBlockCreate(0, NULL, NULL);
    mlirRegionAppendOwnedBlock(region, body);
    for (intptr_t i = 0; i < n; i++) {
        MlirNamedAttribute attrs[2];
        for (intptr_t j = 0; j < ps[i].n_attrs; j++) {
            MlirAttribute v =
                ps[i].attr_bool[j] ? mlirBoolAttrGet(b->ctx, 1) : i64_attr(b, ps[i].attr_values[j]);
            attrs[j] = named(b, ps[i].attr_names[j], v);
        }
        emit(b, body, ps[i].name, 0, NULL, ps[i].n_attrs, attrs, 0);
    }
    MlirOperationState st = mlirOperationStateGet(sr("transform.apply_patterns"), b->loc);
    mlirOperationStateAddOperands(&st, 1, &h);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    mlirBlockAppendOwnedOperation(b->block, mlirOperationCreate(&st));
}

/* A pattern without attributes. */
#define PATTERN(n)                                                                                 \
    { .name = (n) }

/* ---- the schedule of one matmul ---------------------------------------------------------- */

/* One segment of a dimension after splitting: its extent, its cache tile (0: none) and its
 * register tile; both tiles divide the extent, except a cache tile along K. */
typedef struct seg {
    int64_t size, cache, reg;
} seg;

/* What is left to do once every piece is split, cache tiled and packed: tile the piece
 * for registers (or a packing copy row by row) and vectorize it. */
typedef struct work {
    MlirValue h;
    bool copy; /* a packing copy of B's panel; else a matmul piece */
    bool batch;
    int64_t rm, rn; /* matmul: register tile (rn 0: the piece is already one RN panel) */
} work;

typedef struct plan {
    work *items;
    int32_t n, cap;
    bool oom;
    bool packed; /* some piece was packed: its buffer's views need canonicalizing */
} plan;

static void plan_add(plan *p, work w) {
    if (p->n == p->cap) {
        int32_t cap = p->cap ? 2 * p->cap : 64;
        work *items = realloc(p->items, sizeof *items * (size_t)cap);
        if (!items) {
            p->oom = true;
            return;
        }
        p->items = items;
        p->cap = cap;
    }
    p->items[p->n++] = w;
}

/* The cache tile for a dimension of `extent`: among the multiples of unit in [lo, hi], the
 * one covering most of extent (ties: the larger). */
static int64_t pick_cache_tile(int64_t extent, int64_t unit, int64_t lo, int64_t hi) {
    int64_t best = 0, best_cover = -1;
    for (int64_t t = (lo + unit - 1) / unit * unit; t <= hi; t += unit) {
        int64_t cover = extent / t * t;
        if (cover >= best_cover) {
            best = t;
            best_cover = cover;
        }
    }
    return best;
}

/* M or N: [multiple of the cache tile, tiled by it] [multiple of the register tile]
 * [multiple of the vector length vl] [the rest], the cache level only for extents above
 * untiled_max. The vl step matters for N: a piece 10 wide is a vector<10xf32>, which
 * LLVM legalizes for AVX2 with a shuffle per element (6 instead of 60 GFLOP/s at N = 10);
 * as 8 + 2 it is one ymm plus a small tail. */
static int32_t segments(int64_t extent, int64_t reg, int64_t vl, int64_t target,
                        int64_t untiled_max, seg *out) {
    int32_t k = 0;
    int64_t rest = extent;
    if (extent > untiled_max) {
        int64_t c = pick_cache_tile(extent, reg, target / 2, target);
        if (c > 0 && c < extent) {
            out[k++] = (seg){extent / c * c, c, reg};
            rest = extent - extent / c * c;
        }
    }
    if (rest / reg * reg > 0)
        out[k++] = (seg){rest / reg * reg, 0, reg};
    rest %= reg;
    if (vl > 1 && rest / vl * vl > 0) {
        out[k++] = (seg){rest / vl * vl, 0, rest / vl * vl};
        rest %= vl;
    }
    if (rest > 0)
        out[k++] = (seg){rest, 0, rest};
    return k;
}

/* K needs no split: the register tile along K is 1, so a partial last Kc tile still gives
 * static pieces. Kc: equal tiles of at most KC_TARGET. */
static seg segment_k(int64_t k, bool big) {
    if (!big || k <= KC_TARGET)
        return (seg){k, 0, 1};
    int64_t n_tiles = (k + KC_TARGET - 1) / KC_TARGET;
    return (seg){k, (k + n_tiles - 1) / n_tiles, 1};
}

/* Splits h along dim into the given segments; parts[i] gets segment i's handle. */
static void split_segments(tb *b, MlirValue h, int64_t dim, int32_t n, const seg *segs,
                           MlirValue *parts) {
    for (int32_t i = 0; i + 1 < n; i++)
        t_split(b, h, dim, segs[i].size, &parts[i], &h);
    parts[n - 1] = h;
}

/* transform.structured.promote h {operands_to_promote = [1], use_alloca, alignment = 64}:
 * B's tile is copied into a stack buffer, which the caller hoists afterwards. */
static MlirValue t_promote_b(tb *b, MlirValue h) {
    MlirAttribute one = i64_attr(b, 1);
    MlirNamedAttribute attrs[3] = {
        named(b, "operands_to_promote", mlirArrayAttrGet(b->ctx, 1, &one)),
        named(b, "use_alloca", mlirUnitAttrGet(b->ctx)),
        named(b, "alignment", i64_attr(b, 64)),
    };
    return result(emit(b, b->block, "transform.structured.promote", 1, &h, 3, attrs, 1), 0);
}

/* Phase 1 for one static piece. Large pieces are tiled for the caches (loops n, k, m: a
 * Kc x Nc block of B and an Mc x Kc block of A stay in L2). When B's rows lie at least
 * PACK_TILE_LDB floats apart (a column block of a matrix far wider than the piece:
 * conv2's im2col columns [288, 36864]), each row of the Kc x Nc tile is a separate page
 * and the tile is not in any cache: its reads miss one short row after another, and the
 * rows map onto a few cache sets. The whole tile is then copied into a contiguous buffer
 * first, a row (Nc floats) at a time: conv2's W[64,288] x cols ran at 315 instead of 225
 * GFLOP/s, its column gradient [288,64] x [64,36864] at 308 instead of 215. (Where B is
 * in cache the copy costs more than it saves: 64x784x512 at 2 threads went from 420 to
 * 360 when packed this way.) Otherwise, with many rows, B is packed per RN-wide panel:
 * copied into a contiguous Kc x RN buffer that all of the piece's rows read. Unpacked,
 * B's rows lie N floats apart: at N = 2048 a panel maps onto a few cache sets and 2048^3
 * ran at 160 instead of 195 GFLOP/s. With few rows (codegen's 32-row blocks) the copy
 * costs more than it saves: 32-row blocks of 1024^3 ran at 145 packed and 184 unpacked.
 * Small pieces go straight to the register tiles. */
static void plan_piece(tb *b, plan *p, MlirValue h, bool batch, int64_t ldb, const seg *sm,
                       const seg *sn, const seg *sk) {
    /* A cache tile as large as the piece would only add a one-trip loop. */
    int64_t mc = sm->cache < sm->size ? sm->cache : 0, nc = sn->cache < sn->size ? sn->cache : 0,
            kc = sk->cache < sk->size ? sk->cache : 0;
    if (!(mc || nc || kc)) {
        plan_add(p, (work){h, false, batch, sm->reg, sn->reg});
        return;
    }
    bool pack = sm->size >= PACK_MIN_M;
    MlirValue cache_loop = {NULL};
    if (batch) {
        int64_t sizes[4] = {1, mc, nc, kc}, order[4] = {0, 2, 3, 1};
        h = t_tile(b, h, 4, sizes, order);
    } else {
        int64_t sizes[3] = {mc, nc, kc}, order[3] = {1, 2, 0};
        MlirOperation t = t_tile_op(b, h, 3, sizes, order);
        h = result(t, 0);
        cache_loop = result(t, 1);
    }
    if (!batch && ldb >= PACK_TILE_LDB) {
        h = t_promote_b(b, h);
        MlirValue copy = t_match_in(b, cache_loop, "linalg.copy");
        plan_add(p, (work){h, false, batch, sm->reg, sn->reg});
        plan_add(p, (work){copy, true, batch, 0, 0});
        p->packed = true;
        return;
    }
    if (!pack) {
        plan_add(p, (work){h, false, batch, sm->reg, sn->reg});
        return;
    }
    MlirValue panel_loop;
    if (batch) {
        int64_t panel[4] = {0, 0, sn->reg, 0};
        MlirOperation t = t_tile_op(b, h, 4, panel, NULL);
        h = result(t, 0);
        panel_loop = result(t, 1);
    } else {
        int64_t panel[3] = {0, sn->reg, 0};
        MlirOperation t = t_tile_op(b, h, 3, panel, NULL);
        h = result(t, 0);
        panel_loop = result(t, 1);
    }
    h = t_promote_b(b, h);
    MlirValue copy = t_match_in(b, panel_loop, "linalg.copy");
    plan_add(p, (work){h, false, batch, sm->reg, 0});
    plan_add(p, (work){copy, true, batch, 0, 0});
    p->packed = true;
}

/* Big matmuls are cache tiled and packed (plan_piece); measured on Zen 5 (1 MB L2): 1024^3
 * runs at 105 GFLOP/s without, 200 with; 512^3 at 195 / 212; but 64x512x512 is faster
 * unpacked (213 / 195): with few rows a packed panel is reused too little. */
static void plan_matmul(tb *b, plan *p, MlirValue h, const mm_op *m, mm_tiles t) {
    int64_t dm = m->batch ? 1 : 0; /* iteration-space dims: [b,] m, n, k */
    bool big =
        m->k > BIG_K_OR_N || m->n > BIG_K_OR_N || (m->m >= BIG_KN_MIN_M && m->k * m->n >= BIG_KN);
    seg ns[4], ks = segment_k(m->k, big);
    int32_t n_n = segments(m->n, t.rn, t.vl, NC_TARGET, big ? NC_TARGET : INT64_MAX, ns);
    MlirValue by_n[4];
    split_segments(b, h, dm + 1, n_n, ns, by_n);
    for (int32_t i = 0; i < n_n; i++) {
        /* Narrow pieces take more rows: the register tile keeps its number of accumulators
         * (FMA latency x FMA ports needs that many independent sums in flight). */
        int64_t vecs = (ns[i].reg + t.vl - 1) / t.vl;
        int64_t rm = t.rm * (t.rn / t.vl) / vecs;
        seg ms[3];
        int32_t n_m = segments(m->m, rm, 1, MC_TARGET, big ? MC_UNTILED_MAX : INT64_MAX, ms);
        MlirValue by_m[3];
        split_segments(b, by_n[i], dm, n_m, ms, by_m);
        for (int32_t j = 0; j < n_m; j++)
            plan_piece(b, p, by_m[j], m->batch, m->ldb, &ms[j], &ns[i], &ks);
    }
}

/* Phase 2: register tiles and vectorization. A packing copy goes row by row (its row count
 * is dynamic in a partial last Kc tile; a row is one static RN-wide vector). */
static void finish_work(tb *b, const work *w) {
    MlirValue h = w->h;
    if (w->copy) {
        int64_t rows2[2] = {1, 0}, rows3[3] = {1, 1, 0};
        h = w->batch ? t_tile(b, h, 3, rows3, NULL) : t_tile(b, h, 2, rows2, NULL);
    } else if (w->batch) {
        int64_t sizes[4] = {1, w->rm, w->rn, 1};
        h = t_tile(b, h, 4, sizes, NULL);
    } else {
        int64_t sizes[3] = {w->rm, w->rn, 1};
        h = t_tile(b, h, 3, sizes, NULL);
    }
    t_vectorize(b, h);
}

/* Per function, after all its matmuls are vectorized: contractions to outer products to
 * FMAs, alias folding, CSE, hoisting of the C block out of the k loop, 1-D lowering. */
static void finish_funcs(tb *b, MlirValue funcs) {
    static const pattern to_contract[] = {
        PATTERN("transform.apply_patterns.vector.reduction_to_contract"),
        PATTERN("transform.apply_patterns.vector.transfer_permutation_patterns"),
    };
    /* Separately, after contractions exist: a batch piece's unit batch dimension must go
     * before the contraction can become outer products. */
    static const pattern drop_unit[] = {
        PATTERN("transform.apply_patterns.vector.cast_away_vector_leading_one_dim"),
    };
    /* lowering_strategy defaults to outerproduct. */
    static const pattern contract[] = {
        PATTERN("transform.apply_patterns.vector.lower_contraction"),
    };
    static const pattern fold[] = {
        PATTERN("transform.apply_patterns.memref.fold_memref_alias_ops"),
        PATTERN("transform.apply_patterns.canonicalization"),
    };
    static const pattern lower[] = {
        PATTERN("transform.apply_patterns.vector.lower_outerproduct"),
        PATTERN("transform.apply_patterns.vector.transfer_permutation_patterns"),
        {"transform.apply_patterns.vector.lower_transfer",
         1,
         {"max_transfer_rank", NULL},
         {1, 0},
         {false, false}},
        {"transform.apply_patterns.vector.transfer_to_scf",
         2,
         {"max_transfer_rank", "full_unroll"},
         {1, 1},
         {false, true}},
        PATTERN("transform.apply_patterns.vector.lower_broadcast"),
        PATTERN("transform.apply_patterns.vector.lower_shape_cast"),
        PATTERN("transform.apply_patterns.vector.lower_transpose"),
        PATTERN("transform.apply_patterns.canonicalization"),
    };
    t_patterns(b, funcs, 2, to_contract);
    t_patterns(b, funcs, 1, drop_unit);
    t_patterns(b, funcs, 1, contract);
    t_patterns(b, funcs, 2, fold);
    emit(b, b->block, "transform.apply_cse", 1, &funcs, 0, NULL, 0);
    /* Hoisting consumes the handle and returns the functions anew. */
    MlirValue hoisted =
        result(emit(b, b->block, "transform.structured.hoist_redundant_vector_transfers", 1, &funcs,
                    0, NULL, 1),
               0);
    t_patterns(b, hoisted, (intptr_t)(sizeof lower / sizeof lower[0]), lower);
}

/* The transform module holding @__transform_main(%root) that schedules every op in l. */
static MlirModule build_script(MlirContext ctx, const mm_list *l, mm_tiles t,
                               MlirOperation *out_entry) {
    tb b = {ctx, mlirLocationUnknownGet(ctx), mlirTransformAnyOpTypeGet(ctx), {NULL}};
    MlirModule mod = mlirModuleCreateEmpty(b.loc);
    mlirOperationSetAttributeByName(mlirModuleGetOperation(mod),
                                    sr("transform.with_named_sequence"), mlirUnitAttrGet(ctx));

    MlirRegion body = mlirRegionCreate();
    MlirLocation arg_loc = b.loc;
    b.block = mlirBlockCreate(1, &b.any, &arg_loc);
    mlirRegionAppendOwnedBlock(body, b.block);
    MlirValue root = mlirBlockGetArgument(b.block, 0);

    /* Match everything first: later steps consume handles, never the root. */
    MlirValue *ops = malloc(sizeof *ops * (size_t)l->n);
    MlirValue *funcs = malloc(sizeof *funcs * (size_t)l->n);
    if (!ops || !funcs) {
        free(ops);
        free(funcs);
        mlirRegionDestroy(body);
        mlirModuleDestroy(mod);
        return (MlirModule){NULL};
    }
    for (int32_t i = 0; i < l->n; i++) {
        ops[i] = t_match(&b, root, l->ops[i].batch ? "linalg.batch_matmul" : "linalg.matmul", i);
        funcs[i] = t_parent_func(&b, ops[i]);
    }
    MlirValue all_funcs = t_merge(&b, l->n, funcs);
    plan p = {NULL, 0, 0, false, false};
    for (int32_t i = 0; i < l->n; i++)
        plan_matmul(&b, &p, ops[i], &l->ops[i], t);
    if (p.packed) { /* the packed buffers' views become static only now */
        static const pattern canon[] = {PATTERN("transform.apply_patterns.canonicalization")};
        t_patterns(&b, all_funcs, 1, canon);
    }
    for (int32_t i = 0; i < p.n; i++)
        finish_work(&b, &p.items[i]);
    finish_funcs(&b, all_funcs);
    emit(&b, b.block, "transform.yield", 0, NULL, 0, NULL, 0);
    free(ops);
    free(funcs);
    free(p.items);
    if (p.oom) {
        mlirRegionDestroy(body);
        mlirModuleDestroy(mod);
        return (MlirModule){NULL};
    }

    MlirType fn_type = mlirFunctionTypeGet(ctx, 1, &b.any, 0, NULL);
    MlirNamedAttribute readonly = named(&b, "transform.readonly", mlirUnitAttrGet(ctx));
    MlirAttribute arg_attr = mlirDictionaryAttrGet(ctx, 1, &readonly);
    MlirNamedAttribute attrs[3] = {
        named(&b, "sym_name", mlirStringAttrGet(ctx, sr("__transform_main"))),
        named(&b, "function_type", mlirTypeAttrGet(fn_type)),
        named(&b, "arg_attrs", mlirArrayAttrGet(ctx, 1, &arg_attr)),
    };
    MlirOperationState st = mlirOperationStateGet(sr("transform.named_sequence"), b.loc);
    mlirOperationStateAddAttributes(&st, 3, attrs);
    mlirOperationStateAddOwnedRegions(&st, 1, &body);
    *out_entry = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(mod), *out_entry);
    return mod;
}

/* ---- the packing buffers ------------------------------------------------------------- */

/* transform.structured.promote leaves each packing buffer's memref.alloca inside the panel
 * loop, where LLVM would grow the stack on every iteration. Each is moved to the start of
 * its function and the buffers of one function share one allocation: the pieces run one
 * after the other and each fills a panel before reading it. `before` lists the allocas the
 * module had before scheduling; the rest are the schedule's. */
typedef struct op_set {
    MlirOperation *ops;
    int32_t n, cap;
    bool oom;
} op_set;

static void op_set_add(op_set *s, MlirOperation op) {
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 16;
        MlirOperation *ops = realloc(s->ops, sizeof *ops * (size_t)cap);
        if (!ops) {
            s->oom = true;
            return;
        }
        s->ops = ops;
        s->cap = cap;
    }
    s->ops[s->n++] = op;
}

static bool op_set_has(const op_set *s, MlirOperation op) {
    for (int32_t i = 0; i < s->n; i++)
        if (mlirOperationEqual(s->ops[i], op))
            return true;
    return false;
}

static MlirWalkResult collect_allocas(MlirOperation op, void *ud) {
    if (op_named(op, "memref.alloca") && mlirOperationGetNumOperands(op) == 0)
        op_set_add(ud, op);
    return MlirWalkResultAdvance;
}

static MlirOperation parent_func(MlirOperation op) {
    MlirOperation p = mlirOperationGetParentOperation(op);
    while (!mlirOperationIsNull(p) && !op_named(p, "func.func"))
        p = mlirOperationGetParentOperation(p);
    return p;
}

static void hoist_pack_buffers(MlirOperation mod_op, const op_set *before, op_set *after) {
    mlirOperationWalk(mod_op, collect_allocas, after, MlirWalkPostOrder);
    for (int32_t i = 0; i < after->n; i++) {
        MlirOperation a = after->ops[i];
        if (op_set_has(before, a))
            continue;
        MlirOperation fn = parent_func(a);
        if (mlirOperationIsNull(fn))
            continue;
        MlirType type = mlirValueGetType(mlirOperationGetResult(a, 0));
        /* An earlier buffer of this function with the same type takes over its uses. */
        bool merged = false;
        for (int32_t j = 0; j < i && !merged; j++) {
            MlirOperation e = after->ops[j];
            if (mlirOperationIsNull(e) || op_set_has(before, e) ||
                !mlirOperationEqual(parent_func(e), fn) ||
                !mlirTypeEqual(mlirValueGetType(mlirOperationGetResult(e, 0)), type))
                continue;
            mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(a, 0),
                                          mlirOperationGetResult(e, 0));
            mlirOperationDestroy(a);
            after->ops[i] = (MlirOperation){NULL};
            merged = true;
        }
        if (!merged) {
            MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
            mlirOperationMoveBefore(a, mlirBlockGetFirstOperation(entry));
        }
    }
}

/* ---- applying it ---------------------------------------------------------------------- */

typedef struct diag_capture {
    char msg[400];
    size_t len;
    bool seen;
} diag_capture;

static void capture_text(MlirStringRef s, void *ud) {
    diag_capture *c = ud;
    size_t room = sizeof c->msg - 1 - c->len;
    size_t n = s.length < room ? s.length : room;
    memcpy(c->msg + c->len, s.data, n);
    c->len += n;
    c->msg[c->len] = '\0';
}

/* Keeps the first error (MLIR reports the failing transform op there). */
static MlirLogicalResult on_diag(MlirDiagnostic diag, void *ud) {
    diag_capture *c = ud;
    if (mlirDiagnosticGetSeverity(diag) == MlirDiagnosticError && !c->seen) {
        c->seen = true;
        mlirDiagnosticPrint(diag, capture_text, c);
    }
    return mlirLogicalResultSuccess();
}

static const char *const required_ops[] = {
    "transform.named_sequence",
    "transform.structured.match",
    "transform.structured.split",
    "transform.structured.tile_using_for",
    "transform.structured.vectorize",
    "transform.structured.hoist_redundant_vector_transfers",
    "transform.apply_patterns",
    "transform.apply_patterns.vector.lower_contraction",
    "linalg.matmul",
    "vector.fma",
};

/* Verifies and applies the script; MLIR's first error goes into d. */
static loom_status apply_script(MlirOperation mod_op, MlirModule script, MlirOperation entry,
                                loom_ir_diag *d) {
    MlirContext ctx = mlirOperationGetContext(mod_op);
    diag_capture cap = {{0}, 0, false};
    MlirDiagnosticHandlerID handler = mlirContextAttachDiagnosticHandler(ctx, on_diag, &cap, NULL);
    loom_status st = LOOM_OK;
    MlirOperation script_op = mlirModuleGetOperation(script);
    if (!mlirOperationVerify(script_op)) {
        st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL,
                              "matmul schedule: the transform script failed to verify: %s",
                              cap.seen ? cap.msg : "(no diagnostic)");
    } else {
        MlirTransformOptions opts = mlirTransformOptionsCreate();
        /* Re-verifies handles after every transform in debug builds of MLIR (Debian's is a
         * release build, where this does nothing): compile time for a debugging aid. */
        mlirTransformOptionsEnableExpensiveChecks(opts, false);
        if (mlirLogicalResultIsFailure(
                mlirTransformApplyNamedSequence(mod_op, entry, script_op, opts)))
            st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "matmul schedule failed: %s",
                                  cap.seen ? cap.msg : "(no diagnostic)");
        mlirTransformOptionsDestroy(opts);
    }
    mlirContextDetachDiagnosticHandler(ctx, handler);
    return st;
}

loom_status loom_cg_schedule_matmuls(MlirModule module, loom_ir_diag *d) {
    MlirOperation mod_op = mlirModuleGetOperation(module);
    MlirContext ctx = mlirOperationGetContext(mod_op);
    mm_list l = {NULL, 0, 0, false};
    mlirOperationWalk(mod_op, collect, &l, MlirWalkPreOrder);
    if (l.oom) {
        free(l.ops);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "matmul schedule: out of memory");
    }
    if (l.n == 0)
        return LOOM_OK;
    for (size_t i = 0; i < sizeof required_ops / sizeof required_ops[0]; i++) {
        if (!mlirContextIsRegisteredOperation(ctx, sr(required_ops[i]))) {
            free(l.ops);
            return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL,
                                    "matmul schedule: the MLIR context lacks '%s' (register "
                                    "all dialects and extensions, and load them)",
                                    required_ops[i]);
        }
    }

    for (int32_t i = 0; i < l.n; i++)
        mlirOperationSetDiscardableAttributeByName(
            l.ops[i].op, sr(MM_TAG), mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), i));
    op_set before = {NULL, 0, 0, false};
    mlirOperationWalk(mod_op, collect_allocas, &before, MlirWalkPreOrder);
    MlirOperation entry;
    MlirModule script = build_script(ctx, &l, choose_register_tile(), &entry);
    free(l.ops);

    loom_status st;
    if (mlirModuleIsNull(script) || before.oom) {
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "matmul schedule: out of memory");
    } else {
        st = apply_script(mod_op, script, entry, d);
        if (st == LOOM_OK) {
            op_set after = {NULL, 0, 0, false};
            hoist_pack_buffers(mod_op, &before, &after);
            if (after.oom)
                st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                      "matmul schedule: out of memory");
            free(after.ops);
        }
    }
    if (!mlirModuleIsNull(script))
        mlirModuleDestroy(script);
    free(before.ops);
    /* The vectorized pieces no longer exist: this only matters when something failed. */
    mlirOperationWalk(mod_op, untag, NULL, MlirWalkPreOrder);
    return st;
}
