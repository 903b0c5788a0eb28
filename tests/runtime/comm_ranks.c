/* Multi-process communicator checks, one process per rank, started by run_comm_ranks.sh
 * under mpiexec (or alone). Every rank checks every collective against values computed by
 * hand from the rank count (and waits from a second thread), then the collective graph ops
 * (all_reduce, broadcast_from, all_gather) through loom_mark_step, the parameter broadcast
 * and the GradScaler's found_inf across ranks; prints "rank R of N: K checks
 * passed" or each failure, and exits 0 or 1.
 *
 *   comm_ranks collectives N BACKEND   every collective on N ranks, backend "self" or "mpi"
 *   comm_ranks timeout                 rank 0 waits in a barrier rank 1 never joins
 *   comm_ranks die                     rank 1 exits(3) while rank 0 waits in a barrier
 *   comm_ranks step_timeout            rank 0's step all-reduces, rank 1 never does
 *   comm_ranks mismatch                the two ranks' steps all-reduce different shapes */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "loom/amp.h"
#include "loom/dist.h"
#include "runtime/comm.h"
#include "runtime/kernel.h"
#include "rank_check.h"

#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        loom_ir_diag_init(&d);                                                                     \
        loom_status st_ = (call);                                                                  \
        CHECK(st_ == LOOM_OK, "%s: %s", loom_status_name(st_), d.msg);                             \
    } while (0)

#define CHECK_FAILS(call, code, part)                                                              \
    do {                                                                                           \
        loom_ir_diag_init(&d);                                                                     \
        loom_status st_ = (call);                                                                  \
        CHECK(st_ == (code) && strstr(d.msg, (part)), "%s \"%s\"", loom_status_name(st_), d.msg);  \
    } while (0)

enum { N_ELEMS = 6 };

/* Rank r's value i: (r + 1) * (i + 1), negated for odd i. Over N ranks, with S = N(N+1)/2:
 * sum = S * (i+1) * sign; max = N * (i+1) for even i, -(i+1) for odd; min the reverse. */
static double value(int r, int i) {
    return (r + 1) * (i + 1) * (i % 2 ? -1.0 : 1.0);
}

static double expected(loom_reduce_op op, int n, int i) {
    double sign = i % 2 ? -1.0 : 1.0, s = n * (n + 1) / 2.0;
    switch (op) {
    case LOOM_REDUCE_SUM: return s * (i + 1) * sign;
    case LOOM_REDUCE_MAX: return sign > 0 ? n * (i + 1) : -(i + 1);
    case LOOM_REDUCE_MIN: return sign > 0 ? (i + 1) : -n * (i + 1.0);
    case LOOM_REDUCE_COUNT_: break;
    }
    return NAN;
}

