/* IDX dataset reader (gzip or plain, via zlib) and the DistributedSampler-style batch
 * iterator declared in include/loom/data.h. */
#include "loom/data.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "frontend.h"

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u

struct loom_dataset {
    int64_t count, rows, cols;
    uint8_t *images; /* count * rows * cols */
    uint8_t *labels; /* count */
};

loom_status loom_fe_set_err(char *err, size_t err_size, loom_status s, const char *fmt, ...) {
    if (err && err_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return s;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Reads up to len bytes; returns the count read, or -1 on a zlib/IO error. gzread takes an
 * unsigned int, so large payloads are read in chunks. */
static int64_t read_full(gzFile f, uint8_t *buf, size_t len) {
    size_t done = 0;
    while (done < len) {
        size_t want = len - done;
        if (want > (1u << 30))
            want = 1u << 30;
        int r = gzread(f, buf + done, (unsigned)want);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

/* A gzip stream that ends early is reported by zlib as Z_BUF_ERROR after a short read;
 * that is truncation too, so only other errors are reported with zlib's text. */
static loom_status gz_fault(gzFile f, const char *path, char *err, size_t err_size) {
    int code = Z_OK;
    const char *msg = gzerror(f, &code);
    if (code == Z_ERRNO)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_IO_ERROR, "%s: read failed: %s", path,
                               strerror(errno));
    return loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA, "%s: corrupt gzip stream: %s",
                           path, msg ? msg : "unknown error");
}

/* Reads one IDX file: magic, n_dims big-endian uint32 dimensions, then the uint8 payload.
 * On success *out_payload (malloc'd) holds dims[0]*...*dims[n_dims-1] bytes. */
static loom_status read_idx(const char *path, uint32_t magic, int n_dims, int64_t *dims,
                            uint8_t **out_payload, char *err, size_t err_size) {
    *out_payload = NULL;
    loom_ir_diag od; /* a regular file only: a FIFO is refused, not waited on */
    loom_ir_diag_init(&od);
    int fd;
    uint64_t size;
    if (loom_ir_open_regular(path, &fd, &size, &od) != LOOM_OK)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_IO_ERROR, "%s", od.msg);
    errno = 0;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_IO_ERROR, "%s: cannot open: %s", path,
                               errno ? strerror(errno) : "out of memory");
    }
    loom_status st = LOOM_OK;
    uint8_t *payload = NULL;
    uint8_t header[4 + 4 * 3];
    size_t header_size = 4 + 4 * (size_t)n_dims;
    /* The magic first, so a wrong kind of file is named as such even when it is short. */
    int64_t got = read_full(f, header, 4);
    if (got == 4 && be32(header) == magic) {
        int64_t rest = read_full(f, header + 4, header_size - 4);
        got = rest < 0 ? -1 : got + rest;
    }
    if (got < 0) {
        st = gz_fault(f, path, err, err_size);
        goto done;
    }
    uint32_t m = got >= 4 ? be32(header) : 0;
    if (got >= 4 && m != magic) {
        st = loom_fe_set_err(
            err, err_size, LOOM_STATUS_CORRUPT_DATA,
            "%s: bad magic 0x%08" PRIx32 ": expected 0x%08" PRIx32 " (%s IDX file)", path, m, magic,
            magic == IDX_MAGIC_IMAGES ? "uint8 3-d image" : "uint8 1-d label");
        goto done;
    }
    if ((size_t)got < header_size) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "%s: truncated: expected at least %zu header bytes, got %" PRId64,
                             path, header_size, got);
        goto done;
    }
    /* Each dim < 2^32, so the running product is checked against SIZE_MAX and INT64_MAX
     * before each multiplication. */
    uint64_t total = 1;
    for (int i = 0; i < n_dims; i++) {
        uint64_t d = be32(header + 4 + 4 * i);
        dims[i] = (int64_t)d;
        if (i > 0 && d == 0) {
            st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA, "%s: dimension %d is 0",
                                 path, i);
            goto done;
        }
        uint64_t limit = (uint64_t)(SIZE_MAX < INT64_MAX ? SIZE_MAX : INT64_MAX) - header_size;
        if (d != 0 && total > limit / d) {
            st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                                 "%s: dimensions too large: size overflows", path);
            goto done;
        }
        total *= d;
    }
    /* The buffer grows with the bytes that actually arrive (doubling from 16 MiB), so a
     * truncated or hostile header claiming gigabytes costs no more memory than the file
     * holds (found by fuzz/fuzz_idx: a 30-byte file asked for 30 GB up front). */
    size_t cap = total < (16u << 20) ? (size_t)total : (16u << 20), have = 0;
    payload = malloc(cap ? cap : 1);
    for (;;) {
        if (!payload) {
            st =
                loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                                "%s: out of memory for %zu of %" PRIu64 " bytes", path, cap, total);
            goto done;
        }
        got = read_full(f, payload + have, cap - have);
        if (got < 0) {
            st = gz_fault(f, path, err, err_size);
            goto done;
        }
        have += (size_t)got;
        if (have < cap || have == total)
            break; /* the end of the data, or all of it */
        size_t next = cap > total / 2 ? (size_t)total : cap * 2;
        uint8_t *grown = realloc(payload, next);
        if (!grown)
            free(payload);
        payload = grown;
        cap = next;
    }
    got = (int64_t)have;
    if ((uint64_t)got < total) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "%s: truncated: expected %" PRIu64 " bytes, got %" PRIu64, path,
                             (uint64_t)header_size + total, (uint64_t)header_size + (uint64_t)got);
        goto done;
    }
    uint8_t extra[1];
    got = read_full(f, extra, 1);
    if (got < 0) {
        st = gz_fault(f, path, err, err_size);
        goto done;
    }
    if (got > 0) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "%s: trailing bytes after the expected %" PRIu64 " bytes", path,
                             (uint64_t)header_size + total);
        goto done;
    }
    /* A gzip stream cut inside its trailer still yields every byte; zlib flags it. */
    int code = Z_OK;
    gzerror(f, &code);
    if (code != Z_OK)
        st = gz_fault(f, path, err, err_size);
