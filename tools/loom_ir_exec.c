/* loom-ir compile and run: a graph file through the same pipeline as a step (passes, plan,
 * codegen into a program on a thread pool), for looking at what it compiles to and timing
 * it on random inputs, checked against the reference interpreter. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "targets/targets.h"
#include "loom_ir_exec.h"
#include "runtime/kernel.h"

/* The compile pipeline's state: a pool for the program and compile threads, metrics. */
typedef struct pipeline {
    loom_allocator a;
    loom_rt_pool *pool;
    loom_rt_metrics metrics;
    loom_rt_profile profile;
} pipeline;

static bool pipeline_init(pipeline *p, int32_t threads) {
    p->a = loom_allocator_system();
    loom_rt_metrics_init(&p->metrics);
    loom_rt_profile_init(&p->profile, &p->a);
    if (loom_rt_pool_create(threads > 0 ? threads : loom_rt_default_threads(), &p->a, &p->pool) !=
        LOOM_OK) {
        fprintf(stderr, "loom-ir: error: cannot start the thread pool\n");
        return false;
    }
    return true;
}

static void pipeline_deinit(pipeline *p) {
    loom_rt_pool_destroy(p->pool);
    loom_rt_profile_deinit(&p->profile);
}

/* Builds g's executable as a step would (dumps into dump_dir when set). */
static loom_rt_executable *build(pipeline *p, const loom_ir_graph *g, const char *shown,
                                 const char *dump_dir, bool profile, double *out_ms) {
    int64_t t0 = loom_rt_now_ns();
    loom_context_options env; /* LOOM_PERF_MAP, read as a context reads it */
    loom_context_options_init(&env);
    char map_path[64];
    loom_rt_build_options o = {.compile_threads = loom_rt_pool_threads(p->pool),
                               .verify_passes = true,
                               .dump_dir = dump_dir,
                               .dump_prefix = "x",
                               .profile = profile ? &p->profile : NULL,
                               .perf_map = env.perf_map || env.perf_jitdump
                                               ? loom_rt_perf_map_path(map_path, sizeof map_path)
                                               : NULL,
                               .jitdump_dir = env.perf_jitdump ? LOOM_RT_JITDUMP_DIR : NULL};
    loom_rt_executable *exe = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_tg_register_builtin();
    const loom_rt_target *npu = loom_rt_target_find("npu");
    if (npu->build(g, loom_ir_graph_hash(g), &o, p->pool, &p->a, &p->metrics, &exe, &d) !=
        LOOM_OK) {
        fprintf(stderr, "%s: error: %s\n", shown, d.msg);
        return NULL;
    }
    *out_ms = (double)(loom_rt_now_ns() - t0) / 1e6;
    return exe;
}

static bool cat(const char *path, bool header, const char *comment) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    if (header)
        printf("%s ---- %s\n", comment, strrchr(path, '/') + 1);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
    fclose(f);
    return true;
}

int loom_ir_cmd_compile(const loom_ir_graph *g, const char *shown, const char *emit) {
    static const char *const emits[] = {"mlir", "lowered", "llvm", "asm", "plan", "summary"};
    static const char *const files[] = {"x.mlir", "x.lowered.mlir", NULL,
                                        NULL,     "x.plan.txt",     "x.summary.txt"};
    int e = -1;
    for (int i = 0; i < 6; i++)
        if (strcmp(emit, emits[i]) == 0)
            e = i;
    if (e < 0) {
        fprintf(stderr,
                "loom-ir compile: error: unknown --emit '%s' (mlir, lowered, llvm, asm, "
                "plan, summary)\n",
                emit);
        return 2;
    }
    char dir[] = "/tmp/loom-ir-compile-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "loom-ir compile: error: cannot make a temporary folder\n");
        return 1;
    }
    pipeline p;
    int rc = 1;
    if (pipeline_init(&p, 0)) {
        double compile_ms;
        loom_rt_executable *exe = build(&p, g, shown, dir, false, &compile_ms);
        if (exe) {
            rc = 0;
            char path[128];
            if (files[e]) {
                snprintf(path, sizeof path, "%s/%s", dir, files[e]);
                rc = cat(path, false, "") ? 0 : 1;
            } else { /* a file per module */
                for (int m = 0;; m++) {
                    snprintf(path, sizeof path, "%s/x.m%d.%s", dir, m, e == 2 ? "ll" : "s");
                    if (!cat(path, true, e == 2 ? ";" : "#"))
                        break;
                }
            }
            loom_rt_executable_destroy(exe);
        }
        pipeline_deinit(&p);
    }
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "loom-ir compile: warning: could not remove %s\n", dir);
    return rc;
}