static void check_allreduce(loom_rt_comm *c, int n) {
    loom_ir_diag d;
    static const loom_reduce_op ops[] = {LOOM_REDUCE_SUM, LOOM_REDUCE_MAX, LOOM_REDUCE_MIN};
    static const double scales[] = {0.5, 2.0, 1.0};
    for (int k = 0; k < 3; k++) {
        loom_reduce_op op = ops[k];
        const char *name = loom_rt_reduce_op_name(op);
        float f[N_ELEMS];
        double g[N_ELEMS];
        uint16_t b[N_ELEMS], h[N_ELEMS];
        int32_t i32[N_ELEMS];
        int64_t i64[N_ELEMS];
        for (int i = 0; i < N_ELEMS; i++) {
            f[i] = (float)value(rank_, i);
            g[i] = value(rank_, i);
            b[i] = loom_ir_f32_to_bf16(f[i]);
            h[i] = loom_ir_f32_to_f16(f[i]);
            i32[i] = (int32_t)value(rank_, i);
            i64[i] = (int64_t)value(rank_, i) * 3000000000LL; /* beyond 32 bits */
        }
        double s = scales[k];
        CHECK_OK(loom_rt_comm_allreduce(c, f, N_ELEMS, LOOM_DTYPE_F32, op, s, &d));
        CHECK_OK(loom_rt_comm_allreduce(c, g, N_ELEMS, LOOM_DTYPE_F64, op, s, &d));
        CHECK_OK(loom_rt_comm_allreduce(c, b, N_ELEMS, LOOM_DTYPE_BF16, op, s, &d));
        CHECK_OK(loom_rt_comm_allreduce(c, h, N_ELEMS, LOOM_DTYPE_F16, op, s, &d));
        CHECK_OK(loom_rt_comm_allreduce(c, i32, N_ELEMS, LOOM_DTYPE_I32, op, 1.0, &d));
        CHECK_OK(loom_rt_comm_allreduce(c, i64, N_ELEMS, LOOM_DTYPE_I64, op, 1.0, &d));
        for (int i = 0; i < N_ELEMS; i++) {
            double want = expected(op, n, i);
            CHECK(f[i] == (float)(want * s), "f32 %s [%d]: %g, expected %g", name, i, f[i],
                  want * s);
            CHECK(g[i] == want * s, "f64 %s [%d]: %g, expected %g", name, i, g[i], want * s);
            CHECK(loom_ir_bf16_to_f32(b[i]) == (float)(want * s), "bf16 %s [%d]: %g, expected %g",
                  name, i, loom_ir_bf16_to_f32(b[i]), want * s);
            CHECK(loom_ir_f16_to_f32(h[i]) == (float)(want * s), "f16 %s [%d]: %g, expected %g",
                  name, i, loom_ir_f16_to_f32(h[i]), want * s);
            CHECK(i32[i] == (int32_t)want, "i32 %s [%d]: %d, expected %g", name, i, (int)i32[i],
                  want);
            CHECK(i64[i] == (int64_t)want * 3000000000LL, "i64 %s [%d]: %lld, expected %g*3e9",
                  name, i, (long long)i64[i], want);
        }
    }

    /* bf16 sums are rounded once, after an f32 reduction: 256 + 1 + 1 is 258 in bf16, while
     * rounding after each addition would give 256 (257 rounds to even 256). */
    uint16_t b = loom_ir_f32_to_bf16(rank_ == 0 ? 256.0f : 1.0f);
    CHECK_OK(loom_rt_comm_allreduce(c, &b, 1, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1.0, &d));
    float want_b = loom_ir_bf16_to_f32(loom_ir_f32_to_bf16(256.0f + (float)(n - 1)));
    CHECK(loom_ir_bf16_to_f32(b) == want_b, "bf16 256+1+...: %g, expected %g",
          loom_ir_bf16_to_f32(b), want_b);

    /* bool: max is "any rank", min "every rank". */
    uint8_t any[2] = {rank_ == n - 1, 1}, all[2] = {rank_ == n - 1, 1};
    CHECK_OK(loom_rt_comm_allreduce(c, any, 2, LOOM_DTYPE_BOOL, LOOM_REDUCE_MAX, 1.0, &d));
    CHECK_OK(loom_rt_comm_allreduce(c, all, 2, LOOM_DTYPE_BOOL, LOOM_REDUCE_MIN, 1.0, &d));
    CHECK(any[0] == 1 && any[1] == 1, "bool max: %d %d", any[0], any[1]);
    CHECK(all[0] == (n == 1) && all[1] == 1, "bool min: %d %d", all[0], all[1]);
}

static void check_nonblocking(loom_rt_comm *c, int n) {
    loom_ir_diag d;
    /* Three in flight at once, waited in another order than started. */
    float a[3] = {1, 2, 3};
    int32_t m[2] = {rank_, -rank_};
    uint16_t b[2] = {loom_ir_f32_to_bf16(2.0f), loom_ir_f32_to_bf16(-4.0f)};
    loom_rt_comm_request *ra = NULL, *rm = NULL, *rb = NULL;
    CHECK_OK(
        loom_rt_comm_allreduce_start(c, a, 3, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1.0 / n, &ra, &d));
    CHECK_OK(loom_rt_comm_allreduce_start(c, m, 2, LOOM_DTYPE_I32, LOOM_REDUCE_MAX, 1, &rm, &d));
    CHECK_OK(loom_rt_comm_allreduce_start(c, b, 2, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 0.5, &rb, &d));
    if (!ra || !rm || !rb)
        return;
    CHECK(atomic_load(&c->pending) == 3, "pending %d", atomic_load(&c->pending));
    bool done = false;
    loom_status st = LOOM_OK;
    loom_ir_diag_init(&d);
    for (int64_t t0 = loom_rt_now_ns(); st == LOOM_OK && !done;) {
        st = loom_rt_comm_test(rm, &done, &d);
        if (loom_rt_now_ns() - t0 > 10 * (int64_t)1000000000)
            break;
    }
    CHECK(st == LOOM_OK && done, "polling the i32 max: %s, done %d: %s", loom_status_name(st), done,
          d.msg);
    CHECK_OK(loom_rt_comm_wait(rm, &d));
    CHECK_OK(loom_rt_comm_wait(rb, &d));
    CHECK_OK(loom_rt_comm_wait(ra, &d));
    for (int i = 0; i < 3; i++)
        CHECK(fabsf(a[i] - (float)(i + 1)) <= 1e-6f * (i + 1), "f32 mean [%d]: %g", i, a[i]);
    CHECK(m[0] == n - 1 && m[1] == 0, "i32 max: %d %d", (int)m[0], (int)m[1]);
    CHECK(loom_ir_bf16_to_f32(b[0]) == (float)n && loom_ir_bf16_to_f32(b[1]) == -2.0f * n,
          "bf16 sum/2: %g %g", loom_ir_bf16_to_f32(b[0]), loom_ir_bf16_to_f32(b[1]));
    CHECK(atomic_load(&c->pending) == 0, "pending %d", atomic_load(&c->pending));
}

/* A wait on another thread than the one that started the collective, as the device's
 * stream thread will wait on what the host started. */
