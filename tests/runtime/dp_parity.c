/* Data-parallel parity, one process per rank, started by run_dp_parity.sh under mpiexec (or
 * alone). A tiny MLP (8 -> 16 -> 4, ReLU, cross-entropy) trains STEPS steps on a global batch of
 * BATCH rows; on N ranks rank r takes rows r*BATCH/N .. (r+1)*BATCH/N - 1 and its gradients are
 * averaged by loom_allreduce_gradients (DDP). Each rank also trains the same model on the whole
 * batch in a second context that all-reduces no gradient: the one-process run (world size 1
 * cannot be had inside an mpiexec job of several ranks, and this keeps the reference in the
 * same process, with nothing written to files; its GradScaler still max-reduces found_inf
 * across the ranks, over values that are equal on every rank). After the last step every rank's
 * parameters, optimizer state and scaler state must equal the one-process run's within the case's
 * tolerance, and be bitwise equal across ranks.
 *
 * Cases: SGD with momentum and weight decay; AdamW; bf16 autocast with the GradScaler (SGD with
 * momentum), where step LOSS_INF_STEP's loss is multiplied by inf on the last rank only (the
 * gradient all-reduce spreads the inf) and step GRAD_INF_STEP's all-reduced gradient by inf on
 * rank 0 only (only found_inf's max-reduce tells the others): every rank must skip both steps
 * (parameters, optimizer state and step counter unchanged, scale halved), as the one-process
 * run does with the same injections.
 *
 *   dp_parity N [LOCAL]   every case on N ranks (N must divide BATCH), LOCAL of them on each
 *                         machine if given (run_netns.sh: one per network namespace);
 *                         prints per case the largest difference from the one-process run
 *                         and, on rank 0, a "digest CASE HEX" line of the final state's
 *                         bytes; ends with "rank R of N: K checks passed, F failed" and exits
 *                         0 when F is 0. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/amp.h"
#include "loom/dist.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "rank_check.h"

enum { IN = 8, HID = 16, OUT = 4, BATCH = 12, STEPS = 20, N_PARAMS = 4 };
/* Floats in a state snapshot: 212 parameters, at most 2 * 212 + 4 optimizer state values, the
 * scale and the growth tracker. */
enum { MAX_STATE = 1024 };
/* AMP case: 0-based steps that overflow on one rank (see the top of the file). */
enum { LOSS_INF_STEP = 5, GRAD_INF_STEP = 12 };

typedef struct dp_case {
    const char *name;
    loom_optim_kind kind;
    bool amp;
    /* |dp - one process| <= atol + rtol * |one process|, element by element. */
    double rtol, atol;
} dp_case;

/* The tolerances, measured on 1, 2 and 3 ranks (each run prints its largest difference as a
 * share of the tolerance). f32: the ranks' partial-batch gradient sums, added by the
 * all-reduce, round differently from one sum over the whole batch (a few ulps). After 20 steps
 * that leaves at most 6% of 1e-5 relative + 1e-6 absolute, on parameters moved by up to 0.3
 * (the same when the steps with collectives ran on the interpreter, f64 accumulation, against
 * a compiled one-process run). bf16: each rank's weight gradient is a matmul rounded to
 * bf16 (8 bits) before the all-reduce, where the one process rounds the whole batch's, ~0.4%
 * per step, which momentum SGD carries on: differences up to ~2e-3 on values ~0.1, 35% of
 * 5e-2 relative + 5e-3 absolute. Mistakes exceed the tolerance on most values: a rank reading
 * the wrong rows, no gradient all-reduce, no parameter broadcast, a step skipped on one rank
 * only (found_inf not max-reduced: 60-84 times the bf16 tolerance). */
static const dp_case cases[] = {
    {"sgd_momentum", LOOM_OPTIM_SGD, false, 1e-5, 1e-6},
    {"adamw", LOOM_OPTIM_ADAMW, false, 1e-5, 1e-6},
    {"bf16_amp_scaler", LOOM_OPTIM_SGD, true, 5e-2, 5e-3},
};

static int world_;

/* The global batch of a step, the same on every rank and in both runs. */
static void make_batch(int step, float *x, int32_t *y) {
    loom_rng rng;
    loom_rng_init(&rng, 1000 + (uint64_t)step);
    for (int i = 0; i < BATCH * IN; i++)
        x[i] = (float)loom_rng_normal(&rng);
    for (int i = 0; i < BATCH; i++)
        y[i] = (int32_t)(loom_rng_uniform(&rng) * OUT);
}

