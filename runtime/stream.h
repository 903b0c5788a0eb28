/* Asynchronous execution streams: one worker thread per device running submitted jobs in
 * FIFO order, so loom_mark_step returns while the step runs and the host traces the next.
 *
 * Errors. A job returns a status and may fill the loom_ir_diag it is given. The stream keeps
 * the FIRST failure (code and message) until loom_rt_stream_wait reports and clears it.
 * Jobs still queued behind a failed job, and jobs submitted before that wait, are SKIPPED:
 * released without running. They are later steps that read what the failed step should
 * have written (parameters, optimizer state), so running them would only bury the first
 * error under garbage results. After the wait the stream runs jobs again.
 *
 * Back-pressure. At most LOOM_RT_STREAM_MAX_IN_FLIGHT jobs are submitted and not yet
 * finished (the running one included); submit blocks while that many are, so the host runs
 * at most one step ahead of the device and memory for step inputs stays bounded.
 *
 * Threads. run and release execute on the stream's thread, never concurrently with each
 * other. What they touch that the host also touches (device memory pools, buffer
 * refcounts, the context's allocator: none is thread-safe) the host must leave alone until
 * the job is known to be finished (after loom_rt_stream_wait), or guard with a lock.
 * submit and wait are for one host thread (the context's); never call them from a job (a
 * job waiting for its own stream deadlocks). */
#ifndef LOOM_RUNTIME_STREAM_H
#define LOOM_RUNTIME_STREAM_H

#include "ir/ir.h"

#define LOOM_RT_STREAM_MAX_IN_FLIGHT 2

typedef struct loom_rt_stream loom_rt_stream;

/* A job's work: returns LOOM_OK, or a failure with its message in d (d is empty on entry;
 * a failure that leaves d empty is reported as "stream job failed: <STATUS_NAME>"). */
typedef loom_status (*loom_rt_job_run_fn)(void *job, loom_ir_diag *d);
/* Frees a job: called exactly once per submitted job, after run or instead of it. */
typedef void (*loom_rt_job_release_fn)(void *job);

/* Starts the stream's thread. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY, DEVICE_ERROR
 * (the thread could not be started). */
loom_status loom_rt_stream_create(const loom_allocator *a, loom_rt_stream **out);
/* Runs (or skips, after a failure) every queued job, then stops the thread and frees the
 * stream. A failure not yet reported by wait is dropped. Accepts NULL. */
void loom_rt_stream_destroy(loom_rt_stream *stream);

/* Queues run(job) behind the jobs already submitted; blocks while the stream is full.
 * release may be NULL. The stream owns job from the call on, also when submit fails:
 * then release(job) has been called before it returns (on the calling thread).
 * Errors: INVALID_ARGUMENT (NULL stream or run). */
loom_status loom_rt_stream_submit(loom_rt_stream *stream, loom_rt_job_run_fn run, void *job,
                                  loom_rt_job_release_fn release);

/* Blocks until every submitted job has finished (run or skipped), then returns the first
 * failure since the last wait (its code; its message into d) and clears it, or LOOM_OK. */
loom_status loom_rt_stream_wait(loom_rt_stream *stream, loom_ir_diag *d);

#endif
