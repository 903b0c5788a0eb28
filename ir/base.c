/* IR support: allocator helpers, arena, string buffer, diagnostics and status names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static const char *const status_names[] = {
#define LOOM_STATUS(e, v, d) [v] = #e,
#include "loom/status.def"
#undef LOOM_STATUS
};
static const char *const status_descs[] = {
#define LOOM_STATUS(e, v, d) [v] = d,
#include "loom/status.def"
#undef LOOM_STATUS
};
_Static_assert(sizeof status_names / sizeof status_names[0] == LOOM_STATUS_COUNT_,
               "status.def values must be dense");

LOOM_API const char *loom_status_name(loom_status s) {
    return (unsigned)s < LOOM_STATUS_COUNT_ ? status_names[s] : "UNKNOWN";
}

LOOM_API const char *loom_status_description(loom_status s) {
    return (unsigned)s < LOOM_STATUS_COUNT_ ? status_descs[s] : "unknown status code";
}

static void *system_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

LOOM_API loom_allocator loom_allocator_system(void) {
    return (loom_allocator){.fn = system_alloc, .ud = NULL};
}

void *loom_ir_alloc(const loom_allocator *a, size_t size) {
    return size ? a->fn(a->ud, NULL, 0, size) : NULL;
}

void *loom_ir_realloc(const loom_allocator *a, void *p, size_t old_size, size_t new_size) {
    return a->fn(a->ud, p, old_size, new_size);
}

void loom_ir_free(const loom_allocator *a, void *p, size_t size) {
    if (p)
        a->fn(a->ud, p, size, 0);
}

bool loom_ir_grow(const loom_allocator *a, void **array, int32_t *cap, int32_t need,
                  size_t elem_size) {
    if (need <= *cap)
        return true;
    int64_t ncap = *cap ? *cap : 8;
    while (ncap < need)
        ncap *= 2;
    if (ncap > INT32_MAX)
        return false;
    void *p = loom_ir_realloc(a, *array, (size_t)*cap * elem_size, (size_t)ncap * elem_size);
    if (!p)
        return false;
    *array = p;
    *cap = (int32_t)ncap;
    return true;
}

/* ---- arena ------------------------------------------------------------------------------- */

struct loom_ir_arena_chunk {
    loom_ir_arena_chunk *next;
    size_t size; /* usable bytes after the header */
    _Alignas(16) unsigned char data[];
};

enum { ARENA_CHUNK = 16 * 1024 };

void loom_ir_arena_init(loom_ir_arena *ar, const loom_allocator *a) {
    ar->alloc = *a;
    ar->head = NULL;
    ar->used = 0;
}

void loom_ir_arena_deinit(loom_ir_arena *ar) {
    loom_ir_arena_chunk *c = ar->head;
    while (c) {
        loom_ir_arena_chunk *next = c->next;
        loom_ir_free(&ar->alloc, c, sizeof *c + c->size);
        c = next;
    }
    ar->head = NULL;
    ar->used = 0;
}

void loom_ir_arena_reset(loom_ir_arena *ar) {
    if (!ar->head)
        return;
    /* Keep the oldest chunk (the last in the list): steady-state steps then allocate
     * nothing once it has grown to fit. Free the others. */
    loom_ir_arena_chunk *c = ar->head;
    while (c->next) {
        loom_ir_arena_chunk *next = c->next;
        loom_ir_free(&ar->alloc, c, sizeof *c + c->size);
        c = next;
    }
    ar->head = c;
    ar->used = 0;
}

void *loom_ir_arena_alloc(loom_ir_arena *ar, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0)
        size = 16;
    if (!ar->head || ar->used + size > ar->head->size) {
        size_t csize = ARENA_CHUNK;
        if (ar->head && ar->head->size * 2 > csize)
            csize = ar->head->size * 2 > (1u << 24) ? (1u << 24) : ar->head->size * 2;
        if (csize < size)
            csize = size;
        loom_ir_arena_chunk *c = loom_ir_alloc(&ar->alloc, sizeof *c + csize);
        if (!c)
            return NULL;
        c->size = csize;
        c->next = ar->head;
        ar->head = c;
        ar->used = 0;
    }
    void *p = ar->head->data + ar->used;
    ar->used += size;
    return p;
}

