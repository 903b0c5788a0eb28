/* Building a step's executable: the context's device's target builds it (runtime/target.h:
 * the compiler the device brought), or LOOM_EAGER's "ref" target; where the target answers
 * UNSUPPORTED, its fallback target does, and the fallback is counted and reported. */
#include <inttypes.h>
#include <stdio.h>

#include "frontend.h"
#include "runtime/kernel.h"
#include "runtime/target.h"

loom_status loom_fe_build_executable(loom_context *ctx, uint64_t hash, const char *prefix,
                                     loom_rt_executable **out_exe, loom_ir_diag *d) {
    const loom_rt_target *t = ctx->eager ? loom_rt_target_find("ref") : ctx->device->target;
    if (!t)
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "the device %s has no compiler",
                                ctx->device->name);
    char perf_map[64];
    loom_rt_build_options o = {
        .compile_threads = loom_rt_pool_threads(ctx->pool),
        .verify_passes = ctx->verify_passes,
        .cache_dir = ctx->cache_dir,
        .dump_dir = ctx->dump_dir,
        .dump_prefix = prefix,
        .profile = ctx->profiling ? &ctx->profile : NULL,
        .allreduce_bucket_mb = ctx->allreduce_bucket_mb,
        .trace = ctx->chrome,
        .perf_map = ctx->perf_map ? loom_rt_perf_map_path(perf_map, sizeof perf_map) : NULL,
        .jitdump_dir = ctx->perf_jitdump ? LOOM_RT_JITDUMP_DIR : NULL};
    loom_status st =
        t->build(&ctx->cut, hash, &o, ctx->pool, &ctx->alloc, &ctx->metrics, out_exe, d);
    const loom_rt_target *fb =
        st == LOOM_STATUS_UNSUPPORTED ? loom_rt_target_find(t->fallback) : NULL;
    if (fb) {
        loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_FALLBACKS, 1);
        fprintf(stderr, "loom: note: step %" PRId64 ": %s; running this graph on %s\n", ctx->step,
                d->msg, fb->compiler);
        loom_ir_diag_init(d);
        st = fb->build(&ctx->cut, hash, &o, ctx->pool, &ctx->alloc, &ctx->metrics, out_exe, d);
    }
    return st;
}