typedef struct waiter {
    loom_rt_comm_request *req;
    loom_status st;
    loom_ir_diag d;
} waiter;

static void *wait_on_thread(void *arg) {
    waiter *w = arg;
    loom_ir_diag_init(&w->d);
    w->st = loom_rt_comm_wait(w->req, &w->d);
    return NULL;
}

/* Two threads waiting at once (MPI_THREAD_SERIALIZED: Loom's lock keeps their MPI calls
 * apart), then a blocking all-reduce made entirely on a second thread. Both collectives are
 * posted by this thread first, so every rank posts them in the same order. */
static void check_threads(loom_rt_comm *c, int n) {
    loom_ir_diag d;
    double x[2] = {rank_ + 1.0, -1.0};
    int64_t y[1] = {rank_};
    waiter w = {0};
    loom_rt_comm_request *ry = NULL;
    CHECK_OK(loom_rt_comm_allreduce_start(c, x, 2, LOOM_DTYPE_F64, LOOM_REDUCE_SUM, 1, &w.req, &d));
    CHECK_OK(loom_rt_comm_allreduce_start(c, y, 1, LOOM_DTYPE_I64, LOOM_REDUCE_MIN, 1, &ry, &d));
    if (!w.req || !ry)
        return;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_on_thread, &w) == 0, "pthread_create");
    CHECK_OK(loom_rt_comm_wait(ry, &d));
    pthread_join(t, NULL);
    CHECK(w.st == LOOM_OK, "wait on a thread: %s", w.d.msg);
    CHECK(x[0] == n * (n + 1) / 2.0 && x[1] == -n, "f64 sum from a thread: %g %g", x[0], x[1]);
    CHECK(y[0] == 0, "i64 min: %lld", (long long)y[0]);
}

static void check_broadcast_and_allgather(loom_rt_comm *c, int n) {
    loom_ir_diag d;
    for (int root = 0; root < n; root++) {
        float f[3] = {(float)rank_, rank_ * 10.0f + 0.5f, -1.0f * rank_};
        int32_t i[2] = {rank_ * 100, -rank_};
        uint16_t b[2] = {loom_ir_f32_to_bf16((float)rank_ + 0.5f),
                         loom_ir_f32_to_bf16(rank_ * 3.0f)};
        CHECK_OK(loom_rt_comm_broadcast(c, f, 3, LOOM_DTYPE_F32, root, &d));
        CHECK_OK(loom_rt_comm_broadcast(c, i, 2, LOOM_DTYPE_I32, root, &d));
        CHECK_OK(loom_rt_comm_broadcast(c, b, 2, LOOM_DTYPE_BF16, root, &d));
        CHECK(f[0] == (float)root && f[1] == root * 10.0f + 0.5f && f[2] == -1.0f * root,
              "f32 from %d: %g %g %g", root, f[0], f[1], f[2]);
        CHECK(i[0] == root * 100 && i[1] == -root, "i32 from %d: %d %d", root, (int)i[0],
              (int)i[1]);
        CHECK(loom_ir_bf16_to_f32(b[0]) == root + 0.5f && loom_ir_bf16_to_f32(b[1]) == root * 3.0f,
              "bf16 from %d", root);
    }

    enum { MAX_RANKS = 8 };
    if (n > MAX_RANKS)
        return;
    int32_t send[2] = {rank_ * 10, rank_ * 10 + 1}, recv[2 * MAX_RANKS];
    float fs[1] = {rank_ * 1.5f}, fr[MAX_RANKS];
    uint16_t bs[2] = {loom_ir_f32_to_bf16(-(float)rank_), loom_ir_f32_to_bf16(rank_ + 0.25f)},
             br[2 * MAX_RANKS];
    memset(recv, 0xff, sizeof recv);
    CHECK_OK(loom_rt_comm_allgather(c, send, recv, 2, LOOM_DTYPE_I32, &d));
    CHECK_OK(loom_rt_comm_allgather(c, fs, fr, 1, LOOM_DTYPE_F32, &d));
    CHECK_OK(loom_rt_comm_allgather(c, bs, br, 2, LOOM_DTYPE_BF16, &d));
    for (int r = 0; r < n; r++) {
        CHECK(recv[2 * r] == r * 10 && recv[2 * r + 1] == r * 10 + 1, "i32 gather [%d]: %d %d", r,
              (int)recv[2 * r], (int)recv[2 * r + 1]);
        CHECK(fr[r] == r * 1.5f, "f32 gather [%d]: %g", r, fr[r]);
        CHECK(loom_ir_bf16_to_f32(br[2 * r]) == -(float)r &&
                  loom_ir_bf16_to_f32(br[2 * r + 1]) == r + 0.25f,
              "bf16 gather [%d]", r);
    }
    /* In place: this rank's part already sits at its offset. */
    int32_t all[MAX_RANKS];
    for (int r = 0; r < n; r++)
        all[r] = r == rank_ ? 7 * rank_ + 1 : -99;
    CHECK_OK(loom_rt_comm_allgather(c, NULL, all, 1, LOOM_DTYPE_I32, &d));
    for (int r = 0; r < n; r++)
        CHECK(all[r] == 7 * r + 1, "in-place gather [%d]: %d", r, (int)all[r]);
}

