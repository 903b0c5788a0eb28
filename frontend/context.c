/* Contexts: creation and teardown, the handle registry, sticky errors, metrics access. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "runtime/comm.h"
#include "runtime/kernel.h"
#include "runtime/disk_cache.h"
#include "runtime/stream.h"
#include "runtime/trace.h"
#include "targets/targets.h"

/* Registry of live contexts so a handle (which carries only an id) finds its context, even
 * in loom_tensor_retain/release which take no context. Ids are handed out round-robin, so
 * an id is reused only after LOOM_FE_MAX_CONTEXTS creations. */
static _Atomic(loom_context *) registry[LOOM_FE_MAX_CONTEXTS];
static atomic_int next_id;

static int32_t registry_claim(loom_context *ctx) {
    for (int tries = 0; tries < LOOM_FE_MAX_CONTEXTS; tries++) {
        int id = atomic_fetch_add(&next_id, 1) & (LOOM_FE_MAX_CONTEXTS - 1);
        loom_context *expected = NULL;
        if (atomic_compare_exchange_strong(&registry[id], &expected, ctx))
            return id;
    }
    return -1;
}

void loom_fe_finish_all_inflight(void) {
    for (int32_t i = 0; i < LOOM_FE_MAX_CONTEXTS; i++) {
        loom_context *ctx = atomic_load(&registry[i]);
        if (ctx && ctx->stream)
            loom_fe_finish_inflight(ctx); /* a failure is recorded in that context */
    }
}

loom_context *loom_fe_handle_context(const loom_tensor *h) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    return atomic_load(&registry[v >> (64 - LOOM_FE_CTX_BITS)]);
}

/* LOOM_ALLREDUCE_BUCKET_MB as loom_context_options.allreduce_bucket_mb: a number of MB >= 0
 * or "inf"; 0 (one bucket per all-reduce) becomes -1. Unset or invalid (with a warning): 0,
 * the default. */
static double env_bucket_mb(void) {
    const char *env = getenv("LOOM_ALLREDUCE_BUCKET_MB");
    if (!env || !*env)
        return 0;
    char *end = NULL;
    double mb = strtod(env, &end);
    if (*end || isnan(mb) || mb < 0) {
        fprintf(stderr,
                "loom: warning: LOOM_ALLREDUCE_BUCKET_MB=%s is not a size in MB (a number "
                ">= 0, or inf); using 25\n",
                env);
        return 0;
    }
    return mb == 0 ? -1 : mb;
}

LOOM_API void loom_context_options_init(loom_context_options *opts) {
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->allocator = loom_allocator_system();
    opts->device = NULL; /* npu:<local rank>, chosen when the context is created */
    const char *eager = getenv("LOOM_EAGER");
    opts->eager = eager && *eager && strcmp(eager, "0") != 0;
    const char *dump = getenv("LOOM_DUMP");
    opts->dump_dir = dump && *dump ? dump : NULL;
    const char *sync = getenv("LOOM_SYNC");
    opts->sync = sync && *sync && strcmp(sync, "0") != 0;
    const char *profile = getenv("LOOM_PROFILE");
    opts->profile = profile && *profile && strcmp(profile, "0") != 0;
    opts->allreduce_bucket_mb = env_bucket_mb();
    const char *debug = getenv("LOOM_DEBUG");
    opts->debug = debug && *debug && strcmp(debug, "0") != 0;
    const char *trace = getenv("LOOM_TRACE");
    opts->trace_path = trace && *trace ? trace : NULL;
    const char *perf_map = getenv("LOOM_PERF_MAP");
    opts->perf_map = perf_map && *perf_map && strcmp(perf_map, "0") != 0;
    opts->perf_jitdump = perf_map && strcmp(perf_map, "jitdump") == 0;
    const char *poison = getenv("LOOM_POISON");
    opts->poison = poison && *poison && strcmp(poison, "0") != 0;
}

/* A positive number from the environment variable `name` into *out (left as is when unset):
 * false, with the reason on stderr, when it is set to anything else. */
static bool env_positive(const char *name, bool integer, double max, double *out) {
    const char *v = getenv(name);
    if (!v || !*v)
        return true;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x > 0) || x > max || (integer && x != floor(x))) {
        fprintf(stderr, "loom: error: %s='%s' is not %s from 1 to %.0f\n", name, v,
                integer ? "a whole number" : "a number", max);
        return false;
    }
    *out = x;
    return true;
}

