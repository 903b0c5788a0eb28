/* The on-disk store of compiled code (LOOM_CACHE_DIR): one authenticated file per cache key,
 * written atomically, so a warm process skips codegen. A content store only: what the
 * payload is (object code) and what goes into the key is the JIT's business.
 *
 * File `<dir>/<16 hex digits of the key's 64-bit hash>.loomobj`, little-endian:
 *   magic "LOOMOBJ\0" (8 bytes), format version u32 (3), key length u32, key bytes,
 *   payload length u64, payload, MAC (32 bytes: HMAC-SHA-512-256, libsodium's crypto_auth,
 *   of every byte before it, under the per-user secret).
 * The full key is stored and compared, so two keys whose hashes collide share a file name
 * but never a payload: the later put replaces the earlier, and a get of the other is a miss.
 *
 * Object code is executable code, so the cache is a security boundary:
 * - the secret: 32 random bytes in LOOM_CACHE_KEY, else $XDG_CONFIG_HOME/loom/cache.key,
 *   else ~/.config/loom/cache.key, created mode 0600 (its folders 0700) on first use, never
 *   inside the cache folder; a key file others can read or write turns the disk cache off;
 * - the folder: created 0700; one owned by another user or writable by group or others is
 *   not used (IO_ERROR saying what to do), and neither is an entry that is (CORRUPT_DATA);
 * - an entry whose MAC does not verify (another user's, damaged, forged) is CORRUPT_DATA;
 * - its header is checked before the rest is read, so a huge or foreign file costs nothing;
 * - the folder's entries are capped (LOOM_CACHE_MAX_MB, default LOOM_RT_DISK_CACHE_DEFAULT_MAX_MB;
 *   0: no cap): a put evicts the least recently used (a hit refreshes an entry's mtime), and
 *   removes temp files of writers that died.
 *
 * Thread-safety: the secret is loaded once under a mutex; puts of one key from two threads
 * write distinct temp files (loom_ir_write_file) and the last rename wins. */
#ifndef LOOM_RUNTIME_DISK_CACHE_H
#define LOOM_RUNTIME_DISK_CACHE_H

#include "ir/ir.h"

/* 3: a keyed MAC (2 had an XXH3 checksum, 1 XXH64); an entry of another version is stale. */
#define LOOM_RT_DISK_CACHE_VERSION 3u
/* The largest payload an entry holds (a step's code is a few megabytes). */
#define LOOM_RT_DISK_CACHE_MAX_ENTRY ((size_t)1 << 30)
/* The folder's cap without LOOM_CACHE_MAX_MB. */
#define LOOM_RT_DISK_CACHE_DEFAULT_MAX_MB 1024

/* The GNU build ID (hex) of the binary this code is linked into, "none" when it has none:
 * part of every cache key, so code compiled by one build of Loom is never loaded by
 * another. Computed once; thread-safe. */
const char *loom_rt_build_id(void);
#define LOOM_RT_DISK_CACHE_EXT ".loomobj"

/* Stores len bytes of data under key (a NUL-terminated string, not empty) in dir, creating
 * dir and its parents (mode 0700) when missing, then trims the folder to its cap. Replaces
 * any file of the same name. The file image is assembled in one block from a.
 * Errors: INVALID_ARGUMENT (NULL dir/key/allocator, empty key, data NULL with len > 0),
 * OUT_OF_MEMORY, IO_ERROR (dir cannot be created or written, or is not safely owned; no key;
 * message in d). Callers normally warn and carry on: the cache is an optimization. */
loom_status loom_rt_disk_cache_put(const char *dir, const char *key, const void *data,
                                   size_t len, const loom_allocator *a, loom_ir_diag *d);

/* Looks key up in dir. Hit: LOOM_OK, *out_data = the payload allocated from a with
 * *out_len + 1 bytes (NUL-terminated, so an empty payload is a non-NULL hit); the caller
 * frees it with loom_ir_free(a, data, len + 1). Miss (no file, no dir, or a file holding
 * another key whose hash collides): LOOM_OK with *out_data NULL and *out_len 0.
 * Errors (*out_data NULL): INVALID_ARGUMENT, OUT_OF_MEMORY, IO_ERROR (the file exists but
 * cannot be read; the folder is not safely owned; no key), CORRUPT_DATA (not a regular
 * file, not safely owned, bad magic, other format version, truncated, trailing bytes, MAC
 * mismatch; the message names the file and the fault). On CORRUPT_DATA the caller warns,
 * recompiles and may put over the file. */
loom_status loom_rt_disk_cache_get(const char *dir, const char *key, const loom_allocator *a,
                                   void **out_data, size_t *out_len, loom_ir_diag *d);

/* Trims dir to its cap (see above), never removing the entry named keep (may be NULL), and
 * removes temp files of dead writers. Best effort: errors are ignored. */
void loom_rt_disk_cache_trim(const char *dir, const char *keep);

/* The secret's path into buf (n bytes), as described above; NULL when none applies. */
const char *loom_rt_disk_cache_key_path(char *buf, size_t n);

/* The cache folder into buf (n bytes): $LOOM_CACHE_DIR if set (set but empty: the disk
 * cache is off, NULL), else $XDG_CACHE_HOME/loom if that is an absolute path, else
 * $HOME/.cache/loom. NULL when none applies or the path does not fit in n. Reads the
 * environment: not thread-safe against setenv. */
const char *loom_rt_disk_cache_default_dir(char *buf, size_t n);

/* XXH3-64 (libxxhash, seed 0) of len bytes: (of the key) the file name; also the code blob's
 * checksum and the collectives' digest. Catches damage, not forgery. */
uint64_t loom_rt_hash64(const void *data, size_t len);

#endif
