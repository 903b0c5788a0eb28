/* Loom: a compiler-style lazy-tensor runtime.
 *
 * Tutorial
 * --------
 *   loom_context *ctx = NULL;
 *   if (loom_context_create(NULL, &ctx) != LOOM_OK) return 1;      // device "npu:0"
 *   float xs[6] = {1, 2, 3, 4, 5, 6};
 *   loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, xs);
 *   loom_tensor *y = loom_relu(ctx, loom_add(ctx, x, x));           // recorded, not computed
 *   loom_tensor_retain(y);                                          // keep y past the step
 *   if (loom_mark_step(ctx) != LOOM_OK)                             // compile (cached) + run
 *       fprintf(stderr, "%s\n", loom_context_error_message(ctx));
 *   float out[6];
 *   loom_tensor_read(ctx, y, out, sizeof out);                      // waits for the value
 *   loom_tensor_release(y);
 *   loom_context_destroy(ctx);
 *
 * Ownership
 *   - `*_create` gives the caller an object to `*_destroy`. Destroy/release accept NULL.
 *   - Op results (`loom_add`, ...) are step-scoped: they belong to the current step and die
 *     at the next `loom_mark_step` unless `loom_tensor_retain`ed, so nested expressions
 *     leak nothing. Tensors made by `loom_tensor_from_host` (and nn.h's parameters) are
 *     long-lived: the caller owns one reference and releases it.
 *   - Using a handle after it died is reported as LOOM_STATUS_STALE_HANDLE, never undefined
 *     behaviour (handles are checked, generation-counted indices, not raw pointers).
 *
 * Errors
 *   - Fallible functions return a loom_status (LOOM_OK == 0).
 *   - Op builders return NULL on failure and record the error in the context. A NULL
 *     operand makes an op return NULL without overwriting the first error, so a whole
 *     expression is checked once. The context keeps the first error (code and a message
 *     naming the user's file:line, the op, the shapes and dtypes) until
 *     `loom_context_clear_error`; the context stays usable meanwhile.
 *   - Loom never aborts or exits on bad input.
 *
 * Thread-safety
 *   A context and its tensors are used by one thread at a time. Distinct contexts are
 *   independent and may be used from different threads concurrently. A call that finds
 *   another thread inside a call of the same context (through the context, a tensor, an
 *   optimizer or a grad scaler of it) does nothing and fails with LOOM_STATUS_BUSY (NULL for
 *   ops, nothing for void functions), printing one line to stderr; the thread inside then
 *   records BUSY as the context's error, "the context was used from two threads at once".
 *   The error getters (loom_context_error, loom_metric_value, ...) are not guarded.
 */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LOOM_BUILDING) && defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

/* Maximum tensor rank. */
#define LOOM_MAX_RANK 8

/* ---- status ---------------------------------------------------------------------------- */

typedef enum loom_status {
#define LOOM_STATUS(e, v, d) LOOM_STATUS_##e = v,
#include "loom/status.def"
#undef LOOM_STATUS
    LOOM_STATUS_COUNT_
} loom_status;
#define LOOM_OK LOOM_STATUS_OK

/* The status's name ("INVALID_ARGUMENT"); never NULL, "UNKNOWN" for values out of range. */
LOOM_API const char *loom_status_name(loom_status s);
/* One sentence on what the status means and what to do next; never NULL. */
LOOM_API const char *loom_status_description(loom_status s);

/* ---- dtypes ---------------------------------------------------------------------------- */

typedef enum loom_dtype {
#define LOOM_DTYPE(e, n, sz, f, i) LOOM_DTYPE_##e,
#include "loom/dtypes.def"
#undef LOOM_DTYPE
    LOOM_DTYPE_COUNT_
} loom_dtype;

/* Short name ("f32", "bf16"); "?" when out of range. */
LOOM_API const char *loom_dtype_name(loom_dtype dt);
/* Bytes per element; 0 when out of range. */
LOOM_API size_t loom_dtype_size(loom_dtype dt);

/* ---- allocator ------------------------------------------------------------------------- */

/* One-function allocator (as Lua's lua_Alloc): `fn(ud, ptr, old_size, new_size)`.
 * new_size == 0 frees ptr and returns NULL; otherwise behaves as realloc (ptr may be NULL
 * with old_size 0) and returns NULL on failure, leaving ptr untouched. Loom always passes
 * the exact old size. Every host allocation of a context, its graphs and its device memory
 * pool goes through it. */
