/* Steps: cut the pending graph from the trace, find or build its executable, run it, and
 * end the step (op results that were not retained die here). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend.h"
#include "runtime/kernel.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

/* LOOM_DUMP: the graph as text and DOT, named by step and hash. Failures to write are
 * reported on stderr once per graph and never fail the step. */
static void dump_graph(loom_context *ctx, const loom_ir_graph *g, const char *prefix) {
    if (mkdir(ctx->dump_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "loom: LOOM_DUMP: cannot create %s: %s\n", ctx->dump_dir, strerror(errno));
        return;
    }
    static const char *const ext[2] = {"loom", "dot"};
    for (int k = 0; k < 2; k++) {
        loom_ir_sbuf sb;
        loom_ir_sbuf_init(&sb, &ctx->alloc);
        if (k == 0) {
            loom_ir_sbuf_printf(&sb, "// %s: the graph as traced\n", prefix);
            loom_ir_graph_print(g, loom_ir_sbuf_write, &sb);
        } else {
            loom_ir_graph_dot(g, loom_ir_sbuf_write, &sb);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.%s", ctx->dump_dir, prefix, ext[k]);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (sb.oom)
            fprintf(stderr, "loom: LOOM_DUMP: out of memory printing %s\n", path);
        else if (loom_ir_write_file_atomic(path, sb.data ? sb.data : "", sb.len, &d) != LOOM_OK)
            fprintf(stderr, "loom: LOOM_DUMP: %s\n", d.msg);
        loom_ir_sbuf_deinit(&sb);
    }
}

bool loom_fe_graph_room(loom_context *ctx, const char *file, int line, const char *op) {
    const loom_ir_graph *g = &ctx->trace;
    if (g->n_nodes < ctx->max_graph_nodes)
        return true;
    /* where most of the nodes came from: the loop's body, as a rule */
    enum { SLOTS = 1024 };
    static _Thread_local struct {
        const char *file;
        int line;
        int64_t n;
    } counts[SLOTS];
    memset(counts, 0, sizeof counts);
    int32_t best = -1;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        loom_ir_loc l = g->nodes[i].loc;
        uint32_t h = ((uint32_t)(uintptr_t)l.file * 2654435761u ^ (uint32_t)l.line) % SLOTS;
        for (int32_t probe = 0; probe < SLOTS; probe++, h = (h + 1) % SLOTS) {
            if (counts[h].n == 0) {
                counts[h].file = l.file;
                counts[h].line = l.line;
            } else if (counts[h].file != l.file || counts[h].line != l.line) {
                continue;
            }
            counts[h].n++;
            if (best < 0 || counts[h].n > counts[best].n)
                best = (int32_t)h;
            break;
        }
    }
    char where[160] = "";
    if (best >= 0 && counts[best].file) {
        char loc[128];
        loom_ir_format_loc(loc, sizeof loc,
                           (loom_ir_loc){.file = counts[best].file, .line = counts[best].line});
        snprintf(where, sizeof where, ", %lld of them recorded at %s", (long long)counts[best].n,
                 loc);
    }
    loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                  "step %lld's graph reached %lld nodes without a loom_mark_step (the limit: "
                  "LOOM_MAX_GRAPH_NODES)%s: is a loom_mark_step missing in a loop?",
                  (long long)ctx->step, (long long)ctx->max_graph_nodes, where);
    return false;
}

/* TraceTime covers cutting the graph, hashing it and looking it up (t0 is when the cut
 * began); building on a miss is CompileTime. */
