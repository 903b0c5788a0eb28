/* Tests of the matmul schedule: scheduled f32 matmuls, JIT'd through MLIR's execution
 * engine, against a naive triple loop in double; and what it must leave alone. */
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

/* ---- building modules through the C API ------------------------------------------------ */

/* A memref type; dyn_offset gives it a strided layout with a dynamic offset, as a view
 * into a larger buffer would have. */
static MlirType memref_type(MlirContext ctx, MlirType elem, intptr_t rank, const int64_t *shape,
                            bool dyn_offset) {
    if (!dyn_offset)
        return mlirMemRefTypeContiguousGet(elem, rank, shape, mlirAttributeGetNull());
    int64_t strides[3];
    int64_t s = 1;
    for (intptr_t i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
    MlirAttribute layout =
        mlirStridedLayoutAttrGet(ctx, mlirShapedTypeGetDynamicStrideOrOffset(), rank, strides);
    return mlirMemRefTypeGet(elem, rank, shape, layout, mlirAttributeGetNull());
}

typedef struct mm_spec {
    const char *fn; /* function name */
    bool batch;
    int64_t b, m, n, k;
    bool dyn_dims;   /* every extent is dynamic ('?') */
    bool dyn_offset; /* strided layout with a dynamic offset */
} mm_spec;

/* Appends func.func @fn(%A, %B, %C) {llvm.emit_c_interface} { linalg.(batch_)matmul
 * ins(%A, %B) outs(%C); return } to the module, built with the op builders. */
static void add_matmul_func(MlirModule module, const mm_spec *s, MlirType elem) {
    MlirContext ctx = mlirModuleGetContext(module);
    MlirLocation loc = mlirLocationUnknownGet(ctx);
    int64_t dyn = mlirShapedTypeGetDynamicSize();
    intptr_t rank = s->batch ? 3 : 2;
    int64_t sa[3], sb[3], sc[3];
    intptr_t o = 0;
    if (s->batch) {
        sa[0] = sb[0] = sc[0] = s->dyn_dims ? dyn : s->b;
        o = 1;
    }
    sa[o] = sc[o] = s->dyn_dims ? dyn : s->m;
    sa[o + 1] = sb[o] = s->dyn_dims ? dyn : s->k;
    sb[o + 1] = sc[o + 1] = s->dyn_dims ? dyn : s->n;
    MlirType args[3] = {
        memref_type(ctx, elem, rank, sa, s->dyn_offset),
        memref_type(ctx, elem, rank, sb, s->dyn_offset),
        memref_type(ctx, elem, rank, sc, s->dyn_offset),
    };
    MlirLocation locs[3] = {loc, loc, loc};
    MlirRegion body = mlirRegionCreate();
    MlirBlock block = mlirBlockCreate(3, args, locs);
    mlirRegionAppendOwnedBlock(body, block);

    MlirOperationState mm =
        mlirOperationStateGet(sr(s->batch ? "linalg.batch_matmul" : "linalg.matmul"), loc);
    MlirValue operands[3] = {mlirBlockGetArgument(block, 0), mlirBlockGetArgument(block, 1),
                             mlirBlockGetArgument(block, 2)};
    mlirOperationStateAddOperands(&mm, 3, operands);
    int32_t segments[2] = {2, 1};
    MlirNamedAttribute seg_attr = mlirNamedAttributeGet(
        mlirIdentifierGet(ctx, sr("operandSegmentSizes")), mlirDenseI32ArrayGet(ctx, 2, segments));
    mlirOperationStateAddAttributes(&mm, 1, &seg_attr);
    MlirRegion mm_region = mlirRegionCreate();
    mlirOperationStateAddOwnedRegions(&mm, 1, &mm_region);
    MlirOperation mm_op = mlirOperationCreate(&mm);
    mlirLinalgFillBuiltinNamedOpRegion(mm_op);
    mlirBlockAppendOwnedOperation(block, mm_op);
    MlirOperationState ret = mlirOperationStateGet(sr("func.return"), loc);
    mlirBlockAppendOwnedOperation(block, mlirOperationCreate(&ret));

    MlirType fn_type = mlirFunctionTypeGet(ctx, 3, args, 0, NULL);
    MlirNamedAttribute attrs[3] = {
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("sym_name")),
                              mlirStringAttrGet(ctx, sr(s->fn))),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("function_type")),
                              mlirTypeAttrGet(fn_type)),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr("llvm.emit_c_interface")),
                              mlirUnitAttrGet(ctx)),
    };
    MlirOperationState fn = mlirOperationStateGet(sr("func.func"), loc);
    mlirOperationStateAddAttributes(&fn, 3, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(module), mlirOperationCreate(&fn));
}

