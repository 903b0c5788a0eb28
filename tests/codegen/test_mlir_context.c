/* Codegen smoke tests: the MLIR C API and LLVM are linked and build a verified function. */
#include <string.h>

#include "test_util.h"

#include "codegen/codegen.h"

static void test_mlir_smoke_builds_a_verified_addf_function(void **state) {
    (void)state;
    loom_allocator a = loom_allocator_system();
    loom_ir_sbuf text;
    loom_ir_sbuf_init(&text, &a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_cg_mlir_smoke(&text, &d), LOOM_OK);
    assert_non_null(text.data);
    assert_non_null(strstr(text.data, "func.func @loom_smoke(%arg0: f32, %arg1: f32) -> f32"));
    assert_non_null(strstr(text.data, "arith.addf %arg0, %arg1 : f32"));
    assert_non_null(strstr(text.data, "return"));
    loom_ir_sbuf_deinit(&text);
}

static void test_llvm_version_is_19(void **state) {
    (void)state;
    assert_int_equal(strncmp(loom_cg_llvm_version(), "19.", 3), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlir_smoke_builds_a_verified_addf_function),
        cmocka_unit_test(test_llvm_version_is_19),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