/* Local argument errors: every rank makes the same bad calls, and none reaches MPI, so the
 * ranks stay in step (the barrier after them proves it). */
static void check_errors(loom_rt_comm *c, int n) {
    loom_ir_diag d;
    float f[2] = {1, 2};
    int32_t i[2] = {1, 2};
    char root_msg[64];
    snprintf(root_msg, sizeof root_msg, "root %d is not a rank (world size %d)", n, n);
    CHECK_FAILS(loom_rt_comm_broadcast(c, f, 2, LOOM_DTYPE_F32, n, &d),
                LOOM_STATUS_INVALID_ARGUMENT, root_msg);
    CHECK_FAILS(loom_rt_comm_broadcast(c, f, 2, LOOM_DTYPE_F32, -1, &d),
                LOOM_STATUS_INVALID_ARGUMENT, "root -1 is not a rank");
    CHECK_FAILS(loom_rt_comm_allreduce(c, f, 2, LOOM_DTYPE_COUNT_, LOOM_REDUCE_SUM, 1, &d),
                LOOM_STATUS_INVALID_ARGUMENT, "unknown dtype");
    CHECK_FAILS(loom_rt_comm_allreduce(c, i, 2, LOOM_DTYPE_I32, LOOM_REDUCE_SUM, 0.5, &d),
                LOOM_STATUS_INVALID_ARGUMENT, "scale 0.5 on i32");
    CHECK_FAILS(
        loom_rt_comm_allreduce(c, f, (size_t)INT32_MAX + 1, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1, &d),
        LOOM_STATUS_INVALID_ARGUMENT, "at most 2147483647");
    CHECK_FAILS(loom_rt_comm_allgather(c, f, NULL, 2, LOOM_DTYPE_F32, &d),
                LOOM_STATUS_INVALID_ARGUMENT, "recv is NULL");
    CHECK_OK(loom_rt_comm_barrier(c, &d));
    CHECK(!atomic_load(&c->failed), "argument errors failed the communicator");
    /* Zero elements (and no buffer) is a valid collective on every rank. */
    CHECK_OK(loom_rt_comm_allreduce(c, NULL, 0, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 0.5, &d));
    CHECK_OK(loom_rt_comm_allreduce(c, NULL, 0, LOOM_DTYPE_I64, LOOM_REDUCE_MAX, 1, &d));
    CHECK_OK(loom_rt_comm_broadcast(c, NULL, 0, LOOM_DTYPE_F32, n - 1, &d));
    CHECK_OK(loom_rt_comm_allgather(c, NULL, NULL, 0, LOOM_DTYPE_I32, &d));
}

/* The collectives as graph ops (loom/dist.h) through a real loom_mark_step on every rank, in
 * f32, bf16 and i32, with a compiling context (the step falls back to the interpreter) and an
 * eager one: all_reduce sum, max and min each with a scale (floats), broadcast_from every root,
 * all_gather of a matrix. Values are small integers: exact in bf16 after the scale. A bf16 sum
 * is rounded once, after the reduction (as on the communicator). */
