/* The on-disk code cache (layout in disk_cache.h): entries authenticated with a keyed MAC
 * under a per-user secret, in a folder only its owner can write, read header first, capped in
 * size with least-recently-used eviction. Object code is executable code: an entry that
 * fails any check is reported and recompiled, never loaded. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>
#include <xxhash.h>

#include "disk_cache.h"

#define MAGIC "LOOMOBJ"          /* with its NUL: 8 bytes */
#define HEADER_FIXED (8 + 4 + 4) /* magic, version, key length */
#define MAC_BYTES crypto_auth_hmacsha512256_BYTES
#define KEY_BYTES crypto_auth_hmacsha512256_KEYBYTES
#define OVERHEAD (HEADER_FIXED + 8 + MAC_BYTES) /* + payload length + MAC */
#define MAX_KEY_LEN 65536u                       /* cache keys are a few hundred bytes */

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

/* XXH3 (Debian's libxxhash): tens of GB/s. Names cache files, checks code blobs and digests
 * collectives; it catches damage, not forgery (the entries' MAC does that). */
uint64_t loom_rt_hash64(const void *data, size_t len) {
    return XXH3_64bits(data, len);
}

/* ---- the per-user secret ------------------------------------------------------------------ */

const char *loom_rt_disk_cache_key_path(char *buf, size_t n) {
    const char *env = getenv("LOOM_CACHE_KEY");
    int w;
    if (env && *env)
        w = snprintf(buf, n, "%s", env);
    else if ((env = getenv("XDG_CONFIG_HOME")) && env[0] == '/')
        w = snprintf(buf, n, "%s/loom/cache.key", env);
    else if ((env = getenv("HOME")) && *env)
        w = snprintf(buf, n, "%s/.config/loom/cache.key", env);
    else
        return NULL;
    return w >= 0 && (size_t)w < n ? buf : NULL;
}

/* mkdir -p, each missing component created mode `mode`. */
static loom_status make_dirs(const char *dir, mode_t mode, const char *what, loom_ir_diag *d) {
    char path[PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof path)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: bad folder name '%s'", what, dir);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, mode) != 0 && errno != EEXIST)
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot create folder %s: %s",
                                    what, path, strerror(errno));
        path[i] = saved;
    }
    return LOOM_OK;
}

/* A folder or file another user could have written: owned by someone else, or writable by
 * group or others. NULL when safe, else why (for the message). */
static const char *unsafe(const struct stat *st) {
    if (st->st_uid != geteuid())
        return "owned by another user";
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return "writable by group or others";
    return NULL;
}

static pthread_mutex_t key_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char key_bytes[KEY_BYTES];
static char key_loaded_from[PATH_MAX]; /* the path the key came from; "" before */

/* Reads the secret at path: a regular file of KEY_BYTES, the caller's, no access for group or
 * others. */
static loom_status read_key(const char *path, unsigned char *out, loom_ir_diag *d) {
    int fd;
    uint64_t size;
    loom_status st = loom_ir_open_regular(path, &fd, &size, d);
    if (st != LOOM_OK)
        return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid() || (sb.st_mode & 077) ||
        size != KEY_BYTES) {
        close(fd);
        return loom_ir_diag_set(
            d, LOOM_STATUS_IO_ERROR,
            "disk cache: the key %s is %s: the disk cache is off until it is fixed (chmod 600 "
            "it, or remove it to make a new one)",
            path,
            sb.st_uid != geteuid() ? "owned by another user"
            : (sb.st_mode & 077)   ? "readable or writable by group or others"
                                   : "not 32 bytes");
    }
    st = loom_ir_pread_full(fd, out, KEY_BYTES, 0, path, d);
    close(fd);
    return st;
}

/* The secret the entries are authenticated under: read from its file, created there (mode
 * 0600, its folders 0700) with random bytes on first use. Not inside the cache folder: who
 * can write entries must not be able to read it. */
