/* The host target: LLVM's one-time initialisation, the LLVM version, the host's triple, CPU
 * name and features, the target machine objects are emitted for, and what codegen chooses
 * from them (the matmul and convolution paths) and keys compiled code on (loom_cg_target_key). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Support.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <mlir-c/RegisterEverything.h>

#include "build_id.h"
#include "cg_internal.h"

/* ---- one-time initialisation and the host ------------------------------------------------ */

const char *loom_cg_llvm_version(void) {
    static char buf[32];
    unsigned major, minor, patch;
    LLVMGetVersion(&major, &minor, &patch);
    snprintf(buf, sizeof buf, "%u.%u.%u", major, minor, patch);
    return buf;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static char host_triple[128], host_cpu[64], host_features[4096], target_key[4400];

static void copy_str(char *dst, size_t size, char *src) {
    snprintf(dst, size, "%s", src ? src : "");
    LLVMDisposeMessage(src);
}

/* LLVM's loop strength reduction is off in codegen unless LOOM_CG_LSR=1 (read once, at the
 * first compile). On ResNet-50's convolution kernels it took a third of the object emission
 * and sped nothing up: off, the bf16 step at batch 8, 224x224 compiles in ~3.4 s instead of
 * ~4.8 s, its kernels as fast as before (267f427). The option is
 * LLVM's process-wide -disable-lsr; its errors, if any, are ignored (LLVMParseCommandLineOptions
 * writes them to a null stream and never exits). */
static bool lsr_on(void) {
    const char *env = getenv("LOOM_CG_LSR");
    return env && strcmp(env, "1") == 0;
}

static void init(void) {
    if (!lsr_on()) {
        const char *argv[] = {"loom", "-disable-lsr"};
        LLVMParseCommandLineOptions(2, argv, "");
    }
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMInitializeNativeAsmParser();
    mlirRegisterAllPasses();
    char *t = LLVMGetDefaultTargetTriple();
    char *norm = LLVMNormalizeTargetTriple(t);
    LLVMDisposeMessage(t);
    copy_str(host_triple, sizeof host_triple, norm);
    copy_str(host_cpu, sizeof host_cpu, LLVMGetHostCPUName());
    copy_str(host_features, sizeof host_features, LLVMGetHostCPUFeatures());
    /* The key lists the enabled features only: with the LLVM version fixed, the disabled
     * ones are everything else, and the key stays short enough for cache file names. */
    size_t n = (size_t)snprintf(target_key, sizeof target_key, "llvm-%s;%s;%s;",
                                loom_cg_llvm_version(), host_triple, host_cpu);
    for (const char *p = host_features; *p && n < sizeof target_key;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 1 && p[0] == '+' && n + len + 1 < sizeof target_key) {
            memcpy(target_key + n, p, len);
            n += len;
            target_key[n++] = ',';
        }
        p += len + (end ? 1 : 0);
    }
    snprintf(target_key + n, sizeof target_key - n, ";cg%d;build-%s%s", LOOM_CG_FORMAT_VERSION,
             LOOM_BUILD_ID, lsr_on() ? ";lsr" : "");
}

void loom_cg_init_once(void) {
    pthread_once(&init_once, init);
}

const char *loom_cg_host_triple(void) {
    loom_cg_init_once();
    return host_triple;
}

const char *loom_cg_host_cpu(void) {
    loom_cg_init_once();
    return host_cpu;
}

const char *loom_cg_host_features(void) {
    loom_cg_init_once();
    return host_features;
}

bool loom_cg_host_has_fma(void) {
    loom_cg_init_once();
    const char *force = getenv("LOOM_CG_FMA"); /* "0": test the portable path */
    if (force && force[0] == '0')
        return false;
    if (strncmp(host_triple, "aarch64", 7) == 0 || strncmp(host_triple, "arm64", 5) == 0)
        return true;
    for (const char *p = host_features; (p = strstr(p, "+fma")) != NULL; p += 4)
        if ((p == host_features || p[-1] == ',') && (p[4] == ',' || p[4] == '\0'))
            return true;
    return false;
}