static void check_graph_ops(int n) {
    enum { MAX_RANKS = 8 };
    if (n > MAX_RANKS)
        return;
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_I32};
    static const loom_reduce_op ops[] = {LOOM_REDUCE_SUM, LOOM_REDUCE_MAX, LOOM_REDUCE_MIN};
    for (int eager = 0; eager < 2; eager++) {
        for (int k = 0; k < 3; k++) {
            loom_dtype dt = dts[k];
            bool fl = dt != LOOM_DTYPE_I32;
            const char *how = eager ? "eager" : "jit";
            loom_context *ctx = new_context(eager);
            if (!ctx)
                continue;
            unsigned char in[N_ELEMS * 4];
            for (int i = 0; i < N_ELEMS; i++)
                loom_ir_store_f64(in, dt, i, value(rank_, i));
            const int64_t shape[1] = {N_ELEMS};
            loom_tensor *x = loom_tensor_from_host(ctx, dt, 1, shape, in);
            const double scales[] = {fl ? 0.5 : 1.0, fl ? -2.0 : 1.0, fl ? 0.25 : 1.0};
            /* The three all-reduces, a broadcast from each root, the all-gather. */
            loom_tensor *r[3 + MAX_RANKS + 1];
            int nr = 0;
            for (int j = 0; j < 3; j++)
                r[nr++] = loom_all_reduce(ctx, x, ops[j], scales[j]);
            for (int root = 0; root < n; root++)
                r[nr++] = loom_broadcast_from(ctx, x, root);
            r[nr++] = loom_all_gather(ctx, loom_reshape(ctx, x, 2, (int64_t[]){2, N_ELEMS / 2}));
            /* 256 on rank 0, 1 on the others: 256 + (n - 1) rounded once to bf16. */
            uint16_t once_in = loom_ir_f32_to_bf16(rank_ == 0 ? 256.0f : 1.0f);
            loom_tensor *once_x =
                dt == LOOM_DTYPE_BF16 ? loom_tensor_from_host(ctx, dt, 0, NULL, &once_in) : NULL;
            loom_tensor *once = once_x ? loom_all_reduce(ctx, once_x, LOOM_REDUCE_SUM, 1.0) : NULL;
            for (int j = 0; j < nr; j++)
                loom_tensor_retain(r[j]);
            loom_tensor_retain(once);
            CHECK(loom_mark_step(ctx) == LOOM_OK, "%s %s step: %s", loom_dtype_name(dt), how,
                  loom_context_error_message(ctx));
            unsigned char out[N_ELEMS * MAX_RANKS * 4];
            size_t es = loom_dtype_size(dt);
            for (int j = 0; j < nr; j++) {
                bool gather = j == nr - 1;
                int64_t count = gather ? (int64_t)N_ELEMS * n : N_ELEMS;
                char what[32];
                if (j < 3)
                    snprintf(what, sizeof what, "%s", loom_rt_reduce_op_name(ops[j]));
                else
                    snprintf(what, sizeof what, gather ? "all_gather" : "broadcast_from %d", j - 3);
                loom_status st = loom_tensor_read(ctx, r[j], out, (size_t)count * es);
                CHECK(st == LOOM_OK, "read %d: %s", j, loom_context_error_message(ctx));
                for (int64_t i = 0; st == LOOM_OK && i < count; i++) {
                    int e = (int)(i % N_ELEMS);
                    double want = j < 3    ? scales[j] * expected(ops[j], n, e)
                                  : gather ? value((int)(i / N_ELEMS), e)
                                           : value(j - 3, e);
                    double got = loom_ir_load_f64(out, dt, i);
                    CHECK(got == want, "%s %s %s element %lld: got %g, expected %g", what,
                          loom_dtype_name(dt), how, (long long)i, got, want);
                }
                if (gather) {
                    int32_t rank = 0;
                    int64_t got_shape[LOOM_MAX_RANK] = {0};
                    CHECK(loom_tensor_rank(r[j], &rank) == LOOM_OK &&
                              loom_tensor_shape(r[j], got_shape) == LOOM_OK && rank == 2 &&
                              got_shape[0] == 2 * n && got_shape[1] == N_ELEMS / 2,
                          "all_gather of [2,%d] on %d ranks: rank %d, [%lld,%lld]", N_ELEMS / 2, n,
                          (int)rank, (long long)got_shape[0], (long long)got_shape[1]);
                }
                loom_tensor_release(r[j]);
            }
            if (once) {
                uint16_t got = 0;
                float want = loom_ir_bf16_to_f32(loom_ir_f32_to_bf16(256.0f + (float)(n - 1)));
                CHECK(loom_tensor_read(ctx, once, &got, sizeof got) == LOOM_OK &&
                          loom_ir_bf16_to_f32(got) == want,
                      "bf16 %s 256+1+...: %g, expected %g", how, loom_ir_bf16_to_f32(got), want);
            }
            loom_tensor_release(once);
            loom_tensor_release(once_x);
            /* compiled: the program runs the collectives, no interpreter fallback */
            CHECK(loom_metric_value(ctx, "Fallbacks") == 0, "%s %s: %lld fallbacks",
                  loom_dtype_name(dt), how, (long long)loom_metric_value(ctx, "Fallbacks"));
            loom_tensor_release(x);
            loom_context_destroy(ctx);
        }
    }
}

/* Data-parallel state: loom_broadcast_parameters gives every rank rank 0's values, and the
 * GradScaler's found_inf is max-reduced, so when only the last rank's gradient overflows every
 * rank skips (found_inf 1, scale backed off) and a clean step afterwards is clean on all. */
/* A barrier right after loom_mark_step, while the step's collectives (its agreement and its
 * all-reduce) may still run on the stream thread: the barrier waits for the step first, so
 * it never meets them (it used to fail with "collectives differ"). */
static void check_barrier_after_an_async_step(int n) {
    loom_context *ctx = new_context(false);
    for (int round = 0; round < 5; round++) {
        float v[256];
        for (int i = 0; i < 256; i++)
            v[i] = (float)(rank_ + round);
        loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){256}, v);
        loom_tensor *s = loom_all_reduce(ctx, x, LOOM_REDUCE_SUM, 1.0);
        loom_tensor_retain(s);
        CHECK(loom_mark_step(ctx) == LOOM_OK, "async step: %s", loom_context_error_message(ctx));
        CHECK(loom_dist_barrier() == LOOM_OK, "barrier after a step: %s",
              loom_dist_error_message());
        float got = 0;
        CHECK(loom_tensor_read(ctx, s, v, sizeof v) == LOOM_OK &&
                  (got = v[255]) == (float)(n * (n - 1) / 2 + n * round),
              "round %d: sum %g", round, got);
        loom_tensor_release(s);
        loom_tensor_release(x);
    }
    loom_context_destroy(ctx);
}