static loom_status cache_secret(const char *cache_dir, unsigned char *out, loom_ir_diag *d) {
    char path[PATH_MAX];
    if (!loom_rt_disk_cache_key_path(path, sizeof path))
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                "disk cache: no place for its key (set HOME, XDG_CONFIG_HOME or "
                                "LOOM_CACHE_KEY)");
    pthread_mutex_lock(&key_mu);
    if (strcmp(key_loaded_from, path) == 0) {
        memcpy(out, key_bytes, KEY_BYTES);
        pthread_mutex_unlock(&key_mu);
        return LOOM_OK;
    }
    loom_status st = LOOM_OK;
    char real_dir[PATH_MAX], key_dir[PATH_MAX], real_key_dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash && slash > path) {
        snprintf(key_dir, sizeof key_dir, "%.*s", (int)(slash - path), path);
        st = make_dirs(key_dir, 0700, "disk cache key", d);
        if (st == LOOM_OK && realpath(cache_dir, real_dir) && realpath(key_dir, real_key_dir)) {
            size_t n = strlen(real_dir);
            if (strncmp(real_key_dir, real_dir, n) == 0 &&
                (real_key_dir[n] == '/' || !real_key_dir[n]))
                st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                      "disk cache: its key %s lies inside the cache folder %s: "
                                      "the disk cache is off (set LOOM_CACHE_KEY elsewhere)",
                                      path, cache_dir);
        }
    }
    unsigned char k[KEY_BYTES];
    if (st == LOOM_OK) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) { /* first use: a new secret */
            randombytes_buf(k, sizeof k);
            bool ok = write(fd, k, sizeof k) == (ssize_t)sizeof k && fsync(fd) == 0;
            if (close(fd) != 0 || !ok) {
                unlink(path);
                st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                      "disk cache: cannot write its key %s: %s", path,
                                      strerror(errno));
            }
        } else if (errno == EEXIST) {
            /* another process may be writing it this moment: a short file, once more */
            st = read_key(path, k, d);
            for (int i = 0; i < 20 && st != LOOM_OK; i++) {
                struct timespec ts = {0, 5000000};
                nanosleep(&ts, NULL);
                loom_ir_diag_init(d);
                st = read_key(path, k, d);
            }
        } else {
            st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: cannot create its key %s: %s",
                                  path, strerror(errno));
        }
    }
    if (st == LOOM_OK) {
        memcpy(key_bytes, k, KEY_BYTES);
        snprintf(key_loaded_from, sizeof key_loaded_from, "%s", path);
        memcpy(out, k, KEY_BYTES);
    }
    sodium_memzero(k, sizeof k);
    pthread_mutex_unlock(&key_mu);
    return st;
}

/* ---- the folder ----------------------------------------------------------------------------- */

static loom_status file_path(char *buf, size_t n, const char *dir, const char *key,
                             loom_ir_diag *d) {
    uint64_t h = loom_rt_hash64(key, strlen(key));
    int w = snprintf(buf, n, "%s/%016llx%s", dir, (unsigned long long)h, LOOM_RT_DISK_CACHE_EXT);
    if (w < 0 || (size_t)w >= n)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: path too long: %s", dir);
    return LOOM_OK;
}

/* The folder is the caller's alone: owned by them, writable by nobody else. *out_missing:
 * there is none (or something else is there: nothing to read). */
static loom_status check_dir(const char *dir, bool *out_missing, loom_ir_diag *d) {
    struct stat sb;
    *out_missing = false;
    if (stat(dir, &sb) != 0) {
        *out_missing = errno == ENOENT || errno == ENOTDIR;
        return *out_missing ? LOOM_OK
                            : loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: %s: %s", dir,
                                               strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) { /* nothing to read there; a put says why it cannot write */
        *out_missing = true;
        return LOOM_OK;
    }
    const char *why = unsafe(&sb);
    if (why)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                "disk cache: the folder %s is %s (mode %04o, uid %u): not used, "
                                "since code planted there would run; make it yours alone "
                                "(chmod 700 %s) or set LOOM_CACHE_DIR to a folder of your own",
                                dir, why, (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid, dir);
    return LOOM_OK;
}

/* The cap on the folder's entries: LOOM_CACHE_MAX_MB (0: no cap), else the default. */
static uint64_t cap_bytes(void) {
    const char *env = getenv("LOOM_CACHE_MAX_MB");
    char *end;
    if (env && *env) {
        double mb = strtod(env, &end);
        if (*end == '\0' && mb >= 0)
            return mb == 0 ? UINT64_MAX : (uint64_t)(mb * 1048576.0);
    }
    return (uint64_t)LOOM_RT_DISK_CACHE_DEFAULT_MAX_MB << 20;
}

typedef struct entry_info {
    char name[64];
    uint64_t bytes;
    struct timespec used; /* mtime: set on every hit */
} entry_info;

static int older_first(const void *pa, const void *pb) {
    const entry_info *a = pa, *b = pb;
    if (a->used.tv_sec != b->used.tv_sec)
        return a->used.tv_sec < b->used.tv_sec ? -1 : 1;
    return (a->used.tv_nsec > b->used.tv_nsec) - (a->used.tv_nsec < b->used.tv_nsec);
}