typedef struct trainer {
    bool dp; /* this rank's share of the batch, gradients all-reduced */
    loom_context *ctx;
    loom_nn_linear fc1, fc2;
    loom_tensor *params[N_PARAMS];
    loom_optim *opt;
    loom_grad_scaler *scaler;
} trainer;

static void trainer_deinit(trainer *t) {
    loom_grad_scaler_destroy(t->scaler);
    loom_optim_destroy(t->opt);
    loom_nn_linear_deinit(&t->fc2);
    loom_nn_linear_deinit(&t->fc1);
    loom_context_destroy(t->ctx);
    memset(t, 0, sizeof *t);
}

/* Every rank but 0 initializes the data-parallel model from another seed: the parameter
 * broadcast must replace it with rank 0's, which the one-process run starts from. */
static bool trainer_init(trainer *t, const dp_case *c, bool dp) {
    memset(t, 0, sizeof *t);
    t->dp = dp;
    t->ctx = new_context(false);
    if (!t->ctx)
        return false;
    loom_rng rng;
    loom_rng_init(&rng, 7 + (uint64_t)(dp ? rank_ : 0));
    bool ok = loom_nn_linear_init(t->ctx, &t->fc1, IN, HID, true, &rng) == LOOM_OK &&
              loom_nn_linear_init(t->ctx, &t->fc2, HID, OUT, true, &rng) == LOOM_OK;
    CHECK(ok, "%s: model: %s", c->name, loom_context_error_message(t->ctx));
    if (!ok)
        return false;
    t->params[0] = t->fc1.weight;
    t->params[1] = t->fc1.bias;
    t->params[2] = t->fc2.weight;
    t->params[3] = t->fc2.bias;
    if (dp) {
        CHECK(loom_broadcast_parameters(t->ctx, N_PARAMS, t->params) == LOOM_OK &&
                  loom_mark_step(t->ctx) == LOOM_OK,
              "%s: broadcast: %s", c->name, loom_context_error_message(t->ctx));
    }
    loom_optim_options o;
    loom_optim_options_init(&o, c->kind);
    if (c->kind == LOOM_OPTIM_SGD) {
        o.lr = 0.1;
        o.momentum = 0.9;
        o.weight_decay = 1e-3;
    } else {
        o.lr = 1e-2;
    }
    CHECK(loom_optim_create(t->ctx, &o, N_PARAMS, t->params, &t->opt) == LOOM_OK, "%s: optim: %s",
          c->name, loom_context_error_message(t->ctx));
    if (c->amp) {
        loom_grad_scaler_options so;
        loom_grad_scaler_options_init(&so);
        so.growth_interval = 4; /* the scale also grows within 20 steps */
        CHECK(loom_grad_scaler_create(t->ctx, &so, &t->scaler) == LOOM_OK, "%s: scaler: %s",
              c->name, loom_context_error_message(t->ctx));
    }
    return t->opt && (!c->amp || t->scaler);
}

/* A one-element f32 input of the step (a value, not a constant: the graph stays the same). */
static loom_tensor *scalar_input(loom_context *ctx, float v) {
    return loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &v);
}

/* One training step on the batch (x, y); *out_found gets found_inf (0 without a scaler). */
static void trainer_step(trainer *t, const dp_case *c, int step, const float *x, const int32_t *y,
                         float *out_found) {
    loom_context *ctx = t->ctx;
    int64_t rows = t->dp ? BATCH / world_ : BATCH, row0 = t->dp ? rank_ * rows : 0;
    bool loss_inf = c->amp && step == LOSS_INF_STEP && (!t->dp || rank_ == world_ - 1);
    bool grad_inf = c->amp && step == GRAD_INF_STEP && (!t->dp || rank_ == 0);
    loom_tensor *xt =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){rows, IN}, x + row0 * IN);
    loom_tensor *yt = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){rows}, y + row0);
    loom_tensor *lf = c->amp ? scalar_input(ctx, loss_inf ? INFINITY : 1.0f) : NULL;
    loom_tensor *gf = c->amp ? scalar_input(ctx, grad_inf ? INFINITY : 1.0f) : NULL;
    if (c->amp)
        loom_autocast_begin(ctx, LOOM_DTYPE_BF16);
    loom_tensor *h = loom_relu(ctx, loom_nn_linear_forward(ctx, &t->fc1, xt));
    loom_tensor *loss =
        loom_cross_entropy(ctx, loom_nn_linear_forward(ctx, &t->fc2, h), yt, LOOM_REDUCTION_MEAN);
    if (c->amp) {
        loom_autocast_end(ctx);
        loss = loom_grad_scaler_scale(t->scaler, loom_mul(ctx, loss, lf));
    }
    loom_tensor *grads[N_PARAMS] = {0}, *found = NULL;
    loom_backward(ctx, loss, N_PARAMS, t->params, grads);
    if (t->dp)
        loom_allreduce_gradients(ctx, N_PARAMS, grads);
    if (c->amp) {
        grads[0] = loom_mul(ctx, grads[0], gf);
        found = loom_grad_scaler_unscale(t->scaler, N_PARAMS, grads);
        loom_tensor_retain(found);
    }
    loom_optim_step(t->opt, grads, found);
    if (c->amp)
        loom_grad_scaler_update(t->scaler, found);
    CHECK(loom_mark_step(ctx) == LOOM_OK, "%s %s step %d: %s", c->name, t->dp ? "dp" : "one", step,
          loom_context_error_message(ctx));
    *out_found = 0;
    if (found)
        CHECK(loom_tensor_read(ctx, found, out_found, sizeof *out_found) == LOOM_OK,
              "%s %s step %d: found_inf: %s", c->name, t->dp ? "dp" : "one", step,
              loom_context_error_message(ctx));
    loom_tensor_release(found);
    loom_tensor_release(gf);
    loom_tensor_release(lf);
    loom_tensor_release(yt);
    loom_tensor_release(xt);
}

