/* The ORC JIT holding a plan's compiled kernels: one LLJIT per code object, fed with the
 * object files the compile threads emitted (or a cache blob's), its kernels looked up by
 * name; the self-describing blob for the disk cache (the host target: host_target.c). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Object.h>
#include <llvm-c/Orc.h>

#include "cg_internal.h"
#include "runtime/disk_cache.h"

struct loom_cg_code {
    loom_allocator alloc;
    LLVMOrcLLJITRef jit;
    int32_t n_objs, n_kernels;
    uint8_t **objs; /* kept for serialization */
    size_t *obj_lens;
    cg_kernel_rec *recs;
    char refused[128]; /* the first symbol a kernel named outside the allow-list */
};

/* ---- code objects ------------------------------------------------------------------------- */

static loom_status llvm_err(loom_ir_diag *d, loom_status code, const char *what, LLVMErrorRef err) {
    char *msg = LLVMGetErrorMessage(err);
    loom_status st = loom_ir_diag_set(d, code, "codegen: %s: %s", what, msg ? msg : "?");
    LLVMDisposeErrorMessage(msg);
    return st;
}

/* Link errors would otherwise be printed to stderr by ORC; they come back from lookups. */
static void swallow_error(void *ctx, LLVMErrorRef err) {
    (void)ctx;
    LLVMConsumeError(err);
}

void loom_cg_code_destroy(loom_cg_code *code) {
    if (!code)
        return;
    if (code->jit) {
        LLVMErrorRef err = LLVMOrcDisposeLLJIT(code->jit);
        if (err)
            LLVMConsumeError(err);
    }
    for (int32_t i = 0; i < code->n_objs; i++)
        if (code->objs && code->objs[i])
            loom_ir_free(&code->alloc, code->objs[i], code->obj_lens[i] ? code->obj_lens[i] : 1);
    loom_ir_free(&code->alloc, code->objs, (size_t)code->n_objs * sizeof(uint8_t *));
    loom_ir_free(&code->alloc, code->obj_lens, (size_t)code->n_objs * sizeof(size_t));
    loom_ir_free(&code->alloc, code->recs, (size_t)code->n_kernels * sizeof(cg_kernel_rec));
    loom_allocator a = code->alloc;
    loom_ir_free(&a, code, sizeof *code);
}

void loom_cg_code_release(void *code) {
    loom_cg_code_destroy(code);
}

/* The only symbols compiled kernels may link against: what codegen's lowering calls (scratch
 * for the matmul microkernels; libm where a kernel keeps an f64 or scalar function) and what
 * LLVM may emit calls to for the code it is given (memory intrinsics, half and bfloat16
 * conversions on CPUs without the instructions). Object code, from the disk cache above all,
 * is linked against this list and nothing else: a kernel that names another symbol (system,
 * dlopen, anything of the process) fails to link instead of reaching it. */
static const char *const kernel_symbols[] = {
    "malloc",       "free",         "memcpy",     "memmove",       "memset",       "exp",
    "expf",         "exp2",         "exp2f",      "expm1",         "expm1f",       "log",
    "logf",         "log2",         "log2f",      "log1p",         "log1pf",       "pow",
    "powf",         "sqrt",         "sqrtf",      "tanh",          "tanhf",        "erf",
    "erff",         "fmod",         "fmodf",      "floor",         "floorf",       "ceil",
    "ceilf",        "trunc",        "truncf",     "round",         "roundf",       "rint",
    "rintf",        "nearbyint",    "nearbyintf", "fmin",          "fminf",        "fmax",
    "fmaxf",        "fma",          "fmaf",       "__extendhfsf2", "__truncsfhf2", "__truncdfhf2",
    "__truncsfbf2", "__truncdfbf2",
};

static LLVMErrorRef resolve_allowed(LLVMOrcDefinitionGeneratorRef gen, void *ctx,
                                    LLVMOrcLookupStateRef *state, LLVMOrcLookupKind kind,
                                    LLVMOrcJITDylibRef jd, LLVMOrcJITDylibLookupFlags flags,
                                    LLVMOrcCLookupSet set, size_t n) {
    loom_cg_code *code = ctx;
    (void)gen;
    (void)state;
    (void)kind;
    (void)flags;
    for (size_t i = 0; i < n; i++) {
        const char *name = LLVMOrcSymbolStringPoolEntryStr(set[i].Name);
        void *addr = NULL;
        for (size_t k = 0; !addr && k < sizeof kernel_symbols / sizeof *kernel_symbols; k++)
            if (strcmp(name, kernel_symbols[k]) == 0)
                addr = dlsym(RTLD_DEFAULT, name);
        if (!addr) { /* left undefined: the lookup fails */
            if (!code->refused[0])
                snprintf(code->refused, sizeof code->refused, "%s", name);
            continue;
        }
        LLVMOrcRetainSymbolStringPoolEntry(set[i].Name);
        LLVMOrcCSymbolMapPair pair = {
            set[i].Name,
            {(LLVMOrcExecutorAddress)(uintptr_t)addr,
             {LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable, 0}}};
        LLVMErrorRef e = LLVMOrcJITDylibDefine(jd, LLVMOrcAbsoluteSymbols(&pair, 1));
        if (e)
            return e;
    }
    return NULL;
}

