/* The npu target: its compiler is the codegen JIT. A cut graph goes through the passes and
 * the plan, then compiled code comes from the disk cache or codegen (stored back), then a
 * program on the device's thread pool. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/disk_cache.h"
#include "runtime/kernel.h"
#include "runtime/trace.h"
#include "targets.h"

/* Dumps written after each pass: <dir>/<prefix>.NN-<pass>.loom */
typedef struct dump_ctx {
    const loom_rt_build_options *opts;
    const loom_allocator *alloc;
    int index;
    int64_t t_last;     /* when the pass just reported began (LOOM_TRACE) */
    int32_t last_nodes; /* the graph's nodes before the pass just reported */
    char passes[512];   /* "autocast: changed (155 -> 170 nodes), dce: unchanged, ..." */
} dump_ctx;

static void dump_text(const loom_rt_build_options *o, const char *suffix, const loom_ir_sbuf *sb) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", o->dump_dir, o->dump_prefix, suffix);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (sb->oom)
        fprintf(stderr, "loom: LOOM_DUMP: out of memory writing %s\n", path);
    else if (loom_ir_write_file_atomic(path, sb->data ? sb->data : "", sb->len, &d) != LOOM_OK)
        fprintf(stderr, "loom: LOOM_DUMP: %s\n", d.msg);
}

static void after_pass(const char *name, bool changed, const loom_ir_graph *g, void *ud) {
    dump_ctx *dc = ud;
    size_t used = strlen(dc->passes);
    if (changed)
        snprintf(dc->passes + used, sizeof dc->passes - used, "%s%s: changed (%d -> %d nodes)",
                 used ? ", " : "", name, (int)dc->last_nodes, (int)g->n_nodes);
    else
        snprintf(dc->passes + used, sizeof dc->passes - used, "%s%s: unchanged", used ? ", " : "",
                 name);
    dc->last_nodes = g->n_nodes;
    if (dc->opts->trace) {
        int64_t t = loom_rt_now_ns();
        char args[64];
        snprintf(args, sizeof args, "\"changed\":%s,\"nodes\":%d", changed ? "true" : "false",
                 (int)g->n_nodes);
        loom_rt_trace_event(dc->opts->trace, "pass", name, dc->t_last, t, args);
        dc->t_last = t;
    }
    if (!dc->opts->dump_dir)
        return;
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, dc->alloc);
    loom_ir_sbuf_printf(&sb, "// after %s (%s)\n", name, changed ? "changed" : "unchanged");
    loom_ir_graph_print(g, loom_ir_sbuf_write, &sb);
    char suffix[96];
    snprintf(suffix, sizeof suffix, "%02d-%s.loom", ++dc->index, name);
    dump_text(dc->opts, suffix, &sb);
    loom_ir_sbuf_deinit(&sb);
}

/* Cache key: everything compiled code depends on besides the graph: this build of Loom (its
 * passes and codegen), the target, the codegen options and the pass options that change the
 * plan (all-reduce buckets). */
static void cache_key(char *buf, size_t n, uint64_t hash, const loom_rt_build_options *o) {
    snprintf(buf, n, "graph=%016" PRIx64 ";loom=%s;build=%s;%s;bucket=%g", hash,
             LOOM_VERSION_STRING, loom_rt_build_id(), loom_cg_target_key(), o->allreduce_bucket_mb);
}

/* A compile cache warning on stderr, once per process for each distinct message: a folder
 * that is not safely owned would otherwise be named at every compile. */
static void warn_once(const char *what, const char *msg) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t seen[32];
    static int n_seen;
    uint64_t h = loom_rt_hash64(msg, strlen(msg));
    pthread_mutex_lock(&mu);
    bool again = false;
    for (int i = 0; i < n_seen && !again; i++)
        again = seen[i] == h;
    if (!again && n_seen < 32)
        seen[n_seen++] = h;
    pthread_mutex_unlock(&mu);
    if (!again)
        fprintf(stderr, "loom: warning: %s%s\n", what, msg);
}

/* Compiled code for plan: from the disk cache when it holds a valid entry, else compiled
 * (and stored). A corrupt or stale entry is reported once on stderr and replaced. */
