/* Tests of the runtime's NPU device (names, memory accounting, buffers, transfers), the
 * executable cache (lookup, collisions, LRU eviction) and the metrics and their reports. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "runtime/runtime.h"
#include "test_util.h"

static loom_allocator sys;

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---- helpers ----------------------------------------------------------------------------- */

static loom_rt_device *make_device(const char *name, const loom_allocator *a,
                                   loom_rt_metrics *m) {
    loom_rt_device *dev = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_rt_device_create(name, a, m, &dev, &d);
    if (st != LOOM_OK)
        fail_msg("device %s: %s", name ? name : "(null)", d.msg);
    assert_non_null(dev);
    return dev;
}

static loom_rt_buffer *make_buffer(loom_rt_device *dev, size_t size) {
    loom_rt_buffer *b = NULL;
    assert_int_equal(loom_rt_buffer_alloc(dev, size, &b), LOOM_OK);
    assert_non_null(b);
    return b;
}

/* The report in one string (owned by the caller: free). */
static char *report(const loom_rt_metrics *m, loom_report_format format) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_rt_metrics_report(m, format, loom_ir_sbuf_write, &sb), LOOM_OK);
    assert_false(sb.oom);
    char *s = strdup(sb.data ? sb.data : "");
    loom_ir_sbuf_deinit(&sb);
    return s;
}

static void assert_contains(const char *haystack, const char *needle) {
    if (!strstr(haystack, needle))
        fail_msg("\"%s\" not found in:\n%s", needle ? needle : "(null)",
                 haystack ? haystack : "(null)");
}