bool loom_cg_host_has(const char *feature) {
    loom_cg_init_once();
    size_t n = strlen(feature);
    for (const char *p = host_features; (p = strstr(p, feature)) != NULL; p += n)
        if (p > host_features && p[-1] == '+' && (p - 1 == host_features || p[-2] == ',') &&
            (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static atomic_int mm16_warned; /* bit per cg_mm16 fallback already reported */

static void mm16_warn(int bit, const char *what) {
    if (!(atomic_fetch_or(&mm16_warned, 1 << bit) & (1 << bit)))
        fprintf(stderr, "loom: LOOM_MATMUL_ISA=%s: %s; 16-bit matmuls use the f32 path\n",
                getenv("LOOM_MATMUL_ISA"), what);
}

cg_mm16 loom_cg_mm16_path(void) {
    bool bf16 = loom_cg_host_has("avx512bf16") && loom_cg_host_has("avx512f");
    const char *forced = getenv("LOOM_MATMUL_ISA");
    if (!forced || !forced[0])
        return bf16 ? CG_MM16_AVX512BF16 : CG_MM16_F32;
    if (strcmp(forced, "avx512bf16") == 0) {
        if (bf16)
            return CG_MM16_AVX512BF16;
        mm16_warn(0, "this CPU has no AVX512-BF16");
        return CG_MM16_F32;
    }
    if (strcmp(forced, "amx") == 0) {
        mm16_warn(1, loom_cg_host_has("amx-bf16") ? "the AMX path is not implemented yet"
                                                  : "this CPU has no AMX-BF16");
        return CG_MM16_F32;
    }
    /* f32, and the f32 register tiles (avx512, avx2, generic): converted to f32 */
    return CG_MM16_F32;
}

/* The f32 register tiles LOOM_MATMUL_ISA forces: 512 (avx512), 256 (avx2), 0 (another
 * value: generic, or a 16-bit path's name), -1 (unset: by the host). */
static int forced_tile_bits(void) {
    const char *forced = getenv("LOOM_MATMUL_ISA");
    if (!forced || !forced[0])
        return -1;
    return strcmp(forced, "avx512") == 0 ? 512 : strcmp(forced, "avx2") == 0 ? 256 : 0;
}

int64_t loom_cg_mk_acc(void) {
    int bits = forced_tile_bits();
    if (bits == 512 || (bits != 256 && loom_cg_host_has("avx512f")))
        return 16;
    return 6;
}

bool loom_cg_f32_microkernel(void) {
    int bits = forced_tile_bits();
    if (bits == 0)
        return false;
    if (loom_cg_host_has("avx512f"))
        return true;
    return loom_cg_host_has("avx2") && loom_cg_host_has("fma");
}

const char *loom_cg_matmul16_path(loom_dtype dt) {
    if (dt != LOOM_DTYPE_BF16 && dt != LOOM_DTYPE_F16)
        return NULL;
    loom_cg_init_once();
    if (dt == LOOM_DTYPE_BF16 && loom_cg_mm16_path() == CG_MM16_AVX512BF16)
        return "avx512bf16: B packed in pairs, vdpbf16ps, f32 accumulation";
    return loom_cg_mk_acc() == 16
               ? "f32: operands converted to f32 while packed, f32 FMA, 8 x 32 or 16 x 16 C tiles "
                 "(AVX-512)"
               : "f32: operands converted to f32 while packed, f32 FMA, 6 x 16 C tiles (AVX2)";
}

cg_conv_mode loom_cg_conv_mode(void) {
    static const char *const names[] = {[CG_CONV_DIRECT] = "direct",
                                        [CG_CONV_IM2COL] = "im2col",
                                        [CG_CONV_WINO2] = "winograd2",
                                        [CG_CONV_WINO4] = "winograd4",
                                        [CG_CONV_BORDER] = "border"};
    const char *conv = getenv("LOOM_CONV");
    for (int m = CG_CONV_DIRECT; conv && m <= CG_CONV_BORDER; m++)
        if (strcmp(conv, names[m]) == 0)
            return (cg_conv_mode)m;
    return CG_CONV_AUTO;
}

const char *loom_cg_amx_missing(void) {
    loom_cg_init_once();
    return loom_cg_host_has("amx-bf16") ? "the AMX-BF16 kernel is not implemented yet"
                                        : "this CPU has no AMX-BF16";
}

const char *loom_cg_target_key(void) {
    loom_cg_init_once();
    /* the forced matmul ISA shapes the code: part of the key (a short, sanitized copy) */
    static _Thread_local char key[sizeof target_key + 48];
    const char *forced = getenv("LOOM_MATMUL_ISA");
    char isa[17] = "auto";
    if (forced && forced[0]) {
        size_t i = 0;
        for (; forced[i] && i + 1 < sizeof isa; i++) {
            char ch = forced[i];
            isa[i] = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ? ch : '_';
        }
        isa[i] = '\0';
    }
    /* so does LOOM_CONV=im2col, which decomposes the convolutions (passes/conv_decompose.c),
     * and LOOM_CONV=direct|winograd2|winograd4|border (no Winograd, or its tiles or the
     * border classes chosen otherwise): a program compiled another way has other kernels */
    static const char *const conv_key[] = {
        "", ";conv-direct", ";conv-im2col", ";conv-wino2", ";conv-wino4", ";conv-border"};
    const char *how = conv_key[loom_cg_conv_mode()];
    snprintf(key, sizeof key, "%s;mm-%s%s", target_key, isa, how);
    return key;
}

/* ---- the target machine ------------------------------------------------------------------- */

loom_status loom_cg_host_target_machine_create(LLVMTargetMachineRef *out, loom_ir_diag *d) {
    *out = NULL;
    LLVMTargetRef target;
    char *err = NULL;
    if (LLVMGetTargetFromTriple(loom_cg_host_triple(), &target, &err)) {
        loom_status st =
            loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "codegen: no LLVM target for %s: %s",
                             loom_cg_host_triple(), err ? err : "?");
        LLVMDisposeMessage(err);
        return st;
    }
    *out = LLVMCreateTargetMachine(target, loom_cg_host_triple(), loom_cg_host_cpu(),
                                   loom_cg_host_features(), LLVMCodeGenLevelDefault, LLVMRelocPIC,
                                   LLVMCodeModelSmall);
    if (!*out)
        return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "codegen: cannot create a target machine");
    return LOOM_OK;
}