/* Reads n floats of t (f32, or i32 converted) into out; false after a failed check. */
static bool read_floats(trainer *t, loom_tensor *ts, float *out, int64_t cap, int64_t *n) {
    loom_dtype dt = LOOM_DTYPE_COUNT_;
    int64_t numel = 0;
    bool ok = loom_tensor_dtype(ts, &dt) == LOOM_OK && loom_tensor_numel(ts, &numel) == LOOM_OK &&
              numel <= cap && (dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_I32);
    CHECK(ok, "state tensor: dtype %d, %lld elements", (int)dt, (long long)numel);
    if (!ok)
        return false;
    ok = loom_tensor_read(t->ctx, ts, out, (size_t)numel * 4) == LOOM_OK;
    CHECK(ok, "reading state: %s", loom_context_error_message(t->ctx));
    for (int64_t i = 0; ok && dt == LOOM_DTYPE_I32 && i < numel; i++) {
        int32_t v;
        memcpy(&v, &out[i], sizeof v);
        out[i] = (float)v;
    }
    *n = numel;
    return ok;
}

/* Every value of the trainer's state: the parameters, then each parameter's optimizer state
 * (ending with the shared step counter), then the scale and the growth tracker (AMP). Returns
 * how many floats; the last two are the scaler's when it has one. */
static int64_t snapshot(trainer *t, float *out) {
    int64_t k = 0, n = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        if (!read_floats(t, t->params[i], out + k, MAX_STATE - k, &n))
            return 0;
        k += n;
    }
    for (int i = 0; i < N_PARAMS; i++) {
        loom_tensor *st[4];
        int32_t m = loom_optim_state(t->opt, i, NULL, st);
        for (int j = 0; j < m; j++) {
            if (!read_floats(t, st[j], out + k, MAX_STATE - k, &n))
                return 0;
            k += n;
        }
    }
    if (t->scaler) {
        if (!read_floats(t, loom_grad_scaler_scale_tensor(t->scaler), out + k, MAX_STATE - k, &n))
            return 0;
        k += n;
        if (!read_floats(t, loom_grad_scaler_growth_tracker(t->scaler), out + k, MAX_STATE - k, &n))
            return 0;
        k += n;
    }
    return k;
}

/* Checks that an overflowing step changed nothing but the scaler: every parameter and
 * optimizer value (the step counter too) bitwise as before, the scale halved, the tracker 0. */
static void check_skipped(const dp_case *c, const char *run, int step, const float *before,
                          const float *after, int64_t n) {
    CHECK(n > 2 && memcmp(before, after, (size_t)(n - 2) * sizeof *after) == 0,
          "%s %s step %d overflowed but changed the parameters or the optimizer state", c->name,
          run, step);
    CHECK(n > 2 && after[n - 2] == before[n - 2] * 0.5f && after[n - 1] == 0,
          "%s %s step %d: scale %g -> %g, tracker %g: expected halved and 0", c->name, run, step,
          n > 2 ? before[n - 2] : 0, n > 2 ? after[n - 2] : 0, n > 2 ? after[n - 1] : 0);
}

/* The data-parallel state must be bitwise the same on every rank: its max and min across the
 * ranks (loom_all_reduce in a step) both equal this rank's. */
