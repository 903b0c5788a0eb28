/* IDX dataset loading (plain and gzip, with every kind of corruption) and the
 * DistributedSampler-style batch iterator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "loom/data.h"
#include "test_util.h"

/* ---- fixture files --------------------------------------------------------------------- */

static char tmp_dir[64];
static char made[32][128];
static int n_made;

static int setup_dir(void **state) {
    (void)state;
    strcpy(tmp_dir, "/tmp/loom_test_data_XXXXXX");
    n_made = 0;
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    for (int i = 0; i < n_made; i++)
        unlink(made[i]);
    return rmdir(tmp_dir);
}

static const char *tmp_path(const char *name) {
    assert_true(n_made < 32);
    snprintf(made[n_made], sizeof made[n_made], "%s/%s", tmp_dir, name);
    return made[n_made++];
}

/* Builds an IDX file image: magic, dims (big-endian), payload. Returns its length. */
static size_t idx_bytes(uint8_t *buf, uint32_t magic, int n_dims, const uint32_t *dims,
                        const uint8_t *payload, size_t payload_len) {
    size_t k = 0;
    uint32_t words[4] = {magic};
    for (int i = 0; i < n_dims; i++)
        words[1 + i] = dims[i];
    for (int w = 0; w < 1 + n_dims; w++)
        for (int s = 24; s >= 0; s -= 8)
            buf[k++] = (uint8_t)(words[w] >> s);
    if (payload_len > 0)
        memcpy(buf + k, payload, payload_len);
    return k + payload_len;
}

static void write_plain(const char *path, const uint8_t *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void write_gzip(const char *path, const uint8_t *buf, size_t len) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
}

/* Three 2x3 images and their labels. */
static const uint8_t pixels3[18] = {0,  255, 51, 1,   2,   3,   10,  20,  30,
                                    40, 50,  60, 200, 201, 202, 203, 204, 205};
static const uint8_t labels3[3] = {7, 0, 9};

static const char *write_images3(const char *name, bool gz) {
    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x803, 3, (uint32_t[]){3, 2, 3}, pixels3, sizeof pixels3);
    const char *p = tmp_path(name);
    (gz ? write_gzip : write_plain)(p, buf, len);
    return p;
}

static const char *write_labels(const char *name, bool gz, uint32_t n, const uint8_t *labels) {
    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x801, 1, (uint32_t[]){n}, labels, n);
    const char *p = tmp_path(name);
    (gz ? write_gzip : write_plain)(p, buf, len);
    return p;
}

/* Loads and expects failure with status st and a message holding the path and `what`. */
static void expect_load_error(const char *images, const char *labels, loom_status st,
                              const char *path_in_msg, const char *what) {
    char err[256] = "unset";
    loom_dataset *ds = (loom_dataset *)(uintptr_t)1;
    assert_int_equal(loom_dataset_load_idx(images, labels, &ds, err, sizeof err), st);
    assert_null(ds);
    if (!strstr(err, path_in_msg) || !strstr(err, what))
        fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", err, path_in_msg, what);
}

/* ---- loading --------------------------------------------------------------------------- */

static void check_dataset3(loom_dataset *ds) {
    assert_int_equal(loom_dataset_count(ds), 3);
    int64_t rows = 0, cols = 0;
    loom_dataset_image_shape(ds, &rows, &cols);
    assert_int_equal(rows, 2);
    assert_int_equal(cols, 3);
    assert_memory_equal(loom_dataset_images(ds), pixels3, sizeof pixels3);
    assert_memory_equal(loom_dataset_labels(ds), labels3, sizeof labels3);
}

