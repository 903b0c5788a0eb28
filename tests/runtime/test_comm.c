/* Tests of the communicator in one process: the self backend's collectives on every dtype,
 * argument errors, the deadline wait and a failed communicator (through a backend that never
 * completes), the backend and timeout choices from options and environment, the public
 * loom_dist_* API, and the device and threads a context takes from the local rank. The
 * multi-process tests are tests/runtime/comm_ranks.c under mpiexec. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "loom/dist.h"
#include "runtime/comm.h"
#include "runtime/bulk.h"
#include "runtime/runtime.h"
#include "runtime/kernel.h"
#include "test_util.h"

static const char *const dist_vars[] = {
    "LOOM_DIST", "LOOM_DIST_TIMEOUT_S",  "LOOM_NUM_THREADS",     "PMI_RANK", "PMI_SIZE", "PMI_FD",
    "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
};

/* Every test starts as a program started without a launcher. */
static int clean_env(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof dist_vars / sizeof dist_vars[0]; i++)
        unsetenv(dist_vars[i]);
    return 0;
}

static loom_rt_comm *self_comm(void) {
    loom_dist_options o;
    loom_dist_options_init(&o);
    o.backend = LOOM_DIST_BACKEND_SELF;
    loom_rt_comm *c = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_comm_create(&o, &c, &d) != LOOM_OK)
        fail_msg("self communicator: %s", d.msg);
    return c;
}

static void destroy_ok(loom_rt_comm *c) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_comm_destroy(c, &d) != LOOM_OK)
        fail_msg("destroy: %s", d.msg);
}

/* Fails unless st is want and d's message contains `part`. */
static void expect_error(loom_status st, const loom_ir_diag *d, loom_status want,
                         const char *part) {
    if (st != want || !strstr(d->msg, part))
        fail_msg("got %s \"%s\", expected %s with \"%s\"", loom_status_name(st), d->msg,
                 loom_status_name(want), part);
}

/* ---- the self backend ----------------------------------------------------------------------- */

static void test_without_a_launcher_the_communicator_is_rank_0_of_1(void **state) {
    (void)state;
    loom_rt_comm *c = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_comm_create(NULL, &c, &d), LOOM_OK);
    assert_string_equal(c->vt->name, "self");
    assert_int_equal(c->rank, 0);
    assert_int_equal(c->size, 1);
    assert_int_equal(c->local_rank, 0);
    assert_int_equal(c->local_size, 1);
    assert_true(c->timeout_ns == (int64_t)(LOOM_RT_COMM_DEFAULT_TIMEOUT_S * 1e9));
    assert_int_equal(loom_rt_comm_barrier(c, &d), LOOM_OK);
    destroy_ok(c);
}

static void test_self_allreduce_scales_floats_and_keeps_integers(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);

    float f[4] = {1, -2, 3.5f, 0};
    assert_int_equal(loom_rt_comm_allreduce(c, f, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 0.5, &d),
                     LOOM_OK);
    assert_true(f[0] == 0.5f && f[1] == -1.0f && f[2] == 1.75f && f[3] == 0.0f);
    assert_int_equal(loom_rt_comm_allreduce(c, f, 4, LOOM_DTYPE_F32, LOOM_REDUCE_MAX, 4.0, &d),
                     LOOM_OK);
    assert_true(f[0] == 2.0f && f[1] == -4.0f && f[2] == 7.0f && f[3] == 0.0f);

    double g[2] = {3, -0.25};
    assert_int_equal(loom_rt_comm_allreduce(c, g, 2, LOOM_DTYPE_F64, LOOM_REDUCE_MIN, -2.0, &d),
                     LOOM_OK);
    assert_true(g[0] == -6.0 && g[1] == 0.5);

    /* 16-bit floats: widened, scaled, rounded once. 3 * (1/3) is 1 only if the scale is
     * applied in f32 before rounding (bf16(1/3) * 3 != 1). */
    uint16_t b[3] = {loom_ir_f32_to_bf16(3.0f), loom_ir_f32_to_bf16(-1.5f),
                     loom_ir_f32_to_bf16(96.0f)};
    assert_int_equal(
        loom_rt_comm_allreduce(c, b, 3, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1.0 / 3.0, &d), LOOM_OK);
    assert_true(loom_ir_bf16_to_f32(b[0]) == 1.0f);
    assert_true(loom_ir_bf16_to_f32(b[1]) == -0.5f);
    assert_true(loom_ir_bf16_to_f32(b[2]) == 32.0f);
    uint16_t h[2] = {loom_ir_f32_to_f16(6.0f), loom_ir_f32_to_f16(-0.75f)};
    assert_int_equal(loom_rt_comm_allreduce(c, h, 2, LOOM_DTYPE_F16, LOOM_REDUCE_MAX, 0.5, &d),
                     LOOM_OK);
    assert_true(loom_ir_f16_to_f32(h[0]) == 3.0f && loom_ir_f16_to_f32(h[1]) == -0.375f);

    int32_t i[3] = {7, -8, INT32_MAX};
    assert_int_equal(loom_rt_comm_allreduce(c, i, 3, LOOM_DTYPE_I32, LOOM_REDUCE_SUM, 1.0, &d),
                     LOOM_OK);
    assert_true(i[0] == 7 && i[1] == -8 && i[2] == INT32_MAX);
    int64_t l[1] = {INT64_MIN};
    assert_int_equal(loom_rt_comm_allreduce(c, l, 1, LOOM_DTYPE_I64, LOOM_REDUCE_MIN, 1.0, &d),
                     LOOM_OK);
    assert_true(l[0] == INT64_MIN);
    uint8_t flags[2] = {0, 1};
    assert_int_equal(loom_rt_comm_allreduce(c, flags, 2, LOOM_DTYPE_BOOL, LOOM_REDUCE_MAX, 1.0, &d),
                     LOOM_OK);
    assert_true(flags[0] == 0 && flags[1] == 1);
    /* Zero elements is still a collective, and fine. */
    assert_int_equal(loom_rt_comm_allreduce(c, NULL, 0, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 2, &d),
                     LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    destroy_ok(c);
}

