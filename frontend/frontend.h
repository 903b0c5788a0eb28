/* Frontend internals: contexts, tensor slots and handles, the trace of the current step. */
#ifndef LOOM_FRONTEND_FRONTEND_H
#define LOOM_FRONTEND_FRONTEND_H

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ir/ir.h"
#include "ir/samples.h"
#include "loom/amp.h"
#include "runtime/runtime.h"

/* A tensor handle is not a pointer: it packs the owning context's registry id, the slot
 * index and the slot's generation, so a handle used after its tensor died is detected
 * (the generation no longer matches) instead of touching freed memory. */
#define LOOM_FE_CTX_BITS 12
#define LOOM_FE_GEN_BITS 24
#define LOOM_FE_SLOT_BITS 28
#define LOOM_FE_MAX_CONTEXTS (1 << LOOM_FE_CTX_BITS)
_Static_assert(LOOM_FE_CTX_BITS + LOOM_FE_GEN_BITS + LOOM_FE_SLOT_BITS == 64, "handle layout");
_Static_assert(sizeof(void *) == 8, "Loom's tensor handles need 64-bit pointers");

typedef struct loom_fe_tensor {
    uint32_t gen;      /* bumped when the slot is freed */
    bool alive;
    bool step_owned;   /* an op result of the current step: dies at mark_step unless refs > 0 */
    int32_t refs;      /* references held by the user */
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    loom_rt_buffer *buf;  /* the computed value, or NULL while pending */
    int32_t node;         /* its node in the trace when node_step == the context's step */
    int64_t node_step;
    int32_t input_node;   /* the INPUT node reading buf in the trace, when input_step == step */
    int64_t input_step;
    int64_t assigned_step; /* the step whose list of assigned tensors holds this slot */
    loom_ir_loc loc;      /* the user call that created it (file is a static string) */
    int32_t next_free;
} loom_fe_tensor;

/* The step submitted to the stream and not yet finished: at most one, so the host traces
 * step N+1 while step N runs. Its storage is reused from step to step. */
typedef struct loom_fe_inflight {
    bool active;
    int64_t step;
    loom_rt_executable *exe;
    loom_rt_buffer **bufs; /* n_in inputs then n_out outputs, each retained by the job */
    int32_t n_in, n_out, cap_bufs;
    int32_t *slots;        /* per output: the tensor it belongs to, and that slot's generation */
    uint32_t *gens;
    int32_t cap_slots, cap_gens;
    int64_t exec_ns;       /* written by the stream's thread, read after the wait */
    struct loom_rt_trace *trace; /* the context's, or NULL */
} loom_fe_inflight;

/* The recompilation explainer's record (recompile.c): each distinct cause with its count
 * and its first message, and the last explanation. */
typedef struct loom_fe_recompile_cause {
    char key[LOOM_IR_LOC_STR_MAX + 64];
    char first[640];
    int64_t count;
} loom_fe_recompile_cause;

typedef struct loom_fe_recompiles {
    loom_fe_recompile_cause *causes;
    int32_t n, cap;
    char last[640]; /* "" until the first recompilation */
} loom_fe_recompiles;

struct loom_context {
    int32_t id; /* registry slot, part of every handle */
    loom_allocator alloc;
    loom_rt_metrics metrics;
    loom_rt_device *device;
    loom_rt_cache cache;
    struct loom_rt_pool *pool;     /* the device's share of cores, kernels run on it */
    struct loom_rt_stream *stream; /* steps execute here, asynchronously */
    loom_fe_inflight inflight;     /* the step running on the stream, if any */
    bool eager;
    bool sync;      /* wait for every step in mark_step (LOOM_SYNC=1) */
    char *dump_dir; /* NULL: no dumps */
    char *cache_dir; /* NULL: no disk cache */
    bool verify_passes;
    bool profiling;          /* LOOM_PROFILE: programs time their kernels into `profile` */
    double allreduce_bucket_mb; /* resolved: > 0 (INFINITY allowed), or < 0 for 0 */
    struct loom_rt_trace *chrome; /* LOOM_TRACE's Chrome trace; NULL: not tracing */
    bool debug;                   /* LOOM_DEBUG=1: warn about recompilations, forced reads */
    bool perf_map;                /* LOOM_PERF_MAP=1: kernels into /tmp/perf-<pid>.map */
    bool perf_jitdump;            /* LOOM_PERF_MAP=jitdump: and into /tmp/jit-<pid>.dump */
    int64_t max_graph_nodes;      /* a step's trace may hold this many nodes, no more */
    char *memory_report;          /* the last compiled step's (loom_memory_report), or NULL */
    uint64_t memory_report_hash;  /* the graph hash of the executable it came from */
    int64_t late_compiles;        /* compiles after the first LOOM_FE_DEBUG_WARMUP steps */
    loom_ir_loc forced_seen[32];  /* forced reads already reported (LOOM_DEBUG) */
    int32_t n_forced_seen;
    loom_fe_recompiles recompiles;
    loom_rt_profile profile; /* kept until destroy, which prints it when profiling */