static void test_load_reads_plain_and_gzip_idx_files_exactly(void **state) {
    (void)state;
    const char *img_plain = write_images3("img", false), *img_gz = write_images3("img.gz", true);
    const char *lbl_plain = write_labels("lbl", false, 3, labels3);
    const char *lbl_gz = write_labels("lbl.gz", true, 3, labels3);
    const char *pairs[3][2] = {{img_plain, lbl_plain}, {img_gz, lbl_gz}, {img_plain, lbl_gz}};
    for (int i = 0; i < 3; i++) {
        char err[256] = "";
        loom_dataset *ds = NULL;
        assert_int_equal(loom_dataset_load_idx(pairs[i][0], pairs[i][1], &ds, err, sizeof err),
                         LOOM_OK);
        assert_string_equal(err, "");
        check_dataset3(ds);
        loom_dataset_destroy(ds);
    }
}

static void test_batches_normalise_pixels_as_transforms_normalize(void **state) {
    (void)state;
    loom_dataset *ds = NULL;
    assert_int_equal(loom_dataset_load_idx(write_images3("i.gz", true),
                                           write_labels("l.gz", true, 3, labels3), &ds, NULL, 0),
                     LOOM_OK);
    loom_batch_options o;
    loom_batch_options_init(&o);
    o.shuffle = false;
    o.batch_size = 3;
    loom_batches *b = NULL;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_OK);
    const float *x = NULL;
    const int64_t *y = NULL;
    int64_t n = 0;
    assert_true(loom_batches_next(b, &x, &y, &n));
    assert_int_equal(n, 3);
    /* (p/255 - 0.5) / 0.5: 0 -> -1, 255 -> 1, 51 -> -0.6, 204 -> 0.6 */
    assert_true(x[0] == -1.0f);
    assert_true(x[1] == 1.0f);
    assert_float_equal(x[2], -0.6f, 1e-6);
    assert_float_equal(x[16], 0.6f, 1e-6);
    for (int i = 0; i < 18; i++)
        assert_true(x[i] == ((float)pixels3[i] / 255.0f - 0.5f) / 0.5f);
    assert_int_equal(y[0], 7);
    assert_int_equal(y[1], 0);
    assert_int_equal(y[2], 9);
    assert_false(loom_batches_next(b, &x, &y, &n));
    loom_batches_destroy(b);

    /* Other statistics: mean 0.25, std 2 gives (p/255 - 0.25) / 2; 255 -> 0.375. */
    o.mean = 0.25f;
    o.std = 2.0f;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_OK);
    assert_true(loom_batches_next(b, &x, NULL, NULL));
    assert_true(x[0] == -0.125f);
    assert_true(x[1] == 0.375f);
    loom_batches_destroy(b);
    loom_dataset_destroy(ds);
}

static void test_load_rejects_truncated_image_file_naming_it(void **state) {
    (void)state;
    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x803, 3, (uint32_t[]){3, 2, 3}, pixels3, sizeof pixels3);
    assert_int_equal(len, 34);
    const char *p = tmp_path("short");
    write_plain(p, buf, 20);
    const char *lbl = write_labels("lbl", false, 3, labels3);
    expect_load_error(p, lbl, LOOM_STATUS_CORRUPT_DATA, p, "truncated: expected 34 bytes, got 20");
    const char *pg = tmp_path("short.gz");
    write_gzip(pg, buf, 33);
    expect_load_error(pg, lbl, LOOM_STATUS_CORRUPT_DATA, pg,
                      "truncated: expected 34 bytes, got 33");
    const char *ph = tmp_path("header");
    write_plain(ph, buf, 9);
    expect_load_error(ph, lbl, LOOM_STATUS_CORRUPT_DATA, ph, "truncated");
}

static void test_a_header_claiming_terabytes_is_truncation_not_an_allocation(void **state) {
    (void)state;
    /* 4G-1 images of 1000x1000 pixels in a 40-byte file: found by fuzz/fuzz_idx, which
     * made the reader ask for the claimed size up front (here ~4 PB: OUT_OF_MEMORY). */
    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x803, 3, (uint32_t[]){0xFFFFFFFFu, 1000, 1000}, pixels3, 18);
    const char *p = tmp_path("huge");
    write_plain(p, buf, len);
    const char *lbl = write_labels("lbl_huge", false, 3, labels3);
    expect_load_error(p, lbl, LOOM_STATUS_CORRUPT_DATA, p, "truncated: expected");
    const char *pg = tmp_path("huge.gz");
    write_gzip(pg, buf, len);
    expect_load_error(pg, lbl, LOOM_STATUS_CORRUPT_DATA, pg, "truncated: expected");
}

