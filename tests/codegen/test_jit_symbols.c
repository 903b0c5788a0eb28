/* Compiled kernels link against an allow-list of symbols (codegen/jit.c), never the whole
 * process: object code that names system() (as a planted cache entry would) fails to link,
 * with the symbol named; code that calls libm or malloc links and runs. */
#include <stdio.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/cg_internal.h"
#include "test_util.h"

/* An object file defining void loom_k0(void *const *bufs, int64_t lo, int64_t hi) that calls
 * `callee` (declared double callee(double)) on 1.0 and stores the result through bufs[0]. */
static void object_calling(const char *callee, LLVMMemoryBufferRef *out) {
    loom_cg_init_once();
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext("planted", c);
    LLVMSetTarget(m, loom_cg_host_triple());
    LLVMTypeRef ptr = LLVMPointerTypeInContext(c, 0), i64 = LLVMInt64TypeInContext(c);
    LLVMTypeRef f64 = LLVMDoubleTypeInContext(c);
    LLVMTypeRef kparams[3] = {ptr, i64, i64};
    LLVMValueRef k = LLVMAddFunction(
        m, "loom_k0", LLVMFunctionType(LLVMVoidTypeInContext(c), kparams, 3, 0));
    LLVMTypeRef cty = LLVMFunctionType(f64, &f64, 1, 0);
    LLVMValueRef fn = LLVMAddFunction(m, callee, cty);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(c, k, "entry"));
    LLVMValueRef one = LLVMConstReal(f64, 1.0);
    LLVMValueRef r = LLVMBuildCall2(b, cty, fn, &one, 1, "");
    LLVMValueRef out_ptr = LLVMBuildLoad2(b, ptr, LLVMGetParam(k, 0), "");
    LLVMBuildStore(b, r, out_ptr);
    LLVMBuildRetVoid(b);
    LLVMDisposeBuilder(b);
    LLVMTargetRef target;
    char *err = NULL;
    assert_int_equal(LLVMGetTargetFromTriple(loom_cg_host_triple(), &target, &err), 0);
    LLVMTargetMachineRef tm =
        LLVMCreateTargetMachine(target, loom_cg_host_triple(), loom_cg_host_cpu(),
                                loom_cg_host_features(), LLVMCodeGenLevelDefault, LLVMRelocPIC,
                                LLVMCodeModelSmall);
    assert_non_null(tm);
    assert_int_equal(LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &err, out), 0);
    LLVMDisposeTargetMachine(tm);
    LLVMDisposeModule(m);
    LLVMContextDispose(c);
}

/* Builds code from the object; returns its status, the message in d. */
static loom_status build(LLVMMemoryBufferRef obj, loom_cg_code **code, loom_rt_kernel *k,
                         loom_ir_diag *d) {
    const uint8_t *objs[1] = {(const uint8_t *)LLVMGetBufferStart(obj)};
    size_t lens[1] = {LLVMGetBufferSize(obj)};
    cg_kernel_rec rec = {.name = "loom_k0", .extent = 1, .grain = 1};
    loom_allocator a = loom_allocator_system();
    loom_ir_diag_init(d);
    return loom_cg_code_build(&a, 1, objs, lens, 1, &rec, code, k, LOOM_STATUS_CORRUPT_DATA, d);
}

static void test_code_that_calls_system_does_not_link(void **state) {
    (void)state;
    LLVMMemoryBufferRef obj;
    object_calling("system", &obj);
    loom_cg_code *code = NULL;
    loom_rt_kernel k = {0};
    loom_ir_diag d;
    assert_int_equal(build(obj, &code, &k, &d), LOOM_STATUS_CORRUPT_DATA);
    assert_null(code);
    if (!strstr(d.msg, "system"))
        fail_msg("the error does not name the symbol: %s", d.msg);
    LLVMDisposeMemoryBuffer(obj);
    /* nor anything else of the process, Loom's own functions included */
    object_calling("loom_context_create", &obj);
    assert_int_equal(build(obj, &code, &k, &d), LOOM_STATUS_CORRUPT_DATA);
    assert_non_null(strstr(d.msg, "loom_context_create"));
    LLVMDisposeMemoryBuffer(obj);
}

static void test_code_that_calls_libm_links_and_runs(void **state) {
    (void)state;
    LLVMMemoryBufferRef obj;
    object_calling("tanh", &obj);
    loom_cg_code *code = NULL;
    loom_rt_kernel k = {0};
    loom_ir_diag d;
    if (build(obj, &code, &k, &d) != LOOM_OK)
        fail_msg("%s", d.msg);
    double out = 0;
    void *bufs[1] = {&out};
    k.fn(bufs, 0, 1);
    assert_true(out > 0.7615 && out < 0.7616); /* tanh(1) */
    loom_cg_code_destroy(code);
    LLVMDisposeMemoryBuffer(obj);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_code_that_calls_system_does_not_link),
        cmocka_unit_test(test_code_that_calls_libm_links_and_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