static void test_self_broadcast_and_allgather_copy_this_ranks_values(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t v[3] = {4, 5, 6};
    assert_int_equal(loom_rt_comm_broadcast(c, v, 3, LOOM_DTYPE_I32, 0, &d), LOOM_OK);
    assert_true(v[0] == 4 && v[1] == 5 && v[2] == 6);
    float send[2] = {1.5f, -2.5f}, recv[2] = {0, 0};
    assert_int_equal(loom_rt_comm_allgather(c, send, recv, 2, LOOM_DTYPE_F32, &d), LOOM_OK);
    assert_true(recv[0] == 1.5f && recv[1] == -2.5f);
    uint16_t in_place[2] = {0x3f80, 0xc000};
    assert_int_equal(loom_rt_comm_allgather(c, NULL, in_place, 2, LOOM_DTYPE_BF16, &d), LOOM_OK);
    assert_true(in_place[0] == 0x3f80 && in_place[1] == 0xc000);
    destroy_ok(c);
}

static void test_nonblocking_allreduces_are_waited_in_any_order(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    float a[2] = {2, 4};
    uint16_t b[1] = {loom_ir_f32_to_bf16(8.0f)};
    loom_rt_comm_request *ra = NULL, *rb = NULL;
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, a, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 0.5, &ra, &d),
        LOOM_OK);
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, b, 1, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 0.25, &rb, &d),
        LOOM_OK);
    assert_int_equal(atomic_load(&c->pending), 2);
    assert_true(ra->seq == 1 && rb->seq == 2);
    bool done = false;
    assert_int_equal(loom_rt_comm_test(rb, &done, &d), LOOM_OK);
    assert_true(done);
    /* The result lands at the wait, not before. */
    assert_true(loom_ir_bf16_to_f32(b[0]) == 8.0f);
    assert_int_equal(loom_rt_comm_wait(rb, &d), LOOM_OK);
    assert_true(loom_ir_bf16_to_f32(b[0]) == 2.0f);
    assert_int_equal(loom_rt_comm_wait(ra, &d), LOOM_OK);
    assert_true(a[0] == 1.0f && a[1] == 2.0f);
    assert_int_equal(atomic_load(&c->pending), 0);
    destroy_ok(c);
}

/* A finished 16-bit all-reduce's f32 staging serves the next one that fits; two in flight
 * never share one (each result is its own values'), and a staging too small is not taken. */
static void test_16_bit_stagings_are_reused_and_never_shared(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    enum { N = 64 };
    uint16_t a[N], b[2 * N];
    for (int i = 0; i < N; i++)
        a[i] = loom_ir_f32_to_bf16((float)i);
    assert_int_equal(loom_rt_comm_allreduce(c, a, N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK);
    float *kept = c->spare[0];
    assert_non_null(kept);
    assert_true(c->spare_bytes[0] == N * sizeof(float));

    for (int i = 0; i < N; i++) {
        a[i] = loom_ir_f32_to_bf16((float)i);
        b[i] = loom_ir_f32_to_f16((float)-i);
    }
    loom_rt_comm_request *ra = NULL, *rb = NULL;
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, a, N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 0.5, &ra, &d),
        LOOM_OK);
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, b, N, LOOM_DTYPE_F16, LOOM_REDUCE_SUM, 2, &rb, &d),
        LOOM_OK);
    assert_ptr_equal(ra->staging, kept);
    assert_ptr_not_equal(rb->staging, kept);
    assert_int_equal(loom_rt_comm_wait(rb, &d), LOOM_OK);
    assert_int_equal(loom_rt_comm_wait(ra, &d), LOOM_OK);
    for (int i = 0; i < N; i++) {
        assert_true(loom_ir_bf16_to_f32(a[i]) == 0.5f * (float)i);
        assert_true(loom_ir_f16_to_f32(b[i]) == -2.0f * (float)i);
    }
    int spares = 0;
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        spares += c->spare[i] != NULL;
    assert_int_equal(spares, 2);

    for (int i = 0; i < 2 * N; i++)
        b[i] = loom_ir_f32_to_bf16(1.0f);
    loom_rt_comm_request *rc = NULL;
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, b, 2 * N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 3, &rc, &d),
        LOOM_OK);
    spares = 0; /* both smaller spares stay, none was taken */
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        spares += c->spare[i] != NULL && c->spare_bytes[i] == N * sizeof(float);
    assert_int_equal(spares, 2);
    assert_true(rc->staging_bytes == 2 * N * sizeof(float));
    assert_int_equal(loom_rt_comm_wait(rc, &d), LOOM_OK);
    for (int i = 0; i < 2 * N; i++)
        assert_true(loom_ir_bf16_to_f32(b[i]) == 3.0f);
    destroy_ok(c); /* frees the spares (ASan's run checks) */
}

