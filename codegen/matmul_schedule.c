/* The matmul schedule: splits, tiles and vectorizes f32 linalg matmuls through MLIR's
 * transform dialect. The transform script is built with the C API op builders, per matmul. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/Linalg.h>
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
 * The largest matmuls (use_packed: B of 8 MB and more) take the packed path instead, the
 * GotoBLAS/BLIS scheme with both operands packed: before the script, the matmul's main
 * part becomes a linalg.generic over (mo, mi, no, ni, k) on views of A as RM-row blocks
 * and of B as RN-column blocks (rewrite_packed), and the script tiles it n (Nc), k (Kc):
 * B's Kc x Nc tile copied into contiguous Kc x RN panels; m (Mc): A's Mc x Kc tile copied
 * into contiguous RM x Kc panels; then panel by panel the micro-kernel, which reads both
 * operands from the copies only (plan_packed). With every operand read from a stack
 * buffer, LLVM keeps the C block in registers over the k loop itself.
 *
 * The register tile follows the host's vector unit (LLVMGetHostCPUFeatures at run time):
 * 8x32 with AVX-512 (16 zmm accumulators), 6x16 with AVX2 (12 ymm), 8x8 on AArch64, 4x8
 * otherwise. LOOM_MATMUL_ISA=avx512|avx2|generic overrides the choice (for tests and
 * benchmarks; any choice is correct on any CPU, only speed differs).
 *
 * Thread-safe: no global state; concurrent calls on modules of different contexts are
 * fine (codegen compiles in several threads). */

#define MM_TAG "loom.mm"
#define PACKED_TAG "loom.mm_packed"

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

/* The packed path (rewrite_packed, plan_packed): cache tiles of K, of N (B's Kc x Nc tile
 * packed into RN-wide panels: 1 MB) and of M (A's Mc x Kc tile into RM-high panels, 256
 * KB), and the matmuls that take it. Measured on Zen 5 (one thread, CPU time, ratios to
 * OpenBLAS's AVX-512 sgemm, unpacked / packed, two sessions of 3 interleaved rounds):
 * 2048^3 whole 0.94 / 0.96 and 0.98 / 1.00, in codegen's 512-row blocks 0.90 / 0.95 and
 * 0.92 / 0.94 (a gain of 2-5%, the size of the noise); 1024^3 a tie (0.99 / 1.00 whole,
 * 0.95 / 0.94 in 256-row blocks); smaller products lose: 512^3 1.04 / 1.02, 256x512x784
 * 1.05 / 1.00, 256^3 1.10 / 1.02 (packing A costs more than its contiguous reads save
 * while B is small). */
enum {
    KCP_TARGET = 256,        /* a B panel of Kc x RN = 256 x 32 floats (32 KB) stays in L1 */
    NCP_TARGET = 1024,       /* Nc: 512 measured slower, 4096 no faster */
    MCP_TARGET = 256,        /* Mc: 512 measured slower */
    PACKED_MIN_M = 256,      /* rows */
    PACKED_MIN_K_N = 1024,   /* K and N at least */
    PACKED_MIN_KN = 1 << 21, /* and B at least 8 MB (2048 x 1024 floats) */
};

typedef struct mm_tiles {
    int64_t rm, rn; /* register tile */
    int64_t vl;     /* f32 lanes of a vector register */
} mm_tiles;

typedef struct mm_op {
    MlirOperation op;
    bool batch;
    bool packed;           /* the packed path's linalg.generic (see rewrite_packed) */
    int64_t m, n, k;       /* the batch extent is irrelevant to the schedule; packed: in panels */
    int64_t lda, ldb, ldc; /* elements between rows (dynamic: INT64_MIN) */
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
    *out = (mm_op){op, batch, false, a[o], b[o + 1], a[o + 1], lda, ldb, ldc};
    return true;
}

/* The packed path's generic: A as [M/RM, K, RM], B as [N/RN, K, RN] (rewrite_packed). */
static bool qualifies_packed(MlirOperation op, mm_op *out) {
    if (!op_named(op, "linalg.generic") ||
        mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(
            op, mlirStringRefCreateFromCString(PACKED_TAG))))
        return false;
    MlirType a = mlirValueGetType(mlirOperationGetOperand(op, 0)),
             b = mlirValueGetType(mlirOperationGetOperand(op, 1));
    *out = (mm_op){op,
                   false,
                   true,
                   mlirShapedTypeGetDimSize(a, 0),
                   mlirShapedTypeGetDimSize(b, 0),
                   mlirShapedTypeGetDimSize(a, 2),
                   0,
                   0,
                   0};
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
    if (!qualifies(op, &m) && !qualifies_packed(op, &m))
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

