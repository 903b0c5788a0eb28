/* The host target: LLVM's one-time initialisation, the LLVM version, the host's triple, CPU
 * name and features, the target machine objects are emitted for, and what codegen chooses
 * from them (the matmul and convolution paths) and keys compiled code on (loom_cg_target_key). */
#include <math.h>
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

/* ---- the cost of the bf16 dot product ------------------------------------------------------
 * Whether vdpbf16ps pays is not a feature bit: Zen 4 and Zen 5 issue it at their f32 FMA's
 * rate (twice the FLOPs: bf16 matmuls ran ~2x the f32 ones there); the Intel Xeon of family
 * 6 model 207 (AMX hidden) at a quarter of it (this probe: 1.35 G vdpbf16ps/s against 5.5 G
 * vfmadd231ps/s on one core, a gain of 0.50; 2026-12-04), where bf16 GEMMs on vdpbf16ps ran
 * 0.58-0.74x the f32 path and GPT-2's bf16 step 0.70x its fp32 one, against 0.92-1.00x with
 * bf16 matmuls on the f32 path. So it is measured, once per
 * process and only on AVX512-BF16 hosts: the thread's CPU time of a loop of independent
 * vfmadd231ps against one of vdpbf16ps (16 zmm accumulators each, more than either's latency
 * times its issue rate), interleaved, the best of PROBE_ROUNDS after a warm-up (~1 ms in
 * all). The gain is bf16 FLOPs over f32 FLOPs per second; vdpbf16ps is taken from a gain of
 * BF16_MIN_GAIN on (the measured ones sit near 1 and 2). */

#define PROBE_ITERS 20000 /* loop trips of 16 instructions: ~0.1-0.2 ms a loop */
#define PROBE_ROUNDS 3
#define BF16_MIN_GAIN 1.5

static double bf16_gain; /* 0: not measured (no AVX512-BF16, or not x86-64) */
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <time.h>

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define ZMM_ZERO(r) "vpxord %%zmm" #r ", %%zmm" #r ", %%zmm" #r "\n\t"
#define ZMM_OP(op, r) op " %%zmm16, %%zmm17, %%zmm" #r "\n\t"
#define ZMM_16(m, x)                                                                               \
    m(x, 0) m(x, 1) m(x, 2) m(x, 3) m(x, 4) m(x, 5) m(x, 6) m(x, 7) m(x, 8) m(x, 9) m(x, 10)       \
        m(x, 11) m(x, 12) m(x, 13) m(x, 14) m(x, 15)
#define ZERO_AT(x, r) ZMM_ZERO(r)
/* The CPU time of n trips of 16 independent `op`s on zeroed zmm registers (zeros: no
 * denormals, and neither instruction's speed depends on its values). */
#define PROBE_HEAD ZMM_16(ZERO_AT, _) ZMM_ZERO(16) ZMM_ZERO(17) "1:\n\t"
#define PROBE_TAIL "dec %0\n\tjnz 1b\n\t"
#define PROBE_ASM(op) PROBE_HEAD ZMM_16(ZMM_OP, op) PROBE_TAIL
#define PROBE_LOOP(name, op)                                                                       \
    __attribute__((target("avx512f,avx512bf16"))) static double name(long n) {                     \
        double t0 = thread_seconds();                                                              \
        __asm__ volatile(PROBE_ASM(op)                                                             \
                         : "+r"(n)                                                                 \
                         :                                                                         \
                         : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",   \
                           "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15",   \
                           "xmm16", "xmm17");                                                      \
        return thread_seconds() - t0;                                                              \
    }
PROBE_LOOP(probe_fma, "vfmadd231ps")
PROBE_LOOP(probe_dpbf16, "vdpbf16ps")

static void measure_bf16_gain(void) {
    if (!loom_cg_host_has("avx512bf16") || !loom_cg_host_has("avx512f"))
        return;
    double fma = INFINITY, dp = INFINITY;
    probe_fma(PROBE_ITERS); /* warm-up: the AVX-512 frequency, the code's first trips */
    probe_dpbf16(PROBE_ITERS);
    for (int r = 0; r < PROBE_ROUNDS; r++) {
        double t = probe_fma(PROBE_ITERS);
        fma = t < fma ? t : fma;
        t = probe_dpbf16(PROBE_ITERS);
        dp = t < dp ? t : dp;
    }
    /* vdpbf16ps: 32 multiply-adds a zmm; vfmadd231ps: 16 */
    if (fma > 0 && dp > 0 && isfinite(fma) && isfinite(dp))
        bf16_gain = 2.0 * fma / dp;
}
#else
static void measure_bf16_gain(void) {}
#endif

double loom_cg_bf16_dot_gain(void) {
    loom_cg_init_once();
    pthread_once(&bf16_once, measure_bf16_gain);
    return bf16_gain;
}

cg_mm16 loom_cg_mm16_path(void) {
    bool bf16 = loom_cg_host_has("avx512bf16") && loom_cg_host_has("avx512f");
    const char *forced = getenv("LOOM_MATMUL_ISA");
    if (!forced || !forced[0])
        return loom_cg_bf16_dot_gain() >= BF16_MIN_GAIN ? CG_MM16_AVX512BF16 /* 0 without it */
                                                        : CG_MM16_F32;
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
    const char *f32 =
        loom_cg_mk_acc() == 16
            ? "f32: operands converted to f32 while packed, f32 FMA, 8 x 32 or 16 x 16 C tiles "
              "(AVX-512)"
            : "f32: operands converted to f32 while packed, f32 FMA, 6 x 16 C tiles (AVX2)";
    if (dt == LOOM_DTYPE_F16)
        return f32;
    /* bf16: the path, and the measured gain that chose it where one was measured */
    static _Thread_local char buf[256];
    bool dp = loom_cg_mm16_path() == CG_MM16_AVX512BF16;
    const char *path = dp ? "avx512bf16: B packed in pairs, vdpbf16ps, f32 accumulation" : f32;
    const char *forced = getenv("LOOM_MATMUL_ISA");
    double gain = loom_cg_bf16_dot_gain();
    if (forced && forced[0])
        snprintf(buf, sizeof buf, "%s (LOOM_MATMUL_ISA=%s)", path, forced);
    else if (gain > 0)
        snprintf(buf, sizeof buf, "%s (vdpbf16ps measured at %.2fx the f32 FMA's FLOP/s: %s)", path,
                 gain, dp ? "taken" : "below 1.5x, not taken");
    else
        snprintf(buf, sizeof buf, "%s", f32);
    return buf;
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
    /* unforced, the 16-bit path is chosen by a measurement (loom_cg_mm16_path): the key
     * says which, so code compiled for the other path never loads */
    const char *mm16 = "";
    double gain = loom_cg_bf16_dot_gain(); /* measured once per process */
    if (strcmp(isa, "auto") == 0 && gain > 0)
        mm16 = gain >= BF16_MIN_GAIN ? "-bf16dp" : "-bf16f32";
    snprintf(key, sizeof key, "%s;mm-%s%s%s", target_key, isa, mm16, how);
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