/* The bytes of c's spares, and how many there are in *n. */
static size_t spare_total(const loom_rt_comm *c, int *n) {
    size_t total = 0;
    *n = 0;
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        if (c->spare[i]) {
            total += c->spare_bytes[i];
            ++*n;
        }
    return total;
}

/* The spares stay within spare_cap bytes (LOOM_RT_COMM_SPARE_BYTES, lowered here): a
 * staging larger than the cap is not kept, and a newly kept one pushes out the smallest
 * others until the spares fit again. */
static void test_16_bit_stagings_kept_stay_within_their_byte_cap(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    enum { N = 64 };
    const size_t row = N * sizeof(float);
    c->spare_cap = 3 * row;
    uint16_t a[4 * N], b[2 * N];
    for (int i = 0; i < 4 * N; i++)
        a[i] = loom_ir_f32_to_bf16(1.0f);
    int n = 0;
    assert_int_equal(loom_rt_comm_allreduce(c, a, N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK);
    assert_int_equal(loom_rt_comm_allreduce(c, a, 2 * N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK);
    assert_true(spare_total(c, &n) == 3 * row && n == 2); /* at the cap: both kept */
    assert_int_equal(loom_rt_comm_allreduce(c, a, 4 * N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK);
    assert_true(spare_total(c, &n) == 3 * row && n == 2); /* 4 rows: over the cap, not kept */

    /* two of 2 rows in flight: the first takes the spare of 2 rows, the second a new one;
     * given back, the second pushes out the spare of 1 row and then the other of 2 */
    for (int i = 0; i < 2 * N; i++)
        b[i] = loom_ir_f32_to_bf16(2.0f);
    loom_rt_comm_request *ra = NULL, *rb = NULL;
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, a, 2 * N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &ra, &d),
        LOOM_OK);
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, b, 2 * N, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &rb, &d),
        LOOM_OK);
    float *second = rb->staging;
    assert_int_equal(loom_rt_comm_wait(ra, &d), LOOM_OK);
    assert_true(spare_total(c, &n) == 3 * row && n == 2);
    assert_int_equal(loom_rt_comm_wait(rb, &d), LOOM_OK);
    assert_true(spare_total(c, &n) == 2 * row && n == 1);
    int kept = -1;
    for (int i = 0; i < LOOM_RT_COMM_SPARES; i++)
        kept = c->spare[i] ? i : kept;
    assert_ptr_equal(c->spare[kept], second);
    for (int i = 0; i < 2 * N; i++)
        assert_true(loom_ir_bf16_to_f32(a[i]) == 1.0f && loom_ir_bf16_to_f32(b[i]) == 2.0f);
    destroy_ok(c); /* frees the spare, and ASan checks the ones pushed out were freed */
}

static void write_chunk(const char *chunk, size_t len, void *ud) {
    fwrite(chunk, 1, len, ud);
}

static void test_completed_collectives_count_their_time_and_payload_bytes(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    float f[4] = {1, 2, 3, 4};
    uint16_t h[3] = {0x3f80, 0x3f80, 0x3f80};
    int32_t v[3] = {1, 2, 3};
    float recv[2];
    assert_int_equal(loom_rt_comm_allreduce(c, f, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK); /* 16 bytes */
    assert_int_equal(loom_rt_comm_allreduce(c, h, 3, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1, &d),
                     LOOM_OK); /* reduced in f32: 12 bytes */
    assert_int_equal(loom_rt_comm_broadcast(c, v, 3, LOOM_DTYPE_I32, 0, &d), LOOM_OK);    /* 12 */
    assert_int_equal(loom_rt_comm_allgather(c, f, recv, 2, LOOM_DTYPE_F32, &d), LOOM_OK); /* 8 */
    assert_int_equal(loom_rt_comm_barrier(c, &d), LOOM_OK); /* time, no bytes */
    /* Argument errors are not collectives: nothing counted. */
    assert_int_equal(loom_rt_comm_broadcast(c, v, 3, LOOM_DTYPE_I32, 5, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 7);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COLLECTIVE_BYTES, 1000); /* replaced, not added to */
    loom_rt_comm_read_metrics(c, &m);
    assert_int_equal(m.count[LOOM_RT_METRIC_COLLECTIVE_BYTES], 48);
    assert_int_equal(m.count[LOOM_RT_METRIC_COLLECTIVE_TIME], 5);
    assert_true(m.total[LOOM_RT_METRIC_COLLECTIVE_TIME] >= m.max[LOOM_RT_METRIC_COLLECTIVE_TIME]);
    assert_true(m.min[LOOM_RT_METRIC_COLLECTIVE_TIME] >= 0);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_HIT], 7); /* the rest is left alone */
    loom_rt_comm_read_metrics(NULL, &m);
    assert_int_equal(m.count[LOOM_RT_METRIC_COLLECTIVE_BYTES], 48);

    /* A context reports the world communicator's collectives; none without one. */
    loom_context *ctx = tu_context(false);
    assert_int_equal(loom_metric_value(ctx, "CollectiveBytes"), 0);
    assert_int_equal(loom_metric_value(ctx, "CollectiveTime"), 0);
    loom_rt_comm_set_world(c);
    assert_int_equal(loom_metric_value(ctx, "CollectiveBytes"), 48);
    assert_int_equal(loom_metric_value(ctx, "CollectiveTime"), 5);
    assert_true(loom_metric_total(ctx, "CollectiveTime") ==
                m.total[LOOM_RT_METRIC_COLLECTIVE_TIME]);
    char *report = NULL;
    size_t report_len = 0;
    FILE *out = open_memstream(&report, &report_len);
    assert_non_null(out);
    assert_int_equal(loom_metrics_report(ctx, LOOM_REPORT_FORMAT_JSON, write_chunk, out), LOOM_OK);
    fclose(out);
    assert_non_null(strstr(report, "\"CollectiveBytes\":48"));
    assert_non_null(strstr(report, "\"CollectiveTime\":{\"count\":5,"));
    free(report);
    loom_rt_comm_set_world(NULL);
    loom_context_destroy(ctx);
    destroy_ok(c);
}

