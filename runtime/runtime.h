/* Loom runtime: devices and their memory pools, executables and the executable cache,
 * the reference interpreter, and metrics. Uses ir/ for graph metadata only. */
#ifndef LOOM_RUNTIME_RUNTIME_H
#define LOOM_RUNTIME_RUNTIME_H

#include "ir/ir.h"

/* ---- metrics ----------------------------------------------------------------------------- */

typedef enum loom_rt_metric {
#define LOOM_METRIC(e, name, kind, unit) LOOM_RT_METRIC_##e,
#include "metrics.def"
#undef LOOM_METRIC
    LOOM_RT_METRIC_COUNT_
} loom_rt_metric;

typedef struct loom_rt_metrics {
    int64_t count[LOOM_RT_METRIC_COUNT_]; /* counters: the sum; timers: number of samples */
    int64_t total[LOOM_RT_METRIC_COUNT_]; /* timers: sum of samples */
    int64_t min[LOOM_RT_METRIC_COUNT_], max[LOOM_RT_METRIC_COUNT_], last[LOOM_RT_METRIC_COUNT_];
} loom_rt_metrics;

void loom_rt_metrics_init(loom_rt_metrics *m);
/* Counter: adds v. Timer: records one sample v. */
void loom_rt_metrics_add(loom_rt_metrics *m, loom_rt_metric which, int64_t v);
/* Whether the metric is a timer (samples) rather than a counter. */
bool loom_rt_metric_is_timer(loom_rt_metric which);
/* Metric by its report name ("CacheHit"); LOOM_RT_METRIC_COUNT_ if none. */
loom_rt_metric loom_rt_metric_from_name(const char *name);
loom_status loom_rt_metrics_report(const loom_rt_metrics *m, loom_report_format format,
                                   loom_ir_write_fn write, void *ud);
/* Monotonic clock in nanoseconds. */
int64_t loom_rt_now_ns(void);

/* s as a JSON string, quoted (quotes, backslashes and control characters escaped). */
void loom_rt_json_string(loom_ir_writer *w, const char *s);

/* ---- kernel profile (LOOM_PROFILE) ---------------------------------------------------- */

/* One kernel of one program: its times summed over every run, and what it is. Written by
 * the program's runs (on the stream's thread), read by reports on the host thread once no
 * run is in flight. */
typedef struct loom_rt_profile_kernel {
    int64_t total_ns, calls;
    /* the pool's threads' time in the kernel (threads x total_ns), and how much of it they
     * spent not running it: waiting for the last chunk, with no chunk, waking up */
    int64_t thread_ns, idle_ns;
    double flops, bytes; /* per call: the plan's cost (bytes = its args and results once) */
    uint64_t program;    /* the program's graph hash, as in its LOOM_DUMP file names */
    int32_t index;       /* the kernel's index in the program's plan */
    char kind[16];       /* "matmul" */
    char root[LOOM_IR_TYPE_STR_MAX + 32]; /* the root node: "matmul bf16[64,576]" */
    char loc[128];                        /* its source "file.c:88" (basename), "" if unknown */
} loom_rt_profile_kernel;

/* The kernels of every program created while profiling, in blocks the profile owns (a
 * program's entries outlive it, so times of evicted programs still count). Not
 * thread-safe: blocks are added and reports made on the host thread. */
typedef struct loom_rt_profile {
    loom_allocator alloc;
    struct loom_rt_profile_block *blocks; /* newest first */
} loom_rt_profile;

void loom_rt_profile_init(loom_rt_profile *p, const loom_allocator *a);
void loom_rt_profile_deinit(loom_rt_profile *p);
/* n zeroed entries owned by p until deinit; NULL on out-of-memory (or n < 1). */
loom_rt_profile_kernel *loom_rt_profile_add(loom_rt_profile *p, int32_t n);
/* Kernels that ran, by total time (largest first; ties by program and index). Text: the
 * top `top` kernels (all if top <= 0) and a total line comparing the kernels' time with
 * execute_ns (the ExecuteTime of the same steps); JSON: every kernel. Errors:
 * OUT_OF_MEMORY (nothing written). */