typedef struct loom_allocator {
    void *(*fn)(void *ud, void *ptr, size_t old_size, size_t new_size);
    void *ud;
} loom_allocator;

/* The process allocator (malloc/realloc/free). */
LOOM_API loom_allocator loom_allocator_system(void);

/* ---- context --------------------------------------------------------------------------- */

typedef struct loom_context loom_context;
typedef struct loom_tensor loom_tensor;

typedef struct loom_context_options {
    loom_allocator allocator; /* default: loom_allocator_system() */
    const char *device;       /* "npu:N"; NULL (default): "npu:<local rank>" under
                                 loom_dist_init (loom/dist.h), else "npu:0" */
    bool eager;               /* run every step on the reference interpreter (LOOM_EAGER=1) */
    const char *dump_dir;     /* write every graph cut by mark_step here (LOOM_DUMP) */
    int32_t num_threads;      /* the device's threads; 0: LOOM_NUM_THREADS, else all cores
                                 (cores / local size under loom_dist_init) */
    bool sync;                /* mark_step waits for the step to finish (LOOM_SYNC=1) */
    const char *cache_dir;    /* compiled code cache: NULL: LOOM_CACHE_DIR, else
                                 $XDG_CACHE_HOME/loom or ~/.cache/loom; "": no disk cache */
    bool profile;             /* time every compiled kernel and print the slowest to stderr
                                 at destroy (LOOM_PROFILE=1; loom_profile_report) */
    bool debug;               /* LOOM_DEBUG=1: warn on stderr, once per distinct cause, when a
                                 step recompiles a graph near one already compiled, naming
                                 what differs (loom_recompile_report); report each compile
                                 after a 3-step warm-up and reads that forced a step early;
                                 a summary at destroy */
    const char *trace_path;   /* write a Chrome trace (Perfetto) of what Loom did here at
                                 destroy (LOOM_TRACE=<file.json>): tracing, passes, compiles
                                 per module and thread, disk-cache loads, steps, kernels,
                                 transfers, collectives; NULL: none */
    bool perf_map;            /* LOOM_PERF_MAP=1: append every compiled kernel's address, size
                                 and name (as the profile names it) to /tmp/perf-<pid>.map,
                                 so `perf report` names Loom's kernels instead of showing
                                 bare addresses */
    bool perf_jitdump;        /* LOOM_PERF_MAP=jitdump: the map, and the kernels' code into
                                 /tmp/jit-<pid>.dump for `perf inject --jit`, so that
                                 `perf annotate` shows their hot instructions (record with
                                 `perf record -k mono`) */
    double allreduce_bucket_mb; /* gradient all-reduces are reduced in buckets of at least
                                   this many MB (loom/dist.h); 0: LOOM_ALLREDUCE_BUCKET_MB,
                                   else 25 (DDP's); negative: one bucket per all-reduce (as
                                   LOOM_ALLREDUCE_BUCKET_MB=0); INFINITY: one per dtype */
    int64_t max_graph_nodes;  /* the most nodes a step's graph may hold: past it an op fails
                                 with an error saying a loom_mark_step is probably missing in
                                 a loop (and where most nodes came from), before the graph
                                 exhausts memory; 0: LOOM_MAX_GRAPH_NODES, else 2,000,000 */
    double device_memory_mb;  /* the device's memory cap: an allocation past it fails with
                                 OUT_OF_MEMORY (a step's error then gives the plan's memory
                                 report) instead of the process being killed; 0:
                                 LOOM_DEVICE_MEMORY_MB, else no cap */
    bool poison;              /* LOOM_POISON=1, for debugging (slow): fill every new device
                                 buffer, every freed one and each step's scratch with 0xff
                                 bytes (NaN, -1) before use, and hold freed blocks back from
                                 reuse, so a kernel that reads memory it did not write, or a
                                 buffer after its last use, sees NaN instead of the last step's
                                 values */
} loom_context_options;

/* Fills *opts with defaults, then applies the environment (LOOM_EAGER, LOOM_DUMP,
 * LOOM_SYNC, LOOM_PROFILE, LOOM_DEBUG, LOOM_TRACE, LOOM_PERF_MAP, LOOM_POISON; num_threads 0
 * and cache_dir NULL leave LOOM_NUM_THREADS and LOOM_CACHE_DIR to be read when the context is
 * created). A context calls its allocator only from the thread using the context (steps that
 * would allocate while running, such as the interpreter's, run on that thread); one allocator
 * shared by contexts used from several threads must be thread-safe. */