/* ---- the packed path: A and B both packed (GotoBLAS) ----------------------------------- */

/* A large matmul's main part (the rows and columns that whole register tiles cover) becomes
 * a linalg.generic over (mo, mi, no, ni, k) that reads A as [M/RM, RM, K] (blocks of RM
 * rows), B as [N/RN, K, RN] (blocks of RN columns) and writes C as [M/RM, RM, N/RN, RN],
 * all plain strided views of the same memory. Promoting a cache tile of such a view copies
 * it into a contiguous buffer of micro-panels: a B panel is Kc x RN, k-major (the RN
 * values of one k step adjacent, as GotoBLAS and BLIS pack it); an A panel is RM rows of
 * Kc, row by row. (BLIS's k-major A panel, the RM values one k step broadcasts adjacent,
 * was measured too, as A viewed [M/RM, K, RM]: its copy reads RM rows lda apart per k and
 * became gathers, 10% slower overall; with that copy's cost taken out it ran no faster
 * than RM rows of one contiguous 8 KB panel.) The
 * rest of M and N stays a linalg.matmul for the ordinary schedule. */

/* Appends op `name` before `before`; result types given. */
static MlirOperation build_before(MlirOperation before, const char *name, intptr_t n_operands,
                                  const MlirValue *operands, intptr_t n_results,
                                  const MlirType *results, intptr_t n_attrs,
                                  const MlirNamedAttribute *attrs) {
    MlirLocation loc = mlirOperationGetLocation(before);
    MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), loc);
    if (n_operands)
        mlirOperationStateAddOperands(&st, n_operands, operands);
    if (n_results)
        mlirOperationStateAddResults(&st, n_results, results);
    if (n_attrs)
        mlirOperationStateAddAttributes(&st, n_attrs, attrs);
    MlirOperation op = mlirOperationCreate(&st);
    mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, op);
    return op;
}

static MlirNamedAttribute named_ctx(MlirContext ctx, const char *name, MlirAttribute a) {
    return mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString(name)), a);
}

/* The base buffer and offset of a strided memref (memref.extract_strided_metadata). */
static void base_and_offset(MlirOperation before, MlirValue v, MlirValue *base, MlirValue *offset) {
    MlirContext ctx = mlirOperationGetContext(before);
    MlirType t = mlirValueGetType(v), index = mlirIndexTypeGet(ctx);
    intptr_t rank = mlirShapedTypeGetRank(t);
    MlirType results[2 + 2 * 3];
    results[0] = mlirMemRefTypeGet(mlirShapedTypeGetElementType(t), 0, NULL, mlirAttributeGetNull(),
                                   mlirMemRefTypeGetMemorySpace(t));
    for (intptr_t i = 1; i < 2 + 2 * rank; i++)
        results[i] = index;
    MlirOperation op = build_before(before, "memref.extract_strided_metadata", 1, &v, 2 + 2 * rank,
                                    results, 0, NULL);
    *base = mlirOperationGetResult(op, 0);
    *offset = mlirOperationGetResult(op, 1);
}

/* offset + delta (index) */
static MlirValue add_index(MlirOperation before, MlirValue offset, int64_t delta) {
    if (delta == 0)
        return offset;
    MlirContext ctx = mlirOperationGetContext(before);
    MlirType index = mlirIndexTypeGet(ctx);
    MlirNamedAttribute value = named_ctx(ctx, "value", mlirIntegerAttrGet(index, delta));
    MlirValue c = mlirOperationGetResult(
        build_before(before, "arith.constant", 0, NULL, 1, &index, 1, &value), 0);
    MlirValue ops[2] = {offset, c};
    return mlirOperationGetResult(build_before(before, "arith.addi", 2, ops, 1, &index, 0, NULL),
                                  0);
}

