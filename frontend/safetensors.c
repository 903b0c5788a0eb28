/* Safetensors checkpoints (include/loom/safetensors.h): a strict parser and validator for the
 * format's JSON header and data layout, and save/load of a context's tensors through it. */
#include "loom/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend.h"

/* Tensor bytes go between the file and device buffers unchanged. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and Loom copies it as is: a big-endian host needs swaps"
#endif

/* The reference implementation's limit: it bounds what a hostile size field can make us
 * parse, while real headers (one short entry per tensor) stay far below it. */
#define ST_MAX_HEADER 100000000u

/* Loom's dtype enum names are the format's dtype names (F32, BF16, BOOL, ...); a new row in
 * dtypes.def must keep that true or get its own name here. */
static const char *const st_dtype_names[LOOM_DTYPE_COUNT_] = {
#define LOOM_DTYPE(e, n, sz, f, i) [LOOM_DTYPE_##e] = #e,
#include "loom/dtypes.def"
#undef LOOM_DTYPE
};

/* Dtypes of the format that Loom has no type for: refused by name, not as corrupt. */
static const char *const st_unsupported[] = {
    "U8",      "I8",      "I16", "U16",     "U32",     "U64", "F8_E4M3",
    "F8_E5M2", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64",
};

typedef struct st_tensor {
    const char *name; /* NUL-terminated, inside the image's header (decoded in place) */
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    size_t begin, end; /* in the data area */
} st_tensor;

struct loom_safetensors {
    loom_allocator alloc;
    uint8_t *image; /* the whole file, owned */
    size_t image_size;
    const uint8_t *data; /* the data area, after the header */
    size_t data_len;
    st_tensor *t; /* sorted by name */
    int32_t n, cap;
};

/* Length of the valid UTF-8 sequence at s (n bytes available), or 0: no overlong forms,
 * no surrogates, nothing above U+10FFFF (RFC 3629). */
static size_t utf8_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    size_t k;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2, cp = c & 0x1Fu, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3, cp = c & 0x0Fu, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4, cp = c & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

static size_t utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* "[4, 3]" */
static const char *fmt_shape(char *buf, size_t size, int32_t rank, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int32_t i = 0; i < rank && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < size)
        snprintf(buf + k, size - k, "]");
    return buf;
}

/* ---- the header's JSON ------------------------------------------------------------------
 * A recursive-descent parser for exactly the schema: an object of tensor entries (objects
 * with a dtype string, a shape array and a data_offsets pair) and an optional
 * "__metadata__" object of strings. Anything else is refused rather than skipped, so the
 * nesting depth is bounded by the schema (3) and nothing recurses on the input. Strings are
 * decoded in place: an escape never decodes to more bytes than it takes, so the decoded text
 * stays behind the read position and names cost no allocation. */

typedef struct st_parser {
    uint8_t *s; /* the header */
    size_t n, pos;
    size_t data_len;
    const loom_allocator *a;
    loom_safetensors *f;
    char *err;
    size_t err_size;
} st_parser;

typedef struct st_span {
    const char *s;
    size_t len;
} st_span;

#define ST_WHO_MAX 160

static loom_status bad(st_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static loom_status bad(st_parser *p, const char *fmt, ...) {
    if (p->err && p->err_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, p->err_size, fmt, ap);
        va_end(ap);
    }
    return LOOM_STATUS_CORRUPT_DATA;
}

static loom_status syntax_at(st_parser *p, size_t at, const char *what) {
    return bad(p, "header is not valid JSON: byte %zu: %s", at, what);
}

static loom_status expected(st_parser *p, const char *what) {
    if (p->pos >= p->n)
        return bad(p,
                   "header is not valid JSON: expected %s at byte %zu, found the end of the "
                   "header",
                   what, p->pos);
    uint8_t c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7F)
        return bad(p, "header is not valid JSON: expected %s at byte %zu, found '%c'", what, p->pos,
                   c);
    return bad(p, "header is not valid JSON: expected %s at byte %zu, found byte 0x%02x", what,
               p->pos, c);
}

