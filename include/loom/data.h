/* Loom data loading: IDX image datasets (MNIST / Fashion-MNIST, gzip or plain) and a
 * sharded, shuffled batch iterator that behaves as PyTorch's DistributedSampler + DataLoader.
 *
 * Tutorial
 * --------
 *   char err[256];
 *   loom_dataset *ds = NULL;
 *   if (loom_dataset_load_idx("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
 *                             "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz",
 *                             &ds, err, sizeof err) != LOOM_OK)
 *       fprintf(stderr, "%s\n", err);
 *   loom_batch_options o;
 *   loom_batch_options_init(&o);                  // 64, shuffled, drop_last, Normalize(0.5, 0.5)
 *   o.rank = rank; o.world_size = world;
 *   loom_batches *it = NULL;
 *   loom_batches_create(ds, &o, &it);
 *   for (int64_t epoch = 0; epoch < 10; epoch++) {
 *       loom_batches_set_epoch(it, epoch);         // reshuffle, identically on every rank
 *       const float *x; const int64_t *y; int64_t n;
 *       while (loom_batches_next(it, &x, &y, &n)) { ... x is f32[n, rows*cols], y is i64[n] }
 *   }
 *   loom_batches_destroy(it);
 *   loom_dataset_destroy(ds);
 *
 * Thread-safety
 *   A dataset is immutable after loading and may be read from several threads (several
 *   iterators over one dataset may run concurrently). One iterator is used by one thread at
 *   a time.
 */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dataset --------------------------------------------------------------------------- */

/* An in-memory image classification dataset: n images of rows x cols uint8 pixels and n
 * uint8 labels. Memory comes from malloc; no context is needed. */
typedef struct loom_dataset loom_dataset;

/* Loads an IDX image file (magic 0x00000803: n, rows, cols, then n*rows*cols bytes) and an
 * IDX label file (magic 0x00000801: n, then n bytes). Each file may be gzip-compressed or
 * plain (detected from its content). Everything is validated: magic numbers, non-zero
 * rows/cols, equal counts, sizes that fit in memory, no truncation and no trailing bytes.
 * On success *out is owned by the caller (loom_dataset_destroy); on failure *out is NULL.
 * err (may be NULL, or err_size 0) receives a NUL-terminated message naming the file and
 * the fault, e.g. "t.gz: truncated: expected 47040016 bytes, got 1000".
 * Errors: INVALID_ARGUMENT (a path or out NULL), IO_ERROR (missing or unreadable file),
 * CORRUPT_DATA (bad magic, dimensions, counts, truncated, trailing bytes, broken gzip),
 * OUT_OF_MEMORY. */
LOOM_API loom_status loom_dataset_load_idx(const char *images_path, const char *labels_path,
                                           loom_dataset **out, char *err, size_t err_size);

/* Number of examples; 0 for NULL. */
LOOM_API int64_t loom_dataset_count(const loom_dataset *ds);
/* Image height and width (either out pointer may be NULL); 0 for a NULL dataset. */
LOOM_API void loom_dataset_image_shape(const loom_dataset *ds, int64_t *out_rows,
                                       int64_t *out_cols);
/* Raw pixels, count*rows*cols bytes in file order (row-major images). Borrowed: valid until
 * loom_dataset_destroy. NULL for a NULL dataset. */
LOOM_API const uint8_t *loom_dataset_images(const loom_dataset *ds);
/* Raw labels, count bytes in file order. Borrowed, as loom_dataset_images. */
LOOM_API const uint8_t *loom_dataset_labels(const loom_dataset *ds);
/* Frees the dataset. Accepts NULL. Every iterator over it must be destroyed first. */
LOOM_API void loom_dataset_destroy(loom_dataset *ds);

/* ---- batch iterator -------------------------------------------------------------------- */

typedef struct loom_batch_options {
    int64_t batch_size; /* examples per batch on this rank; default 64 */
    bool shuffle;       /* permute each epoch (seed + epoch); default true */
    uint64_t seed;      /* default 0; must be equal on every rank */
    bool drop_last;     /* default true: trim the data to a multiple of world_size and drop
                           the last partial batch; false: pad by repeating the first
                           indices (as DistributedSampler) and keep a partial last batch */
    int32_t rank;       /* this process's rank, 0 <= rank < world_size; default 0 */
    int32_t world_size; /* default 1 */
    float mean, std;    /* pixels are (p/255 - mean) / std; default 0.5, 0.5 */
} loom_batch_options;

/* Fills *o with the defaults above. */
LOOM_API void loom_batch_options_init(loom_batch_options *o);

/* An epoch-by-epoch iterator over one rank's share of a dataset. */
typedef struct loom_batches loom_batches;

/* Creates an iterator positioned at the start of epoch 0. o may be NULL (defaults). ds is
 * borrowed and must outlive the iterator. On success *out is owned by the caller
 * (loom_batches_destroy). Errors: INVALID_ARGUMENT (ds or out NULL, batch_size < 1,
 * world_size < 1, rank outside [0, world_size), std not finite and positive, mean not
 * finite), OUT_OF_MEMORY. */
LOOM_API loom_status loom_batches_create(const loom_dataset *ds, const loom_batch_options *o,
                                         loom_batches **out);

/* Starts epoch `epoch`: the order is a permutation from a deterministic PRNG seeded by
 * seed + epoch (file order without shuffle), identical on every rank; rank r then takes
 * the padded/trimmed list's indices r, r + world_size, ... Also rewinds when called with
 * the current epoch. Accepts NULL (no-op). */
LOOM_API void loom_batches_set_epoch(loom_batches *b, int64_t epoch);

/* The next batch of this epoch: *out_images is f32[count, rows*cols] (normalised),
 * *out_labels is i64[count]. Borrowed: valid until the next call on b or its destruction.
 * Any out pointer may be NULL. Returns false (and leaves the outputs untouched) at the end
 * of the epoch or for a NULL iterator. */
LOOM_API bool loom_batches_next(loom_batches *b, const float **out_images,
                                const int64_t **out_labels, int64_t *out_count);

/* Number of batches one epoch yields on this rank (equal on every rank); 0 for NULL. */
LOOM_API int64_t loom_batches_per_epoch(const loom_batches *b);

/* Frees the iterator. Accepts NULL. */
LOOM_API void loom_batches_destroy(loom_batches *b);

#ifdef __cplusplus
}
#endif

#endif
