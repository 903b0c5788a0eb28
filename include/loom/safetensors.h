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

/* Writes the n tensors' current values (computing pending ones, all in one graph) to path
 * atomically (a temporary file in the same folder, fsync, rename): a failed save leaves any
 * previous file intact. Tensors are stored in name order (byte order of the UTF-8 names)
 * with 8-byte aligned data and {"format": "pt"} metadata, as compact JSON padded with
 * spaces; dtypes F64 F32 F16 BF16 I64 I32 BOOL. n may be 0 (an empty checkpoint). Names
 * must be valid UTF-8 without control characters. Errors (also recorded in ctx, naming
 * the file and the tensor): INVALID_ARGUMENT (NULL, empty or duplicate names, names with
 * control characters or invalid UTF-8, the reserved name "__metadata__", a handle of
 * another context), STALE_HANDLE, IO_ERROR, OUT_OF_MEMORY, DEVICE_ERROR. */
LOOM_API loom_status loom_safetensors_save(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts);

/* Reads path and assigns each listed tensor the file's tensor of the same name (as
 * loom_assign: the value lands in the tensor's own buffer at the next mark_step; reads and
 * ops recorded after the load see it); the tensors must be long-lived (not results of the
 * current step) and their dtypes and shapes must match the file's exactly. strict: every
 * tensor in the file must be listed too (PyTorch's load_state_dict(strict=True)). Nothing
 * is assigned unless the whole file parses, everything validates and every value has been
 * copied to the device; only an OUT_OF_MEMORY while recording the assignments themselves
 * (a few bytes of bookkeeping) can leave the earlier ones made. Errors (recorded in ctx
 * with the file name and the offending tensor): INVALID_ARGUMENT (NULL, a name listed
 * twice, a listed name missing from the file, dtype/shape mismatch, a step's result,
 * unexpected names under strict), STALE_HANDLE, IO_ERROR, CORRUPT_DATA and UNSUPPORTED
 * (see loom_safetensors_parse), OUT_OF_MEMORY. */
LOOM_API loom_status loom_safetensors_load(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts, bool strict);

/* ---- parsed files (inspection, fuzzing) ------------------------------------------------ */

typedef struct loom_safetensors loom_safetensors;

/* Parses and validates a whole file image (len bytes, copied): header length within the
 * data and at most 100,000,000 bytes; the header one strict UTF-8 JSON object starting
 * with '{' (whitespace between tokens and after it, as the format's space padding;
 * strings with every JSON escape, \uXXXX surrogate pairs included; no duplicate keys
 * anywhere); each entry an object with exactly the keys dtype, shape and data_offsets,
 * a known dtype, rank <= 8, shape and offsets integers in [0, 2^63-1] (no fractions or
 * exponents), data_offsets [begin, end] with end - begin == numel * size (no overflow),
 * every range inside the data, the ranges tiling the data exactly in offset order (none
 * overlapping, no byte uncovered, as the reference reader demands), no duplicate names,
 * no NUL in names, BOOL bytes 0 or 1. An optional "__metadata__" must be an object of
 * strings (or null); it is checked, not kept. On success *out is owned by the caller and
 * *out is NULL on failure. err (may be NULL) receives a message naming the fault
 * ("tensor 'fc1.weight': data_offsets [0, 12] hold 12 bytes, dtype F32 shape [4] needs
 * 16"). Errors: INVALID_ARGUMENT (NULL), CORRUPT_DATA, UNSUPPORTED (a dtype of the format
 * that Loom lacks: U8, I8, I16, U16, U32, U64, F8_*, F6_*, F4, C64), OUT_OF_MEMORY. */
LOOM_API loom_status loom_safetensors_parse(const void *data, size_t len, loom_safetensors **out,
                                            char *err, size_t err_size);
/* Reads path (a regular file) then parses it; messages start with the path. Errors: as
 * parse, plus IO_ERROR. */
LOOM_API loom_status loom_safetensors_open(const char *path, loom_safetensors **out, char *err,
                                           size_t err_size);
/* Number of tensors (0 for NULL). */
LOOM_API int32_t loom_safetensors_count(const loom_safetensors *f);
/* Tensor i's name (NUL-terminated UTF-8), dtype, rank, shape (room for LOOM_MAX_RANK) and
 * bytes (little-endian, packed row-major; not necessarily aligned to the element size, as
 * files written elsewhere need not pad); any out pointer may be NULL. Borrowed until
 * loom_safetensors_close. Tensors are listed in name order (byte order, as strcmp).
 * Errors: INVALID_ARGUMENT (NULL f, i out of range). */
LOOM_API loom_status loom_safetensors_tensor(const loom_safetensors *f, int32_t i,
                                             const char **out_name, loom_dtype *out_dtype,
                                             int32_t *out_rank, int64_t *out_shape,
                                             const void **out_data, size_t *out_size);
/* Index of the tensor named name, or -1 (also for NULL f or name). */
LOOM_API int32_t loom_safetensors_find(const loom_safetensors *f, const char *name);
/* Frees it. Accepts NULL. */
LOOM_API void loom_safetensors_close(loom_safetensors *f);

#ifdef __cplusplus
}
#endif

#endif