static void skip_ws(st_parser *p) {
    while (p->pos < p->n) {
        uint8_t c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static bool at(st_parser *p, uint8_t c) {
    skip_ws(p);
    return p->pos < p->n && p->s[p->pos] == c;
}

static bool is_digit(st_parser *p) {
    return p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9';
}

static int hex_digit(uint8_t c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The four hex digits at i, or -1. */
static int32_t hex4(const st_parser *p, size_t i) {
    if (i > p->n || p->n - i < 4)
        return -1;
    int32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int d = hex_digit(p->s[i + k]);
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The string at pos (what: its role, for "expected ..."), decoded in place and
 * NUL-terminated; *out_len counts any \u0000 inside it. */
static loom_status parse_string(st_parser *p, const char *what, char **out_s, size_t *out_len) {
    if (!at(p, '"'))
        return expected(p, what);
    uint8_t *s = p->s;
    size_t start = ++p->pos, w = start;
    for (;;) {
        if (p->pos >= p->n)
            return syntax_at(p, start - 1, "unterminated string");
        uint8_t c = s[p->pos];
        if (c == '"') {
            s[w] = 0; /* w <= pos: at most the closing quote is overwritten */
            p->pos++;
            *out_s = (char *)s + start;
            *out_len = w - start;
            return LOOM_OK;
        }
        if (c == '\\') {
            if (p->pos + 1 >= p->n)
                return syntax_at(p, start - 1, "unterminated string");
            uint8_t e = s[p->pos + 1];
            const char *simple = strchr("\"\\/bfnrt", e);
            if (e != 0 && simple) {
                static const char decoded[] = "\"\\/\b\f\n\r\t";
                s[w++] = (uint8_t)decoded[simple - "\"\\/bfnrt"];
                p->pos += 2;
                continue;
            }
            if (e != 'u')
                return syntax_at(p, p->pos, "invalid escape in a string");
            int32_t cp = hex4(p, p->pos + 2);
            if (cp < 0)
                return syntax_at(p, p->pos, "\\u needs four hex digits");
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return syntax_at(p, p->pos, "a low surrogate \\u escape without a high one");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                size_t lo_at = p->pos + 6;
                int32_t lo = lo_at + 1 < p->n && s[lo_at] == '\\' && s[lo_at + 1] == 'u'
                                 ? hex4(p, lo_at + 2)
                                 : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return syntax_at(p, p->pos, "a high surrogate \\u escape without a low one");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->pos += 6;
            }
            p->pos += 6; /* read before written: the output (<= 4 bytes) stays behind */
            w += utf8_put((uint32_t)cp, s + w);
            continue;
        }
        if (c < 0x20)
            return syntax_at(p, p->pos, "unescaped control character in a string");
        size_t k = c < 0x80 ? 1 : utf8_len(s + p->pos, p->n - p->pos);
        if (k == 0)
            return syntax_at(p, p->pos, "invalid UTF-8 in a string");
        memmove(s + w, s + p->pos, k);
        w += k;
        p->pos += k;
    }
}

static bool str_is(const char *s, size_t len, const char *lit) {
    return len == strlen(lit) && memcmp(s, lit, len) == 0;
}

/* A number that must be an integer in [0, INT64_MAX]; who says which, in messages. */
static loom_status parse_count(st_parser *p, const char *who, int64_t *out) {
    skip_ws(p);
    size_t start = p->pos;
    bool neg = at(p, '-');
    if (neg)
        p->pos++;
    if (!is_digit(p)) {
        if (!neg && p->pos < p->n && strchr("\"[{tfn", p->s[p->pos]) && p->s[p->pos] != 0)
            return bad(p, "%s is not an integer", who);
        return expected(p, "a number");
    }
    uint64_t v = 0;
    bool big = false;
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (is_digit(p))
            return syntax_at(p, p->pos, "a number with a leading zero");
    } else {
        while (is_digit(p)) {
            uint64_t d = (uint64_t)(p->s[p->pos++] - '0');
            if (v > ((uint64_t)INT64_MAX - d) / 10)
                big = true;
            else
                v = v * 10 + d;
        }
    }
    bool frac = false;
    if (p->pos < p->n && p->s[p->pos] == '.') {
        p->pos++;
        if (!is_digit(p))
            return syntax_at(p, p->pos, "expected a digit after '.'");
        while (is_digit(p))
            p->pos++;
        frac = true;
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
            p->pos++;
        if (!is_digit(p))
            return syntax_at(p, p->pos, "expected a digit in an exponent");
        while (is_digit(p))
            p->pos++;
        frac = true;
    }
    int len = (int)(p->pos - start);
    const char *tok = (const char *)p->s + start;
    const char *more = len > 30 ? "..." : "";
    if (frac)
        return bad(p, "%s is %.*s%s, not an integer", who, len > 30 ? 30 : len, tok, more);
    if (neg)
        return bad(p, "%s is negative (%.*s%s)", who, len > 30 ? 30 : len, tok, more);
    if (big)
        return bad(p, "%s is too large (%.*s%s; at most 2^63-1)", who, len > 30 ? 30 : len, tok,
                   more);
    *out = (int64_t)v;
    return LOOM_OK;
}

/* ---- objects: '{' is consumed, then members "key": value separated by ',' up to '}' ---- */

/* Consumes the '}' of an empty object; false when a member follows. */
static bool empty_object(st_parser *p) {
    if (!at(p, '}'))
        return false;
    p->pos++;
    return true;
}

/* A member's key (`what` names it in errors) and its ':'. */
static loom_status parse_key(st_parser *p, const char *what, char **key, size_t *klen) {
    loom_status st = parse_string(p, what, key, klen);
    if (st != LOOM_OK)
        return st;
    if (!at(p, ':'))
        return expected(p, "':'");
    p->pos++;
    return LOOM_OK;
}

/* After a member's value: ',' (*more: another member follows) or the object's '}'. */
static loom_status end_member(st_parser *p, bool *more) {
    if (at(p, ',')) {
        p->pos++;
        *more = true;
        return LOOM_OK;
    }
    if (at(p, '}')) {
        p->pos++;
        *more = false;
        return LOOM_OK;
    }
    return expected(p, "',' or '}'");
}

/* An array of at most max counts; *out_n gets how many there were, max + 1 when more. */
static loom_status parse_counts(st_parser *p, const char *who, const char *key, int32_t max,
                                int64_t *vals, int32_t *out_n) {
    if (!at(p, '['))
        return bad(p, "%s: %s is not an array of integers", who, key);
    p->pos++;
    int32_t n = 0;
    if (at(p, ']')) {
        p->pos++;
        *out_n = 0;
        return LOOM_OK;
    }
    for (;;) {
        if (n == max) {
            *out_n = max + 1;
            return LOOM_OK;
        }
        char what[ST_WHO_MAX + 32];
        snprintf(what, sizeof what, "%s: %s[%d]", who, key, (int)n);
        loom_status st = parse_count(p, what, &vals[n]);
        if (st != LOOM_OK)
            return st;
        n++;
        if (at(p, ',')) {
            p->pos++;
            continue;
        }
        if (at(p, ']')) {
            p->pos++;
            *out_n = n;
            return LOOM_OK;
        }
        return expected(p, "',' or ']'");
    }
}

static loom_status parse_dtype(st_parser *p, const char *who, st_tensor *e) {
    char *s;
    size_t len;
    if (!at(p, '"'))
        return bad(p, "%s: dtype is not a string", who);
    loom_status st = parse_string(p, "a string", &s, &len);
    if (st != LOOM_OK)
        return st;
    for (int32_t d = 0; d < LOOM_DTYPE_COUNT_; d++)
        if (str_is(s, len, st_dtype_names[d])) {
            e->dtype = (loom_dtype)d;
            return LOOM_OK;
        }
    for (size_t k = 0; k < sizeof st_unsupported / sizeof *st_unsupported; k++)
        if (str_is(s, len, st_unsupported[k])) {
            loom_fe_set_err(
                p->err, p->err_size, LOOM_STATUS_UNSUPPORTED,
                "%s: unsupported dtype %s (Loom reads F64, F32, F16, BF16, I64, I32, BOOL)", who,
                st_unsupported[k]);
            return LOOM_STATUS_UNSUPPORTED;
        }
    return bad(p, "%s: unknown dtype \"%.40s\"", who, s);
}

/* Bytes the entry's dtype and shape need; false when they overflow 64 bits. */
static bool entry_bytes(const st_tensor *e, uint64_t *out) {
    uint64_t numel = 1;
    bool overflow = false;
    for (int32_t i = 0; i < e->rank; i++) {
        uint64_t x = (uint64_t)e->shape[i];
        if (x == 0) {
            *out = 0;
            return true;
        }
        if (numel > (uint64_t)INT64_MAX / x)
            overflow = true;
        else
            numel *= x;
    }
    uint64_t size = loom_dtype_size(e->dtype);
    if (overflow || numel > (uint64_t)INT64_MAX / size)
        return false;
    *out = numel * size;
    return true;
}

/* One tensor entry: {"dtype": .., "shape": [..], "data_offsets": [begin, end]}, keys in any
 * order, each exactly once; then its offsets against the data area. */
static loom_status parse_entry(st_parser *p, st_tensor *e) {
    char who[ST_WHO_MAX];
    snprintf(who, sizeof who, "tensor '%.120s'", e->name);
    if (!at(p, '{'))
        return bad(p, "%s: expected an object {\"dtype\", \"shape\", \"data_offsets\"}", who);
    p->pos++;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    int64_t offs[3] = {0, 0, 0};
    loom_status st;
    for (bool more = !empty_object(p); more;) {
        char *key;
        size_t klen;
        if ((st = parse_key(p, "a key", &key, &klen)) != LOOM_OK)
            return st;
        bool *seen;
        if (str_is(key, klen, "dtype"))
            seen = &has_dtype;
        else if (str_is(key, klen, "shape"))
            seen = &has_shape;
        else if (str_is(key, klen, "data_offsets"))
            seen = &has_offsets;
        else
            return bad(p,
                       "%s: unknown key \"%.40s\" (an entry has dtype, shape and "
                       "data_offsets)",
                       who, key);
        if (*seen)
            return bad(p, "%s: key \"%s\" appears twice", who, key);
        *seen = true;
        if (seen == &has_dtype) {
            st = parse_dtype(p, who, e);
        } else if (seen == &has_shape) {
            st = parse_counts(p, who, "shape", LOOM_MAX_RANK, e->shape, &e->rank);
            if (st == LOOM_OK && e->rank > LOOM_MAX_RANK)
                return bad(p, "%s: shape has more than %d dimensions (Loom's maximum rank)", who,
                           LOOM_MAX_RANK);
        } else {
            int32_t k = 0;
            st = parse_counts(p, who, "data_offsets", 2, offs, &k);
            if (st == LOOM_OK && k != 2)
                return bad(p, "%s: data_offsets has %s entries, needs 2 [begin, end]", who,
                           k > 2    ? "more than 2"
                           : k == 1 ? "1"
                                    : "0");
        }
        if (st != LOOM_OK || (st = end_member(p, &more)) != LOOM_OK)
            return st;
    }
    if (!has_dtype || !has_shape || !has_offsets)
        return bad(p, "%s: no \"%s\"", who,
                   !has_dtype   ? "dtype"
                   : !has_shape ? "shape"
                                : "data_offsets");

    char sh[LOOM_MAX_RANK * 22 + 4];
    if (offs[0] > offs[1])
        return bad(p, "%s: data_offsets [%" PRId64 ", %" PRId64 "] run backwards", who, offs[0],
                   offs[1]);
    if ((uint64_t)offs[1] > p->data_len)
        return bad(p,
                   "%s: data_offsets [%" PRId64 ", %" PRId64 "] run past the end of the "
                   "data (%zu bytes)",
                   who, offs[0], offs[1], p->data_len);
    uint64_t need;
    if (!entry_bytes(e, &need))
        return bad(p, "%s: shape %s has more bytes than fit in 63 bits", who,
                   fmt_shape(sh, sizeof sh, e->rank, e->shape));
    if (need != (uint64_t)(offs[1] - offs[0]))
        return bad(p,
                   "%s: data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRId64 " bytes, dtype "
                   "%s shape %s needs %" PRIu64,
                   who, offs[0], offs[1], offs[1] - offs[0], st_dtype_names[e->dtype],
                   fmt_shape(sh, sizeof sh, e->rank, e->shape), need);
    e->begin = (size_t)offs[0];
    e->end = (size_t)offs[1];
    return LOOM_OK;
}

static int cmp_span(const void *x, const void *y) {
    const st_span *a = x, *b = y;
    int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* "__metadata__": an object of string values (or null). Not kept: Loom has no use for it. */
static loom_status parse_metadata(st_parser *p) {
    skip_ws(p);
    if (p->n - p->pos >= 4 && memcmp(p->s + p->pos, "null", 4) == 0) {
        p->pos += 4;
        return LOOM_OK;
    }
    if (!at(p, '{'))
        return bad(p, "__metadata__ is not an object of strings");
    p->pos++;
    st_span *keys = NULL;
    int32_t n = 0, cap = 0;
    loom_status st = LOOM_OK;
    for (bool more = !empty_object(p); more && st == LOOM_OK;) {
        char *key, *val;
        size_t klen, vlen;
        if ((st = parse_key(p, "a key", &key, &klen)) != LOOM_OK)
            break;
        if (!at(p, '"')) {
            st = bad(p, "__metadata__: the value of \"%.60s\" is not a string", key);
            break;
        }
        if ((st = parse_string(p, "a string", &val, &vlen)) != LOOM_OK)
            break;
        if (!loom_ir_grow(p->a, (void **)&keys, &cap, n + 1, sizeof *keys)) {
            st = loom_fe_set_err(p->err, p->err_size, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
            break;
        }
        keys[n++] = (st_span){key, klen};
        st = end_member(p, &more);
    }
    if (st == LOOM_OK && n > 1) { /* an empty object has no keys array to sort */
        qsort(keys, (size_t)n, sizeof *keys, cmp_span);
        for (int32_t i = 1; i < n; i++)
            if (cmp_span(&keys[i - 1], &keys[i]) == 0) {
                st = bad(p, "__metadata__: key \"%.60s\" appears twice", keys[i].s);
                break;
            }
    }
    loom_ir_free(p->a, keys, (size_t)cap * sizeof *keys);
    return st;
}

static loom_status parse_header(st_parser *p) {
    if (p->n == 0 || p->s[0] != '{')
        return bad(p, "header is not a JSON object: it does not start with '{'");
    p->pos = 1;
    bool has_meta = false;
    loom_status st;
    for (bool more = !empty_object(p); more;) {
        char *key;
        size_t klen;
        if ((st = parse_key(p, "a tensor name", &key, &klen)) != LOOM_OK)
            return st;
        if (str_is(key, klen, "__metadata__")) {
            if (has_meta)
                return bad(p, "__metadata__ appears twice");
            has_meta = true;
            st = parse_metadata(p);
        } else {
            if (memchr(key, 0, klen))
                return bad(p, "tensor '%s\\u0000...': a name with a NUL character", key);
            loom_safetensors *f = p->f;
            if (!loom_ir_grow(p->a, (void **)&f->t, &f->cap, f->n + 1, sizeof *f->t))
                return loom_fe_set_err(p->err, p->err_size, LOOM_STATUS_OUT_OF_MEMORY,
                                       "out of memory");
            st_tensor *e = &f->t[f->n++];
            memset(e, 0, sizeof *e);
            e->name = key;
            st = parse_entry(p, e);
        }
        if (st != LOOM_OK || (st = end_member(p, &more)) != LOOM_OK)
            return st;
    }
    skip_ws(p); /* the format pads with spaces; JSON allows any whitespace */
    if (p->pos < p->n)
        return bad(p, "header has bytes after its JSON object, at byte %zu", p->pos);
    return LOOM_OK;
}

/* ---- parsed files ------------------------------------------------------------------------ */

static int cmp_name(const void *x, const void *y) {
    return strcmp(((const st_tensor *)x)->name, ((const st_tensor *)y)->name);
}

static int cmp_offsets(const void *x, const void *y) {
    const st_tensor *a = *(const st_tensor *const *)x, *b = *(const st_tensor *const *)y;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

/* The data area must be tiled exactly: in offset order each range starts where the previous
 * one ended (so none overlap and no byte is left over), as the reference reader demands. */
static loom_status check_layout(loom_safetensors *f, char *err, size_t err_size) {
    if (f->n == 0)
        return f->data_len == 0
                   ? LOOM_OK
                   : loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                                     "the header lists no tensors but %zu data bytes follow",
                                     f->data_len);
    const st_tensor **order = loom_ir_alloc(&f->alloc, (size_t)f->n * sizeof *order);
    if (!order)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < f->n; i++)
        order[i] = &f->t[i];
    qsort(order, (size_t)f->n, sizeof *order, cmp_offsets);
    loom_status st = LOOM_OK;
    size_t cur = 0;
    for (int32_t k = 0; k < f->n && st == LOOM_OK; k++) {
        const st_tensor *e = order[k];
        if (e->begin < cur)
            st = loom_fe_set_err(
                err, err_size, LOOM_STATUS_CORRUPT_DATA,
                "tensor '%.120s': data_offsets [%zu, %zu] overlap tensor '%.120s' at "
                "[%zu, %zu]",
                e->name, e->begin, e->end, order[k - 1]->name, order[k - 1]->begin,
                order[k - 1]->end);
        else if (e->begin > cur)
            st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                                 "data bytes [%zu, %zu) belong to no tensor (a gap before tensor "
                                 "'%.120s')",
                                 cur, e->begin, e->name);
        cur = e->end;
    }
    if (st == LOOM_OK && cur != f->data_len)
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "data bytes [%zu, %zu) belong to no tensor (after tensor '%.120s')",
                             cur, f->data_len, order[f->n - 1]->name);
    loom_ir_free(&f->alloc, order, (size_t)f->n * sizeof *order);
    return st;
}

/* Takes image (alloc_size bytes allocated with a, len used) and parses it; frees it on
 * failure. image holds the file's first len of file_len bytes: all of them, or (a check of
 * the header before the data is read) at least the size field and the header, in which case
 * the data area's layout is checked against its size but not its bytes. */
static loom_status st_parse_image(const loom_allocator *a, uint8_t *image, size_t len,
                                  size_t alloc_size, size_t file_len, loom_safetensors **out,
                                  char *err, size_t err_size) {
    loom_safetensors *f = loom_ir_alloc(a, sizeof *f);
    if (!f) {
        loom_ir_free(a, image, alloc_size);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    memset(f, 0, sizeof *f);
    f->alloc = *a;
    f->image = image;
    f->image_size = alloc_size;
    loom_status st = LOOM_OK;
    uint64_t hlen = 0;
    if (file_len < 8 || len < 8) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "truncated: %zu bytes, too short for the 8-byte header size",
                             file_len);
        goto fail;
    }
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | image[i];
    if (hlen > ST_MAX_HEADER) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "header size %" PRIu64 " is over the limit of %u bytes", hlen,
                             ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > file_len - 8) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                             "truncated: header size %" PRIu64
                             " but only %zu bytes follow the size field",
                             hlen, file_len - 8);
        goto fail;
    }
    bool whole = len == file_len;
    if (!whole && len < 8 + hlen) {
        st = loom_fe_set_err(err, err_size, LOOM_STATUS_INTERNAL, "the header was not read");
        goto fail;
    }
    f->data = whole ? image + 8 + hlen : NULL;
    f->data_len = file_len - 8 - (size_t)hlen;
    st_parser p = {.s = image + 8,
                   .n = (size_t)hlen,
                   .data_len = f->data_len,
                   .a = a,
                   .f = f,
                   .err = err,
                   .err_size = err_size};
    if ((st = parse_header(&p)) != LOOM_OK)
        goto fail;
    if (f->n > 1) /* qsort wants a non-NULL array even when empty */
        qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
    for (int32_t i = 1; i < f->n; i++)
        if (strcmp(f->t[i - 1].name, f->t[i].name) == 0) {
            st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                                 "tensor '%.120s' appears twice in the header", f->t[i].name);
            goto fail;
        }
    if ((st = check_layout(f, err, err_size)) != LOOM_OK)
        goto fail;
    /* Loom's bools are bytes 0 or 1; anything else would make masks and selects disagree. */
    for (int32_t i = 0; whole && i < f->n; i++) {
        const st_tensor *e = &f->t[i];
        if (e->dtype != LOOM_DTYPE_BOOL)
            continue;
        for (size_t k = e->begin; k < e->end; k++)
            if (f->data[k] > 1) {
                st = loom_fe_set_err(err, err_size, LOOM_STATUS_CORRUPT_DATA,
                                     "tensor '%.120s': BOOL element %zu is %u, not 0 or 1", e->name,
                                     k - e->begin, f->data[k]);
                goto fail;
            }
    }
    *out = f;
    return LOOM_OK;