loom_status loom_rt_profile_report(const loom_rt_profile *p, int64_t execute_ns, int32_t top,
                                   loom_report_format format, loom_ir_write_fn write, void *ud);

/* ---- devices ----------------------------------------------------------------------------- */

typedef struct loom_rt_device loom_rt_device;

/* How many freed blocks a device keeps for reuse, and at most how many bytes in all. */
#define LOOM_RT_DEVICE_CACHED_BLOCKS 32
#define LOOM_RT_DEVICE_CACHED_BYTES ((size_t)1 << 30)

/* A block of device memory. Refcounted: tensors sharing a value share the buffer. */
typedef struct loom_rt_buffer {
    loom_rt_device *device;
    void *data;  /* host-addressable for the built-in NPU target; 64-byte aligned there */
    void *block; /* what the NPU target allocated (data is block rounded up to 64 bytes) */
    size_t size;
    int32_t refs;
} loom_rt_buffer;

typedef struct loom_rt_device_vtable {
    loom_status (*buffer_alloc)(loom_rt_device *dev, size_t size, loom_rt_buffer **out_buf);
    void (*buffer_free)(loom_rt_device *dev, loom_rt_buffer *buf);
    /* host -> device and device -> host copies of `size` bytes at `offset` */
    loom_status (*write)(loom_rt_device *dev, loom_rt_buffer *buf, size_t offset,
                         const void *src, size_t size);
    loom_status (*read)(loom_rt_device *dev, const loom_rt_buffer *buf, size_t offset,
                        void *dst, size_t size);
    void (*destroy)(loom_rt_device *dev);
} loom_rt_device_vtable;

struct loom_rt_device {
    const loom_rt_device_vtable *vt;
    const struct loom_rt_target *target; /* its compiler (target.h); NULL if none registered */
    loom_allocator alloc;
    loom_rt_metrics *metrics; /* borrowed: transfers are counted here */
    struct loom_rt_trace *trace; /* borrowed, may be NULL: transfers are traced here */
    char name[32];            /* "npu:0" */
    int32_t index;
    size_t mem_current, mem_peak; /* bytes of buffers in use (cached blocks not counted) */
    /* Freed blocks kept for reuse, as a caching device allocator does: a step allocates
     * the same sizes every time, and fresh large blocks cost page faults on every use. */
    struct loom_rt_cached_block {
        void *block;  /* a freed buffer's block */
        size_t bytes; /* its block_bytes (device.c) */
    } cached[LOOM_RT_DEVICE_CACHED_BLOCKS];
    int32_t n_cached;
    size_t cached_bytes;
    /* Debugging (LOOM_POISON): new and freed blocks and each run's arena are filled with
     * 0xff bytes, and cached blocks are only held back (a quarantine), never reused. */
    bool poison;
    size_t mem_limit; /* buffers may hold this many bytes at most; 0: no cap */
};

/* Creates the device named `name` ("npu" or "npu:N"). Errors: INVALID_ARGUMENT (unknown
 * name; message in d), OUT_OF_MEMORY. */
loom_status loom_rt_device_create(const char *name, const loom_allocator *a,
                                  loom_rt_metrics *metrics, loom_rt_device **out_dev,
                                  loom_ir_diag *d);
void loom_rt_device_destroy(loom_rt_device *dev);
/* A new buffer with refs == 1. */
loom_status loom_rt_buffer_alloc(loom_rt_device *dev, size_t size, loom_rt_buffer **out_buf);
/* For out-of-memory messages: "" without a cap, else "; the device is capped at 1 MB
 * (device_memory_mb, LOOM_DEVICE_MEMORY_MB) and holds 0.25 MB"; returns buf. */