/* input 0 f32[n] -> op -> output; graphs differing in n or op differ structurally. */
static void build_graph(loom_ir_graph *g, const loom_allocator *a, loom_ir_op op, int64_t n) {
    loom_ir_graph_init(g, a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t x, y;
    loom_ir_node_desc in = {.op = LOOM_IR_OP_INPUT, .dtype = LOOM_DTYPE_F32, .rank = 1,
                            .shape = &n};
    assert_int_equal(loom_ir_graph_add(g, &in, &x, &d), LOOM_OK);
    loom_ir_node_desc un = {.op = op, .n_inputs = 1, .inputs = &x};
    assert_int_equal(loom_ir_graph_add(g, &un, &y, &d), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(g, y, -1), LOOM_OK);
}

static loom_rt_executable *make_exe(const loom_ir_graph *g, const loom_allocator *a) {
    loom_rt_executable *exe = NULL;
    assert_int_equal(loom_rt_interp_executable_create(g, loom_ir_graph_hash(g), a, &exe),
                     LOOM_OK);
    assert_non_null(exe);
    return exe;
}

/* ---- a minimal JSON syntax checker (objects, arrays, strings, numbers, literals) --------- */

typedef struct json {
    const char *p;
} json;

static bool json_value(json *j);

static void json_ws(json *j) {
    while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')
        j->p++;
}

static bool json_string(json *j) {
    if (*j->p != '"')
        return false;
    for (j->p++; *j->p != '"'; j->p++) {
        if (*j->p == '\0' || (unsigned char)*j->p < 0x20)
            return false;
        if (*j->p == '\\') {
            j->p++;
            if (!strchr("\"\\/bfnrtu", *j->p) || *j->p == '\0')
                return false;
        }
    }
    j->p++;
    return true;
}

static bool json_number(json *j) {
    const char *start = j->p;
    if (*j->p == '-')
        j->p++;
    if (!isdigit((unsigned char)*j->p))
        return false;
    if (*j->p == '0' && isdigit((unsigned char)j->p[1]))
        return false; /* no leading zeros */
    while (isdigit((unsigned char)*j->p))
        j->p++;
    if (*j->p == '.') {
        j->p++;
        if (!isdigit((unsigned char)*j->p))
            return false;
        while (isdigit((unsigned char)*j->p))
            j->p++;
    }
    if (*j->p == 'e' || *j->p == 'E') {
        j->p++;
        if (*j->p == '+' || *j->p == '-')
            j->p++;
        if (!isdigit((unsigned char)*j->p))
            return false;
        while (isdigit((unsigned char)*j->p))
            j->p++;
    }
    return j->p > start;
}

static bool json_members(json *j, char close, bool keyed) {
    j->p++; /* '{' or '[' */
    json_ws(j);
    if (*j->p == close) {
        j->p++;
        return true;
    }
    for (;;) {
        json_ws(j);
        if (keyed) {
            if (!json_string(j))
                return false;
            json_ws(j);
            if (*j->p++ != ':')
                return false;
        }
        if (!json_value(j))
            return false;
        json_ws(j);
        if (*j->p == close) {
            j->p++;
            return true;
        }
        if (*j->p++ != ',')
            return false;
    }
}

static bool json_value(json *j) {
    json_ws(j);
    switch (*j->p) {
    case '{': return json_members(j, '}', true);
    case '[': return json_members(j, ']', false);
    case '"': return json_string(j);
    case 't': return strncmp(j->p, "true", 4) == 0 ? (j->p += 4, true) : false;
    case 'f': return strncmp(j->p, "false", 5) == 0 ? (j->p += 5, true) : false;
    case 'n': return strncmp(j->p, "null", 4) == 0 ? (j->p += 4, true) : false;
    default: return json_number(j);
    }
}

/* Whole text is exactly one JSON value (plus whitespace). */
static bool json_valid(const char *text) {
    json j = {text};
    if (!json_value(&j))
        return false;
    json_ws(&j);
    return *j.p == '\0';
}

/* ---- device names ------------------------------------------------------------------------ */

static void test_device_accepts_npu_and_npu_n(void **state) {
    (void)state;
    static const struct {
        const char *name, *want;
        int32_t index;
    } ok[] = {
        {"npu", "npu:0", 0},       {"npu:0", "npu:0", 0}, {"npu:3", "npu:3", 3},
        {"npu:1023", "npu:1023", 1023}, {NULL, "npu:0", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        test_alloc ta = {0};
        loom_allocator a = test_alloc_make(&ta);
        loom_rt_metrics m;
        loom_rt_metrics_init(&m);
        loom_rt_device *dev = make_device(ok[i].name, &a, &m);
        assert_string_equal(dev->name, ok[i].want);
        assert_int_equal(dev->index, ok[i].index);
        assert_true(dev->metrics == &m);
        assert_int_equal(dev->mem_current, 0);
        assert_int_equal(dev->mem_peak, 0);
        loom_rt_device_destroy(dev);
        assert_int_equal(ta.live_bytes, 0);
    }
    loom_rt_device_destroy(NULL);
}

static void test_device_rejects_bad_names_with_a_message(void **state) {
    (void)state;
    static const struct {
        const char *name, *msg;
    } bad[] = {
        {"gpu:0",
         "unknown device 'gpu:0' (expected \"npu\" or \"npu:N\", or a registered target's name)"},
        {"npu:x", "unknown device 'npu:x' (expected \"npu\" or \"npu:N\")"},
        {"npu:", "unknown device 'npu:' (expected \"npu\" or \"npu:N\")"},
        {"", "unknown device '' (expected \"npu\" or \"npu:N\", or a registered target's name)"},
        {"npu0",
         "unknown device 'npu0' (expected \"npu\" or \"npu:N\", or a registered target's name)"},
        {"NPU:0",
         "unknown device 'NPU:0' (expected \"npu\" or \"npu:N\", or a registered target's name)"},
        {"npu:-1", "unknown device 'npu:-1' (expected \"npu\" or \"npu:N\")"},
        {"npu: 1", "unknown device 'npu: 1' (expected \"npu\" or \"npu:N\")"},
        {"npu:99999", "bad device index in 'npu:99999' (expected npu:0..npu:1023)"},
        {"npu:1024", "bad device index in 'npu:1024' (expected npu:0..npu:1023)"},
        {"npu:3x", "bad device index in 'npu:3x' (expected npu:0..npu:1023)"},
        {"npu:1 ", "bad device index in 'npu:1 ' (expected npu:0..npu:1023)"},
        {"npu:99999999999999999999999",
         "bad device index in 'npu:99999999999999999999999' (expected npu:0..npu:1023)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_alloc ta = {0};
        loom_allocator a = test_alloc_make(&ta);
        loom_rt_device *dev = NULL;
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_status st = loom_rt_device_create(bad[i].name, &a, NULL, &dev, &d);
        if (st != LOOM_STATUS_INVALID_ARGUMENT || strcmp(d.msg, bad[i].msg) != 0)
            fail_msg("'%s': %s \"%s\"", bad[i].name, loom_status_name(st), d.msg);
        assert_int_equal(d.code, LOOM_STATUS_INVALID_ARGUMENT);
        assert_null(dev);
        assert_int_equal(ta.n_allocs, 0);
    }
}

static void test_device_create_reports_out_of_memory(void **state) {
    (void)state;
    test_alloc ta = {.fail_at = 1};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_device *dev = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_device_create("npu:2", &a, NULL, &dev, &d),
                     LOOM_STATUS_OUT_OF_MEMORY);
    assert_string_equal(d.msg, "out of memory creating npu:2");
    assert_null(dev);
    assert_int_equal(ta.live_bytes, 0);
}

/* ---- buffers ----------------------------------------------------------------------------- */

static void test_buffers_count_rounded_bytes_in_current_and_peak(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_device *dev = make_device("npu:1", &a, NULL);
    int64_t base = ta.live_bytes; /* the device itself */
    static const struct {
        size_t size, rounded;
    } sizes[] = {{1, 64}, {64, 64}, {65, 128}, {0, 64}, {1000, 1024}, {4096, 4096}};
    enum { N = sizeof sizes / sizeof sizes[0] };
    loom_rt_buffer *bufs[N];
    size_t expect = 0;
    for (size_t i = 0; i < N; i++) {
        bufs[i] = make_buffer(dev, sizes[i].size);
        expect += sizes[i].rounded;
        assert_int_equal(bufs[i]->size, sizes[i].size); /* the requested size is kept */
        assert_int_equal(bufs[i]->refs, 1);
        assert_true(bufs[i]->device == dev);
        assert_non_null(bufs[i]->data);
        /* the data starts at a cache line, inside the block allocated for it */
        assert_int_equal((uintptr_t)bufs[i]->data % 64, 0);
        assert_true((char *)bufs[i]->data >= (char *)bufs[i]->block);
        assert_true((char *)bufs[i]->data < (char *)bufs[i]->block + 64);
        assert_int_equal(dev->mem_current, expect);
        assert_int_equal(dev->mem_peak, expect);
    }
    assert_int_equal(expect, 64 + 64 + 128 + 64 + 1024 + 4096);
    /* the pool's host memory is the rounded size, 64 bytes a block to align it, and the
     * buffer records */
    assert_int_equal(ta.live_bytes - base, (int64_t)(expect + N * (64 + sizeof(loom_rt_buffer))));
    size_t peak = expect;
    loom_rt_buffer_release(bufs[4]);
    expect -= 1024;
    assert_int_equal(dev->mem_current, expect);
    assert_int_equal(dev->mem_peak, peak);
    /* a new, smaller buffer does not move the peak */
    loom_rt_buffer *again = make_buffer(dev, 500);
    assert_int_equal(dev->mem_current, expect + 512);
    assert_int_equal(dev->mem_peak, peak);
    loom_rt_buffer_release(again);
    for (size_t i = 0; i < N; i++)
        if (i != 4)
            loom_rt_buffer_release(bufs[i]);
    assert_int_equal(dev->mem_current, 0);
    assert_int_equal(dev->mem_peak, peak);
    /* freed blocks stay cached for reuse (not counted as in use) until destroy */
    assert_int_equal(dev->cached_bytes, peak + 512);
    assert_int_equal(dev->n_cached, N + 1);
    assert_int_equal(ta.live_bytes, base + (int64_t)dev->cached_bytes + 64 * (N + 1));
    loom_rt_device_destroy(dev);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

static void test_buffer_is_freed_on_the_last_release(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_device *dev = make_device("npu", &a, NULL);
    int64_t blocks = ta.live_blocks;
    loom_rt_buffer *b = make_buffer(dev, 100);
    assert_int_equal(ta.live_blocks, blocks + 2); /* record and data */
    loom_rt_buffer_retain(b);
    loom_rt_buffer_retain(b);
    assert_int_equal(b->refs, 3);
    loom_rt_buffer_release(b);
    loom_rt_buffer_release(b);
    assert_int_equal(b->refs, 1);
    assert_int_equal(dev->mem_current, 128);
    assert_int_equal(ta.live_blocks, blocks + 2);
    loom_rt_buffer_release(b);
    assert_int_equal(dev->mem_current, 0);
    assert_int_equal(ta.live_blocks, blocks + 1); /* the record is freed, the data cached */
    assert_int_equal(dev->cached_bytes, 128);
    /* the next buffer of that rounded size reuses the cached block */
    void *cached_block = dev->cached[0].block;
    loom_rt_buffer *again = make_buffer(dev, 120);
    assert_ptr_equal(again->block, cached_block);
    assert_int_equal((uintptr_t)again->data % 64, 0);
    assert_int_equal(dev->cached_bytes, 0);
    assert_int_equal(dev->mem_current, 128);
    loom_rt_buffer_release(again);
    loom_rt_buffer_retain(NULL);
    loom_rt_buffer_release(NULL);
    loom_rt_device_destroy(dev);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_buffer_alloc_fails_cleanly(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_device *dev = make_device("npu", &a, NULL);
    int64_t live = ta.live_bytes;
    for (int64_t k = 1; k <= 2; k++) { /* the record, then the data */
        ta.fail_at = ta.n_allocs + k;
        loom_rt_buffer *b = NULL;
        assert_int_equal(loom_rt_buffer_alloc(dev, 256, &b), LOOM_STATUS_OUT_OF_MEMORY);
        assert_null(b);
        assert_int_equal(ta.n_failed, k);
        assert_int_equal(dev->mem_current, 0);
        assert_int_equal(dev->mem_peak, 0);
        assert_int_equal(ta.live_bytes, live);
    }
    ta.fail_at = 0;
    /* a size whose rounding and alignment would wrap is refused before any allocation */
    int64_t allocs = ta.n_allocs;
    loom_rt_buffer *huge = NULL;
    assert_int_equal(loom_rt_buffer_alloc(dev, SIZE_MAX - 10, &huge), LOOM_STATUS_OUT_OF_MEMORY);
    assert_null(huge);
    assert_int_equal(ta.n_allocs, allocs);
    assert_int_equal(dev->mem_current, 0);
    loom_rt_buffer *b = make_buffer(dev, 256);
    assert_int_equal(dev->mem_current, 256);
    loom_rt_buffer_release(b);
    loom_rt_device_destroy(dev);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_write_read_round_trip_and_count_transfers(void **state) {
    (void)state;
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    loom_rt_device *dev = make_device("npu:0", &sys, &m);
    loom_rt_buffer *b = make_buffer(dev, 40);
    float src[10], dst[10];
    for (int i = 0; i < 10; i++)
        src[i] = (float)i * 1.5f - 3.0f;
    assert_int_equal(loom_rt_buffer_write(b, src, sizeof src), LOOM_OK);
    memset(dst, 0, sizeof dst);
    assert_int_equal(loom_rt_buffer_read(b, dst, sizeof dst), LOOM_OK);
    assert_memory_equal(dst, src, sizeof src);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE], 40); /* bytes, not rounded */
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE_TIME], 1);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_FROM_DEVICE], 40);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_FROM_DEVICE_TIME], 1);
    assert_true(m.total[LOOM_RT_METRIC_TRANSFER_TO_DEVICE_TIME] >= 0);

    /* a partial write of the first bytes; later bytes keep their value */
    float two[2] = {100.0f, 200.0f};
    assert_int_equal(loom_rt_buffer_write(b, two, sizeof two), LOOM_OK);
    float first3[3];
    assert_int_equal(loom_rt_buffer_read(b, first3, sizeof first3), LOOM_OK);
    assert_true(first3[0] == 100.0f && first3[1] == 200.0f && first3[2] == src[2]);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE], 48);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE_TIME], 2);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_FROM_DEVICE], 52);

    /* more than the buffer holds (its padding to 64 bytes is not the user's): refused and
     * not counted */
    char big[64] = {0};
    assert_int_equal(loom_rt_buffer_write(b, big, 41), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_buffer_read(b, big, 41), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE], 48);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_FROM_DEVICE], 52);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE_TIME], 2);
    /* zero bytes is a valid no-op */
    assert_int_equal(loom_rt_buffer_write(b, NULL, 0), LOOM_OK);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE], 48);
    loom_rt_buffer_release(b);
    loom_rt_device_destroy(dev);

    /* a device without metrics transfers all the same */
    dev = make_device("npu:1", &sys, NULL);
    b = make_buffer(dev, 8);
    assert_int_equal(loom_rt_buffer_write(b, "abcdefgh", 8), LOOM_OK);
    char out[9] = {0};
    assert_int_equal(loom_rt_buffer_read(b, out, 8), LOOM_OK);
    assert_string_equal(out, "abcdefgh");
    loom_rt_buffer_release(b);
    loom_rt_device_destroy(dev);
}