fail:
    loom_safetensors_close(f);
    return st;
}

/* Reads a regular file's first len bytes (at most its size) into memory from a; opened
 * without blocking (loom_ir_open_regular: a FIFO or device is refused). *out_file_len: the
 * file's size. */
static loom_status st_read_file(const char *path, const loom_allocator *a, size_t want,
                                uint8_t **out, size_t *out_len, size_t *out_file_len, char *err,
                                size_t err_size) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int fd;
    uint64_t size;
    if (loom_ir_open_regular(path, &fd, &size, &d) != LOOM_OK)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_IO_ERROR, "%s", d.msg);
    if (size > SIZE_MAX - 1) {
        close(fd);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY, "%s: too large to read",
                               path);
    }
    size_t len = want < (size_t)size ? want : (size_t)size;
    uint8_t *buf = loom_ir_alloc(a, len ? len : 1);
    if (!buf) {
        close(fd);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                               "%s: out of memory for %zu bytes", path, len);
    }
    loom_status st = loom_ir_pread_full(fd, buf, len, 0, path, &d);
    close(fd);
    if (st != LOOM_OK) {
        loom_ir_free(a, buf, len ? len : 1);
        return loom_fe_set_err(err, err_size, st, "%s", d.msg);
    }
    *out = buf;
    *out_len = len;
    *out_file_len = (size_t)size;
    return LOOM_OK;
}