void loom_rt_disk_cache_trim(const char *dir, const char *keep) {
    uint64_t cap = cap_bytes();
    DIR *dp = opendir(dir);
    if (!dp)
        return;
    int dfd = dirfd(dp);
    entry_info *es = NULL;
    size_t n = 0, cap_n = 0;
    uint64_t total = 0;
    size_t ext = strlen(LOOM_RT_DISK_CACHE_EXT);
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len <= ext || len >= sizeof es->name ||
            strcmp(e->d_name + len - ext, LOOM_RT_DISK_CACHE_EXT) != 0)
            continue;
        struct stat sb;
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (n == cap_n) {
            size_t nc = cap_n ? 2 * cap_n : 64;
            entry_info *ne = realloc(es, nc * sizeof *es);
            if (!ne)
                break;
            es = ne;
            cap_n = nc;
        }
        snprintf(es[n].name, sizeof es[n].name, "%s", e->d_name);
        es[n].bytes = (uint64_t)sb.st_size;
        es[n].used = sb.st_mtim;
        total += es[n].bytes;
        n++;
    }
    if (total > cap && n > 0) { /* the least recently used go, down to 90% of the cap */
        qsort(es, n, sizeof *es, older_first);
        uint64_t goal = cap / 10 * 9;
        for (size_t i = 0; i < n && total > goal; i++) {
            if (keep && strcmp(es[i].name, keep) == 0)
                continue;
            if (unlinkat(dfd, es[i].name, 0) == 0)
                total -= es[i].bytes;
        }
    }
    /* temp files of writers that died (their pid is gone) */
    rewinddir(dp);
    while ((e = readdir(dp)) != NULL) {
        char *tag = strstr(e->d_name, LOOM_RT_DISK_CACHE_EXT ".tmp.");
        if (!tag)
            continue;
        char target[PATH_MAX];
        if (snprintf(target, sizeof target, "%s/%.*s", dir,
                     (int)(tag - e->d_name + (ptrdiff_t)ext), e->d_name) < (int)sizeof target)
            loom_ir_remove_stale_temps(target);
    }
    closedir(dp);
    free(es);
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
    if (key_len == 0 || key_len > MAX_KEY_LEN)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache put: the key must be 1..%u bytes, got %zu",
                                MAX_KEY_LEN, key_len);
    if (len > LOOM_RT_DISK_CACHE_MAX_ENTRY)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "disk cache put: payload of %zu bytes is too large", len);
    if (sodium_init() < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "disk cache: libsodium did not start");
    char path[PATH_MAX];
    bool missing;
    loom_status st = file_path(path, sizeof path, dir, key, d);
    if (st == LOOM_OK)
        st = check_dir(dir, &missing, d);
    if (st == LOOM_OK && missing) {
        st = make_dirs(dir, 0700, "disk cache", d);
        if (st == LOOM_OK)
            st = check_dir(dir, &missing, d);
        if (st == LOOM_OK && missing)
            st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: %s is not a folder", dir);
    }
    unsigned char secret[KEY_BYTES];
    if (st == LOOM_OK)
        st = cache_secret(dir, secret, d);
    if (st != LOOM_OK)
        return st;

    size_t total = OVERHEAD + key_len + len;
    unsigned char *img = loom_ir_alloc(a, total);
    if (!img) {
        sodium_memzero(secret, sizeof secret);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "disk cache put: out of memory for a %zu-byte file", total);
    }
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
    crypto_auth_hmacsha512256(p, img, total - MAC_BYTES, secret);
    sodium_memzero(secret, sizeof secret);
    st = loom_ir_write_file(path, img, total, 0600, d);
    loom_ir_free(a, img, total);
    if (st == LOOM_OK)
        loom_rt_disk_cache_trim(dir, strrchr(path, '/') + 1);
    return st;
}

/* ---- get ----------------------------------------------------------------------------------- */

