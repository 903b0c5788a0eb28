/* Tests of the matmul schedule's packed path (A and B both packed into panels): scheduled
 * f32 matmuls, JIT'd through MLIR's execution engine, against a plain loop in double, for
 * the shapes that take it and its edges (remainders of every block, K below Kc, one row,
 * one column), and which shapes take it. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <mlir-c/ExecutionEngine.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlir_test_util.h"
#include "test_util.h"

#include "codegen/matmul_schedule.h"

typedef struct shape {
    int64_t m, n, k;
    bool dyn_offset; /* views with a dynamic offset, as codegen's row blocks are */
} shape;

/* A row-major rows x cols f32 memref type, with a dynamic offset when asked. */
static MlirType matrix_type(MlirContext ctx, int64_t rows, int64_t cols, bool dyn_offset) {
    int64_t sizes[2] = {rows, cols}, strides[2] = {cols, 1};
    MlirAttribute layout =
        dyn_offset
            ? mlirStridedLayoutAttrGet(ctx, mlirShapedTypeGetDynamicStrideOrOffset(), 2, strides)
            : mlirAttributeGetNull();
    return mlirMemRefTypeGet(mlirF32TypeGet(ctx), 2, sizes, layout, mlirAttributeGetNull());
}

/* A module with func.func @mm(%A, %B, %C) {llvm.emit_c_interface} holding `count`
 * linalg.matmul ins(%A, %B) outs(%C) (C += A x B, count times). */
static MlirModule matmul_module(MlirContext ctx, const shape *s, int count) {
    MlirLocation loc = mlirLocationUnknownGet(ctx);
    MlirType args[3] = {matrix_type(ctx, s->m, s->k, s->dyn_offset),
                        matrix_type(ctx, s->k, s->n, s->dyn_offset),
                        matrix_type(ctx, s->m, s->n, s->dyn_offset)};
    MlirLocation locs[3] = {loc, loc, loc};
    MlirRegion body = mlirRegionCreate();
    MlirBlock block = mlirBlockCreate(3, args, locs);
    mlirRegionAppendOwnedBlock(body, block);
    MlirValue operands[3] = {mlirBlockGetArgument(block, 0), mlirBlockGetArgument(block, 1),
                             mlirBlockGetArgument(block, 2)};
    for (int i = 0; i < count; i++) {
        MlirOperationState mm = mlirOperationStateGet(sr("linalg.matmul"), loc);
        mlirOperationStateAddOperands(&mm, 3, operands);
        MlirNamedAttribute seg =
            mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("operandSegmentSizes")),
                                  mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){2, 1}));
        mlirOperationStateAddAttributes(&mm, 1, &seg);
        MlirRegion region = mlirRegionCreate();
        mlirOperationStateAddOwnedRegions(&mm, 1, &region);
        MlirOperation op = mlirOperationCreate(&mm);
        mlirLinalgFillBuiltinNamedOpRegion(op);
        mlirBlockAppendOwnedOperation(block, op);
    }
    MlirOperationState ret = mlirOperationStateGet(sr("func.return"), loc);
    mlirBlockAppendOwnedOperation(block, mlirOperationCreate(&ret));
    MlirNamedAttribute attrs[3] = {
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("sym_name")),
                              mlirStringAttrGet(ctx, sr("mm"))),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("function_type")),
                              mlirTypeAttrGet(mlirFunctionTypeGet(ctx, 3, args, 0, NULL))),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("llvm.emit_c_interface")),
                              mlirUnitAttrGet(ctx)),
    };
    MlirOperationState fn = mlirOperationStateGet(sr("func.func"), loc);
    mlirOperationStateAddAttributes(&fn, 3, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    MlirModule module = mlirModuleCreateEmpty(loc);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(module), mlirOperationCreate(&fn));
    return module;
}

/* How often needle occurs in the module's text. */
static int64_t count_in_module(MlirModule module, const char *needle) {
    loom_allocator a = loom_allocator_system();
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &a);
    mlirOperationPrint(mlirModuleGetOperation(module), print_to_sbuf, &sb);
    int64_t n = 0;
    for (const char *p = sb.data ? sb.data : ""; (p = strstr(p, needle)) != NULL;
         p += strlen(needle))
        n++;
    loom_ir_sbuf_deinit(&sb);
    return n;
}

typedef struct desc2 { /* the C interface's memref descriptor */
    void *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} desc2;

/* Schedules a module of `count` matmuls of shape s (the packed path forced on, off or left
 * to the schedule: pack = "always", "never", NULL), checks every element of C = C0 + count
 * x A x B against double sums, and returns the number of stack buffers the schedule
 * allocated (the packed path: two per function, A's panels and B's; the unpacked one at
 * most one, B's). */