/* ---- executable cache -------------------------------------------------------------------- */

static void test_cache_finds_an_inserted_graph_and_misses_others(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    loom_rt_cache c;
    loom_rt_cache_init(&c, &a, 8, &m);
    loom_ir_graph g, same, other;
    build_graph(&g, &a, LOOM_IR_OP_NEG, 4);
    build_graph(&same, &a, LOOM_IR_OP_NEG, 4);
    build_graph(&other, &a, LOOM_IR_OP_NEG, 5);
    uint64_t h = loom_ir_graph_hash(&g);
    assert_null(loom_rt_cache_find(&c, &g, h)); /* empty */
    loom_rt_executable *exe = make_exe(&g, &a);
    assert_true(exe->hash == h);
    loom_ir_graph_deinit(&g); /* the executable holds its own copy */
    assert_int_equal(loom_rt_cache_insert(&c, exe), LOOM_OK);
    assert_int_equal(c.n, 1);
    assert_true(loom_rt_cache_find(&c, &same, h) == exe);
    assert_null(loom_rt_cache_find(&c, &same, h ^ 1)); /* another hash: not even compared */
    assert_null(loom_rt_cache_find(&c, &other, loom_ir_graph_hash(&other)));
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_EVICTIONS], 0);
    loom_ir_graph_deinit(&same);
    loom_ir_graph_deinit(&other);
    loom_rt_cache_deinit(&c);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