static loom_status lookup_or_build(loom_context *ctx, int64_t t0, loom_rt_executable **out_exe) {
    uint64_t hash = loom_ir_graph_hash(&ctx->cut);
    loom_rt_executable *exe = loom_rt_cache_find(&ctx->cache, &ctx->cut, hash);
    int64_t t1 = loom_rt_now_ns();
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_TRACE_TIME, t1 - t0);
    if (ctx->chrome) {
        char name[64], args[96];
        snprintf(name, sizeof name, "trace step %" PRId64, ctx->step);
        snprintf(args, sizeof args, "\"nodes\":%d,\"graph\":\"%016" PRIx64 "\",\"cache\":\"%s\"",
                 (int)ctx->cut.n_nodes, hash, exe ? "hit" : "miss");
        loom_rt_trace_event(ctx->chrome, "trace", name, t0, t1, args);
    }
    if (exe) {
        loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_CACHE_HIT, 1);
        *out_exe = exe;
        return LOOM_OK;
    }
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_CACHE_MISS, 1);
    if (loom_fe_explain_recompile(ctx, &ctx->cut) != LOOM_OK)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step",
                             "out of memory explaining why step %" PRId64 " recompiled", ctx->step);
    if (ctx->step >= LOOM_FE_DEBUG_WARMUP) {
        ctx->late_compiles++;
        if (ctx->debug)
            fprintf(stderr,
                    "loom: debug: step %" PRId64 " compiles a graph of %d nodes after the %d-step "
                    "warm-up (%" PRId64 " such compile%s so far)\n",
                    ctx->step, (int)ctx->cut.n_nodes, LOOM_FE_DEBUG_WARMUP, ctx->late_compiles,
                    ctx->late_compiles == 1 ? "" : "s");
    }
    int64_t compile_t0 = loom_rt_now_ns();
    char prefix[64];
    snprintf(prefix, sizeof prefix, "step%06" PRId64 "-%016" PRIx64, ctx->step, hash);
    if (ctx->dump_dir)
        dump_graph(ctx, &ctx->cut, prefix);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_fe_build_executable(ctx, hash, prefix, &exe, &d);
    if (st == LOOM_OK)
        st = loom_rt_cache_insert(&ctx->cache, exe);
    int64_t compile_t1 = loom_rt_now_ns();
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_COMPILE_TIME, compile_t1 - compile_t0);
    if (ctx->chrome) {
        char name[64];
        snprintf(name, sizeof name, "compile step %" PRId64 "%s", ctx->step,
                 st == LOOM_OK && exe && exe->host_thread_only ? " (interpreter)" : "");
        loom_rt_trace_event(ctx->chrome, "compile", name, compile_t0, compile_t1, NULL);
    }
    if (st != LOOM_OK)
        return loom_fe_error(ctx, st, NULL, 0, "mark_step", "building step %" PRId64 ": %s",
                             ctx->step, d.code != LOOM_OK ? d.msg : "out of memory");
    *out_exe = exe;
    return LOOM_OK;
}

static loom_status run_job(void *job, loom_ir_diag *d) {
    loom_fe_inflight *f = job;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = f->exe->vt->run(f->exe, f->bufs, f->bufs + f->n_in, d);
    int64_t t1 = loom_rt_now_ns();
    f->exec_ns = t1 - t0;
    if (f->trace) {
        char name[64];
        snprintf(name, sizeof name, "step %" PRId64, f->step);
        loom_rt_trace_event(f->trace, "step", name, t0, t1,
                            st == LOOM_OK ? NULL : "\"failed\":true");
    }
    return st;
}

/* The job's storage belongs to the context and is recycled on the user's thread by
 * loom_fe_finish_inflight: nothing to free on the stream's thread. */
static void release_job(void *job) { (void)job; }

/* Ends the in-flight job once it has run (status st, message in d): counts its time,
 * records a failure, takes the values it failed to produce from their tensors, and drops
 * the job's buffer references. On the host thread. */
static loom_status complete_job(loom_context *ctx, loom_status st, const loom_ir_diag *d) {
    loom_fe_inflight *f = &ctx->inflight;
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_EXECUTE_TIME, f->exec_ns);
    if (st != LOOM_OK) {
        loom_fe_error(ctx, st, NULL, 0, "mark_step", "executing step %" PRId64 ": %s", f->step,
                      d->msg);
        for (int32_t k = 0; k < f->n_out; k++) {
            loom_fe_tensor *t = &ctx->tensors[f->slots[k]];
            if (t->alive && t->gen == f->gens[k] && t->buf == f->bufs[f->n_in + k]) {
                loom_rt_buffer_release(t->buf);
                t->buf = NULL;
            }
        }
    }
    for (int32_t k = 0; k < f->n_in + f->n_out; k++)
        loom_rt_buffer_release(f->bufs[k]);
    f->active = false;
    return st;
}

loom_status loom_fe_finish_inflight(loom_context *ctx) {
    if (!ctx->inflight.active)
        return LOOM_OK;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_rt_stream_wait(ctx->stream, &d);
    return complete_job(ctx, st, &d);
}

/* For loom_memory_report: exe's, copied when it is another executable than the last. */
static loom_status keep_memory_report(loom_context *ctx, const loom_rt_executable *exe) {
    if (!exe->memory_report || (ctx->memory_report && exe->hash == ctx->memory_report_hash))
        return LOOM_OK;
    size_t len = strlen(exe->memory_report) + 1;
    char *copy = loom_ir_alloc(&ctx->alloc, len);
    if (!copy)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step",
                             "out of memory keeping the step's memory report");
    memcpy(copy, exe->memory_report, len);
    if (ctx->memory_report)
        loom_ir_free(&ctx->alloc, ctx->memory_report, strlen(ctx->memory_report) + 1);
    ctx->memory_report = copy;
    ctx->memory_report_hash = exe->hash;
    return LOOM_OK;
}

/* Submits exe on the stream: inputs are the trace buffers the cut graph reads; outputs
 * get new buffers that the tensors hold at once (a read waits for the step). */
