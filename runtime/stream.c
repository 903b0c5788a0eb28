/* Execution streams: a bounded FIFO of jobs drained by one pthread, with the first failure
 * kept for the next wait (the contract is in stream.h). */
#include <pthread.h>
#include <string.h>

#include "stream.h"

typedef struct stream_job {
    loom_rt_job_run_fn run;
    void *job;
    loom_rt_job_release_fn release;
} stream_job;

struct loom_rt_stream {
    loom_allocator alloc;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was queued, or stop */
    pthread_cond_t space; /* a job finished: room to submit */
    pthread_cond_t idle;  /* the queue drained */
    /* ring[head] is the running (or next) job; a slot is freed when its job finishes, so
     * n counts jobs in flight, the running one included. */
    stream_job ring[LOOM_RT_STREAM_MAX_IN_FLIGHT];
    int32_t head, n;
    bool stop;
    bool failed;        /* a job failed since the last wait: skip the rest until it */
    loom_ir_diag first; /* that failure */
};

static void *stream_main(void *arg) {
    loom_rt_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->n == 0 && !s->stop)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->n == 0) /* stop, and drained */
            break;
        stream_job j = s->ring[s->head];
        bool skip = s->failed;
        pthread_mutex_unlock(&s->mu);

        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_status st = skip ? LOOM_OK : j.run(j.job, &d);
        if (j.release)
            j.release(j.job);

        pthread_mutex_lock(&s->mu);
        if (st != LOOM_OK && !s->failed) {
            s->failed = true;
            loom_ir_diag_init(&s->first);
            if (d.code != LOOM_OK && d.msg[0])
                s->first = d;
            else
                loom_ir_diag_set(&s->first, st, "stream job failed: %s", loom_status_name(st));
            s->first.code = st; /* the returned status wins over what d recorded */
        }
        s->head = (s->head + 1) % LOOM_RT_STREAM_MAX_IN_FLIGHT;
        s->n--;
        pthread_cond_signal(&s->space);
        if (s->n == 0)
            pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

loom_status loom_rt_stream_create(const loom_allocator *a, loom_rt_stream **out) {
    if (!out)
        return LOOM_STATUS_INVALID_ARGUMENT;
    *out = NULL;
    if (!a)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_rt_stream *s = loom_ir_alloc(a, sizeof *s);
    if (!s)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->alloc = *a;
    loom_ir_diag_init(&s->first);
    int inited = 0; /* how many of mu, work, space, idle exist: for the unwinding below */
    bool ok = pthread_mutex_init(&s->mu, NULL) == 0 && ++inited &&
              pthread_cond_init(&s->work, NULL) == 0 && ++inited &&
              pthread_cond_init(&s->space, NULL) == 0 && ++inited &&
              pthread_cond_init(&s->idle, NULL) == 0 && ++inited &&
              pthread_create(&s->thread, NULL, stream_main, s) == 0;
    if (!ok) {
        if (inited > 3)
            pthread_cond_destroy(&s->idle);
        if (inited > 2)
            pthread_cond_destroy(&s->space);
        if (inited > 1)
            pthread_cond_destroy(&s->work);
        if (inited > 0)
            pthread_mutex_destroy(&s->mu);
        loom_ir_free(a, s, sizeof *s);
        return LOOM_STATUS_DEVICE_ERROR;
    }
    *out = s;
    return LOOM_OK;
}

void loom_rt_stream_destroy(loom_rt_stream *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the thread drains the queue before it exits */
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->space);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    loom_allocator a = s->alloc;
    loom_ir_free(&a, s, sizeof *s);
}

loom_status loom_rt_stream_submit(loom_rt_stream *s, loom_rt_job_run_fn run, void *job,
                                  loom_rt_job_release_fn release) {
    if (!s || !run) {
        if (release)
            release(job);
        return LOOM_STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&s->mu);
    while (s->n == LOOM_RT_STREAM_MAX_IN_FLIGHT)
        pthread_cond_wait(&s->space, &s->mu);
    s->ring[(s->head + s->n) % LOOM_RT_STREAM_MAX_IN_FLIGHT] =
        (stream_job){.run = run, .job = job, .release = release};
    s->n++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    return LOOM_OK;
}

loom_status loom_rt_stream_wait(loom_rt_stream *s, loom_ir_diag *d) {
    if (!s)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "stream wait: NULL stream");
    pthread_mutex_lock(&s->mu);
    while (s->n > 0)
        pthread_cond_wait(&s->idle, &s->mu);
    loom_status st = LOOM_OK;
    if (s->failed) {
        st = s->first.code;
        if (d && d->code == LOOM_OK) {
            *d = s->first; /* keeps node/line/col the job recorded */
        }
        s->failed = false;
        loom_ir_diag_init(&s->first);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}
