/* The IR text parser: a hand-written lexer and recursive-descent parser for the format
 * printed by print.c. It reads (text, len) without ever looking past len, so it survives
 * arbitrary bytes (it is fuzzed), and every error names the line and column it is at. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* ---- tokens ------------------------------------------------------------------------------ */

typedef enum tok_kind {
    TOK_EOF,
    TOK_ERROR,  /* a lexical error, already reported */
    TOK_IDENT,  /* letters, digits, '_', '.': op names, dtypes, keywords */
    TOK_NAME,   /* %name */
    TOK_NUMBER, /* unsigned decimal: 12, 0.5, 1e-3 (the sign is a TOK_MINUS) */
    TOK_STRING, /* "..." including the quotes, escapes not yet decoded */
    TOK_LBRACE,
    TOK_RBRACE,
    TOK_LBRACKET,
    TOK_RBRACKET,
    TOK_LPAREN,
    TOK_RPAREN,
    TOK_COMMA,
    TOK_COLON,
    TOK_EQUAL,
    TOK_MINUS,
    TOK_COUNT_
} tok_kind;

typedef struct token {
    tok_kind kind;
    const char *s; /* into the text */
    size_t len;
    int32_t line, col;
    bool is_int; /* TOK_NUMBER without '.' or exponent */
} token;

/* A %name -> node id table (open addressing). Keys point into the text being parsed. */
typedef struct name_entry {
    const char *s; /* NULL: empty slot */
    size_t len;
    int32_t id;
} name_entry;

typedef struct parser {
    const char *text;
    size_t len, pos;
    int32_t line;
    size_t line_start;
    token tok; /* the lookahead */
    loom_ir_graph *g;
    const loom_allocator *a;
    loom_ir_diag *d;
    loom_status st;
    name_entry *names;
    size_t names_cap, names_count;
    int32_t *operands;
    int32_t operands_cap;
    char *scratch; /* the decoded location's file name */
    int32_t scratch_cap;
    char *scope; /* and its scope */
    int32_t scope_cap;
} parser;

static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_name_char(int c) { return is_alpha(c) || is_digit(c) || c == '.'; }

static int peek_at(const parser *p, size_t i) {
    return p->pos + i < p->len ? (unsigned char)p->text[p->pos + i] : -1;
}

/* ---- errors ------------------------------------------------------------------------------ */

/* Records the first error of the parse at (line, col). */
__attribute__((format(printf, 4, 5)))
static bool fail_at(parser *p, int32_t line, int32_t col, const char *fmt, ...) {
    if (p->st == LOOM_OK) {
        p->st = LOOM_STATUS_PARSE_ERROR;
        if (p->d->code == LOOM_OK) {
            p->d->line = line;
            p->d->col = col;
        }
        va_list ap;
        va_start(ap, fmt);
        loom_ir_diag_vset(p->d, LOOM_STATUS_PARSE_ERROR, fmt, ap);
        va_end(ap);
    }
    return false;
}

#define fail_tok(p, t, ...) fail_at((p), (t)->line, (t)->col, __VA_ARGS__)