LOOM_API void loom_context_options_init(loom_context_options *opts);

/* Creates a context. opts may be NULL (defaults). On success *out_ctx is owned by the
 * caller. Errors: INVALID_ARGUMENT (out_ctx NULL, unknown device, a negative num_threads,
 * max_graph_nodes or device_memory_mb, or LOOM_NUM_THREADS, LOOM_MAX_GRAPH_NODES or
 * LOOM_DEVICE_MEMORY_MB set to something else than a positive number: the reason is
 * printed on stderr, there being no context to hold it), OUT_OF_MEMORY. */
LOOM_API loom_status loom_context_create(const loom_context_options *opts,
                                         loom_context **out_ctx);
/* Destroys the context, its tensors (live handles become stale) and its device memory.
 * Accepts NULL. */
LOOM_API void loom_context_destroy(loom_context *ctx);

/* The first error recorded since the last clear (LOOM_OK if none). NULL ctx: INVALID_ARGUMENT. */
LOOM_API loom_status loom_context_error(const loom_context *ctx);
/* Its message ("file.c:12: matmul: inner dimensions differ: f32[2,3] x f32[4,5]"), "" if
 * none. Borrowed: valid until the next clear or the context's destruction. */
LOOM_API const char *loom_context_error_message(const loom_context *ctx);
/* Forgets the recorded error. Accepts NULL. */
LOOM_API void loom_context_clear_error(loom_context *ctx);

/* Number of the current step (0 before the first loom_mark_step). */
LOOM_API int64_t loom_context_step(const loom_context *ctx);

/* Computes every live tensor with pending IR as one graph: the graph is hashed and looked
 * up in the executable cache, built on a miss, and launched on the device's stream: it
 * returns while the step runs (unless LOOM_SYNC), and reads wait for it. One step is in
 * flight at a time: mark_step first waits for the previous one. Then the step's results
 * that were not retained die. Returns the first error recorded since the last clear if
 * there is one (including a failure of the previous step while it ran; the valid part of
 * this step is still launched), else LOOM_OK.
 * Errors: INVALID_ARGUMENT (NULL), OUT_OF_MEMORY, DEVICE_ERROR. */
LOOM_API loom_status loom_mark_step(loom_context *ctx);

/* Compiles the step loom_mark_step would run now (every live tensor with pending IR, as
 * one graph), or finds it in the cache, without running it: the step stays pending, and the
 * next loom_mark_step runs that executable without compiling again (unless more ops are
 * recorded first, which makes another graph). loom_memory_report then describes it, so the
 * planned peak is known before anything has run. Nothing pending: nothing is done. Returns
 * the first error recorded since the last clear, else LOOM_OK.
 * Errors: INVALID_ARGUMENT (NULL), OUT_OF_MEMORY, the build's errors (recorded). */
LOOM_API loom_status loom_compile_step(loom_context *ctx);

/* Waits until every step launched so far has finished. Returns the first error of a step
 * that failed while running (also recorded as the context's error), else LOOM_OK. */
LOOM_API loom_status loom_context_sync(loom_context *ctx);

/* ---- scopes ---------------------------------------------------------------------------- */

/* Names the ops recorded from now on by the module they belong to, as PyTorch's module paths
 * do: scopes nest, their names joined with '.'.
 *
 *   loom_scope_push(ctx, "layer1");
 *   loom_scope_push(ctx, "0.conv1");     // the scope is now "layer1.0.conv1"
 *   y = loom_conv2d(ctx, x, w, ...);     // its node: layer1.0.conv1 (model.c:161) conv2d ...
 *   loom_scope_pop(ctx);
 *   loom_scope_pop(ctx);
 *
 * Every node carries the scope it was recorded in beside its source line, and autograd gives
 * the nodes of its gradient the same scope, marked backward ("layer1.0.conv1.grad"). Dumps
 * (loc("model.c":161, scope = "layer1.0.conv1")), loom-ir, the profile, the trace, the memory
 * report and error messages print it. A scope is not part of the graph's hash: pushing scopes
 * or renaming them never recompiles (so, as with source lines, the profile and the memory
 * report of a cached executable name the scopes of the graph it was compiled from).
 * Tensors remember the scope they were made in (parameters made under "layer1.0.conv1" name
 * their step inputs so).
 * Errors (recorded in the context): INVALID_ARGUMENT (NULL ctx; a NULL or empty name, or one
 * with a control byte; more than LOOM_SCOPE_MAX_DEPTH open; a joined name longer than
 * LOOM_SCOPE_MAX_LEN bytes; a pop with none open), OUT_OF_MEMORY. */