static void test_load_rejects_a_cut_gzip_stream(void **state) {
    (void)state;
    const char *img = write_images3("img.gz", true);
    /* Read back the compressed bytes to cut them. */
    FILE *f = fopen(img, "rb");
    assert_non_null(f);
    uint8_t gz[256];
    size_t len = fread(gz, 1, sizeof gz, f);
    fclose(f);
    assert_true(len > 20);
    const char *lbl = write_labels("lbl", false, 3, labels3);
    /* Cut inside the compressed data: fewer pixels come out. */
    const char *cut = tmp_path("cut.gz");
    write_plain(cut, gz, len - 12);
    expect_load_error(cut, lbl, LOOM_STATUS_CORRUPT_DATA, cut, "truncated: expected 34 bytes");
    /* Cut inside the 8-byte CRC/size trailer: every pixel comes out, zlib flags the end. */
    const char *cut_trailer = tmp_path("cut_trailer.gz");
    write_plain(cut_trailer, gz, len - 4);
    expect_load_error(cut_trailer, lbl, LOOM_STATUS_CORRUPT_DATA, cut_trailer,
                      "corrupt gzip stream");
}

static void test_load_rejects_bad_magic_naming_the_file(void **state) {
    (void)state;
    const char *img = write_images3("img", false);
    /* A label file given where images belong, and vice versa. */
    const char *lbl = write_labels("lbl", false, 3, labels3);
    expect_load_error(lbl, lbl, LOOM_STATUS_CORRUPT_DATA, lbl,
                      "bad magic 0x00000801: expected 0x00000803");
    expect_load_error(img, img, LOOM_STATUS_CORRUPT_DATA, img,
                      "bad magic 0x00000803: expected 0x00000801");
}

static void test_load_rejects_count_mismatch(void **state) {
    (void)state;
    const char *img = write_images3("img", false);
    const char *lbl = write_labels("lbl4", false, 4, (const uint8_t[]){1, 2, 3, 4});
    expect_load_error(img, lbl, LOOM_STATUS_CORRUPT_DATA, lbl, "4 labels, but");
}

static void test_load_rejects_trailing_bytes(void **state) {
    (void)state;
    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x801, 1, (uint32_t[]){3}, (const uint8_t[]){1, 2, 3, 4}, 4);
    const char *p = tmp_path("trail.gz");
    write_gzip(p, buf, len);
    expect_load_error(write_images3("img", false), p, LOOM_STATUS_CORRUPT_DATA, p,
                      "trailing bytes after the expected 11 bytes");
}