done:
    gzclose(f);
    if (st != LOOM_OK) {
        free(payload);
        return st;
    }
    *out_payload = payload;
    return LOOM_OK;
}

loom_status loom_dataset_load_idx(const char *images_path, const char *labels_path,
                                  loom_dataset **out, char *err, size_t err_size) {
    if (err && err_size > 0)
        err[0] = '\0';
    if (out)
        *out = NULL;
    if (!images_path || !labels_path || !out)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_INVALID_ARGUMENT,
                               "loom_dataset_load_idx: %s is NULL",
                               !images_path   ? "images_path"
                               : !labels_path ? "labels_path"
                                              : "out");
    int64_t idims[3], ldims[1];
    uint8_t *images = NULL, *labels = NULL;
    loom_status st = read_idx(images_path, IDX_MAGIC_IMAGES, 3, idims, &images, err, err_size);
    if (st != LOOM_OK)
        return st;
    st = read_idx(labels_path, IDX_MAGIC_LABELS, 1, ldims, &labels, err, err_size);
    if (st != LOOM_OK) {
        free(images);
        return st;
    }
    if (idims[0] != ldims[0]) {
        free(images);
        free(labels);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                               "%s: %" PRId64 " labels, but %s has %" PRId64 " images", labels_path,
                               ldims[0], images_path, idims[0]);
    }
    loom_dataset *ds = malloc(sizeof *ds);
    if (!ds) {
        free(images);
        free(labels);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                               "loom_dataset_load_idx: out of memory");
    }
    *ds = (loom_dataset){
        .count = idims[0], .rows = idims[1], .cols = idims[2], .images = images, .labels = labels};
    *out = ds;
    return LOOM_OK;
}

int64_t loom_dataset_count(const loom_dataset *ds) {
    return ds ? ds->count : 0;
}

void loom_dataset_image_shape(const loom_dataset *ds, int64_t *out_rows, int64_t *out_cols) {
    if (out_rows)
        *out_rows = ds ? ds->rows : 0;
    if (out_cols)
        *out_cols = ds ? ds->cols : 0;
}

const uint8_t *loom_dataset_images(const loom_dataset *ds) {
    return ds ? ds->images : NULL;
}

const uint8_t *loom_dataset_labels(const loom_dataset *ds) {
    return ds ? ds->labels : NULL;
}

void loom_dataset_destroy(loom_dataset *ds) {
    if (!ds)
        return;
    free(ds->images);
    free(ds->labels);
    free(ds);
}

/* ---- batch iterator -------------------------------------------------------------------- */

struct loom_batches {
    const loom_dataset *ds;
    loom_batch_options o;
    int64_t num_samples; /* this rank's indices per epoch (DistributedSampler.num_samples) */
    int64_t total;       /* num_samples * world_size */
    int64_t *order;      /* the whole (padded/trimmed) list: total entries, scratch for N */
    int64_t *mine;       /* this rank's indices: num_samples entries */
    int64_t pos;         /* next entry of mine */
    int64_t cap;         /* examples the batch buffers hold */
    float *images;       /* cap * rows * cols */
    int64_t *labels;     /* cap */
    float lut[256];      /* (p/255 - mean) / std for every pixel value */
};

void loom_batch_options_init(loom_batch_options *o) {
    if (!o)
        return;
    *o = (loom_batch_options){.batch_size = 64,
                              .shuffle = true,
                              .seed = 0,
                              .drop_last = true,
                              .rank = 0,
                              .world_size = 1,
                              .mean = 0.5f,
                              .std = 0.5f};
}