static void test_finalize_with_a_pending_request_is_refused(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    float a[1] = {1};
    loom_rt_comm_request *r = NULL;
    assert_int_equal(
        loom_rt_comm_allreduce_start(c, a, 1, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, &r, &d), LOOM_OK);
    expect_error(loom_rt_comm_destroy(c, &d), &d, LOOM_STATUS_INVALID_ARGUMENT,
                 "1 collective(s) not yet waited for");
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_comm_wait(r, &d), LOOM_OK);
    destroy_ok(c);
}

/* ---- argument errors ------------------------------------------------------------------------ */

static void test_bad_arguments_are_reported_and_leave_the_communicator_usable(void **state) {
    (void)state;
    loom_rt_comm *c = self_comm();
    float f[2] = {1, 2};
    int32_t i[2] = {1, 2};
    loom_rt_comm_request *r = NULL;
    loom_ir_diag d;
    struct {
        loom_status st;
        const char *part;
    } got[20];
    int n = 0;
#define TRY(call)                                                                                  \
    do {                                                                                           \
        loom_ir_diag_init(&d);                                                                     \
        got[n].st = (call);                                                                        \
        got[n].part = strdup(d.msg);                                                               \
        n++;                                                                                       \
    } while (0)
    TRY(loom_rt_comm_barrier(NULL, &d));
    TRY(loom_rt_comm_allreduce(NULL, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, &d));
    TRY(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_COUNT_, LOOM_REDUCE_SUM, 1, &d));
    TRY(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_COUNT_, 1, &d));
    TRY(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_BOOL, LOOM_REDUCE_SUM, 1, &d));
    TRY(loom_rt_comm_allreduce(c, i, 2, LOOM_DTYPE_I32, LOOM_REDUCE_SUM, 0.5, &d));
    TRY(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, NAN, &d));
    TRY(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, INFINITY, &d));
    TRY(loom_rt_comm_allreduce(c, f, (size_t)INT32_MAX + 1, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1,
                               &d));
    TRY(loom_rt_comm_allreduce(c, NULL, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, &d));
    TRY(loom_rt_comm_allreduce_start(c, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, NULL, &d));
    TRY(loom_rt_comm_broadcast(c, f, 2, LOOM_DTYPE_F32, 1, &d));
    TRY(loom_rt_comm_broadcast(c, f, 2, LOOM_DTYPE_F32, -1, &d));
    TRY(loom_rt_comm_broadcast(c, f, 2, (loom_dtype)-1, 0, &d));
    TRY(loom_rt_comm_allgather(c, f, NULL, 2, LOOM_DTYPE_F32, &d));
    TRY(loom_rt_comm_allgather(c, NULL, NULL, 2, LOOM_DTYPE_F32, &d));
    TRY(loom_rt_comm_wait(NULL, &d));
#undef TRY
    static const char *const want[] = {
        "barrier before loom_dist_init",
        "allreduce before loom_dist_init",
        "allreduce: unknown dtype",
        "unknown reduce op",
        "sum of bool",
        "scale 0.5 on i32",
        "scale nan is not finite",
        "scale inf is not finite",
        "2147483648 elements of f32: at most 2147483647",
        "buf is NULL for 2 elements",
        "allreduce: out is NULL",
        "root 1 is not a rank (world size 1)",
        "root -1 is not a rank",
        "broadcast: unknown dtype -1",
        "recv is NULL for 2 elements",
        "recv is NULL for 2 elements",
        "request is NULL",
    };
    assert_int_equal(n, (int)(sizeof want / sizeof want[0]));
    for (int k = 0; k < n; k++) {
        if (got[k].st != LOOM_STATUS_INVALID_ARGUMENT || !strstr(got[k].part, want[k]))
            fail_msg("case %d: got %s \"%s\", expected INVALID_ARGUMENT with \"%s\"", k,
                     loom_status_name(got[k].st), got[k].part, want[k]);
        free((void *)got[k].part);
    }
    (void)r;
    /* None of that touched the communicator. */
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 2, &d),
                     LOOM_OK);
    assert_true(f[0] == 2.0f && f[1] == 4.0f);
    assert_false(atomic_load(&c->failed));
    assert_true(c->seq == 1);
    destroy_ok(c);
}

/* ---- deadlines and failure ------------------------------------------------------------------ */