static void check_data_parallel_state(int n) {
    loom_context *ctx = new_context(false);
    if (!ctx)
        return;
    const float mine[2] = {(float)(rank_ + 1), -(float)(rank_ + 1)};
    const int64_t shape[1] = {2};
    loom_tensor *p = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, shape, mine);
    CHECK(loom_broadcast_parameters(ctx, 1, &p) == LOOM_OK, "broadcast_parameters: %s",
          loom_context_error_message(ctx));
    CHECK(loom_mark_step(ctx) == LOOM_OK, "broadcast step: %s", loom_context_error_message(ctx));
    float got[2] = {0, 0};
    CHECK(loom_tensor_read(ctx, p, got, sizeof got) == LOOM_OK && got[0] == 1 && got[1] == -1,
          "parameter after broadcast: %g %g, expected 1 -1", got[0], got[1]);

    /* DDP's gradient average: the ranks' mean; one rank records nothing. Its bytes are the
     * gradient's 8 and the 32 of the step's agreement check. */
    const float gm[2] = {(float)(rank_ + 1), 2.0f * (float)(rank_ + 1)};
    loom_tensor *mine_g = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, shape, gm);
    loom_tensor *avg[2] = {mine_g, NULL};
    int64_t bytes0 = loom_metric_value(ctx, "CollectiveBytes");
    CHECK(loom_allreduce_gradients(ctx, 2, avg) == LOOM_OK, "allreduce_gradients: %s",
          loom_context_error_message(ctx));
    CHECK((avg[0] != mine_g) == (n > 1) && avg[1] == NULL, "gradients replaced on %d rank(s)", n);
    loom_tensor_retain(avg[0]);
    CHECK(loom_mark_step(ctx) == LOOM_OK, "gradient step: %s", loom_context_error_message(ctx));
    float want = (float)(n + 1) / 2;
    CHECK(loom_tensor_read(ctx, avg[0], got, sizeof got) == LOOM_OK &&
              fabsf(got[0] - want) <= 1e-6f * want && fabsf(got[1] - 2 * want) <= 2e-6f * want,
          "gradient average %g %g, expected %g %g", got[0], got[1], want, 2 * want);
    int64_t bytes = loom_metric_value(ctx, "CollectiveBytes") - bytes0;
    CHECK(bytes == (n > 1 ? 40 : 0), "CollectiveBytes grew by %lld, expected %d", (long long)bytes,
          n > 1 ? 40 : 0);
    loom_tensor_release(avg[0]);
    loom_tensor_release(mine_g);

    loom_grad_scaler_options so;
    loom_grad_scaler_options_init(&so);
    so.init_scale = 1024;
    loom_grad_scaler *sc = NULL;
    CHECK(loom_grad_scaler_create(ctx, &so, &sc) == LOOM_OK, "scaler");
    for (int step = 0; sc && step < 2; step++) {
        /* Step 0: only the last rank's gradient holds an inf. Step 1: every rank is clean. */
        const float gv[2] = {2, step == 0 && rank_ == n - 1 ? INFINITY : 4};
        loom_tensor *g = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, shape, gv);
        loom_tensor *grads[1] = {g};
        loom_tensor *found = loom_grad_scaler_unscale(sc, 1, grads);
        loom_tensor_retain(found);
        CHECK(loom_grad_scaler_update(sc, found) == LOOM_OK, "update: %s",
              loom_context_error_message(ctx));
        CHECK(loom_mark_step(ctx) == LOOM_OK, "scaler step %d: %s", step,
              loom_context_error_message(ctx));
        float f = -1, scale = -1;
        CHECK(loom_tensor_read(ctx, found, &f, sizeof f) == LOOM_OK && f == (step == 0 ? 1 : 0),
              "step %d found_inf %g", step, f);
        CHECK(loom_tensor_read(ctx, loom_grad_scaler_scale_tensor(sc), &scale, sizeof scale) ==
                      LOOM_OK &&
                  scale == 512,
              "step %d scale %g, expected 512 on every rank", step, scale);
        loom_tensor_release(found);
        loom_tensor_release(g);
    }
    CHECK(loom_metric_value(ctx, "Fallbacks") == 0, "scaler steps: %lld fallbacks",
          (long long)loom_metric_value(ctx, "Fallbacks"));
    loom_grad_scaler_destroy(sc);
    loom_tensor_release(p);
    loom_context_destroy(ctx);
}

