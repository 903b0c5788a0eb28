/* Tests of the MLIR op builder's helpers that emit loops or shuffle networks of their own
 * (codegen/mlir_build.c, conv_stage.c), built into small functions, JIT'd through MLIR's
 * execution engine and run on buffers whose every element is checked: cg_zero_range zeros
 * exactly its range, for run-time and compile-time lengths around the vector's 16 lanes;
 * cg_vtranspose16, its shuffles fenced by cg_vfence, transposes f32, i32 and i16 rows. */
#include <mlir-c/ExecutionEngine.h>
#include <mlir-c/Pass.h>

#include <stdio.h>
#include <string.h>

#include "mlir_test_util.h"
#include "test_util.h"

#include "codegen/cg_internal.h"

enum { BUF = 80, FILL = 7 };

typedef struct desc1 { /* the C interface's descriptor of a 1-D memref */
    void *allocated, *aligned;
    int64_t offset, size, stride;
} desc1;

/* A function of n args being built: its body's region, whose one block b appends to. */
static MlirRegion begin_fn(cg_b *b, int n, const MlirType *args) {
    MlirLocation locs[3] = {b->loc, b->loc, b->loc};
    MlirRegion body = mlirRegionCreate();
    b->block = mlirBlockCreate(n, args, locs);
    mlirRegionAppendOwnedBlock(body, b->block);
    return body;
}

/* Returns from the function begun by begin_fn and adds it to b's module as
 * func.func @name(args) {llvm.emit_c_interface}. */
static void end_fn(cg_b *b, const char *name, int n, const MlirType *args, MlirRegion body) {
    cg_op(b, "func.return", 0, NULL, 0, NULL, 0, NULL);
    MlirNamedAttribute attrs[3] = {
        cg_named(b, "sym_name", mlirStringAttrGet(b->ctx, sr(name))),
        cg_named(b, "function_type",
                 mlirTypeAttrGet(mlirFunctionTypeGet(b->ctx, n, args, 0, NULL))),
        cg_named(b, "llvm.emit_c_interface", mlirUnitAttrGet(b->ctx)),
    };
    MlirOperationState fn = mlirOperationStateGet(sr("func.func"), b->loc);
    mlirOperationStateAddAttributes(&fn, 3, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(b->module), mlirOperationCreate(&fn));
}

/* func.func @name(%mem: memref<BUF x et>, %at: index[, %n: index]) {llvm.emit_c_interface}
 * whose body is cg_zero_range(mem, at, n, 0): n the argument, or the constant fixed_n when
 * fixed_n >= 0. */
static void add_zero_fn(MlirContext ctx, MlirModule module, const char *name, MlirType et,
                        int64_t fixed_n) {
    cg_b b;
    cg_b_init(&b, ctx, module);
    int64_t size = BUF;
    MlirType args[3] = {
        mlirMemRefTypeGet(et, 1, &size, mlirAttributeGetNull(), mlirAttributeGetNull()), b.index,
        b.index};
    int n_args = fixed_n >= 0 ? 2 : 3;
    MlirRegion body = begin_fn(&b, n_args, args);
    MlirValue zero = mlirTypeIsAFloat(et) ? cg_cf(&b, et, 0.0) : cg_ci(&b, et, 0);
    MlirValue n = fixed_n >= 0 ? cg_idx(&b, fixed_n) : mlirBlockGetArgument(b.block, 2);
    cg_zero_range(&b, mlirBlockGetArgument(b.block, 0), mlirBlockGetArgument(b.block, 1), n, zero);
    end_fn(&b, name, n_args, args, body);
}

/* func.func @name(%src: memref<256 x et>, %dst: memref<256 x et>) {llvm.emit_c_interface}:
 * src's 16 rows of 16 loaded as vectors, cg_vtranspose16, stored to dst. One builder for all
 * the module's functions, as codegen's (each declares the intrinsics it calls once). */
static void add_transpose_fn(cg_b *b, const char *name, MlirType et) {
    int64_t size = 256;
    MlirType mt = mlirMemRefTypeGet(et, 1, &size, mlirAttributeGetNull(), mlirAttributeGetNull());
    MlirType args[2] = {mt, mt};
    MlirRegion body = begin_fn(b, 2, args);
    MlirValue src = mlirBlockGetArgument(b->block, 0), dst = mlirBlockGetArgument(b->block, 1);
    MlirValue r[16];
    for (int i = 0; i < 16; i++)
        r[i] = cg_vload(b, cg_vec_t(16, et), src, cg_idx(b, 16 * i));
    cg_vtranspose16(b, r);
    for (int i = 0; i < 16; i++)
        cg_vstore(b, r[i], dst, cg_idx(b, 16 * i));
    end_fn(b, name, 2, args, body);
}

