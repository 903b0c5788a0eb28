/* Devices: the vtable dispatch and the built-in NPU target, whose memory pool lives in host
 * memory (from the context's allocator) and counts current and peak bytes. */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "target.h"
#include "trace.h"

/* ---- the NPU target ---------------------------------------------------------------------- */

/* Round to 64 bytes: kernels may read whole cache lines; never zero-sized. */
static size_t block_bytes(size_t size) {
    size_t bytes = (size + 63) & ~(size_t)63;
    return bytes ? bytes : 64;
}

/* A buffer's data starts at a cache line, fewer than LINE_PAD bytes into a block of
 * block_bytes + LINE_PAD: the system allocator's large blocks (the step's arena) start 16
 * bytes into a page, and every tensor placed there (at 64-byte offsets) then made each
 * 64-byte vector load and store straddle two lines. Line-aligned, ResNet-50's step spent 0-3%
 * less time in its kernels in bf16 (three rounds) and 5% in f32 (one; measured in e1ffd02).
 * Memory counts block_bytes. */
enum { LINE_PAD = 64 };

static void *line_start(void *block) {
    return (void *)(((uintptr_t)block + LINE_PAD - 1) & ~(uintptr_t)(LINE_PAD - 1));
}

static void *new_block(loom_rt_device *dev, size_t bytes) {
    return loom_ir_alloc(&dev->alloc, bytes + LINE_PAD);
}

static void free_block(loom_rt_device *dev, void *block, size_t bytes) {
    loom_ir_free(&dev->alloc, block, bytes + LINE_PAD);
}

/* A cached block of exactly `bytes`, or NULL. Most recently freed first. */
static void *take_cached(loom_rt_device *dev, size_t bytes) {
    for (int32_t i = dev->n_cached - 1; i >= 0; i--) {
        if (dev->cached[i].bytes != bytes)
            continue;
        void *p = dev->cached[i].block;
        dev->cached[i] = dev->cached[--dev->n_cached];
        dev->cached_bytes -= bytes;
        return p;
    }
    return NULL;
}

static void drop_cache(loom_rt_device *dev) {
    for (int32_t i = 0; i < dev->n_cached; i++)
        free_block(dev, dev->cached[i].block, dev->cached[i].bytes);
    dev->n_cached = 0;
    dev->cached_bytes = 0;
}

static loom_status npu_buffer_alloc(loom_rt_device *dev, size_t size, loom_rt_buffer **out) {
    if (size > SIZE_MAX - 2 * LINE_PAD) /* its rounded and padded size would wrap */
        return LOOM_STATUS_OUT_OF_MEMORY;
    loom_rt_buffer *b = loom_ir_alloc(&dev->alloc, sizeof *b);
    if (!b)
        return LOOM_STATUS_OUT_OF_MEMORY;
    size_t bytes = block_bytes(size);
    if (dev->mem_limit && (bytes > dev->mem_limit || dev->mem_current > dev->mem_limit - bytes)) {
        loom_ir_free(&dev->alloc, b, sizeof *b); /* the cap (LOOM_DEVICE_MEMORY_MB) */
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    b->block = dev->poison ? NULL : take_cached(dev, bytes);
    if (!b->block)
        b->block = new_block(dev, bytes);
    if (!b->block && dev->n_cached > 0) { /* memory is short: give the cache back, retry */
        drop_cache(dev);
        b->block = new_block(dev, bytes);
    }
    if (!b->block) {
        loom_ir_free(&dev->alloc, b, sizeof *b);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    if (dev->poison)
        memset(b->block, 0xff, bytes + LINE_PAD);
    b->data = line_start(b->block);
    b->device = dev;
    b->size = size;
    b->refs = 1;
    dev->mem_current += bytes;
    if (dev->mem_current > dev->mem_peak)
        dev->mem_peak = dev->mem_current;
    *out = b;
    return LOOM_OK;
}

static void npu_buffer_free(loom_rt_device *dev, loom_rt_buffer *b) {
    size_t bytes = block_bytes(b->size);
    dev->mem_current -= bytes;
    if (dev->poison) { /* a read after free sees NaN; the oldest held block goes back */
        memset(b->block, 0xff, bytes + LINE_PAD);
        if (dev->n_cached == LOOM_RT_DEVICE_CACHED_BLOCKS) {
            free_block(dev, dev->cached[0].block, dev->cached[0].bytes);
            dev->cached_bytes -= dev->cached[0].bytes;
            memmove(dev->cached, dev->cached + 1, (size_t)--dev->n_cached * sizeof *dev->cached);
        }
    }
    if (dev->n_cached == LOOM_RT_DEVICE_CACHED_BLOCKS ||
        dev->cached_bytes + bytes > LOOM_RT_DEVICE_CACHED_BYTES) {
        free_block(dev, b->block, bytes);
    } else {
        dev->cached[dev->n_cached++] = (struct loom_rt_cached_block){b->block, bytes};
        dev->cached_bytes += bytes;
    }
    loom_ir_free(&dev->alloc, b, sizeof *b);
}

static loom_status npu_write(loom_rt_device *dev, loom_rt_buffer *b, size_t off, const void *src,
                             size_t size) {
    (void)dev;
    if (off > b->size || size > b->size - off)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (size)
        memcpy((char *)b->data + off, src, size);
    return LOOM_OK;
}

static loom_status npu_read(loom_rt_device *dev, const loom_rt_buffer *b, size_t off, void *dst,
                            size_t size) {
    (void)dev;
    if (off > b->size || size > b->size - off)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (size)
        memcpy(dst, (const char *)b->data + off, size);
    return LOOM_OK;
}

static void npu_destroy(loom_rt_device *dev) {
    drop_cache(dev);
    loom_ir_free(&dev->alloc, dev, sizeof *dev);
}

static const loom_rt_device_vtable npu_vtable = {
    .buffer_alloc = npu_buffer_alloc,
    .buffer_free = npu_buffer_free,
    .write = npu_write,
    .read = npu_read,
    .destroy = npu_destroy,
};

/* ---- dispatch ---------------------------------------------------------------------------- */

loom_status loom_rt_device_create(const char *name, const loom_allocator *a,
                                  loom_rt_metrics *metrics, loom_rt_device **out_dev,
                                  loom_ir_diag *d) {
    if (!name)
        name = "npu:0";
    /* "<target>" or "<target>:N": npu, or a target registered from above (target.h) */
    size_t base = strcspn(name, ":");
    char tname[16];
    snprintf(tname, sizeof tname, "%.*s", (int)(base < sizeof tname ? base : sizeof tname - 1),
             name);
    const loom_rt_target *target = loom_rt_target_find(tname);
    if (base >= sizeof tname || (strcmp(tname, "npu") != 0 && !target))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "unknown device '%s' (expected \"npu\" or \"npu:N\", or a "
                                "registered target's name)",
                                name);
    long index = 0;
    if (name[base] == ':') {
        char *end = NULL;
        if (name[base + 1] < '0' || name[base + 1] > '9')
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "unknown device '%s' (expected \"npu\" or \"npu:N\")", name);
        index = strtol(name + base + 1, &end, 10);
        if (*end != '\0' || index > 1023)
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "bad device index in '%s' (expected %s:0..%s:1023)", name,
                                    tname, tname);
    }
    loom_rt_device *dev = loom_ir_alloc(a, sizeof *dev);
    if (!dev)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory creating %s", name);
    memset(dev, 0, sizeof *dev);
    dev->vt = &npu_vtable;
    dev->target = target; /* NULL where no target registered (runtime's own tests) */
    dev->alloc = *a;
    dev->metrics = metrics;
    dev->index = (int32_t)index;
    snprintf(dev->name, sizeof dev->name, "%s:%d", tname, (int)index);
    *out_dev = dev;
    return LOOM_OK;
}