static void check_same_on_every_rank(trainer *t, const dp_case *c, const float *snap, int64_t n) {
    loom_tensor *v = loom_tensor_from_host(t->ctx, LOOM_DTYPE_F32, 1, (int64_t[]){n}, snap);
    loom_tensor *mx = loom_all_reduce(t->ctx, v, LOOM_REDUCE_MAX, 1.0);
    loom_tensor *mn = loom_all_reduce(t->ctx, v, LOOM_REDUCE_MIN, 1.0);
    loom_tensor_retain(mx);
    loom_tensor_retain(mn);
    static float hi[MAX_STATE], lo[MAX_STATE];
    bool ok = loom_mark_step(t->ctx) == LOOM_OK &&
              loom_tensor_read(t->ctx, mx, hi, (size_t)n * sizeof *hi) == LOOM_OK &&
              loom_tensor_read(t->ctx, mn, lo, (size_t)n * sizeof *lo) == LOOM_OK;
    CHECK(ok, "%s: max/min across ranks: %s", c->name, loom_context_error_message(t->ctx));
    int64_t differ = 0;
    for (int64_t i = 0; ok && i < n; i++)
        differ += hi[i] != snap[i] || lo[i] != snap[i];
    CHECK(differ == 0, "%s: %lld of %lld state values differ between ranks", c->name,
          (long long)differ, (long long)n);
    loom_tensor_release(mn);
    loom_tensor_release(mx);
    loom_tensor_release(v);
}

/* FNV-1a of the state's bytes: equal runs print equal digests. */
static uint64_t digest(const float *v, int64_t n) {
    uint64_t h = 14695981039346656037ULL;
    const unsigned char *b = (const unsigned char *)v;
    for (size_t i = 0; i < (size_t)n * sizeof *v; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Runs one case. Every rank must run the same collectives in the same order, so a failed
 * check never changes what follows; only a failure that leaves this rank unable to go on in
 * step with the others (no context, unreadable state) returns false: the program then exits
 * at once, and mpiexec ends the other ranks. */
static bool run_case(const dp_case *c) {
    trainer dp, one;
    bool ok = trainer_init(&dp, c, true);
    ok = trainer_init(&one, c, false) && ok;
    static float a[MAX_STATE], b[MAX_STATE], init[MAX_STATE], x[BATCH * IN];
    int32_t y[BATCH];
    int64_t n = ok ? snapshot(&one, init) : 0;
    ok = n > 0 && snapshot(&dp, a) == n;
    CHECK(ok && memcmp(a, init, (size_t)n * sizeof *a) == 0,
          "%s: after the broadcast the state differs from rank 0's initial state", c->name);
    for (int step = 0; ok && step < STEPS; step++) {
        make_batch(step, x, y);
        bool inject = c->amp && (step == LOSS_INF_STEP || step == GRAD_INF_STEP);
        trainer *tr[2] = {&dp, &one};
        for (int k = 0; k < 2; k++) {
            float found = -1;
            if (inject)
                snapshot(tr[k], a);
            trainer_step(tr[k], c, step, x, y, &found);
            CHECK(found == (inject ? 1.0f : 0.0f), "%s %s step %d: found_inf %g, expected %d",
                  c->name, k ? "one" : "dp", step, found, inject);
            if (inject && snapshot(tr[k], b) == n)
                check_skipped(c, k ? "one" : "dp", step, a, b, n);
        }
    }
    ok = ok && snapshot(&dp, a) == n && snapshot(&one, b) == n;
    if (ok) {
        /* Differences from the one-process run, and how far training moved the parameters
         * (the tolerance must be far smaller, or the comparison would prove nothing). */
        double worst = 0, moved = 0;
        int64_t bad = 0, n_params = 0;
        for (int i = 0; i < N_PARAMS; i++) {
            int64_t m = 0;
            loom_tensor_numel(one.params[i], &m);
            n_params += m;
        }
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)a[i] - b[i]), tol = c->atol + c->rtol * fabs((double)b[i]);
            worst = fmax(worst, d / tol);
            bad += !(d <= tol);
            if (i < n_params)
                moved = fmax(moved, fabs((double)b[i] - init[i]));
        }
        printf("rank %d: %s: largest |dp - one process| is %.3g of the tolerance; parameters "
               "moved up to %.3g\n",
               rank_, c->name, worst, moved);
        CHECK(bad == 0,
              "%s: %lld of %lld state values differ from the one-process run beyond %g "
              "relative + %g",
              c->name, (long long)bad, (long long)n, c->rtol, c->atol);
        CHECK(moved > 0.05, "%s: training moved the parameters by only %g", c->name, moved);
        check_same_on_every_rank(&dp, c, a, n);
        if (rank_ == 0)
            printf("digest %s %016" PRIx64 "\n", c->name, digest(a, n));
    }
    /* Every step compiled, the data-parallel ones (collectives, autocast) included. */
    if (dp.ctx && one.ctx)
        CHECK(loom_metric_value(dp.ctx, "Fallbacks") == 0 &&
                  loom_metric_value(one.ctx, "Fallbacks") == 0,
              "%s: %lld data-parallel and %lld one-process steps ran on the interpreter", c->name,
              (long long)loom_metric_value(dp.ctx, "Fallbacks"),
              (long long)loom_metric_value(one.ctx, "Fallbacks"));
    trainer_deinit(&one);
    trainer_deinit(&dp);
    return ok;
}

