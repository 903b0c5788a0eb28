/* The kernel ABI between codegen and the runtime, the thread pool kernels run on, and the
 * program executable that runs a plan's compiled kernels. */
#ifndef LOOM_RUNTIME_KERNEL_H
#define LOOM_RUNTIME_KERNEL_H

#include "ir/plan.h"
#include "runtime.h"

/* A compiled kernel computes iterations [lo, hi) of its outer parallel loop. bufs holds the
 * base pointers of the kernel's args (in loom_ir_kernel.args order) followed by its
 * results (in .results order); each is the value's row-major contiguous data. Kernels are
 * reentrant: disjoint ranges may run concurrently on different threads. */
typedef void (*loom_rt_kernel_fn)(void *const *bufs, int64_t lo, int64_t hi);

typedef struct loom_rt_kernel {
    loom_rt_kernel_fn fn;
    int64_t extent; /* iterations of the outer loop (>= 1) */
    int64_t grain;  /* fewest iterations worth a task of their own (>= 1) */
    int64_t code_bytes; /* the size of fn's machine code; 0: not known (loom_cg_code_sizes) */
} loom_rt_kernel;

/* ---- thread pool -------------------------------------------------------------------------- */

typedef struct loom_rt_pool loom_rt_pool;

/* n_threads >= 1 (the caller's thread counts as one: n_threads - 1 workers are started).
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY, DEVICE_ERROR (thread creation failed). */
loom_status loom_rt_pool_create(int32_t n_threads, const loom_allocator *a, loom_rt_pool **out);
void loom_rt_pool_destroy(loom_rt_pool *pool);
int32_t loom_rt_pool_threads(const loom_rt_pool *pool);
/* Runs fn(ud, lo, hi) over [0, extent) split into at most n_threads contiguous chunks of at
 * least grain iterations, the caller's thread taking one; returns when all are done.
 * Not reentrant: one parallel_for at a time per pool. */
void loom_rt_pool_parallel_for(loom_rt_pool *pool, int64_t extent, int64_t grain,
                               void (*fn)(void *ud, int64_t lo, int64_t hi), void *ud);
/* The same in up to per_thread (>= 1) chunks a thread, which the threads claim as they
 * come free: a thread slowed down (its core shared with the host thread, say) then runs
 * fewer of them instead of holding the others up. Worth it where a chunk costs nothing to
 * start (elementwise kernels), not where each repacks operands (convolutions). With idle_ns
 * (not NULL), also returns there the thread time the pool's threads spent not running fn
 * between the call and its return: threads x wall time less the chunks' summed run times
 * (a thread with no chunk, one waiting for the last chunk, one still waking up), at the
 * cost of two clock reads per chunk. */
void loom_rt_pool_parallel_for_ex(loom_rt_pool *pool, int64_t extent, int64_t grain,
                                  int32_t per_thread, void (*fn)(void *ud, int64_t lo, int64_t hi),
                                  void *ud, int64_t *idle_ns);
/* The default thread count: LOOM_NUM_THREADS if set and valid, else the online cores. */
int32_t loom_rt_default_threads(void);
/* The same for one of `sharers` processes sharing the machine (the local ranks of a
 * distributed job): LOOM_NUM_THREADS if set and valid, else online cores / sharers, at
 * least 1. */
int32_t loom_rt_default_threads_shared(int32_t sharers);

/* ---- program executables ------------------------------------------------------------------ */

/* An executable running plan's kernels in order with a scratch arena of
 * plan->arena_bytes, then the plan's copies. Takes copies of g and plan. kernels has
 * plan->n_kernels entries. code_owner (may be NULL) keeps the kernels' code alive and is
 * released with release_code(code_owner) when the executable is destroyed (also when
 * creation fails). pool is borrowed and must outlive the executable.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
loom_status loom_rt_program_create(const loom_ir_graph *g, uint64_t hash, const loom_ir_plan *plan,
                                   const loom_rt_kernel *kernels, void *code_owner,
                                   void (*release_code)(void *code_owner), loom_rt_pool *pool,
                                   const loom_allocator *a, loom_rt_executable **out_exe);

/* Allocates a program executable's scratch arena on dev now, on the calling thread. A run
 * otherwise allocates it on its first use, on whichever thread runs it, and device pools
 * (and the context's allocator) are not thread-safe: call this before handing the
 * executable to a stream. The arena is kept until destroy, or until a run whose outputs
 * live on another device replaces it. Runs of one executable are sequential: they share
 * the arena (an overlapping run fails with INTERNAL). Executables of other kinds: no-op.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY, INTERNAL (the executable is running). */