/* A backend that posts, then never completes (a peer that died) or fails its post. */
static struct {
    int posts, tests, destroys;
    bool destroyed_failed;
    bool fail_post;
} stuck;

static loom_status stuck_post_barrier(loom_rt_comm *c, loom_rt_comm_request *req, loom_ir_diag *d) {
    stuck.posts++;
    if (stuck.fail_post)
        return loom_ir_diag_set(d, LOOM_STATUS_COMM_ERROR, "MPI_Ibarrier: the peer is gone");
    return LOOM_OK;
}

static loom_status stuck_post_allreduce(loom_rt_comm *c, void *buf, loom_rt_comm_request *req,
                                        loom_ir_diag *d) {
    stuck.posts++;
    return LOOM_OK;
}

static loom_status stuck_test(loom_rt_comm *c, loom_rt_comm_request *req, bool *out_done,
                              loom_ir_diag *d) {
    stuck.tests++;
    *out_done = false;
    return LOOM_OK;
}

static loom_status stuck_destroy(loom_rt_comm *c, bool failed, loom_ir_diag *d) {
    stuck.destroys++;
    stuck.destroyed_failed = failed;
    return LOOM_OK;
}

static const loom_rt_comm_vtable stuck_vtable = {
    .name = "stuck",
    .post_barrier = stuck_post_barrier,
    .post_allreduce = stuck_post_allreduce,
    .test = stuck_test,
    .destroy = stuck_destroy,
};

/* Rank 1 of 2 on the stuck backend, with a timeout of timeout_ms. */
static loom_rt_comm *stuck_comm(int64_t timeout_ms) {
    memset(&stuck, 0, sizeof stuck);
    loom_allocator sys = loom_allocator_system();
    loom_rt_comm *c = loom_ir_alloc(&sys, sizeof *c);
    assert_non_null(c);
    assert_int_equal(loom_rt_comm_init_base(c, &stuck_vtable, &sys, timeout_ms * 1000000), LOOM_OK);
    c->rank = 1;
    c->size = 2;
    return c;
}

static void
test_a_collective_that_never_completes_times_out_and_fails_the_communicator(void **state) {
    (void)state;
    loom_rt_comm *c = stuck_comm(30);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    float f[4] = {1, 2, 3, 4};
    int64_t t0 = loom_rt_now_ns();
    expect_error(loom_rt_comm_allreduce(c, f, 4, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 0.5, &d), &d,
                 LOOM_STATUS_COMM_ERROR,
                 "allreduce #1 (sum, f32 x4) on rank 1 of 2 did not complete within 0.03 s");
    int64_t waited = loom_rt_now_ns() - t0;
    assert_true(waited >= 30000000 && waited < 2000000000);
    assert_true(stuck.tests > 1);
    assert_true(f[0] == 1.0f); /* no scale on a result that never came */
    assert_true(atomic_load(&c->failed));
    assert_int_equal(atomic_load(&c->pending), 0);

    /* Every later collective fails at once with the first message, without the backend. */
    int posts = stuck.posts;
    c->timeout_ns = 60 * (int64_t)1000000000;
    loom_ir_diag_init(&d);
    t0 = loom_rt_now_ns();
    expect_error(loom_rt_comm_barrier(c, &d), &d, LOOM_STATUS_COMM_ERROR,
                 "barrier on rank 1: the communicator failed earlier: dist: allreduce #1");
    assert_true(loom_rt_now_ns() - t0 < 10 * (int64_t)1000000000);
    assert_int_equal(stuck.posts, posts);

    /* Destroy frees it but says MPI is left alone, and tells the backend so. */
    loom_ir_diag_init(&d);
    expect_error(loom_rt_comm_destroy(c, &d), &d, LOOM_STATUS_COMM_ERROR,
                 "MPI left unfinalized after an earlier failure");
    assert_int_equal(stuck.destroys, 1);
    assert_true(stuck.destroyed_failed);
}

static void test_a_backend_error_names_the_collective_and_the_rank(void **state) {
    (void)state;
    loom_rt_comm *c = stuck_comm(1000);
    stuck.fail_post = true;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    expect_error(loom_rt_comm_barrier(c, &d), &d, LOOM_STATUS_COMM_ERROR,
                 "dist: barrier #1 failed on rank 1 of 2: MPI_Ibarrier: the peer is gone");
    assert_true(atomic_load(&c->failed));
    assert_int_equal(atomic_load(&c->pending), 0);
    loom_ir_diag_init(&d);
    expect_error(loom_rt_comm_destroy(c, &d), &d, LOOM_STATUS_COMM_ERROR, "earlier failure");
}

/* ---- backend and timeout choice ---------------------------------------------------------------
 */

static loom_status choose(loom_dist_backend opt, loom_dist_backend *out, loom_ir_diag *d) {
    loom_dist_options o;
    loom_dist_options_init(&o);
    o.backend = opt;
    loom_ir_diag_init(d);
    return loom_rt_comm_choose_backend(&o, out, d);
}