/* The module's text, owned by the caller (free). */
static char *module_text(MlirModule module) {
    loom_allocator a = loom_allocator_system();
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &a);
    mlirOperationPrint(mlirModuleGetOperation(module), print_to_sbuf, &sb);
    char *s = strdup(sb.data ? sb.data : "");
    loom_ir_sbuf_deinit(&sb);
    return s;
}

static void lower_to_llvm(MlirModule module) {
    static const char pipeline[] =
        "builtin.module(func.func(convert-linalg-to-loops),"
        "convert-vector-to-scf{full-unroll=true},lower-affine,convert-scf-to-cf,"
        "expand-strided-metadata,lower-affine,convert-vector-to-llvm,"
        "finalize-memref-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,"
        "convert-cf-to-llvm,reconcile-unrealized-casts)";
    MlirPassManager pm = mlirPassManagerCreate(mlirModuleGetContext(module));
    assert_true(mlirLogicalResultIsSuccess(mlirParsePassPipeline(
        mlirPassManagerGetAsOpPassManager(pm), sr(pipeline), print_to_stderr, NULL)));
    assert_true(
        mlirLogicalResultIsSuccess(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module))));
    mlirPassManagerDestroy(pm);
}

/* ---- running and checking -------------------------------------------------------------- */

typedef struct desc3 { /* the C interface's memref descriptor, up to rank 3 */
    void *allocated, *aligned;
    int64_t offset, sizes[3], strides[3];
} desc3;

typedef struct desc2 {
    void *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} desc2;

/* Calls fn(A, B, C) on row-major buffers of the spec's shapes, each placed `pad` elements
 * into its allocation (the descriptor's offset). */
static void call_matmul(void *fn, const mm_spec *s, void *a, void *b, void *c, int64_t pad) {
    int64_t bt = s->batch ? s->b : 1;
    if (!s->batch) {
        desc2 da = {a, a, pad, {s->m, s->k}, {s->k, 1}};
        desc2 db = {b, b, pad, {s->k, s->n}, {s->n, 1}};
        desc2 dc = {c, c, pad, {s->m, s->n}, {s->n, 1}};
        void (*f2)(desc2 *, desc2 *, desc2 *);
        memcpy(&f2, &fn, sizeof f2); /* ISO C has no object-to-function pointer cast */
        f2(&da, &db, &dc);
        return;
    }
    desc3 da = {a, a, pad, {bt, s->m, s->k}, {s->m * s->k, s->k, 1}};
    desc3 db = {b, b, pad, {bt, s->k, s->n}, {s->k * s->n, s->n, 1}};
    desc3 dc = {c, c, pad, {bt, s->m, s->n}, {s->m * s->n, s->n, 1}};
    void (*f3)(desc3 *, desc3 *, desc3 *);
    memcpy(&f3, &fn, sizeof f3);
    f3(&da, &db, &dc);
}

/* Checks C_out = C_in + A x B against double sums, over every row_step-th row and every
 * row near the end (where the M remainder pieces are). The tolerance is relative to
 * sum |c_in| + |a_ik b_kj|, the scale of the terms: relative to the result itself,
 * cancellation makes any fp32 sum fail. */
static void check_result(const mm_spec *s, const float *a, const float *b, const float *c_in,
                         const float *c_out, int64_t row_step) {
    int64_t bt = s->batch ? s->b : 1;
    for (int64_t p = 0; p < bt; p++) {
        const float *ap = a + p * s->m * s->k, *bp = b + p * s->k * s->n;
        for (int64_t i = 0; i < s->m; i += (i + row_step < s->m - 9 ? row_step : 1)) {
            for (int64_t j = 0; j < s->n; j++) {
                int64_t ci = p * s->m * s->n + i * s->n + j;
                double ref = c_in[ci], scale = fabs(c_in[ci]);
                for (int64_t q = 0; q < s->k; q++) {
                    ref += (double)ap[i * s->k + q] * bp[q * s->n + j];
                    scale += fabs((double)ap[i * s->k + q] * bp[q * s->n + j]);
                }
                if (fabs(c_out[ci] - ref) > 1e-5 * (scale > 1 ? scale : 1)) {
                    fail_msg("%s: C[%lld][%lld][%lld] = %.9g, expected %.9g", s->fn, (long long)p,
                             (long long)i, (long long)j, (double)c_out[ci], ref);
                }
            }
        }
    }
}