/* The header first (the size field, then as many bytes as it claims): a file whose header
 * is damaged, or whose data area does not hold the tensors it lists, is refused before its
 * data is read; then the whole file. */
static loom_status st_open(const char *path, const loom_allocator *a, loom_safetensors **out,
                           char *err, size_t err_size) {
    uint8_t *image = NULL;
    size_t len = 0, file_len = 0;
    char inner[512];
    loom_status st = st_read_file(path, a, 8, &image, &len, &file_len, err, err_size);
    if (st == LOOM_OK && len == 8 && file_len > 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | image[i];
        loom_ir_free(a, image, len);
        image = NULL;
        size_t head = hlen <= ST_MAX_HEADER && hlen <= file_len - 8 ? 8 + (size_t)hlen : 8;
        st = st_read_file(path, a, head, &image, &len, &file_len, err, err_size);
        loom_safetensors *h = NULL;
        if (st == LOOM_OK && len < file_len) {
            st = st_parse_image(a, image, len, len ? len : 1, file_len, &h, inner, sizeof inner);
            image = NULL; /* the parse owns it */
            loom_safetensors_close(h);
            if (st != LOOM_OK)
                return loom_fe_set_err(err, err_size, st, "%s: %s", path, inner);
        }
        if (st == LOOM_OK && image == NULL)
            st = st_read_file(path, a, SIZE_MAX, &image, &len, &file_len, err, err_size);
    }
    if (st != LOOM_OK)
        return st;
    st = st_parse_image(a, image, len, len ? len : 1, file_len, out, inner, sizeof inner);
    if (st != LOOM_OK)
        loom_fe_set_err(err, err_size, st, "%s: %s", path, inner);
    return st;
}