/* splitmix64: tiny, well mixed, and identical on every platform, so every rank draws the
 * same permutation from the same seed. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound) by rejection, so the shuffle is unbiased. */
static uint64_t uniform_below(uint64_t *s, uint64_t bound) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do
        r = splitmix64(s);
    while (r >= limit);
    return r % bound;
}

loom_status loom_batches_create(const loom_dataset *ds, const loom_batch_options *o,
                                loom_batches **out) {
    if (out)
        *out = NULL;
    if (!ds || !out)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_batch_options opts;
    loom_batch_options_init(&opts);
    if (o)
        opts = *o;
    if (opts.batch_size < 1 || opts.world_size < 1 || opts.rank < 0 ||
        opts.rank >= opts.world_size || !isfinite(opts.mean) || !isfinite(opts.std) ||
        !(opts.std > 0))
        return LOOM_STATUS_INVALID_ARGUMENT;
    int64_t n = ds->count, world = opts.world_size;
    /* DistributedSampler: drop_last trims to a multiple of world_size, otherwise the list
     * is padded up to one. */
    int64_t num_samples = opts.drop_last ? n / world : (n + world - 1) / world;
    int64_t total = num_samples * world;
    int64_t cap = opts.batch_size < num_samples ? opts.batch_size : num_samples;
    size_t pixels = (size_t)(ds->rows * ds->cols);
    size_t order_len = (size_t)(total > n ? total : n);
    if (cap > 0 && pixels > SIZE_MAX / sizeof(float) / (size_t)cap)
        return LOOM_STATUS_OUT_OF_MEMORY;
    loom_batches *b = calloc(1, sizeof *b);
    if (!b)
        return LOOM_STATUS_OUT_OF_MEMORY;
    b->ds = ds;
    b->o = opts;
    b->num_samples = num_samples;
    b->total = total;
    b->cap = cap;
    b->order = malloc((order_len ? order_len : 1) * sizeof *b->order);
    b->mine = malloc((num_samples ? (size_t)num_samples : 1) * sizeof *b->mine);
    b->images = malloc((cap ? (size_t)cap * pixels : 1) * sizeof *b->images);
    b->labels = malloc((cap ? (size_t)cap : 1) * sizeof *b->labels);
    if (!b->order || !b->mine || !b->images || !b->labels) {
        loom_batches_destroy(b);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (int p = 0; p < 256; p++)
        b->lut[p] = ((float)p / 255.0f - opts.mean) / opts.std;
    loom_batches_set_epoch(b, 0);
    *out = b;
    return LOOM_OK;
}

void loom_batches_set_epoch(loom_batches *b, int64_t epoch) {
    if (!b)
        return;
    int64_t n = b->ds->count;
    for (int64_t i = 0; i < n; i++)
        b->order[i] = i;
    if (b->o.shuffle && n > 1) {
        uint64_t s = b->o.seed + (uint64_t)epoch;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)uniform_below(&s, (uint64_t)i + 1);
            int64_t t = b->order[i];
            b->order[i] = b->order[j];
            b->order[j] = t;
        }
    }
    /* Padding repeats the list from its start (cyclically when it must grow by more than
     * n, as DistributedSampler's `indices * ceil(padding / len)`). */
    for (int64_t i = n; i < b->total; i++)
        b->order[i] = b->order[i - n];
    for (int64_t k = 0; k < b->num_samples; k++)
        b->mine[k] = b->order[b->o.rank + k * b->o.world_size];
    b->pos = 0;
}

int64_t loom_batches_per_epoch(const loom_batches *b) {
    if (!b)
        return 0;
    int64_t bs = b->o.batch_size;
    return b->o.drop_last ? b->num_samples / bs : (b->num_samples + bs - 1) / bs;
}

bool loom_batches_next(loom_batches *b, const float **out_images, const int64_t **out_labels,
                       int64_t *out_count) {
    if (!b)
        return false;
    int64_t left = b->num_samples - b->pos;
    int64_t count = left < b->o.batch_size ? left : b->o.batch_size;
    if (count <= 0 || (b->o.drop_last && count < b->o.batch_size))
        return false;
    size_t pixels = (size_t)(b->ds->rows * b->ds->cols);
    for (int64_t k = 0; k < count; k++) {
        int64_t idx = b->mine[b->pos + k];
        const uint8_t *src = b->ds->images + (size_t)idx * pixels;
        float *dst = b->images + (size_t)k * pixels;
        for (size_t p = 0; p < pixels; p++)
            dst[p] = b->lut[src[p]];
        b->labels[k] = b->ds->labels[idx];
    }
    b->pos += count;
    if (out_images)
        *out_images = b->images;
    if (out_labels)
        *out_labels = b->labels;
    if (out_count)
        *out_count = count;
    return true;
}

void loom_batches_destroy(loom_batches *b) {
    if (!b)
        return;
    free(b->order);
    free(b->mine);
    free(b->images);
    free(b->labels);
    free(b);
}