/* A hash collision must never run the wrong program: equal hashes, different graphs. */
static void test_cache_confirms_a_hash_match_by_structure(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_cache c;
    loom_rt_cache_init(&c, &a, 4, NULL);
    loom_ir_graph neg, exp_g;
    build_graph(&neg, &a, LOOM_IR_OP_NEG, 4);
    build_graph(&exp_g, &a, LOOM_IR_OP_EXP, 4);
    uint64_t h_exp = loom_ir_graph_hash(&exp_g);
    assert_true(loom_ir_graph_hash(&neg) != h_exp);
    /* an executable for neg filed under exp's hash: a fake collision */
    loom_rt_executable *fake = NULL;
    assert_int_equal(loom_rt_interp_executable_create(&neg, h_exp, &a, &fake), LOOM_OK);
    assert_true(fake->hash == h_exp);
    assert_int_equal(loom_rt_cache_insert(&c, fake), LOOM_OK);
    assert_null(loom_rt_cache_find(&c, &exp_g, h_exp));
    /* the right graph under that hash is found */
    assert_true(loom_rt_cache_find(&c, &neg, h_exp) == fake);
    /* with the real executable inserted too, each graph gets its own */
    loom_rt_executable *real = make_exe(&exp_g, &a);
    assert_int_equal(loom_rt_cache_insert(&c, real), LOOM_OK);
    assert_true(loom_rt_cache_find(&c, &exp_g, h_exp) == real);
    assert_true(loom_rt_cache_find(&c, &neg, h_exp) == fake);
    loom_ir_graph_deinit(&neg);
    loom_ir_graph_deinit(&exp_g);
    loom_rt_cache_deinit(&c);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_cache_evicts_the_least_recently_used(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    loom_rt_cache c;
    loom_rt_cache_init(&c, &a, 2, &m);
    loom_ir_graph ga, gb, gc, gd;
    build_graph(&ga, &a, LOOM_IR_OP_NEG, 1);
    build_graph(&gb, &a, LOOM_IR_OP_NEG, 2);
    build_graph(&gc, &a, LOOM_IR_OP_NEG, 3);
    build_graph(&gd, &a, LOOM_IR_OP_NEG, 4);
    uint64_t ha = loom_ir_graph_hash(&ga), hb = loom_ir_graph_hash(&gb);
    uint64_t hc = loom_ir_graph_hash(&gc), hd = loom_ir_graph_hash(&gd);
    loom_rt_executable *ea = make_exe(&ga, &a), *eb = make_exe(&gb, &a);
    loom_rt_executable *ec = make_exe(&gc, &a), *ed = make_exe(&gd, &a);
    assert_int_equal(loom_rt_cache_insert(&c, ea), LOOM_OK);
    assert_int_equal(loom_rt_cache_insert(&c, eb), LOOM_OK);
    /* A is used after B was inserted: B is now the least recently used */
    assert_true(loom_rt_cache_find(&c, &ga, ha) == ea);
    assert_int_equal(loom_rt_cache_insert(&c, ec), LOOM_OK);
    assert_int_equal(c.n, 2);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_EVICTIONS], 1);
    assert_null(loom_rt_cache_find(&c, &gb, hb));
    assert_true(loom_rt_cache_find(&c, &gc, hc) == ec);
    assert_true(loom_rt_cache_find(&c, &ga, ha) == ea);
    /* now C is older than A: D evicts C */
    assert_int_equal(loom_rt_cache_insert(&c, ed), LOOM_OK);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_EVICTIONS], 2);
    assert_null(loom_rt_cache_find(&c, &gc, hc));
    assert_true(loom_rt_cache_find(&c, &ga, ha) == ea);
    assert_true(loom_rt_cache_find(&c, &gd, hd) == ed);
    assert_int_equal(c.n, 2);
    /* A is used again, so D is now the least recently used; a miss changes nothing */
    assert_true(loom_rt_cache_find(&c, &ga, ha) == ea);
    assert_null(loom_rt_cache_find(&c, &gb, hb));
    loom_rt_executable *eb2 = make_exe(&gb, &a);
    assert_int_equal(loom_rt_cache_insert(&c, eb2), LOOM_OK);
    assert_null(loom_rt_cache_find(&c, &gd, hd));
    assert_true(loom_rt_cache_find(&c, &ga, ha) == ea);
    assert_true(loom_rt_cache_find(&c, &gb, hb) == eb2);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_EVICTIONS], 3);
    loom_ir_graph_deinit(&ga);
    loom_ir_graph_deinit(&gb);
    loom_ir_graph_deinit(&gc);
    loom_ir_graph_deinit(&gd);
    loom_rt_cache_deinit(&c);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

