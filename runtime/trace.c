/* The Chrome trace: see trace.h. */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime.h"
#include "trace.h"

struct loom_rt_trace {
    loom_allocator alloc;
    pthread_mutex_t mu;
    loom_ir_sbuf events; /* ",\n{...}" per event */
    int64_t n_events, dropped;
    int64_t t_origin; /* loom_rt_now_ns at open: the trace starts at 0 */
    int32_t pid;
    char *path;
};

loom_status loom_rt_trace_open(const char *path, int32_t pid, const loom_allocator *a,
                               loom_rt_trace **out, loom_ir_diag *d) {
    if (out)
        *out = NULL;
    if (!path || !*path || !a || !out)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "trace: %s",
                                !path || !*path ? "no file name" : "NULL argument");
    loom_rt_trace *t = loom_ir_alloc(a, sizeof *t);
    size_t n = strlen(path) + 1;
    char *p = loom_ir_alloc(a, n);
    if (!t || !p) {
        loom_ir_free(a, t, sizeof *t);
        loom_ir_free(a, p, n);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "trace: out of memory");
    }
    memset(t, 0, sizeof *t);
    memcpy(p, path, n);
    t->alloc = *a;
    t->path = p;
    t->pid = pid;
    t->t_origin = loom_rt_now_ns();
    pthread_mutex_init(&t->mu, NULL);
    loom_ir_sbuf_init(&t->events, &t->alloc);
    *out = t;
    return LOOM_OK;
}

void loom_rt_trace_event(loom_rt_trace *t, const char *cat, const char *name, int64_t t0_ns,
                         int64_t t1_ns, const char *args) {
    if (!t)
        return;
    static _Thread_local long tid; /* asked of the kernel once per thread */
    if (!tid)
        tid = syscall(SYS_gettid);
    pthread_mutex_lock(&t->mu);
    if (t->n_events >= LOOM_RT_TRACE_MAX_EVENTS) {
        t->dropped++;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    loom_ir_writer w = {.write = loom_ir_sbuf_write, .ud = &t->events};
    loom_ir_writer_printf(&w, "%s\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", t->n_events ? "," : "",
                          cat);
    loom_rt_json_string(&w, name);
    /* microseconds, as the format wants; ns precision kept in the fraction */
    loom_ir_writer_printf(&w, ",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%ld",
                          (double)(t0_ns - t->t_origin) / 1e3,
                          (double)(t1_ns > t0_ns ? t1_ns - t0_ns : 0) / 1e3, (int)t->pid, tid);
    if (args && *args)
        loom_ir_writer_printf(&w, ",\"args\":{%s}", args);
    loom_ir_writer_puts(&w, "}");
    loom_ir_writer_flush(&w);
    t->n_events++;
    pthread_mutex_unlock(&t->mu);
}

loom_status loom_rt_trace_close(loom_rt_trace *t, loom_ir_diag *d) {
    if (!t)
        return LOOM_OK;
    loom_ir_sbuf out;
    loom_ir_sbuf_init(&out, &t->alloc);
    loom_ir_sbuf_printf(&out, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    if (t->events.len)
        loom_ir_sbuf_append(&out, t->events.data, t->events.len);
    if (t->dropped)
        loom_ir_sbuf_printf(&out,
                            "%s\n{\"ph\":\"i\",\"s\":\"g\",\"name\":\"%" PRId64
                            " later events dropped (limit %d)\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}",
                            t->n_events ? "," : "", t->dropped, LOOM_RT_TRACE_MAX_EVENTS,
                            (double)(loom_rt_now_ns() - t->t_origin) / 1e3, (int)t->pid);
    loom_ir_sbuf_printf(&out, "\n]}\n");
    loom_status st = out.oom || t->events.oom
                         ? loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                            "trace: out of memory writing %s", t->path)
                         : loom_ir_write_file_atomic(t->path, out.data, out.len, d);
    loom_ir_sbuf_deinit(&out);
    loom_ir_sbuf_deinit(&t->events);
    pthread_mutex_destroy(&t->mu);
    loom_allocator a = t->alloc;
    loom_ir_free(&a, t->path, strlen(t->path) + 1);
    loom_ir_free(&a, t, sizeof *t);
    return st;
}
