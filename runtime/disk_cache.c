/* The on-disk code cache: one self-checking file per key (layout in disk_cache.h), written
 * atomically and validated field by field on read so a damaged file is reported, not run. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "disk_cache.h"

#define MAGIC "LOOMOBJ"           /* with its NUL: 8 bytes */
#define HEADER_FIXED (8 + 4 + 4)  /* magic, version, key length */
#define OVERHEAD (HEADER_FIXED + 8 + 8) /* + payload length + checksum */

static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void wr64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void wr32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* XXH3 (Debian's libxxhash): tens of GB/s, so checking a multi-megabyte object file costs
 * well under a millisecond. */
uint64_t loom_rt_hash64(const void *data, size_t len) {
    return XXH3_64bits(data, len);
}

/* ---- paths --------------------------------------------------------------------------------- */

static loom_status file_path(char *buf, size_t n, const char *dir, const char *key,
                             loom_ir_diag *d) {
    uint64_t h = loom_rt_hash64(key, strlen(key));
    int w = snprintf(buf, n, "%s/%016llx%s", dir, (unsigned long long)h, LOOM_RT_DISK_CACHE_EXT);
    if (w < 0 || (size_t)w >= n)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: path too long: %s", dir);
    return LOOM_OK;
}

/* mkdir -p: creates each missing component; an existing non-folder fails at the next. */
static loom_status make_dirs(const char *dir, loom_ir_diag *d) {
    char path[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof path)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: bad folder name '%s'", dir);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                    "disk cache: cannot create folder %s: %s", path, strerror(e));
        }
        path[i] = saved;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: %s is not a folder", dir);
    return LOOM_OK;
}

/* ---- put ----------------------------------------------------------------------------------- */

loom_status loom_rt_disk_cache_put(const char *dir, const char *key, const void *data,
                                   size_t len, const loom_allocator *a, loom_ir_diag *d) {
    if (!dir || !key || !a || (!data && len > 0))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache put: NULL %s", !dir   ? "folder"
                                                           : !key ? "key"
                                                           : !a   ? "allocator"
                                                                  : "data");
    size_t key_len = strlen(key);
    if (key_len == 0 || key_len > UINT32_MAX)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache put: the key must be 1..4G bytes, got %zu", key_len);
    if (len > SIZE_MAX - OVERHEAD - key_len)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache put: payload of %zu bytes is too large", len);
    char path[4096];
    loom_status st = file_path(path, sizeof path, dir, key, d);
    if (st == LOOM_OK)
        st = make_dirs(dir, d);
    if (st != LOOM_OK)
        return st;

    size_t total = OVERHEAD + key_len + len;
    unsigned char *img = loom_ir_alloc(a, total);
    if (!img)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "disk cache put: out of memory for a %zu-byte file", total);
    unsigned char *p = img;
    memcpy(p, MAGIC, 8);
    wr32(p + 8, LOOM_RT_DISK_CACHE_VERSION);
    wr32(p + 12, (uint32_t)key_len);
    p += HEADER_FIXED;
    memcpy(p, key, key_len);
    p += key_len;
    wr64(p, (uint64_t)len);
    p += 8;
    if (len)
        memcpy(p, data, len);
    p += len;
    wr64(p, loom_rt_hash64(img, total - 8));
    st = loom_ir_write_file_atomic(path, img, total, d);
    loom_ir_free(a, img, total);
    return st;
}

/* ---- get ----------------------------------------------------------------------------------- */

/* Reads the whole open file into *out, a block of *out_block bytes from a holding
 * *out_size bytes of the file (fewer than the block's size - 1 if it shrank meanwhile). */
static loom_status read_all(int fd, const char *path, const loom_allocator *a,
                            unsigned char **out, size_t *out_block, size_t *out_size,
                            loom_ir_diag *d) {
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: cannot stat %s: %s", path,
                                strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s is not a regular file", path);
    if ((uint64_t)sb.st_size >= SIZE_MAX)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "disk cache: %s is too large",
                                path);
    size_t size = (size_t)sb.st_size;
    unsigned char *buf = loom_ir_alloc(a, size + 1);
    if (!buf)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "disk cache: out of memory reading %s (%zu bytes)", path, size);
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            loom_ir_free(a, buf, size + 1);
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: cannot read %s: %s",
                                    path, strerror(e));
        }
        if (r == 0)
            break; /* shrank under us (a concurrent writer renames, never truncates) */
        got += (size_t)r;
    }
    *out = buf;
    *out_block = size + 1;
    *out_size = got;
    return LOOM_OK;
}

