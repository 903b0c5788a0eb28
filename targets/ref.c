/* The ref target: the reference interpreter (runtime/interp.c) as a device's compiler, the
 * test oracle and LOOM_EAGER=1's op-by-op mode, and the npu target's fallback. */
#include "passes/passes.h"
#include "targets.h"

/* The autocast pass first (the interpreter runs what the JIT runs), the graph as traced kept
 * for the cache. */
static loom_status ref_build(const loom_ir_graph *cut, uint64_t hash,
                             const loom_rt_build_options *o, struct loom_rt_pool *pool,
                             const loom_allocator *a, loom_rt_metrics *m,
                             loom_rt_executable **out_exe, loom_ir_diag *d) {
    (void)o;
    (void)pool;
    (void)m;
    *out_exe = NULL;
    loom_ir_graph g;
    loom_ir_graph_init(&g, a);
    static const loom_pass *const autocast[] = {&loom_pass_autocast};
    loom_status st = loom_ir_graph_copy(&g, cut);
    if (st != LOOM_OK)
        st = loom_ir_diag_set(d, st, "out of memory copying the graph");
    if (st == LOOM_OK)
        st = loom_pass_run_pipeline(&g, autocast, 1, NULL, d);
    if (st == LOOM_OK && (st = loom_rt_interp_executable_create(&g, hash, a, out_exe)) != LOOM_OK)
        loom_ir_diag_set(d, st, "creating the interpreter's executable");
    if (st == LOOM_OK)
        st = loom_tg_keep_traced_graph(out_exe, cut, d);
    loom_ir_graph_deinit(&g);
    return st;
}

static loom_status ref_supports(const loom_ir_graph *g, loom_ir_diag *d) {
    (void)g;
    (void)d;
    return LOOM_OK; /* every op of ops.def */
}

static const loom_rt_target ref = {.name = "ref",
                                   .compiler = "the reference interpreter",
                                   .build = ref_build,
                                   .supports = ref_supports,
                                   .fallback = NULL};

loom_status loom_tg_register_ref(void) {
    return loom_rt_target_register(&ref);
}