/* xorshift64*: reproducible inputs from a seed. */
static double rnd(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static void fill(void *data, const loom_ir_node *n, uint64_t *seed) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    for (int64_t i = 0; i < count; i++) {
        double u = rnd(seed);
        if (n->dtype == LOOM_DTYPE_BOOL)
            loom_ir_store_i64(data, n->dtype, i, u < 0.5);
        else if (loom_ir_dtype_is_float(n->dtype))
            loom_ir_store_f64(data, n->dtype, i, 2 * u - 1);
        else
            loom_ir_store_i64(data, n->dtype, i, (int64_t)(u * 16) - 8);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void write_stdout(const char *chunk, size_t len, void *ud) {
    (void)ud;
    fwrite(chunk, 1, len, stdout);
}

/* Compares out against the interpreter's want; prints the worst difference of each output
 * when verbose, of the differing ones otherwise (run r of a --repeat). An element may
 * differ by rtol times its magnitude plus the output's RMS: a value that cancels to near zero
 * (a dot product of random signs) carries the rounding of the terms it summed, which are of
 * the output's scale, not of its own. */
static bool check(const loom_ir_graph *g, void *const *out, void *const *want, int run,
                  bool verbose) {
    bool ok = true;
    for (int32_t o = 0; o < g->n_outputs; o++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o].node];
        int64_t count = loom_ir_numel(n->rank, n->shape);
        bool f16 = n->dtype == LOOM_DTYPE_BF16 || n->dtype == LOOM_DTYPE_F16;
        double rtol = f16 ? 2e-2 : n->dtype == LOOM_DTYPE_F64 ? 1e-9 : 1e-4, worst = 0, sq = 0;
        int64_t bad = 0, finite = 0;
        for (int64_t i = 0; i < count; i++) {
            double w = loom_ir_load_f64(want[o], n->dtype, i);
            if (isfinite(w)) {
                sq += w * w;
                finite++;
            }
        }
        double rms = finite ? sqrt(sq / (double)finite) : 0, scale = rms > 0 ? rms : 1e-3;
        for (int64_t i = 0; i < count; i++) {
            double w = loom_ir_load_f64(want[o], n->dtype, i);
            double x = loom_ir_load_f64(out[o], n->dtype, i);
            if ((isnan(w) && isnan(x)) || w == x)
                continue;
            double err = fabs(w - x) / (rtol * (fabs(w) + scale));
            worst = err > worst ? err : worst;
            bad += !(err <= 1);
        }
        if (verbose || bad) {
            char ty[LOOM_IR_TYPE_STR_MAX], alias[48] = "";
            if (g->outputs[o].alias >= 0)
                snprintf(alias, sizeof alias, ", written into input %d",
                         (int)g->outputs[o].alias);
            printf("check: run %d: output %d %s%s: %s (largest difference %.3g of the "
                   "tolerance, %g x (|value| + %.3g, the output's RMS))\n",
                   run + 1, (int)o, loom_ir_format_type(ty, sizeof ty, n->dtype, n->rank, n->shape),
                   alias, bad ? "DIFFERS from the interpreter" : "matches the interpreter", worst,
                   rtol, scale);
        }
        ok = ok && bad == 0;
    }
    return ok;
}

/* Runs as a step does: every output written into the buffer of the input it aliases (its
 * donated input), the others into buffers of their own; so each run starts from the donated
 * values the run before it left, as a training loop's steps do. With check_interp every run
 * is compared with the interpreter's run from the same inputs (the first run's outputs in
 * full, later runs' only where they differ); only the compiled runs are timed. */