static loom_status get_code(const loom_ir_graph *g, const loom_ir_plan *plan, uint64_t hash,
                            const loom_rt_build_options *o, const loom_allocator *a,
                            loom_rt_metrics *m, loom_cg_code **code, loom_rt_kernel *kernels,
                            loom_ir_diag *d) {
    char key[1024];
    cache_key(key, sizeof key, hash, o);
    loom_ir_diag cd;
    loom_ir_diag_init(&cd);
    /* With dumps, the step compiles even when the disk holds its code: the MLIR, LLVM IR and
     * assembly are not in the cache, and dumps must be whole (the entry is refreshed). */
    if (o->cache_dir && !o->dump_dir) {
        void *blob = NULL;
        size_t len = 0;
        int64_t t0 = loom_rt_now_ns();
        loom_status st = loom_rt_disk_cache_get(o->cache_dir, key, a, &blob, &len, &cd);
        if (st == LOOM_OK && blob) {
            st = loom_cg_code_load(blob, len, plan, code, kernels, &cd);
            loom_ir_free(a, blob, len + 1);
            if (o->trace) {
                char args[64];
                snprintf(args, sizeof args, "\"bytes\":%zu,\"ok\":%s", len,
                         st == LOOM_OK ? "true" : "false");
                loom_rt_trace_event(o->trace, "cache", "disk cache load", t0, loom_rt_now_ns(),
                                    args);
            }
            if (st == LOOM_OK) {
                loom_rt_metrics_add(m, LOOM_RT_METRIC_DISK_CACHE_HIT, 1);
                return LOOM_OK;
            }
        }
        if (st == LOOM_STATUS_CORRUPT_DATA) {
            loom_rt_metrics_add(m, LOOM_RT_METRIC_DISK_CACHE_CORRUPT, 1);
            warn_once("ignoring a compile cache entry, recompiling: ", cd.msg);
        } else if (st == LOOM_STATUS_OUT_OF_MEMORY) {
            return loom_ir_diag_set(d, st, "%s", cd.msg);
        } else if (st != LOOM_OK) {
            warn_once("compile cache not used, compiling: ", cd.msg);
        }
        loom_rt_metrics_add(m, LOOM_RT_METRIC_DISK_CACHE_MISS, 1);
    }
    loom_cg_options co = {.compile_threads = o->compile_threads,
                          .dump_dir = o->dump_dir,
                          .dump_prefix = o->dump_prefix,
                          .trace = o->trace};
    loom_status st = loom_cg_compile(g, plan, &co, code, kernels, d);
    if (st != LOOM_OK || !o->cache_dir)
        return st;
    loom_ir_sbuf blob;
    loom_ir_sbuf_init(&blob, a);
    loom_ir_diag_init(&cd);
    loom_status sst = loom_cg_code_serialize(*code, &blob, &cd);
    if (sst == LOOM_OK && blob.oom)
        sst = loom_ir_diag_set(&cd, LOOM_STATUS_OUT_OF_MEMORY, "out of memory serializing code");
    if (sst == LOOM_OK)
        sst = loom_rt_disk_cache_put(o->cache_dir, key, blob.data, blob.len, a, &cd);
    if (sst != LOOM_OK)
        warn_once("compile cache not written (the step still runs): ", cd.msg);
    loom_ir_sbuf_deinit(&blob);
    return LOOM_OK;
}

/* LOOM_PERF_MAP: the perf map and the jitdump of a new program; failures are warnings. */
static void perf_views(loom_rt_executable *exe, const loom_ir_plan *plan, const loom_ir_graph *g,
                       const loom_rt_build_options *o) {
    loom_ir_diag pd;
    loom_ir_diag_init(&pd);
    if (o->perf_map && loom_rt_program_perf_map(exe, plan, g, o->perf_map, &pd) != LOOM_OK)
        fprintf(stderr, "loom: warning: LOOM_PERF_MAP: %s\n", pd.msg);
    loom_ir_diag_init(&pd);
    if (o->jitdump_dir && loom_rt_program_jitdump(exe, plan, g, o->jitdump_dir, &pd) != LOOM_OK)
        fprintf(stderr, "loom: warning: LOOM_PERF_MAP=jitdump: %s\n", pd.msg);
}

/* LOOM_DUMP's <prefix>.summary.txt: what a person wants first. The kernels by kind, FLOPs
 * and bytes moved, the planned peak, the compile time (passes and planning, then codegen),
 * which passes changed what, then the memory report. */
