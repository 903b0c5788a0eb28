/* Tests of execution streams: FIFO order on the stream's own thread, the first failure kept
 * and cleared by wait, skipped jobs after a failure, release exactly once, back-pressure
 * from the bounded queue, and destroy draining the queue. */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "runtime/stream.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- jobs --------------------------------------------------------------------------------- */

enum { MAX_JOBS = 128 };

/* What the jobs did, in the order the stream did it. Written on the stream's thread, read
 * by the test after a wait (which orders the two). */
static int ran[MAX_JOBS], n_ran;
static int released_ids[MAX_JOBS], n_released;
static int release_count[MAX_JOBS];
static pthread_t job_thread;
static int dirty_diags;

typedef struct job {
    int id;
    loom_status fail;    /* LOOM_OK: succeed */
    const char *msg;     /* failure message, NULL: leave d empty */
    sem_t *gate;         /* if set: wait on it before finishing */
    int sleep_us;
} job;

static job jobs[MAX_JOBS];

static void reset_jobs(void) {
    memset(jobs, 0, sizeof jobs);
    memset(release_count, 0, sizeof release_count);
    n_ran = n_released = dirty_diags = 0;
    for (int i = 0; i < MAX_JOBS; i++)
        jobs[i].id = i;
}

static loom_status run_job(void *p, loom_ir_diag *d) {
    job *j = p;
    job_thread = pthread_self();
    if (d->code != LOOM_OK || d->msg[0])
        dirty_diags++; /* each job must get an empty diag (no cmocka asserts off-thread) */
    if (j->gate)
        sem_wait(j->gate);
    if (j->sleep_us)
        usleep((useconds_t)j->sleep_us);
    ran[n_ran++] = j->id;
    if (j->fail != LOOM_OK && j->msg)
        return loom_ir_diag_set(d, j->fail, "%s", j->msg);
    return j->fail;
}

static void release_job(void *p) {
    job *j = p;
    released_ids[n_released++] = j->id;
    release_count[j->id]++;
}

static loom_rt_stream *make_stream(void) {
    loom_rt_stream *s = NULL;
    assert_int_equal(loom_rt_stream_create(&sys, &s), LOOM_OK);
    assert_non_null(s);
    return s;
}

static void submit(loom_rt_stream *s, int id) {
    assert_int_equal(loom_rt_stream_submit(s, run_job, &jobs[id], release_job), LOOM_OK);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_jobs_run_in_submission_order_on_the_stream_thread(void **state) {
    (void)state;
    reset_jobs();
    loom_rt_stream *s = make_stream();
    for (int i = 0; i < 50; i++)
        submit(s, i);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    assert_int_equal(n_ran, 50);
    assert_int_equal(n_released, 50);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(ran[i], i);
        assert_int_equal(released_ids[i], i);
        assert_int_equal(release_count[i], 1);
    }
    assert_false(pthread_equal(job_thread, pthread_self()));
    loom_rt_stream_destroy(s);
}

static void test_wait_on_an_idle_stream_returns_ok(void **state) {
    (void)state;
    loom_rt_stream *s = make_stream();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_OK);
    assert_int_equal(loom_rt_stream_wait(s, NULL), LOOM_OK);
    loom_rt_stream_destroy(s);
    loom_rt_stream_destroy(NULL);
}

static void test_wait_returns_the_first_failure_then_clears_it(void **state) {
    (void)state;
    reset_jobs();
    jobs[1] = (job){.id = 1, .fail = LOOM_STATUS_DEVICE_ERROR, .msg = "kernel 3 failed: boom"};
    jobs[2] = (job){.id = 2, .fail = LOOM_STATUS_OUT_OF_MEMORY, .msg = "second failure"};
    loom_rt_stream *s = make_stream();
    for (int i = 0; i < 4; i++)
        submit(s, i);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_STATUS_DEVICE_ERROR);
    assert_int_equal(d.code, LOOM_STATUS_DEVICE_ERROR);
    assert_string_equal(d.msg, "kernel 3 failed: boom");
    /* Jobs 2 and 3 came after the failure: skipped (not run) but released. */
    assert_int_equal(n_ran, 2);
    assert_int_equal(ran[0], 0);
    assert_int_equal(ran[1], 1);
    assert_int_equal(n_released, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(release_count[i], 1);

    /* Cleared: the next wait is clean, and the stream runs jobs again. */
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    submit(s, 10);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_OK);
    assert_int_equal(n_ran, 3);
    assert_int_equal(ran[2], 10);
    assert_int_equal(dirty_diags, 0); /* job 10 ran after the failure with a fresh diag */
    loom_rt_stream_destroy(s);
}

static void test_a_failure_without_a_message_gets_one(void **state) {
    (void)state;
    reset_jobs();
    jobs[0].fail = LOOM_STATUS_DEVICE_ERROR; /* msg NULL: d left empty */
    loom_rt_stream *s = make_stream();
    submit(s, 0);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_STATUS_DEVICE_ERROR);
    assert_string_equal(d.msg, "stream job failed: DEVICE_ERROR");
    loom_rt_stream_destroy(s);
}

static void test_wait_keeps_an_error_already_in_the_diag(void **state) {
    (void)state;
    reset_jobs();
    jobs[0] = (job){.id = 0, .fail = LOOM_STATUS_DEVICE_ERROR, .msg = "late"};
    loom_rt_stream *s = make_stream();
    submit(s, 0);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_diag_set(&d, LOOM_STATUS_INVALID_ARGUMENT, "earlier");
    /* The status is the stream's; the diag keeps its first error (first error wins). */
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_STATUS_DEVICE_ERROR);
    assert_string_equal(d.msg, "earlier");
    assert_int_equal(loom_rt_stream_wait(s, &d), LOOM_OK); /* but the failure was cleared */
    loom_rt_stream_destroy(s);
}