/* A lookup's result, handed over by ORC's callback (on this thread or another). */
typedef struct lookup_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    LLVMErrorRef err;
    LLVMOrcCSymbolMapPairs pairs;
    size_t n;
} lookup_wait;

static void lookup_done(LLVMErrorRef err, LLVMOrcCSymbolMapPairs result, size_t n, void *ctx) {
    lookup_wait *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->err = err;
    if (!err && n > 0 && (w->pairs = malloc(n * sizeof *result)) != NULL) {
        memcpy(w->pairs, result, n * sizeof *result);
        for (size_t i = 0; i < n; i++) /* the result's names are ORC's: keep ours alive */
            LLVMOrcRetainSymbolStringPoolEntry(w->pairs[i].Name);
        w->n = n;
    }
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* The kernels' addresses, looked up in jd alone (its objects and the allow-list). */
static loom_status look_up_kernels(loom_cg_code *code, LLVMOrcJITDylibRef jd, int32_t n_kernels,
                                   loom_rt_kernel *out_kernels, loom_status bad_object_status,
                                   loom_ir_diag *d) {
    size_t n = 0;
    LLVMOrcCLookupSetElement *set = malloc((size_t)(n_kernels > 0 ? n_kernels : 1) * sizeof *set);
    if (!set)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory linking");
    for (int32_t k = 0; k < n_kernels; k++) {
        out_kernels[k] = (loom_rt_kernel){.extent = 1, .grain = 1};
        if (!code->recs[k].name[0]) /* no code: the runtime runs this kernel itself */
            continue;
        bool seen = false; /* kernels sharing code share a name: each once in the set */
        for (int32_t j = 0; j < k && !seen; j++)
            seen = strcmp(code->recs[j].name, code->recs[k].name) == 0;
        if (!seen)
            set[n++] = (LLVMOrcCLookupSetElement){
                LLVMOrcLLJITMangleAndIntern(code->jit, code->recs[k].name),
                LLVMOrcSymbolLookupFlagsRequiredSymbol};
    }
    loom_status st = LOOM_OK;
    if (n > 0) {
        lookup_wait w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        LLVMOrcCJITDylibSearchOrderElement order[1] = {
            {jd, LLVMOrcJITDylibLookupFlagsMatchExportedSymbolsOnly}};
        LLVMOrcExecutionSessionLookup(LLVMOrcLLJITGetExecutionSession(code->jit),
                                      LLVMOrcLookupKindStatic, order, 1, set, n, lookup_done, &w);
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        if (w.err && code->refused[0]) {
            LLVMConsumeError(w.err);
            st = loom_ir_diag_set(d, bad_object_status,
                                  "codegen: linking compiled kernels: they call '%s', which "
                                  "is not among the symbols kernels may use (codegen/jit.c)",
                                  code->refused);
        } else if (w.err) {
            st = llvm_err(d, bad_object_status, "linking compiled kernels", w.err);
        }
        for (int32_t k = 0; k < n_kernels && st == LOOM_OK; k++) {
            if (!code->recs[k].name[0])
                continue;
            LLVMOrcExecutorAddress addr = 0;
            LLVMOrcSymbolStringPoolEntryRef want =
                LLVMOrcLLJITMangleAndIntern(code->jit, code->recs[k].name);
            for (size_t i = 0; i < w.n && !addr; i++)
                if (w.pairs[i].Name == want)
                    addr = w.pairs[i].Sym.Address;
            LLVMOrcReleaseSymbolStringPoolEntry(want);
            if (!addr)
                st = loom_ir_diag_set(d, bad_object_status, "codegen: kernel %s has no address",
                                      code->recs[k].name);
            else
                out_kernels[k] = (loom_rt_kernel){.fn = (loom_rt_kernel_fn)(uintptr_t)addr,
                                                  .extent = code->recs[k].extent,
                                                  .grain = code->recs[k].grain};
        }
        for (size_t i = 0; i < w.n; i++)
            LLVMOrcReleaseSymbolStringPoolEntry(w.pairs[i].Name);
        free(w.pairs);
    }
    free(set); /* the lookup took its names' references */
    return st;
}

loom_status loom_cg_code_build(const loom_allocator *a, int32_t n_objs, const uint8_t *const *objs,
                               const size_t *obj_lens, int32_t n_kernels, const cg_kernel_rec *recs,
                               loom_cg_code **out_code, loom_rt_kernel *out_kernels,
                               loom_status bad_object_status, loom_ir_diag *d) {
    loom_cg_init_once();
    *out_code = NULL;
    loom_cg_code *code = loom_ir_alloc(a, sizeof *code);
    if (!code)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    memset(code, 0, sizeof *code);
    code->alloc = *a;
    loom_status st = LOOM_OK;
    if (n_objs > 0) {
        code->objs = loom_ir_alloc(a, (size_t)n_objs * sizeof(uint8_t *));
        code->obj_lens = loom_ir_alloc(a, (size_t)n_objs * sizeof(size_t));
        if (code->objs && code->obj_lens) {
            code->n_objs = n_objs;
            memset(code->objs, 0, (size_t)n_objs * sizeof(uint8_t *));
            memset(code->obj_lens, 0, (size_t)n_objs * sizeof(size_t));
        } else {
            loom_ir_free(a, code->objs, (size_t)n_objs * sizeof(uint8_t *));
            loom_ir_free(a, code->obj_lens, (size_t)n_objs * sizeof(size_t));
            code->objs = NULL;
            code->obj_lens = NULL;
            st = LOOM_STATUS_OUT_OF_MEMORY;
        }
    }
    for (int32_t i = 0; i < code->n_objs && st == LOOM_OK; i++) {
        code->objs[i] = loom_ir_alloc(a, obj_lens[i] ? obj_lens[i] : 1);
        if (!code->objs[i])
            st = LOOM_STATUS_OUT_OF_MEMORY;
        else {
            memcpy(code->objs[i], objs[i], obj_lens[i]);
            code->obj_lens[i] = obj_lens[i];
        }
    }
    if (st == LOOM_OK && n_kernels > 0) {
        code->recs = loom_ir_alloc(a, (size_t)n_kernels * sizeof(cg_kernel_rec));
        if (!code->recs)
            st = LOOM_STATUS_OUT_OF_MEMORY;
        else {
            memcpy(code->recs, recs, (size_t)n_kernels * sizeof(cg_kernel_rec));
            code->n_kernels = n_kernels;
        }
    }
    if (st != LOOM_OK) {
        loom_cg_code_destroy(code);
        return loom_ir_diag_set(d, st, "codegen: out of memory keeping the kernels' code");
    }

    LLVMOrcJITDylibRef jd = NULL;
    LLVMErrorRef err = LLVMOrcCreateLLJIT(&code->jit, LLVMOrcCreateLLJITBuilder());
    if (err) {
        code->jit = NULL;
        st = llvm_err(d, LOOM_STATUS_INTERNAL, "creating the JIT", err);
    }
    if (st == LOOM_OK) {
        LLVMOrcExecutionSessionSetErrorReporter(LLVMOrcLLJITGetExecutionSession(code->jit),
                                                swallow_error, NULL);
        /* Not the main JITDylib, which LLJIT links against every symbol of the process: a
         * bare one whose only other symbols are the allow-list's. */
        jd = LLVMOrcExecutionSessionCreateBareJITDylib(LLVMOrcLLJITGetExecutionSession(code->jit),
                                                       "loom-kernels");
        LLVMOrcJITDylibAddGenerator(
            jd, LLVMOrcCreateCustomCAPIDefinitionGenerator(resolve_allowed, code, NULL));
        for (int32_t i = 0; i < code->n_objs && st == LOOM_OK; i++) {
            LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(
                (const char *)code->objs[i], code->obj_lens[i], "loom-kernels");
            err = LLVMOrcLLJITAddObjectFile(code->jit, jd, mb);
            if (err)
                st = llvm_err(d, bad_object_status, "loading compiled kernels", err);
        }
    }
    if (st == LOOM_OK)
        st = look_up_kernels(code, jd, n_kernels, out_kernels, bad_object_status, d);
    if (st != LOOM_OK) {
        loom_cg_code_destroy(code);
        return st;
    }
    *out_code = code;
    return LOOM_OK;
}

void loom_cg_code_sizes(const loom_cg_code *code, int32_t n_kernels, loom_rt_kernel *kernels) {
    if (!code || !kernels)
        return;
    n_kernels = n_kernels < code->n_kernels ? n_kernels : code->n_kernels;
    for (int32_t i = 0; i < code->n_objs; i++) {
        LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRange(
            (const char *)code->objs[i], code->obj_lens[i], "loom-kernels", 0);
        char *msg = NULL;
        LLVMBinaryRef bin = mb ? LLVMCreateBinary(mb, NULL, &msg) : NULL;
        LLVMDisposeMessage(msg);
        LLVMSymbolIteratorRef it = bin ? LLVMObjectFileCopySymbolIterator(bin) : NULL;
        for (; it && !LLVMObjectFileIsSymbolIteratorAtEnd(bin, it); LLVMMoveToNextSymbol(it)) {
            const char *name = LLVMGetSymbolName(it);
            uint64_t size = LLVMGetSymbolSize(it);
            for (int32_t k = 0; name && size && k < n_kernels; k++)
                if (code->recs[k].name[0] && strcmp(code->recs[k].name, name) == 0)
                    kernels[k].code_bytes = (int64_t)size;
        }
        if (it)
            LLVMDisposeSymbolIterator(it);
        if (bin)
            LLVMDisposeBinary(bin);
        if (mb)
            LLVMDisposeMemoryBuffer(mb);
    }
}

/* ---- the cache blob ------------------------------------------------------------------------
 *   "LOOMCGB\0"  u32 format version  u32 key length  u32 kernels  u32 objects
 *   key bytes (loom_cg_target_key())
 *   per kernel: u32 name length, name, i64 extent, i64 grain
 *   per object: u64 length, bytes
 *   u64 checksum of everything before it
 * Integers little-endian. The checksum covers the machine code too: a flipped byte there
 * would otherwise load and then crash. */

static const char blob_magic[8] = {'L', 'O', 'O', 'M', 'C', 'G', 'B', '\0'};

static uint64_t checksum(const uint8_t *p, size_t n) {
    return loom_rt_hash64(p, n);
}

static void put_u32(loom_ir_sbuf *sb, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    loom_ir_sbuf_append(sb, (const char *)b, 4);
}

static void put_u64(loom_ir_sbuf *sb, uint64_t v) {
    put_u32(sb, (uint32_t)v);
    put_u32(sb, (uint32_t)(v >> 32));
}

loom_status loom_cg_code_serialize(const loom_cg_code *code, loom_ir_sbuf *out, loom_ir_diag *d) {
    if (!code || !out)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "codegen: %s is NULL",
                                !code ? "the code" : "the output");
    size_t start = out->len;
    const char *key = loom_cg_target_key();
    loom_ir_sbuf_append(out, blob_magic, sizeof blob_magic);
    put_u32(out, LOOM_CG_FORMAT_VERSION);
    put_u32(out, (uint32_t)strlen(key));
    put_u32(out, (uint32_t)code->n_kernels);
    put_u32(out, (uint32_t)code->n_objs);
    loom_ir_sbuf_append(out, key, strlen(key));
    for (int32_t k = 0; k < code->n_kernels; k++) {
        const cg_kernel_rec *r = &code->recs[k];
        put_u32(out, (uint32_t)strlen(r->name));
        loom_ir_sbuf_append(out, r->name, strlen(r->name));
        put_u64(out, (uint64_t)r->extent);
        put_u64(out, (uint64_t)r->grain);
    }
    for (int32_t i = 0; i < code->n_objs; i++) {
        put_u64(out, code->obj_lens[i]);
        loom_ir_sbuf_append(out, (const char *)code->objs[i], code->obj_lens[i]);
    }
    if (out->oom)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory serializing");
    put_u64(out, checksum((const uint8_t *)out->data + start, out->len - start));
    if (out->oom)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory serializing");
    return LOOM_OK;
}

