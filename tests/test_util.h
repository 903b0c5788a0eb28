/* Shared test helpers: a failing allocator for fault injection and leak accounting, and
 * graph-building shorthands that fail the test with the diagnostic on error. */
#ifndef LOOM_TESTS_TEST_UTIL_H
#define LOOM_TESTS_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "ir/plan.h"
#include "loom/loom.h"
#include "runtime/kernel.h"

/* Counts live bytes and blocks; fails the allocation numbered fail_at (1-based, counting
 * only allocations and growing reallocs) when fail_at > 0. */
typedef struct test_alloc {
    int64_t live_bytes, live_blocks, peak_bytes;
    int64_t n_allocs; /* allocations and growing reallocs seen so far */
    int64_t fail_at;  /* 0: never fail */
    int64_t n_failed;
} test_alloc;

/* A dead process's pid, for files named after a writer that is gone: a child that exited
 * and was reaped. */
long tu_dead_pid(void);

/* A loom_allocator over ta (which must outlive every use). */
loom_allocator test_alloc_make(test_alloc *ta);

/* ---- contexts ------------------------------------------------------------------------ */

/* The runtime below the frontend, for tests that build and run graphs themselves: the
 * system allocator, a 2-thread pool, device npu:0 and its metrics. */
typedef struct tu_runtime {
    loom_allocator alloc;
    loom_rt_pool *pool;
    loom_rt_device *dev;
    loom_rt_metrics metrics;
} tu_runtime;
/* 0 when r is ready, -1 otherwise (as a cmocka group setup returns). */
int tu_runtime_setup(tu_runtime *r);
void tu_runtime_teardown(tu_runtime *r);

/* A context on the reference interpreter (eager) or the JIT, with dumps off whatever
 * LOOM_DUMP says; fails the test if it cannot be created. */
loom_context *tu_context(bool eager);

/* The same with every allocation through ta (NULL: the system allocator). The context is
 * created before the caller arms ta->fail_at. */
loom_context *tu_context_alloc(bool eager, test_alloc *ta);

/* A long-lived f32 tensor [n] (n > 0) or scalar (n == 0: v[0]) holding a copy of v; fails
 * the test when it cannot be made. */
loom_tensor *tu_f32(loom_context *ctx, int64_t n, const float *v);
/* A long-lived f32 scalar holding v. */
loom_tensor *tu_scalar_f32(loom_context *ctx, float v);

/* The whole file at path, NUL-terminated (malloc'd: free it), or NULL when it cannot be read. */
char *tu_read_file(const char *path);

/* Whether this process has a read-and-execute mapping (r-x) that holds [lo, hi) (path NULL) or that
 * maps the file path (lo and hi ignored), from /proc/self/maps. */
bool tu_mapped_executable(uintptr_t lo, uintptr_t hi, const char *path);

/* Reads n floats of t into out, failing the test with the context's message on error. */
void tu_read_f32(loom_context *ctx, loom_tensor *t, float *out, size_t n);

/* ---- graph building: each fails the test with the diag message when the graph refuses --- */

/* Adds desc to g; returns its id. */
int32_t tu_add_desc(loom_ir_graph *g, loom_ir_node_desc desc);

/* Adds an op node with the given operands, type (dtype/rank/shape; zero to infer) and attrs. */
int32_t tu_add(loom_ir_graph *g, loom_ir_op op, int32_t n_in, const int32_t *in, loom_dtype dt,
               int32_t rank, const int64_t *shape, loom_ir_attrs attrs);

/* Adds the graph input with the next free index (g->n_graph_inputs). */
int32_t tu_input(loom_ir_graph *g, loom_dtype dt, int32_t rank, const int64_t *shape);

/* Marks node as an output of g (alias: the input it updates in place, or -1). */
void tu_output(loom_ir_graph *g, int32_t node, int32_t alias);

/* Fails the test unless g verifies. */
void tu_verify(const loom_ir_graph *g);

/* Bytes of n's value: numel * element size. */
size_t tu_node_bytes(const loom_ir_node *n);

/* "%3->0,%4": g's outputs with their aliases, in a static buffer. */
const char *tu_output_list(const loom_ir_graph *g);

/* ---- plans (fusion and memory planning) ---- */

/* Parses IR text into g (initialized here), failing the test on an error. */
void tu_parse(loom_ir_graph *g, const char *text);

/* Fails the test if two arena values alive in the same kernel share bytes (independent of
 * the plan verifier). */
void tu_expect_no_overlap(const loom_ir_graph *g, const loom_ir_plan *p);

/* Fuses and plans g into p (initialized here), verifying the plan, or fails the test. */
void tu_fuse_ok(const loom_ir_graph *g, loom_ir_plan *p);

/* "M{5 6 7 8}<-{0 1 2}->{8} | R{...}...": per kernel its kind (E, R, M), nodes, args and
 * results, in a static buffer. */
const char *tu_plan_str(const loom_ir_plan *p);

/* "%3:out0 %5:arena+0 %7:in1": every placement, in a static buffer. */
const char *tu_placement_str(const loom_ir_plan *p, const loom_ir_graph *g);

/* "%5->out0 %1->out3": the copies after the kernels, in a static buffer. */
const char *tu_copies_str(const loom_ir_plan *p);

void tu_deinit_both(loom_ir_graph *g, loom_ir_plan *p);

#endif