#define LOOM_SCOPE_MAX_DEPTH 64
#define LOOM_SCOPE_MAX_LEN 1023
LOOM_API loom_status loom_scope_push(loom_context *ctx, const char *name);
LOOM_API loom_status loom_scope_pop(loom_context *ctx);
/* The scope open now ("layer1.0.conv1"), "" when none is (or ctx is NULL). Valid until the
 * context is destroyed. */
LOOM_API const char *loom_scope_current(const loom_context *ctx);

/* ---- tensors --------------------------------------------------------------------------- */

/* A long-lived device tensor holding a copy of `data` (rank*shape elements of dtype, packed
 * row-major; f16/bf16 as 16-bit patterns, bool as one byte 0/1). The caller owns one
 * reference. Returns NULL and records INVALID_ARGUMENT (bad dtype/rank/extent, NULL data)
 * or OUT_OF_MEMORY. Counted as TransferToDevice. */
LOOM_API loom_tensor *loom_tensor_from_host_at(loom_context *ctx, loom_dtype dtype,
                                               int32_t rank, const int64_t *shape,
                                               const void *data, const char *file, int line);
#define loom_tensor_from_host(...) loom_tensor_from_host_at(__VA_ARGS__, __FILE__, __LINE__)

/* Copies the tensor's value into dst (size bytes, exactly the tensor's byte size),
 * computing it first if it is pending (only what it needs). Errors: INVALID_ARGUMENT
 * (NULL, size mismatch), STALE_HANDLE, OUT_OF_MEMORY, DEVICE_ERROR. */
LOOM_API loom_status loom_tensor_read(loom_context *ctx, loom_tensor *t, void *dst,
                                      size_t size);

/* Adds a reference: a step-scoped tensor then survives mark_step. NULL is ignored. A stale
 * handle is ignored and recorded as STALE_HANDLE in its context when that still exists. */
LOOM_API void loom_tensor_retain(loom_tensor *t);
/* Drops a reference; the tensor dies when no reference and no step holds it. NULL is
 * ignored; a stale handle is recorded as STALE_HANDLE. */
LOOM_API void loom_tensor_release(loom_tensor *t);

/* Gives dst, a long-lived tensor (from loom_tensor_from_host or a retained result of an
 * earlier step), the value of `value` as of the next loom_mark_step, which writes it into
 * dst's own device buffer (buffer donation: no new allocation; optimizers update
 * parameters and state this way). Ops recorded after the assignment that read dst see the
 * new value; ops recorded before it read the old one. dst and value need equal dtypes and
 * shapes. Errors (recorded, returned): INVALID_ARGUMENT (NULL, a step-scoped dst, type
 * mismatch), STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_status loom_assign_at(loom_context *ctx, loom_tensor *dst, loom_tensor *value,
                                    const char *file, int line);
#define loom_assign(...) loom_assign_at(__VA_ARGS__, __FILE__, __LINE__)

/* Shape queries. They return LOOM_STATUS_STALE_HANDLE / INVALID_ARGUMENT on bad handles. */
LOOM_API loom_status loom_tensor_dtype(const loom_tensor *t, loom_dtype *out_dtype);
LOOM_API loom_status loom_tensor_rank(const loom_tensor *t, int32_t *out_rank);
/* Writes rank extents into out_shape (room for LOOM_MAX_RANK). */
LOOM_API loom_status loom_tensor_shape(const loom_tensor *t, int64_t *out_shape);
LOOM_API loom_status loom_tensor_numel(const loom_tensor *t, int64_t *out_numel);

/* ---- ops ------------------------------------------------------------------------------- *
 * Every op builder validates its operands, records one or more IR nodes (computing
 * nothing) and returns a step-scoped tensor, or NULL with the error recorded in ctx.
 * The `_at` forms take the caller's source location; each macro `loom_x(ctx, ...)` forwards
 * its arguments to `loom_x_at` and appends __FILE__/__LINE__, which then appear in IR dumps
 * and error messages (the macros are variadic so that compound literals such as
 * `(int64_t[]){2, 3}` pass through as one argument).
 * Binary elementwise ops broadcast numpy-style and require equal dtypes.             */

/* A tensor of `shape` filled with `value` (a constant in the graph: it is hashed, so
 * values that change per step belong in loom_tensor_from_host). */
