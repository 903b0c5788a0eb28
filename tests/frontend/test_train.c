/* End-to-end training on real Fashion-MNIST images (the t10k file of Debian's
 * dataset-fashion-mnist): a small MLP trained by SGD drives its loss down, and the compiled
 * steps follow the reference interpreter's loss trajectory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "loom/data.h"
#include "loom/nn.h"
#include "loom/optim.h"

enum { HIDDEN = 64, CLASSES = 10, BATCH = 64, SAMPLES = 512 };

static loom_dataset *load_t10k(void) {
    const char *dir = getenv("LOOM_FASHION_MNIST_DIR");
    if (!dir)
        dir = "/usr/share/datasets/fashion-mnist";
    char img[512], lab[512], err[256];
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte.gz", dir);
    loom_dataset *ds = NULL;
    if (loom_dataset_load_idx(img, lab, &ds, err, sizeof err) != LOOM_OK)
        fail_msg("the Fashion-MNIST test set is needed (package dataset-fashion-mnist, or "
                 "LOOM_FASHION_MNIST_DIR): %s",
                 err);
    return ds;
}

typedef struct run {
    float loss[64];
    int n_loss;
    double accuracy; /* on the training samples after training */
} run;

/* Trains 784-64-10 on the first SAMPLES images for `epochs` epochs in file order. */
static void train(loom_dataset *ds, bool eager, int epochs, run *out) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    loom_rng rng;
    loom_rng_init(&rng, 1);
    loom_nn_linear fc1, fc2;
    assert_int_equal(loom_nn_linear_init(ctx, &fc1, 784, HIDDEN, true, &rng), LOOM_OK);
    assert_int_equal(loom_nn_linear_init(ctx, &fc2, HIDDEN, CLASSES, true, &rng), LOOM_OK);
    loom_tensor *params[4] = {fc1.weight, fc1.bias, fc2.weight, fc2.bias};
    loom_optim_options oo;
    loom_optim_options_init(&oo, LOOM_OPTIM_SGD);
    oo.lr = 0.05;
    oo.momentum = 0.9;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &oo, 4, params, &opt), LOOM_OK);
    loom_batch_options bo;
    loom_batch_options_init(&bo);
    bo.batch_size = BATCH;
    bo.shuffle = false;
    loom_batches *it = NULL;
    assert_int_equal(loom_batches_create(ds, &bo, &it), LOOM_OK);

    out->n_loss = 0;
    for (int e = 0; e < epochs; e++) {
        loom_batches_set_epoch(it, e);
        const float *xb;
        const int64_t *yb;
        int64_t n;
        for (int b = 0; b < SAMPLES / BATCH && loom_batches_next(it, &xb, &yb, &n); b++) {
            loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){n, 784}, xb);
            loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){n}, yb);
            loom_tensor *h = loom_relu(ctx, loom_nn_linear_forward(ctx, &fc1, x));
            loom_tensor *loss = loom_cross_entropy(ctx, loom_nn_linear_forward(ctx, &fc2, h), y,
                                                   LOOM_REDUCTION_MEAN);
            loom_tensor *grads[4] = {0};
            if (loom_backward(ctx, loss, 4, params, grads) != LOOM_OK ||
                loom_optim_step(opt, grads, NULL) != LOOM_OK)
                fail_msg("%s", loom_context_error_message(ctx));
            loom_tensor_retain(loss);
            assert_int_equal(loom_mark_step(ctx), LOOM_OK);
            assert_int_equal(loom_tensor_read(ctx, loss, &out->loss[out->n_loss++], sizeof(float)),
                             LOOM_OK);
            loom_tensor_release(loss);
            loom_tensor_release(x);
            loom_tensor_release(y);
        }
    }
    /* accuracy on the samples it trained on */
    loom_batches_set_epoch(it, 0);
    int64_t correct = 0, seen = 0;
    const float *xb;
    const int64_t *yb;
    int64_t n;
    for (int b = 0; b < SAMPLES / BATCH && loom_batches_next(it, &xb, &yb, &n); b++) {
        loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){n, 784}, xb);
        loom_tensor *h = loom_relu(ctx, loom_nn_linear_forward(ctx, &fc1, x));
        loom_tensor *pred = loom_argmax(ctx, loom_nn_linear_forward(ctx, &fc2, h), 1);
        int64_t p[BATCH];
        assert_int_equal(loom_tensor_read(ctx, pred, p, (size_t)n * sizeof *p), LOOM_OK);
        for (int64_t i = 0; i < n; i++)
            correct += p[i] == yb[i];
        seen += n;
        loom_tensor_release(x);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    }
    out->accuracy = (double)correct / (double)seen;
    loom_batches_destroy(it);
    loom_optim_destroy(opt);
    loom_nn_linear_deinit(&fc1);
    loom_nn_linear_deinit(&fc2);
    loom_context_destroy(ctx);
}

static void test_sgd_on_fashion_mnist_drives_the_loss_down(void **state) {
    (void)state;
    loom_dataset *ds = load_t10k();
    run r;
    train(ds, false, 4, &r);
    assert_int_equal(r.n_loss, 4 * SAMPLES / BATCH);
    double first = 0, last = 0;
    int per = SAMPLES / BATCH;
    for (int i = 0; i < per; i++) {
        first += r.loss[i] / per;
        last += r.loss[r.n_loss - per + i] / per;
    }
    /* chance level is log(10) = 2.30; a working step roughly halves it within 4 epochs */
    assert_true(r.loss[0] > 2.0 && r.loss[0] < 2.6);
    if (!(last < 0.6 * first))
        fail_msg("mean loss went from %.4f (first epoch) to %.4f (fourth): not learning", first,
                 last);
    if (!(r.accuracy > 0.7))
        fail_msg("accuracy on the training samples is %.3f after 4 epochs", r.accuracy);
    loom_dataset_destroy(ds);
}

static void test_compiled_training_follows_the_interpreter(void **state) {
    (void)state;
    loom_dataset *ds = load_t10k();
    run jit, ref;
    train(ds, false, 1, &jit);
    train(ds, true, 1, &ref);
    assert_int_equal(jit.n_loss, ref.n_loss);
    /* same data, same init, same updates: f32 rounding differences only, growing slowly */
    for (int i = 0; i < jit.n_loss; i++)
        if (fabsf(jit.loss[i] - ref.loss[i]) > 1e-4f * (float)(i + 1))
            fail_msg("step %d: JIT loss %.7f, interpreter %.7f", i, jit.loss[i], ref.loss[i]);
    loom_dataset_destroy(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_on_fashion_mnist_drives_the_loss_down),
        cmocka_unit_test(test_compiled_training_follows_the_interpreter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