static int run_collectives(int n, const char *backend) {
    loom_ir_diag d;
    /* Before init: rank 0 of 1, and collectives refuse. */
    CHECK(!loom_dist_is_initialized() && loom_dist_rank() == 0 && loom_dist_world_size() == 1,
          "not initialized yet");
    CHECK(loom_dist_barrier() == LOOM_STATUS_INVALID_ARGUMENT &&
              strstr(loom_dist_error_message(), "before loom_dist_init"),
          "barrier before init: %s", loom_dist_error_message());
    CHECK_FAILS(loom_rt_comm_allreduce(loom_rt_comm_world(), NULL, 0, LOOM_DTYPE_F32,
                                       LOOM_REDUCE_SUM, 1, &d),
                LOOM_STATUS_INVALID_ARGUMENT, "allreduce before loom_dist_init");

    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "rank ?: loom_dist_init: %s\n", loom_dist_error_message());
        return 1;
    }
    rank_ = loom_dist_rank();
    loom_rt_comm *c = loom_rt_comm_world();
    CHECK(loom_dist_world_size() == n, "world size %d, expected %d", loom_dist_world_size(), n);
    CHECK(rank_ >= 0 && rank_ < n, "rank %d", rank_);
    CHECK(strcmp(loom_dist_backend_name(), backend) == 0, "backend %s, expected %s",
          loom_dist_backend_name(), backend);
    /* One machine: the local rank is the rank. */
    CHECK(loom_dist_local_rank() == rank_ && loom_dist_local_size() == n, "local rank %d of %d",
          loom_dist_local_rank(), loom_dist_local_size());

    /* The context's default device and threads follow the local rank. */
    loom_context *ctx = new_context(true);
    if (ctx) {
        char want[16];
        snprintf(want, sizeof want, "npu:%d", rank_);
        CHECK(strcmp(ctx->device->name, want) == 0, "device %s, expected %s", ctx->device->name,
              want);
        CHECK(loom_rt_pool_threads(ctx->pool) == loom_rt_default_threads_shared(n),
              "threads %d, expected %d", loom_rt_pool_threads(ctx->pool),
              loom_rt_default_threads_shared(n));
        loom_context_destroy(ctx);
    }

    check_allreduce(c, n);
    check_nonblocking(c, n);
    check_threads(c, n);
    check_broadcast_and_allgather(c, n);
    check_errors(c, n);
    check_graph_ops(n);
    check_data_parallel_state(n);
    check_barrier_after_an_async_step(n);
    CHECK(loom_dist_barrier() == LOOM_OK, "barrier: %s", loom_dist_error_message());
    CHECK(loom_dist_finalize() == LOOM_OK, "finalize: %s", loom_dist_error_message());
    CHECK(strcmp(loom_dist_backend_name(), "none") == 0, "after finalize: %s",
          loom_dist_backend_name());
    if (strcmp(backend, "mpi") == 0) {
        CHECK(loom_dist_init(NULL) == LOOM_STATUS_UNSUPPORTED &&
                  strstr(loom_dist_error_message(), "cannot be initialized again"),
              "init after MPI_Finalize: %s", loom_dist_error_message());
    }
    printf("rank %d of %d: %d checks passed, %d failed\n", rank_, n, checks - failures, failures);
    return failures ? 1 : 0;
}

/* Rank 0 waits in a barrier that rank 1 never joins: with LOOM_DIST_TIMEOUT_S=0.5 it must
 * fail within about that long, name the barrier and the rank, and fail everything after. */
/* Joins the job; every rank but 0 sleeps (mpiexec ends it once rank 0 exits non-zero) and
 * gets 0 to exit with; rank 0 gets 2 and goes on; 1 if the join failed. */
static int join_and_park_other_ranks(void) {
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "loom_dist_init: %s\n", loom_dist_error_message());
        return 1;
    }
    rank_ = loom_dist_rank();
    if (rank_ != 0) {
        sleep(20);
        return 0;
    }
    return 2;
}

static int run_timeout(void) {
    int joined = join_and_park_other_ranks();
    if (joined != 2)
        return joined;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = loom_dist_barrier();
    double waited = (double)(loom_rt_now_ns() - t0) / 1e9;
    fprintf(stderr, "rank 0: barrier: %s after %.2f s: %s\n", loom_status_name(st), waited,
            loom_dist_error_message());
    CHECK(st == LOOM_STATUS_COMM_ERROR, "barrier: %s", loom_status_name(st));
    CHECK(strstr(loom_dist_error_message(),
                 "barrier #1 on rank 0 of 2 did not complete within 0.5 s") != NULL,
          "message: %s", loom_dist_error_message());
    CHECK(waited >= 0.45 && waited < 5.0, "waited %.2f s", waited);
    CHECK(loom_dist_barrier() == LOOM_STATUS_COMM_ERROR &&
              strstr(loom_dist_error_message(), "failed earlier"),
          "second barrier: %s", loom_dist_error_message());
    CHECK(loom_dist_finalize() == LOOM_STATUS_COMM_ERROR &&
              strstr(loom_dist_error_message(), "MPI left unfinalized"),
          "finalize: %s", loom_dist_error_message());
    fprintf(stderr, "rank 0: finalize: %s\n", loom_dist_error_message());
    printf("rank 0 of 2: %d checks passed, %d failed\n", checks - failures, failures);
    /* Exit non-zero as a program should after a COMM_ERROR; 42 tells the script the checks
     * above passed. */
    return failures ? 1 : 42;
}