static void write_summary(const loom_rt_build_options *o, const loom_ir_plan *plan,
                          const loom_ir_graph *g, const loom_ir_memory_report *mem,
                          const dump_ctx *dc, int64_t plan_ns, int64_t code_ns) {
    int32_t kinds[LOOM_IR_KERNEL_COUNT_] = {0};
    double flops = 0, bytes = 0;
    for (int32_t k = 0; k < plan->n_kernels; k++) {
        double f, b;
        loom_ir_kernel_cost(&plan->kernels[k], g, &f, &b);
        flops += f;
        bytes += b;
        kinds[plan->kernels[k].kind]++;
    }
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, dc->alloc);
    loom_ir_sbuf_printf(&sb, "%s: %d kernel%s (", o->dump_prefix, (int)plan->n_kernels,
                        plan->n_kernels == 1 ? "" : "s");
    for (int kd = 0, n = 0; kd < LOOM_IR_KERNEL_COUNT_; kd++)
        if (kinds[kd])
            loom_ir_sbuf_printf(&sb, "%s%d %s", n++ ? ", " : "", (int)kinds[kd],
                                loom_ir_kernel_kind_name((loom_ir_kernel_kind)kd));
    loom_ir_sbuf_printf(&sb, "), %.4g GFLOP, %.4g MB moved, planned peak %.4g MB\n", flops / 1e9,
                        bytes / 1e6, (double)plan->peak_bytes / 1e6);
    loom_ir_sbuf_printf(&sb, "compile: %.1f ms (passes and plan %.1f ms, codegen %.1f ms)\n",
                        (double)(plan_ns + code_ns) / 1e6, (double)plan_ns / 1e6,
                        (double)code_ns / 1e6);
    loom_ir_sbuf_printf(&sb, "passes: %s\n", dc->passes[0] ? dc->passes : "none");
    loom_ir_memory_report_print(mem, plan, g, 10, loom_ir_sbuf_write, &sb);
    dump_text(o, "summary.txt", &sb);
    loom_ir_sbuf_deinit(&sb);
}

/* The plan's memory report (its 5 largest live values) on exe, for an out-of-memory error
 * and loom_memory_report. Errors: OUT_OF_MEMORY. */
static loom_status attach_memory_report(loom_rt_executable *exe, const loom_ir_plan *plan,
                                        const loom_ir_graph *g, const loom_ir_memory_report *mem) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &exe->alloc);
    loom_ir_memory_report_print(mem, plan, g, 5, loom_ir_sbuf_write, &sb);
    if (!sb.oom && sb.len > 0 && (exe->memory_report = loom_ir_alloc(&exe->alloc, sb.len + 1)))
        memcpy(exe->memory_report, sb.data, sb.len + 1);
    bool ok = !sb.oom && (exe->memory_report || sb.len == 0);
    loom_ir_sbuf_deinit(&sb);
    return ok ? LOOM_OK : LOOM_STATUS_OUT_OF_MEMORY;
}

/* A step of building *exe that failed with st: destroys it, says what ran out of memory. */
static loom_status drop_exe(loom_rt_executable **exe, loom_status st, loom_ir_diag *d,
                            const char *what) {
    loom_rt_executable_destroy(*exe);
    *exe = NULL;
    return loom_ir_diag_set(d, st, "out of memory %s", what);
}

