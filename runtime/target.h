/* Targets: what a device brings besides its memory (runtime.h's device vtable): its
 * compiler, a cut graph to an executable, and its answer to whether it can run a graph.
 * Registered from above (targets/: "npu" with the codegen JIT, "ref" with the reference
 * interpreter), so a new target is added without touching the frontend or the passes. The
 * frontend asks the context's device's target to build a step, and the target's fallback
 * where the target answers UNSUPPORTED. */
#ifndef LOOM_RUNTIME_TARGET_H
#define LOOM_RUNTIME_TARGET_H

#include "runtime.h"

struct loom_rt_pool;
struct loom_rt_trace;

/* The settings that shape a build (the context's), for every target: a target ignores what
 * it has no use for. */
typedef struct loom_rt_build_options {
    int32_t compile_threads;
    bool verify_passes;          /* verifier after every pass (tests, LOOM_VERIFY=1) */
    const char *cache_dir;       /* NULL: no disk cache */
    const char *dump_dir;        /* NULL: no dumps */
    const char *dump_prefix;     /* "stepNNNNNN-<hash>" */
    loom_rt_profile *profile;    /* NULL: kernels are not timed (LOOM_PROFILE) */
    double allreduce_bucket_mb;  /* loom_pass_options.allreduce_bucket_mb; part of the cache key */
    struct loom_rt_trace *trace; /* NULL: not tracing */
    const char *perf_map;        /* append the kernels' perf map here (LOOM_PERF_MAP); NULL: no */
    const char *jitdump_dir;     /* and their code to <dir>/jit-<pid>.dump; NULL: no */
} loom_rt_build_options;

typedef struct loom_rt_target {
    const char *name;     /* the devices' name: "npu" for npu:0, npu:1, ... */
    const char *compiler; /* what builds its executables, for messages ("the JIT") */
    /* An executable for cut (hash: its structural hash) that runs on pool's threads (or the
     * host thread). Errors: UNSUPPORTED (this target cannot run cut, d says why: the
     * fallback target builds it), INTERNAL, OUT_OF_MEMORY, with the message in d. */
    loom_status (*build)(const loom_ir_graph *cut, uint64_t hash, const loom_rt_build_options *o,
                         struct loom_rt_pool *pool, const loom_allocator *a, loom_rt_metrics *m,
                         loom_rt_executable **out_exe, loom_ir_diag *d);
    /* Whether build would take g, checked without building: LOOM_OK, or UNSUPPORTED naming
     * what the target refuses. */
    loom_status (*supports)(const loom_ir_graph *g, loom_ir_diag *d);
    const char *fallback; /* the target that builds what this one does not support; NULL */
} loom_rt_target;

/* Registers t (static storage), once per name: a second registration of a name is ignored.
 * Thread-safe. Errors: OUT_OF_MEMORY (the table is full). */
loom_status loom_rt_target_register(const loom_rt_target *t);
/* The target registered as name, NULL if none. Thread-safe. */
const loom_rt_target *loom_rt_target_find(const char *name);

#endif
