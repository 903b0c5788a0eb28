/* Whole-file I/O for IR tools and dumps: atomic writes (temp file, fsync, rename). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir.h"

loom_status loom_ir_write_file_atomic(const char *path, const void *data, size_t len,
                                      loom_ir_diag *d) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot create: %s", tmp,
                                strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: write failed: %s", tmp,
                                    strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: sync failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: rename failed: %s", path,
                                strerror(e));
    }
    return LOOM_OK;
}

loom_status loom_ir_read_file(const char *path, const loom_allocator *a, char **out_data,
                              size_t *out_len, loom_ir_diag *d) {
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: cannot open: %s", path,
                                strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = loom_ir_alloc(a, cap);
    loom_status st = LOOM_OK;
    while (buf) {
        if (len + 1 >= cap) {
            char *nb = loom_ir_realloc(a, buf, cap, cap * 2);
            if (!nb) {
                loom_ir_free(a, buf, cap);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) {
                st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "%s: read failed", path);
                loom_ir_free(a, buf, cap);
                buf = NULL;
            }
            break;
        }
    }
    if (!is_stdin)
        fclose(f);
    if (!buf)
        return st != LOOM_OK ? st
                             : loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                                "%s: out of memory reading", path);
    buf[len] = '\0';
    /* Shrink to the exact size so the caller can free with len + 1. */
    char *exact = loom_ir_realloc(a, buf, cap, len + 1);
    *out_data = exact ? exact : buf;
    if (!exact) { /* keep the larger block; callers free len + 1, so copy instead */
        exact = loom_ir_alloc(a, len + 1);
        if (!exact) {
            loom_ir_free(a, buf, cap);
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "%s: out of memory reading", path);
        }
        memcpy(exact, buf, len + 1);
        loom_ir_free(a, buf, cap);
        *out_data = exact;
    }
    *out_len = len;
    return LOOM_OK;
}
