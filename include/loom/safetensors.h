/* Loom checkpoints in the safetensors format (Hugging Face): an 8-byte little-endian header
 * length N, N bytes of JSON ({"name": {"dtype": "F32", "shape": [..], "data_offsets":
 * [begin, end]}, ..., "__metadata__": {...}}), then raw little-endian data. Files written
 * here load with `safetensors.torch.load_file` and with PyTorch; files from them load here.
 *
 * Tutorial
 * --------
 *   loom_named_tensor ts[] = {{"fc1.weight", w1}, {"fc1.bias", b1}};
 *   if (loom_safetensors_save(ctx, "model.safetensors", 2, ts) != LOOM_OK) ...
 *   if (loom_safetensors_load(ctx, "model.safetensors", 2, ts, true) != LOOM_OK)
 *       fprintf(stderr, "%s\n", loom_context_error_message(ctx));
 *
 * Thread-safety: the file functions are thread-safe on distinct objects; save/load are as
 * their context.
 */
#ifndef LOOM_SAFETENSORS_H
#define LOOM_SAFETENSORS_H

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_named_tensor {
    const char *name;
    loom_tensor *tensor;
} loom_named_tensor;

/* Writes the n tensors' current values (computing pending ones) to path atomically (a
 * temporary file in the same folder, fsync, rename): a failed save leaves any previous
 * file intact. Tensors are stored in name order with 8-byte aligned data and
 * {"format": "pt"} metadata; dtypes F64 F32 F16 BF16 I64 I32 BOOL. Errors (also recorded
 * in ctx): INVALID_ARGUMENT (NULL, empty or duplicate names, names with control
 * characters), STALE_HANDLE, IO_ERROR, OUT_OF_MEMORY, DEVICE_ERROR. */
LOOM_API loom_status loom_safetensors_save(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts);

/* Reads path and assigns each listed tensor the file's tensor of the same name (as
 * loom_assign: the value lands in the tensor's own buffer at the next mark_step); dtypes
 * and shapes must match exactly. strict: every tensor in the file must be listed too
 * (PyTorch's load_state_dict(strict=True)). Nothing is assigned unless everything
 * validates. Errors (recorded in ctx with the file name and the offending tensor):
 * INVALID_ARGUMENT (NULL, a listed name missing from the file, dtype/shape mismatch,
 * unexpected names under strict), IO_ERROR, CORRUPT_DATA (see loom_safetensors_parse),
 * OUT_OF_MEMORY. */
LOOM_API loom_status loom_safetensors_load(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts, bool strict);

/* ---- parsed files (inspection, fuzzing) ------------------------------------------------ */

typedef struct loom_safetensors loom_safetensors;

/* Parses and validates a whole file image (len bytes, copied): header length within the
 * data and at most 100 MB, UTF-8 JSON object, each entry with a known dtype, rank <= 8,
 * non-negative shape, data_offsets [begin, end] with end - begin == numel * size, every
 * range inside the data, no two ranges overlapping and no bytes uncovered, no duplicate
 * names. On success *out is owned by the caller. err (may be NULL) receives a message
 * naming the fault ("tensor 'fc1.weight': data_offsets [0, 12] hold 12 bytes, dtype F32
 * shape [4] needs 16"). Errors: INVALID_ARGUMENT (NULL), CORRUPT_DATA, OUT_OF_MEMORY. */
LOOM_API loom_status loom_safetensors_parse(const void *data, size_t len, loom_safetensors **out,
                                            char *err, size_t err_size);
/* Reads path then parses it. Errors: as parse, plus IO_ERROR (naming the path). */
LOOM_API loom_status loom_safetensors_open(const char *path, loom_safetensors **out, char *err,
                                           size_t err_size);
/* Number of tensors (0 for NULL). */
LOOM_API int32_t loom_safetensors_count(const loom_safetensors *f);
/* Tensor i's name (NUL-terminated), dtype, rank, shape (room for LOOM_MAX_RANK) and
 * bytes; any out pointer may be NULL. Borrowed until loom_safetensors_close. Tensors are
 * listed in name order. Errors: INVALID_ARGUMENT (NULL f, i out of range). */
LOOM_API loom_status loom_safetensors_tensor(const loom_safetensors *f, int32_t i,
                                             const char **out_name, loom_dtype *out_dtype,
                                             int32_t *out_rank, int64_t *out_shape,
                                             const void **out_data, size_t *out_size);
/* Index of the tensor named name, or -1. */
LOOM_API int32_t loom_safetensors_find(const loom_safetensors *f, const char *name);
/* Frees it. Accepts NULL. */
LOOM_API void loom_safetensors_close(loom_safetensors *f);

#ifdef __cplusplus
}
#endif

#endif
