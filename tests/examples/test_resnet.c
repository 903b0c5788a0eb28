/* The ResNet of examples/resnet: its state_dict has torchvision's names, shapes and order;
 * ResNet-18's forward and one training step on a tiny image (compiled) match the reference
 * interpreter's; a saved state_dict loads back bit-exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/safetensors.h"

#include "resnet_model.h"
#include "resnet_state_dicts.h"
#include "train_util.h"

/* At 32x32 layer4's maps are 1x1, so its batch norms see BATCH values per channel: with 2
 * the normalisation is ill-conditioned (f32 rounding shows at 3e-3), with 8 the compiled
 * step stays within 1e-4 of the interpreter's. */
enum { BATCH = 8, IMAGE = 32, CLASSES = 1000 };

/* Every entry's name, dtype and shape, in order, against torchvision's list. */
static void check_state_dict(const resnet *m, const expected_entry *want, int32_t n) {
    assert_int_equal(m->n_state, n);
    for (int32_t i = 0; i < n; i++) {
        if (strcmp(m->state[i].name, want[i].name) != 0)
            fail_msg("entry %d is '%s', torchvision's is '%s'", (int)i, m->state[i].name,
                     want[i].name);
        int32_t rank;
        loom_dtype dt;
        int64_t shape[LOOM_MAX_RANK];
        assert_int_equal(loom_tensor_rank(m->state[i].tensor, &rank), LOOM_OK);
        assert_int_equal(loom_tensor_dtype(m->state[i].tensor, &dt), LOOM_OK);
        assert_int_equal(loom_tensor_shape(m->state[i].tensor, shape), LOOM_OK);
        if (rank != want[i].rank)
            fail_msg("'%s' has rank %d, torchvision's %d", want[i].name, (int)rank,
                     (int)want[i].rank);
        assert_int_equal(dt, rank == 0 ? LOOM_DTYPE_I64 : LOOM_DTYPE_F32);
        for (int32_t d = 0; d < rank; d++)
            if (shape[d] != want[i].shape[d])
                fail_msg("'%s' dim %d is %lld, torchvision's %lld", want[i].name, (int)d,
                         (long long)shape[d], (long long)want[i].shape[d]);
    }
}

static void test_resnet18_state_dict_is_torchvisions(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    resnet m;
    assert_int_equal(resnet_init(ctx, &m, RESNET18, CLASSES, 0), LOOM_OK);
    check_state_dict(&m, resnet18_state, sizeof resnet18_state / sizeof *resnet18_state);
    assert_int_equal(m.n_params, 62); /* conv and bn weights, bn biases, fc: no buffers */
    resnet_deinit(&m);
    loom_context_destroy(ctx);
}

static void test_resnet50_state_dict_is_torchvisions(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    resnet m;
    assert_int_equal(resnet_init(ctx, &m, RESNET50, CLASSES, 0), LOOM_OK);
    check_state_dict(&m, resnet50_state, sizeof resnet50_state / sizeof *resnet50_state);
    assert_int_equal(m.n_params, 161);
    resnet_deinit(&m);
    loom_context_destroy(ctx);
}

/* Deterministic inputs: normalised-looking pixels and labels. */
static void make_batch(float *x, int64_t *y) {
    uint32_t s = 12345;
    for (size_t i = 0; i < (size_t)BATCH * 3 * IMAGE * IMAGE; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((double)(s >> 8) / 16777216.0 * 3.4 - 1.7);
    }
    for (int i = 0; i < BATCH; i++) /* spread over the classes, both ends included */
        y[i] = i == 0 ? 0 : i == 1 ? CLASSES - 1 : 113 * i + 7;
}

typedef struct step_result {
    float logits[BATCH * CLASSES], loss;
    int32_t n;
    float *values[400]; /* every state entry after the step (num_batches_tracked as float) */
    size_t numel[400];
} step_result;

static void read_as_f32(loom_context *ctx, loom_tensor *t, float **out, size_t *out_n) {
    int64_t numel;
    loom_dtype dt;
    assert_int_equal(loom_tensor_numel(t, &numel), LOOM_OK);
    assert_int_equal(loom_tensor_dtype(t, &dt), LOOM_OK);
    *out = malloc((size_t)numel * sizeof **out);
    assert_non_null(*out);
    *out_n = (size_t)numel;
    if (dt == LOOM_DTYPE_I64) {
        int64_t v;
        assert_int_equal(loom_tensor_read(ctx, t, &v, sizeof v), LOOM_OK);
        **out = (float)v;
    } else {
        assert_int_equal(loom_tensor_read(ctx, t, *out, (size_t)numel * sizeof **out), LOOM_OK);
    }
}

/* ResNet-18 from seed 7: one training forward (logits and loss read), then one SGD step
 * (momentum, weight decay) through the example's step; every state entry read after it.
 * With save_path the state after the step is saved there and checked to load back. */
