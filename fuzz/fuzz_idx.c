/* libFuzzer target for the IDX dataset reader: any pair of files (plain or gzip) must load or
 * fail cleanly with a message, and a dataset that loads must be self-consistent. The input is
 * split in two at a point its first two bytes choose: images file, labels file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_idx: invariant violated: %s\n", what);
        abort();
    }
}

/* The reader takes paths (it streams through zlib), so the halves go to files in /dev/shm
 * (or /tmp), named per process so parallel fuzzing jobs do not collide. */
static void put(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    check(f != NULL, "cannot create the scratch file");
    check(fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write the scratch file");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    size_t split = ((size_t)data[0] << 8 | data[1]) % (size - 1);
    const uint8_t *rest = data + 2;
    size_t n = size - 2;
    if (split > n)
        split = n;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char img[256], lab[256];
    snprintf(img, sizeof img, "%s/fuzz_idx_%d_images", dir, (int)getpid());
    snprintf(lab, sizeof lab, "%s/fuzz_idx_%d_labels", dir, (int)getpid());
    put(img, rest, split);
    put(lab, rest + split, n - split);

    loom_dataset *ds = NULL;
    char err[256] = "";
    loom_status st = loom_dataset_load_idx(img, lab, &ds, err, sizeof err);
    if (st != LOOM_OK) {
        check(ds == NULL, "a failed load left a dataset");
        check(err[0] != '\0', "a failed load gave no message");
        check(st == LOOM_STATUS_CORRUPT_DATA || st == LOOM_STATUS_IO_ERROR ||
                  st == LOOM_STATUS_OUT_OF_MEMORY,
              "unexpected status");
        return 0;
    }
    int64_t count = loom_dataset_count(ds), rows = 0, cols = 0;
    loom_dataset_image_shape(ds, &rows, &cols);
    check(count >= 0 && rows > 0 && cols > 0, "bad dimensions");
    const uint8_t *px = loom_dataset_images(ds), *lb = loom_dataset_labels(ds);
    /* touch every byte: ASan checks the buffers are as large as claimed */
    unsigned sum = 0;
    for (int64_t i = 0; i < count * rows * cols; i++)
        sum += px[i];
    for (int64_t i = 0; i < count; i++)
        sum += lb[i];
    (void)sum;
    if (count > 0) { /* one batch through the iterator */
        loom_batch_options o;
        loom_batch_options_init(&o);
        o.batch_size = count < 4 ? count : 4;
        loom_batches *it = NULL;
        check(loom_batches_create(ds, &o, &it) == LOOM_OK, "iterator refused a loaded dataset");
        const float *x;
        const int64_t *y;
        int64_t got = 0;
        if (loom_batches_next(it, &x, &y, &got)) {
            for (int64_t i = 0; i < got; i++)
                check(y[i] >= 0 && y[i] <= 255, "label out of its byte range");
            for (int64_t i = 0; i < got * rows * cols; i++) /* (p/255 - 0.5) / 0.5 */
                check(x[i] >= -1.0f && x[i] <= 1.0f, "pixel outside [-1, 1]");
        }
        loom_batches_destroy(it);
    }
    loom_dataset_destroy(ds);
    return 0;
}