    /* the current step */
    int64_t step;
    loom_ir_graph trace;    /* every op recorded since the last mark_step */
    loom_ir_graph cut;      /* the graph cut from the trace for execution */
    int32_t *cut_map;       /* trace node -> cut node */
    int32_t cap_cut_map;
    loom_rt_buffer **trace_inputs; /* per trace INPUT index: the buffer it reads (retained) */
    int32_t *trace_input_nodes;    /* per trace INPUT index: its node id */
    int32_t n_trace_inputs, cap_trace_inputs, cap_trace_input_nodes;
    int32_t *step_tensors; /* slots of this step's op results */
    int32_t n_step_tensors, cap_step_tensors;
    int32_t *assigned;     /* slots of long-lived tensors given a new value this step */
    int32_t n_assigned, cap_assigned;
    int32_t *aliases;      /* scratch: per root, the trace input it is written into, or -1 */
    int32_t cap_aliases;
    /* autocast scopes (loom_autocast_begin): each open scope's dtype, innermost last */
    loom_dtype autocast_stack[LOOM_AUTOCAST_MAX_DEPTH];
    int32_t autocast_depth;
    /* module scopes (scope.c): the open names joined with '.', where each push began, and
     * the joined name as pooled (what nodes record; NULL when none is open) */
    char scope_buf[LOOM_SCOPE_MAX_LEN + 1];
    size_t scope_len;
    size_t scope_ends[LOOM_SCOPE_MAX_DEPTH];
    int32_t scope_depth;
    const char *scope;
    char **scope_pool; /* every joined name seen, each once, freed with the context */
    int32_t n_scope_pool, cap_scope_pool;
    uint8_t *detached; /* per trace node: 1 = gradient barrier (loom_detach); valid for
                          nodes below n_detached when detached_step == step */
    int32_t n_detached, cap_detached;
    int64_t detached_step;

    /* tensor slots */
    loom_fe_tensor *tensors;
    int32_t n_tensors, cap_tensors;
    int32_t free_head; /* -1: none */
    int32_t n_live_tensors;

    /* scratch for cutting graphs */
    int32_t *roots, *root_tensors;
    int32_t cap_roots, cap_root_tensors;

    /* the first error since the last clear */
    loom_status err;
    char err_msg[1024];

    /* the in-use guard (LOOM_FE_USE): the thread inside a call, 0 when none; how deep its
     * calls nest; the first call another thread made meanwhile, refused and not yet recorded */
    _Atomic uintptr_t user;
    int32_t use_depth;
    _Atomic(const char *) refused_op;
    atomic_bool refusal_printed; /* the first refusal is printed, the rest only counted */
};

/* Frees the scopes' names (scope.c), at the context's destruction. */
void loom_fe_scope_deinit(loom_context *ctx);

/* LOOM_DUMP_TENSORS (dump_tensors.c): begin, before mark_step takes the step's roots, makes
 * a retained result of each node it selects (they become roots); end, after the step ran,
 * writes them to the step's file and releases them. */
typedef struct loom_fe_tensor_dump {
    const char *dir;
    int64_t step;
    struct loom_named_tensor *items;
    int32_t n, cap;
} loom_fe_tensor_dump;
void loom_fe_tensor_dump_begin(loom_context *ctx, loom_fe_tensor_dump *td);
void loom_fe_tensor_dump_end(loom_context *ctx, loom_fe_tensor_dump *td);

/* ---- context.c ---- */
/* Records an error unless one is recorded: "file:line: op: message". Returns the context's
 * first error (code, unless an earlier one stands), so a returned status always matches
 * loom_context_error and its message: an OOM in an early op is not reported as the
 * INVALID_ARGUMENT of the NULL it left behind. */