static const int64_t fixed_lengths[] = {0, 5, 16, 21, 32};

typedef struct jit_fns {
    MlirContext ctx;
    MlirModule module;
    MlirExecutionEngine jit;
} jit_fns;

/* zero_f32 and zero_i32 (n an argument), zero_c<n> for each fixed length, transpose_f32,
 * transpose_i32 and transpose_i16, lowered as codegen lowers its kernels and JIT'd. */
static jit_fns build(void) {
    jit_fns j;
    j.ctx = make_context();
    j.module = mlirModuleCreateEmpty(mlirLocationUnknownGet(j.ctx));
    add_zero_fn(j.ctx, j.module, "zero_f32", mlirF32TypeGet(j.ctx), -1);
    add_zero_fn(j.ctx, j.module, "zero_i32", mlirIntegerTypeGet(j.ctx, 32), -1);
    for (size_t i = 0; i < sizeof fixed_lengths / sizeof fixed_lengths[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "zero_c%lld", (long long)fixed_lengths[i]);
        add_zero_fn(j.ctx, j.module, name, mlirF32TypeGet(j.ctx), fixed_lengths[i]);
    }
    cg_b tb;
    cg_b_init(&tb, j.ctx, j.module);
    add_transpose_fn(&tb, "transpose_f32", mlirF32TypeGet(j.ctx));
    add_transpose_fn(&tb, "transpose_i32", mlirIntegerTypeGet(j.ctx, 32));
    add_transpose_fn(&tb, "transpose_i16", mlirIntegerTypeGet(j.ctx, 16));
    assert_true(mlirOperationVerify(mlirModuleGetOperation(j.module)));
    static const char pipeline[] =
        "builtin.module(convert-scf-to-cf,convert-vector-to-llvm,convert-arith-to-llvm,"
        "finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
        "reconcile-unrealized-casts)";
    MlirPassManager pm = mlirPassManagerCreate(j.ctx);
    assert_true(mlirLogicalResultIsSuccess(mlirParsePassPipeline(
        mlirPassManagerGetAsOpPassManager(pm), sr(pipeline), print_to_stderr, NULL)));
    assert_true(
        mlirLogicalResultIsSuccess(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(j.module))));
    mlirPassManagerDestroy(pm);
    j.jit = mlirExecutionEngineCreate(j.module, 2, 0, NULL, false);
    assert_false(mlirExecutionEngineIsNull(j.jit));
    return j;
}

static void destroy(jit_fns *j) {
    mlirExecutionEngineDestroy(j->jit);
    mlirModuleDestroy(j->module);
    mlirContextDestroy(j->ctx);
}

static void *lookup(const jit_fns *j, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "_mlir_ciface_%s", name);
    void *fn = mlirExecutionEngineLookup(j->jit, sr(full));
    assert_non_null(fn);
    return fn;
}

/* Every element of buf: 0 in [at, at + n) (none where n <= 0), FILL elsewhere. */
static void check_zeroed(const char *what, const int32_t *bits, const float *f, int64_t at,
                         int64_t n) {
    for (int64_t i = 0; i < BUF; i++) {
        bool zeroed = i >= at && i < at + n;
        bool ok = f ? f[i] == (zeroed ? 0.0f : (float)FILL) : bits[i] == (zeroed ? 0 : FILL);
        if (!ok)
            fail_msg("%s at %lld, n %lld: element %lld is %g, expected %d", what, (long long)at,
                     (long long)n, (long long)i, f ? (double)f[i] : (double)bits[i],
                     zeroed ? 0 : FILL);
    }
}

/* Run-time lengths: none, negative, under, at and over one and two vectors of 16, at
 * offsets that are and are not multiples of 16, the last one ending at the buffer's end. */