/* The same inside a step: rank 0's all_reduce graph op is never joined; loom_mark_step
 * fails with COMM_ERROR naming the op and this file's line, within LOOM_DIST_TIMEOUT_S. */
static int run_step_timeout(void) {
    int joined = join_and_park_other_ranks();
    if (joined != 2)
        return joined;
    loom_context *ctx = new_context(false);
    if (!ctx)
        return 1;
    const float xs[2] = {1, 2};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, xs);
    int line = __LINE__ + 1;
    loom_tensor *y = loom_all_reduce(ctx, x, LOOM_REDUCE_SUM, 0.5);
    loom_tensor_retain(y);
    int64_t t0 = loom_rt_now_ns();
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK) /* the step may run asynchronously: its error surfaces at the sync */
        st = loom_context_sync(ctx);
    double waited = (double)(loom_rt_now_ns() - t0) / 1e9;
    const char *msg = loom_context_error_message(ctx);
    fprintf(stderr, "rank 0: step: %s after %.2f s: %s\n", loom_status_name(st), waited, msg);
    char where[64];
    snprintf(where, sizeof where, "comm_ranks.c:%d", line);
    CHECK(st == LOOM_STATUS_COMM_ERROR, "step: %s", loom_status_name(st));
    CHECK(strstr(msg, where) && strstr(msg, "all_reduce of f32[2]") &&
              strstr(msg, "did not complete within 0.5 s"),
          "message: %s", msg);
    CHECK(waited < 5.0, "waited %.2f s", waited);
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    loom_dist_finalize();
    printf("rank 0 of 2: %d checks passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 42;
}

/* Rank 0 all-reduces f32[2], rank 1 f32[3]: both steps fail with COMM_ERROR saying the
 * ranks are not running the same step, naming the first node where their graphs differ (the
 * input, at this file's line) as each rank has it, instead of hanging. */
static int run_mismatch(void) {
    if (loom_dist_init(NULL) != LOOM_OK || loom_dist_world_size() != 2) {
        fprintf(stderr, "loom_dist_init: %s (needs 2 ranks)\n", loom_dist_error_message());
        return 1;
    }
    rank_ = loom_dist_rank();
    loom_context *ctx = new_context(false);
    if (!ctx)
        return 1;
    const float xs[3] = {1, 2, 3};
    int line = __LINE__ + 1;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2 + rank_}, xs);
    loom_tensor *y = loom_all_reduce(ctx, x, LOOM_REDUCE_SUM, 1.0);
    loom_tensor_retain(y);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_context_sync(ctx);
    const char *msg = loom_context_error_message(ctx);
    fprintf(stderr, "rank %d: step: %s: %s\n", rank_, loom_status_name(st), msg);
    char mine[96], other[96];
    snprintf(mine, sizeof mine, "rank %d: `%%0 = input {index = 0} : f32[%d]` at comm_ranks.c:%d",
             rank_, 2 + rank_, line);
    snprintf(other, sizeof other, "rank %d: `%%0 = input {index = 0} : f32[%d]` at comm_ranks.c:%d",
             1 - rank_, 3 - rank_, line);
    CHECK(st == LOOM_STATUS_COMM_ERROR, "step: %s", loom_status_name(st));
    CHECK(strstr(msg, "the ranks are not running the same step") &&
              strstr(msg, "their graphs differ first at node %0") && strstr(msg, mine) &&
              strstr(msg, other),
          "message: %s", msg);
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    loom_dist_finalize();
    printf("rank %d of 2: %d checks passed, %d failed\n", rank_, checks - failures, failures);
    return failures ? 1 : 42;
}

/* Rank 1 dies right after joining; rank 0 waits in a barrier. mpiexec must end the job. */
static int run_die(void) {
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "loom_dist_init: %s\n", loom_dist_error_message());
        return 1;
    }
    if (loom_dist_rank() == 1)
        exit(3);
    loom_status st = loom_dist_barrier();
    fprintf(stderr, "rank 0: barrier returned %s: %s\n", loom_status_name(st),
            loom_dist_error_message());
    return st == LOOM_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "collectives") == 0 && argc == 4)
        return run_collectives(atoi(argv[2]), argv[3]);
    if (strcmp(mode, "timeout") == 0)
        return run_timeout();
    if (strcmp(mode, "die") == 0)
        return run_die();
    if (strcmp(mode, "step_timeout") == 0)
        return run_step_timeout();
    if (strcmp(mode, "mismatch") == 0)
        return run_mismatch();
    fprintf(stderr,
            "usage: comm_ranks collectives N self|mpi | timeout | die | step_timeout | mismatch\n");
    return 2;
}