static void run_step(bool eager, step_result *r, const char *save_path) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    o.cache_dir = "";
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    resnet m;
    assert_int_equal(resnet_init(ctx, &m, RESNET18, CLASSES, 7), LOOM_OK);
    loom_optim_options oo;
    loom_optim_options_init(&oo, LOOM_OPTIM_SGD);
    oo.lr = 0.1;
    oo.momentum = 0.9;
    oo.weight_decay = 1e-4;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &oo, m.n_params, m.params, &opt), LOOM_OK);

    static float x[BATCH * 3 * IMAGE * IMAGE];
    int64_t y[BATCH];
    make_batch(x, y);
    loom_tensor *xt =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){BATCH, 3, IMAGE, IMAGE}, x);
    loom_tensor *yt = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){BATCH}, y);
    loom_tensor *logits = resnet_forward(ctx, &m, xt, true);
    loom_tensor *loss = loom_cross_entropy(ctx, logits, yt, LOOM_REDUCTION_MEAN);
    if (!loss)
        fail_msg("%s", loom_context_error_message(ctx));
    loom_tensor_retain(logits);
    loom_tensor *kept = NULL;
    model_amp amp = {.dtype = LOOM_DTYPE_F32};
    if (ex_train_step_finish(ctx, loss, m.n_params, m.params, opt, &amp, &kept) != LOOM_OK)
        fail_msg("%s", loom_context_error_message(ctx));
    tu_read_f32(ctx, logits, r->logits, BATCH * CLASSES);
    assert_int_equal(loom_tensor_read(ctx, kept, &r->loss, sizeof r->loss), LOOM_OK);
    loom_tensor_release(logits);
    loom_tensor_release(kept);
    loom_tensor_release(xt);
    loom_tensor_release(yt);
    r->n = m.n_state;
    for (int32_t i = 0; i < m.n_state; i++)
        read_as_f32(ctx, m.state[i].tensor, &r->values[i], &r->numel[i]);

    if (save_path) {
        assert_int_equal(loom_safetensors_save(ctx, save_path, m.n_state, m.state), LOOM_OK);
        /* The file's entries: torchvision's names and shapes. */
        char err[256];
        loom_safetensors *f = NULL;
        assert_int_equal(loom_safetensors_open(save_path, &f, err, sizeof err), LOOM_OK);
        int32_t n = sizeof resnet18_state / sizeof *resnet18_state;
        assert_int_equal(loom_safetensors_count(f), n);
        for (int32_t i = 0; i < n; i++) {
            int32_t k = loom_safetensors_find(f, resnet18_state[i].name);
            if (k < 0)
                fail_msg("the saved file lacks '%s'", resnet18_state[i].name);
            int32_t rank;
            int64_t shape[LOOM_MAX_RANK];
            loom_dtype dt;
            assert_int_equal(loom_safetensors_tensor(f, k, NULL, &dt, &rank, shape, NULL, NULL),
                             LOOM_OK);
            assert_int_equal(rank, resnet18_state[i].rank);
            assert_int_equal(dt, rank == 0 ? LOOM_DTYPE_I64 : LOOM_DTYPE_F32);
            for (int32_t d = 0; d < rank; d++)
                assert_int_equal(shape[d], resnet18_state[i].shape[d]);
        }
        loom_safetensors_close(f);
        /* A model from another seed, loaded strictly: every byte comes back. */
        resnet m2;
        assert_int_equal(resnet_init(ctx, &m2, RESNET18, CLASSES, 99), LOOM_OK);
        if (loom_safetensors_load(ctx, save_path, m2.n_state, m2.state, true) != LOOM_OK)
            fail_msg("%s", loom_context_error_message(ctx));
        for (int32_t i = 0; i < m.n_state; i++) {
            int64_t numel;
            loom_dtype dt;
            assert_int_equal(loom_tensor_numel(m.state[i].tensor, &numel), LOOM_OK);
            assert_int_equal(loom_tensor_dtype(m.state[i].tensor, &dt), LOOM_OK);
            size_t bytes = (size_t)numel * loom_dtype_size(dt);
            char *a = malloc(bytes), *b = malloc(bytes);
            assert_non_null(a);
            assert_non_null(b);
            assert_int_equal(loom_tensor_read(ctx, m.state[i].tensor, a, bytes), LOOM_OK);
            assert_int_equal(loom_tensor_read(ctx, m2.state[i].tensor, b, bytes), LOOM_OK);
            if (memcmp(a, b, bytes) != 0)
                fail_msg("'%s' did not load back bit-exactly", m.state[i].name);
            free(a);
            free(b);
        }
        resnet_deinit(&m2);
    }
    loom_optim_destroy(opt);
    resnet_deinit(&m);
    loom_context_destroy(ctx);
}

/* Largest |a - b| relative to the largest |b| (and at least 1e-3 of it, for zeros). */
static double rel_err(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / fmax(scale, 1e-3);
}

static void test_resnet18_step_matches_the_interpreter(void **state) {
    (void)state;
    char path[] = "/tmp/loom-resnet-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    static step_result jit, ref;
    run_step(false, &jit, path);
    run_step(true, &ref, NULL);
    unlink(path);
    double e = rel_err(jit.logits, ref.logits, BATCH * CLASSES);
    if (e > 1e-4)
        fail_msg("logits differ from the interpreter's by %g (relative)", e);
    if (fabs((double)jit.loss - (double)ref.loss) > 1e-4 * fabs((double)ref.loss))
        fail_msg("loss %.7f, the interpreter's %.7f", (double)jit.loss, (double)ref.loss);
    assert_true(isfinite(jit.loss) && jit.loss > 0);
    assert_int_equal(jit.n, ref.n);
    for (int32_t i = 0; i < jit.n; i++) {
        const char *name = resnet18_state[i].name;
        if (strstr(name, "num_batches_tracked")) { /* one training forward */
            assert_true(jit.values[i][0] == 1.0f && ref.values[i][0] == 1.0f);
        } else {
            e = rel_err(jit.values[i], ref.values[i], jit.numel[i]);
            if (e > 1e-4)
                fail_msg("'%s' after the step differs from the interpreter's by %g", name, e);
        }
        free(jit.values[i]);
        free(ref.values[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resnet18_state_dict_is_torchvisions),
        cmocka_unit_test(test_resnet50_state_dict_is_torchvisions),
        cmocka_unit_test(test_resnet18_step_matches_the_interpreter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