static loom_status dup_string(const loom_allocator *a, const char *s, char **out) {
    size_t n = strlen(s);
    *out = loom_ir_alloc(a, n + 1);
    if (!*out)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memcpy(*out, s, n + 1);
    return LOOM_OK;
}

LOOM_API loom_status loom_context_create(const loom_context_options *opts,
                                         loom_context **out_ctx) {
    if (!out_ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    *out_ctx = NULL;
    loom_context_options defaults;
    if (!opts) {
        loom_context_options_init(&defaults);
        opts = &defaults;
    }
    if (!opts->allocator.fn)
        return LOOM_STATUS_INVALID_ARGUMENT;
    /* settings that are wrong are errors, not silently something else */
    double threads_env = 0, max_nodes = 2e6, mem_mb = 0;
    if (opts->num_threads < 0 || opts->max_graph_nodes < 0 || opts->device_memory_mb < 0 ||
        isnan(opts->device_memory_mb)) {
        fprintf(stderr, "loom: error: loom_context_create: %s is negative (0 takes the default)\n",
                opts->num_threads < 0       ? "num_threads"
                : opts->max_graph_nodes < 0 ? "max_graph_nodes"
                                            : "device_memory_mb");
        return LOOM_STATUS_INVALID_ARGUMENT;
    }
    if (!env_positive("LOOM_NUM_THREADS", true, 4096, &threads_env) ||
        !env_positive("LOOM_MAX_GRAPH_NODES", true, 1e12, &max_nodes) ||
        !env_positive("LOOM_DEVICE_MEMORY_MB", false, 1e12, &mem_mb))
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_context *ctx = loom_ir_alloc(&opts->allocator, sizeof *ctx);
    if (!ctx)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = opts->allocator;
    ctx->free_head = -1;
    ctx->eager = opts->eager;
    ctx->sync = opts->sync;
    ctx->profiling = opts->profile;
    ctx->debug = opts->debug;
    ctx->perf_map = opts->perf_map || opts->perf_jitdump;
    ctx->perf_jitdump = opts->perf_jitdump;
    ctx->max_graph_nodes = opts->max_graph_nodes > 0 ? opts->max_graph_nodes : (int64_t)max_nodes;
    double mb = opts->allreduce_bucket_mb == 0 ? env_bucket_mb() : opts->allreduce_bucket_mb;
    ctx->allreduce_bucket_mb = isnan(mb) || mb == 0 ? 25 : mb;
    loom_rt_profile_init(&ctx->profile, &ctx->alloc);
    loom_rt_metrics_init(&ctx->metrics);
    loom_ir_graph_init(&ctx->trace, &ctx->alloc);
    loom_ir_graph_init(&ctx->cut, &ctx->alloc);
    loom_rt_cache_init(&ctx->cache, &ctx->alloc, 64, &ctx->metrics);
    ctx->id = -1;

    /* One device per process: under loom_dist_init, this process's share of the machine. */
    loom_rt_comm *world = loom_rt_comm_world();
    int32_t local_rank = world ? world->local_rank : 0;
    int32_t local_size = world ? world->local_size : 1;
    char device_name[32];
    snprintf(device_name, sizeof device_name, "npu:%d", (int)local_rank);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_tg_register_builtin(); /* before the device: it finds its target by name */
    loom_status st = loom_rt_device_create(opts->device ? opts->device : device_name, &ctx->alloc,
                                           &ctx->metrics, &ctx->device, &d);
    if (st == LOOM_OK) {
        ctx->device->poison = opts->poison;
        double cap_mb = opts->device_memory_mb > 0 ? opts->device_memory_mb : mem_mb;
        ctx->device->mem_limit = cap_mb > 0 ? (size_t)(cap_mb * 1048576.0) : 0;
    }
    if (st == LOOM_OK && opts->dump_dir)
        st = dup_string(&ctx->alloc, opts->dump_dir, &ctx->dump_dir);
    if (st == LOOM_OK && opts->trace_path) {
        st = loom_rt_trace_open(opts->trace_path, world ? world->rank : 0, &ctx->alloc,
                                &ctx->chrome, &d);
        ctx->inflight.trace = ctx->chrome;
        if (st == LOOM_OK)
            ctx->device->trace = ctx->chrome;
    }
    char cache_buf[4096];
    const char *cache_dir = opts->cache_dir
                                ? opts->cache_dir
                                : loom_rt_disk_cache_default_dir(cache_buf, sizeof cache_buf);
    if (st == LOOM_OK && cache_dir && *cache_dir)
        st = dup_string(&ctx->alloc, cache_dir, &ctx->cache_dir);
    const char *verify = getenv("LOOM_VERIFY");
#ifdef NDEBUG
    ctx->verify_passes = verify && *verify && strcmp(verify, "0") != 0;
#else
    ctx->verify_passes = !verify || strcmp(verify, "0") != 0; /* debug builds verify */
#endif
    if (st == LOOM_OK) {
        int32_t threads =
            opts->num_threads > 0 ? opts->num_threads : loom_rt_default_threads_shared(local_size);
        st = loom_rt_pool_create(threads, &ctx->alloc, &ctx->pool);
    }
    if (st == LOOM_OK)
        st = loom_rt_stream_create(&ctx->alloc, &ctx->stream);
    if (st == LOOM_OK && (ctx->id = registry_claim(ctx)) < 0)
        st = LOOM_STATUS_OUT_OF_MEMORY; /* 4096 live contexts */
    if (st != LOOM_OK) {
        loom_context_destroy(ctx);
        return st;
    }
    *out_ctx = ctx;
    return LOOM_OK;
}

/* How many kernels LOOM_PROFILE prints at exit. */
#define PROFILE_TOP 25

static void write_stderr(const char *chunk, size_t len, void *ud) {
    (void)ud;
    fwrite(chunk, 1, len, stderr);
}

static void print_profile(loom_context *ctx) {
    const char *env = getenv("LOOM_PROFILE"); /* "all": every kernel */
    int32_t top = env && strcmp(env, "all") == 0 ? 0 : PROFILE_TOP;
    if (loom_rt_profile_report(&ctx->profile, ctx->metrics.total[LOOM_RT_METRIC_EXECUTE_TIME], top,
                               LOOM_REPORT_FORMAT_TEXT, write_stderr, NULL) != LOOM_OK)
        fprintf(stderr, "loom: LOOM_PROFILE: out of memory printing the profile\n");
}

LOOM_API void loom_context_destroy(loom_context *ctx) {
    if (!ctx)
        return;
    loom_fe_use use; /* not left: the context is gone when this returns */
    if (!loom_fe_use_begin(&use, ctx, "context_destroy"))
        return; /* another thread is inside it: leaking it beats freeing it under that thread */
    if (ctx->id >= 0)
        atomic_store(&registry[ctx->id], NULL);
    if (ctx->stream)
        loom_fe_finish_inflight(ctx);
    if (ctx->profiling)
        print_profile(ctx);
    if (ctx->debug)
        loom_fe_debug_summary(ctx);
    loom_rt_stream_destroy(ctx->stream);
    loom_rt_pool_destroy(ctx->pool);
    if (ctx->chrome) {
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_rt_trace_close(ctx->chrome, &d) != LOOM_OK)
            fprintf(stderr, "loom: LOOM_TRACE: %s\n", d.msg);
        if (ctx->device)
            ctx->device->trace = NULL;
    }
    for (int32_t i = 0; i < ctx->n_tensors; i++)
        if (ctx->tensors[i].alive)
            loom_rt_buffer_release(ctx->tensors[i].buf);
    for (int32_t k = 0; k < ctx->n_trace_inputs; k++)
        loom_rt_buffer_release(ctx->trace_inputs[k]);
    const loom_allocator *a = &ctx->alloc;
    loom_ir_free(a, ctx->tensors, (size_t)ctx->cap_tensors * sizeof *ctx->tensors);
    loom_ir_free(a, ctx->trace_inputs, (size_t)ctx->cap_trace_inputs * sizeof *ctx->trace_inputs);
    loom_ir_free(a, ctx->trace_input_nodes,
                 (size_t)ctx->cap_trace_input_nodes * sizeof *ctx->trace_input_nodes);
    loom_ir_free(a, ctx->step_tensors, (size_t)ctx->cap_step_tensors * sizeof *ctx->step_tensors);
    loom_ir_free(a, ctx->assigned, (size_t)ctx->cap_assigned * sizeof *ctx->assigned);
    loom_ir_free(a, ctx->aliases, (size_t)ctx->cap_aliases * sizeof *ctx->aliases);
    loom_ir_free(a, ctx->detached, (size_t)ctx->cap_detached);
    loom_ir_free(a, ctx->cut_map, (size_t)ctx->cap_cut_map * sizeof *ctx->cut_map);
    loom_ir_free(a, ctx->inflight.bufs, (size_t)ctx->inflight.cap_bufs * sizeof *ctx->inflight.bufs);
    loom_ir_free(a, ctx->inflight.slots, (size_t)ctx->inflight.cap_slots * sizeof *ctx->inflight.slots);
    loom_ir_free(a, ctx->inflight.gens, (size_t)ctx->inflight.cap_gens * sizeof *ctx->inflight.gens);
    loom_ir_free(a, ctx->roots, (size_t)ctx->cap_roots * sizeof *ctx->roots);
    if (ctx->memory_report)
        loom_ir_free(a, ctx->memory_report, strlen(ctx->memory_report) + 1);
    loom_fe_scope_deinit(ctx);
    loom_ir_free(a, ctx->recompiles.causes,
                 (size_t)ctx->recompiles.cap * sizeof *ctx->recompiles.causes);
    loom_ir_free(a, ctx->root_tensors, (size_t)ctx->cap_root_tensors * sizeof *ctx->root_tensors);
    if (ctx->dump_dir)
        loom_ir_free(a, ctx->dump_dir, strlen(ctx->dump_dir) + 1);
    if (ctx->cache_dir)
        loom_ir_free(a, ctx->cache_dir, strlen(ctx->cache_dir) + 1);
    loom_rt_cache_deinit(&ctx->cache);
    loom_rt_profile_deinit(&ctx->profile);
    loom_ir_graph_deinit(&ctx->trace);
    loom_ir_graph_deinit(&ctx->cut);
    loom_rt_device_destroy(ctx->device);
    loom_allocator alloc = ctx->alloc;
    loom_ir_free(&alloc, ctx, sizeof *ctx);
}