static void test_cache_of_size_zero_holds_one_entry(void **state) {
    (void)state;
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    loom_rt_cache c;
    loom_rt_cache_init(&c, &sys, 0, &m);
    assert_int_equal(c.max_entries, 1);
    loom_ir_graph g1, g2;
    build_graph(&g1, &sys, LOOM_IR_OP_ABS, 3);
    build_graph(&g2, &sys, LOOM_IR_OP_RELU, 3);
    assert_int_equal(loom_rt_cache_insert(&c, make_exe(&g1, &sys)), LOOM_OK);
    assert_non_null(loom_rt_cache_find(&c, &g1, loom_ir_graph_hash(&g1)));
    assert_int_equal(loom_rt_cache_insert(&c, make_exe(&g2, &sys)), LOOM_OK);
    assert_null(loom_rt_cache_find(&c, &g1, loom_ir_graph_hash(&g1)));
    assert_non_null(loom_rt_cache_find(&c, &g2, loom_ir_graph_hash(&g2)));
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_EVICTIONS], 1);
    loom_ir_graph_deinit(&g1);
    loom_ir_graph_deinit(&g2);
    loom_rt_cache_deinit(&c);
    loom_rt_cache_deinit(&c); /* twice is harmless */
}

/* Insert takes ownership even when it fails: the executable is destroyed, nothing leaks,
 * and the cache keeps working. */
