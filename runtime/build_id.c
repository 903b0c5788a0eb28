/* The identity of the code that is running: the GNU build ID of the binary holding Loom
 * (the shared library, or a program linking the layers statically), for cache keys. Two
 * builds of different sources get different IDs, so compiled code cached by one build is
 * never handed to another, whose passes or codegen may differ (the version string alone
 * does not change between development builds). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr */
#endif
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "disk_cache.h"

typedef struct find_ctx {
    uintptr_t addr; /* an address inside the object we want */
    char *out;      /* hex digits */
    size_t cap;
} find_ctx;

/* Notes are 4-byte aligned name/desc pairs after a 12-byte header. */
static bool scan_notes(const uint8_t *p, size_t len, find_ctx *f) {
    size_t off = 0;
    while (off + sizeof(ElfW(Nhdr)) <= len) {
        const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)(const void *)(p + off);
        size_t name = off + sizeof *nh, desc = name + ((nh->n_namesz + 3u) & ~3u);
        size_t next = desc + ((nh->n_descsz + 3u) & ~3u);
        if (next > len)
            return false;
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(p + name, "GNU", 4) == 0) {
            size_t n = 0;
            for (uint32_t i = 0; i < nh->n_descsz && n + 3 <= f->cap; i++)
                n += (size_t)snprintf(f->out + n, f->cap - n, "%02x", p[desc + i]);
            return n > 0;
        }
        off = next;
    }
    return false;
}

static int visit(struct dl_phdr_info *info, size_t size, void *ud) {
    (void)size;
    find_ctx *f = ud;
    bool inside = false;
    for (int i = 0; i < info->dlpi_phnum && !inside; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        inside = ph->p_type == PT_LOAD && f->addr >= lo && f->addr < lo + ph->p_memsz;
    }
    if (!inside)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_NOTE &&
            scan_notes((const uint8_t *)(info->dlpi_addr + ph->p_vaddr), ph->p_memsz, f))
            return 1;
    }
    return 1; /* found the object, but it has no build ID */
}

const char *loom_rt_build_id(void) {
    static char id[2 * 64 + 1];
    static _Atomic int done;
    if (!done) { /* idempotent: racing threads compute the same string */
        char tmp[sizeof id] = "";
        find_ctx f = {.addr = (uintptr_t)&id, .out = tmp, .cap = sizeof tmp}; /* in our data */
        dl_iterate_phdr(visit, &f);
        memcpy(id, tmp[0] ? tmp : "none", tmp[0] ? sizeof id : 5);
        done = 1;
    }
    return id;
}