static loom_status execute(loom_context *ctx, loom_rt_executable *exe, int32_t n,
                           const int32_t *slots) {
    const loom_ir_graph *g = &ctx->cut;
    loom_fe_inflight *f = &ctx->inflight;
    int32_t n_in = g->n_graph_inputs;
    if (!loom_ir_grow(&ctx->alloc, (void **)&f->bufs, &f->cap_bufs, n_in + n, sizeof *f->bufs) ||
        !loom_ir_grow(&ctx->alloc, (void **)&f->slots, &f->cap_slots, n, sizeof *f->slots) ||
        !loom_ir_grow(&ctx->alloc, (void **)&f->gens, &f->cap_gens, n, sizeof *f->gens))
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step", "out of memory");
    /* The cut renumbered the trace's inputs densely in node order. */
    for (int32_t k = 0; k < ctx->n_trace_inputs; k++) {
        int32_t mapped = ctx->cut_map[ctx->trace_input_nodes[k]];
        if (mapped >= 0)
            f->bufs[g->nodes[mapped].attrs.index] = ctx->trace_inputs[k];
    }
    loom_status st = LOOM_OK;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t n_outs = 0;
    for (; n_outs < n; n_outs++) {
        int32_t alias = g->outputs[n_outs].alias;
        if (alias >= 0) { /* donated: written back into the input's own buffer */
            f->bufs[n_in + n_outs] = f->bufs[alias];
            loom_rt_buffer_retain(f->bufs[alias]);
            continue;
        }
        size_t bytes = loom_ir_node_bytes(&g->nodes[g->outputs[n_outs].node]);
        if ((st = loom_rt_buffer_alloc(ctx->device, bytes, &f->bufs[n_in + n_outs])) != LOOM_OK) {
            char cap[160];
            loom_ir_diag_set(&d, st, "out of memory for output %d of the step (%zu bytes)%s",
                             (int)n_outs, bytes,
                             loom_rt_device_cap_note(ctx->device, cap, sizeof cap));
            break;
        }
    }
    if (st == LOOM_OK)
        st = loom_rt_program_prepare(exe, ctx->device, &d);
    if (st != LOOM_OK) {
        for (int32_t k = 0; k < n_outs; k++)
            loom_rt_buffer_release(f->bufs[n_in + k]);
        /* out of memory: say where the step's memory goes (the plan's largest values) */
        bool oom = st == LOOM_STATUS_OUT_OF_MEMORY && exe->memory_report;
        return loom_fe_error(ctx, st, NULL, 0, "mark_step", "%s%s%s",
                             d.code != LOOM_OK ? d.msg : "out of memory for the step's outputs",
                             oom ? "\n" : "", oom ? exe->memory_report : "");
    }
    if ((st = keep_memory_report(ctx, exe)) != LOOM_OK) {
        for (int32_t k = 0; k < n_outs; k++)
            loom_rt_buffer_release(f->bufs[n_in + k]);
        return st;
    }
    for (int32_t k = 0; k < n_in; k++)
        loom_rt_buffer_retain(f->bufs[k]);
    for (int32_t k = 0; k < n; k++) {
        loom_fe_tensor *t = &ctx->tensors[slots[k]];
        loom_rt_buffer_release(t->buf);
        t->buf = f->bufs[n_in + k];
        loom_rt_buffer_retain(t->buf); /* one reference for the tensor, one for the job */
        t->node = -1;
        t->node_step = -1;
        if (g->outputs[k].alias < 0) /* a new buffer: the trace's input reads the old one */
            t->input_step = -1;
        f->slots[k] = slots[k];
        f->gens[k] = t->gen;
    }
    f->exe = exe;
    f->n_in = n_in;
    f->n_out = n;
    f->step = ctx->step;
    f->active = true;
    if (exe->host_thread_only) { /* runs here and now: it allocates from our allocator */
        loom_ir_diag_init(&d);
        return complete_job(ctx, run_job(f, &d), &d);
    }
    st = loom_rt_stream_submit(ctx->stream, run_job, f, release_job);
    if (st != LOOM_OK) { /* not queued: nothing ran, nothing will */
        loom_ir_diag_set(&d, st, "the device stream refused the step");
        return complete_job(ctx, st, &d);
    }
    return ctx->sync ? loom_fe_finish_inflight(ctx) : LOOM_OK;
}

/* Cuts the graph computing the tensors `slots` from the trace and finds or builds its
 * executable (loom_fe_compute's first half). */
