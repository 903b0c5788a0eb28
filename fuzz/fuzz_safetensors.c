/* libFuzzer target for the safetensors reader: any bytes must parse or fail cleanly, and any
 * file that parses must describe in-bounds, exactly tiled data and survive a rewrite. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* frontend/safetensors.c: the bytes loom_safetensors_save would write for f's tensors. */
loom_status loom_fe_safetensors_canonical(const loom_safetensors *f, uint8_t **out,
                                          size_t *out_len);

static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: invariant violated: %s\n", what);
        abort();
    }
}

typedef struct view {
    const char *name;
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    const uint8_t *data;
    size_t size;
} view;

static view get(const loom_safetensors *f, int32_t i) {
    view v;
    memset(&v, 0, sizeof v);
    const void *d = NULL;
    check(loom_safetensors_tensor(f, i, &v.name, &v.dtype, &v.rank, v.shape, &d, &v.size) ==
              LOOM_OK,
          "tensor() refused a valid index");
    v.data = d;
    return v;
}

/* What parse promised: sorted unique names that find() finds, sizes that match the types,
 * data that can be read in full, bools that are 0 or 1, and ranges tiling the data. */
static size_t check_file(const loom_safetensors *f, const uint8_t *input, size_t size) {
    int32_t n = loom_safetensors_count(f);
    check(n >= 0, "negative count");
    size_t total = 0;
    unsigned sum = 0;
    for (int32_t i = 0; i < n; i++) {
        view v = get(f, i);
        check(v.name != NULL, "NULL name");
        check(loom_safetensors_find(f, v.name) == i, "find() misses a listed name");
        if (i > 0)
            check(strcmp(get(f, i - 1).name, v.name) < 0, "names not sorted or not unique");
        check(v.rank >= 0 && v.rank <= LOOM_MAX_RANK, "rank out of range");
        uint64_t numel = 1;
        for (int32_t d = 0; d < v.rank; d++) {
            check(v.shape[d] >= 0, "negative extent");
            numel *= (uint64_t)v.shape[d];
        }
        check(numel * loom_dtype_size(v.dtype) == v.size, "size does not match the type");
        for (size_t k = 0; k < v.size; k++) { /* ASan: every byte is inside the copy */
            sum += v.data[k];
            if (v.dtype == LOOM_DTYPE_BOOL)
                check(v.data[k] <= 1, "a bool other than 0 or 1");
        }
        total += v.size;
    }
    (void)sum;
    check(total <= size, "tensors hold more bytes than the input");
    (void)input;
    check(loom_safetensors_tensor(f, n, NULL, NULL, NULL, NULL, NULL, NULL) ==
              LOOM_STATUS_INVALID_ARGUMENT,
          "tensor() accepted an index past the end");
    return total;
}

/* Rewritten as save writes it, the file parses to the same tensors, and rewriting that gives
 * the same bytes again. */
static void check_rewrite(const loom_safetensors *f) {
    uint8_t *img = NULL;
    size_t len = 0;
    if (loom_fe_safetensors_canonical(f, &img, &len) != LOOM_OK)
        return; /* out of memory */
    char err[512];
    loom_safetensors *g = NULL;
    if (loom_safetensors_parse(img, len, &g, err, sizeof err) != LOOM_OK) {
        fprintf(stderr, "the rewrite does not parse: %s\n", err);
        check(false, "rewrite does not parse");
    }
    check(loom_safetensors_count(g) == loom_safetensors_count(f), "rewrite changed the count");
    for (int32_t i = 0; i < loom_safetensors_count(f); i++) {
        view a = get(f, i), b = get(g, i);
        check(strcmp(a.name, b.name) == 0, "rewrite changed a name");
        check(a.dtype == b.dtype && a.rank == b.rank, "rewrite changed a type");
        check(memcmp(a.shape, b.shape, (size_t)a.rank * sizeof *a.shape) == 0,
              "rewrite changed a shape");
        check(a.size == b.size && (a.size == 0 || memcmp(a.data, b.data, a.size) == 0),
              "rewrite changed data");
    }
    uint8_t *img2 = NULL;
    size_t len2 = 0;
    if (loom_fe_safetensors_canonical(g, &img2, &len2) == LOOM_OK) {
        check(len2 == len && memcmp(img, img2, len) == 0, "rewriting is not a fixed point");
        uint64_t h = 0;
        for (int k = 7; k >= 0; k--)
            h = h << 8 | img[k];
        check((8 + h) % 8 == 0, "rewritten data does not start at a multiple of 8");
        free(img2);
    }
    loom_safetensors_close(g);
    free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    err[0] = '\0';
    loom_safetensors *f = (loom_safetensors *)(uintptr_t)1;
    loom_status st = loom_safetensors_parse(data, size, &f, err, sizeof err);
    if (st != LOOM_OK) {
        check(f == NULL, "a failed parse left *out set");
        check(st == LOOM_STATUS_CORRUPT_DATA || st == LOOM_STATUS_UNSUPPORTED ||
                  st == LOOM_STATUS_OUT_OF_MEMORY,
              "unexpected status");
        check(err[0] != '\0' && memchr(err, 0, sizeof err), "no message");
        return 0;
    }
    check(f != NULL, "a successful parse gave no file");
    check_file(f, data, size);
    check_rewrite(f);
    loom_safetensors_close(f);
    return 0;
}
