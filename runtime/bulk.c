/* Host loops over whole buffers (bulk.h). The 16-bit conversions' vector paths compute what
 * ir.h's per-element conversions compute, lane by lane: the same integer rounding for bf16,
 * and for f16 the same cases (NaN, overflow to inf, subnormal, normal) as masks over 16
 * lanes. */
#include "bulk.h"

#include <stdatomic.h>

#include "ir/ir.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_VECTOR 1
#define VECTOR_FN __attribute__((target("avx512f")))
#else
#define HAVE_X86_VECTOR 0
#endif

static atomic_bool vector_allowed = true;

bool loom_rt_bulk_vector(void) {
#if HAVE_X86_VECTOR
    return atomic_load(&vector_allowed) && __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

void loom_rt_bulk_allow_vector(bool allow) {
    atomic_store(&vector_allowed, allow);
}

static void widen_scalar(float *dst, const uint16_t *src, size_t n, loom_dtype dt) {
    if (dt == LOOM_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = loom_ir_bf16_to_f32(src[i]);
    else if (dt == LOOM_DTYPE_F16)
        for (size_t i = 0; i < n; i++)
            dst[i] = loom_ir_f16_to_f32(src[i]);
}

static void narrow_scalar(uint16_t *dst, const float *src, size_t n, float scale, loom_dtype dt) {
    if (dt == LOOM_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = loom_ir_f32_to_bf16(src[i] * scale);
    else if (dt == LOOM_DTYPE_F16)
        for (size_t i = 0; i < n; i++)
            dst[i] = loom_ir_f32_to_f16(src[i] * scale);
}

#if HAVE_X86_VECTOR
#define U32(x) _mm512_set1_epi32((int)(x))

/* n a multiple of 16. */
VECTOR_FN static void widen_vector(float *dst, const uint16_t *src, size_t n, loom_dtype dt) {
    const bool bf16 = dt == LOOM_DTYPE_BF16;
    for (size_t i = 0; i < n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512i out;
        if (bf16) {
            out = _mm512_slli_epi32(h, 16);
        } else {
            __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h, U32(0x8000)), 16);
            __m512i e = _mm512_and_si512(_mm512_srli_epi32(h, 10), U32(0x1f));
            __m512i m13 = _mm512_slli_epi32(_mm512_and_si512(h, U32(0x3ff)), 13);
            /* normal: the exponent rebiased (15 -> 127) */
            out = _mm512_or_si512(
                sign, _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, U32(112)), 23), m13));
            /* inf and NaN, the payload kept */
            __mmask16 top = _mm512_cmpeq_epi32_mask(e, U32(31));
            out = _mm512_mask_or_epi32(out, top, sign, _mm512_or_si512(U32(0x7f800000), m13));
            /* zero and subnormals: mantissa * 2^-24, exact in f32 */
            __mmask16 sub = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(h, U32(0x3ff))),
                                     _mm512_set1_ps(1.0f / 16777216.0f));
            out = _mm512_mask_or_epi32(out, sub, sign, _mm512_castps_si512(v));
        }
        _mm512_storeu_si512(dst + i, out);
    }
}

/* n a multiple of 16. */
VECTOR_FN static void narrow_vector(uint16_t *dst, const float *src, size_t n, float scale,
                                    loom_dtype dt) {
    const bool bf16 = dt == LOOM_DTYPE_BF16;
    const __m512 s = _mm512_set1_ps(scale);
    for (size_t i = 0; i < n; i += 16) {
        __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(src + i), s));
        __m512i absu = _mm512_and_si512(u, U32(0x7fffffff));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(absu, U32(0x7f800000));
        __m512i out;
        if (bf16) {
            __m512i hi = _mm512_srli_epi32(u, 16);
            __m512i odd = _mm512_and_si512(hi, U32(1));
            out = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(U32(0x7fff), odd)), 16);
            out = _mm512_mask_or_epi32(out, nan, hi, U32(0x40)); /* quiet, still a NaN */
        } else {
            __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), U32(0x8000));
            /* normal: exponent rebiased (127 -> 15), mantissa rounded 23 -> 10 bits */
            __m512i r = _mm512_sub_epi32(absu, U32(0x38000000));
            __m512i odd = _mm512_and_si512(_mm512_srli_epi32(r, 13), U32(1));
            r = _mm512_add_epi32(r, _mm512_add_epi32(U32(0xfff), odd));
            out = _mm512_srli_epi32(r, 13);
            /* below 2^-14: round(|x| 2^24) to nearest even, a subnormal's mantissa */
            __mmask16 sub = _mm512_cmplt_epu32_mask(absu, U32(0x38800000));
            __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(absu), _mm512_set1_ps(16777216.0f));
            out = _mm512_mask_mov_epi32(
                out, sub,
                _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            /* rounds to 65520 or more: inf */
            __mmask16 inf = _mm512_cmpge_epu32_mask(absu, U32(0x477ff000));
            out = _mm512_mask_mov_epi32(out, inf, U32(0x7c00));
            /* NaN: quiet, the payload's top bits kept */
            out = _mm512_mask_or_epi32(out, nan, U32(0x7e00),
                                       _mm512_and_si512(_mm512_srli_epi32(absu, 13), U32(0x3ff)));
            out = _mm512_or_si512(out, sign);
        }
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(out));
    }
}

/* n a multiple of 16. */
VECTOR_FN static void scale_vector(float *dst, const float *src, size_t n, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    for (size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_loadu_ps(src + i), s));
}
#else /* loom_rt_bulk_vector() is false: never called */
static void widen_vector(float *dst, const uint16_t *src, size_t n, loom_dtype dt) {
    (void)dst, (void)src, (void)n, (void)dt;
}
static void narrow_vector(uint16_t *dst, const float *src, size_t n, float scale, loom_dtype dt) {
    (void)dst, (void)src, (void)n, (void)scale, (void)dt;
}
static void scale_vector(float *dst, const float *src, size_t n, float scale) {
    (void)dst, (void)src, (void)n, (void)scale;
}
#endif

/* The leading elements of n that the vector path takes: whole 16s, where the CPU has it. */
static size_t vector_count(size_t n) {
    return loom_rt_bulk_vector() ? n / 16 * 16 : 0;
}

static bool is_16(loom_dtype dt) {
    return dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16;
}

void loom_rt_scale_f32(float *dst, const float *src, size_t n, float scale) {
    if (n == 0) /* dst and src may be NULL */
        return;
    size_t i = vector_count(n);
    if (i > 0)
        scale_vector(dst, src, i, scale);
    for (; i < n; i++)
        dst[i] = src[i] * scale;
}

void loom_rt_widen16(float *dst, const uint16_t *src, size_t n, loom_dtype dt) {
    if (n == 0)
        return;
    size_t done = is_16(dt) ? vector_count(n) : 0;
    if (done > 0)
        widen_vector(dst, src, done, dt);
    widen_scalar(dst + done, src + done, n - done, dt);
}

void loom_rt_narrow16(uint16_t *dst, const float *src, size_t n, float scale, loom_dtype dt) {
    if (n == 0)
        return;
    size_t done = is_16(dt) ? vector_count(n) : 0;
    if (done > 0)
        narrow_vector(dst, src, done, scale, dt);
    narrow_scalar(dst + done, src + done, n - done, scale, dt);
}