static void test_cache_insert_out_of_memory_destroys_the_executable(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_rt_cache c;
    loom_rt_cache_init(&c, &a, 4, NULL);
    loom_ir_graph g;
    build_graph(&g, &a, LOOM_IR_OP_SIGMOID, 6);
    uint64_t h = loom_ir_graph_hash(&g);
    int64_t live = ta.live_bytes;
    loom_rt_executable *exe = make_exe(&g, &a);
    ta.fail_at = ta.n_allocs + 1; /* the entries array */
    assert_int_equal(loom_rt_cache_insert(&c, exe), LOOM_STATUS_OUT_OF_MEMORY);
    assert_int_equal(c.n, 0);
    assert_int_equal(ta.live_bytes, live);
    ta.fail_at = 0;
    assert_null(loom_rt_cache_find(&c, &g, h));
    exe = make_exe(&g, &a);
    assert_int_equal(loom_rt_cache_insert(&c, exe), LOOM_OK);
    assert_true(loom_rt_cache_find(&c, &g, h) == exe);
    loom_ir_graph_deinit(&g);
    loom_rt_cache_deinit(&c);
    assert_int_equal(ta.live_bytes, 0);

    /* creating an executable fails cleanly at each allocation too */
    build_graph(&g, &sys, LOOM_IR_OP_SIGMOID, 6);
    int failures = 0;
    for (int64_t k = 1;; k++) {
        test_alloc tf = {.fail_at = k};
        loom_allocator af = test_alloc_make(&tf);
        loom_rt_executable *e = NULL;
        loom_status st = loom_rt_interp_executable_create(&g, h, &af, &e);
        if (tf.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            loom_rt_executable_destroy(e);
            assert_int_equal(tf.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_null(e);
        assert_int_equal(tf.live_bytes, 0);
        failures++;
    }
    assert_true(failures >= 2);
    loom_rt_executable_destroy(NULL);
    loom_ir_graph_deinit(&g);
}

/* ---- metrics ----------------------------------------------------------------------------- */

static void test_metrics_sum_counters_and_summarize_timers(void **state) {
    (void)state;
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    for (int i = 0; i < LOOM_RT_METRIC_COUNT_; i++)
        assert_int_equal(m.count[i], 0);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 1);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 1);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 1);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_TRANSFER_TO_DEVICE, 4096);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_TRANSFER_TO_DEVICE, 100);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_HIT], 3);
    assert_int_equal(m.count[LOOM_RT_METRIC_TRANSFER_TO_DEVICE], 4196);
    assert_int_equal(m.count[LOOM_RT_METRIC_CACHE_MISS], 0);

    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 5);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 2);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 9);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 4);
    assert_int_equal(m.count[LOOM_RT_METRIC_COMPILE_TIME], 4);
    assert_int_equal(m.total[LOOM_RT_METRIC_COMPILE_TIME], 20);
    assert_int_equal(m.min[LOOM_RT_METRIC_COMPILE_TIME], 2);
    assert_int_equal(m.max[LOOM_RT_METRIC_COMPILE_TIME], 9);
    assert_int_equal(m.last[LOOM_RT_METRIC_COMPILE_TIME], 4);
    /* the first sample sets min and max, even when it is larger than the zeroed fields */
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_EXECUTE_TIME, 700);
    assert_int_equal(m.min[LOOM_RT_METRIC_EXECUTE_TIME], 700);
    assert_int_equal(m.max[LOOM_RT_METRIC_EXECUTE_TIME], 700);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_EXECUTE_TIME, -3); /* clock skew: still min */
    assert_int_equal(m.min[LOOM_RT_METRIC_EXECUTE_TIME], -3);
    assert_int_equal(m.max[LOOM_RT_METRIC_EXECUTE_TIME], 700);
    /* a counter never touches the timer fields */
    assert_int_equal(m.total[LOOM_RT_METRIC_CACHE_HIT], 0);
    assert_int_equal(m.max[LOOM_RT_METRIC_CACHE_HIT], 0);

    int64_t t0 = loom_rt_now_ns();
    int64_t t1 = loom_rt_now_ns();
    assert_true(t0 > 0);
    assert_true(t1 >= t0);
}

