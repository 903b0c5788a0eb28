/* The kernel profile (LOOM_PROFILE): per-kernel times kept across steps and programs, and
 * the report of kernels by total time. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

typedef struct loom_rt_profile_block {
    struct loom_rt_profile_block *next;
    int32_t n;
    loom_rt_profile_kernel k[];
} profile_block;

static size_t block_bytes(int32_t n) {
    return sizeof(profile_block) + (size_t)n * sizeof(loom_rt_profile_kernel);
}

void loom_rt_profile_init(loom_rt_profile *p, const loom_allocator *a) {
    memset(p, 0, sizeof *p);
    p->alloc = *a;
}

void loom_rt_profile_deinit(loom_rt_profile *p) {
    for (profile_block *b = p->blocks, *next; b; b = next) {
        next = b->next;
        loom_ir_free(&p->alloc, b, block_bytes(b->n));
    }
    p->blocks = NULL;
}

loom_rt_profile_kernel *loom_rt_profile_add(loom_rt_profile *p, int32_t n) {
    if (n < 1)
        return NULL;
    profile_block *b = loom_ir_alloc(&p->alloc, block_bytes(n));
    if (!b)
        return NULL;
    memset(b, 0, block_bytes(n));
    b->n = n;
    b->next = p->blocks;
    p->blocks = b;
    return b->k;
}

static int by_time(const void *x, const void *y) {
    const loom_rt_profile_kernel *a = *(const loom_rt_profile_kernel *const *)x;
    const loom_rt_profile_kernel *b = *(const loom_rt_profile_kernel *const *)y;
    if (a->total_ns != b->total_ns)
        return a->total_ns > b->total_ns ? -1 : 1;
    if (a->program != b->program)
        return a->program < b->program ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

void loom_rt_json_string(loom_ir_writer *w, const char *s) {
    loom_ir_writer_puts(w, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            loom_ir_writer_printf(w, "\\%c", c);
        else if (c < 0x20)
            loom_ir_writer_printf(w, "\\u%04x", c);
        else
            loom_ir_writer_put(w, s, 1);
    }
    loom_ir_writer_puts(w, "\"");
}

/* part / whole in percent, 0 for an empty whole. */
static double share(int64_t part, int64_t whole) {
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0;
}

/* Rate in units of 1e9 per second of `amount` done calls times over total_ns. */
static double giga_per_s(double amount, int64_t calls, int64_t total_ns) {
    return total_ns > 0 ? amount * (double)calls / (double)total_ns : 0;
}

loom_status loom_rt_profile_report(const loom_rt_profile *p, int64_t execute_ns, int32_t top,
                                   loom_report_format format, loom_ir_write_fn write, void *ud) {
    size_t n = 0;
    for (const profile_block *b = p->blocks; b; b = b->next)
        for (int32_t i = 0; i < b->n; i++)
            n += b->k[i].calls > 0;
    const loom_rt_profile_kernel **ks = NULL;
    if (n > 0 && !(ks = loom_ir_alloc(&p->alloc, n * sizeof *ks)))
        return LOOM_STATUS_OUT_OF_MEMORY;
    size_t at = 0;
    int64_t kernel_ns = 0, calls = 0, thread_ns = 0, idle_ns = 0;
    for (const profile_block *b = p->blocks; b; b = b->next)
        for (int32_t i = 0; i < b->n; i++)
            if (b->k[i].calls > 0) {
                ks[at++] = &b->k[i];
                kernel_ns += b->k[i].total_ns;
                calls += b->k[i].calls;
                thread_ns += b->k[i].thread_ns;
                idle_ns += b->k[i].idle_ns;
            }
    if (n > 1)
        qsort(ks, n, sizeof *ks, by_time);

    loom_ir_writer w = {.write = write, .ud = ud};
    if (format == LOOM_REPORT_FORMAT_JSON) {
        loom_ir_writer_printf(&w,
                              "{\"kernel_ns\":%" PRId64 ",\"execute_ns\":%" PRId64
                              ",\"calls\":%" PRId64 ",\"thread_ns\":%" PRId64
                              ",\"idle_ns\":%" PRId64 ",\"kernels\":[",
                              kernel_ns, execute_ns, calls, thread_ns, idle_ns);
        for (size_t i = 0; i < n; i++) {
            const loom_rt_profile_kernel *k = ks[i];
            loom_ir_writer_printf(&w, "%s{\"program\":\"%016" PRIx64 "\",\"index\":%d,\"kind\":",
                                  i ? "," : "", k->program, (int)k->index);
            loom_rt_json_string(&w, k->kind);
            loom_ir_writer_puts(&w, ",\"root\":");
            loom_rt_json_string(&w, k->root);
            loom_ir_writer_puts(&w, ",\"loc\":");
            loom_rt_json_string(&w, k->loc);
            loom_ir_writer_printf(
                &w,
                ",\"calls\":%" PRId64 ",\"total_ns\":%" PRId64 ",\"thread_ns\":%" PRId64
                ",\"idle_ns\":%" PRId64 ",\"flops\":%.0f,\"bytes\":%.0f}",
                k->calls, k->total_ns, k->thread_ns, k->idle_ns, k->flops, k->bytes);
        }
        loom_ir_writer_puts(&w, "]}\n");
        loom_ir_writer_flush(&w);
        loom_ir_free(&p->alloc, ks, n * sizeof *ks);
        return LOOM_OK;
    }

    size_t shown = top > 0 && (size_t)top < n ? (size_t)top : n;
    loom_ir_writer_printf(
        &w, "Loom kernel profile: %zu kernels ran, the %zu slowest by total time\n", n, shown);
    loom_ir_writer_puts(&w, "rank  total ms  kern%  calls   mean us  GFLOP/s    GB/s  idle%  "
                            "kind         program:kernel       root op                        "
                            "source\n");
    for (size_t i = 0; i < shown; i++) {
        const loom_rt_profile_kernel *k = ks[i];
        loom_ir_writer_printf(&w, "%4zu %9.3f %6.1f %6" PRId64 " %9.1f %8.2f %7.2f %6.1f  %-12s ",
                              i + 1, (double)k->total_ns / 1e6, share(k->total_ns, kernel_ns),
                              k->calls, (double)k->total_ns / 1e3 / (double)k->calls,
                              giga_per_s(k->flops, k->calls, k->total_ns),
                              giga_per_s(k->bytes, k->calls, k->total_ns),
                              share(k->idle_ns, k->thread_ns), k->kind);
        loom_ir_writer_printf(&w, "%016" PRIx64 ":%-3d ", k->program, (int)k->index);
        loom_ir_writer_printf(&w, "%-30s ", k->root);
        loom_ir_writer_puts(&w, *k->loc ? k->loc : "?");
        loom_ir_writer_puts(&w, "\n");
    }
    loom_ir_writer_printf(&w,
                          "total: %.3f ms in %" PRId64 " kernel calls; ExecuteTime %.3f ms "
                          "(kernels %.1f%% of it); threads idle %.1f%% of the kernels' thread "
                          "time\n",
                          (double)kernel_ns / 1e6, calls, (double)execute_ns / 1e6,
                          share(kernel_ns, execute_ns), share(idle_ns, thread_ns));
    loom_ir_writer_flush(&w);
    loom_ir_free(&p->alloc, ks, n * sizeof *ks);
    return LOOM_OK;
}
