/* Linux perf's views of compiled code: the perf map (/tmp/perf-<pid>.map: names for
 * addresses, what `perf report` needs) and the jitdump (names and the code's bytes, what
 * `perf inject --jit` turns into symbols `perf annotate` can disassemble). Both are fed by
 * loom_rt_program_each_code. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernel.h"

const char *loom_rt_perf_map_path(char *buf, size_t size) {
    snprintf(buf, size, "/tmp/perf-%ld.map", (long)getpid());
    return buf;
}

static void map_line(void *ud, const void *code, size_t bytes, const char *name) {
    loom_ir_sbuf_printf(ud, "%" PRIxPTR " %zx %s\n", (uintptr_t)code, bytes, name);
}

loom_status loom_rt_program_perf_map(loom_rt_executable *exe, const loom_ir_plan *plan,
                                     const loom_ir_graph *g, const char *path, loom_ir_diag *d) {
    if (!exe || !path)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "perf map: bad arguments");
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &exe->alloc);
    loom_status st = loom_rt_program_each_code(exe, plan, g, map_line, &sb);
    if (st != LOOM_OK || sb.oom) {
        loom_ir_sbuf_deinit(&sb);
        return st != LOOM_OK
                   ? loom_ir_diag_set(d, st, "perf map: bad arguments")
                   : loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "perf map: out of memory");
    }
    int fd = sb.len ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644) : -2;
    if (fd == -1)
        st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "perf map: cannot open %s: %s", path,
                              strerror(errno));
    else if (fd >= 0) {
        ssize_t n = write(fd, sb.data, sb.len);
        if (n != (ssize_t)sb.len)
            st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "perf map: writing %s: %s", path,
                                  n < 0 ? strerror(errno) : "short write");
        if (close(fd) != 0 && st == LOOM_OK)
            st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "perf map: closing %s: %s", path,
                                  strerror(errno));
    }
    loom_ir_sbuf_deinit(&sb);
    return st;
}

/* ---- jitdump (tools/perf/Documentation/jitdump-specification.txt in Linux) ---------------- */

#define JITDUMP_MAGIC 0x4A695444u /* "JiTD" */
#define JITDUMP_CODE_LOAD 0u

typedef struct jitdump_header {
    uint32_t magic, version, total_size, elf_mach, pad1, pid;
    uint64_t timestamp, flags;
} jitdump_header;

typedef struct jitdump_load { /* then the name, NUL-terminated, then the code */
    uint32_t id, total_size;
    uint64_t timestamp;
    uint32_t pid, tid;
    uint64_t vma, code_addr, code_size, code_index;
} jitdump_load;

static pthread_mutex_t jd_lock = PTHREAD_MUTEX_INITIALIZER;
static int jd_fd = -1;
static uint64_t jd_index; /* code_index: one per record, as perf inject names its files */
static char jd_path[4096];

/* perf record -k mono stamps its samples with CLOCK_MONOTONIC: the records must agree. */
static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool write_all(int fd, const void *p, size_t n) {
    for (const char *c = p; n > 0;) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* Opens the dump once per process (under jd_lock): the header, then a page of it mapped
 * executable, which is how perf record learns the file's name (an MMAP event). */
static loom_status jd_open(const char *dir, loom_ir_diag *d) {
    if (jd_fd >= 0)
        return LOOM_OK;
    snprintf(jd_path, sizeof jd_path, "%s/jit-%ld.dump", dir, (long)getpid());
    int fd = open(jd_path, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "jitdump: cannot open %s: %s", jd_path,
                                strerror(errno));
#if defined(__x86_64__)
    uint32_t mach = 62; /* EM_X86_64 */
#elif defined(__aarch64__)
    uint32_t mach = 183; /* EM_AARCH64 */
#else
    uint32_t mach = 0;
#endif
    jitdump_header h = {.magic = JITDUMP_MAGIC,
                        .version = 1,
                        .total_size = sizeof h,
                        .elf_mach = mach,
                        .pid = (uint32_t)getpid(),
                        .timestamp = mono_ns()};
    long page = sysconf(_SC_PAGESIZE);
    void *mark = MAP_FAILED;
    if (write_all(fd, &h, sizeof h))
        mark =
            mmap(NULL, (size_t)(page > 0 ? page : 4096), PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    if (mark == MAP_FAILED) {
        loom_status st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "jitdump: writing %s: %s",
                                          jd_path, strerror(errno));
        close(fd);
        return st;
    }
    jd_fd = fd; /* the mapping and the file stay until the process ends, as perf wants */
    return LOOM_OK;
}

typedef struct jd_ctx {
    bool ok;
    int err;
} jd_ctx;

static void jd_record(void *ud, const void *code, size_t bytes, const char *name) {
    jd_ctx *x = ud;
    size_t name_len = strlen(name) + 1;
    jitdump_load r = {.id = JITDUMP_CODE_LOAD,
                      .total_size = (uint32_t)(sizeof r + name_len + bytes),
                      .timestamp = mono_ns(),
                      .pid = (uint32_t)getpid(),
                      .tid = (uint32_t)gettid(),
                      .vma = (uint64_t)(uintptr_t)code,
                      .code_addr = (uint64_t)(uintptr_t)code,
                      .code_size = bytes,
                      .code_index = jd_index++};
    if (x->ok && !(write_all(jd_fd, &r, sizeof r) && write_all(jd_fd, name, name_len) &&
                   write_all(jd_fd, code, bytes))) {
        x->ok = false;
        x->err = errno;
    }
}

loom_status loom_rt_program_jitdump(loom_rt_executable *exe, const loom_ir_plan *plan,
                                    const loom_ir_graph *g, const char *dir, loom_ir_diag *d) {
    if (!exe || !dir)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "jitdump: bad arguments");
    pthread_mutex_lock(&jd_lock);
    loom_status st = jd_open(dir, d);
    jd_ctx x = {.ok = true};
    if (st == LOOM_OK && (st = loom_rt_program_each_code(exe, plan, g, jd_record, &x)) != LOOM_OK)
        loom_ir_diag_set(d, st, "jitdump: bad arguments");
    if (st == LOOM_OK && !x.ok)
        st = loom_ir_diag_set(d, LOOM_STATUS_IO_ERROR, "jitdump: writing %s: %s", jd_path,
                              strerror(x.err));
    pthread_mutex_unlock(&jd_lock);
    return st;
}
