/* The Chrome trace (LOOM_TRACE=<file.json>): what Loom did over time, as complete events
 * ("ph":"X": name, category, start, duration, process = rank, thread) that Perfetto and
 * chrome://tracing open. Events are kept in memory and written when the trace is closed, as
 * {"traceEvents":[...]}, atomically (a crash leaves no half-written file). Categories:
 * "trace" (cutting and looking up a step), "pass", "compile" (a whole build, and each
 * codegen module on its thread), "cache" (disk-cache loads), "step" (an executable's run),
 * "kernel", "transfer" (host<->device) and "collective".
 *
 * Thread-safe: events come from the host thread, the device's stream thread and the
 * compile threads, under a mutex. At most LOOM_RT_TRACE_MAX_EVENTS are kept; later ones are
 * counted and named in a last event. */
#ifndef LOOM_RUNTIME_TRACE_H
#define LOOM_RUNTIME_TRACE_H

#include "ir/ir.h"

#define LOOM_RT_TRACE_MAX_EVENTS 2000000

typedef struct loom_rt_trace loom_rt_trace;

/* A trace to be written to path at close; pid is the process in the trace (the rank).
 * Nothing is written until then: a path that cannot be written fails at close.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
loom_status loom_rt_trace_open(const char *path, int32_t pid, const loom_allocator *a,
                               loom_rt_trace **out, loom_ir_diag *d);

/* An event of category cat named name (copied, escaped) from t0_ns to t1_ns
 * (loom_rt_now_ns), on the calling thread. args: NULL, or the body of a JSON object
 * ("\"bytes\":4096"). t may be NULL (no-op), so callers need no test. */
void loom_rt_trace_event(loom_rt_trace *t, const char *cat, const char *name, int64_t t0_ns,
                         int64_t t1_ns, const char *args);

/* Writes the file and frees t (also on failure). Accepts NULL.
 * Errors: IO_ERROR (naming the path), OUT_OF_MEMORY. */
loom_status loom_rt_trace_close(loom_rt_trace *t, loom_ir_diag *d);

#endif