static void test_load_rejects_missing_file_and_bad_dimensions(void **state) {
    (void)state;
    const char *lbl = write_labels("lbl", false, 3, labels3);
    const char *missing = tmp_path("does-not-exist.gz");
    expect_load_error(missing, lbl, LOOM_STATUS_IO_ERROR, missing, "cannot open");
    expect_load_error(write_images3("img", false), missing, LOOM_STATUS_IO_ERROR, missing,
                      "cannot open");
    /* a FIFO is refused at once (gzopen would wait for a writer) */
    const char *fifo = tmp_path("fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(10);
    expect_load_error(fifo, lbl, LOOM_STATUS_IO_ERROR, fifo, "is a FIFO");
    alarm(0);
    assert_int_equal(unlink(fifo), 0);

    uint8_t buf[64];
    size_t len = idx_bytes(buf, 0x803, 3, (uint32_t[]){3, 0, 3}, NULL, 0);
    const char *zero = tmp_path("zero");
    write_plain(zero, buf, len);
    expect_load_error(zero, lbl, LOOM_STATUS_CORRUPT_DATA, zero, "dimension 1 is 0");

    len = idx_bytes(buf, 0x803, 3, (uint32_t[]){0xffffffffu, 0xffffffffu, 0xffffffffu}, NULL, 0);
    const char *huge = tmp_path("huge");
    write_plain(huge, buf, len);
    expect_load_error(huge, lbl, LOOM_STATUS_CORRUPT_DATA, huge, "overflows");

    char err[64];
    loom_dataset *ds = NULL;
    assert_int_equal(loom_dataset_load_idx(NULL, lbl, &ds, err, sizeof err),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(ds);
    loom_dataset_destroy(NULL);
    assert_int_equal(loom_dataset_count(NULL), 0);
}

/* ---- iterator -------------------------------------------------------------------------- */

/* n 1x1 images whose pixel and label are both the example's index. */
static loom_dataset *index_dataset(uint32_t n) {
    uint8_t ids[64];
    assert_true(n <= 64);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = (uint8_t)i;
    uint8_t buf[128];
    size_t len = idx_bytes(buf, 0x803, 3, (uint32_t[]){n, 1, 1}, ids, n);
    const char *img = tmp_path("idx_img");
    write_plain(img, buf, len);
    const char *lbl = write_labels("idx_lbl", false, n, ids);
    char err[256] = "";
    loom_dataset *ds = NULL;
    if (loom_dataset_load_idx(img, lbl, &ds, err, sizeof err) != LOOM_OK)
        fail_msg("%s", err);
    return ds;
}

/* Runs one epoch; writes the labels (= indices) to out and the batch sizes to sizes. Returns
 * the number of examples. */
static int64_t run_epoch(loom_batches *b, int64_t *out, int64_t *sizes, int64_t *n_batches) {
    const int64_t *y;
    int64_t n, total = 0;
    *n_batches = 0;
    while (loom_batches_next(b, NULL, &y, &n)) {
        sizes[(*n_batches)++] = n;
        for (int64_t i = 0; i < n; i++)
            out[total++] = y[i];
    }
    return total;
}

static loom_batches *make_batches(loom_dataset *ds, int64_t bs, bool shuffle, bool drop_last,
                                  int32_t rank, int32_t world, uint64_t seed) {
    loom_batch_options o;
    loom_batch_options_init(&o);
    o.batch_size = bs;
    o.shuffle = shuffle;
    o.drop_last = drop_last;
    o.rank = rank;
    o.world_size = world;
    o.seed = seed;
    loom_batches *b = NULL;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_OK);
    return b;
}

static void test_options_default_as_pytorch(void **state) {
    (void)state;
    loom_batch_options o;
    memset(&o, 0xff, sizeof o);
    loom_batch_options_init(&o);
    assert_int_equal(o.batch_size, 64);
    assert_true(o.shuffle);
    assert_int_equal(o.seed, 0);
    assert_true(o.drop_last);
    assert_int_equal(o.rank, 0);
    assert_int_equal(o.world_size, 1);
    assert_true(o.mean == 0.5f && o.std == 0.5f);
}

static void test_batches_without_shuffle_come_in_file_order(void **state) {
    (void)state;
    loom_dataset *ds = index_dataset(10);
    int64_t got[16], sizes[16], nb;
    loom_batches *b = make_batches(ds, 4, false, false, 0, 1, 0);
    assert_int_equal(loom_batches_per_epoch(b), 3);
    assert_int_equal(run_epoch(b, got, sizes, &nb), 10);
    assert_int_equal(nb, 3);
    assert_int_equal(sizes[0], 4);
    assert_int_equal(sizes[2], 2);
    for (int64_t i = 0; i < 10; i++)
        assert_int_equal(got[i], i);
    /* Exhausted until the next set_epoch, which rewinds. */
    assert_false(loom_batches_next(b, NULL, NULL, NULL));
    loom_batches_set_epoch(b, 1);
    assert_int_equal(run_epoch(b, got, sizes, &nb), 10);
    assert_int_equal(got[9], 9);
    loom_batches_destroy(b);

    b = make_batches(ds, 4, false, true, 0, 1, 0);
    assert_int_equal(loom_batches_per_epoch(b), 2);
    assert_int_equal(run_epoch(b, got, sizes, &nb), 8);
    assert_int_equal(nb, 2);
    assert_int_equal(got[7], 7);
    loom_batches_destroy(b);
    loom_dataset_destroy(ds);
}

static void test_shuffle_is_a_permutation_per_epoch_and_reproducible(void **state) {
    (void)state;
    loom_dataset *ds = index_dataset(50);
    int64_t e0[64], e1[64], again[64], sizes[64], nb;
    loom_batches *b = make_batches(ds, 10, true, true, 0, 1, 1234);
    assert_int_equal(run_epoch(b, e0, sizes, &nb), 50);
    assert_int_equal(nb, 5);
    loom_batches_set_epoch(b, 1);
    assert_int_equal(run_epoch(b, e1, sizes, &nb), 50);
    int seen0[50] = {0}, seen1[50] = {0}, in_place = 0, differ = 0;
    for (int i = 0; i < 50; i++) {
        assert_in_range(e0[i], 0, 49);
        assert_in_range(e1[i], 0, 49);
        seen0[e0[i]]++;
        seen1[e1[i]]++;
        in_place += e0[i] == i;
        differ += e0[i] != e1[i];
    }
    for (int i = 0; i < 50; i++) {
        assert_int_equal(seen0[i], 1);
        assert_int_equal(seen1[i], 1);
    }
    assert_true(in_place < 10); /* a shuffle, not file order */
    assert_true(differ > 25);   /* epochs differ */

    /* A fresh iterator with the same seed, set to epoch 1, replays epoch 1. */
    loom_batches *c = make_batches(ds, 10, true, true, 0, 1, 1234);
    loom_batches_set_epoch(c, 1);
    assert_int_equal(run_epoch(c, again, sizes, &nb), 50);
    assert_memory_equal(again, e1, sizeof(int64_t) * 50);
    /* Re-running epoch 0 on the first iterator replays epoch 0. */
    loom_batches_set_epoch(b, 0);
    assert_int_equal(run_epoch(b, again, sizes, &nb), 50);
    assert_memory_equal(again, e0, sizeof(int64_t) * 50);
    loom_batches_destroy(b);
    loom_batches_destroy(c);
    loom_dataset_destroy(ds);
}

static void test_two_ranks_split_the_data_disjointly(void **state) {
    (void)state;
    loom_dataset *ds = index_dataset(10);
    int64_t r0[16], r1[16], sizes[16], nb;
    for (int epoch = 0; epoch < 3; epoch++) {
        loom_batches *a = make_batches(ds, 2, true, true, 0, 2, 7);
        loom_batches *b = make_batches(ds, 2, true, true, 1, 2, 7);
        loom_batches_set_epoch(a, epoch);
        loom_batches_set_epoch(b, epoch);
        assert_int_equal(loom_batches_per_epoch(a), 2);
        assert_int_equal(loom_batches_per_epoch(b), 2);
        assert_int_equal(run_epoch(a, r0, sizes, &nb), 4); /* 5 per rank, last batch dropped */
        assert_int_equal(run_epoch(b, r1, sizes, &nb), 4);
        loom_batches_destroy(a);
        loom_batches_destroy(b);
        /* With batch 5 nothing is dropped: together the ranks see every index once. */
        a = make_batches(ds, 5, true, true, 0, 2, 7);
        b = make_batches(ds, 5, true, true, 1, 2, 7);
        loom_batches_set_epoch(a, epoch);
        loom_batches_set_epoch(b, epoch);
        assert_int_equal(run_epoch(a, r0, sizes, &nb), 5);
        assert_int_equal(run_epoch(b, r1, sizes, &nb), 5);
        int seen[10] = {0};
        for (int i = 0; i < 5; i++) {
            seen[r0[i]]++;
            seen[r1[i]]++;
        }
        for (int i = 0; i < 10; i++)
            assert_int_equal(seen[i], 1);
        loom_batches_destroy(a);
        loom_batches_destroy(b);
    }
    loom_dataset_destroy(ds);
}

static void test_padding_and_trimming_follow_distributed_sampler(void **state) {
    (void)state;
    loom_dataset *ds = index_dataset(11);
    int64_t r0[16], r1[16], sizes[16], nb;
    /* drop_last=false: 11 padded to 12 by repeating index 0; rank 1's last is 0. */
    loom_batches *a = make_batches(ds, 4, false, false, 0, 2, 0);
    loom_batches *b = make_batches(ds, 4, false, false, 1, 2, 0);
    assert_int_equal(loom_batches_per_epoch(a), 2);
    assert_int_equal(run_epoch(a, r0, sizes, &nb), 6);
    assert_int_equal(sizes[1], 2);
    assert_int_equal(run_epoch(b, r1, sizes, &nb), 6);
    const int64_t want0[6] = {0, 2, 4, 6, 8, 10}, want1[6] = {1, 3, 5, 7, 9, 0};
    assert_memory_equal(r0, want0, sizeof want0);
    assert_memory_equal(r1, want1, sizeof want1);
    loom_batches_destroy(a);
    loom_batches_destroy(b);

    /* Shuffled and padded: the ranks cover all 11, and the one repeat is the list's head. */
    a = make_batches(ds, 3, true, false, 0, 2, 99);
    b = make_batches(ds, 3, true, false, 1, 2, 99);
    assert_int_equal(run_epoch(a, r0, sizes, &nb), 6);
    assert_int_equal(run_epoch(b, r1, sizes, &nb), 6);
    int seen[11] = {0};
    for (int i = 0; i < 6; i++) {
        seen[r0[i]]++;
        seen[r1[i]]++;
    }
    for (int i = 0; i < 11; i++)
        assert_int_equal(seen[i], i == r0[0] ? 2 : 1);
    assert_int_equal(r1[5], r0[0]);
    loom_batches_destroy(a);
    loom_batches_destroy(b);

    /* drop_last=true: trimmed to 10, so index 10 is never seen. */
    a = make_batches(ds, 2, false, true, 0, 2, 0);
    b = make_batches(ds, 2, false, true, 1, 2, 0);
    assert_int_equal(loom_batches_per_epoch(a), 2);
    assert_int_equal(run_epoch(a, r0, sizes, &nb), 4);
    assert_int_equal(run_epoch(b, r1, sizes, &nb), 4);
    const int64_t trim0[4] = {0, 2, 4, 6}, trim1[4] = {1, 3, 5, 7};
    assert_memory_equal(r0, trim0, sizeof trim0);
    assert_memory_equal(r1, trim1, sizeof trim1);
    loom_batches_destroy(a);
    loom_batches_destroy(b);
    loom_dataset_destroy(ds);

    /* Padding longer than the data repeats it cyclically: 2 examples over 5 ranks. */
    ds = index_dataset(2);
    const int64_t want[5] = {0, 1, 0, 1, 0};
    for (int32_t r = 0; r < 5; r++) {
        loom_batches *c = make_batches(ds, 1, false, false, r, 5, 0);
        assert_int_equal(run_epoch(c, r0, sizes, &nb), 1);
        assert_int_equal(r0[0], want[r]);
        loom_batches_destroy(c);
    }
    loom_dataset_destroy(ds);
}

static void test_batches_create_rejects_bad_options(void **state) {
    (void)state;
    loom_dataset *ds = index_dataset(4);
    loom_batch_options o;
    loom_batches *b = (loom_batches *)(uintptr_t)1;
    loom_batch_options_init(&o);
    o.batch_size = 0;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(b);
    loom_batch_options_init(&o);
    o.rank = 2;
    o.world_size = 2;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_STATUS_INVALID_ARGUMENT);
    loom_batch_options_init(&o);
    o.std = 0;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_batches_create(NULL, NULL, &b), LOOM_STATUS_INVALID_ARGUMENT);
    /* NULL options mean defaults: batch 64 > 4 examples with drop_last gives no batch. */
    assert_int_equal(loom_batches_create(ds, NULL, &b), LOOM_OK);
    assert_int_equal(loom_batches_per_epoch(b), 0);
    assert_false(loom_batches_next(b, NULL, NULL, NULL));
    loom_batches_destroy(b);
    loom_batches_destroy(NULL);
    assert_false(loom_batches_next(NULL, NULL, NULL, NULL));
    loom_dataset_destroy(ds);
}