static void test_submit_without_run_releases_the_job(void **state) {
    (void)state;
    reset_jobs();
    loom_rt_stream *s = make_stream();
    assert_int_equal(loom_rt_stream_submit(s, NULL, &jobs[5], release_job),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(release_count[5], 1);
    assert_int_equal(loom_rt_stream_submit(NULL, run_job, &jobs[6], release_job),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(release_count[6], 1);
    /* release may be NULL */
    assert_int_equal(loom_rt_stream_submit(s, run_job, &jobs[7], NULL), LOOM_OK);
    assert_int_equal(loom_rt_stream_wait(s, NULL), LOOM_OK);
    assert_int_equal(n_ran, 1);
    assert_int_equal(release_count[7], 0);
    loom_rt_stream_destroy(s);
}

typedef struct submitter {
    loom_rt_stream *s;
    int id;
    atomic_bool done;
} submitter;

static void *submit_thread(void *p) {
    submitter *sub = p;
    loom_rt_stream_submit(sub->s, run_job, &jobs[sub->id], release_job);
    atomic_store(&sub->done, true);
    return NULL;
}

static void test_submit_blocks_while_the_queue_is_full(void **state) {
    (void)state;
    reset_jobs();
    sem_t gate;
    sem_init(&gate, 0, 0);
    jobs[0].gate = &gate; /* job 0 holds the stream until the gate opens */
    loom_rt_stream *s = make_stream();
    assert_int_equal(LOOM_RT_STREAM_MAX_IN_FLIGHT, 2);
    submit(s, 0);
    submit(s, 1); /* two in flight: full */
    submitter sub = {.s = s, .id = 2};
    atomic_init(&sub.done, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, submit_thread, &sub), 0);
    usleep(100 * 1000);
    assert_false(atomic_load(&sub.done)); /* still blocked in submit */
    sem_post(&gate);
    pthread_join(t, NULL);
    assert_true(atomic_load(&sub.done));
    assert_int_equal(loom_rt_stream_wait(s, NULL), LOOM_OK);
    assert_int_equal(n_ran, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ran[i], i);
    loom_rt_stream_destroy(s);
    sem_destroy(&gate);
}

/* Posts the gate after a delay, from another thread. */
static void *open_gate_later(void *p) {
    usleep(30 * 1000);
    sem_post(p);
    return NULL;
}

static void test_submit_returns_before_the_job_and_wait_after_it(void **state) {
    (void)state;
    reset_jobs();
    sem_t gate;
    sem_init(&gate, 0, 0);
    jobs[0].gate = &gate;
    loom_rt_stream *s = make_stream();
    submit(s, 0); /* returns although job 0 cannot finish yet: asynchronous */
    assert_int_equal(n_released, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, open_gate_later, &gate), 0);
    assert_int_equal(loom_rt_stream_wait(s, NULL), LOOM_OK);
    assert_int_equal(n_ran, 1); /* wait returned only once the job was done and released */
    assert_int_equal(n_released, 1);
    pthread_join(t, NULL);
    loom_rt_stream_destroy(s);
    sem_destroy(&gate);
}

static void test_destroy_drains_the_queue(void **state) {
    (void)state;
    reset_jobs();
    jobs[0].sleep_us = 20 * 1000;
    jobs[1].sleep_us = 20 * 1000;
    jobs[1].fail = LOOM_STATUS_DEVICE_ERROR; /* dropped by destroy: nobody waits for it */
    loom_rt_stream *s = make_stream();
    submit(s, 0);
    submit(s, 1);
    submit(s, 2); /* blocks until job 0 is done; then skipped after job 1 fails */
    loom_rt_stream_destroy(s);
    assert_int_equal(n_ran, 2);
    assert_int_equal(n_released, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(release_count[i], 1);
}

static void test_create_rejects_bad_arguments_and_out_of_memory(void **state) {
    (void)state;
    loom_rt_stream *s = (loom_rt_stream *)&s;
    assert_int_equal(loom_rt_stream_create(NULL, &s), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(s);
    assert_int_equal(loom_rt_stream_create(&sys, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    test_alloc ta = {.fail_at = 1};
    loom_allocator a = test_alloc_make(&ta);
    assert_int_equal(loom_rt_stream_create(&a, &s), LOOM_STATUS_OUT_OF_MEMORY);
    assert_null(s);
    ta.fail_at = 0;
    assert_int_equal(loom_rt_stream_create(&a, &s), LOOM_OK);
    loom_rt_stream_destroy(s);
    assert_int_equal(ta.live_bytes, 0);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_stream_wait(NULL, &d), LOOM_STATUS_INVALID_ARGUMENT);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs_run_in_submission_order_on_the_stream_thread),
        cmocka_unit_test(test_wait_on_an_idle_stream_returns_ok),
        cmocka_unit_test(test_wait_returns_the_first_failure_then_clears_it),
        cmocka_unit_test(test_a_failure_without_a_message_gets_one),
        cmocka_unit_test(test_wait_keeps_an_error_already_in_the_diag),
        cmocka_unit_test(test_submit_without_run_releases_the_job),
        cmocka_unit_test(test_submit_blocks_while_the_queue_is_full),
        cmocka_unit_test(test_submit_returns_before_the_job_and_wait_after_it),
        cmocka_unit_test(test_destroy_drains_the_queue),
        cmocka_unit_test(test_create_rejects_bad_arguments_and_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
