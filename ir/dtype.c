/* Element types: the dtype table, 16-bit float conversions, typed loads and stores. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir.h"

static const struct {
    const char *name;
    size_t size;
    bool is_float, is_int;
} dtypes[] = {
#define LOOM_DTYPE(e, n, sz, f, i) [LOOM_DTYPE_##e] = {#n, sz, f, i},
#include "loom/dtypes.def"
#undef LOOM_DTYPE
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == LOOM_DTYPE_COUNT_, "dtype table size");

bool loom_ir_dtype_valid(loom_dtype dt) { return (unsigned)dt < LOOM_DTYPE_COUNT_; }

LOOM_API const char *loom_dtype_name(loom_dtype dt) {
    return loom_ir_dtype_valid(dt) ? dtypes[dt].name : "?";
}

LOOM_API size_t loom_dtype_size(loom_dtype dt) {
    return loom_ir_dtype_valid(dt) ? dtypes[dt].size : 0;
}

bool loom_ir_dtype_is_float(loom_dtype dt) { return loom_ir_dtype_valid(dt) && dtypes[dt].is_float; }
bool loom_ir_dtype_is_int(loom_dtype dt) { return loom_ir_dtype_valid(dt) && dtypes[dt].is_int; }

bool loom_ir_dtype_in_class(loom_dtype dt, loom_ir_dtclass c) {
    if (!loom_ir_dtype_valid(dt))
        return false;
    switch (c) {
    case LOOM_IR_DT_ANY: return true;
    case LOOM_IR_DT_NUM: return dt != LOOM_DTYPE_BOOL;
    case LOOM_IR_DT_FLOAT: return dtypes[dt].is_float;
    case LOOM_IR_DT_COUNT_: break;
    }
    return false;
}

loom_dtype loom_ir_dtype_from_name(const char *name, size_t len) {
    for (int i = 0; i < LOOM_DTYPE_COUNT_; i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0)
            return (loom_dtype)i;
    return LOOM_DTYPE_COUNT_;
}

char *loom_ir_format_type(char *buf, size_t size, loom_dtype dt, int32_t rank,
                          const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, size, "%s[", loom_dtype_name(dt));
    for (int32_t i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

/* ---- 16-bit floats ----------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* loom_ir_f32_to_bf16 and loom_ir_bf16_to_f32 are inline in ir.h. */

uint16_t loom_ir_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
    if (absu >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal f16 (2^-14): subnormal or zero */
        /* value = absf; f16 subnormal unit is 2^-24: round(absf * 2^24) to nearest even */
        float absf = bits_f32(absu);
        float scaled = absf * 16777216.0f; /* exact: power-of-two scaling */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits to nearest even */
    uint32_t r = absu - 0x38000000u; /* exponent - 112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float loom_ir_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

/* ---- typed element access ---------------------------------------------------------------- */

double loom_ir_load_f64(const void *buf, loom_dtype dt, int64_t i) {
    switch (dt) {
    case LOOM_DTYPE_F32: return ((const float *)buf)[i];
    case LOOM_DTYPE_F16: return loom_ir_f16_to_f32(((const uint16_t *)buf)[i]);
    case LOOM_DTYPE_BF16: return loom_ir_bf16_to_f32(((const uint16_t *)buf)[i]);
    case LOOM_DTYPE_F64: return ((const double *)buf)[i];
    case LOOM_DTYPE_I32: return ((const int32_t *)buf)[i];
    case LOOM_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case LOOM_DTYPE_BOOL: return ((const uint8_t *)buf)[i] ? 1.0 : 0.0;
    case LOOM_DTYPE_COUNT_: break;
    }
    return 0.0;
}

/* Float -> integer conversion that never invokes undefined behaviour: truncation toward
 * zero, saturating at the type's limits, NaN -> 0. */
static int64_t f64_to_i64_sat(double v, int64_t lo, int64_t hi) {
    if (isnan(v))
        return 0;
    if (v <= (double)lo)
        return lo;
    if (v >= (double)hi)
        return hi;
    return (int64_t)v;
}

void loom_ir_store_f64(void *buf, loom_dtype dt, int64_t i, double v) {
    switch (dt) {
    case LOOM_DTYPE_F32: ((float *)buf)[i] = (float)v; return;
    /* f64 -> f32 -> f16 double-rounds; the interpreter computes 16-bit types via f32, as
     * the compiled kernels do, so this matches them. */
    case LOOM_DTYPE_F16: ((uint16_t *)buf)[i] = loom_ir_f32_to_f16((float)v); return;
    case LOOM_DTYPE_BF16: ((uint16_t *)buf)[i] = loom_ir_f32_to_bf16((float)v); return;
    case LOOM_DTYPE_F64: ((double *)buf)[i] = v; return;
    case LOOM_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)f64_to_i64_sat(v, INT32_MIN, INT32_MAX); return;
    case LOOM_DTYPE_I64: ((int64_t *)buf)[i] = f64_to_i64_sat(v, INT64_MIN, INT64_MAX); return;
    case LOOM_DTYPE_BOOL: ((uint8_t *)buf)[i] = v != 0.0; return;
    case LOOM_DTYPE_COUNT_: break;
    }
}

int64_t loom_ir_load_i64(const void *buf, loom_dtype dt, int64_t i) {
    switch (dt) {
    case LOOM_DTYPE_I32: return ((const int32_t *)buf)[i];
    case LOOM_DTYPE_I64: return ((const int64_t *)buf)[i];
    case LOOM_DTYPE_BOOL: return ((const uint8_t *)buf)[i] != 0;
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16:
    case LOOM_DTYPE_F64: return f64_to_i64_sat(loom_ir_load_f64(buf, dt, i), INT64_MIN, INT64_MAX);
    case LOOM_DTYPE_COUNT_: break;
    }
    return 0;
}

void loom_ir_store_i64(void *buf, loom_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case LOOM_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; return; /* wraps, as C casts do */
    case LOOM_DTYPE_I64: ((int64_t *)buf)[i] = v; return;
    case LOOM_DTYPE_BOOL: ((uint8_t *)buf)[i] = v != 0; return;
    case LOOM_DTYPE_F32:
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16:
    case LOOM_DTYPE_F64: loom_ir_store_f64(buf, dt, i, (double)v); return;
    case LOOM_DTYPE_COUNT_: break;
    }
}
