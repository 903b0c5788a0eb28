/* Helpers the codegen tests that build MLIR modules themselves share (test_matmul_schedule.c,
 * test_matmul_packing.c): a context with every dialect, printing callbacks, inputs. */
#ifndef LOOM_TESTS_MLIR_TEST_UTIL_H
#define LOOM_TESTS_MLIR_TEST_UTIL_H

#include <mlir-c/IR.h>
#include <mlir-c/RegisterEverything.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ir/ir.h"

static inline MlirStringRef sr(const char *s) {
    return mlirStringRefCreateFromCString(s);
}

/* A context with every dialect loaded and the LLVM translations registered. */
static inline MlirContext make_context(void) {
    MlirContext ctx = mlirContextCreate();
    MlirDialectRegistry reg = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(reg);
    mlirContextAppendDialectRegistry(ctx, reg);
    mlirDialectRegistryDestroy(reg);
    mlirContextLoadAllAvailableDialects(ctx);
    mlirRegisterAllLLVMTranslations(ctx);
    return ctx;
}

/* Deterministic values in [-1, 1). */
static inline float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 23) - 1.0);
}

/* n values from rnd after pad unused floats (so that a view of them has a dynamic offset),
 * malloc'd; NULL when out of memory. */
static inline float *rnd_buffer(size_t n, int64_t pad, uint64_t *seed) {
    float *p = malloc(sizeof(float) * (n + (size_t)pad));
    for (size_t i = 0; p && i < n; i++)
        p[(size_t)pad + i] = rnd(seed);
    return p;
}

static inline void print_to_sbuf(MlirStringRef s, void *ud) {
    loom_ir_sbuf_append(ud, s.data, s.length);
}

static inline void print_to_stderr(MlirStringRef s, void *ud) {
    (void)ud;
    fprintf(stderr, "%.*s", (int)s.length, s.data);
}

#endif