static void test_the_backend_follows_options_then_loom_dist_then_the_launcher(void **state) {
    (void)state;
    loom_dist_backend b = LOOM_DIST_BACKEND_COUNT_;
    loom_ir_diag d;
    assert_int_equal(choose(LOOM_DIST_BACKEND_DEFAULT, &b, &d), LOOM_OK);
    assert_int_equal(b, LOOM_DIST_BACKEND_SELF);
    assert_int_equal(choose(LOOM_DIST_BACKEND_MPI, &b, &d), LOOM_OK); /* created later */
    assert_int_equal(b, LOOM_DIST_BACKEND_MPI);

    setenv("LOOM_DIST", "mpi", 1);
    assert_int_equal(choose(LOOM_DIST_BACKEND_DEFAULT, &b, &d), LOOM_OK);
    assert_int_equal(b, LOOM_DIST_BACKEND_MPI);
    assert_int_equal(choose(LOOM_DIST_BACKEND_SELF, &b, &d), LOOM_OK); /* options win */
    assert_int_equal(b, LOOM_DIST_BACKEND_SELF);
    setenv("LOOM_DIST", "self", 1);
    assert_int_equal(choose(LOOM_DIST_BACKEND_DEFAULT, &b, &d), LOOM_OK);
    assert_int_equal(b, LOOM_DIST_BACKEND_SELF);
    setenv("LOOM_DIST", "bogus", 1);
    expect_error(choose(LOOM_DIST_BACKEND_DEFAULT, &b, &d), &d, LOOM_STATUS_INVALID_ARGUMENT,
                 "LOOM_DIST='bogus': expected self, mpi or auto");
    expect_error(choose((loom_dist_backend)42, &b, &d), &d, LOOM_STATUS_INVALID_ARGUMENT,
                 "unknown backend 42");

    /* auto: a launcher's variables select mpi. */
    setenv("LOOM_DIST", "auto", 1);
    int32_t size = -1;
    assert_false(loom_rt_comm_launcher_present(&size));
    assert_int_equal(size, 0);
    setenv("PMI_SIZE", "3", 1);
    assert_true(loom_rt_comm_launcher_present(&size));
    assert_int_equal(size, 3);
    if (loom_dist_have_mpi()) {
        assert_int_equal(choose(LOOM_DIST_BACKEND_AUTO, &b, &d), LOOM_OK);
        assert_int_equal(b, LOOM_DIST_BACKEND_MPI);
    } else {
        expect_error(choose(LOOM_DIST_BACKEND_AUTO, &b, &d), &d, LOOM_STATUS_UNSUPPORTED,
                     "a launcher started 3 ranks, but this Loom was built without MPI");
        setenv("PMI_SIZE", "1", 1); /* mpiexec -n 1 still runs, on self */
        assert_int_equal(choose(LOOM_DIST_BACKEND_AUTO, &b, &d), LOOM_OK);
        assert_int_equal(b, LOOM_DIST_BACKEND_SELF);
    }
    unsetenv("PMI_SIZE");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    assert_true(loom_rt_comm_launcher_present(&size));
    assert_int_equal(size, 2);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("PMI_FD", "6", 1);
    assert_true(loom_rt_comm_launcher_present(&size));
    assert_int_equal(size, 0);
}

static void test_the_timeout_comes_from_options_then_loom_dist_timeout_s(void **state) {
    (void)state;
    loom_dist_options o;
    loom_dist_options_init(&o);
    int64_t ns = 0;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_comm_timeout_ns(&o, &ns, &d), LOOM_OK);
    assert_true(ns == 300 * (int64_t)1000000000);
    assert_int_equal(loom_rt_comm_timeout_ns(NULL, &ns, &d), LOOM_OK);
    assert_true(ns == 300 * (int64_t)1000000000);
    setenv("LOOM_DIST_TIMEOUT_S", "2.5", 1);
    assert_int_equal(loom_rt_comm_timeout_ns(&o, &ns, &d), LOOM_OK);
    assert_true(ns == 2500000000);
    o.timeout_s = 7;
    assert_int_equal(loom_rt_comm_timeout_ns(&o, &ns, &d), LOOM_OK);
    assert_true(ns == 7 * (int64_t)1000000000);
    o.timeout_s = -1;
    expect_error(loom_rt_comm_timeout_ns(&o, &ns, &d), &d, LOOM_STATUS_INVALID_ARGUMENT,
                 "loom_dist_options.timeout_s=-1: expected a number of seconds > 0");
    o.timeout_s = 0;
    const char *bad[] = {"0", "-3", "abc", "5s", "1e999", "nan", "1e10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LOOM_DIST_TIMEOUT_S", bad[i], 1);
        loom_ir_diag_init(&d);
        loom_status st = loom_rt_comm_timeout_ns(&o, &ns, &d);
        if (st != LOOM_STATUS_INVALID_ARGUMENT || !strstr(d.msg, "LOOM_DIST_TIMEOUT_S='"))
            fail_msg("LOOM_DIST_TIMEOUT_S=%s: %s \"%s\"", bad[i], loom_status_name(st), d.msg);
    }
}

/* ---- the public API ---------------------------------------------------------------------------
 */

static void test_dist_api_before_init_is_rank_0_of_1_and_refuses_collectives(void **state) {
    (void)state;
    assert_false(loom_dist_is_initialized());
    assert_int_equal(loom_dist_rank(), 0);
    assert_int_equal(loom_dist_world_size(), 1);
    assert_int_equal(loom_dist_local_rank(), 0);
    assert_int_equal(loom_dist_local_size(), 1);
    assert_string_equal(loom_dist_backend_name(), "none");
    assert_int_equal(loom_dist_barrier(), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_dist_error_message(), "barrier before loom_dist_init"));
    assert_int_equal(loom_dist_finalize(), LOOM_OK);
}