void loom_rt_device_destroy(loom_rt_device *dev) {
    if (dev)
        dev->vt->destroy(dev);
}

loom_status loom_rt_buffer_alloc(loom_rt_device *dev, size_t size, loom_rt_buffer **out_buf) {
    return dev->vt->buffer_alloc(dev, size, out_buf);
}

char *loom_rt_device_cap_note(const loom_rt_device *dev, char *buf, size_t size) {
    if (size == 0)
        return buf;
    buf[0] = '\0';
    if (dev && dev->mem_limit)
        snprintf(buf, size,
                 "; the device is capped at %.6g MB (device_memory_mb, LOOM_DEVICE_MEMORY_MB) and "
                 "holds %.6g MB",
                 (double)dev->mem_limit / (1 << 20), (double)dev->mem_current / (1 << 20));
    return buf;
}

void loom_rt_buffer_retain(loom_rt_buffer *buf) {
    if (buf)
        buf->refs++;
}

void loom_rt_buffer_release(loom_rt_buffer *buf) {
    if (buf && --buf->refs == 0)
        buf->device->vt->buffer_free(buf->device, buf);
}

/* A transfer that began at t0: its bytes and time in the metrics, an event in the trace. */
static void count_transfer(loom_rt_device *dev, loom_rt_metric bytes, loom_rt_metric time,
                           const char *what, size_t size, int64_t t0) {
    int64_t t1 = loom_rt_now_ns();
    if (dev->metrics) {
        loom_rt_metrics_add(dev->metrics, bytes, (int64_t)size);
        loom_rt_metrics_add(dev->metrics, time, t1 - t0);
    }
    if (dev->trace) {
        char args[48];
        snprintf(args, sizeof args, "\"bytes\":%zu", size);
        loom_rt_trace_event(dev->trace, "transfer", what, t0, t1, args);
    }
}

loom_status loom_rt_buffer_write(loom_rt_buffer *buf, const void *src, size_t size) {
    loom_rt_device *dev = buf->device;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = dev->vt->write(dev, buf, 0, src, size);
    if (st == LOOM_OK)
        count_transfer(dev, LOOM_RT_METRIC_TRANSFER_TO_DEVICE,
                       LOOM_RT_METRIC_TRANSFER_TO_DEVICE_TIME, "to device", size, t0);
    return st;
}

loom_status loom_rt_buffer_read(const loom_rt_buffer *buf, void *dst, size_t size) {
    loom_rt_device *dev = buf->device;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = dev->vt->read(dev, buf, 0, dst, size);
    if (st == LOOM_OK)
        count_transfer(dev, LOOM_RT_METRIC_TRANSFER_FROM_DEVICE,
                       LOOM_RT_METRIC_TRANSFER_FROM_DEVICE_TIME, "from device", size, t0);
    return st;
}