loom_status loom_fe_error(loom_context *ctx, loom_status code, const char *file, int line,
                          const char *op, const char *fmt, ...) {
    if (ctx->err != LOOM_OK) /* the earlier error stands, and is what the caller reports */
        return ctx->err;
    ctx->err = code;
    size_t n = 0;
    if (file) {
        const char *base = strrchr(file, '/');
        n = (size_t)snprintf(ctx->err_msg, sizeof ctx->err_msg, "%s:%d: ", base ? base + 1 : file,
                             line);
    }
    if (file && ctx->scope && n < sizeof ctx->err_msg) /* an op recorded in a module */
        n += (size_t)snprintf(ctx->err_msg + n, sizeof ctx->err_msg - n, "%s: ", ctx->scope);
    if (op && n < sizeof ctx->err_msg)
        n += (size_t)snprintf(ctx->err_msg + n, sizeof ctx->err_msg - n, "%s: ", op);
    if (n < sizeof ctx->err_msg) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err_msg + n, sizeof ctx->err_msg - n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* A thread's identity: the address of its own byte. */
static _Thread_local char thread_tag;

bool loom_fe_use_begin(loom_fe_use *u, loom_context *ctx, const char *op) {
    u->ctx = NULL;
    if (!ctx)
        return true;
    uintptr_t me = (uintptr_t)&thread_tag, free_ = 0;
    if (atomic_load_explicit(&ctx->user, memory_order_relaxed) == me) {
        ctx->use_depth++; /* a call nested in this thread's own */
    } else if (atomic_compare_exchange_strong_explicit(&ctx->user, &free_, me,
                                                       memory_order_acquire,
                                                       memory_order_relaxed)) {
        ctx->use_depth = 1;
    } else {
        const char *none = NULL;
        atomic_compare_exchange_strong(&ctx->refused_op, &none, op);
        if (!atomic_exchange(&ctx->refusal_printed, true))
            fprintf(stderr,
                    "loom: error: %s: the context is in use by another thread (a context is "
                    "used by one thread at a time: one context per thread, or a lock around "
                    "it); later refusals are not printed\n",
                    op);
        return false;
    }
    u->ctx = ctx;
    return true;
}

void loom_fe_use_end(loom_fe_use *u) {
    loom_context *ctx = u->ctx;
    if (!ctx || --ctx->use_depth > 0)
        return;
    const char *refused = atomic_exchange(&ctx->refused_op, NULL);
    if (refused)
        loom_fe_error(ctx, LOOM_STATUS_BUSY, NULL, 0, refused,
                      "the context was used from two threads at once: this call came from "
                      "another thread while one was inside the context, and was refused (a "
                      "context is used by one thread at a time: one context per thread, or a "
                      "lock around it)");
    atomic_store_explicit(&ctx->user, 0, memory_order_release);
}

LOOM_API loom_status loom_context_error(const loom_context *ctx) {
    return ctx ? ctx->err : LOOM_STATUS_INVALID_ARGUMENT;
}

LOOM_API const char *loom_context_error_message(const loom_context *ctx) {
    if (!ctx)
        return "context is NULL";
    return ctx->err == LOOM_OK ? "" : ctx->err_msg;
}

LOOM_API void loom_context_clear_error(loom_context *ctx) {
    LOOM_FE_USE(ctx, "context_clear_error", );
    if (ctx) {
        ctx->err = LOOM_OK;
        ctx->err_msg[0] = '\0';
    }
}

LOOM_API int64_t loom_context_step(const loom_context *ctx) { return ctx ? ctx->step : -1; }

LOOM_API loom_status loom_context_sync(loom_context *ctx) {
    LOOM_FE_USE(ctx, "context_sync", LOOM_STATUS_BUSY);
    return ctx ? loom_fe_finish_inflight(ctx) : LOOM_STATUS_INVALID_ARGUMENT;
}

/* The context's metrics, with the collectives' (CollectiveTime, CollectiveBytes) from the
 * world communicator, which counts them for every context of the process. */
static void metrics_view(const loom_context *ctx, loom_rt_metrics *out) {
    *out = ctx->metrics;
    loom_rt_comm_read_metrics(loom_rt_comm_world(), out);
}

LOOM_API int64_t loom_metric_value(const loom_context *ctx, const char *name) {
    if (!ctx || !name)
        return -1;
    loom_rt_metric m = loom_rt_metric_from_name(name);
    if (m == LOOM_RT_METRIC_COUNT_)
        return -1;
    loom_rt_metrics v;
    metrics_view(ctx, &v);
    return v.count[m];
}

LOOM_API int64_t loom_metric_total(const loom_context *ctx, const char *name) {
    if (!ctx || !name)
        return -1;
    loom_rt_metric m = loom_rt_metric_from_name(name);
    if (m == LOOM_RT_METRIC_COUNT_)
        return -1;
    loom_rt_metrics v;
    metrics_view(ctx, &v);
    return loom_rt_metric_is_timer(m) ? v.total[m] : v.count[m];
}

LOOM_API loom_status loom_metrics_report(const loom_context *ctx, loom_report_format format,
                                         void (*write)(const char *chunk, size_t len, void *ud),
                                         void *ud) {
    if (!ctx || !write || (unsigned)format >= LOOM_REPORT_FORMAT_COUNT_)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_rt_metrics v;
    metrics_view(ctx, &v);
    return loom_rt_metrics_report(&v, format, write, ud);
}

LOOM_API loom_status loom_profile_report(loom_context *ctx, loom_report_format format,
                                         void (*write)(const char *chunk, size_t len, void *ud),
                                         void *ud) {
    if (!ctx || !write || (unsigned)format >= LOOM_REPORT_FORMAT_COUNT_)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_fe_finish_inflight(ctx); /* its kernels' times are written on the stream */
    return loom_rt_profile_report(&ctx->profile, ctx->metrics.total[LOOM_RT_METRIC_EXECUTE_TIME],
                                  PROFILE_TOP, format, write, ud);
}

LOOM_API loom_status loom_device_memory(const loom_context *ctx, size_t *out_current,
                                        size_t *out_peak) {
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out_current)
        *out_current = ctx->device->mem_current;
    if (out_peak)
        *out_peak = ctx->device->mem_peak;
    return LOOM_OK;
}