static void test_dist_init_is_idempotent_and_finalize_undoes_it(void **state) {
    (void)state;
    assert_int_equal(loom_dist_init(NULL), LOOM_OK);
    assert_true(loom_dist_is_initialized());
    assert_string_equal(loom_dist_backend_name(), "self");
    assert_int_equal(loom_dist_rank(), 0);
    assert_int_equal(loom_dist_world_size(), 1);
    /* Later calls keep the first communicator, whatever they ask for. */
    loom_rt_comm *first = loom_rt_comm_world();
    loom_dist_options o;
    loom_dist_options_init(&o);
    o.backend = LOOM_DIST_BACKEND_MPI;
    assert_int_equal(loom_dist_init(&o), LOOM_OK);
    assert_ptr_equal(loom_rt_comm_world(), first);
    assert_int_equal(loom_dist_barrier(), LOOM_OK);
    assert_int_equal(loom_dist_finalize(), LOOM_OK);
    assert_false(loom_dist_is_initialized());
    assert_string_equal(loom_dist_backend_name(), "none");
    /* self may be initialized again. */
    o.backend = LOOM_DIST_BACKEND_SELF;
    o.timeout_s = 12;
    assert_int_equal(loom_dist_init(&o), LOOM_OK);
    assert_true(loom_rt_comm_world()->timeout_ns == 12 * (int64_t)1000000000);
    assert_int_equal(loom_dist_finalize(), LOOM_OK);
}