loom_status loom_fe_error(loom_context *ctx, loom_status code, const char *file, int line,
                          const char *op, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* The in-use guard. A context is used by one thread at a time; a call that finds another
 * thread inside one of its calls fails with BUSY instead of corrupting it. Every public
 * function taking a context or a handle starts with LOOM_FE_USE(ctx, op, failure value): the
 * context is claimed for the calling thread until the function returns (calls nested on that
 * thread pass). A refused call prints one line to stderr and returns the failure value; it
 * cannot record an error in a context another thread is changing, so the thread inside
 * records "used from two threads at once" when its outermost call returns. A NULL ctx passes
 * (the function's own check reports it). Costs an atomic exchange a call. */
typedef struct {
    loom_context *ctx; /* NULL: nothing claimed */
} loom_fe_use;
bool loom_fe_use_begin(loom_fe_use *u, loom_context *ctx, const char *op);
void loom_fe_use_end(loom_fe_use *u);
#define LOOM_FE_USE(ctx, op, ...)                                                              \
    loom_fe_use loom_fe_use_ __attribute__((cleanup(loom_fe_use_end)));                        \
    if (!loom_fe_use_begin(&loom_fe_use_, (ctx), (op)))                                        \
    return __VA_ARGS__

/* The context a handle belongs to, or NULL when none is alive under its id. */
loom_context *loom_fe_handle_context(const loom_tensor *h);

/* ---- step.c ---- */
/* False after recording an error when the step's trace already holds ctx->max_graph_nodes
 * nodes: what a loop that forgets loom_mark_step builds (the message says so and names the
 * source line most of the nodes came from). Called before each node is recorded. */
bool loom_fe_graph_room(loom_context *ctx, const char *file, int line, const char *op);

/* ---- tensor.c ---- */
/* t's dtype, rank and shape (LOOM_MAX_RANK entries), for an op builder: false with the
 * context's error set when t is NULL (named `what`) or not a live tensor of ctx. */
bool loom_fe_type_of(loom_context *ctx, loom_tensor *t, const char *what, const char *file,
                     int line, const char *op, loom_dtype *dt, int32_t *rank, int64_t *shape);
/* *axis (negative counts from the end) as an axis in [0, rank), or false with an error. */
bool loom_fe_norm_axis(loom_context *ctx, int32_t *axis, int32_t rank, const char *file, int line,
                       const char *op);
/* The slot behind a handle of ctx, or NULL after recording STALE_HANDLE/INVALID_ARGUMENT
 * (naming op and the caller's location). */
loom_fe_tensor *loom_fe_tensor_get(loom_context *ctx, const loom_tensor *h, const char *file,
                                   int line, const char *op);
/* A new slot (refs 0, not step-owned); -1 on out-of-memory. */
int32_t loom_fe_tensor_new(loom_context *ctx);
void loom_fe_tensor_free(loom_context *ctx, int32_t slot);
loom_tensor *loom_fe_handle(const loom_context *ctx, int32_t slot);
/* The trace node holding t's value in the current step, adding an INPUT node for a computed
 * tensor; -1 after recording an error. */
int32_t loom_fe_tensor_node(loom_context *ctx, int32_t slot, const char *file, int line,
                            const char *op);
/* Records op opc on n tensors (at most LOOM_FE_RECORD_MAX) with attrs, as the public ops do
 * (autocast tag, inference errors reported as op's at file:line): its result, or NULL. */
enum { LOOM_FE_RECORD_MAX = 8 };
loom_tensor *loom_fe_record_op(loom_context *ctx, loom_ir_op opc, int32_t n,
                               loom_tensor *const *operand, loom_ir_attrs attrs, const char *file,
                               int line, const char *op);
/* Makes a step-owned op result for trace node `node`; NULL after recording an error. */
loom_tensor *loom_fe_result(loom_context *ctx, int32_t node, const char *file, int line,
                            const char *op);

/* ---- nn.c ---- */
/* Dropout's generator key for an i64 scalar seed and a stream (loom_dropout's, which the
 * fused attention's dropout shares): NULL after recording the error, as op's. */
loom_tensor *loom_fe_dropout_key(loom_context *ctx, loom_tensor *seed, int64_t stream,
                                 const char *file, int line, const char *op);

/* ---- ops.c ---- */
/* x [..., K] times w [N, K] transposed -> [..., N], as loom_matmul(x, loom_transpose(w))
 * computes it (rows folded, (w x^T)^T for a large w) without recording the transpose
 * first. NULL after recording the error. */
loom_tensor *loom_fe_matmul_t(loom_context *ctx, loom_tensor *x, loom_tensor *w, const char *file,
                              int line);
/* Records conv2d(x, w) with window cv (loom_conv2d_at validates first, so that its messages
 * name the user's arguments); NULL after recording an error. */
loom_tensor *loom_fe_conv2d(loom_context *ctx, loom_tensor *x, loom_tensor *w,
                            const loom_ir_conv *cv, const char *file, int line);
/* Records max_pool2d(x) over window (kernel, stride, padding; dilation 1), validated by the
 * caller likewise. */
loom_tensor *loom_fe_max_pool2d(loom_context *ctx, loom_tensor *x, const loom_ir_conv *window,
                                const char *file, int line);

/* ---- data.c ---- */
/* Formats a message into err (err_size bytes; nothing when err is NULL or err_size 0), for
 * the context-free loaders that report through a caller's buffer. Returns s. */
loom_status loom_fe_set_err(char *err, size_t err_size, loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- autograd.c ---- */
/* Whether trace node `node` was marked by loom_detach in the current step. */
bool loom_fe_is_detached(const loom_context *ctx, int32_t node);
/* For `loom-ir ops`: whether loom_backward differentiates node `subject` of g (a one-op
 * sample, ir/samples.h). The nodes up to subject are recorded in a context of their own
 * (graph inputs as zero tensors) and subject is differentiated with respect to the float
 * inputs; nothing runs. *applies is false when there is nothing to differentiate (subject's
 * result or all its operands not float, or it has none). Errors: UNSUPPORTED (no gradient rule: the
 * message says which), OUT_OF_MEMORY, INVALID_ARGUMENT, with the message in d. */
loom_status loom_fe_vjp_probe(const loom_ir_graph *g, int32_t subject, bool *applies,
                              loom_ir_diag *d);

/* ---- optim.c ---- */
/* Checks that found_inf (not NULL) is one float or bool element; records STALE_HANDLE or
 * INVALID_ARGUMENT (naming op) otherwise and returns the context's error. */
loom_status loom_fe_check_found_inf(loom_context *ctx, loom_tensor *found_inf, const char *op);
/* A checked found_inf as a bool scalar, true when non-zero or NaN (PyTorch's
 * `if (*found_inf)`); NULL after recording an error. */
loom_tensor *loom_fe_found_inf_flag(loom_context *ctx, loom_tensor *found_inf);

/* ---- build_executable.c ---- */
/* Builds the executable of ctx->cut (hash: its hash; prefix: its dumps' "stepNNNNNN-<hash>")
 * with the context's device's target, or the fallback target where that one answers
 * UNSUPPORTED (counted in Fallbacks, one note on stderr). Errors from the target, with the
 * message in d. */
loom_status loom_fe_build_executable(loom_context *ctx, uint64_t hash, const char *prefix,
                                     loom_rt_executable **out_exe, loom_ir_diag *d);

/* Waits for the step in flight of every live context (dist.c: a barrier or finalize must not
 * meet a step's collectives on the stream thread). Errors are recorded in each context. */
void loom_fe_finish_all_inflight(void);

/* LOOM_DEBUG (debug_report.c): a read of t that forced the pending step to run early, printed
 * once per source line of the tensor; and, at destroy, a summary of the compiles after the
 * first LOOM_FE_DEBUG_WARMUP steps, forced reads and interpreter fallbacks. */
#define LOOM_FE_DEBUG_WARMUP 3
void loom_fe_debug_forced_read(loom_context *ctx, const loom_fe_tensor *t);
void loom_fe_debug_summary(const loom_context *ctx);

/* On a cache miss for cut while near graphs are cached: records and (LOOM_DEBUG) prints
 * why the step recompiled (recompile.c). */
loom_status loom_fe_explain_recompile(loom_context *ctx, const loom_ir_graph *cut);



/* ---- step.c ---- */
/* Computes the given tensors (slots) now: cuts their graph from the trace, looks it up in
 * the cache (building on a miss), runs it and stores the results in the tensors. whole_step
 * (mark_step only: every pending value is computed) lets an assigned tensor be written into
 * its own buffer; a partial compute (a read, a save) gives it a new buffer instead, since ops
 * still pending may read the old value from the old one. */
loom_status loom_fe_compute(loom_context *ctx, int32_t n, const int32_t *slots, bool whole_step);
/* Ends the current step: frees dead op results, releases the trace's inputs. */
void loom_fe_end_step(loom_context *ctx);
/* Waits for the step in flight, releases what it held and, if it failed, records its error
 * and takes the values it was to produce from their tensors. */
loom_status loom_fe_finish_inflight(loom_context *ctx);

#endif