LOOM_API loom_tensor *loom_full_at(loom_context *ctx, loom_dtype dtype, int32_t rank,
                                   const int64_t *shape, double value, const char *file,
                                   int line);
#define loom_full(...) loom_full_at(__VA_ARGS__, __FILE__, __LINE__)
/* A rank-0 constant. */
#define loom_scalar(ctx, dt, v) loom_full_at((ctx), (dt), 0, NULL, (v), __FILE__, __LINE__)

#define LOOM_UNARY_OPS(X)                                                                          \
    X(neg)                                                                                         \
    X(abs) X(exp) X(log) X(sqrt) X(rsqrt) X(tanh) X(sigmoid) X(relu) X(gelu) X(gelu_tanh)          \
        X(isfinite)
#define LOOM_BINARY_OPS(X)                                                                    \
    X(add) X(sub) X(mul) X(div) X(pow) X(maximum) X(minimum)                                  \
    X(eq) X(ne) X(lt) X(le) X(gt) X(ge)

#define LOOM_DECLARE_UNARY_(name)                                                             \
    LOOM_API loom_tensor *loom_##name##_at(loom_context *ctx, loom_tensor *a,                 \
                                           const char *file, int line);
#define LOOM_DECLARE_BINARY_(name)                                                            \
    LOOM_API loom_tensor *loom_##name##_at(loom_context *ctx, loom_tensor *a, loom_tensor *b, \
                                           const char *file, int line);
LOOM_UNARY_OPS(LOOM_DECLARE_UNARY_)
LOOM_BINARY_OPS(LOOM_DECLARE_BINARY_)
#undef LOOM_DECLARE_UNARY_
#undef LOOM_DECLARE_BINARY_

/* Elementwise unary: neg, abs, relu accept any numeric dtype; exp, log, sqrt, rsqrt, tanh,
 * sigmoid, gelu (the erf form, PyTorch's default) and gelu_tanh (PyTorch's
 * gelu(approximate="tanh"), GPT-2's) need a float dtype; isfinite gives bool. */
#define loom_neg(...) loom_neg_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_abs(...) loom_abs_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_exp(...) loom_exp_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_log(...) loom_log_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_sqrt(...) loom_sqrt_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_rsqrt(...) loom_rsqrt_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_tanh(...) loom_tanh_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_sigmoid(...) loom_sigmoid_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_relu(...) loom_relu_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_gelu(...) loom_gelu_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_gelu_tanh(...) loom_gelu_tanh_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_isfinite(...) loom_isfinite_at(__VA_ARGS__, __FILE__, __LINE__)
/* Elementwise binary arithmetic (numeric; pow needs float) and comparisons (bool result). */
#define loom_add(...) loom_add_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_sub(...) loom_sub_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_mul(...) loom_mul_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_div(...) loom_div_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_pow(...) loom_pow_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_maximum(...) loom_maximum_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_minimum(...) loom_minimum_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_eq(...) loom_eq_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_ne(...) loom_ne_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_lt(...) loom_lt_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_le(...) loom_le_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_gt(...) loom_gt_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_ge(...) loom_ge_at(__VA_ARGS__, __FILE__, __LINE__)

/* cond ? a : b elementwise; cond is bool; a and b have equal dtypes; all three broadcast. */
LOOM_API loom_tensor *loom_select_at(loom_context *ctx, loom_tensor *cond, loom_tensor *a,
                                     loom_tensor *b, const char *file, int line);
#define loom_select(...) loom_select_at(__VA_ARGS__, __FILE__, __LINE__)

/* Converts to dtype (float->int truncates toward zero; ->bool is != 0; ->f16/bf16 rounds
 * to nearest even). */
LOOM_API loom_tensor *loom_cast_at(loom_context *ctx, loom_tensor *a, loom_dtype dtype,
                                   const char *file, int line);
#define loom_cast(...) loom_cast_at(__VA_ARGS__, __FILE__, __LINE__)

/* Broadcasts a to `shape` by numpy rules (a's dims align right; each is 1 or equal). */
LOOM_API loom_tensor *loom_broadcast_at(loom_context *ctx, loom_tensor *a, int32_t rank,
                                        const int64_t *shape, const char *file, int line);
#define loom_broadcast(...) loom_broadcast_at(__VA_ARGS__, __FILE__, __LINE__)

/* Reshapes to `shape` (same element count; at most one extent may be -1, inferred). */
LOOM_API loom_tensor *loom_reshape_at(loom_context *ctx, loom_tensor *a, int32_t rank,
                                      const int64_t *shape, const char *file, int line);