static int64_t count_of(const char *text, const char *needle) {
    int64_t n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Builds, schedules, JITs and runs one f32 matmul and checks it. */
static void run_f32_case(const mm_spec *s) {
    MlirContext ctx = make_context();
    MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(ctx));
    add_matmul_func(module, s, mlirF32TypeGet(ctx));
    assert_true(mlirOperationVerify(mlirModuleGetOperation(module)));

    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_cg_schedule_matmuls(module, &d);
    if (st != LOOM_OK)
        fail_msg("%s: %s", s->fn, d.msg);
    assert_true(mlirOperationVerify(mlirModuleGetOperation(module)));
    char *text = module_text(module);
    /* Scheduled: no matmul left, FMAs on vectors instead. */
    assert_int_equal(count_of(text, "linalg."), 0);
    assert_true(count_of(text, "vector.fma") > 0);
    free(text);

    lower_to_llvm(module);
    MlirExecutionEngine jit = mlirExecutionEngineCreate(module, 2, 0, NULL, false);
    assert_false(mlirExecutionEngineIsNull(jit));
    char name[64];
    snprintf(name, sizeof name, "_mlir_ciface_%s", s->fn);
    void *fn = mlirExecutionEngineLookup(jit, sr(name));
    assert_non_null(fn);

    int64_t bt = s->batch ? s->b : 1, pad = s->dyn_offset ? 5 : 0;
    size_t na = (size_t)(bt * s->m * s->k), nb = (size_t)(bt * s->k * s->n),
           nc = (size_t)(bt * s->m * s->n);
    uint64_t seed = (uint64_t)(s->m * 1000003 + s->n * 1009 + s->k);
    float *a = rnd_buffer(na, pad, &seed), *b = rnd_buffer(nb, pad, &seed);
    float *c = rnd_buffer(nc, pad, &seed), *c_in = malloc(sizeof(float) * nc);
    assert_true(a && b && c && c_in);
    memcpy(c_in, c + pad, sizeof(float) * nc);
    call_matmul(fn, s, a, b, c, pad);
    check_result(s, a + pad, b + pad, c_in, c + pad, s->m * s->n * s->k > (1 << 24) ? 37 : 1);
    free(a);
    free(b);
    free(c);
    free(c_in);
    mlirExecutionEngineDestroy(jit);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
}

#define MATMUL(fn_, m_, n_, k_)                                                                    \
    (mm_spec) {                                                                                    \
        fn_, false, 1, m_, n_, k_, false, false                                                    \
    }

static void test_schedules_a_1x1x1_matmul(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_1x1x1", 1, 1, 1));
}

static void test_schedules_a_7x13x5_matmul_smaller_than_one_tile(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_7x13x5", 7, 13, 5));
}

static void test_schedules_an_8x32x1_matmul_of_exactly_one_tile(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_8x32x1", 8, 32, 1));
}

static void test_schedules_a_64x64x64_matmul(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_64", 64, 64, 64));
}

static void test_schedules_a_100x257x33_matmul_with_remainders_in_m_and_n(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_100x257x33", 100, 257, 33));
}

static void test_schedules_a_256x256x256_matmul(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_256", 256, 256, 256));
}

static void test_schedules_a_1000_cubed_matmul_with_cache_tiles_and_remainders(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_1000", 1000, 1000, 1000)); /* B packed per panel */
    /* Few rows (B not packed), and a prime K > 512: a partial last K cache tile. */
    run_f32_case(&MATMUL("mm_37x1000x1009", 37, 1000, 1009));
}

/* B's rows 8200 floats apart: each cache tile of B is packed whole (K in two tiles of 150,
 * N in 32 tiles of 256 and a piece of 8). */
