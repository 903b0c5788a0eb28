/* Whole-file I/O, the one writer and the one reader every file Loom touches goes through:
 * atomic replacement of regular files (a unique temp file in the target's folder opened with
 * O_EXCL | O_NOFOLLOW, fsync of file and folder, rename), special files written in place or
 * refused but never replaced, and regular files only read, opened without blocking. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_NOFOLLOW, O_DIRECTORY, getrandom */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ir.h"

/* A temp file's name is "<target>.tmp.<pid>.<8 hex digits>" (TEMP_TAG after the target). */
#define TEMP_TAG ".tmp."

static const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a folder"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

/* path's folder ("." when it has none) into buf and its last component into *out_base. */
static bool split_path(const char *path, char *buf, size_t n, const char **out_base) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        *out_base = path;
        return snprintf(buf, n, ".") < (int)n;
    }
    *out_base = slash + 1;
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    if (len >= n)
        return false;
    memcpy(buf, path, len);
    buf[len] = '\0';
    return true;
}

static uint32_t random_u32(void) {
    uint32_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    static uint32_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)ts.tv_nsec ^ (uint32_t)getpid() << 16 ^ ++counter * 2654435761u;
}

static loom_status write_all(int fd, const void *data, size_t len, const char *shown,
                             loom_ir_diag *d) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: write failed: %s", shown,
                                    w < 0 ? strerror(errno) : "no progress");
        p += w;
        len -= (size_t)w;
    }
    return LOOM_OK;
}

/* A FIFO or a character device (a terminal, /dev/null, a pipe behind /dev/stdout): written
 * in place, as a shell redirection would, never replaced by a regular file. A FIFO nobody
 * reads is an error, not a wait. */
static loom_status write_in_place(const char *path, mode_t kind, const void *data, size_t len,
                                  loom_ir_diag *d) {
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot write to %s: %s", path,
                                file_kind(kind),
                                errno == ENXIO ? "nothing reads it" : strerror(errno));
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    loom_status st = write_all(fd, data, len, path, d);
    if (close(fd) != 0 && st == LOOM_OK)
        st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: close failed: %s", path,
                              strerror(errno));
    return st;
}

/* True when pid is a process that no longer exists. */
static bool dead(long pid) {
    return pid > 0 && pid <= INT_MAX && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

void loom_ir_remove_stale_temps(const char *path) {
    char dir[PATH_MAX];
    const char *base;
    if (!split_path(path, dir, sizeof dir, &base) || !*base)
        return;
    size_t blen = strlen(base), tlen = strlen(TEMP_TAG);
    DIR *dp = opendir(dir);
    if (!dp)
        return;
    int dfd = dirfd(dp);
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) != 0 || strncmp(n + blen, TEMP_TAG, tlen) != 0)
            continue;
        char *end;
        long pid = strtol(n + blen + tlen, &end, 10);
        if (end == n + blen + tlen || *end != '.' || !dead(pid))
            continue;
        struct stat st; /* only our own regular files: never follow or remove another's */
        if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid())
            unlinkat(dfd, n, 0);
    }
    closedir(dp);
}

loom_status loom_ir_write_file(const char *path, const void *data, size_t len, int mode,
                               loom_ir_diag *d) {
    if (!path || !*path || (!data && len > 0))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "write_file: %s",
                                !path || !*path ? "no path" : "data is NULL");
    char target[PATH_MAX];
    if (snprintf(target, sizeof target, "%s", path) >= (int)sizeof target)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: path too long", path);
    struct stat st;
    int keep_mode = -1; /* the replaced file's permissions */
    if (lstat(target, &st) == 0) {
        if (S_ISLNK(st.st_mode)) {
            /* A link is followed to the file it names, which is replaced in its own folder;
             * but not one another user planted in a sticky world-writable folder (/tmp), the
             * kernel's protected_symlinks rule. */
            char dir[PATH_MAX];
            const char *base;
            struct stat ds, ts;
            if (split_path(target, dir, sizeof dir, &base) && stat(dir, &ds) == 0 &&
                (ds.st_mode & S_ISVTX) && (ds.st_mode & S_IWOTH) && st.st_uid != geteuid() &&
                st.st_uid != ds.st_uid)
                return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                        "%s: a symbolic link of another user (uid %u) in a "
                                        "world-writable folder: not followed",
                                        path, (unsigned)st.st_uid);
            if (stat(target, &ts) != 0)
                return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                        "%s: a symbolic link to nothing: %s", path,
                                        strerror(errno));
            if (S_ISREG(ts.st_mode)) {
                char *real = realpath(target, NULL);
                if (!real || snprintf(target, sizeof target, "%s", real) >= (int)sizeof target) {
                    free(real);
                    return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                            "%s: cannot resolve its link", path);
                }
                free(real);
            }
            st = ts;
        }
        if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))
            return write_in_place(target, st.st_mode, data, len, d);
        if (!S_ISREG(st.st_mode))
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: is %s: not replaced", path,
                                    file_kind(st.st_mode));
        keep_mode = (int)(st.st_mode & 07777);
    } else if (errno != ENOENT) {
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: %s", path, strerror(errno));
    }
    char dir[PATH_MAX], tmp[PATH_MAX + 64];
    const char *base;
    if (!split_path(target, dir, sizeof dir, &base))
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: path too long", path);
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        if (snprintf(tmp, sizeof tmp, "%s" TEMP_TAG "%ld.%08" PRIx32, target, (long)getpid(),
                     random_u32()) >= (int)sizeof tmp)
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: path too long", path);
        /* O_EXCL | O_NOFOLLOW: a file or link planted at the name is never opened */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  mode > 0 ? (mode_t)mode : 0666);
        if (fd < 0 && errno != EEXIST)
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot create %s: %s", path,
                                    tmp, strerror(errno));
    }
    if (fd < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                "%s: cannot create a temp file beside it: names taken", path);
    loom_status st_w = write_all(fd, data, len, tmp, d);
    if (st_w == LOOM_OK && mode <= 0 && keep_mode >= 0 && fchmod(fd, (mode_t)keep_mode) != 0)
        st_w = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot keep its permissions: %s",
                                path, strerror(errno));
    if (st_w == LOOM_OK && mode > 0 && fchmod(fd, (mode_t)mode) != 0)
        st_w = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot set its permissions: %s",
                                path, strerror(errno));
    if (st_w == LOOM_OK && fsync(fd) != 0)
        st_w = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: sync failed: %s", tmp,
                                strerror(errno));
    if (close(fd) != 0 && st_w == LOOM_OK)
        st_w = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: close failed: %s", tmp,
                                strerror(errno));
    if (st_w == LOOM_OK && rename(tmp, target) != 0)
        st_w = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: rename failed: %s", path,
                                strerror(errno));
    if (st_w != LOOM_OK) {
        unlink(tmp);
        return st_w;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the rename itself durable */
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    loom_ir_remove_stale_temps(target);
    return LOOM_OK;
}