/* Ranks that trace different steps (here rank r's batch has r rows more, as under another
 * --batch-size or amp mode) fail at that step on every rank, compiled and on the
 * interpreter, with a message naming the first node where their graphs differ as this rank
 * and rank 0 have it; they once trained apart, or hung. */
static bool run_disagree(bool eager) {
    loom_context *ctx = new_context(eager);
    if (!ctx)
        return false;
    const char *mode = eager ? "interpreter" : "compiled";
    int64_t rows = BATCH / world_ + rank_;
    static float x[(BATCH + 8) * IN];
    for (int64_t i = 0; i < rows * IN; i++)
        x[i] = (float)(i % 7);
    loom_tensor *xt = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){rows, IN}, x);
    loom_tensor *r = loom_all_reduce(ctx, loom_sum(ctx, xt, 1, (int32_t[]){0}, false),
                                     LOOM_REDUCE_SUM, 1.0);
    CHECK(r != NULL, "%s: recording: %s", mode, loom_context_error_message(ctx));
    loom_tensor_retain(r);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK) /* a compiled step runs asynchronously: its error comes at the sync */
        st = loom_context_sync(ctx);
    const char *msg = loom_context_error_message(ctx);
    char mine[96], first[96];
    snprintf(mine, sizeof mine, "; rank %d: `%%0 = input {index = 0} : f32[%lld,%d]`", rank_,
             (long long)rows, IN);
    snprintf(first, sizeof first, "; rank 0: `%%0 = input {index = 0} : f32[%d,%d]`",
             BATCH / world_, IN);
    CHECK(st == LOOM_STATUS_COMM_ERROR, "%s: mark_step gave %s: %s", mode, loom_status_name(st),
          msg);
    CHECK(strstr(msg, "the ranks are not running the same step") &&
              strstr(msg, "their graphs differ first at node %0") && strstr(msg, mine) &&
              (rank_ == 0 || strstr(msg, first)),
          "%s: the message does not name the first difference: %s", mode, msg);
    printf("rank %d: %s: %s\n", rank_, mode, msg);
    loom_tensor_release(r);
    loom_tensor_release(xt);
    loom_context_destroy(ctx);
    return true;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2 || argc > 3 || atoi(argv[1]) < 1 || BATCH % atoi(argv[1]) != 0) {
        fprintf(stderr, "usage: dp_parity N [LOCAL]   (N ranks, N divides %d)\n", BATCH);
        return 2;
    }
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "rank ?: loom_dist_init: %s\n", loom_dist_error_message());
        return 1;
    }
    rank_ = loom_dist_rank();
    world_ = loom_dist_world_size();
    CHECK(world_ == atoi(argv[1]), "world size %d, expected %s", world_, argv[1]);
    CHECK(argc < 3 || loom_dist_local_size() == atoi(argv[2]),
          "%d ranks on this rank's machine, expected %s", loom_dist_local_size(), argv[2]);
    bool ok = world_ == atoi(argv[1]);
    const char *disagree = getenv("DP_PARITY_DISAGREE"); /* 1: the disagreeing ranks only */
    if (disagree && strcmp(disagree, "1") == 0) {
        CHECK(world_ > 1, "DP_PARITY_DISAGREE needs 2 or more ranks");
        ok = ok && world_ > 1 && run_disagree(false) && run_disagree(true);
    } else {
        for (size_t k = 0; ok && k < sizeof cases / sizeof cases[0]; k++)
            ok = run_case(&cases[k]);
    }
    /* After a failure that broke the ranks' lockstep MPI_Finalize could wait for the others:
     * leave MPI unfinalized and exit non-zero, so that mpiexec ends them. */
    if (ok)
        CHECK(loom_dist_finalize() == LOOM_OK, "finalize: %s", loom_dist_error_message());
    printf("rank %d of %d: %d checks passed, %d failed\n", rank_, world_, checks - failures,
           failures);
    return failures ? 1 : 0;
}