static loom_status corrupt(loom_ir_diag *d, const char *path, const char *what) {
    return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA, "disk cache: %s %s", path, what);
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
    if (sodium_init() < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "disk cache: libsodium did not start");
    char path[PATH_MAX];
    bool missing;
    loom_status st = file_path(path, sizeof path, dir, key, d);
    if (st == LOOM_OK)
        st = check_dir(dir, &missing, d);
    if (st != LOOM_OK || missing)
        return st; /* no folder: a plain miss */
    struct stat ls;
    if (lstat(path, &ls) != 0)
        return errno == ENOENT || errno == ENOTDIR
                   ? LOOM_OK
                   : loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "disk cache: %s: %s", path,
                                      strerror(errno));
    if (!S_ISREG(ls.st_mode)) /* a link, a FIFO, a folder: not an entry we wrote */
        return corrupt(d, path, "is not a regular file");
    unsigned char secret[KEY_BYTES];
    if ((st = cache_secret(dir, secret, d)) != LOOM_OK)
        return st;
    int fd;
    uint64_t size;
    if ((st = loom_ir_open_regular(path, &fd, &size, d)) != LOOM_OK) {
        sodium_memzero(secret, sizeof secret);
        return st;
    }
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    const char *why = fstat(fd, &sb) == 0 ? unsafe(&sb) : "not readable";
    unsigned char head[HEADER_FIXED], tail[8 + MAC_BYTES];
    unsigned char *buf = NULL;
    size_t block = 0;
    uint64_t klen = 0, plen = 0;
    if (why) {
        st = loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                              "disk cache: %s is %s (mode %04o, uid %u): not loaded", path, why,
                              (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid);
        goto done;
    }
    /* the header first: a damaged or foreign file is named without being read */
    if (size < OVERHEAD) {
        st = loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                              "disk cache: %s is truncated: %" PRIu64 " bytes, less than the "
                              "%d-byte header and MAC",
                              path, size, OVERHEAD);
        goto done;
    }
    if ((st = loom_ir_pread_full(fd, head, sizeof head, 0, path, d)) != LOOM_OK)
        goto done;
    if (memcmp(head, MAGIC, 8) != 0) {
        st = corrupt(d, path, "is not a Loom object file (bad magic)");
        goto done;
    }
    uint32_t version = rd32(head + 8);
    if (version != LOOM_RT_DISK_CACHE_VERSION) {
        st = loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                              "disk cache: %s has format version %u, this Loom reads %u", path,
                              version, LOOM_RT_DISK_CACHE_VERSION);
        goto done;
    }
    klen = rd32(head + 12);
    if (klen > MAX_KEY_LEN || klen > size - OVERHEAD) {
        st = loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                              "disk cache: %s is truncated: its key of %" PRIu64
                              " bytes runs past the end (%" PRIu64 " bytes)",
                              path, klen, size);
        goto done;
    }
    plen = size - OVERHEAD - klen;
    if (plen > LOOM_RT_DISK_CACHE_MAX_ENTRY) {
        st = corrupt(d, path, "is larger than any entry Loom writes");
        goto done;
    }
    /* everything but the payload: the key (a miss if it is another's) and the MAC */
    block = (size_t)klen + (size_t)plen + 1;
    if (!(buf = loom_ir_alloc(a, block))) {
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                              "disk cache: out of memory reading %s (%" PRIu64 " bytes)", path,
                              size);
        goto done;
    }
    if ((st = loom_ir_pread_full(fd, buf, (size_t)klen, HEADER_FIXED, path, d)) != LOOM_OK ||
        (st = loom_ir_pread_full(fd, tail, 8, HEADER_FIXED + klen, path, d)) != LOOM_OK)
        goto done;
    if (klen != strlen(key) || memcmp(buf, key, (size_t)klen) != 0)
        goto done; /* another key with the same hash: a miss */
    if (rd64(tail) != plen) {
        st = loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                              "disk cache: %s is %s: its header says %" PRIu64
                              " payload bytes, the file has room for %" PRIu64,
                              path, rd64(tail) > plen ? "truncated" : "followed by stray bytes",
                              rd64(tail), plen);
        goto done;
    }
    if ((st = loom_ir_pread_full(fd, buf + klen, (size_t)plen, HEADER_FIXED + klen + 8, path,
                                 d)) != LOOM_OK ||
        (st = loom_ir_pread_full(fd, tail + 8, MAC_BYTES, size - MAC_BYTES, path, d)) != LOOM_OK)
        goto done;
    crypto_auth_hmacsha512256_state mac;
    unsigned char want[MAC_BYTES];
    crypto_auth_hmacsha512256_init(&mac, secret, KEY_BYTES);
    crypto_auth_hmacsha512256_update(&mac, head, sizeof head);
    crypto_auth_hmacsha512256_update(&mac, buf, (size_t)klen);
    crypto_auth_hmacsha512256_update(&mac, tail, 8);
    crypto_auth_hmacsha512256_update(&mac, buf + klen, (size_t)plen);
    crypto_auth_hmacsha512256_final(&mac, want);
    if (crypto_verify_32(want, tail + 8) != 0) {
        st = corrupt(d, path,
                     "fails its MAC: written by another user's Loom, under another key, "
                     "damaged or forged; not loaded");
        goto done;
    }
    /* the payload to the front of the block, NUL-terminated; then the block shrunk */
    memmove(buf, buf + klen, (size_t)plen);
    buf[plen] = '\0';
    unsigned char *shrunk = loom_ir_realloc(a, buf, block, (size_t)plen + 1);
    if (!shrunk) { /* an allocator may refuse even to shrink: copy instead */
        if (!(shrunk = loom_ir_alloc(a, (size_t)plen + 1))) {
            st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                  "disk cache: out of memory reading %s", path);
            goto done;
        }
        memcpy(shrunk, buf, (size_t)plen + 1);
        loom_ir_free(a, buf, block);
    }
    buf = NULL;
    *out_data = shrunk;
    *out_len = (size_t)plen;
    futimens(fd, NULL); /* used now: the last to be evicted */
done:
    sodium_memzero(secret, sizeof secret);
    if (buf)
        loom_ir_free(a, buf, block);
    close(fd);
    return st;
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