static void test_fashion_mnist_t10k_loads_when_installed(void **state) {
    (void)state;
    const char *img = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    const char *lbl = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(img, R_OK) != 0 || access(lbl, R_OK) != 0)
        skip();
    char err[256] = "";
    loom_dataset *ds = NULL;
    if (loom_dataset_load_idx(img, lbl, &ds, err, sizeof err) != LOOM_OK)
        fail_msg("%s", err);
    assert_int_equal(loom_dataset_count(ds), 10000);
    int64_t rows, cols;
    loom_dataset_image_shape(ds, &rows, &cols);
    assert_int_equal(rows, 28);
    assert_int_equal(cols, 28);
    const uint8_t *labels = loom_dataset_labels(ds);
    int per_class[10] = {0};
    for (int i = 0; i < 10000; i++) {
        assert_in_range(labels[i], 0, 9);
        per_class[labels[i]]++;
    }
    assert_int_equal(labels[0], 9); /* 'Ankle boot' */
    for (int c = 0; c < 10; c++)
        assert_int_equal(per_class[c], 1000);
    /* 10000 / 64 = 156 full batches on one rank; 78 per rank over two. */
    loom_batch_options o;
    loom_batch_options_init(&o);
    loom_batches *b = NULL;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_OK);
    assert_int_equal(loom_batches_per_epoch(b), 156);
    const float *x;
    int64_t n;
    assert_true(loom_batches_next(b, &x, NULL, &n));
    assert_int_equal(n, 64);
    for (int i = 0; i < 64 * 784; i++)
        assert_true(x[i] >= -1.0f && x[i] <= 1.0f);
    loom_batches_destroy(b);
    o.world_size = 2;
    o.rank = 1;
    assert_int_equal(loom_batches_create(ds, &o, &b), LOOM_OK);
    assert_int_equal(loom_batches_per_epoch(b), 78);
    loom_batches_destroy(b);
    loom_dataset_destroy(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_reads_plain_and_gzip_idx_files_exactly, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_batches_normalise_pixels_as_transforms_normalize,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_truncated_image_file_naming_it, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(
            test_a_header_claiming_terabytes_is_truncation_not_an_allocation, setup_dir,
            teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_a_cut_gzip_stream, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_bad_magic_naming_the_file, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_count_mismatch, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_trailing_bytes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_rejects_missing_file_and_bad_dimensions,
                                        setup_dir, teardown_dir),
        cmocka_unit_test(test_options_default_as_pytorch),
        cmocka_unit_test_setup_teardown(test_batches_without_shuffle_come_in_file_order, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_shuffle_is_a_permutation_per_epoch_and_reproducible,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_two_ranks_split_the_data_disjointly, setup_dir,
                                        teardown_dir),
        cmocka_unit_test_setup_teardown(test_padding_and_trimming_follow_distributed_sampler,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_batches_create_rejects_bad_options, setup_dir,
                                        teardown_dir),
        cmocka_unit_test(test_fashion_mnist_t10k_loads_when_installed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