LOOM_API loom_status loom_safetensors_parse(const void *data, size_t len, loom_safetensors **out,
                                            char *err, size_t err_size) {
    if (out)
        *out = NULL;
    if (!out || (!data && len > 0))
        return loom_fe_set_err(err, err_size, LOOM_STATUS_INVALID_ARGUMENT, "%s is NULL",
                               out ? "data" : "out");
    loom_allocator a = loom_allocator_system();
    size_t size = len ? len : 1;
    uint8_t *image = loom_ir_alloc(&a, size);
    if (!image)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                               "out of memory for %zu bytes", len);
    if (len)
        memcpy(image, data, len);
    return st_parse_image(&a, image, len, size, len, out, err, err_size);
}

LOOM_API loom_status loom_safetensors_open(const char *path, loom_safetensors **out, char *err,
                                           size_t err_size) {
    if (out)
        *out = NULL;
    if (!path || !out)
        return loom_fe_set_err(err, err_size, LOOM_STATUS_INVALID_ARGUMENT, "%s is NULL",
                               path ? "out" : "path");
    loom_allocator a = loom_allocator_system();
    return st_open(path, &a, out, err, err_size);
}

LOOM_API int32_t loom_safetensors_count(const loom_safetensors *f) {
    return f ? f->n : 0;
}

LOOM_API loom_status loom_safetensors_tensor(const loom_safetensors *f, int32_t i,
                                             const char **out_name, loom_dtype *out_dtype,
                                             int32_t *out_rank, int64_t *out_shape,
                                             const void **out_data, size_t *out_size) {
    if (!f || i < 0 || i >= f->n)
        return LOOM_STATUS_INVALID_ARGUMENT;
    const st_tensor *e = &f->t[i];
    if (out_name)
        *out_name = e->name;
    if (out_dtype)
        *out_dtype = e->dtype;
    if (out_rank)
        *out_rank = e->rank;
    if (out_shape)
        memcpy(out_shape, e->shape, (size_t)e->rank * sizeof *out_shape);
    if (out_data)
        *out_data = f->data + e->begin;
    if (out_size)
        *out_size = e->end - e->begin;
    return LOOM_OK;
}