static bool fail_oom(parser *p, const char *what) {
    if (p->st == LOOM_OK) {
        p->st = LOOM_STATUS_OUT_OF_MEMORY;
        loom_ir_diag_set(p->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory parsing %s", what);
    }
    return false;
}

/* The token as it appears in a message: quoted, shortened, non-printable bytes as '?'. */
static const char *describe(const token *t, char *buf, size_t size) {
    if (t->kind == TOK_EOF)
        return "end of input";
    size_t max = size - 6, n = 0;
    buf[n++] = '\'';
    for (size_t i = 0; i < t->len && n < max; i++) {
        unsigned char c = (unsigned char)t->s[i];
        buf[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (t->len > max - 1) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n++] = '\'';
    buf[n] = '\0';
    return buf;
}

#define DESC_MAX 48

/* ---- lexer ------------------------------------------------------------------------------- */

static int32_t clamp_i32(size_t v) { return v > INT32_MAX ? INT32_MAX : (int32_t)v; }

static void lex(parser *p) {
    for (;;) { /* whitespace and // comments */
        int c = peek_at(p, 0);
        if (c == '\n') {
            p->pos++;
            if (p->line < INT32_MAX)
                p->line++;
            p->line_start = p->pos;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
            p->pos++;
        } else if (c == '/' && peek_at(p, 1) == '/') {
            while (p->pos < p->len && p->text[p->pos] != '\n')
                p->pos++;
        } else {
            break;
        }
    }
    token *t = &p->tok;
    t->s = p->text + p->pos;
    t->line = p->line;
    t->col = clamp_i32(p->pos - p->line_start + 1);
    t->is_int = false;
    size_t start = p->pos;
    int c = peek_at(p, 0);
    if (c < 0) {
        t->kind = TOK_EOF;
        t->len = 0;
        return;
    }
    if (is_alpha(c)) {
        while (is_name_char(peek_at(p, 0)))
            p->pos++;
        t->kind = TOK_IDENT;
    } else if (c == '%') {
        p->pos++;
        while (is_name_char(peek_at(p, 0)))
            p->pos++;
        t->kind = TOK_NAME;
        if (p->pos - start == 1) {
            t->len = 1;
            t->kind = TOK_ERROR;
            fail_tok(p, t, "expected a value name after '%%'");
            return;
        }
    } else if (is_digit(c)) {
        t->is_int = true;
        while (is_digit(peek_at(p, 0)))
            p->pos++;
        if (peek_at(p, 0) == '.') {
            t->is_int = false;
            p->pos++;
            while (is_digit(peek_at(p, 0)))
                p->pos++;
        }
        int e = peek_at(p, 0), s1 = peek_at(p, 1), s2 = peek_at(p, 2);
        if ((e == 'e' || e == 'E') &&
            (is_digit(s1) || ((s1 == '+' || s1 == '-') && is_digit(s2)))) {
            t->is_int = false;
            p->pos += 2;
            while (is_digit(peek_at(p, 0)))
                p->pos++;
        }
        t->kind = TOK_NUMBER;
        if (is_name_char(peek_at(p, 0))) { /* 12abc, 1.2.3, 0x10 */
            while (is_name_char(peek_at(p, 0)))
                p->pos++;
            t->len = p->pos - start;
            t->kind = TOK_ERROR;
            char b[DESC_MAX];
            fail_tok(p, t, "malformed number %s", describe(t, b, sizeof b));
            return;
        }
    } else if (c == '"') {
        p->pos++;
        for (;;) {
            int ch = peek_at(p, 0);
            if (ch < 0 || ch == '\n') {
                t->len = 1;
                t->kind = TOK_ERROR;
                fail_tok(p, t, "unterminated string");
                return;
            }
            p->pos++;
            if (ch == '"')
                break;
            if (ch == '\\' && peek_at(p, 0) >= 0 && peek_at(p, 0) != '\n')
                p->pos++; /* the escaped byte; decode_string checks it */
        }
        t->kind = TOK_STRING;
    } else {
        static const char punct[] = "{}[](),:=-";
        static const tok_kind kinds[] = {TOK_LBRACE, TOK_RBRACE, TOK_LBRACKET, TOK_RBRACKET,
                                         TOK_LPAREN, TOK_RPAREN, TOK_COMMA,    TOK_COLON,
                                         TOK_EQUAL,  TOK_MINUS};
        const char *hit = c ? strchr(punct, c) : NULL;
        p->pos++;
        t->len = 1;
        if (!hit) {
            t->kind = TOK_ERROR;
            if (c >= 0x20 && c < 0x7f)
                fail_tok(p, t, "unexpected character '%c'", c);
            else
                fail_tok(p, t, "unexpected byte 0x%02x", (unsigned)c);
            return;
        }
        t->kind = kinds[hit - punct];
    }
    t->len = p->pos - start;
}

/* ---- parser helpers ---------------------------------------------------------------------- */

static bool tok_is(const token *t, const char *ident) {
    size_t n = strlen(ident);
    return t->kind == TOK_IDENT && t->len == n && memcmp(t->s, ident, n) == 0;
}

/* Consumes a token of `kind`, or fails with "expected <what>, got <token>". */
static bool expect(parser *p, tok_kind kind, const char *what) {
    if (p->tok.kind != kind) {
        char b[DESC_MAX];
        return fail_tok(p, &p->tok, "expected %s, got %s", what, describe(&p->tok, b, sizeof b));
    }
    lex(p);
    return true;
}

/* A non-negative decimal integer in 0..max. */
static bool parse_int(parser *p, int64_t max, const char *what, int64_t *out) {
    token t = p->tok;
    char b[DESC_MAX];
    if (t.kind != TOK_NUMBER || !t.is_int)
        return fail_tok(p, &t, "expected %s, got %s", what, describe(&t, b, sizeof b));
    int64_t v = 0;
    for (size_t i = 0; i < t.len; i++) {
        int digit = t.s[i] - '0';
        if (v > (INT64_MAX - digit) / 10)
            return fail_tok(p, &t, "integer %s is too large", describe(&t, b, sizeof b));
        v = v * 10 + digit;
    }
    if (v > max)
        return fail_tok(p, &t, "%lld is out of range for %s (0..%lld)", (long long)v, what,
                        (long long)max);
    *out = v;
    lex(p);
    return true;
}

/* ['-'] (number | inf | nan) */
static bool parse_double(parser *p, double *out) {
    bool neg = false;
    if (p->tok.kind == TOK_MINUS) {
        neg = true;
        lex(p);
    }
    token t = p->tok;
    char b[DESC_MAX];
    double v;
    if (tok_is(&t, "inf")) {
        v = INFINITY;
    } else if (tok_is(&t, "nan")) {
        v = NAN;
    } else if (t.kind == TOK_NUMBER) {
        char num[64];
        if (t.len >= sizeof num)
            return fail_tok(p, &t, "number %s is too long", describe(&t, b, sizeof b));
        memcpy(num, t.s, t.len);
        num[t.len] = '\0';
        char *end;
        v = strtod(num, &end);
        /* ERANGE also flags subnormal results, which are valid values: only reject
         * overflow (spell infinities "inf"). */
        if (*end != '\0' || isinf(v))
            return fail_tok(p, &t, "number %s is out of range", describe(&t, b, sizeof b));
    } else {
        return fail_tok(p, &t, "expected a number, got %s", describe(&t, b, sizeof b));
    }
    *out = neg ? -v : v;
    lex(p);
    return true;
}

/* dtype '[' extent (',' extent)* ']' */
static bool parse_type(parser *p, loom_dtype *dt, int32_t *rank, int64_t *shape) {
    token t = p->tok;
    char b[DESC_MAX];
    if (t.kind != TOK_IDENT)
        return fail_tok(p, &t, "expected a type such as f32[2,3], got %s",
                        describe(&t, b, sizeof b));
    *dt = loom_ir_dtype_from_name(t.s, t.len);
    if (*dt == LOOM_DTYPE_COUNT_)
        return fail_tok(p, &t, "unknown dtype %s", describe(&t, b, sizeof b));
    lex(p);
    if (!expect(p, TOK_LBRACKET, "'[' after the dtype"))
        return false;
    *rank = 0;
    if (p->tok.kind == TOK_RBRACKET) {
        lex(p);
        return true;
    }
    for (;;) {
        if (*rank == LOOM_MAX_RANK)
            return fail_tok(p, &p->tok, "rank exceeds the maximum of %d", LOOM_MAX_RANK);
        if (!parse_int(p, INT64_MAX, "an extent", &shape[*rank]))
            return false;
        (*rank)++;
        if (p->tok.kind != TOK_COMMA)
            break;
        lex(p);
    }
    return expect(p, TOK_RBRACKET, "',' or ']' in the shape");
}

/* '[' int (',' int)* ']' of integers in [0, max] into out (at most LOOM_MAX_RANK entries);
 * elem names one entry in errors ("an axis"). */
static bool parse_bounded_list(parser *p, const char *what, const char *elem, int64_t max,
                               int64_t *out, int32_t *n) {
    if (!expect(p, TOK_LBRACKET, "'['"))
        return false;
    *n = 0;
    if (p->tok.kind == TOK_RBRACKET) {
        lex(p);
        return true;
    }
    for (;;) {
        if (*n == LOOM_MAX_RANK)
            return fail_tok(p, &p->tok, "%s has more than %d entries", what, LOOM_MAX_RANK);
        if (!parse_int(p, max, elem, &out[*n]))
            return false;
        (*n)++;
        if (p->tok.kind != TOK_COMMA)
            break;
        lex(p);
    }
    return expect(p, TOK_RBRACKET, "',' or ']'");
}

/* A list of axes (each < LOOM_MAX_RANK) into out. */
static bool parse_axis_list(parser *p, const char *what, int32_t *out, int32_t *n) {
    int64_t v[LOOM_MAX_RANK];
    if (!parse_bounded_list(p, what, "an axis", LOOM_MAX_RANK - 1, v, n))
        return false;
    for (int32_t i = 0; i < *n; i++)
        out[i] = (int32_t)v[i];
    return true;
}

/* ---- %name table --------------------------------------------------------------------------- */

static size_t name_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return (size_t)(h ^ (h >> 32));
}

/* The slot holding name, or the empty slot where it would go. The table is never full. */
static name_entry *name_slot(name_entry *tab, size_t cap, const char *s, size_t len) {
    size_t i = name_hash(s, len) & (cap - 1);
    while (tab[i].s && !(tab[i].len == len && memcmp(tab[i].s, s, len) == 0))
        i = (i + 1) & (cap - 1);
    return &tab[i];
}

/* The node id of a %name token, or -1 when it is not defined. */
static int32_t name_lookup(const parser *p, const token *t) {
    if (!p->names)
        return -1;
    name_entry *e = name_slot(p->names, p->names_cap, t->s + 1, t->len - 1);
    return e->s ? e->id : -1;
}

static bool name_insert(parser *p, const token *t, int32_t id) {
    if ((p->names_count + 1) * 2 > p->names_cap) {
        size_t ncap = p->names_cap ? p->names_cap * 2 : 64;
        name_entry *tab = loom_ir_alloc(p->a, ncap * sizeof *tab);
        if (!tab)
            return fail_oom(p, "value names");
        memset(tab, 0, ncap * sizeof *tab);
        for (size_t i = 0; i < p->names_cap; i++)
            if (p->names[i].s)
                *name_slot(tab, ncap, p->names[i].s, p->names[i].len) = p->names[i];
        loom_ir_free(p->a, p->names, p->names_cap * sizeof *p->names);
        p->names = tab;
        p->names_cap = ncap;
    }
    *name_slot(p->names, p->names_cap, t->s + 1, t->len - 1) =
        (name_entry){.s = t->s + 1, .len = t->len - 1, .id = id};
    p->names_count++;
    return true;
}

/* The node named by the current %name token, consumed. */
static bool parse_use(parser *p, int32_t *out_id) {
    char b[DESC_MAX];
    if (p->tok.kind != TOK_NAME)
        return fail_tok(p, &p->tok, "expected a value such as %%0, got %s",
                        describe(&p->tok, b, sizeof b));
    *out_id = name_lookup(p, &p->tok);
    if (*out_id < 0)
        return fail_tok(p, &p->tok, "undefined value %s", describe(&p->tok, b, sizeof b));
    lex(p);
    return true;
}

/* ---- statements ---------------------------------------------------------------------------- */

typedef enum attr_id {
    ATTR_INDEX,
    ATTR_VALUE,
    ATTR_PERM,
    ATTR_AXES,
    ATTR_KEEPDIM,
    ATTR_START,    /* slice */
    ATTR_STRIDE,   /* slice */
    ATTR_LOW,      /* pad */
    ATTR_INTERIOR, /* pad */
    ATTR_AXIS,     /* concat, iota */
    ATTR_AUTOCAST, /* every op */
    ATTR_REDUCE,   /* all_reduce */
    ATTR_SCALE,    /* all_reduce */
    ATTR_ROOT,     /* broadcast_from */
    ATTR_WORLD,    /* all_gather */
    ATTR_STRIDES,  /* conv: two entries (slice's stride has one per axis) */
    ATTR_PADDING,  /* conv */
    ATTR_DILATION, /* conv */
    ATTR_GROUPS,   /* conv */
    ATTR_KERNEL,   /* max_pool2d */
    ATTR_CAUSAL,   /* attention */
    ATTR_DROPOUT,  /* attention, optional */
    ATTR_COUNT_
} attr_id;
static const char *const attr_names[ATTR_COUNT_] = {
    "index",    "value",    "perm",     "axes",   "keepdim", "start",  "stride", "low",
    "interior", "axis",     "autocast", "reduce", "scale",   "root",   "world",  "stride",
    "padding",  "dilation", "groups",   "kernel", "causal",  "dropout"};

typedef struct parsed_attrs {
    loom_ir_attrs attrs;
    bool have[ATTR_COUNT_];
    int32_t perm_len;
    token perm_tok;
    int32_t list_len[2]; /* entries of start/low and stride/interior */
    token list_tok[2];
} parsed_attrs;

/* A list of non-negative int64 into out (at most LOOM_MAX_RANK entries). */
static bool parse_int_list(parser *p, const char *what, int64_t *out, int32_t *n) {
    return parse_bounded_list(p, what, what, INT64_MAX, out, n);
}

/* Which attributes an op's attribute kind consists of. */
static int attr_set(loom_ir_attrs_kind k, attr_id *ids) {
    switch (k) {
    case LOOM_IR_ATTRS_NONE: return 0;
    case LOOM_IR_ATTRS_INDEX: ids[0] = ATTR_INDEX; return 1;
    case LOOM_IR_ATTRS_VALUE: ids[0] = ATTR_VALUE; return 1;
    case LOOM_IR_ATTRS_PERM: ids[0] = ATTR_PERM; return 1;
    case LOOM_IR_ATTRS_AXES:
        ids[0] = ATTR_AXES;
        ids[1] = ATTR_KEEPDIM;
        return 2;
    case LOOM_IR_ATTRS_SLICE:
        ids[0] = ATTR_START;
        ids[1] = ATTR_STRIDE;
        return 2;
    case LOOM_IR_ATTRS_PAD:
        ids[0] = ATTR_LOW;
        ids[1] = ATTR_INTERIOR;
        ids[2] = ATTR_VALUE;
        return 3;
    case LOOM_IR_ATTRS_AXIS: ids[0] = ATTR_AXIS; return 1;
    case LOOM_IR_ATTRS_REDUCE:
        ids[0] = ATTR_REDUCE;
        ids[1] = ATTR_SCALE;
        return 2;
    case LOOM_IR_ATTRS_ATTENTION:
        ids[0] = ATTR_CAUSAL;
        ids[1] = ATTR_SCALE;
        return 2;
    case LOOM_IR_ATTRS_ROOT: ids[0] = ATTR_ROOT; return 1;
    case LOOM_IR_ATTRS_WORLD: ids[0] = ATTR_WORLD; return 1;
    case LOOM_IR_ATTRS_CONV:
        ids[0] = ATTR_STRIDES;
        ids[1] = ATTR_PADDING;
        ids[2] = ATTR_DILATION;
        ids[3] = ATTR_GROUPS;
        return 4;
    case LOOM_IR_ATTRS_POOL:
        ids[0] = ATTR_KERNEL;
        ids[1] = ATTR_STRIDES;
        ids[2] = ATTR_PADDING;
        ids[3] = ATTR_DILATION;
        return 4;
    case LOOM_IR_ATTRS_COUNT_: break;
    }
    return 0;
}

/* '{' name '=' value (',' name '=' value)* '}' */
static bool parse_attrs(parser *p, loom_ir_op op, parsed_attrs *pa) {
    const char *opname = loom_ir_op_name(op);
    attr_id ids[5];
    int n_ids = attr_set(loom_ir_op_table[op].attrs, ids);
    char b[DESC_MAX];
    ids[n_ids++] = ATTR_AUTOCAST; /* any op may carry an autocast tag */
    if (loom_ir_op_table[op].attrs == LOOM_IR_ATTRS_ATTENTION)
        ids[n_ids++] = ATTR_DROPOUT; /* 0 where absent */
    lex(p); /* '{' */
    for (;;) {
        token t = p->tok;
        if (t.kind != TOK_IDENT)
            return fail_tok(p, &t, "expected an attribute name, got %s",
                            describe(&t, b, sizeof b));
        attr_id id = ATTR_COUNT_;
        for (int k = 0; k < n_ids; k++)
            if (tok_is(&t, attr_names[ids[k]]))
                id = ids[k];
        if (id == ATTR_COUNT_)
            return fail_tok(p, &t, "unknown attribute %s for %s", describe(&t, b, sizeof b),
                            opname);
        if (pa->have[id])
            return fail_tok(p, &t, "attribute '%s' is given twice", attr_names[id]);
        pa->have[id] = true;
        lex(p);
        if (!expect(p, TOK_EQUAL, "'=' after the attribute name"))
            return false;
        int64_t v;
        int32_t list[LOOM_MAX_RANK], n;
        switch (id) {
        case ATTR_INDEX:
            if (!parse_int(p, INT32_MAX, "an input index", &v))
                return false;
            pa->attrs.index = v;
            break;
        case ATTR_VALUE:
            if (!parse_double(p, &pa->attrs.value))
                return false;
            break;
        case ATTR_PERM:
            pa->perm_tok = p->tok;
            if (!parse_axis_list(p, "perm", list, &n))
                return false;
            memcpy(pa->attrs.perm, list, (size_t)n * sizeof list[0]);
            pa->perm_len = n;
            break;
        case ATTR_AXES: {
            token at = p->tok;
            if (!parse_axis_list(p, "axes", list, &n))
                return false;
            for (int32_t k = 0; k < n; k++) {
                if (pa->attrs.axes & (1u << list[k]))
                    return fail_tok(p, &at, "axis %d is listed twice", (int)list[k]);
                pa->attrs.axes |= 1u << list[k];
            }
            break;
        }
        case ATTR_KEEPDIM:
        case ATTR_CAUSAL:
            if (tok_is(&p->tok, "true") || tok_is(&p->tok, "false")) {
                bool on = tok_is(&p->tok, "true");
                if (id == ATTR_KEEPDIM)
                    pa->attrs.keepdim = on;
                else
                    pa->attrs.index = on;
            } else
                return fail_tok(p, &p->tok, "expected true or false, got %s",
                                describe(&p->tok, b, sizeof b));
            lex(p);
            break;
        case ATTR_START:
        case ATTR_LOW:
            pa->list_tok[0] = p->tok;
            if (!parse_int_list(p, attr_names[id], pa->attrs.start, &pa->list_len[0]))
                return false;
            break;
        case ATTR_STRIDE:
        case ATTR_INTERIOR:
            pa->list_tok[1] = p->tok;
            if (!parse_int_list(p, attr_names[id], pa->attrs.step, &pa->list_len[1]))
                return false;
            break;
        case ATTR_AXIS:
            if (!parse_int(p, LOOM_MAX_RANK - 1, "an axis", &v))
                return false;
            pa->attrs.index = v;
            break;
        case ATTR_REDUCE: {
            int64_t r = LOOM_REDUCE_COUNT_;
            for (int64_t k = 0; k < LOOM_REDUCE_COUNT_ && p->tok.kind == TOK_IDENT; k++)
                if (tok_is(&p->tok, loom_ir_reduce_op_name(k)))
                    r = k;
            if (r == LOOM_REDUCE_COUNT_)
                return fail_tok(p, &p->tok, "expected sum, max or min as the reduce op, got %s",
                                describe(&p->tok, b, sizeof b));
            pa->attrs.index = r;
            lex(p);
            break;
        }
        case ATTR_SCALE:
            if (!parse_double(p, &pa->attrs.value))
                return false;
            break;
        case ATTR_DROPOUT:
            if (!parse_double(p, &pa->attrs.dropout))
                return false;
            break;
        case ATTR_ROOT:
            if (!parse_int(p, INT32_MAX, "a root rank", &v))
                return false;
            pa->attrs.index = v;
            break;
        case ATTR_WORLD:
            if (!parse_int(p, INT32_MAX, "a world size", &v))
                return false;
            pa->attrs.index = v;
            break;
        case ATTR_KERNEL:
        case ATTR_STRIDES:
        case ATTR_PADDING:
        case ATTR_DILATION: {
            int64_t *dst = id == ATTR_KERNEL    ? pa->attrs.conv.kernel
                           : id == ATTR_STRIDES ? pa->attrs.conv.stride
                           : id == ATTR_PADDING ? pa->attrs.conv.padding
                                                : pa->attrs.conv.dilation;
            int64_t pair[LOOM_MAX_RANK];
            token at = p->tok;
            if (!parse_bounded_list(p, attr_names[id], attr_names[id], INT32_MAX, pair, &n))
                return false;
            if (n != 2)
                return fail_tok(p, &at, "%s has %d entries; a 2-D window needs [h, w]",
                                attr_names[id], (int)n);
            dst[0] = pair[0];
            dst[1] = pair[1];
            break;
        }
        case ATTR_GROUPS:
            if (!parse_int(p, INT32_MAX, "a group count", &v))
                return false;
            pa->attrs.conv.groups = v;
            break;
        case ATTR_AUTOCAST: {
            loom_dtype dt = p->tok.kind == TOK_IDENT ? loom_ir_dtype_from_name(p->tok.s, p->tok.len)
                                                     : LOOM_DTYPE_COUNT_;
            if (dt != LOOM_DTYPE_BF16 && dt != LOOM_DTYPE_F16)
                return fail_tok(p, &p->tok, "expected bf16 or f16 as the autocast dtype, got %s",
                                describe(&p->tok, b, sizeof b));
            pa->attrs.autocast = dt;
            lex(p);
            break;
        }
        case ATTR_COUNT_: return false; /* excluded above */
        }
        if (p->tok.kind != TOK_COMMA)
            break;
        lex(p);
    }
    return expect(p, TOK_RBRACE, "',' or '}' after the attribute");
}

/* The quoted string at the current token (what: "file name", "scope") decoded into *buf
 * (grown in p's allocator, capacity *cap); the token is not consumed. */
static bool decode_string(parser *p, const char *what, char **buf, int32_t *cap) {
    token t = p->tok;
    char b[DESC_MAX];
    if (t.kind != TOK_STRING)
        return fail_tok(p, &t, "expected a quoted %s, got %s", what, describe(&t, b, sizeof b));
    if (t.len + 1 > INT32_MAX)
        return fail_tok(p, &t, "%s is too long", what);
    if (!loom_ir_grow(p->a, (void **)buf, cap, (int32_t)t.len, sizeof **buf))
        return fail_oom(p, "a location");
    size_t n = 0;
    for (size_t i = 1; i + 1 < t.len; i++) {
        unsigned char c = (unsigned char)t.s[i];
        int32_t col = clamp_i32((size_t)t.col + i);
        if (c == '\\') {
            unsigned char e = (unsigned char)t.s[i + 1]; /* the lexer kept escapes whole */
            if (e == '"' || e == '\\') {
                (*buf)[n++] = (char)e;
                i++;
                continue;
            }
            if (e == 'x' && i + 3 < t.len) {
                int v = 0, k;
                for (k = 2; k < 4; k++) {
                    int h = t.s[i + (size_t)k];
                    int d = is_digit(h) ? h - '0'
                            : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                     : -1;
                    if (d < 0)
                        break;
                    v = v * 16 + d;
                }
                if (k == 4) {
                    if (v == 0)
                        return fail_at(p, t.line, col, "%s contains a NUL byte", what);
                    (*buf)[n++] = (char)v;
                    i += 3;
                    continue;
                }
            }
            if (e >= 0x20 && e < 0x7f)
                return fail_at(p, t.line, col,
                               "bad escape '\\%c' in string (use \\\", \\\\ or \\xHH)", e);
            return fail_at(p, t.line, col, "bad escape in string (use \\\", \\\\ or \\xHH)");
        }
        if (c < 0x20 || c == 0x7f)
            return fail_at(p, t.line, col, "control byte 0x%02x in string (escape it as \\xHH)",
                           (unsigned)c);
        (*buf)[n++] = (char)c;
    }
    (*buf)[n] = '\0';
    return true;
}

/* loc '(' [string ':' line] {',' (scope '=' string | backward)} ')': the file decoded into
 * p->scratch, the scope into p->scope. */
static bool parse_loc(parser *p, loom_ir_loc *loc) {
    lex(p); /* loc */
    if (!expect(p, TOK_LPAREN, "'(' after loc"))
        return false;
    bool first = true;
    if (p->tok.kind == TOK_STRING) {
        if (!decode_string(p, "file name", &p->scratch, &p->scratch_cap))
            return false;
        loc->file = p->scratch;
        lex(p);
        if (!expect(p, TOK_COLON, "':' and a line number"))
            return false;
        int64_t line;
        if (!parse_int(p, INT32_MAX, "a line number", &line))
            return false;
        loc->line = (int32_t)line;
        first = false;
    }
    while (p->tok.kind != TOK_RPAREN) {
        if (!first && !expect(p, TOK_COMMA, "',' or ')' in loc"))
            return false;
        first = false;
        token t = p->tok;
        if (tok_is(&t, "scope") && !loc->scope) {
            lex(p);
            if (!expect(p, TOK_EQUAL, "'=' after scope"))
                return false;
            if (!decode_string(p, "scope", &p->scope, &p->scope_cap))
                return false;
            loc->scope = p->scope;
            lex(p);
        } else if (tok_is(&t, "backward") && !loc->backward) {
            loc->backward = true;
            lex(p);
        } else {
            char b[DESC_MAX];
            return fail_tok(p, &t,
                            "expected a quoted file name, scope = \"...\" or backward (each "
                            "once) in loc, got %s",
                            describe(&t, b, sizeof b));
        }
    }
    return expect(p, TOK_RPAREN, "')' after the location");
}

/* %name '=' op [operands] [attrs] ':' type [loc] */
static bool parse_node(parser *p) {
    char b[DESC_MAX];
    token name = p->tok;
    if (name_lookup(p, &name) >= 0)
        return fail_tok(p, &name, "value %s is defined twice", describe(&name, b, sizeof b));
    lex(p);
    if (!expect(p, TOK_EQUAL, "'=' after the value name"))
        return false;
    token optok = p->tok;
    if (optok.kind != TOK_IDENT)
        return fail_tok(p, &optok, "expected an op name, got %s", describe(&optok, b, sizeof b));
    loom_ir_op op = loom_ir_op_from_name(optok.s, optok.len);
    if (op == LOOM_IR_OP_COUNT_)
        return fail_tok(p, &optok, "unknown op %s", describe(&optok, b, sizeof b));
    lex(p);

    int32_t n_ops = 0;
    if (p->tok.kind == TOK_NAME) {
        for (;;) {
            if (!loom_ir_grow(p->a, (void **)&p->operands, &p->operands_cap, n_ops + 1,
                              sizeof *p->operands))
                return fail_oom(p, "operands");
            if (!parse_use(p, &p->operands[n_ops]))
                return false;
            n_ops++;
            if (p->tok.kind != TOK_COMMA)
                break;
            lex(p);
        }
    }

    parsed_attrs pa = {.attrs = {.index = 0}};
    if (p->tok.kind == TOK_LBRACE && !parse_attrs(p, op, &pa))
        return false;
    attr_id ids[4];
    int n_ids = attr_set(loom_ir_op_table[op].attrs, ids);
    for (int k = 0; k < n_ids; k++)
        if (!pa.have[ids[k]])
            return fail_tok(p, &optok, "%s needs attribute '%s'", loom_ir_op_name(op),
                            attr_names[ids[k]]);

    if (!expect(p, TOK_COLON, "':' and the result type"))
        return false;
    token typetok = p->tok;
    loom_dtype dt = LOOM_DTYPE_F32;
    int32_t rank = 0;
    int64_t shape[LOOM_MAX_RANK];
    if (!parse_type(p, &dt, &rank, shape))
        return false;
    loom_ir_loc loc = {0};
    if (tok_is(&p->tok, "loc") && !parse_loc(p, &loc))
        return false;

    /* The printer writes one perm entry per operand axis; anything else is malformed text
     * that would otherwise be silently truncated or zero-filled. */
    if (pa.have[ATTR_PERM] && n_ops >= 1 && pa.perm_len != p->g->nodes[p->operands[0]].rank)
        return fail_tok(p, &pa.perm_tok, "perm has %d entries, but the operand has rank %d",
                        (int)pa.perm_len, (int)p->g->nodes[p->operands[0]].rank);
    for (int l = 0; l < 2; l++) {
        attr_id which = l == 0 ? ATTR_START : ATTR_STRIDE;
        if (!pa.have[which] && !pa.have[which + 2]) /* start/stride or low/interior */
            continue;
        const char *what = attr_names[pa.have[which] ? which : which + 2];
        if (n_ops >= 1 && pa.list_len[l] != p->g->nodes[p->operands[0]].rank)
            return fail_tok(p, &pa.list_tok[l], "%s has %d entries, but the operand has rank %d",
                            what, (int)pa.list_len[l], (int)p->g->nodes[p->operands[0]].rank);
    }

    loom_ir_node_desc desc = {.op = op, .n_inputs = n_ops, .inputs = p->operands,
                              .dtype = dt, .rank = rank, .shape = shape,
                              .attrs = pa.attrs, .loc = loc};
    /* The graph interns file names by pointer first; scratch is reused for every location,
     * so make it compare by content. */
    p->g->last_file = NULL;
    p->g->last_scope = NULL;
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    int32_t id;
    loom_status st = loom_ir_graph_add(p->g, &desc, &id, &sub);
    if (st == LOOM_STATUS_INVALID_ARGUMENT)
        return fail_tok(p, &optok, "%s: %s", loom_ir_op_name(op), sub.msg);
    if (st != LOOM_OK) {
        p->st = st;
        loom_ir_diag_set(p->d, st, "%s", sub.msg);
        return false;
    }
    const loom_ir_node *n = &p->g->nodes[id];
    bool same = n->dtype == dt && n->rank == rank;
    for (int32_t i = 0; same && i < rank; i++)
        same = n->shape[i] == shape[i];
    if (!same) {
        char declared[LOOM_IR_TYPE_STR_MAX], inferred[LOOM_IR_TYPE_STR_MAX];
        loom_ir_format_type(declared, sizeof declared, dt, rank, shape);
        loom_ir_format_type(inferred, sizeof inferred, n->dtype, n->rank, n->shape);
        return fail_tok(p, &typetok, "declared type %s but the operands give %s", declared,
                        inferred);
    }
    return name_insert(p, &name, id);
}

/* return [%a [{alias = K}] (',' %b [{alias = K}])*] */
static bool parse_return(parser *p) {
    char b[DESC_MAX];
    lex(p); /* return */
    if (p->tok.kind != TOK_NAME)
        return true;
    for (;;) {
        int32_t id;
        if (!parse_use(p, &id))
            return false;
        int64_t alias = -1;
        if (p->tok.kind == TOK_LBRACE) {
            lex(p);
            if (!tok_is(&p->tok, "alias"))
                return fail_tok(p, &p->tok, "expected 'alias', got %s",
                                describe(&p->tok, b, sizeof b));
            lex(p);
            if (!expect(p, TOK_EQUAL, "'=' after alias") ||
                !parse_int(p, INT32_MAX, "an input index", &alias) ||
                !expect(p, TOK_RBRACE, "'}' after the alias"))
                return false;
        }
        if (loom_ir_graph_add_output(p->g, id, (int32_t)alias) != LOOM_OK)
            return fail_oom(p, "outputs");
        if (p->tok.kind != TOK_COMMA)
            return true;
        lex(p);
    }
}

static bool parse_graph(parser *p) {
    char b[DESC_MAX];
    lex(p);
    if (!tok_is(&p->tok, "loom.graph"))
        return fail_tok(p, &p->tok, "expected 'loom.graph', got %s",
                        describe(&p->tok, b, sizeof b));
    lex(p);
    if (!expect(p, TOK_LBRACE, "'{' after loom.graph"))
        return false;
    for (;;) {
        if (p->tok.kind == TOK_NAME) {
            if (!parse_node(p))
                return false;
        } else if (tok_is(&p->tok, "return")) {
            if (!parse_return(p))
                return false;
            break;
        } else if (p->tok.kind == TOK_RBRACE) {
            return fail_tok(p, &p->tok, "missing 'return' before '}'");
        } else {
            return fail_tok(p, &p->tok, "expected a %%name or 'return', got %s",
                            describe(&p->tok, b, sizeof b));
        }
    }
    if (!expect(p, TOK_RBRACE, "'}' to close the graph"))
        return false;
    if (p->tok.kind != TOK_EOF)
        return fail_tok(p, &p->tok, "unexpected %s after the graph",
                        describe(&p->tok, b, sizeof b));
    return true;
}

/* The verifier keeps a byte per graph input, and the input count is the largest index plus
 * one: when that exceeds the node count, some index cannot be filled, and it is rejected
 * here so that a few bytes of text cannot ask for gigabytes. */
static loom_status check_input_indices(const loom_ir_graph *g, loom_ir_diag *d) {
    if (g->n_graph_inputs <= 256 || g->n_graph_inputs <= g->n_nodes)
        return LOOM_OK; /* small, or no larger than the graph: the verifier reports it */
    int32_t n_inputs = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        n_inputs += g->nodes[i].op == LOOM_IR_OP_INPUT;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op == LOOM_IR_OP_INPUT && n->attrs.index >= n_inputs) {
            if (d->code == LOOM_OK)
                d->node = i;
            return loom_ir_diag_set(d, LOOM_STATUS_VERIFY_FAILED,
                                    "%%%d: input index %lld is out of range: the graph has %d "
                                    "input nodes",
                                    (int)i, (long long)n->attrs.index, (int)n_inputs);
        }
    }
    return LOOM_OK;
}

loom_status loom_ir_graph_parse(loom_ir_graph *g, const char *text, size_t len,
                                loom_ir_diag *d) {
    loom_ir_diag local;
    if (!d) {
        loom_ir_diag_init(&local);
        d = &local;
    }
    if (!g || (!text && len > 0))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "graph or text is NULL");
    loom_ir_graph_reset(g);
    parser p = {.text = text ? text : "", .len = len, .line = 1, .g = g, .a = &g->alloc,
                .d = d, .st = LOOM_OK};
    parse_graph(&p);
    loom_ir_free(p.a, p.names, p.names_cap * sizeof *p.names);
    loom_ir_free(p.a, p.operands, (size_t)p.operands_cap * sizeof *p.operands);
    loom_ir_free(p.a, p.scratch, (size_t)p.scratch_cap);
    loom_ir_free(p.a, p.scope, (size_t)p.scope_cap);
    loom_status st = p.st;
    if (st == LOOM_OK)
        st = check_input_indices(g, d);
    if (st == LOOM_OK)
        st = loom_ir_graph_verify(g, d);
    if (st != LOOM_OK)
        loom_ir_graph_reset(g);
    return st;
}