/* A view of base at offset with the given static sizes and strides. */
static MlirValue strided_view(MlirOperation before, MlirValue base, MlirValue offset, intptr_t rank,
                              const int64_t *sizes, const int64_t *strides) {
    MlirContext ctx = mlirOperationGetContext(before);
    int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset();
    MlirType bt = mlirValueGetType(base);
    MlirType t = mlirMemRefTypeGet(mlirShapedTypeGetElementType(bt), rank, sizes,
                                   mlirStridedLayoutAttrGet(ctx, dyn, rank, strides),
                                   mlirMemRefTypeGetMemorySpace(bt));
    MlirNamedAttribute attrs[4] = {
        named_ctx(ctx, "operandSegmentSizes",
                  mlirDenseI32ArrayGet(ctx, 4, (int32_t[]){1, 1, 0, 0})),
        named_ctx(ctx, "static_offsets", mlirDenseI64ArrayGet(ctx, 1, &dyn)),
        named_ctx(ctx, "static_sizes", mlirDenseI64ArrayGet(ctx, rank, sizes)),
        named_ctx(ctx, "static_strides", mlirDenseI64ArrayGet(ctx, rank, strides)),
    };
    MlirValue ops[2] = {base, offset};
    return mlirOperationGetResult(
        build_before(before, "memref.reinterpret_cast", 2, ops, 1, &t, 4, attrs), 0);
}

/* A named linalg op (matmul) on memrefs before `before`, its region filled by MLIR. */
static void named_linalg_before(MlirOperation before, const char *name, intptr_t n_ops,
                                const MlirValue *ops) {
    MlirContext ctx = mlirOperationGetContext(before);
    MlirNamedAttribute seg =
        named_ctx(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){2, 1}));
    MlirRegion region = mlirRegionCreate();
    MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name),
                                                  mlirOperationGetLocation(before));
    mlirOperationStateAddOperands(&st, n_ops, ops);
    mlirOperationStateAddAttributes(&st, 1, &seg);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    MlirOperation op = mlirOperationCreate(&st);
    mlirLinalgFillBuiltinNamedOpRegion(op);
    mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, op);
}

/* The packed generic C[mo, mi, no, ni] += A[mo, mi, k] * B[no, k, ni]. */
static void packed_generic_before(MlirOperation before, MlirValue a, MlirValue b, MlirValue c) {
    MlirContext ctx = mlirOperationGetContext(before);
    static const char *const maps[3] = {
        "affine_map<(mo, mi, no, ni, k) -> (mo, mi, k)>",
        "affine_map<(mo, mi, no, ni, k) -> (no, k, ni)>",
        "affine_map<(mo, mi, no, ni, k) -> (mo, mi, no, ni)>",
    };
    MlirAttribute map_attrs[3], iters[5];
    for (int i = 0; i < 3; i++)
        map_attrs[i] = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(maps[i]));
    for (int i = 0; i < 5; i++)
        iters[i] = mlirAttributeParseGet(
            ctx, mlirStringRefCreateFromCString(i < 4 ? "#linalg.iterator_type<parallel>"
                                                      : "#linalg.iterator_type<reduction>"));
    MlirNamedAttribute attrs[4] = {
        named_ctx(ctx, "indexing_maps", mlirArrayAttrGet(ctx, 3, map_attrs)),
        named_ctx(ctx, "iterator_types", mlirArrayAttrGet(ctx, 5, iters)),
        named_ctx(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){2, 1})),
        named_ctx(ctx, PACKED_TAG, mlirUnitAttrGet(ctx)),
    };
    MlirLocation loc = mlirOperationGetLocation(before);
    MlirType f32 = mlirF32TypeGet(ctx);
    MlirType args[3] = {f32, f32, f32};
    MlirLocation locs[3] = {loc, loc, loc};
    MlirRegion region = mlirRegionCreate();
    MlirBlock body = mlirBlockCreate(3, args, locs);
    mlirRegionAppendOwnedBlock(region, body);
    MlirValue x[2] = {mlirBlockGetArgument(body, 0), mlirBlockGetArgument(body, 1)};
    MlirOperationState mul =
        mlirOperationStateGet(mlirStringRefCreateFromCString("arith.mulf"), loc);
    mlirOperationStateAddOperands(&mul, 2, x);
    mlirOperationStateAddResults(&mul, 1, &f32);
    MlirOperation mul_op = mlirOperationCreate(&mul);
    mlirBlockAppendOwnedOperation(body, mul_op);
    MlirValue y[2] = {mlirBlockGetArgument(body, 2), mlirOperationGetResult(mul_op, 0)};
    MlirOperationState add =
        mlirOperationStateGet(mlirStringRefCreateFromCString("arith.addf"), loc);
    mlirOperationStateAddOperands(&add, 2, y);
    mlirOperationStateAddResults(&add, 1, &f32);
    MlirOperation add_op = mlirOperationCreate(&add);
    mlirBlockAppendOwnedOperation(body, add_op);
    MlirValue sum = mlirOperationGetResult(add_op, 0);
    MlirOperationState yield =
        mlirOperationStateGet(mlirStringRefCreateFromCString("linalg.yield"), loc);
    mlirOperationStateAddOperands(&yield, 1, &sum);
    mlirBlockAppendOwnedOperation(body, mlirOperationCreate(&yield));

    MlirValue ops[3] = {a, b, c};
    MlirOperationState st =
        mlirOperationStateGet(mlirStringRefCreateFromCString("linalg.generic"), loc);
    mlirOperationStateAddOperands(&st, 3, ops);
    mlirOperationStateAddAttributes(&st, 4, attrs);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before,
                                        mlirOperationCreate(&st));
}