LOOM_API int32_t loom_safetensors_find(const loom_safetensors *f, const char *name) {
    if (!f || !name)
        return -1;
    int32_t lo = 0, hi = f->n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[mid].name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

LOOM_API void loom_safetensors_close(loom_safetensors *f) {
    if (!f)
        return;
    loom_allocator a = f->alloc;
    loom_ir_free(&a, f->t, (size_t)f->cap * sizeof *f->t);
    loom_ir_free(&a, f->image, f->image_size);
    loom_ir_free(&a, f, sizeof *f);
}

/* ---- writing ----------------------------------------------------------------------------- */

typedef struct st_item {
    const char *name;
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    size_t bytes;
    size_t offset; /* in the data area, set by st_layout */
    int32_t slot;  /* save: the tensor's slot */
    loom_tensor *handle;
    const void *src; /* re-encoding: the bytes */
} st_item;

static void put_json_string(loom_ir_sbuf *sb, const char *s) {
    loom_ir_sbuf_append(sb, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        uint8_t c = (uint8_t)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        loom_ir_sbuf_append(sb, run, (size_t)(s - run));
        if (c == '"' || c == '\\')
            loom_ir_sbuf_printf(sb, "\\%c", c);
        else
            loom_ir_sbuf_printf(sb, "\\u%04x", c);
        run = s + 1;
    }
    loom_ir_sbuf_append(sb, run, (size_t)(s - run));
    loom_ir_sbuf_append(sb, "\"", 1);
}

/* Lays out items (sorted by name): sets their offsets and returns a buffer (allocated with
 * a) of the whole file's size holding the size field and the header, padded with spaces so
 * the data starts at a multiple of 8; the caller fills the data from *out_data_start.
 * The header is written as the reference writer does: compact JSON, metadata first. */
static loom_status st_layout(const loom_allocator *a, int32_t n, st_item *items, uint8_t **out,
                             size_t *out_len, size_t *out_data_start, char *err, size_t err_size) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, a);
    loom_ir_sbuf_append(&sb, "{\"__metadata__\":{\"format\":\"pt\"}", 31);
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        st_item *it = &items[i];
        if (it->bytes > SIZE_MAX / 2 - off) {
            loom_ir_sbuf_deinit(&sb);
            return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                                   "the tensors hold more bytes than fit in memory");
        }
        it->offset = off;
        loom_ir_sbuf_append(&sb, ",", 1);
        put_json_string(&sb, it->name);
        loom_ir_sbuf_printf(&sb, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_names[it->dtype]);
        for (int32_t d = 0; d < it->rank; d++)
            loom_ir_sbuf_printf(&sb, "%s%" PRId64, d ? "," : "", it->shape[d]);
        loom_ir_sbuf_printf(&sb, "],\"data_offsets\":[%zu,%zu]}", off, off + it->bytes);
        off += it->bytes;
    }
    loom_ir_sbuf_append(&sb, "}", 1);
    if (sb.oom) {
        loom_ir_sbuf_deinit(&sb);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    size_t hlen = (sb.len + 7) & ~(size_t)7;
    size_t total = 8 + hlen + off;
    uint8_t *buf = loom_ir_alloc(a, total);
    if (!buf) {
        loom_ir_sbuf_deinit(&sb);
        return loom_fe_set_err(err, err_size, LOOM_STATUS_OUT_OF_MEMORY,
                               "out of memory for %zu bytes", total);
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(buf + 8, sb.data, sb.len);
    memset(buf + 8 + sb.len, ' ', hlen - sb.len);
    loom_ir_sbuf_deinit(&sb);
    *out = buf;
    *out_len = total;
    *out_data_start = 8 + hlen;
    return LOOM_OK;
}

/* The file image that save writes for f's tensors (malloc'd): for the fuzzer's round trip. */
loom_status loom_fe_safetensors_canonical(const loom_safetensors *f, uint8_t **out,
                                          size_t *out_len);

loom_status loom_fe_safetensors_canonical(const loom_safetensors *f, uint8_t **out,
                                          size_t *out_len) {
    loom_allocator a = loom_allocator_system();
    st_item *items = f->n ? calloc((size_t)f->n, sizeof *items) : NULL;
    if (f->n && !items)
        return LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t i = 0; i < f->n; i++) {
        const st_tensor *e = &f->t[i];
        items[i] = (st_item){.name = e->name,
                             .dtype = e->dtype,
                             .rank = e->rank,
                             .bytes = e->end - e->begin,
                             .src = f->data + e->begin};
        memcpy(items[i].shape, e->shape, sizeof e->shape);
    }
    size_t start;
    loom_status st = st_layout(&a, f->n, items, out, out_len, &start, NULL, 0);
    for (int32_t i = 0; st == LOOM_OK && i < f->n; i++)
        if (items[i].bytes)
            memcpy(*out + start + items[i].offset, items[i].src, items[i].bytes);
    free(items);
    return st;
}

#ifndef LOOM_SAFETENSORS_PARSE_ONLY /* the fuzzer compiles the parser alone */

/* ---- save and load ---------------------------------------------------------------------- */

/* An inner call recorded its error under its own op name; when that is the context's first
 * error (prev: the error before the call), restate it under op with the file and tensor. */
static loom_status rewrap(loom_context *ctx, loom_status prev, loom_status st, const char *op,
                          const char *path, const char *name) {
    if (prev != LOOM_OK || ctx->err == LOOM_OK)
        return st;
    char inner[sizeof ctx->err_msg];
    memcpy(inner, ctx->err_msg, sizeof inner);
    loom_status code = ctx->err;
    ctx->err = LOOM_OK;
    if (name)
        loom_fe_error(ctx, code, NULL, 0, op, "%s: tensor '%s': %s", path, name, inner);
    else
        loom_fe_error(ctx, code, NULL, 0, op, "%s: %s", path, inner);
    return st;
}