loom_status loom_rt_program_prepare(loom_rt_executable *exe, loom_rt_device *dev,
                                    loom_ir_diag *d);

/* Times every kernel of a program executable from now on, each run adding to new entries
 * of prof (one per kernel, owned by prof, so they outlive exe) described from plan and g
 * (the plan exe was created from and its graph): kind, root op, its source location, and
 * the plan's flops and bytes per call. Off (the default), a run costs one branch per
 * kernel more. Once per executable (later calls are no-ops), on the host thread, before
 * the executable is handed to a stream. Executables of other kinds: no-op.
 * Errors: INVALID_ARGUMENT (NULL, or plan does not match exe), OUT_OF_MEMORY. */
loom_status loom_rt_program_profile(loom_rt_executable *exe, loom_rt_profile *prof,
                                    const loom_ir_plan *plan, const loom_ir_graph *g);

/* Traces every kernel and collective of a program executable from now on into trace (which
 * must outlive exe): one event per kernel run, named "k3 matmul f32[64,10] train.c:88", and
 * one per collective from its start to its completion (its bytes, and the kernel it is
 * waited on before). Once per executable, on the host thread, before the executable is
 * handed to a stream. Executables of other kinds: no-op.
 * Errors: INVALID_ARGUMENT (NULL, or plan does not match exe), OUT_OF_MEMORY. */
struct loom_rt_trace;
loom_status loom_rt_program_trace(loom_rt_executable *exe, struct loom_rt_trace *trace,
                                  const loom_ir_plan *plan, const loom_ir_graph *g);

/* Calls fn once per distinct piece of exe's compiled code whose size is known
 * (loom_rt_kernel.code_bytes > 0), named as the profile names its first kernel: "loom
 * 6313aa135caee3fc:56 cast bf16[8,256,56,56] resnet_model.c:182", with " (+2 kernels sharing
 * its code)" when several kernels run it. Executables of other kinds: no calls.
 * Errors: INVALID_ARGUMENT (NULL, or plan does not match exe). */
typedef void (*loom_rt_code_fn)(void *ud, const void *code, size_t bytes, const char *name);
loom_status loom_rt_program_each_code(loom_rt_executable *exe, const loom_ir_plan *plan,
                                      const loom_ir_graph *g, loom_rt_code_fn fn, void *ud);

/* ---- perf (perf.c) ------------------------------------------------------------------------ */

/* Appends a perf map of exe's compiled code to path (the format `perf report` reads from
 * /tmp/perf-<pid>.map: "<start> <size> <name>", hex, a line per loom_rt_program_each_code).
 * The lines go out in one append (O_APPEND), so programs of several threads do not
 * interleave; the file is created when missing and never followed through a symlink.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY, IO_ERROR (message in d). */
loom_status loom_rt_program_perf_map(loom_rt_executable *exe, const loom_ir_plan *plan,
                                     const loom_ir_graph *g, const char *path, loom_ir_diag *d);
/* Where perf looks for this process's map: "/tmp/perf-<pid>.map", into buf. */
const char *loom_rt_perf_map_path(char *buf, size_t size);

/* Appends exe's compiled code, bytes and names, to this process's jitdump ("<dir>/jit-<pid>.dump",
 * perf's jitdump format; created with its header by the first call that succeeds, whose dir
 * later calls keep, and kept mapped executable so that `perf record -k mono` notes it), for
 * `perf inject --jit` to turn into symbols whose instructions `perf annotate` shows.
 * Thread-safe.
 * Errors: INVALID_ARGUMENT, IO_ERROR (message in d). */
loom_status loom_rt_program_jitdump(loom_rt_executable *exe, const loom_ir_plan *plan,
                                    const loom_ir_graph *g, const char *dir, loom_ir_diag *d);
/* Where LOOM_PERF_MAP=jitdump puts it (perf inject writes its jitted-*.so files beside it). */
#define LOOM_RT_JITDUMP_DIR "/tmp"

#endif