static void test_dist_init_reports_bad_settings(void **state) {
    (void)state;
    setenv("LOOM_DIST", "nccl", 1);
    assert_int_equal(loom_dist_init(NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(loom_dist_error_message(),
                        "dist: LOOM_DIST='nccl': expected self, mpi or auto");
    assert_false(loom_dist_is_initialized());
    unsetenv("LOOM_DIST");
    setenv("LOOM_DIST_TIMEOUT_S", "soon", 1);
    assert_int_equal(loom_dist_init(NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_dist_error_message(), "LOOM_DIST_TIMEOUT_S='soon'"));
    assert_false(loom_dist_is_initialized());
    if (!loom_dist_have_mpi()) {
        setenv("LOOM_DIST", "mpi", 1);
        unsetenv("LOOM_DIST_TIMEOUT_S");
        assert_int_equal(loom_dist_init(NULL), LOOM_STATUS_UNSUPPORTED);
        assert_non_null(strstr(loom_dist_error_message(), "built without MPI"));
    }
}

/* ---- the context's device and threads ---------------------------------------------------------
 */

static void expect_context(const char *device, int32_t threads, const char *want_device,
                           int32_t want_threads) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.device = device;
    o.num_threads = threads;
    o.cache_dir = "";
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    assert_string_equal(ctx->device->name, want_device);
    assert_int_equal(loom_rt_pool_threads(ctx->pool), want_threads);
    loom_context_destroy(ctx);
}

static void test_a_context_takes_the_local_ranks_device_and_share_of_cores(void **state) {
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t online = cores < 1 ? 1 : cores > 1024 ? 1024 : (int32_t)cores;
    int32_t half = online / 2 > 0 ? online / 2 : 1;
    assert_int_equal(loom_rt_default_threads_shared(1), online);
    assert_int_equal(loom_rt_default_threads_shared(2), half);
    assert_int_equal(loom_rt_default_threads_shared(4096), 1);

    /* Not distributed: npu:0 with every core, as before. */
    expect_context(NULL, 0, "npu:0", online);

    /* Local rank 1 of 2 on this machine (a self communicator dressed up as one). */
    loom_rt_comm *c = self_comm();
    c->local_rank = 1;
    c->local_size = 2;
    loom_rt_comm_set_world(c);
    expect_context(NULL, 0, "npu:1", half);
    expect_context("npu:0", 1, "npu:0", 1); /* explicit choices win */
    setenv("LOOM_NUM_THREADS", "3", 1);
    expect_context(NULL, 0, "npu:1", 3);
    assert_int_equal(loom_rt_default_threads_shared(2), 3);
    unsetenv("LOOM_NUM_THREADS");
    loom_rt_comm_set_world(NULL);
    destroy_ok(c);
    expect_context(NULL, 0, "npu:0", online);
}

/* The staging's whole-buffer conversions give ir.h's per-element results bit for bit: every
 * 16-bit pattern widened, and f32 patterns around every rounding boundary narrowed (ties,
 * NaNs, infinities, f16's subnormals and overflow), with and without a scale, at lengths
 * that leave a tail for the element-by-element path; the f32 scaling likewise. */
static void test_bulk_loops_give_the_per_element_results(void **state) {
    (void)state;
    if (!loom_rt_bulk_vector()) {
        printf("# skipped the vector path: this CPU has no AVX-512F (the element-by-element "
               "path is the per-element functions themselves)\n");
        return;
    }
    enum { N16 = 65536 + 7, LOWS = 12 };
    static const uint32_t lows[LOWS] = {0,      1,      0x0fff, 0x1000, 0x1001, 0x2000,
                                        0x7fff, 0x8000, 0x8001, 0xa000, 0xf000, 0xffff};
    uint16_t *h = malloc(sizeof *h * N16), *got = malloc(sizeof *got * (size_t)65536 * LOWS);
    float *f = malloc(sizeof *f * (size_t)65536 * LOWS);
    assert_non_null(h);
    assert_non_null(got);
    assert_non_null(f);
    static const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int t = 0; t < 2; t++) {
        loom_dtype dt = dts[t];
        for (size_t i = 0; i < N16; i++)
            h[i] = (uint16_t)i;
        loom_rt_widen16(f, h, N16, dt);
        for (size_t i = 0; i < N16; i++) {
            float want =
                dt == LOOM_DTYPE_BF16 ? loom_ir_bf16_to_f32(h[i]) : loom_ir_f16_to_f32(h[i]);
            if (memcmp(&f[i], &want, sizeof want) != 0)
                fail_msg("%s 0x%04x widened to %a, want %a", loom_dtype_name(dt), h[i], f[i], want);
        }
        size_t n = (size_t)65536 * LOWS - 3;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(i / LOWS) << 16 | lows[i % LOWS];
            memcpy(&f[i], &u, sizeof u);
        }
        static const float scales[3] = {1.0f, 0.5f, 1.0f / 3.0f};
        for (int s = 0; s < 3; s++) {
            loom_rt_narrow16(got, f, n, scales[s], dt);
            for (size_t i = 0; i < n; i++) {
                float v = f[i] * scales[s];
                uint16_t want =
                    dt == LOOM_DTYPE_BF16 ? loom_ir_f32_to_bf16(v) : loom_ir_f32_to_f16(v);
                if (got[i] != want)
                    fail_msg("%s: %a x %a narrowed to 0x%04x, want 0x%04x", loom_dtype_name(dt),
                             f[i], scales[s], got[i], want);
            }
        }
    }
    /* f32 scaled, into another buffer and in place (patterns: the narrowing's) */
    size_t n = (size_t)65536 * LOWS - 5;
    float *scaled = malloc(sizeof *scaled * n);
    assert_non_null(scaled);
    loom_rt_scale_f32(scaled, f, n, 1.0f / 3.0f);
    for (size_t i = 0; i < n; i++) {
        float want = f[i] * (1.0f / 3.0f);
        if (memcmp(&scaled[i], &want, sizeof want) != 0 && !(isnan(scaled[i]) && isnan(want)))
            fail_msg("%a scaled to %a, want %a", f[i], scaled[i], want);
    }
    loom_rt_scale_f32(scaled, scaled, n, 3.0f);
    for (size_t i = 0; i < n; i++) {
        float want = f[i] * (1.0f / 3.0f) * 3.0f;
        if (memcmp(&scaled[i], &want, sizeof want) != 0 && !(isnan(scaled[i]) && isnan(want)))
            fail_msg("%a scaled in place to %a, want %a", f[i], scaled[i], want);
    }
    free(scaled);
    /* the element-by-element path when the vector one is switched off: the same results */
    loom_rt_bulk_allow_vector(false);
    assert_false(loom_rt_bulk_vector());
    loom_rt_narrow16(got, f, 40, 0.5f, LOOM_DTYPE_F16);
    loom_rt_bulk_allow_vector(true);
    for (size_t i = 0; i < 40; i++)
        assert_int_equal(got[i], loom_ir_f32_to_f16(f[i] * 0.5f));
    free(h);
    free(got);
    free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_without_a_launcher_the_communicator_is_rank_0_of_1, clean_env),
        cmocka_unit_test_setup(test_self_allreduce_scales_floats_and_keeps_integers, clean_env),
        cmocka_unit_test(test_bulk_loops_give_the_per_element_results),
        cmocka_unit_test_setup(test_self_broadcast_and_allgather_copy_this_ranks_values, clean_env),
        cmocka_unit_test_setup(test_nonblocking_allreduces_are_waited_in_any_order, clean_env),
        cmocka_unit_test_setup(test_16_bit_stagings_are_reused_and_never_shared, clean_env),
        cmocka_unit_test_setup(test_16_bit_stagings_kept_stay_within_their_byte_cap, clean_env),
        cmocka_unit_test_setup(test_completed_collectives_count_their_time_and_payload_bytes,
                               clean_env),
        cmocka_unit_test_setup(test_finalize_with_a_pending_request_is_refused, clean_env),
        cmocka_unit_test_setup(test_bad_arguments_are_reported_and_leave_the_communicator_usable,
                               clean_env),
        cmocka_unit_test_setup(
            test_a_collective_that_never_completes_times_out_and_fails_the_communicator, clean_env),
        cmocka_unit_test_setup(test_a_backend_error_names_the_collective_and_the_rank, clean_env),
        cmocka_unit_test_setup(test_the_backend_follows_options_then_loom_dist_then_the_launcher,
                               clean_env),
        cmocka_unit_test_setup(test_the_timeout_comes_from_options_then_loom_dist_timeout_s,
                               clean_env),
        cmocka_unit_test_setup(test_dist_api_before_init_is_rank_0_of_1_and_refuses_collectives,
                               clean_env),
        cmocka_unit_test_setup(test_dist_init_is_idempotent_and_finalize_undoes_it, clean_env),
        cmocka_unit_test_setup(test_dist_init_reports_bad_settings, clean_env),
        cmocka_unit_test_setup(test_a_context_takes_the_local_ranks_device_and_share_of_cores,
                               clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