int loom_ir_cmd_run(const loom_ir_graph *g, const char *shown, int repeat, bool check_interp,
                    uint64_t seed) {
    pipeline p;
    if (!pipeline_init(&p, 0))
        return 1;
    int rc = 1;
    int32_t n_in = g->n_graph_inputs, n_out = g->n_outputs;
    loom_rt_device *dev = NULL;
    loom_rt_buffer **ins = calloc((size_t)n_in + 1, sizeof *ins);
    loom_rt_buffer **outs = calloc((size_t)n_out + 1, sizeof *outs);
    void **snap = calloc((size_t)n_in + 1, sizeof *snap); /* the inputs before a checked run */
    void **want = calloc((size_t)n_out + 1, sizeof *want);
    void **got = calloc((size_t)n_out + 1, sizeof *got);
    size_t *in_bytes = calloc((size_t)n_in + 1, sizeof *in_bytes);
    double *ms = calloc((size_t)repeat, sizeof *ms);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_rt_executable *exe = NULL;
    int checked = 0, failed = 0;
    if (!ins || !outs || !snap || !want || !got || !in_bytes || !ms ||
        loom_rt_device_create("npu:0", &p.a, &p.metrics, &dev, &d) != LOOM_OK) {
        fprintf(stderr, "%s: error: out of memory\n", shown);
        goto done;
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int32_t k = (int32_t)n->attrs.index;
        in_bytes[k] = loom_ir_node_bytes(n);
        if (loom_rt_buffer_alloc(dev, in_bytes[k] + 1, &ins[k]) != LOOM_OK ||
            (check_interp && !(snap[k] = malloc(in_bytes[k] + 1)))) {
            fprintf(stderr, "%s: error: out of memory for input %d (%zu bytes)\n", shown, (int)k,
                    in_bytes[k]);
            goto done;
        }
        fill(ins[k]->data, n, &seed);
    }
    for (int32_t o = 0; o < n_out; o++) {
        size_t bytes = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]) + 1;
        int32_t alias = g->outputs[o].alias;
        if (alias >= 0) { /* donated: the input's own buffer, one more reference */
            outs[o] = ins[alias];
            loom_rt_buffer_retain(outs[o]);
        } else if (loom_rt_buffer_alloc(dev, bytes, &outs[o]) != LOOM_OK) {
            outs[o] = NULL;
        }
        if (!outs[o] || (check_interp && !(want[o] = calloc(1, bytes)))) {
            fprintf(stderr, "%s: error: out of memory for output %d (%zu bytes)\n", shown, (int)o,
                    bytes);
            goto done;
        }
        got[o] = outs[o]->data;
    }
    double compile_ms = 0, total_ms = 0;
    if (!(exe = build(&p, g, shown, NULL, true, &compile_ms)))
        goto done;
    for (int r = 0; r < repeat; r++) {
        if (check_interp) { /* the interpreter from this run's inputs, before they change */
            for (int32_t k = 0; k < n_in; k++)
                memcpy(snap[k], ins[k]->data, in_bytes[k]);
            if (loom_rt_interp_run(g, &p.a, (const void *const *)snap, want, &d) != LOOM_OK) {
                fprintf(stderr, "%s: error: the interpreter, run %d: %s\n", shown, r + 1, d.msg);
                goto done;
            }
        }
        int64_t t0 = loom_rt_now_ns();
        if (exe->vt->run(exe, ins, outs, &d) != LOOM_OK) {
            fprintf(stderr, "%s: error: run %d: %s\n", shown, r + 1, d.msg);
            goto done;
        }
        ms[r] = (double)(loom_rt_now_ns() - t0) / 1e6;
        total_ms += ms[r];
        if (check_interp) {
            checked++;
            failed += !check(g, got, want, r, r == 0);
        }
    }
    if (check_interp) {
        int32_t donated = 0;
        for (int32_t o = 0; o < n_out; o++)
            donated += g->outputs[o].alias >= 0;
        printf("check: %d of %d run%s match%s the interpreter%s\n", checked - failed, checked,
               checked == 1 ? "" : "s", checked - failed == 1 ? "es" : "",
               donated ? " (each run from the donated outputs of the one before)" : "");
        if (failed)
            goto done;
    }
    qsort(ms, (size_t)repeat, sizeof *ms, cmp_double);
    printf("run: %d run%s on %d thread%s: median %.3f ms, min %.3f ms, max %.3f ms "
           "(the first includes the arena's allocation); compile %.1f ms\n",
           repeat, repeat == 1 ? "" : "s", (int)loom_rt_pool_threads(p.pool),
           loom_rt_pool_threads(p.pool) == 1 ? "" : "s", ms[repeat / 2], ms[0], ms[repeat - 1],
           compile_ms);
    loom_rt_profile_report(&p.profile, (int64_t)(total_ms * 1e6), 25, LOOM_REPORT_FORMAT_TEXT,
                           write_stdout, NULL);
    rc = 0;
done:
    loom_rt_executable_destroy(exe);
    for (int32_t k = 0; k < n_in; k++) {
        loom_rt_buffer_release(ins ? ins[k] : NULL);
        free(snap ? snap[k] : NULL);
    }
    for (int32_t o = 0; o < n_out; o++) {
        loom_rt_buffer_release(outs ? outs[o] : NULL);
        free(want ? want[o] : NULL);
    }
    free(ins);
    free(outs);
    free(snap);
    free(want);
    free(got);
    free(in_bytes);
    free(ms);
    if (dev)
        loom_rt_device_destroy(dev);
    pipeline_deinit(&p);
    return rc;
}