/* Checks everything but the key. *payload_at / *payload_len locate the payload. */
static loom_status validate(const unsigned char *buf, size_t size, const char *path,
                            size_t *key_len, size_t *payload_at, size_t *payload_len,
                            loom_ir_diag *d) {
    if (size < OVERHEAD)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s is truncated: %zu bytes, less than the %d-byte "
                                "header and checksum", path, size, OVERHEAD);
    if (memcmp(buf, MAGIC, 8) != 0)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s is not a Loom object file (bad magic)", path);
    uint32_t version = rd32(buf + 8);
    if (version != LOOM_RT_DISK_CACHE_VERSION)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s has format version %u, this Loom reads %u", path,
                                version, LOOM_RT_DISK_CACHE_VERSION);
    uint64_t klen = rd32(buf + 12);
    if (klen > size - OVERHEAD)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s is truncated: its key of %llu bytes runs past the "
                                "end (%zu bytes)", path, (unsigned long long)klen, size);
    uint64_t plen = rd64(buf + HEADER_FIXED + klen);
    uint64_t room = size - OVERHEAD - klen;
    if (plen != room)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s is %s: its header says %llu payload bytes, the "
                                "file has room for %llu", path,
                                plen > room ? "truncated" : "followed by stray bytes",
                                (unsigned long long)plen, (unsigned long long)room);
    uint64_t want = rd64(buf + size - 8), have = loom_rt_hash64(buf, size - 8);
    if (want != have)
        return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                "disk cache: %s fails its checksum (stored %016llx, computed "
                                "%016llx)", path, (unsigned long long)want,
                                (unsigned long long)have);
    *key_len = (size_t)klen;
    *payload_at = HEADER_FIXED + (size_t)klen + 8;
    *payload_len = (size_t)plen;
    return LOOM_OK;
}

loom_status loom_rt_disk_cache_get(const char *dir, const char *key, const loom_allocator *a,
                                   void **out_data, size_t *out_len, loom_ir_diag *d) {
    if (out_data)
        *out_data = NULL;
    if (out_len)
        *out_len = 0;
    if (!dir || !key || !a || !out_data || !out_len)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache get: NULL argument");
    char path[4096];
    loom_status st = file_path(path, sizeof path, dir, key, d);
    if (st != LOOM_OK)
        return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return LOOM_OK; /* no file, or no folder: a plain miss */
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: cannot open %s: %s", path,
                                strerror(e));
    }
    unsigned char *buf = NULL;
    size_t block = 0, size = 0;
    st = read_all(fd, path, a, &buf, &block, &size, d);
    close(fd);
    if (st != LOOM_OK)
        return st;
    size_t key_len = 0, at = 0, plen = 0;
    st = validate(buf, size, path, &key_len, &at, &plen, d);
    if (st == LOOM_OK && (key_len != strlen(key) || memcmp(buf + HEADER_FIXED, key, key_len))) {
        loom_ir_free(a, buf, block); /* another key with the same hash: a miss */
        return LOOM_OK;
    }
    if (st != LOOM_OK) {
        loom_ir_free(a, buf, block);
        return st;
    }
    /* Hand the payload back in the same block: move it to the front, NUL-terminate, shrink. */
    memmove(buf, buf + at, plen);
    buf[plen] = '\0';
    unsigned char *shrunk = loom_ir_realloc(a, buf, block, plen + 1);
    if (!shrunk) { /* an allocator may refuse even to shrink: copy instead */
        shrunk = loom_ir_alloc(a, plen + 1);
        if (!shrunk) {
            loom_ir_free(a, buf, block);
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                    "disk cache: out of memory reading %s", path);
        }
        memcpy(shrunk, buf, plen + 1);
        loom_ir_free(a, buf, block);
    }
    *out_data = shrunk;
    *out_len = plen;
    return LOOM_OK;
}

/* ---- default folder ------------------------------------------------------------------------ */

const char *loom_rt_disk_cache_default_dir(char *buf, size_t n) {
    if (!buf || n == 0)
        return NULL;
    const char *env = getenv("LOOM_CACHE_DIR");
    int w;
    if (env) {
        if (!*env)
            return NULL; /* set but empty: the disk cache is off */
        w = snprintf(buf, n, "%s", env);
    } else if ((env = getenv("XDG_CACHE_HOME")) && env[0] == '/') {
        w = snprintf(buf, n, "%s/loom", env); /* relative XDG paths are invalid: ignored */
    } else if ((env = getenv("HOME")) && *env) {
        w = snprintf(buf, n, "%s/.cache/loom", env);
    } else {
        return NULL;
    }
    return w >= 0 && (size_t)w < n ? buf : NULL;
}