/* Whether m takes the packed path: big enough that packing both operands pays (measured:
 * see the enum above); LOOM_MATMUL_PACK=always|never overrides (tests, benchmarks; any
 * choice is correct). */
static bool use_packed(const mm_op *m, mm_tiles t) {
    int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset();
    if (m->batch || m->packed || m->lda == dyn || m->ldb == dyn || m->ldc == dyn || m->m < t.rm ||
        m->n < t.rn)
        return false;
    const char *forced = getenv("LOOM_MATMUL_PACK");
    if (forced && strcmp(forced, "always") == 0)
        return true;
    if (forced && strcmp(forced, "never") == 0)
        return false;
    return m->m >= PACKED_MIN_M && m->n >= PACKED_MIN_K_N && m->k >= PACKED_MIN_K_N &&
           m->k * m->n >= PACKED_MIN_KN;
}

/* Replaces m's matmul by the packed generic on its first M0 = M / RM * RM rows and N0 = N /
 * RN * RN columns and linalg.matmuls on the rest (rows M0.., then columns N0.. of the first
 * M0 rows). */
static void rewrite_packed(const mm_op *m, mm_tiles t) {
    MlirOperation op = m->op;
    int64_t m0 = m->m / t.rm * t.rm, n0 = m->n / t.rn * t.rn;
    MlirValue base[3], off[3];
    for (int q = 0; q < 3; q++)
        base_and_offset(op, mlirOperationGetOperand(op, q), &base[q], &off[q]);
    int64_t sa[3] = {m0 / t.rm, t.rm, m->k}, ta[3] = {t.rm * m->lda, m->lda, 1};
    int64_t sb[3] = {n0 / t.rn, m->k, t.rn}, tb_[3] = {t.rn, m->ldb, 1};
    int64_t sc[4] = {m0 / t.rm, t.rm, n0 / t.rn, t.rn}, tc[4] = {t.rm * m->ldc, m->ldc, t.rn, 1};
    packed_generic_before(op, strided_view(op, base[0], off[0], 3, sa, ta),
                          strided_view(op, base[1], off[1], 3, sb, tb_),
                          strided_view(op, base[2], off[2], 4, sc, tc));
    if (m0 < m->m) { /* the last rows, all columns */
        int64_t s_a[2] = {m->m - m0, m->k}, t_a[2] = {m->lda, 1};
        int64_t s_b[2] = {m->k, m->n}, t_b[2] = {m->ldb, 1};
        int64_t s_c[2] = {m->m - m0, m->n}, t_c[2] = {m->ldc, 1};
        MlirValue ops[3] = {
            strided_view(op, base[0], add_index(op, off[0], m0 * m->lda), 2, s_a, t_a),
            strided_view(op, base[1], off[1], 2, s_b, t_b),
            strided_view(op, base[2], add_index(op, off[2], m0 * m->ldc), 2, s_c, t_c)};
        named_linalg_before(op, "linalg.matmul", 3, ops);
    }
    if (n0 < m->n) { /* the last columns of the first m0 rows */
        int64_t s_a[2] = {m0, m->k}, t_a[2] = {m->lda, 1};
        int64_t s_b[2] = {m->k, m->n - n0}, t_b[2] = {m->ldb, 1};
        int64_t s_c[2] = {m0, m->n - n0}, t_c[2] = {m->ldc, 1};
        MlirValue ops[3] = {strided_view(op, base[0], off[0], 2, s_a, t_a),
                            strided_view(op, base[1], add_index(op, off[1], n0), 2, s_b, t_b),
                            strided_view(op, base[2], add_index(op, off[2], n0), 2, s_c, t_c)};
        named_linalg_before(op, "linalg.matmul", 3, ops);
    }
    mlirOperationDestroy(op);
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
    int scalable[5] = {0, 0, 0, 0, 0};
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
    bool batch;     /* a batch piece, or a copy of rank 3 */
    bool packed;    /* the packed generic's cache tile: to micro-kernel tiles */
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
static MlirValue t_promote(tb *b, MlirValue h, int64_t operand) {
    MlirAttribute one = i64_attr(b, operand);
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
        plan_add(p, (work){h, false, batch, false, sm->reg, sn->reg});
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
        h = t_promote(b, h, 1);
        MlirValue copy = t_match_in(b, cache_loop, "linalg.copy");
        plan_add(p, (work){h, false, batch, false, sm->reg, sn->reg});
        plan_add(p, (work){copy, true, batch, false, 0, 0});
        p->packed = true;
        return;
    }
    if (!pack) {
        plan_add(p, (work){h, false, batch, false, sm->reg, sn->reg});
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
    h = t_promote(b, h, 1);
    MlirValue copy = t_match_in(b, panel_loop, "linalg.copy");
    plan_add(p, (work){h, false, batch, false, sm->reg, 0});
    plan_add(p, (work){copy, true, batch, false, 0, 0});
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

/* The packed generic (rewrite_packed): loops n (Nc), k (Kc) around a copy of B's Kc x Nc
 * tile into RN-wide panels, then m (Mc) around a copy of A's Mc x Kc tile into RM-high
 * panels, then the micro-kernel over the tile (finish_work). m->m and m->n count panels. */
static void plan_packed(tb *b, plan *p, MlirValue h, const mm_op *m, mm_tiles t) {
    int64_t kc = m->k > KCP_TARGET ? (m->k + (m->k + KCP_TARGET - 1) / KCP_TARGET - 1) /
                                         ((m->k + KCP_TARGET - 1) / KCP_TARGET)
                                   : 0;
    int64_t nc = NCP_TARGET / t.rn, mc = MCP_TARGET / t.rm;
    int64_t sizes1[5] = {0, 0, nc < m->n ? nc : 0, 0, kc ? kc : m->k}, order1[5] = {2, 4, 0, 1, 3};
    MlirOperation t1 = t_tile_op(b, h, 5, sizes1, order1);
    MlirValue k_loop = result(t1, sizes1[2] ? 2 : 1);
    h = t_promote(b, result(t1, 0), 1);
    plan_add(p, (work){t_match_in(b, k_loop, "linalg.copy"), true, true, false, 0, 0});
    int64_t sizes2[5] = {mc < m->m ? mc : m->m, 0, 0, 0, 0};
    MlirOperation t2 = t_tile_op(b, h, 5, sizes2, NULL);
    MlirValue m_loop = result(t2, 1);
    h = t_promote(b, result(t2, 0), 0);
    /* A's copy row by row (Kc wide): static unless the last K tile is shorter; then LLVM
     * vectorizes the plain loops */
    if (kc == 0 || m->k % kc == 0)
        plan_add(p, (work){t_match_in(b, m_loop, "linalg.copy"), true, true, false, 0, 0});
    plan_add(p, (work){h, false, false, true, 0, 0});
    p->packed = true;
}

/* Phase 2: register tiles and vectorization. A packing copy goes row by row (its row count
 * is dynamic in a partial last Kc tile; a row is one static RN-wide vector). */
static void finish_work(tb *b, const work *w) {
    MlirValue h = w->h;
    if (w->packed) {
        /* loops no, mo, k around one RM x RN block: B's panel (Kc x RN) stays in L1 while
         * the cache tile's A panels stream past it */
        int64_t sizes[5] = {1, 0, 1, 0, 1}, order[5] = {2, 0, 1, 3, 4};
        h = t_tile(b, h, 5, sizes, order);
    } else if (w->copy) {
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
        ops[i] = t_match(&b, root,
                         l->ops[i].packed  ? "linalg.generic"
                         : l->ops[i].batch ? "linalg.batch_matmul"
                                           : "linalg.matmul",
                         i);
        funcs[i] = t_parent_func(&b, ops[i]);
    }
    MlirValue all_funcs = t_merge(&b, l->n, funcs);
    plan p = {NULL, 0, 0, false, false};
    for (int32_t i = 0; i < l->n; i++) {
        if (l->ops[i].packed)
            plan_packed(&b, &p, ops[i], &l->ops[i], t);
        else
            plan_matmul(&b, &p, ops[i], &l->ops[i], t);
    }
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

/* Whether op lies inside the region of anc (at any depth). */
static bool nested_in(MlirOperation op, MlirOperation anc) {
    for (MlirOperation p = mlirOperationGetParentOperation(op); !mlirOperationIsNull(p);
         p = mlirOperationGetParentOperation(p))
        if (mlirOperationEqual(p, anc))
            return true;
    return false;
}

/* Whether buffers allocated in the bodies of px and py are live at the same time: one is
 * allocated inside the loop nest that allocates the other (the packed path's A and B
 * panels), not in pieces that run one after the other. */
static bool overlapping(MlirOperation px, MlirOperation py) {
    return mlirOperationEqual(px, py) || nested_in(px, py) || nested_in(py, px);
}

static void hoist_pack_buffers(MlirOperation mod_op, const op_set *before, op_set *after) {
    mlirOperationWalk(mod_op, collect_allocas, after, MlirWalkPostOrder);
    /* each alloca's original parent, and the buffer it was merged into (its index) */
    MlirOperation *parent = malloc(sizeof *parent * (size_t)(after->n ? after->n : 1));
    int32_t *owner = malloc(sizeof *owner * (size_t)(after->n ? after->n : 1));
    if (!parent || !owner) {
        free(parent);
        free(owner);
        after->oom = true;
        return;
    }
    for (int32_t i = 0; i < after->n; i++) {
        parent[i] = mlirOperationGetParentOperation(after->ops[i]);
        owner[i] = i;
    }
    for (int32_t i = 0; i < after->n; i++) {
        MlirOperation a = after->ops[i];
        if (op_set_has(before, a))
            continue;
        MlirOperation fn = parent_func(a);
        if (mlirOperationIsNull(fn))
            continue;
        MlirType type = mlirValueGetType(mlirOperationGetResult(a, 0));
        /* An earlier buffer of this function with the same type takes over its uses, unless
         * it (or a buffer merged into it) is live at the same time. */
        bool merged = false;
        for (int32_t j = 0; j < i && !merged; j++) {
            MlirOperation e = after->ops[j];
            if (mlirOperationIsNull(e) || op_set_has(before, e) ||
                !mlirOperationEqual(parent_func(e), fn) ||
                !mlirTypeEqual(mlirValueGetType(mlirOperationGetResult(e, 0)), type))
                continue;
            bool clash = false;
            for (int32_t q = 0; q < i && !clash; q++)
                clash = owner[q] == j && overlapping(parent[i], parent[q]);
            if (clash)
                continue;
            mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(a, 0),
                                          mlirOperationGetResult(e, 0));
            mlirOperationDestroy(a);
            after->ops[i] = (MlirOperation){NULL};
            owner[i] = j;
            merged = true;
        }
        if (!merged) {
            MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
            mlirOperationMoveBefore(a, mlirBlockGetFirstOperation(entry));
        }
    }
    free(parent);
    free(owner);
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
    mm_tiles tiles = choose_register_tile();
    bool rewritten = false;
    for (int32_t i = 0; i < l.n; i++) {
        if (use_packed(&l.ops[i], tiles)) {
            rewrite_packed(&l.ops[i], tiles);
            rewritten = true;
        }
    }
    if (rewritten) { /* the edges' matmuls and the generics */
        l.n = 0;
        mlirOperationWalk(mod_op, collect, &l, MlirWalkPreOrder);
        if (l.oom) {
            free(l.ops);
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "matmul schedule: out of memory");
        }
    }
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
    MlirModule script = build_script(ctx, &l, tiles, &entry);
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