static void test_schedules_a_wide_matmul_packing_whole_tiles_of_b(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_40x8200x300", 40, 8200, 300));
}

static void test_schedules_an_mlp_layer_with_k_784_and_n_10(void **state) {
    (void)state;
    run_f32_case(&MATMUL("mm_64x512x784", 64, 512, 784));
    run_f32_case(&MATMUL("mm_256x10x512", 256, 10, 512));
}

static void test_schedules_batched_matmuls(void **state) {
    (void)state;
    run_f32_case(&(mm_spec){"bmm_3x20x40x17", true, 3, 20, 40, 17, false, false});
    /* Large enough for the cache tiles and a K split. */
    run_f32_case(&(mm_spec){"bmm_2x33x600x700", true, 2, 33, 600, 700, false, false});
    /* With enough rows for packing B's panels (and 4 more rows unpacked). */
    run_f32_case(&(mm_spec){"bmm_2x260x300x520", true, 2, 260, 300, 520, false, false});
}

static void test_schedules_matmuls_on_views_with_a_dynamic_offset(void **state) {
    (void)state;
    run_f32_case(&(mm_spec){"mm_view", false, 1, 19, 70, 45, false, true});
}

/* Every register tile must be correct on every CPU: force the other ISAs' tiles. */
static void test_schedules_correctly_with_the_avx2_and_generic_tiles(void **state) {
    (void)state;
    setenv("LOOM_MATMUL_ISA", "avx2", 1);
    run_f32_case(&MATMUL("mm_avx2_100x257x33", 100, 257, 33));
    run_f32_case(&MATMUL("mm_avx2_61x530x600", 61, 530, 600));
    run_f32_case(&MATMUL("mm_avx2_300x530x40", 300, 530, 40)); /* packed */
    setenv("LOOM_MATMUL_ISA", "generic", 1);
    run_f32_case(&MATMUL("mm_generic_100x257x33", 100, 257, 33));
    unsetenv("LOOM_MATMUL_ISA");
}

static void test_schedules_every_matmul_of_a_module(void **state) {
    (void)state;
    MlirContext ctx = make_context();
    MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(ctx));
    mm_spec s1 = MATMUL("first", 9, 40, 7), s2 = MATMUL("second", 16, 64, 3);
    add_matmul_func(module, &s1, mlirF32TypeGet(ctx));
    add_matmul_func(module, &s2, mlirF32TypeGet(ctx));
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_cg_schedule_matmuls(module, &d), LOOM_OK);
    char *text = module_text(module);
    assert_int_equal(count_of(text, "linalg.matmul"), 0);
    assert_int_equal(count_of(text, "loom.mm"), 0); /* the schedule's tags are gone */
    free(text);

    lower_to_llvm(module);
    MlirExecutionEngine jit = mlirExecutionEngineCreate(module, 2, 0, NULL, false);
    assert_false(mlirExecutionEngineIsNull(jit));
    /* Hand-checked values: A = ones, B = 2 * ones, C = 1 -> C = 1 + 2k. */
    const mm_spec *specs[2] = {&s1, &s2};
    for (int i = 0; i < 2; i++) {
        const mm_spec *s = specs[i];
        char name[64];
        snprintf(name, sizeof name, "_mlir_ciface_%s", s->fn);
        void *fn = mlirExecutionEngineLookup(jit, sr(name));
        assert_non_null(fn);
        float a[16 * 7], b[7 * 64], c[16 * 64];
        for (int j = 0; j < 16 * 7; j++)
            a[j] = 1.0f;
        for (int j = 0; j < 7 * 64; j++)
            b[j] = 2.0f;
        for (int j = 0; j < 16 * 64; j++)
            c[j] = 1.0f;
        call_matmul(fn, s, a, b, c, 0);
        for (int64_t j = 0; j < s->m * s->n; j++)
            assert_float_equal(c[j], 1.0f + 2.0f * (float)s->k, 0.0f);
    }
    mlirExecutionEngineDestroy(jit);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
}

