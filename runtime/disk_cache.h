/* The on-disk store of compiled code (LOOM_CACHE_DIR): one checksummed file per cache key,
 * written atomically, so a warm process skips codegen. A content store only: what the
 * payload is (object code) and what goes into the key is the JIT's business.
 *
 * File `<dir>/<16 hex digits of the key's 64-bit hash>.loomobj`, little-endian:
 *   magic "LOOMOBJ\0" (8 bytes), format version u32 (1), key length u32, key bytes,
 *   payload length u64, payload, checksum u64 (XXH3-64, seed 0, of every byte before it).
 * The full key is stored and compared, so two keys whose hashes collide share a file name
 * but never a payload: the later put replaces the earlier, and a get of the other is a miss.
 *
 * Thread-safety: functions touch no shared state; concurrent puts of one key from the same
 * process race on loom_ir_write_file_atomic's temp file (name per process), so a process
 * must not write one key from two threads at once. Different processes are safe: each
 * writes its own temp file and rename() is atomic. */
#ifndef LOOM_RUNTIME_DISK_CACHE_H
#define LOOM_RUNTIME_DISK_CACHE_H

#include "ir/ir.h"

/* 2: XXH3 checksums and file names (1 had XXH64); an entry of another version is stale. */
#define LOOM_RT_DISK_CACHE_VERSION 2u

/* The GNU build ID (hex) of the binary this code is linked into, "none" when it has none:
 * part of every cache key, so code compiled by one build of Loom is never loaded by
 * another. Computed once; thread-safe. */
const char *loom_rt_build_id(void);
#define LOOM_RT_DISK_CACHE_EXT ".loomobj"

/* Stores len bytes of data under key (a NUL-terminated string, not empty) in dir, creating
 * dir and its parents (mode 0755) when missing. Replaces any file of the same name. The
 * file image is assembled in one block from a.
 * Errors: INVALID_ARGUMENT (NULL dir/key/allocator, empty key, data NULL with len > 0),
 * OUT_OF_MEMORY, IO_ERROR (dir cannot be created or written; message in d). Callers
 * normally warn and carry on: the cache is an optimization. */
loom_status loom_rt_disk_cache_put(const char *dir, const char *key, const void *data,
                                   size_t len, const loom_allocator *a, loom_ir_diag *d);

/* Looks key up in dir. Hit: LOOM_OK, *out_data = the payload allocated from a with
 * *out_len + 1 bytes (NUL-terminated, so an empty payload is a non-NULL hit); the caller
 * frees it with loom_ir_free(a, data, len + 1). Miss (no file, no dir, or a file holding
 * another key whose hash collides): LOOM_OK with *out_data NULL and *out_len 0.
 * Errors (*out_data NULL): INVALID_ARGUMENT, OUT_OF_MEMORY, IO_ERROR (the file exists but
 * cannot be read), CORRUPT_DATA (bad magic, other format version, truncated, trailing
 * bytes, checksum mismatch; the message names the file and the fault). On CORRUPT_DATA the
 * caller warns, recompiles and may put over the file. */
loom_status loom_rt_disk_cache_get(const char *dir, const char *key, const loom_allocator *a,
                                   void **out_data, size_t *out_len, loom_ir_diag *d);

/* The cache folder into buf (n bytes): $LOOM_CACHE_DIR if set (set but empty: the disk
 * cache is off, NULL), else $XDG_CACHE_HOME/loom if that is an absolute path, else
 * $HOME/.cache/loom. NULL when none applies or the path does not fit in n. Reads the
 * environment: not thread-safe against setenv. */
const char *loom_rt_disk_cache_default_dir(char *buf, size_t n);

/* XXH3-64 (libxxhash, seed 0) of len bytes: the file checksum, and (of the key) the file name;
 * also the code blob's checksum and the collectives' digest. */
uint64_t loom_rt_hash64(const void *data, size_t len);

#endif