#define loom_reshape(...) loom_reshape_at(__VA_ARGS__, __FILE__, __LINE__)

/* Permutes axes: result dim i is a's dim perm[i]. perm has a's rank entries. */
LOOM_API loom_tensor *loom_permute_at(loom_context *ctx, loom_tensor *a, const int32_t *perm,
                                      const char *file, int line);
#define loom_permute(...) loom_permute_at(__VA_ARGS__, __FILE__, __LINE__)
/* Swaps the last two axes (rank >= 2). */
LOOM_API loom_tensor *loom_transpose_at(loom_context *ctx, loom_tensor *a, const char *file,
                                        int line);
#define loom_transpose(...) loom_transpose_at(__VA_ARGS__, __FILE__, __LINE__)

/* Reductions over n_axes axes (negative counts from the end; n_axes == 0 means all axes).
 * keepdim keeps reduced axes as extent 1. mean needs a float dtype. */
LOOM_API loom_tensor *loom_sum_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                  const int32_t *axes, bool keepdim, const char *file, int line);
LOOM_API loom_tensor *loom_mean_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                   const int32_t *axes, bool keepdim, const char *file, int line);
LOOM_API loom_tensor *loom_max_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                  const int32_t *axes, bool keepdim, const char *file, int line);
#define loom_sum(...) loom_sum_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_mean(...) loom_mean_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_max(...) loom_max_at(__VA_ARGS__, __FILE__, __LINE__)

/* Matrix product: a [..., M, K] x b [..., K, N] -> [..., M, N]. Rank-1 operands are
 * treated as [1, K] / [K, 1] and the added axis removed, as numpy does. Batch dims
 * broadcast. Equal dtypes. */
LOOM_API loom_tensor *loom_matmul_at(loom_context *ctx, loom_tensor *a, loom_tensor *b,
                                     const char *file, int line);
#define loom_matmul(...) loom_matmul_at(__VA_ARGS__, __FILE__, __LINE__)

/* Slice: result element i (per axis) is a[start[i] + stride[i] * i]; the result has extents
 * size[] (a's rank entries each). stride may be NULL (all 1); strides are >= 1, and
 * start + stride * (size - 1) must lie inside a. Any dtype. */
LOOM_API loom_tensor *loom_slice_at(loom_context *ctx, loom_tensor *a, const int64_t *start,
                                    const int64_t *size, const int64_t *stride, const char *file,
                                    int line);
#define loom_slice(...) loom_slice_at(__VA_ARGS__, __FILE__, __LINE__)
/* Pads with `value`: low[i] elements before axis i, high[i] after, interior[i] between
 * adjacent elements (as XLA's pad). low/high may be NULL (0) and interior NULL (0); all
 * entries >= 0. Any dtype (value is converted to it). */
LOOM_API loom_tensor *loom_pad_at(loom_context *ctx, loom_tensor *a, const int64_t *low,
                                  const int64_t *high, const int64_t *interior, double value,
                                  const char *file, int line);
#define loom_pad(...) loom_pad_at(__VA_ARGS__, __FILE__, __LINE__)
/* Joins n >= 1 tensors of equal dtype and rank along `axis` (negative counts from the end);
 * every other extent must be equal. */
LOOM_API loom_tensor *loom_concat_at(loom_context *ctx, int32_t n, loom_tensor *const *ts,
                                     int32_t axis, const char *file, int line);
#define loom_concat(...) loom_concat_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.gather(x, axis, index): out[i] = x[i with its index along `axis` replaced by
 * index[i]]; index is i32 or i64 of x's rank, with x's extents on every other axis (PyTorch
 * allows smaller ones: broadcast or slice first), and out has index's shape and x's dtype.
 * An index outside [0, x's extent) is clamped into it (never read out of bounds); a constant
 * one is an error here. Differentiable in x (its gradient: scatter_add). */
LOOM_API loom_tensor *loom_gather_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                     loom_tensor *index, const char *file, int line);
#define loom_gather(...) loom_gather_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.index_select(x, axis, index) for an index of any shape, as numpy.take: x's rows
 * along `axis` at index (i32 or i64), the result x's shape with that axis replaced by
 * index's axes (an embedding: a table [V, C] at tokens [B, T] gives [B, T, C]). Indices are
 * clamped as loom_gather's. */