static loom_status npu_build(const loom_ir_graph *cut, uint64_t hash,
                             const loom_rt_build_options *o, loom_rt_pool *pool,
                             const loom_allocator *a, loom_rt_metrics *m,
                             loom_rt_executable **out_exe, loom_ir_diag *d) {
    *out_exe = NULL;
    loom_ir_graph g;
    loom_ir_graph_init(&g, a);
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, a);
    loom_cg_code *code = NULL;
    loom_rt_kernel *kernels = NULL;
    size_t kernels_bytes = 0;
    int64_t t_start = loom_rt_now_ns(), t_planned = 0;
    dump_ctx dc = {.opts = o, .alloc = a, .t_last = t_start, .last_nodes = cut->n_nodes};
    loom_pass_options popts = {.verify_each = o->verify_passes,
                               .after_pass = o->dump_dir || o->trace ? after_pass : NULL,
                               .ud = &dc,
                               .allreduce_bucket_mb = o->allreduce_bucket_mb};
    loom_status st = loom_ir_graph_copy(&g, cut);
    if (st != LOOM_OK)
        st = loom_ir_diag_set(d, st, "out of memory copying the graph");
    if (st == LOOM_OK)
        st = loom_pass_build_plan(&g, &popts, &plan, d);
    t_planned = loom_rt_now_ns();
    if (o->trace) /* fusion, buckets, memory planning and the plan's verification */
        loom_rt_trace_event(o->trace, "pass", "plan", dc.t_last, t_planned, NULL);
    if (st == LOOM_OK && o->dump_dir) {
        loom_ir_sbuf sb;
        loom_ir_sbuf_init(&sb, a);
        loom_ir_plan_print(&plan, &g, loom_ir_sbuf_write, &sb);
        dump_text(o, "plan.txt", &sb);
        loom_ir_sbuf_deinit(&sb);
    }
    loom_ir_memory_report mem; /* for the summary and the executable: made once */
    if (st == LOOM_OK && (st = loom_ir_plan_memory(&plan, &g, &mem)) != LOOM_OK)
        loom_ir_diag_set(d, st, "out of memory making the plan's memory report");
    bool have_mem = st == LOOM_OK;
    if (st == LOOM_OK) {
        loom_rt_metrics_add(m, LOOM_RT_METRIC_KERNELS, plan.n_kernels);
        loom_rt_metrics_add(m, LOOM_RT_METRIC_PLANNED_PEAK, (int64_t)plan.peak_bytes);
        kernels_bytes = (size_t)(plan.n_kernels ? plan.n_kernels : 1) * sizeof *kernels;
        kernels = loom_ir_alloc(a, kernels_bytes);
        if (!kernels)
            st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    if (st == LOOM_OK)
        st = get_code(&g, &plan, hash, o, a, m, &code, kernels, d);
    if (st == LOOM_OK && o->dump_dir) /* dumping compiles: get_code skipped the disk cache */
        write_summary(o, &plan, &g, &mem, &dc, t_planned - t_start, loom_rt_now_ns() - t_planned);
    if (st == LOOM_OK && (o->perf_map || o->jitdump_dir))
        loom_cg_code_sizes(code, plan.n_kernels, kernels);
    if (st == LOOM_OK) {
        /* The program takes the code; from here it releases it, also on failure. */
        st = loom_rt_program_create(&g, hash, &plan, kernels, code, loom_cg_code_release, pool, a,
                                    out_exe);
        code = NULL;
        if (st != LOOM_OK)
            loom_ir_diag_set(d, st, "out of memory creating the program");
    }
    if (st == LOOM_OK && o->profile &&
        (st = loom_rt_program_profile(*out_exe, o->profile, &plan, &g)) != LOOM_OK)
        drop_exe(out_exe, st, d, "profiling the program");
    if (st == LOOM_OK && (st = attach_memory_report(*out_exe, &plan, &g, &mem)) != LOOM_OK)
        drop_exe(out_exe, st, d, "making the plan's memory report");
    if (st == LOOM_OK && o->trace &&
        (st = loom_rt_program_trace(*out_exe, o->trace, &plan, &g)) != LOOM_OK)
        drop_exe(out_exe, st, d, "tracing the program");
    if (st == LOOM_OK) /* a map that cannot be written costs the step nothing */
        perf_views(*out_exe, &plan, &g, o);
    if (have_mem)
        loom_ir_memory_report_deinit(&mem);
    if (st == LOOM_OK)
        st = loom_tg_keep_traced_graph(out_exe, cut, d);
    loom_cg_code_destroy(code);
    loom_ir_free(a, kernels, kernels_bytes);
    loom_ir_plan_deinit(&plan);
    loom_ir_graph_deinit(&g);
    return st;
}

loom_status loom_tg_npu_supports(const loom_ir_graph *g, loom_ir_diag *d) {
    loom_ir_graph copy;
    loom_ir_graph_init(&copy, &g->alloc);
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, &g->alloc);
    loom_pass_options popts = {.verify_each = true};
    loom_status st = loom_ir_graph_copy(&copy, g);
    if (st != LOOM_OK)
        st = loom_ir_diag_set(d, st, "out of memory copying the graph");
    if (st == LOOM_OK)
        st = loom_pass_build_plan(&copy, &popts, &plan, d);
    if (st == LOOM_OK)
        st = loom_cg_check(&copy, &plan, d);
    loom_ir_plan_deinit(&plan);
    loom_ir_graph_deinit(&copy);
    return st;
}

static const loom_rt_target npu = {.name = "npu",
                                   .compiler = "the JIT",
                                   .build = npu_build,
                                   .supports = loom_tg_npu_supports,
                                   .fallback = "ref"};

loom_status loom_tg_register_npu(void) {
    return loom_rt_target_register(&npu);
}
