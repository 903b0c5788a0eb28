/* How codegen/compile.c splits a plan's kernels into modules for its threads: contiguous
 * runs of the kernels in plan order, each compiled once, of about equal compile cost (a
 * matmul's module holds fewer kernels than an elementwise one's), as many per thread; one
 * module on one thread. Read from the per-module LLVM IR dumps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/kernel.h"

static tu_runtime H;

static int setup(void **state) {
    (void)state;
    return tu_runtime_setup(&H);
}

static int teardown(void **state) {
    (void)state;
    tu_runtime_teardown(&H);
    return 0;
}

enum { N_MATMUL = 6, N_EXP = 40, MAX_MODULES = 64 };

/* N_MATMUL matmuls, then N_EXP exps, every one of its own shape: no two kernels share code. */
static void build(loom_ir_graph *g) {
    for (int i = 0; i < N_MATMUL; i++) {
        int32_t a = tu_input(g, LOOM_DTYPE_F32, 2, (int64_t[]){8, 16 + i});
        int32_t b = tu_input(g, LOOM_DTYPE_F32, 2, (int64_t[]){16 + i, 8});
        tu_output(g,
                  tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){a, b}, LOOM_DTYPE_F32, 0, NULL,
                         (loom_ir_attrs){0}),
                  -1);
    }
    for (int i = 0; i < N_EXP; i++) {
        int32_t x = tu_input(g, LOOM_DTYPE_F32, 2, (int64_t[]){i + 1, 33});
        tu_output(g, tu_add(g, LOOM_IR_OP_EXP, 1, &x, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0}),
                  -1);
    }
}

/* The kernels module j of the dump in dir defines, in order, into ks (*n of them); false
 * when there is no module j. */
static bool module_kernels(const char *dir, int j, int32_t *ks, int *n) {
    char path[256];
    snprintf(path, sizeof path, "%s/s.m%d.ll", dir, j);
    char *text = tu_read_file(path);
    if (!text)
        return false;
    *n = 0;
    for (const char *p = text; (p = strstr(p, "define void @loom_k")) != NULL; p++)
        ks[(*n)++] = (int32_t)strtol(p + strlen("define void @loom_k"), NULL, 10);
    free(text);
    unlink(path);
    return true;
}

static void remove_dumps(const char *dir) {
    static const char *const names[] = {"s.mlir", "s.lowered.mlir"};
    char path[256];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    for (int j = 0; j < MAX_MODULES; j++) {
        snprintf(path, sizeof path, "%s/s.m%d.s", dir, j);
        unlink(path);
    }
    rmdir(dir);
}

static void test_modules_are_contiguous_runs_of_equal_cost(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &H.alloc);
    build(&g);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_plan p;
    loom_ir_plan_init(&p, &H.alloc);
    loom_pass_options po = {.verify_each = true};
    assert_int_equal(loom_pass_build_plan(&g, &po, &p, &d), LOOM_OK);
    assert_int_equal(p.n_kernels, N_MATMUL + N_EXP);
    for (int32_t k = 0; k < p.n_kernels; k++) /* plan order: the matmuls first */
        assert_int_equal(p.kernels[k].kind,
                         k < N_MATMUL ? LOOM_IR_KERNEL_ROOTED : LOOM_IR_KERNEL_ELEMENTWISE);

    loom_rt_kernel *kern = calloc((size_t)p.n_kernels, sizeof *kern);
    for (int threads = 1; threads <= 2; threads++) {
        char dir[] = "/tmp/loom_cg_modulesXXXXXX";
        assert_non_null(mkdtemp(dir));
        loom_cg_options opts = {.compile_threads = threads, .dump_dir = dir, .dump_prefix = "s"};
        loom_cg_code *code = NULL;
        assert_int_equal(loom_cg_compile(&g, &p, &opts, &code, kern, &d), LOOM_OK);
        loom_cg_code_destroy(code);

        int32_t ks[N_MATMUL + N_EXP];
        int count[MAX_MODULES], n_modules = 0, next = 0;
        while (n_modules < MAX_MODULES && module_kernels(dir, n_modules, ks, &count[n_modules])) {
            /* each module: the next kernels in plan order, at least one */
            assert_true(count[n_modules] >= 1);
            for (int i = 0; i < count[n_modules]; i++)
                assert_int_equal(ks[i], next++);
            n_modules++;
        }
        assert_int_equal(next, p.n_kernels); /* every kernel, once */
        remove_dumps(dir);
        if (threads == 1) {
            assert_int_equal(n_modules, 1);
            continue;
        }
        /* Compile costs (compile.c): a matmul 20, an exp kernel 4; 280 in all, so 5 modules
         * of at least 50, rounded up to 3 a thread: 6 of ~47. The first holds two matmuls
         * (a third would take it to 60), the last a run of ~11 exps; split by count, each
         * would hold 7 or 8. */
        printf("# 2 threads: %d modules of", n_modules);
        for (int j = 0; j < n_modules; j++)
            printf(" %d", count[j]);
        printf(" kernels\n");
        assert_int_equal(n_modules, 6);
        assert_int_equal(count[0], 2);
        assert_true(count[n_modules - 1] >= 10);
    }
    free(kern);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modules_are_contiguous_runs_of_equal_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