static int64_t run_case_rows(const shape *s, const char *pack, int count, int64_t row_step) {
    if (pack)
        setenv("LOOM_MATMUL_PACK", pack, 1);
    else
        unsetenv("LOOM_MATMUL_PACK");
    MlirContext ctx = make_context();
    MlirModule module = matmul_module(ctx, s, count);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_cg_schedule_matmuls(module, &d) != LOOM_OK)
        fail_msg("%lldx%lldx%lld: %s", (long long)s->m, (long long)s->n, (long long)s->k, d.msg);
    unsetenv("LOOM_MATMUL_PACK");
    assert_true(mlirOperationVerify(mlirModuleGetOperation(module)));
    assert_int_equal(count_in_module(module, "linalg.matmul"), 0);
    assert_int_equal(count_in_module(module, "linalg.generic"), 0);
    assert_true(count_in_module(module, "vector.fma") > 0);
    int64_t buffers = count_in_module(module, "memref.alloca");

    static const char pipeline[] =
        "builtin.module(func.func(convert-linalg-to-loops),"
        "convert-vector-to-scf{full-unroll=true},lower-affine,convert-scf-to-cf,"
        "expand-strided-metadata,lower-affine,convert-vector-to-llvm,"
        "finalize-memref-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,"
        "convert-cf-to-llvm,reconcile-unrealized-casts)";
    MlirPassManager pm = mlirPassManagerCreate(ctx);
    assert_true(mlirLogicalResultIsSuccess(mlirParsePassPipeline(
        mlirPassManagerGetAsOpPassManager(pm), sr(pipeline), print_to_stderr, NULL)));
    assert_true(
        mlirLogicalResultIsSuccess(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module))));
    mlirPassManagerDestroy(pm);
    MlirExecutionEngine jit = mlirExecutionEngineCreate(module, 2, 0, NULL, false);
    assert_false(mlirExecutionEngineIsNull(jit));
    void *fn = mlirExecutionEngineLookup(jit, sr("_mlir_ciface_mm"));
    assert_non_null(fn);

    int64_t pad = s->dyn_offset ? 3 : 0;
    size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n), nc = (size_t)(s->m * s->n);
    uint64_t seed = (uint64_t)(s->m * 1000003 + s->n * 1009 + s->k);
    float *a = rnd_buffer(na, pad, &seed), *b = rnd_buffer(nb, pad, &seed);
    float *c = rnd_buffer(nc, pad, &seed), *c0 = malloc(sizeof(float) * nc);
    assert_true(a && b && c && c0);
    memcpy(c0, c + pad, sizeof(float) * nc);
    desc2 da = {a, a, pad, {s->m, s->k}, {s->k, 1}};
    desc2 db = {b, b, pad, {s->k, s->n}, {s->n, 1}};
    desc2 dc = {c, c, pad, {s->m, s->n}, {s->n, 1}};
    void (*f)(desc2 *, desc2 *, desc2 *);
    memcpy(&f, &fn, sizeof f); /* ISO C has no object-to-function pointer cast */
    f(&da, &db, &dc);

    const float *ap = a + pad, *bp = b + pad, *cp = c + pad;
    for (int64_t i = 0; i < s->m; i += i + row_step < s->m - 9 ? row_step : 1) {
        for (int64_t j = 0; j < s->n; j++) {
            double dot = 0, scale = 0;
            for (int64_t q = 0; q < s->k; q++) {
                dot += (double)ap[i * s->k + q] * bp[q * s->n + j];
                scale += fabs((double)ap[i * s->k + q] * bp[q * s->n + j]);
            }
            double ref = c0[i * s->n + j] + count * dot;
            scale = fabs(c0[i * s->n + j]) + count * scale;
            if (fabs(cp[i * s->n + j] - ref) > 1e-5 * (scale > 1 ? scale : 1))
                fail_msg("%lldx%lldx%lld (pack %s): C[%lld][%lld] = %.9g, expected %.9g",
                         (long long)s->m, (long long)s->n, (long long)s->k, pack ? pack : "auto",
                         (long long)i, (long long)j, (double)cp[i * s->n + j], ref);
        }
    }
    free(a);
    free(b);
    free(c);
    free(c0);
    mlirExecutionEngineDestroy(jit);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
    return buffers;
}

/* Every row checked. */
static int64_t run_case(const shape *s, const char *pack, int count) {
    return run_case_rows(s, pack, count, 1);
}

/* B of 2048 x 1024 floats, 256 rows: the smallest product the schedule packs by itself
 * (rows 0, 31, 62, ... and the last ones checked). */
static void test_packs_a_and_b_of_a_256x1024x2048_matmul(void **state) {
    (void)state;
    setenv("LOOM_MATMUL_ISA", "avx512", 1); /* the tiles its thresholds were measured with */
    assert_int_equal(run_case_rows(&(shape){256, 1024, 2048, false}, NULL, 1, 31), 2);
    assert_int_equal(run_case_rows(&(shape){256, 1024, 2048, true}, NULL, 1, 31), 2);
    unsetenv("LOOM_MATMUL_ISA");
}