/* *out_slot: the slot of h, a live tensor of ctx (listed as name); else records why not. */
static loom_status st_slot(loom_context *ctx, const char *op, const char *path, const char *name,
                           loom_tensor *h, int32_t *out_slot) {
    if (!h)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                             "%s: tensor '%s' is NULL", path, name);
    loom_dtype dt;
    loom_status q = loom_tensor_dtype(h, &dt);
    if (q == LOOM_OK && loom_fe_handle_context(h) != ctx)
        q = LOOM_STATUS_INVALID_ARGUMENT;
    if (q != LOOM_OK)
        return loom_fe_error(ctx, q, NULL, 0, op, "%s: tensor '%s': %s", path, name,
                             q == LOOM_STATUS_STALE_HANDLE
                                 ? "the handle is stale (the tensor died at an earlier "
                                   "mark_step or was released)"
                                 : "not a tensor handle of this context");
    loom_fe_tensor *t = loom_fe_tensor_get(ctx, h, NULL, 0, op);
    if (!t)
        return LOOM_STATUS_INVALID_ARGUMENT;
    *out_slot = (int32_t)(t - ctx->tensors);
    return LOOM_OK;
}

/* Why name cannot be written as a tensor name, or NULL. */
static const char *bad_name(const char *name) {
    if (!*name)
        return "is empty";
    if (strcmp(name, "__metadata__") == 0)
        return "is reserved for the file's metadata";
    for (const uint8_t *s = (const uint8_t *)name; *s;) {
        if (*s < 0x20 || *s == 0x7F)
            return "holds a control character";
        size_t k = *s < 0x80 ? 1 : utf8_len(s, strlen((const char *)s));
        if (k == 0)
            return "is not valid UTF-8";
        s += k;
    }
    return NULL;
}

static int cmp_item(const void *x, const void *y) {
    return strcmp(((const st_item *)x)->name, ((const st_item *)y)->name);
}

/* Computes every pending tensor among items in one graph, rather than one graph per tensor
 * as reading them one by one would (a save right after an optimizer step, say). */
static loom_status compute_pending(loom_context *ctx, int32_t n, const st_item *items) {
    loom_fe_finish_inflight(ctx); /* its failure is recorded; the reads report it */
    int32_t *slots = loom_ir_alloc(&ctx->alloc, (size_t)n * sizeof *slots);
    if (!slots)
        return LOOM_STATUS_OUT_OF_MEMORY;
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const loom_fe_tensor *t = &ctx->tensors[items[i].slot];
        if (t->node_step == ctx->step && t->node >= 0)
            slots[k++] = items[i].slot;
    }
    if (k > 1)
        qsort(slots, (size_t)k, sizeof *slots, loom_ir_cmp_i32);
    int32_t m = 0;
    for (int32_t i = 0; i < k; i++)
        if (m == 0 || slots[m - 1] != slots[i])
            slots[m++] = slots[i];
    loom_status st = LOOM_OK;
    if (m > 0) {
        loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_FORCED_READS, 1);
        st = loom_fe_compute(ctx, m, slots, false);
        if (st == LOOM_OK)
            st = loom_fe_finish_inflight(ctx);
    }
    loom_ir_free(&ctx->alloc, slots, (size_t)n * sizeof *slots);
    return st;
}

LOOM_API loom_status loom_safetensors_save(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts) {
    LOOM_FE_USE(ctx, "safetensors_save", LOOM_STATUS_BUSY);
    static const char op[] = "safetensors_save";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!path)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "path is NULL");
    if (n < 0 || (n > 0 && !ts))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s: %s", path,
                             n < 0 ? "the tensor count is negative" : "ts is NULL");
    size_t items_size = (size_t)n * sizeof(st_item);
    st_item *items = n ? loom_ir_alloc(&ctx->alloc, items_size) : NULL;
    if (n && !items)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "%s: out of memory",
                             path);
    uint8_t *file = NULL;
    size_t len = 0, start = 0;
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < n; i++) {
        const char *why = ts[i].name ? bad_name(ts[i].name) : "is NULL";
        if (why) {
            st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                               "%s: the name of tensor %d %s", path, (int)i, why);
            goto done;
        }
        int32_t slot = -1;
        if ((st = st_slot(ctx, op, path, ts[i].name, ts[i].tensor, &slot)) != LOOM_OK)
            goto done;
        const loom_fe_tensor *t = &ctx->tensors[slot];
        st_item *it = &items[i];
        memset(it, 0, sizeof *it);
        it->name = ts[i].name;
        it->dtype = t->dtype;
        it->rank = t->rank;
        memcpy(it->shape, t->shape, sizeof it->shape);
        it->bytes = (size_t)loom_ir_numel(t->rank, t->shape) * loom_dtype_size(t->dtype);
        it->slot = slot;
        it->handle = ts[i].tensor;
    }
    if (n > 1)
        qsort(items, (size_t)n, sizeof *items, cmp_item);
    for (int32_t i = 1; i < n; i++)
        if (strcmp(items[i - 1].name, items[i].name) == 0) {
            st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                               "%s: tensor '%s' is listed twice", path, items[i].name);
            goto done;
        }
    loom_status prev = ctx->err;
    if (n > 0 && (st = compute_pending(ctx, n, items)) != LOOM_OK) {
        if (st == LOOM_STATUS_OUT_OF_MEMORY && ctx->err == prev)
            loom_fe_error(ctx, st, NULL, 0, op, "%s: out of memory", path);
        else
            rewrap(ctx, prev, st, op, path, NULL);
        goto done;
    }
    char err[256];
    if ((st = st_layout(&ctx->alloc, n, items, &file, &len, &start, err, sizeof err)) != LOOM_OK) {
        loom_fe_error(ctx, st, NULL, 0, op, "%s: %s", path, err);
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        prev = ctx->err;
        st = loom_tensor_read(ctx, items[i].handle, file + start + items[i].offset, items[i].bytes);
        if (st != LOOM_OK) {
            rewrap(ctx, prev, st, op, path, items[i].name);
            goto done;
        }
    }
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if ((st = loom_ir_write_file_atomic(path, file, len, &d)) != LOOM_OK)
        loom_fe_error(ctx, st, NULL, 0, op, "%s", d.msg);
done:
    loom_ir_free(&ctx->alloc, file, len);
    loom_ir_free(&ctx->alloc, items, items_size);
    return st;
}