static void test_zero_range_zeros_exactly_its_range_of_a_run_time_length(void **state) {
    (void)state;
    jit_fns j = build();
    void (*zf)(desc1 *, int64_t, int64_t), (*zi)(desc1 *, int64_t, int64_t);
    void *pf = lookup(&j, "zero_f32"), *pi = lookup(&j, "zero_i32");
    memcpy(&zf, &pf, sizeof zf); /* ISO C has no object-to-function pointer cast */
    memcpy(&zi, &pi, sizeof zi);
    static const int64_t lengths[] = {-3, 0, 1, 7, 15, 16, 17, 31, 32, 33, 47};
    static const int64_t offsets[] = {0, 5, 16};
    for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++)
        for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
            int64_t at = offsets[o], n = lengths[l];
            float f[BUF];
            int32_t bits[BUF];
            for (int i = 0; i < BUF; i++)
                f[i] = (float)FILL, bits[i] = FILL;
            desc1 df = {f, f, 0, BUF, 1}, di = {bits, bits, 0, BUF, 1};
            zf(&df, at, n);
            zi(&di, at, n);
            check_zeroed("f32", NULL, f, at, n);
            check_zeroed("i32", bits, NULL, at, n);
        }
    int64_t at = BUF - 33; /* the masked rest's lanes past the buffer's end touch no memory */
    float f[BUF];
    for (int i = 0; i < BUF; i++)
        f[i] = (float)FILL;
    desc1 df = {f, f, 0, BUF, 1};
    zf(&df, at, 33);
    check_zeroed("f32 to the end", NULL, f, at, 33);
    destroy(&j);
}

/* Compile-time lengths take the path without a run-time count: whole vectors, then a
 * masked store only where 16 does not divide n. */
static void test_zero_range_zeros_exactly_its_range_of_a_constant_length(void **state) {
    (void)state;
    jit_fns j = build();
    for (size_t l = 0; l < sizeof fixed_lengths / sizeof fixed_lengths[0]; l++) {
        char name[32];
        snprintf(name, sizeof name, "zero_c%lld", (long long)fixed_lengths[l]);
        void (*zc)(desc1 *, int64_t);
        void *p = lookup(&j, name);
        memcpy(&zc, &p, sizeof zc);
        for (int64_t at = 0; at <= 3; at += 3) {
            float f[BUF];
            for (int i = 0; i < BUF; i++)
                f[i] = (float)FILL;
            desc1 df = {f, f, 0, BUF, 1};
            zc(&df, at);
            check_zeroed(name, NULL, f, at, fixed_lengths[l]);
        }
    }
    destroy(&j);
}

/* Every element lands at its transposed place, f32 (the staging's rows), i32 (bf16 pairs)
 * and i16 (bf16 images by taps, vectors of 256 bits): element (i, j) of dst is element (j, i) of
 * src, with distinct values throughout (a transpose that lost or swapped any lane of any level
 * fails). */
static void test_transpose16_moves_every_element_to_its_transposed_place(void **state) {
    (void)state;
    jit_fns j = build();
    void (*tf)(desc1 *, desc1 *), (*ti)(desc1 *, desc1 *), (*th)(desc1 *, desc1 *);
    void *pf = lookup(&j, "transpose_f32"), *pi = lookup(&j, "transpose_i32");
    void *ph = lookup(&j, "transpose_i16");
    memcpy(&tf, &pf, sizeof tf);
    memcpy(&ti, &pi, sizeof ti);
    memcpy(&th, &ph, sizeof th);
    float fs[256], fd[256];
    int32_t is[256], id[256];
    int16_t hs[256], hd[256];
    for (int i = 0; i < 256; i++) {
        fs[i] = 0.5f + (float)i, fd[i] = -1.0f;
        is[i] = 0x10001 * i + 7, id[i] = -1; /* both bf16 halves of a pair differ */
        hs[i] = (int16_t)(3 * i + 1), hd[i] = -1;
    }
    desc1 dfs = {fs, fs, 0, 256, 1}, dfd = {fd, fd, 0, 256, 1};
    desc1 dis = {is, is, 0, 256, 1}, did = {id, id, 0, 256, 1};
    desc1 dhs = {hs, hs, 0, 256, 1}, dhd = {hd, hd, 0, 256, 1};
    tf(&dfs, &dfd);
    ti(&dis, &did);
    th(&dhs, &dhd);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            if (fd[16 * r + c] != fs[16 * c + r])
                fail_msg("f32: element (%d, %d) is %g, expected %g", r, c, (double)fd[16 * r + c],
                         (double)fs[16 * c + r]);
            if (id[16 * r + c] != is[16 * c + r])
                fail_msg("i32: element (%d, %d) is %d, expected %d", r, c, id[16 * r + c],
                         is[16 * c + r]);
            if (hd[16 * r + c] != hs[16 * c + r])
                fail_msg("i16: element (%d, %d) is %d, expected %d", r, c, hd[16 * r + c],
                         hs[16 * c + r]);
        }
    destroy(&j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_range_zeros_exactly_its_range_of_a_run_time_length),
        cmocka_unit_test(test_zero_range_zeros_exactly_its_range_of_a_constant_length),
        cmocka_unit_test(test_transpose16_moves_every_element_to_its_transposed_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