static void test_metrics_text_report(void **state) {
    (void)state;
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    for (int i = 0; i < 3; i++)
        loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 1);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_TRANSFER_TO_DEVICE, 100);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 5);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 2);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 9);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_EXECUTE_TIME, 1500);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_EXECUTE_TIME, 2500000);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_EXECUTE_TIME, 3000000000);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_GRAPH_NODES, 10);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_GRAPH_NODES, 21);
    char *text = report(&m, LOOM_REPORT_FORMAT_TEXT);
    assert_contains(text, "Counter: CacheHit\n  Value: 3\n");
    assert_contains(text, "Counter: CacheMiss\n  Value: 0\n");
    assert_contains(text, "Counter: TransferToDeviceBytes\n  Value: 100\n");
    assert_contains(text, "Metric: CompileTime\n  TotalSamples: 3\n  Accumulator: 16ns\n"
                          "  Mean: 5ns\n  Min: 2ns\n  Max: 9ns\n");
    /* durations scale to us, ms and s with three decimals */
    assert_contains(text, "Metric: ExecuteTime\n  TotalSamples: 3\n  Accumulator: 3.003s\n"
                          "  Mean: 1.001s\n  Min: 1.500us\n  Max: 3.000s\n");
    assert_contains(text, "Metric: GraphNodes\n  TotalSamples: 2\n  Accumulator: 31 nodes\n"
                          "  Mean: 15 nodes\n  Min: 10 nodes\n  Max: 21 nodes\n");
    assert_contains(text, "Metric: TraceTime\n  TotalSamples: 0\n");
    assert_contains(text, "Counter: CacheEvictions\n  Value: 0\n");
    /* one entry per metric, in table order */
    assert_true(strncmp(text, "Metric: TraceTime\n", 18) == 0);
    int entries = 0;
    for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, "Counter: ", 9) == 0 || strncmp(p, "Metric: ", 8) == 0)
            entries++;
    assert_int_equal(entries, LOOM_RT_METRIC_COUNT_);
    free(text);

    /* a millisecond-range timer */
    loom_rt_metrics_init(&m);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_TRACE_TIME, 1234567);
    text = report(&m, LOOM_REPORT_FORMAT_TEXT);
    assert_contains(text, "Metric: TraceTime\n  TotalSamples: 1\n  Accumulator: 1.235ms\n"
                          "  Mean: 1.235ms\n  Min: 1.235ms\n  Max: 1.235ms\n");
    free(text);
}