LOOM_API loom_tensor *loom_index_select_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                           loom_tensor *index, const char *file, int line);
#define loom_index_select(...) loom_index_select_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.scatter_add(base, axis, index, src): base with each src[i] added at (i with its
 * index along `axis` replaced by index[i]); index (i32 or i64) has src's shape and base's
 * extents on every other axis. Sums repeated indices; indices clamped as loom_gather's.
 * Differentiable in base and src. */
LOOM_API loom_tensor *loom_scatter_add_at(loom_context *ctx, loom_tensor *base, int32_t axis,
                                          loom_tensor *index, loom_tensor *src, const char *file,
                                          int line);
#define loom_scatter_add(...) loom_scatter_add_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.tril / torch.triu over the last two axes of x [..., M, N]: the elements with
 * col - row <= diagonal (tril) or >= diagonal (triu) kept, the others 0. */
LOOM_API loom_tensor *loom_tril_at(loom_context *ctx, loom_tensor *x, int64_t diagonal,
                                   const char *file, int line);
LOOM_API loom_tensor *loom_triu_at(loom_context *ctx, loom_tensor *x, int64_t diagonal,
                                   const char *file, int line);
#define loom_tril(...) loom_tril_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_triu(...) loom_triu_at(__VA_ARGS__, __FILE__, __LINE__)
/* Tensor.masked_fill: value where the bool mask (broadcast to x's shape) holds, x elsewhere
 * (-INFINITY: an attention mask before softmax). */
LOOM_API loom_tensor *loom_masked_fill_at(loom_context *ctx, loom_tensor *x, loom_tensor *mask,
                                          double value, const char *file, int line);
#define loom_masked_fill(...) loom_masked_fill_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.split with sizes: out[i] (n of them) the consecutive parts of x along axis, of
 * sizes[i] each (slices of x); the sizes sum to the axis's extent. On error every out[i]
 * is NULL. */
LOOM_API loom_status loom_split_at(loom_context *ctx, loom_tensor *x, int32_t n,
                                   const int64_t *sizes, int32_t axis, loom_tensor **out,
                                   const char *file, int line);
#define loom_split(...) loom_split_at(__VA_ARGS__, __FILE__, __LINE__)
/* torch.chunk: x along axis in parts of ceil(extent / chunks), the last smaller, so there
 * may be fewer than chunks (*out_n says how many; out has room for chunks). */
LOOM_API loom_status loom_chunk_at(loom_context *ctx, loom_tensor *x, int32_t chunks, int32_t axis,
                                   loom_tensor **out, int32_t *out_n, const char *file, int line);
#define loom_chunk(...) loom_chunk_at(__VA_ARGS__, __FILE__, __LINE__)
/* A tensor of `shape` whose element is its index along `axis` (0, 1, 2, ...), as a
 * constant of the graph. dtype numeric. */
LOOM_API loom_tensor *loom_iota_at(loom_context *ctx, loom_dtype dtype, int32_t rank,
                                   const int64_t *shape, int32_t axis, const char *file, int line);
#define loom_iota(...) loom_iota_at(__VA_ARGS__, __FILE__, __LINE__)
/* Uniform random numbers in [0, 1) of `shape` and float dtype from a counter-based
 * generator inside the graph: element i is a pure function of (seed, i) (SplitMix64 of
 * seed + (i + 1) * 0x9E3779B97F4A7C15, top 24 bits / 2^24), so the compiled step and the
 * interpreter give identical bits and a changing seed never recompiles. seed is an i64
 * scalar tensor (usually a graph input set per step). f16/bf16 results are that value
 * rounded to nearest, so values just below 1 can round to 1.0 there. */
LOOM_API loom_tensor *loom_rand_uniform_at(loom_context *ctx, loom_tensor *seed, loom_dtype dtype,
                                           int32_t rank, const int64_t *shape, const char *file,
                                           int line);
#define loom_rand_uniform(...) loom_rand_uniform_at(__VA_ARGS__, __FILE__, __LINE__)

/* ---- metrics --------------------------------------------------------------------------- *
 * Counters and timers in the spirit of PyTorch/XLA's metrics report: TraceTime,
 * CompileTime, ExecuteTime (timers, ns), CacheHit, CacheMiss, TransferToDeviceBytes,
 * TransferFromDeviceBytes, GraphNodes, ... (see loom_metrics_report for the full list).
 * CollectiveTime (a timer: each collective from its start to the end of its wait, overlap
 * with compute included, so its total can exceed the wall time) and CollectiveBytes (the
 * payload this rank reduced, received or gathered) count the collectives of the process's
 * world communicator (loom/dist.h), so every context of a process reports the same values
 * for them. */