loom_status loom_ir_write_file_atomic(const char *path, const void *data, size_t len,
                                      loom_ir_diag *d) {
    return loom_ir_write_file(path, data, len, 0, d);
}

loom_status loom_ir_open_regular(const char *path, int *out_fd, uint64_t *out_size,
                                 loom_ir_diag *d) {
    *out_fd = -1;
    *out_size = 0;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot open: %s", path,
                                strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot stat: %s", path,
                                strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: is %s: only regular files are read",
                                path, file_kind(st.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *out_fd = fd;
    *out_size = (uint64_t)st.st_size;
    return LOOM_OK;
}

loom_status loom_ir_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                               loom_ir_diag *d) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: read failed: %s", path,
                                    strerror(errno));
        if (r == 0)
            return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA,
                                    "%s: truncated: it ends %zu bytes early (it shrank while "
                                    "being read?)",
                                    path, n);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return LOOM_OK;
}

/* The bytes of fd (a regular file of size bytes, or stdin of unknown size) into a block from
 * a of exactly len + 1 bytes, NUL-terminated. */
static loom_status read_fd(int fd, uint64_t size, bool known, const char *path,
                           const loom_allocator *a, char **out_data, size_t *out_len,
                           loom_ir_diag *d) {
    if (known && size > LOOM_IR_READ_FILE_MAX)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                "%s: %" PRIu64 " bytes, over the %llu-byte limit for a text file",
                                path, size, (unsigned long long)LOOM_IR_READ_FILE_MAX);
    size_t cap = known ? (size_t)size + 1 : 4096, len = 0;
    char *buf = loom_ir_alloc(a, cap);
    while (buf) {
        if (len + 1 >= cap) { /* stdin, or a file that grew */
            char probe;
            ssize_t r = known && len == size ? read(fd, &probe, 1) : 1;
            if (r == 0)
                break; /* the whole file, no more */
            if (r < 0 && errno == EINTR)
                continue;
            if (cap > LOOM_IR_READ_FILE_MAX) {
                loom_ir_free(a, buf, cap);
                return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR,
                                        "%s: over the %llu-byte limit for a text file", path,
                                        (unsigned long long)LOOM_IR_READ_FILE_MAX);
            }
            char *nb = loom_ir_realloc(a, buf, cap, cap * 2);
            if (!nb) {
                loom_ir_free(a, buf, cap);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
            if (known && len == size && r == 1)
                buf[len++] = probe;
            known = false;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            loom_ir_free(a, buf, cap);
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: read failed: %s", path,
                                    strerror(e));
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (!buf)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "%s: out of memory reading", path);
    buf[len] = '\0';
    if (cap != len + 1) { /* callers free len + 1 bytes */
        char *exact = loom_ir_alloc(a, len + 1);
        if (!exact) {
            loom_ir_free(a, buf, cap);
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "%s: out of memory reading",
                                    path);
        }
        memcpy(exact, buf, len + 1);
        loom_ir_free(a, buf, cap);
        buf = exact;
    }
    *out_data = buf;
    *out_len = len;
    return LOOM_OK;
}

loom_status loom_ir_read_file(const char *path, const loom_allocator *a, char **out_data,
                              size_t *out_len, loom_ir_diag *d) {
    *out_data = NULL;
    *out_len = 0;
    if (strcmp(path, "-") == 0)
        return read_fd(STDIN_FILENO, 0, false, path, a, out_data, out_len, d);
    int fd;
    uint64_t size;
    loom_status st = loom_ir_open_regular(path, &fd, &size, d);
    if (st != LOOM_OK)
        return st;
    st = read_fd(fd, size, true, path, a, out_data, out_len, d);
    close(fd);
    return st;
}