static int cmp_str_ptr(const void *x, const void *y) {
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* Everything load checks before it assigns anything: the listed names and handles, each
 * tensor against the file's, and (strict) that the file holds nothing unlisted. fidx[i]: the
 * file's index of ts[i]; slots[i]: its slot. */
static loom_status check_load(loom_context *ctx, const char *op, const char *path,
                              const loom_safetensors *f, int32_t n, const loom_named_tensor *ts,
                              bool strict, int32_t *fidx, int32_t *slots) {
    const loom_status inval = LOOM_STATUS_INVALID_ARGUMENT;
    for (int32_t i = 0; i < n; i++) {
        const char *name = ts[i].name;
        if ((fidx[i] = loom_safetensors_find(f, name)) < 0)
            return loom_fe_error(ctx, inval, NULL, 0, op,
                                 "%s: tensor '%s' is not in the file (it holds %d tensors)", path,
                                 name, (int)f->n);
        loom_status st = st_slot(ctx, op, path, name, ts[i].tensor, &slots[i]);
        if (st != LOOM_OK)
            return st;
        const loom_fe_tensor *t = &ctx->tensors[slots[i]];
        const st_tensor *e = &f->t[fidx[i]];
        char tf[LOOM_IR_TYPE_STR_MAX], tt[LOOM_IR_TYPE_STR_MAX];
        if (t->dtype != e->dtype || t->rank != e->rank ||
            memcmp(t->shape, e->shape, (size_t)t->rank * sizeof *t->shape) != 0)
            return loom_fe_error(ctx, inval, NULL, 0, op,
                                 "%s: tensor '%s': the file holds %s, the tensor is %s", path, name,
                                 loom_ir_format_type(tf, sizeof tf, e->dtype, e->rank, e->shape),
                                 loom_ir_format_type(tt, sizeof tt, t->dtype, t->rank, t->shape));
        if (t->step_owned)
            return loom_fe_error(ctx, inval, NULL, 0, op,
                                 "%s: tensor '%s' is a result of this step; load into a "
                                 "long-lived tensor",
                                 path, name);
    }
    if (!strict)
        return LOOM_OK;
    bool *listed = f->n ? loom_ir_alloc(&ctx->alloc, (size_t)f->n) : NULL;
    if (f->n && !listed)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "%s: out of memory",
                             path);
    memset(listed, 0, (size_t)f->n);
    for (int32_t i = 0; i < n; i++)
        listed[fidx[i]] = true;
    char names[256] = "";
    size_t k = 0;
    int32_t extra = 0;
    for (int32_t j = 0; j < f->n; j++) {
        if (listed[j])
            continue;
        if (extra < 3 && k < sizeof names)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s'%.60s'", extra ? ", " : "",
                                  f->t[j].name);
        extra++;
    }
    loom_ir_free(&ctx->alloc, listed, (size_t)f->n);
    if (extra == 0)
        return LOOM_OK;
    return loom_fe_error(ctx, inval, NULL, 0, op,
                         "%s: strict: %d tensor%s in the file %s not listed: %s%s", path,
                         (int)extra, extra == 1 ? "" : "s", extra == 1 ? "is" : "are", names,
                         extra > 3 ? ", ..." : "");
}

LOOM_API loom_status loom_safetensors_load(loom_context *ctx, const char *path, int32_t n,
                                           const loom_named_tensor *ts, bool strict) {
    LOOM_FE_USE(ctx, "safetensors_load", LOOM_STATUS_BUSY);
    static const char op[] = "safetensors_load";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!path)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "path is NULL");
    if (n < 0 || (n > 0 && !ts))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s: %s", path,
                             n < 0 ? "the tensor count is negative" : "ts is NULL");
    for (int32_t i = 0; i < n; i++)
        if (!ts[i].name)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                                 "%s: the name of tensor %d is NULL", path, (int)i);
    /* One scratch block: names (to find duplicates), file indices, slots, temporaries. */
    size_t scratch_size =
        (size_t)n * (sizeof(const char *) + 2 * sizeof(int32_t) + sizeof(loom_tensor *));
    void *scratch = n ? loom_ir_alloc(&ctx->alloc, scratch_size) : NULL;
    if (n && !scratch)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "%s: out of memory",
                             path);
    const char **names = NULL;
    loom_tensor **tmps = NULL;
    int32_t *fidx = NULL, *slots = NULL;
    if (n > 0) {
        names = scratch;
        tmps = (loom_tensor **)(names + n);
        fidx = (int32_t *)(tmps + n);
        slots = fidx + n;
    }
    loom_safetensors *f = NULL;
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < n; i++) {
        names[i] = ts[i].name;
        tmps[i] = NULL;
    }
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int32_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                               "%s: tensor '%s' is listed twice", path, names[i]);
            goto done;
        }
    char err[600];
    if ((st = st_open(path, &ctx->alloc, &f, err, sizeof err)) != LOOM_OK) {
        loom_fe_error(ctx, st, NULL, 0, op, "%s", err);
        goto done;
    }
    if ((st = check_load(ctx, op, path, f, n, ts, strict, fidx, slots)) != LOOM_OK)
        goto done;
    /* All device copies first: they are what can run out of memory, and until they exist
     * nothing has been assigned. */
    for (int32_t i = 0; i < n; i++) {
        const st_tensor *e = &f->t[fidx[i]];
        loom_status prev = ctx->err;
        tmps[i] =
            loom_tensor_from_host_at(ctx, e->dtype, e->rank, e->shape, f->data + e->begin, NULL, 0);
        if (!tmps[i]) {
            st = prev == LOOM_OK && ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_OUT_OF_MEMORY;
            rewrap(ctx, prev, st, op, path, e->name);
            goto done;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        loom_status prev = ctx->err;
        if ((st = loom_assign_at(ctx, ts[i].tensor, tmps[i], NULL, 0)) != LOOM_OK) {
            rewrap(ctx, prev, st, op, path, ts[i].name);
            goto done;
        }
    }
done:
    for (int32_t i = 0; i < n; i++)
        loom_tensor_release(tmps ? tmps[i] : NULL);
    loom_safetensors_close(f);
    loom_ir_free(&ctx->alloc, scratch, scratch_size);
    return st;
}

#endif /* LOOM_SAFETENSORS_PARSE_ONLY */