char *loom_ir_arena_strndup(loom_ir_arena *ar, const char *s, size_t len) {
    char *p = loom_ir_arena_alloc(ar, len + 1);
    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

/* ---- string buffer ----------------------------------------------------------------------- */

void loom_ir_sbuf_init(loom_ir_sbuf *sb, const loom_allocator *a) {
    *sb = (loom_ir_sbuf){.alloc = a};
}

void loom_ir_sbuf_deinit(loom_ir_sbuf *sb) {
    loom_ir_free(sb->alloc, sb->data, sb->cap);
    sb->data = NULL;
    sb->len = sb->cap = 0;
}

void loom_ir_sbuf_append(loom_ir_sbuf *sb, const char *s, size_t len) {
    if (sb->oom)
        return;
    if (sb->len + len + 1 > sb->cap) {
        size_t ncap = sb->cap ? sb->cap : 256;
        while (ncap < sb->len + len + 1)
            ncap *= 2;
        char *p = loom_ir_realloc(sb->alloc, sb->data, sb->cap, ncap);
        if (!p) {
            sb->oom = true;
            return;
        }
        sb->data = p;
        sb->cap = ncap;
    }
    memcpy(sb->data + sb->len, s, len);
    sb->len += len;
    sb->data[sb->len] = '\0';
}

void loom_ir_sbuf_printf(loom_ir_sbuf *sb, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        loom_ir_sbuf_append(sb, small, (size_t)n);
        return;
    }
    char *big = loom_ir_alloc(sb->alloc, (size_t)n + 1);
    if (!big) {
        sb->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    loom_ir_sbuf_append(sb, big, (size_t)n);
    loom_ir_free(sb->alloc, big, (size_t)n + 1);
}

void loom_ir_sbuf_write(const char *chunk, size_t len, void *ud) {
    loom_ir_sbuf_append(ud, chunk, len);
}

void loom_ir_fixed_buf_write(const char *chunk, size_t len, void *ud) {
    loom_ir_fixed_buf *f = ud;
    size_t drop = len < f->skip ? len : f->skip;
    chunk += drop;
    len -= drop;
    f->skip -= drop;
    size_t room = f->size - 1 - f->len;
    if (len > room)
        len = room;
    memcpy(f->buf + f->len, chunk, len);
    f->len += len;
    f->buf[f->len] = '\0';
}

/* ---- chunked writer ---------------------------------------------------------------------- */

void loom_ir_writer_flush(loom_ir_writer *w) {
    if (w->len > 0)
        w->write(w->buf, w->len, w->ud);
    w->len = 0;
}

void loom_ir_writer_put(loom_ir_writer *w, const char *s, size_t len) {
    while (len > 0) {
        if (w->len == sizeof w->buf)
            loom_ir_writer_flush(w);
        size_t n = sizeof w->buf - w->len;
        if (n > len)
            n = len;
        memcpy(w->buf + w->len, s, n);
        w->len += n;
        s += n;
        len -= n;
    }
}

void loom_ir_writer_puts(loom_ir_writer *w, const char *s) { loom_ir_writer_put(w, s, strlen(s)); }

void loom_ir_writer_printf(loom_ir_writer *w, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        loom_ir_writer_put(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- diagnostics ------------------------------------------------------------------------- */

void loom_ir_diag_init(loom_ir_diag *d) {
    d->code = LOOM_OK;
    d->line = d->col = 0;
    d->node = -1;
    d->msg[0] = '\0';
}

loom_status loom_ir_diag_vset(loom_ir_diag *d, loom_status code, const char *fmt, va_list ap) {
    if (d && d->code == LOOM_OK) {
        d->code = code;
        vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    }
    return code;
}

loom_status loom_ir_diag_set(loom_ir_diag *d, loom_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    loom_ir_diag_vset(d, code, fmt, ap);
    va_end(ap);
    return code;
}

int64_t loom_ir_numel(int32_t rank, const int64_t *shape) {
    int64_t n = 1;
    for (int32_t i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

int64_t loom_ir_broadcast_strides(int32_t rank, const int64_t *shape, int32_t r, int64_t *stride) {
    int64_t st = 1;
    for (int32_t i = 0; i < r - rank; i++)
        stride[i] = 0;
    for (int32_t i = rank - 1; i >= 0; i--) {
        stride[r - rank + i] = shape[i] == 1 ? 0 : st;
        st *= shape[i];
    }
    return st;
}

int loom_ir_cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