/* Smaller products run faster unpacked: no buffer, or B's panel (with 256 rows or more). */
static void test_keeps_smaller_matmuls_unpacked(void **state) {
    (void)state;
    /* the 8 x 32 tiles of AVX-512 (on a host without it, their 512-bit vectors are split in
     * two: the products are still checked), as the thresholds were measured; with AVX2's
     * 6 x 16, 256 x 1024 x 1024 takes no B panel (a Zen 2) */
    setenv("LOOM_MATMUL_ISA", "avx512", 1);
    assert_int_equal(run_case(&(shape){64, 64, 64, false}, NULL, 1), 0);
    assert_int_equal(run_case(&(shape){256, 256, 256, false}, NULL, 1), 0);
    assert_int_equal(run_case_rows(&(shape){255, 1024, 2048, false}, NULL, 1, 31), 0);
    assert_int_equal(run_case_rows(&(shape){256, 1024, 1024, false}, NULL, 1, 31), 1);
    /* and the override: never */
    assert_int_equal(run_case_rows(&(shape){256, 1024, 2048, false}, "never", 1, 31), 1);
    unsetenv("LOOM_MATMUL_ISA");
}

/* M = 300 = 37 panels of 8 + 4 rows, N = 263 = 8 panels of 32 + 7 columns (the edges'
 * matmuls), K = 520 in Kc tiles of 174, 174 and 172 (the last shorter: A's copy is not
 * vectorized there). */
static void test_packed_path_with_remainders_in_m_n_and_k(void **state) {
    (void)state;
    /* 3: the packed part's two, and B's panel of the 296 x 7 edge (K > 512: cache tiled) */
    assert_int_equal(run_case(&(shape){300, 263, 520, false}, "always", 1), 3);
    /* K over Kc in equal tiles (1000 = 4 x 250), M over Mc (37 panels > 32) */
    assert_int_equal(run_case(&(shape){296, 64, 1000, false}, "always", 1), 2);
}

static void test_packed_path_with_k_smaller_than_kc(void **state) {
    (void)state;
    assert_int_equal(run_case(&(shape){67, 95, 13, false}, "always", 1), 2);
    assert_int_equal(run_case(&(shape){9, 33, 5, false}, "always", 1), 2);
    assert_int_equal(run_case(&(shape){8, 32, 1, false}, "always", 1), 2); /* one tile, K 1 */
}

/* Fewer rows than a register tile, or fewer columns: nothing to pack, all of it is the
 * edges' ordinary matmuls. */
static void test_packed_path_leaves_one_row_or_one_column_to_the_plain_schedule(void **state) {
    (void)state;
    assert_int_equal(run_case(&(shape){1, 300, 200, false}, "always", 1), 0);
    assert_int_equal(run_case(&(shape){300, 1, 200, false}, "always", 1), 0);
    assert_int_equal(run_case(&(shape){1, 1, 1, false}, "always", 1), 0);
    /* one row or column past whole tiles: the packed part and a one-wide edge */
    assert_int_equal(run_case(&(shape){9, 40, 30, false}, "always", 1), 2);
    assert_int_equal(run_case(&(shape){16, 33, 30, false}, "always", 1), 2);
}

static void test_packed_path_on_views_with_a_dynamic_offset(void **state) {
    (void)state;
    assert_int_equal(run_case(&(shape){100, 70, 300, true}, "always", 1), 2);
}

/* A's and B's panels of 64x64x64 have the same size (4096 floats): they are live together
 * and must stay two buffers (sharing one gave wrong products). Two packed matmuls in one
 * function: their buffers sit in the same block (single-trip loops are folded), so none
 * is shared, and C = C0 + 2 A x B. */
static void test_packed_buffers_of_equal_size_stay_apart(void **state) {
    (void)state;
    assert_int_equal(run_case(&(shape){64, 64, 64, false}, "always", 1), 2);
    assert_int_equal(run_case(&(shape){72, 96, 40, false}, "always", 2), 4);
}

static void test_packed_path_with_the_avx2_and_generic_tiles(void **state) {
    (void)state;
    setenv("LOOM_MATMUL_ISA", "avx2", 1); /* 6 x 16 */
    assert_int_equal(run_case(&(shape){50, 45, 270, false}, "always", 1), 2);
    setenv("LOOM_MATMUL_ISA", "generic", 1); /* 4 x 8 */
    assert_int_equal(run_case(&(shape){50, 45, 270, false}, "always", 1), 2);
    unsetenv("LOOM_MATMUL_ISA");
}

int main(void) {
    mlirRegisterAllPasses();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packs_a_and_b_of_a_256x1024x2048_matmul),
        cmocka_unit_test(test_keeps_smaller_matmuls_unpacked),
        cmocka_unit_test(test_packed_path_with_remainders_in_m_n_and_k),
        cmocka_unit_test(test_packed_path_with_k_smaller_than_kc),
        cmocka_unit_test(test_packed_path_leaves_one_row_or_one_column_to_the_plain_schedule),
        cmocka_unit_test(test_packed_path_on_views_with_a_dynamic_offset),
        cmocka_unit_test(test_packed_buffers_of_equal_size_stay_apart),
        cmocka_unit_test(test_packed_path_with_the_avx2_and_generic_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