static void test_leaves_a_module_without_matmuls_unchanged(void **state) {
    (void)state;
    MlirContext ctx = make_context();
    MlirModule module =
        mlirModuleCreateParse(ctx, sr("func.func @add(%a: memref<4xf32>, %b: memref<4xf32>) {\n"
                                      "  linalg.add ins(%a, %a : memref<4xf32>, memref<4xf32>)"
                                      " outs(%b : memref<4xf32>)\n"
                                      "  return\n"
                                      "}\n"));
    assert_false(mlirModuleIsNull(module));
    char *before = module_text(module);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_cg_schedule_matmuls(module, &d), LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    char *after = module_text(module);
    assert_string_equal(before, after);
    free(before);
    free(after);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
}

/* f64 and dynamically shaped matmuls are not the schedule's: they stay as they are, for
 * the generic lowering, and that lowering still computes them. */
static void test_leaves_f64_and_dynamic_matmuls_for_the_generic_lowering(void **state) {
    (void)state;
    MlirContext ctx = make_context();
    MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(ctx));
    mm_spec s64 = MATMUL("mm_f64", 3, 2, 2);
    mm_spec sdyn = {"mm_dyn", false, 1, 3, 2, 2, true, false};
    add_matmul_func(module, &s64, mlirF64TypeGet(ctx));
    add_matmul_func(module, &sdyn, mlirF32TypeGet(ctx));
    char *before = module_text(module);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_cg_schedule_matmuls(module, &d), LOOM_OK);
    char *after = module_text(module);
    assert_string_equal(before, after);
    assert_int_equal(count_of(after, "linalg.matmul"), 2);
    free(before);
    free(after);

    lower_to_llvm(module);
    MlirExecutionEngine jit = mlirExecutionEngineCreate(module, 2, 0, NULL, false);
    assert_false(mlirExecutionEngineIsNull(jit));
    void *fn64 = mlirExecutionEngineLookup(jit, sr("_mlir_ciface_mm_f64"));
    void *fndyn = mlirExecutionEngineLookup(jit, sr("_mlir_ciface_mm_dyn"));
    assert_non_null(fn64);
    assert_non_null(fndyn);
    /* [[1,2],[3,4],[5,6]] x [[1,0],[1,1]] = [[3,2],[7,4],[11,6]], added to C = 0.5. */
    double a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {1, 0, 1, 1}, c[6];
    float af[6] = {1, 2, 3, 4, 5, 6}, bf[4] = {1, 0, 1, 1}, cf[6];
    const double want[6] = {3.5, 2.5, 7.5, 4.5, 11.5, 6.5};
    for (int i = 0; i < 6; i++)
        c[i] = cf[i] = 0.5f;
    call_matmul(fn64, &s64, a, b, c, 0);
    call_matmul(fndyn, &sdyn, af, bf, cf, 0);
    for (int i = 0; i < 6; i++) {
        assert_float_equal(c[i], want[i], 0.0);
        assert_float_equal(cf[i], want[i], 0.0);
    }
    mlirExecutionEngineDestroy(jit);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
}

int main(void) {
    mlirRegisterAllPasses();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedules_a_1x1x1_matmul),
        cmocka_unit_test(test_schedules_a_7x13x5_matmul_smaller_than_one_tile),
        cmocka_unit_test(test_schedules_an_8x32x1_matmul_of_exactly_one_tile),
        cmocka_unit_test(test_schedules_a_64x64x64_matmul),
        cmocka_unit_test(test_schedules_a_100x257x33_matmul_with_remainders_in_m_and_n),
        cmocka_unit_test(test_schedules_a_256x256x256_matmul),
        cmocka_unit_test(test_schedules_a_1000_cubed_matmul_with_cache_tiles_and_remainders),
        cmocka_unit_test(test_schedules_a_wide_matmul_packing_whole_tiles_of_b),
        cmocka_unit_test(test_schedules_an_mlp_layer_with_k_784_and_n_10),
        cmocka_unit_test(test_schedules_batched_matmuls),
        cmocka_unit_test(test_schedules_matmuls_on_views_with_a_dynamic_offset),
        cmocka_unit_test(test_schedules_correctly_with_the_avx2_and_generic_tiles),
        cmocka_unit_test(test_schedules_every_matmul_of_a_module),
        cmocka_unit_test(test_leaves_a_module_without_matmuls_unchanged),
        cmocka_unit_test(test_leaves_f64_and_dynamic_matmuls_for_the_generic_lowering),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