static loom_status cut_and_build(loom_context *ctx, int32_t n, const int32_t *slots,
                                 bool whole_step, loom_rt_executable **out_exe) {
    /* One step in flight: the previous one finishes first (and its executable cannot be
     * evicted by this step's compile while it runs). */
    loom_fe_finish_inflight(ctx);
    int64_t t0 = loom_rt_now_ns();
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->roots, &ctx->cap_roots, n, sizeof *ctx->roots) ||
        !loom_ir_grow(&ctx->alloc, (void **)&ctx->cut_map, &ctx->cap_cut_map, ctx->trace.n_nodes,
                      sizeof *ctx->cut_map))
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step", "out of memory");
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->aliases, &ctx->cap_aliases, n,
                      sizeof *ctx->aliases))
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step", "out of memory");
    /* A tensor that had a value read in this step and gets a new one (an assignment) is
     * written back into its own buffer: the output aliases that graph input (donation). Only
     * when the whole step runs: after a partial compute, ops still pending may read the old
     * value through that input. */
    for (int32_t k = 0; k < n; k++) {
        const loom_fe_tensor *t = &ctx->tensors[slots[k]];
        ctx->roots[k] = t->node;
        ctx->aliases[k] = whole_step && t->buf && t->input_step == ctx->step
                              ? (int32_t)ctx->trace.nodes[t->input_node].attrs.index
                              : -1;
    }
    loom_status st = loom_ir_graph_extract(&ctx->cut, &ctx->trace, n, ctx->roots, ctx->aliases,
                                           false, ctx->cut_map);
    if (st != LOOM_OK)
        return loom_fe_error(ctx, st, NULL, 0, "mark_step", "out of memory cutting the graph");
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_GRAPH_NODES, ctx->cut.n_nodes);
    return lookup_or_build(ctx, t0, out_exe);
}

loom_status loom_fe_compute(loom_context *ctx, int32_t n, const int32_t *slots, bool whole_step) {
    loom_rt_executable *exe = NULL;
    loom_status st = cut_and_build(ctx, n, slots, whole_step, &exe);
    return st != LOOM_OK ? st : execute(ctx, exe, n, slots);
}

void loom_fe_end_step(loom_context *ctx) {
    for (int32_t k = 0; k < ctx->n_step_tensors; k++) {
        int32_t slot = ctx->step_tensors[k];
        loom_fe_tensor *t = &ctx->tensors[slot];
        t->step_owned = false;
        if (t->refs == 0)
            loom_fe_tensor_free(ctx, slot);
    }
    for (int32_t k = 0; k < ctx->n_trace_inputs; k++)
        loom_rt_buffer_release(ctx->trace_inputs[k]);
    ctx->n_step_tensors = 0;
    ctx->n_assigned = 0;
    ctx->n_trace_inputs = 0;
    loom_ir_graph_reset(&ctx->trace);
    ctx->step++;
}

/* The step's roots into ctx->root_tensors: retained op results still pending and pending
 * assignments. Only this step's results can be pending (earlier steps computed theirs), so
 * scanning them suffices. */
static loom_status step_roots(loom_context *ctx, int32_t *out_n) {
    int32_t n = 0;
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->root_tensors, &ctx->cap_root_tensors,
                      ctx->n_step_tensors + ctx->n_assigned, sizeof *ctx->root_tensors))
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step", "out of memory");
    for (int32_t k = 0; k < ctx->n_step_tensors; k++) {
        const loom_fe_tensor *t = &ctx->tensors[ctx->step_tensors[k]];
        if (t->refs > 0 && !t->buf && t->node_step == ctx->step)
            ctx->root_tensors[n++] = ctx->step_tensors[k];
    }
    for (int32_t k = 0; k < ctx->n_assigned; k++) {
        const loom_fe_tensor *t = &ctx->tensors[ctx->assigned[k]];
        if (t->alive && t->node_step == ctx->step && t->node >= 0)
            ctx->root_tensors[n++] = ctx->assigned[k];
    }
    *out_n = n;
    return LOOM_OK;
}

LOOM_API loom_status loom_compile_step(loom_context *ctx) {
    LOOM_FE_USE(ctx, "compile_step", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    int32_t n = 0;
    loom_rt_executable *exe = NULL;
    loom_status st = step_roots(ctx, &n);
    if (st == LOOM_OK && n > 0)
        st = cut_and_build(ctx, n, ctx->root_tensors, true, &exe);
    if (st == LOOM_OK && exe)
        st = keep_memory_report(ctx, exe);
    return ctx->err != LOOM_OK ? ctx->err : st;
}

LOOM_API loom_status loom_mark_step(loom_context *ctx) {
    LOOM_FE_USE(ctx, "mark_step", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_STEPS, 1);
    loom_fe_tensor_dump td;
    loom_fe_tensor_dump_begin(ctx, &td);
    int32_t n = 0;
    loom_status st = step_roots(ctx, &n);
    if (st == LOOM_OK && n > 0)
        st = loom_fe_compute(ctx, n, ctx->root_tensors, true);
    loom_fe_tensor_dump_end(ctx, &td);
    loom_fe_end_step(ctx);
    /* The first error of the step wins over the execution status: it is the cause. */
    return ctx->err != LOOM_OK ? ctx->err : st;
}