/* The current value of a counter, or a timer's sample count; -1 if no metric has that name. */
LOOM_API int64_t loom_metric_value(const loom_context *ctx, const char *name);
/* A timer's sum of samples (ns for times, nodes for GraphNodes), or a counter's value; -1 if
 * no metric has that name. */
LOOM_API int64_t loom_metric_total(const loom_context *ctx, const char *name);

typedef enum loom_report_format {
    LOOM_REPORT_FORMAT_TEXT,
    LOOM_REPORT_FORMAT_JSON,
    LOOM_REPORT_FORMAT_COUNT_
} loom_report_format;

/* Writes the metrics report through `write` in chunks (as MLIR's print callbacks do).
 * Errors: INVALID_ARGUMENT. */
LOOM_API loom_status loom_metrics_report(const loom_context *ctx, loom_report_format format,
                                         void (*write)(const char *chunk, size_t len, void *ud),
                                         void *ud);

/* Why steps recompiled. A cache miss for a graph near one already compiled (at most a
 * quarter of its nodes differ: not a new graph such as an evaluation step) counts in the
 * Recompiles metric, and its first difference is found node by node against the nearest
 * cached graph: "step 12 recompiled: %7 matmul at train.c:88 has f32[63,784] (was
 * f32[64,784])"; a constant whose value changed is named as such ("a value that changes
 * every step defeats the cache: pass it as a tensor instead"). loom_last_recompile gives the
 * last such message ("" before any; valid until the next step). loom_recompile_report
 * writes each distinct cause (the kind of difference, its op and source line) with how many
 * steps it recompiled and its first message, as text ("Recompiles: N (M distinct causes)"
 * then a line per cause) or JSON ({"recompiles": [{"count", "first"}, ...]}).
 * Errors: INVALID_ARGUMENT. */
LOOM_API const char *loom_last_recompile(const loom_context *ctx);

/* The planned memory of the last compiled step that ran (or that loom_compile_step
 * compiled), known before it ran: "memory:
 * planned peak N bytes (X MiB) = arena A + outputs O", then the kernel where the most bytes
 * are alive and the 5 largest values alive there, one a line (bytes, node, op, type,
 * "(output)", the source line that recorded it). An out-of-memory error of a step carries
 * the same lines; the LOOM_DUMP plan and `loom-ir plan` start with it (`loom-ir plan --svg`
 * draws it). "" before any compiled step. Valid until the next step. */
LOOM_API const char *loom_memory_report(const loom_context *ctx);
LOOM_API loom_status loom_recompile_report(const loom_context *ctx, loom_report_format format,
                                           void (*write)(const char *chunk, size_t len, void *ud),
                                           void *ud);

/* Writes the kernel profile through `write` in chunks: every kernel of the context's
 * compiled steps (the interpreter's are not timed) with its time summed over all its runs
 * (the same kernel of the same compiled graph across steps), by total time, largest first.
 * Text (what LOOM_PROFILE=1 prints at loom_context_destroy): the 25 slowest, one line each
 * with rank, total ms, share of all kernels' time, calls, mean us, GFLOP/s and GB/s (from
 * the plan's flops and bytes moved, as in the LOOM_DUMP plan), idle% (the share of the
 * device threads' time in the kernel, threads x its time, that they spent not running it:
 * waiting for the last chunk, with no chunk, waking up), kind, graph hash:kernel index
 * (the plan dump's names), the root op with its type and the user's source line that
 * recorded it; then a total line comparing the kernels' time with ExecuteTime and giving
 * the threads' idle share over all kernels. JSON: {"kernel_ns", "execute_ns", "calls",
 * "thread_ns", "idle_ns", "kernels": [{"program", "index", "kind", "root", "loc", "calls",
 * "total_ns", "thread_ns", "idle_ns", "flops", "bytes"}, ...]}, every kernel (flops and
 * bytes per call). Without loom_context_options.profile nothing is timed and the list is
 * empty. Waits for the step in flight first, as loom_context_sync does (its error, if any,
 * is recorded in the context). Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
LOOM_API loom_status loom_profile_report(loom_context *ctx, loom_report_format format,
                                         void (*write)(const char *chunk, size_t len, void *ud),
                                         void *ud);

/* Device memory of the context's device: bytes in use now and the peak since creation. */
LOOM_API loom_status loom_device_memory(const loom_context *ctx, size_t *out_current,
                                        size_t *out_peak);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_LOOM_H */