typedef struct reader {
    const uint8_t *p;
    size_t len, pos;
} reader;

static bool get_bytes(reader *r, size_t n, const uint8_t **out) {
    if (n > r->len - r->pos)
        return false;
    *out = r->p + r->pos;
    r->pos += n;
    return true;
}

static bool get_u32(reader *r, uint32_t *v) {
    const uint8_t *b;
    if (!get_bytes(r, 4, &b))
        return false;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return true;
}

static bool get_u64(reader *r, uint64_t *v) {
    uint32_t lo, hi;
    if (!get_u32(r, &lo) || !get_u32(r, &hi))
        return false;
    *v = (uint64_t)hi << 32 | lo;
    return true;
}

static loom_status corrupt(loom_ir_diag *d, const char *what) {
    return loom_ir_diag_set(d, LOOM_STATUS_CORRUPT_DATA, "codegen: code blob: %s", what);
}

loom_status loom_cg_code_load(const void *blob, size_t len, const loom_ir_plan *plan,
                              loom_cg_code **out_code, loom_rt_kernel *out_kernels,
                              loom_ir_diag *d) {
    int32_t n_kernels = plan ? plan->n_kernels : -1;
    if (!out_code || (!blob && len > 0) || (!out_kernels && n_kernels > 0) || n_kernels < 0)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "codegen: bad load arguments");
    *out_code = NULL;
    loom_cg_init_once();
    reader r = {.p = blob, .len = len};
    if (len < sizeof blob_magic + 16 + 8)
        return corrupt(d, "truncated header");
    uint64_t sum;
    memcpy(&sum, (const uint8_t *)blob + len - 8, 8); /* little-endian hosts only (x86-64, arm64) */
    if (sum != checksum(blob, len - 8))
        return corrupt(d, "checksum mismatch");
    r.len = len - 8;
    const uint8_t *magic;
    uint32_t version, key_len, nk, no;
    if (!get_bytes(&r, sizeof blob_magic, &magic) || memcmp(magic, blob_magic, sizeof blob_magic))
        return corrupt(d, "not a Loom code blob");
    if (!get_u32(&r, &version) || !get_u32(&r, &key_len) || !get_u32(&r, &nk) || !get_u32(&r, &no))
        return corrupt(d, "truncated header");
    if (version != LOOM_CG_FORMAT_VERSION)
        return corrupt(d, "written by another codegen version");
    const uint8_t *key;
    const char *want = loom_cg_target_key();
    if (!get_bytes(&r, key_len, &key) || key_len != strlen(want) || memcmp(key, want, key_len))
        return corrupt(d, "compiled for another LLVM version or CPU");
    if (nk != (uint32_t)n_kernels)
        return corrupt(d, "kernel count differs from the plan's");
    if (no > 4096 || nk > (1u << 24))
        return corrupt(d, "implausible counts");
    loom_allocator a = loom_allocator_system();
    size_t recs_bytes = (size_t)(nk ? nk : 1) * sizeof(cg_kernel_rec);
    size_t objs_bytes = (size_t)(no ? no : 1) * (sizeof(uint8_t *) + sizeof(size_t));
    cg_kernel_rec *recs = loom_ir_alloc(&a, recs_bytes);
    const uint8_t **objs = loom_ir_alloc(&a, objs_bytes);
    loom_status st = LOOM_OK;
    if (!recs || !objs)
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory loading");
    size_t *lens = objs ? (size_t *)(objs + (no ? no : 1)) : NULL;
    for (uint32_t k = 0; k < nk && st == LOOM_OK; k++) {
        uint32_t n;
        const uint8_t *name;
        uint64_t extent, grain;
        if (!get_u32(&r, &n) || n >= sizeof recs[k].name || !get_bytes(&r, n, &name) ||
            !get_u64(&r, &extent) || !get_u64(&r, &grain)) {
            st = corrupt(d, "bad kernel table");
            break;
        }
        /* exactly the kernels the runtime runs itself have no code (an empty name) */
        if ((n == 0) != (plan->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE)) {
            st = corrupt(d, "kernel table differs from the plan's");
            break;
        }
        memset(recs[k].name, 0, sizeof recs[k].name);
        for (uint32_t i = 0; i < n; i++)
            if (name[i] < 0x21 || name[i] > 0x7e)
                st = corrupt(d, "bad kernel name");
        memcpy(recs[k].name, name, n);
        if ((int64_t)extent < 1 || (int64_t)grain < 1)
            st = corrupt(d, "bad kernel extent");
        recs[k].extent = (int64_t)extent;
        recs[k].grain = (int64_t)grain;
    }
    for (uint32_t i = 0; i < no && st == LOOM_OK; i++) {
        uint64_t n;
        if (!get_u64(&r, &n) || n > r.len - r.pos || !get_bytes(&r, (size_t)n, &objs[i]))
            st = corrupt(d, "bad object length");
        else
            lens[i] = (size_t)n;
    }
    if (st == LOOM_OK && r.pos != r.len)
        st = corrupt(d, "trailing bytes");
    if (st == LOOM_OK)
        st = loom_cg_code_build(&a, (int32_t)no, objs, lens, (int32_t)nk, recs, out_code,
                                out_kernels, LOOM_STATUS_CORRUPT_DATA, d);
    loom_ir_free(&a, recs, recs_bytes);
    loom_ir_free(&a, objs, objs_bytes);
    return st;
}