char *loom_rt_device_cap_note(const loom_rt_device *dev, char *buf, size_t size);
void loom_rt_buffer_retain(loom_rt_buffer *buf);
/* Frees the buffer when the last reference goes. Accepts NULL. */
void loom_rt_buffer_release(loom_rt_buffer *buf);
loom_status loom_rt_buffer_write(loom_rt_buffer *buf, const void *src, size_t size);
loom_status loom_rt_buffer_read(const loom_rt_buffer *buf, void *dst, size_t size);

/* ---- executables ------------------------------------------------------------------------- */

typedef struct loom_rt_executable loom_rt_executable;

typedef struct loom_rt_executable_vtable {
    /* inputs[i]: graph input i; outputs[o]: output o, allocated by the caller with the
     * output's byte size (it may be the same buffer as its aliased input). */
    loom_status (*run)(loom_rt_executable *exe, loom_rt_buffer *const *inputs,
                       loom_rt_buffer *const *outputs, loom_ir_diag *d);
    void (*destroy)(loom_rt_executable *exe);
} loom_rt_executable_vtable;

struct loom_rt_executable {
    const loom_rt_executable_vtable *vt;
    loom_allocator alloc;
    loom_ir_graph graph; /* owned copy: what the cache compares against */
    uint64_t hash;
    /* run() allocates from the context's allocator, which is not thread-safe: run it on
     * the host thread, never on a stream (the interpreter; compiled programs do not). */
    bool host_thread_only;
    /* The planned memory report's text (NUL-terminated, from alloc; freed by destroy), for
     * out-of-memory errors and loom_memory_report; NULL when none was made. */
    char *memory_report;
};

void loom_rt_executable_destroy(loom_rt_executable *exe);

/* Reference interpreter over plain C loops: f64 accumulation for reductions and matmul,
 * f16/bf16 computed via f32. It verifies g first (it is the oracle: correctness over
 * speed). inputs[i] points at graph input i's data, outputs[o] at output o's (which may
 * alias an input: all results are computed before any output is written). Temporaries
 * come from a. Errors: INVALID_ARGUMENT (NULL graph/allocator/buffer), VERIFY_FAILED,
 * OUT_OF_MEMORY, INTERNAL. */
loom_status loom_rt_interp_run(const loom_ir_graph *g, const loom_allocator *a,
                               const void *const *inputs, void *const *outputs,
                               loom_ir_diag *d);

/* An executable that runs g on the reference interpreter (g is copied, twice: once as the
 * graph it runs, once as exe->graph, which the cache compares and the caller may replace by
 * the graph as traced when g was derived from it). Errors:
 * INVALID_ARGUMENT, OUT_OF_MEMORY. Destroy with loom_rt_executable_destroy. */
loom_status loom_rt_interp_executable_create(const loom_ir_graph *g, uint64_t hash,
                                             const loom_allocator *a,
                                             loom_rt_executable **out_exe);

/* ---- executable cache -------------------------------------------------------------------- */

/* Bounded LRU of executables keyed by structural hash, confirmed by structural equality. */
typedef struct loom_rt_cache_entry {
    loom_rt_executable *exe;
    uint64_t last_use;
} loom_rt_cache_entry;

typedef struct loom_rt_cache {
    loom_allocator alloc;
    loom_rt_cache_entry *entries;
    int32_t n, cap, max_entries;
    uint64_t clock;
    loom_rt_metrics *metrics;
} loom_rt_cache;

void loom_rt_cache_init(loom_rt_cache *c, const loom_allocator *a, int32_t max_entries,
                        loom_rt_metrics *metrics);
void loom_rt_cache_deinit(loom_rt_cache *c);
/* The executable for a graph equal to g, or NULL. Borrowed. */
loom_rt_executable *loom_rt_cache_find(loom_rt_cache *c, const loom_ir_graph *g, uint64_t hash);
/* Takes ownership of exe (also on failure, when it is destroyed); evicts the least
 * recently used entry when full. */
loom_status loom_rt_cache_insert(loom_rt_cache *c, loom_rt_executable *exe);

#endif /* LOOM_RUNTIME_RUNTIME_H */