static void test_metrics_json_report_is_well_formed(void **state) {
    (void)state;
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    for (int i = 0; i < 3; i++)
        loom_rt_metrics_add(&m, LOOM_RT_METRIC_CACHE_HIT, 1);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 5);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 2);
    loom_rt_metrics_add(&m, LOOM_RT_METRIC_COMPILE_TIME, 9);
    char *text = report(&m, LOOM_REPORT_FORMAT_JSON);
    size_t len = strlen(text);
    assert_true(len > 3);
    assert_int_equal(text[0], '{');
    assert_string_equal(text + len - 2, "}\n");
    assert_contains(text, "\"CacheHit\":3");
    assert_contains(text, "\"CacheMiss\":0");
    assert_contains(text, "\"CompileTime\":{\"count\":3,\"total\":16,\"min\":2,\"max\":9,"
                          "\"last\":9,\"unit\":\"ns\"}");
    assert_contains(text, "\"GraphNodes\":{\"count\":0,");
    assert_true(json_valid(text));
    /* the checker itself rejects broken JSON */
    assert_false(json_valid("{\"a\":1,}"));
    assert_false(json_valid("{\"a\" 1}"));
    assert_false(json_valid("{\"a\":1"));
    assert_false(json_valid("{\"a\":01}"));
    assert_false(json_valid("{}{}"));
    assert_true(json_valid("{\"a\":[1,-2.5e3,true,null,\"x\\\"y\"],\"b\":{}}\n"));
    /* every metric appears once as a key */
    int keys = 0;
    for (const char *p = text; (p = strstr(p, "\":")) != NULL; p += 2)
        if (p[2] == '{' || isdigit((unsigned char)p[2]) || p[2] == '-')
            keys++;
    /* timers contribute their five numeric fields as keys too */
    int n_timers = 0;
    for (const char *p = text; (p = strstr(p, "\"count\":")) != NULL; p++)
        n_timers++;
    assert_int_equal(keys, LOOM_RT_METRIC_COUNT_ + 5 * n_timers);
    assert_true(n_timers >= 3);
    free(text);
}

static void test_metric_from_name_finds_report_names(void **state) {
    (void)state;
    assert_int_equal(loom_rt_metric_from_name("CacheHit"), LOOM_RT_METRIC_CACHE_HIT);
    assert_int_equal(loom_rt_metric_from_name("CacheMiss"), LOOM_RT_METRIC_CACHE_MISS);
    assert_int_equal(loom_rt_metric_from_name("TransferToDeviceBytes"),
                     LOOM_RT_METRIC_TRANSFER_TO_DEVICE);
    assert_int_equal(loom_rt_metric_from_name("CompileTime"), LOOM_RT_METRIC_COMPILE_TIME);
    assert_int_equal(loom_rt_metric_from_name("MarkStep"), LOOM_RT_METRIC_STEPS);
    assert_int_equal(loom_rt_metric_from_name("CacheEvictions"), LOOM_RT_METRIC_CACHE_EVICTIONS);
    assert_int_equal(loom_rt_metric_from_name("cachehit"), LOOM_RT_METRIC_COUNT_);
    assert_int_equal(loom_rt_metric_from_name("CacheHits"), LOOM_RT_METRIC_COUNT_);
    assert_int_equal(loom_rt_metric_from_name(""), LOOM_RT_METRIC_COUNT_);
    /* every name in the report maps back to its metric */
    loom_rt_metrics m;
    loom_rt_metrics_init(&m);
    char *text = report(&m, LOOM_REPORT_FORMAT_TEXT);
    int found = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *name = NULL;
        if (strncmp(line, "Counter: ", 9) == 0)
            name = line + 9;
        else if (strncmp(line, "Metric: ", 8) == 0)
            name = line + 8;
        if (!name)
            continue;
        loom_rt_metric which = loom_rt_metric_from_name(name);
        if (which != (loom_rt_metric)found)
            fail_msg("%s maps to %d, expected %d", name, (int)which, found);
        found++;
    }
    assert_int_equal(found, LOOM_RT_METRIC_COUNT_);
    free(text);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_accepts_npu_and_npu_n),
        cmocka_unit_test(test_device_rejects_bad_names_with_a_message),
        cmocka_unit_test(test_device_create_reports_out_of_memory),
        cmocka_unit_test(test_buffers_count_rounded_bytes_in_current_and_peak),
        cmocka_unit_test(test_buffer_is_freed_on_the_last_release),
        cmocka_unit_test(test_buffer_alloc_fails_cleanly),
        cmocka_unit_test(test_write_read_round_trip_and_count_transfers),
        cmocka_unit_test(test_cache_finds_an_inserted_graph_and_misses_others),
        cmocka_unit_test(test_cache_confirms_a_hash_match_by_structure),
        cmocka_unit_test(test_cache_evicts_the_least_recently_used),
        cmocka_unit_test(test_cache_of_size_zero_holds_one_entry),
        cmocka_unit_test(test_cache_insert_out_of_memory_destroys_the_executable),
        cmocka_unit_test(test_metrics_sum_counters_and_summarize_timers),
        cmocka_unit_test(test_metrics_text_report),
        cmocka_unit_test(test_metrics_json_report_is_well_formed),
        cmocka_unit_test(test_metric_from_name_finds_report_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
