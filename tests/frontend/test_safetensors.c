/* Safetensors checkpoints: bit-exact round trips of every dtype, the exact bytes written, files
 * laid out as the reference writer does, every kind of corruption refused with a message that
 * names it, and save/load failures that leave files and the context as they were. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/safetensors.h"
#include "test_util.h"

/* ---- fixtures ---------------------------------------------------------------------------- */

static char tmp_dir[64];

static int setup_dir(void **state) {
    (void)state;
    strcpy(tmp_dir, "/tmp/loom_test_st_XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

/* Removes the folder and what the tests left in it (files, and the folders they made). */
static int teardown_dir(void **state) {
    (void)state;
    DIR *d = opendir(tmp_dir);
    if (!d)
        return -1;
    struct dirent *e;
    char p[sizeof tmp_dir + sizeof e->d_name + 1];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
        if (unlink(p) != 0)
            rmdir(p);
    }
    closedir(d);
    return rmdir(tmp_dir);
}

static const char *tmp_path(const char *name) {
    static char bufs[8][256];
    static int k;
    char *p = bufs[k++ % 8];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* The whole file at path (malloc'd), its length in *len. */
static uint8_t *read_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* A file image: the header's length (8 bytes, little-endian), header, data. Static storage. */
static size_t image(uint8_t **out, const char *header, const void *data, size_t data_len) {
    static uint8_t buf[4096];
    size_t h = strlen(header);
    assert_true(8 + h + data_len <= sizeof buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    if (data_len)
        memcpy(buf + 8 + h, data, data_len);
    *out = buf;
    return 8 + h + data_len;
}

static void expect_msg(const char *msg, const char *what) {
    if (!strstr(msg, what))
        fail_msg("message \"%s\" lacks \"%s\"", msg, what);
}

/* Parsing bytes gives st; a failure comes with a message holding what. */
static void expect_parse_bytes(const uint8_t *bytes, size_t len, loom_status st, const char *what) {
    char err[512] = "unset";
    loom_safetensors *f = (loom_safetensors *)(uintptr_t)1;
    loom_status got = loom_safetensors_parse(bytes, len, &f, err, sizeof err);
    if (got != st)
        fail_msg("status %s, expected %s (\"%s\")", loom_status_name(got), loom_status_name(st),
                 err);
    if (st == LOOM_OK) {
        loom_safetensors_close(f);
        return;
    }
    assert_null(f);
    expect_msg(err, what);
}

static void expect_parse(const char *header, const void *data, size_t data_len, loom_status st,
                         const char *what) {
    uint8_t *b;
    size_t len = image(&b, header, data, data_len);
    expect_parse_bytes(b, len, st, what);
}

static loom_tensor *f32(loom_context *ctx, int32_t rank, const int64_t *shape, const float *v) {
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, rank, shape, v);
    assert_non_null(t);
    return t;
}

/* The context's error is code with a message holding each of what[]; then it runs a step. */
static void expect_ctx_error(loom_context *ctx, loom_status got, loom_status code,
                             const char *const *what) {
    const char *msg = loom_context_error_message(ctx);
    if (got != code || loom_context_error(ctx) != code)
        fail_msg("returned %s, recorded %s, expected %s (\"%s\")", loom_status_name(got),
                 loom_status_name(loom_context_error(ctx)), loom_status_name(code), msg);
    for (; *what; what++)
        expect_msg(msg, *what);
    loom_context_clear_error(ctx);
    float v[2] = {1.5f, -2};
    loom_tensor *x = f32(ctx, 1, (int64_t[]){2}, v);
    loom_tensor *y = loom_add(ctx, x, x);
    assert_non_null(y);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[2];
    assert_int_equal(loom_tensor_read(ctx, y, out, sizeof out), LOOM_OK);
    assert_true(out[0] == 3.0f && out[1] == -4.0f);
    loom_tensor_release(y);
    loom_tensor_release(x);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
}

#define WHAT(...) ((const char *const[]){__VA_ARGS__, NULL})

static void read_exact(loom_context *ctx, loom_tensor *t, void *dst, size_t size) {
    if (loom_tensor_read(ctx, t, dst, size) != LOOM_OK)
        fail_msg("read: %s", loom_context_error_message(ctx));
}

/* ---- round trips ------------------------------------------------------------------------- */

/* One tensor per dtype (with the awkward values: signaling NaNs with payloads, -0,
 * infinities, subnormals, extreme integers), a scalar and a zero-size tensor. */
typedef struct sample {
    const char *name;
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[3];
    const void *data;
    size_t bytes;
} sample;

static const uint32_t f32_bits[6] = {0x3F800000, 0x80000000, 0x7F812345,
                                     0xFF800000, 0x00000001, 0x7F7FFFFF};
static const uint64_t f64_bits[3] = {0x3FB999999999999Aull, 0xFFF8000000000001ull,
                                     0x8000000000000000ull};
static const uint16_t f16_bits[4] = {0x3C00, 0x7C01, 0x0001, 0xFBFF};
static const uint16_t bf16_bits[4] = {0x3F80, 0xC060, 0x7F81, 0x0080};
static const int32_t i32_vals[3] = {INT32_MIN, -1, INT32_MAX};
static const int64_t i64_vals[2] = {INT64_MIN, 1234567890123456789};
static const uint8_t bool_vals[5] = {1, 0, 0, 1, 1};
static const float scalar_val = 42.5f;

static const sample samples[] = {
    {"f32", LOOM_DTYPE_F32, 2, {2, 3}, f32_bits, sizeof f32_bits},
    {"f64", LOOM_DTYPE_F64, 1, {3}, f64_bits, sizeof f64_bits},
    {"f16", LOOM_DTYPE_F16, 2, {2, 2}, f16_bits, sizeof f16_bits},
    {"bf16", LOOM_DTYPE_BF16, 3, {1, 2, 2}, bf16_bits, sizeof bf16_bits},
    {"i32", LOOM_DTYPE_I32, 1, {3}, i32_vals, sizeof i32_vals},
    {"i64", LOOM_DTYPE_I64, 1, {2}, i64_vals, sizeof i64_vals},
    {"bool", LOOM_DTYPE_BOOL, 1, {5}, bool_vals, sizeof bool_vals},
    {"scalar", LOOM_DTYPE_F32, 0, {0}, &scalar_val, sizeof scalar_val},
    {"empty", LOOM_DTYPE_I64, 2, {0, 3}, "", 0},
};
#define N_SAMPLES ((int32_t)(sizeof samples / sizeof samples[0]))

static void run_round_trip(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_named_tensor src[N_SAMPLES], dst[N_SAMPLES];
    uint8_t zeros[64] = {0};
    for (int32_t i = 0; i < N_SAMPLES; i++) {
        const sample *s = &samples[i];
        src[i] = (loom_named_tensor){
            s->name, loom_tensor_from_host(ctx, s->dtype, s->rank, s->shape, s->data)};
        dst[i] = (loom_named_tensor){
            s->name, loom_tensor_from_host(ctx, s->dtype, s->rank, s->shape, zeros)};
        assert_non_null(src[i].tensor);
        assert_non_null(dst[i].tensor);
    }
    const char *path = tmp_path(eager ? "rt_eager.safetensors" : "rt_jit.safetensors");
    if (loom_safetensors_save(ctx, path, N_SAMPLES, src) != LOOM_OK)
        fail_msg("save: %s", loom_context_error_message(ctx));
    if (loom_safetensors_load(ctx, path, N_SAMPLES, dst, true) != LOOM_OK)
        fail_msg("load: %s", loom_context_error_message(ctx));
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    for (int32_t i = 0; i < N_SAMPLES; i++) {
        uint8_t got[64];
        read_exact(ctx, dst[i].tensor, got, samples[i].bytes);
        if (samples[i].bytes)
            assert_memory_equal(got, samples[i].data, samples[i].bytes);
    }

    /* The file itself, through the inspection API: name order, types, bytes. */
    char err[256];
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, err, sizeof err), LOOM_OK);
    assert_int_equal(loom_safetensors_count(f), N_SAMPLES);
    const char *prev = "";
    for (int32_t i = 0; i < N_SAMPLES; i++) {
        const char *name;
        loom_dtype dt;
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        const void *data;
        size_t size;
        assert_int_equal(loom_safetensors_tensor(f, i, &name, &dt, &rank, shape, &data, &size),
                         LOOM_OK);
        assert_true(strcmp(prev, name) < 0);
        prev = name;
        int32_t k = loom_safetensors_find(f, name);
        assert_int_equal(k, i);
        int32_t j = 0;
        while (strcmp(samples[j].name, name) != 0)
            j++;
        assert_int_equal(dt, samples[j].dtype);
        assert_int_equal(rank, samples[j].rank);
        assert_memory_equal(shape, samples[j].shape, (size_t)rank * sizeof *shape);
        assert_int_equal(size, samples[j].bytes);
        if (size)
            assert_memory_equal(data, samples[j].data, size);
    }
    loom_safetensors_close(f);
    for (int32_t i = 0; i < N_SAMPLES; i++) {
        loom_tensor_release(src[i].tensor);
        loom_tensor_release(dst[i].tensor);
    }
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_every_dtype_round_trips_bit_exact_on_the_interpreter(void **state) {
    (void)state;
    run_round_trip(true);
}

static void test_every_dtype_round_trips_bit_exact_on_the_jit(void **state) {
    (void)state;
    run_round_trip(false);
}

static void test_a_saved_file_has_the_reference_writers_bytes_exactly(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float b[2] = {1.0f, -2.0f};
    int64_t a = 7;
    uint8_t q[3] = {1, 0, 1};
    loom_named_tensor ts[3] = {
        {"b", f32(ctx, 1, (int64_t[]){2}, b)},
        {"q\"\\\xc3\xa9z", loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, (int64_t[]){3}, q)},
        {"a", loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &a)},
    };
    const char *path = tmp_path("layout.safetensors");
    assert_int_equal(loom_safetensors_save(ctx, path, 3, ts), LOOM_OK);
    /* Names sorted, compact JSON with metadata first, the quote and backslash escaped and the
     * UTF-8 kept; 201 header bytes padded to 208 so the data starts at byte 216. */
    static const char header[] =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"q\\\"\\\\\xc3\xa9z\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[16,19]}}"
        "       ";
    static const uint8_t size_field[8] = {208, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t data[19] = {7, 0, 0,    0,    0, 0, 0, 0,    /* a = 7 */
                                     0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0, /* b = 1, -2 */
                                     1, 0, 1};                        /* q */
    assert_int_equal(sizeof header - 1, 208);
    size_t len;
    uint8_t *got = read_bytes(path, &len);
    assert_int_equal(len, 8 + 208 + 19);
    assert_memory_equal(got, size_field, 8);
    assert_memory_equal(got + 8, header, 208);
    assert_memory_equal(got + 216, data, 19);
    free(got);
    for (int i = 0; i < 3; i++)
        loom_tensor_release(ts[i].tensor);
    loom_context_destroy(ctx);
}

/* ---- files written elsewhere ------------------------------------------------------------- */

static void test_a_file_laid_out_by_the_reference_writer_loads(void **state) {
    (void)state;
    const char *dir = getenv("LOOM_TEST_DATA");
    assert_non_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/safetensors/reference.safetensors", dir);
    loom_context *ctx = tu_context(true);
    uint8_t zeros[64] = {0};
    loom_named_tensor ts[8] = {
        {"model.embed.weight",
         loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){3, 2}, zeros)},
        {"model.mask", loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, (int64_t[]){4}, zeros)},
        {"model.steps", loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, zeros)},
        {"half", loom_tensor_from_host(ctx, LOOM_DTYPE_F16, 1, (int64_t[]){2}, zeros)},
        {"brain", loom_tensor_from_host(ctx, LOOM_DTYPE_BF16, 1, (int64_t[]){2}, zeros)},
        {"count", loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){2}, zeros)},
        {"x.f64", loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 1, (int64_t[]){1}, zeros)},
        {"empty", loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){0, 4}, zeros)},
    };
    if (loom_safetensors_load(ctx, path, 8, ts, true) != LOOM_OK)
        fail_msg("%s", loom_context_error_message(ctx));
    float w[6];
    read_exact(ctx, ts[0].tensor, w, sizeof w);
    const float w_want[6] = {0.5f, -1.0f, 2.0f, 3.25f, -0.0f, 1e-3f};
    assert_memory_equal(w, w_want, sizeof w);
    uint8_t mask[4];
    read_exact(ctx, ts[1].tensor, mask, 4);
    assert_memory_equal(mask, ((uint8_t[]){1, 0, 0, 1}), 4);
    int64_t steps;
    read_exact(ctx, ts[2].tensor, &steps, 8);
    assert_true(steps == 1234567890123);
    uint16_t h[2], bf[2];
    read_exact(ctx, ts[3].tensor, h, 4);
    assert_int_equal(h[0], 0x3E00); /* 1.5 */
    assert_int_equal(h[1], 0xFBFF); /* -65504 */
    read_exact(ctx, ts[4].tensor, bf, 4);
    assert_int_equal(bf[0], 0x3F80); /* 1.0 */
    assert_int_equal(bf[1], 0xC060); /* -3.5 */
    int32_t count[2];
    read_exact(ctx, ts[5].tensor, count, 8);
    assert_int_equal(count[0], -7);
    assert_int_equal(count[1], INT32_MAX);
    double x;
    read_exact(ctx, ts[6].tensor, &x, 8);
    assert_true(x == 0.1);
    for (int i = 0; i < 8; i++)
        loom_tensor_release(ts[i].tensor);
    loom_context_destroy(ctx);
}

static void test_a_hand_written_file_with_spaces_escapes_and_no_padding_parses(void **state) {
    (void)state;
    /* As other writers may produce it: spaces and newlines, keys in any order, metadata last
     * with escapes, names with \u escapes (a surrogate pair among them), an odd header length
     * so the data is unaligned, and trailing spaces. */
    const char header[] =
        "{ \"w\" : {\"shape\" : [2], \"data_offsets\": [4, 12], \"dtype\": \"F32\"},\n"
        "  \"caf\\u00e9\\ud83d\\ude00\": {\"dtype\": \"I32\", \"data_offsets\": [0, 4],"
        " \"shape\": []},\n"
        "  \"__metadata__\": {\"source\": \"hand \\\"made\\\"\\n\\t\", \"format\": \"pt\"} }   ";
    assert_true((strlen(header) + 8) % 8 != 0);
    uint8_t data[12] = {0xFE, 0xFF, 0xFF, 0xFF, 0, 0, 0x80, 0x3F, 0, 0, 0x40, 0x40};
    uint8_t *b;
    size_t len = image(&b, header, data, sizeof data);
    char err[256] = "";
    loom_safetensors *f = NULL;
    if (loom_safetensors_parse(b, len, &f, err, sizeof err) != LOOM_OK)
        fail_msg("%s", err);
    memset(b, 0, len); /* parse copied the image */
    assert_int_equal(loom_safetensors_count(f), 2);
    const char *name;
    loom_dtype dt;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    const void *d;
    size_t size;
    assert_int_equal(loom_safetensors_tensor(f, 0, &name, &dt, &rank, shape, &d, &size), LOOM_OK);
    assert_string_equal(name, "caf\xc3\xa9\xf0\x9f\x98\x80"); /* "café😀" in UTF-8 */
    assert_int_equal(dt, LOOM_DTYPE_I32);
    assert_int_equal(rank, 0);
    assert_int_equal(size, 4);
    int32_t iv;
    memcpy(&iv, d, 4);
    assert_int_equal(iv, -2);
    assert_int_equal(loom_safetensors_tensor(f, 1, &name, &dt, &rank, shape, &d, &size), LOOM_OK);
    assert_string_equal(name, "w");
    assert_int_equal(dt, LOOM_DTYPE_F32);
    assert_int_equal(rank, 1);
    assert_int_equal(shape[0], 2);
    float fv[2];
    memcpy(fv, d, 8);
    assert_true(fv[0] == 1.0f && fv[1] == 3.0f);
    assert_int_equal(loom_safetensors_find(f, "w"), 1);
    assert_int_equal(loom_safetensors_find(f, "caf\xc3\xa9\xf0\x9f\x98\x80"), 0);
    assert_int_equal(loom_safetensors_find(f, "x"), -1);
    loom_safetensors_close(f);

    /* An empty checkpoint, and "__metadata__": null, are files too. */
    expect_parse("{}", NULL, 0, LOOM_OK, "");
}

/* ---- corruption -------------------------------------------------------------------------- */

static void test_parse_rejects_truncated_and_oversized_header_sizes(void **state) {
    (void)state;
    const uint8_t five[5] = {2, 0, 0, 0, 0};
    expect_parse_bytes(five, 5, LOOM_STATUS_CORRUPT_DATA,
                       "truncated: 5 bytes, too short for the 8-byte header size");
    expect_parse_bytes(NULL, 0, LOOM_STATUS_CORRUPT_DATA, "truncated: 0 bytes");
    uint8_t b[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_parse_bytes(b, 10, LOOM_STATUS_CORRUPT_DATA,
                       "truncated: header size 200 but only 2 bytes follow the size field");
    const uint8_t huge[10] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, '{', '}'};
    expect_parse_bytes(huge, 10, LOOM_STATUS_CORRUPT_DATA,
                       "header size 18446744073709551615 is over the limit of 100000000 bytes");
    /* Just over the limit, with the bytes really there: refused by the size alone. */
    const uint8_t over[10] = {0x01, 0xE1, 0xF5, 0x05, 0, 0, 0, 0, '{', '}'};
    expect_parse_bytes(over, 10, LOOM_STATUS_CORRUPT_DATA, "header size 100000001 is over");
}

static void test_parse_rejects_text_that_is_not_json(void **state) {
    (void)state;
    const loom_status bad = LOOM_STATUS_CORRUPT_DATA;
    expect_parse("", NULL, 0, bad, "does not start with '{'");
    expect_parse(" {}", NULL, 0, bad, "does not start with '{'");
    expect_parse("hello", NULL, 0, bad, "does not start with '{'");
    expect_parse("{", NULL, 0, bad, "expected a tensor name at byte 1, found the end");
    expect_parse("{\"a\" {}}", NULL, 0, bad, "expected ':' at byte 5, found '{'");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},}", NULL, 0, bad,
                 "expected a tensor name at byte 54, found '}'");
    expect_parse("{}x", NULL, 0, bad, "header has bytes after its JSON object, at byte 2");
    expect_parse("{} {}", NULL, 0, bad, "bytes after its JSON object, at byte 3");
    expect_parse("{\"a", NULL, 0, bad, "byte 1: unterminated string");
    expect_parse("{\"a\\x\":1}", NULL, 0, bad, "byte 3: invalid escape");
    expect_parse("{\"a\\u12\":1}", NULL, 0, bad, "\\u needs four hex digits");
    expect_parse("{\"\\ud800x\":1}", NULL, 0, bad, "a high surrogate \\u escape without a low");
    expect_parse("{\"\\udc00\":1}", NULL, 0, bad, "a low surrogate \\u escape without");
    expect_parse("{\"a\nb\":1}", NULL, 0, bad, "byte 3: unescaped control character");
    expect_parse("{\"\xc3\x28\":1}", NULL, 0, bad, "byte 2: invalid UTF-8");
    expect_parse("{\"\xc0\xaf\":1}", NULL, 0, bad, "invalid UTF-8");     /* overlong '/' */
    expect_parse("{\"\xed\xa0\x80\":1}", NULL, 0, bad, "invalid UTF-8"); /* a surrogate */
    expect_parse("{\"a\":[1]}", NULL, 0, bad, "tensor 'a': expected an object");
    expect_parse("{\"a\\u0000b\":{}}", NULL, 0, bad, "a name with a NUL character");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1 2],\"data_offsets\":[0,4]}}", NULL, 0, bad,
                 "expected ',' or ']' at byte 31, found '2'");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", NULL, 0, bad,
                 "a number with a leading zero");
    expect_parse("{\"__metadata__\":[]}", NULL, 0, bad, "__metadata__ is not an object of strings");
    expect_parse("{\"__metadata__\":{\"k\":1}}", NULL, 0, bad,
                 "__metadata__: the value of \"k\" is not a string");
}

static void test_parse_rejects_unknown_and_unsupported_dtypes(void **state) {
    (void)state;
    uint8_t d[4] = {0};
    expect_parse("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'w': unknown dtype \"F33\"");
    expect_parse("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4,
                 LOOM_STATUS_CORRUPT_DATA, "unknown dtype \"f32\"");
    expect_parse("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'w': dtype is not a string");
    const char *unsupported[] = {"U8", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        char h[128], want[64];
        snprintf(h, sizeof h, "{\"q\":{\"dtype\":\"%s\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                 unsupported[i]);
        snprintf(want, sizeof want, "tensor 'q': unsupported dtype %s (Loom reads", unsupported[i]);
        expect_parse(h, d, 4, LOOM_STATUS_UNSUPPORTED, want);
    }
}

static void test_parse_rejects_offsets_that_do_not_match_the_shape(void **state) {
    (void)state;
    uint8_t d[16] = {0};
    expect_parse("{\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", d,
                 12, LOOM_STATUS_CORRUPT_DATA,
                 "tensor 'fc1.weight': data_offsets [0, 12] hold 12 bytes, dtype F32 shape [4] "
                 "needs 16");
    expect_parse("{\"m\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", d, 16,
                 LOOM_STATUS_CORRUPT_DATA, "hold 16 bytes, dtype BF16 shape [2, 3] needs 12");
    expect_parse("{\"m\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", d, 16,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'm': data_offsets has 1 entries, needs 2");
    expect_parse("{\"m\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8,16]}}", d, 16,
                 LOOM_STATUS_CORRUPT_DATA, "data_offsets has more than 2 entries");
    expect_parse("{\"m\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", d, 16,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'm': no \"shape\"");
    expect_parse("{\"m\":{}}", d, 0, LOOM_STATUS_CORRUPT_DATA, "tensor 'm': no \"dtype\"");
    expect_parse("{\"m\":{\"dtype\":\"F32\",\"shape\":[4]}}", d, 16, LOOM_STATUS_CORRUPT_DATA,
                 "tensor 'm': no \"data_offsets\"");
    expect_parse("{\"m\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":1}}", d, 16,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'm': unknown key \"x\"");
}

static void test_parse_rejects_offsets_out_of_bounds_overlapping_or_leaving_gaps(void **state) {
    (void)state;
    uint8_t d[32] = {0};
    const loom_status bad = LOOM_STATUS_CORRUPT_DATA;
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 8, bad,
                 "tensor 'a': data_offsets [0, 16] run past the end of the data (8 bytes)");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9,9]}}", d, 8, bad,
                 "tensor 'a': data_offsets [9, 9] run past the end of the data (8 bytes)");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", d, 8, bad,
                 "tensor 'a': data_offsets [8, 4] run backwards");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 d, 12, bad, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 d, 8, bad, "tensor 'b': data_offsets [0, 8] overlap tensor 'a' at [0, 8]");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                 d, 12, bad, "data bytes [4, 8) belong to no tensor (a gap before tensor 'b')");
    expect_parse("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, bad,
                 "data bytes [0, 4) belong to no tensor (a gap before tensor 'b')");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 6, bad,
                 "data bytes [4, 6) belong to no tensor (after tensor 'a')");
    expect_parse("{}", d, 3, bad, "the header lists no tensors but 3 data bytes follow");
    /* A zero-size tensor inside another's bytes, as the reference reader also refuses. */
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                 d, 8, bad, "tensor 'z': data_offsets [4, 4] overlap tensor 'a'");
}

static void test_parse_rejects_duplicate_names_and_keys(void **state) {
    (void)state;
    uint8_t d[8] = {0};
    const loom_status bad = LOOM_STATUS_CORRUPT_DATA;
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 d, 8, bad, "tensor 'a' appears twice in the header");
    /* The same name spelled with an escape is the same name. */
    expect_parse("{\"ab\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 d, 8, bad, "tensor 'ab' appears twice in the header");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,4]}}",
                 d, 4, bad, "tensor 'a': key \"dtype\" appears twice");
    expect_parse("{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0, bad,
                 "__metadata__ appears twice");
    expect_parse("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", NULL, 0, bad,
                 "__metadata__: key \"k\" appears twice");
}

static void test_parse_rejects_huge_negative_and_fractional_numbers(void **state) {
    (void)state;
    uint8_t d[8] = {0};
    const loom_status bad = LOOM_STATUS_CORRUPT_DATA;
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                 "\"data_offsets\":[0,4]}}",
                 d, 4, bad,
                 "tensor 'a': shape[0] is too large (99999999999999999999; at most 2^63-1)");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,9223372036854775808]}}",
                 d, 4, bad, "tensor 'a': data_offsets[1] is too large");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[0,9223372036854775807]}}",
                 d, 4, bad, "data_offsets [0, 9223372036854775807] run past the end of the data");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", d, 4, bad,
                 "tensor 'a': shape[0] is negative (-1)");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", d, 4, bad,
                 "tensor 'a': shape[0] is 1.0, not an integer");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4e0]}}", d, 4, bad,
                 "tensor 'a': data_offsets[1] is 4e0, not an integer");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", d, 4, bad,
                 "tensor 'a': shape[0] is not an integer");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", d, 4, bad,
                 "tensor 'a': shape is not an array of integers");
    /* Extents whose product overflows: refused, not wrapped to a small size. */
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                 "\"data_offsets\":[0,0]}}",
                 d, 0, bad,
                 "tensor 'a': shape [4611686018427387904, 4] has more bytes than fit in 63 bits");
    expect_parse("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
                 "\"data_offsets\":[0,0]}}",
                 d, 0, bad, "has more bytes than fit");
    /* ...unless an extent is zero: then it holds nothing. */
    expect_parse("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,0,4],"
                 "\"data_offsets\":[0,0]}}",
                 d, 0, LOOM_OK, "");
}

static void test_parse_rejects_rank_above_eight_and_bools_other_than_0_or_1(void **state) {
    (void)state;
    uint8_t d[8] = {1, 0, 2, 1};
    expect_parse("{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                 "\"data_offsets\":[0,1]}}",
                 d, 1, LOOM_STATUS_CORRUPT_DATA, "tensor 'a': shape has more than 8 dimensions");
    expect_parse("{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1,1,1,1,1,1,1,1],"
                 "\"data_offsets\":[0,1]}}",
                 d, 1, LOOM_OK, "");
    expect_parse("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]}}", d, 4,
                 LOOM_STATUS_CORRUPT_DATA, "tensor 'm': BOOL element 2 is 2, not 0 or 1");
}

static void test_the_inspection_api_checks_its_arguments(void **state) {
    (void)state;
    char err[128] = "";
    loom_safetensors *f = (loom_safetensors *)(uintptr_t)1;
    assert_int_equal(loom_safetensors_parse(NULL, 4, &f, err, sizeof err),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(f);
    assert_string_equal(err, "data is NULL");
    assert_int_equal(loom_safetensors_parse("x", 1, NULL, NULL, 0), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_safetensors_open(NULL, &f, err, sizeof err),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_safetensors_open(tmp_path("nope"), &f, err, sizeof err),
                     LOOM_STATUS_IO_ERROR);
    expect_msg(err, "nope: cannot open: No such file or directory");
    assert_int_equal(loom_safetensors_open(tmp_dir, &f, err, sizeof err), LOOM_STATUS_IO_ERROR);
    expect_msg(err, ": is a folder: only regular files are read");
    assert_int_equal(loom_safetensors_count(NULL), 0);
    assert_int_equal(loom_safetensors_find(NULL, "a"), -1);
    assert_int_equal(loom_safetensors_tensor(NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    loom_safetensors_close(NULL);
    uint8_t *b;
    size_t len =
        image(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", "abcd", 4);
    assert_int_equal(loom_safetensors_parse(b, len, &f, err, sizeof err), LOOM_OK);
    assert_int_equal(loom_safetensors_tensor(f, 1, NULL, NULL, NULL, NULL, NULL, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_safetensors_tensor(f, -1, NULL, NULL, NULL, NULL, NULL, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_safetensors_tensor(f, 0, NULL, NULL, NULL, NULL, NULL, NULL), LOOM_OK);
    assert_int_equal(loom_safetensors_find(f, NULL), -1);
    loom_safetensors_close(f);
    /* A corrupt file through open names the path. */
    const char *p = tmp_path("short.safetensors");
    write_bytes(p, "\x01\x02", 2);
    assert_int_equal(loom_safetensors_open(p, &f, err, sizeof err), LOOM_STATUS_CORRUPT_DATA);
    expect_msg(err, "short.safetensors: truncated: 2 bytes");
}

/* ---- load errors ------------------------------------------------------------------------- */

/* A checkpoint of w = f32[2,2] {1,2,3,4} and b = f32[2] {5,6}. */
static const char *write_wb(loom_context *ctx, const char *name) {
    float w[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    loom_named_tensor ts[2] = {{"w", f32(ctx, 2, (int64_t[]){2, 2}, w)},
                               {"b", f32(ctx, 1, (int64_t[]){2}, b)}};
    const char *path = tmp_path(name);
    assert_int_equal(loom_safetensors_save(ctx, path, 2, ts), LOOM_OK);
    loom_tensor_release(ts[0].tensor);
    loom_tensor_release(ts[1].tensor);
    return path;
}

static void expect_f32(loom_context *ctx, loom_tensor *t, const float *want, size_t n) {
    float got[8];
    read_exact(ctx, t, got, n * sizeof *got);
    assert_memory_equal(got, want, n * sizeof *got);
}

static void test_load_of_a_missing_name_reports_it_and_assigns_nothing(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const char *path = write_wb(ctx, "wb1.safetensors");
    float z[4] = {0};
    loom_named_tensor ts[2] = {{"w", f32(ctx, 2, (int64_t[]){2, 2}, z)},
                               {"fc2.bias", f32(ctx, 1, (int64_t[]){2}, z)}};
    loom_status st = loom_safetensors_load(ctx, path, 2, ts, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("safetensors_load: ", "wb1.safetensors: tensor 'fc2.bias' is not in "
                                                "the file (it holds 2 tensors)"));
    expect_f32(ctx, ts[0].tensor, z, 4); /* "w" was valid but is not assigned */
    /* The same names listed twice are refused before the file is read. */
    loom_named_tensor twice[2] = {{"w", ts[0].tensor}, {"w", ts[0].tensor}};
    st = loom_safetensors_load(ctx, path, 2, twice, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("tensor 'w' is listed twice"));
    loom_tensor_release(ts[0].tensor);
    loom_tensor_release(ts[1].tensor);
    loom_context_destroy(ctx);
}

static void test_load_rejects_dtype_and_shape_mismatches(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const char *path = write_wb(ctx, "wb2.safetensors");
    float z[4] = {0};
    double zd[4] = {0};
    loom_tensor *b_ok = f32(ctx, 1, (int64_t[]){2}, z);
    loom_tensor *w_t = f32(ctx, 2, (int64_t[]){4, 1}, z);
    loom_tensor *w_d = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 2, (int64_t[]){2, 2}, zd);
    loom_tensor *w_r = f32(ctx, 1, (int64_t[]){4}, z);
    loom_named_tensor ts[2] = {{"b", b_ok}, {"w", w_t}};
    loom_status st = loom_safetensors_load(ctx, path, 2, ts, true);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("wb2.safetensors: tensor 'w': the file holds f32[2,2], the tensor is "
                          "f32[4,1]"));
    ts[1].tensor = w_d;
    st = loom_safetensors_load(ctx, path, 2, ts, true);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("tensor 'w': the file holds f32[2,2], the tensor is f64[2,2]"));
    ts[1].tensor = w_r;
    st = loom_safetensors_load(ctx, path, 2, ts, true);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("the file holds f32[2,2], the tensor is f32[4]"));
    expect_f32(ctx, b_ok, z, 2); /* nothing was assigned */
    /* A step's result cannot receive a value. */
    loom_tensor *sum = loom_add(ctx, b_ok, b_ok);
    loom_named_tensor res[1] = {{"b", sum}};
    st = loom_safetensors_load(ctx, path, 1, res, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("tensor 'b' is a result of this step; load into a long-lived tensor"));
    /* Nor can a NULL or stale handle. */
    loom_named_tensor null_t[1] = {{"b", NULL}};
    st = loom_safetensors_load(ctx, path, 1, null_t, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("tensor 'b' is NULL"));
    loom_tensor *dead = f32(ctx, 1, (int64_t[]){2}, z);
    loom_tensor_release(dead);
    loom_named_tensor stale[1] = {{"b", dead}};
    st = loom_safetensors_load(ctx, path, 1, stale, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_STALE_HANDLE, WHAT("tensor 'b': the handle is stale"));
    loom_tensor_release(b_ok);
    loom_tensor_release(w_t);
    loom_tensor_release(w_d);
    loom_tensor_release(w_r);
    loom_context_destroy(ctx);
}

static void test_strict_load_rejects_tensors_the_caller_did_not_list(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const char *path = write_wb(ctx, "wb3.safetensors");
    float z[4] = {0};
    loom_named_tensor ts[1] = {{"w", f32(ctx, 2, (int64_t[]){2, 2}, z)}};
    loom_status st = loom_safetensors_load(ctx, path, 1, ts, true);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("wb3.safetensors: strict: 1 tensor in the file is not listed: 'b'"));
    expect_f32(ctx, ts[0].tensor, z, 4);
    st = loom_safetensors_load(ctx, path, 0, NULL, true);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("strict: 2 tensors in the file are not listed: 'b', 'w'"));
    /* Not strict: a subset loads. */
    assert_int_equal(loom_safetensors_load(ctx, path, 1, ts, false), LOOM_OK);
    expect_f32(ctx, ts[0].tensor, (float[]){1, 2, 3, 4}, 4);
    loom_tensor_release(ts[0].tensor);
    loom_context_destroy(ctx);
}

static void test_load_of_a_corrupt_or_missing_file_names_the_path(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float z[4] = {0};
    loom_named_tensor ts[1] = {{"w", f32(ctx, 1, (int64_t[]){4}, z)}};
    loom_status st = loom_safetensors_load(ctx, tmp_path("absent.safetensors"), 1, ts, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_IO_ERROR,
                     WHAT("safetensors_load: ", "absent.safetensors: cannot open: No such file"));
    uint8_t *b;
    size_t len =
        image(&b, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", z, 12);
    const char *p = tmp_path("corrupt.safetensors");
    write_bytes(p, b, len);
    st = loom_safetensors_load(ctx, p, 1, ts, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_CORRUPT_DATA,
                     WHAT("corrupt.safetensors: tensor 'w': data_offsets [0, 12] hold 12 bytes"));
    len = image(&b, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", z, 4);
    p = tmp_path("u8.safetensors");
    write_bytes(p, b, len);
    st = loom_safetensors_load(ctx, p, 1, ts, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_UNSUPPORTED,
                     WHAT("u8.safetensors: tensor 'w': unsupported dtype U8"));
    st = loom_safetensors_load(ctx, NULL, 1, ts, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("path is NULL"));
    loom_named_tensor no_name[1] = {{NULL, ts[0].tensor}};
    st = loom_safetensors_load(ctx, p, 1, no_name, false);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("the name of tensor 0 is NULL"));
    assert_int_equal(loom_safetensors_load(NULL, p, 0, NULL, false), LOOM_STATUS_INVALID_ARGUMENT);
    expect_f32(ctx, ts[0].tensor, z, 4);
    loom_tensor_release(ts[0].tensor);
    loom_context_destroy(ctx);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_safetensors: opening a FIFO blocked\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

/* A sparse file of `size` bytes whose first bytes are head (len). */
static void sparse_file(const char *path, const void *head, size_t len, off_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, head, len), (ssize_t)len);
    assert_int_equal(ftruncate(fd, size), 0);
    assert_int_equal(close(fd), 0);
}

static long max_rss_kb(void) {
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

/* A FIFO is refused without waiting for a writer, and a huge file whose header is wrong, or
 * whose data area holds more than its tensors, is refused after its header alone is read:
 * no time or memory that grows with the file. */
static void test_fifos_and_huge_bad_files_are_refused_without_reading_them(void **state) {
    (void)state;
    char err[512];
    loom_safetensors *f = NULL;
    const char *fifo = tmp_path("pipe.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_alarm);
    alarm(10);
    assert_int_equal(loom_safetensors_open(fifo, &f, err, sizeof err), LOOM_STATUS_IO_ERROR);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    expect_msg(err, "pipe.safetensors: is a FIFO: only regular files are read");
    assert_null(f);
    assert_int_equal(unlink(fifo), 0);

    long rss0 = max_rss_kb();
    time_t t0 = time(NULL);
    /* 3 GB of nothing after a size field of 0xff...: "bad magic" from 8 bytes */
    const char *big = tmp_path("huge.safetensors");
    uint8_t ff[8];
    memset(ff, 0xff, sizeof ff);
    sparse_file(big, ff, sizeof ff, (off_t)3 << 30);
    assert_int_equal(loom_safetensors_open(big, &f, err, sizeof err), LOOM_STATUS_CORRUPT_DATA);
    expect_msg(err, "is over the limit");
    /* a well-formed header for 16 bytes, then 2 GB: the layout check needs only the header */
    uint8_t *b;
    float z[4] = {0};
    size_t len = image(&b, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", z, 16);
    sparse_file(big, b, len, (off_t)2 << 30);
    assert_int_equal(loom_safetensors_open(big, &f, err, sizeof err), LOOM_STATUS_CORRUPT_DATA);
    expect_msg(err, "belong to no tensor");
    assert_true(max_rss_kb() - rss0 < 64 * 1024); /* not the file's gigabytes */
    assert_true(time(NULL) - t0 < 10);
    assert_int_equal(unlink(big), 0);
}

/* ---- save -------------------------------------------------------------------------------- */

static void test_a_failed_save_leaves_the_previous_file_intact(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const char *path = write_wb(ctx, "keep.safetensors");
    size_t len0;
    uint8_t *before = read_bytes(path, &len0);
    float v[4] = {9, 9, 9, 9};
    loom_named_tensor ts[1] = {{"w", f32(ctx, 1, (int64_t[]){4}, v)}};

    /* A folder that does not exist. */
    loom_status st = loom_safetensors_save(ctx, tmp_path("no/such/dir/x.safetensors"), 1, ts);
    expect_ctx_error(ctx, st, LOOM_STATUS_IO_ERROR,
                     WHAT("safetensors_save: ", "x.safetensors", "No such file or directory"));
    /* A path that is a folder: refused before anything is written. */
    const char *dir = tmp_path("a_dir.safetensors");
    assert_int_equal(mkdir(dir, 0755), 0);
    st = loom_safetensors_save(ctx, dir, 1, ts);
    expect_ctx_error(ctx, st, LOOM_STATUS_IO_ERROR,
                     WHAT("a_dir.safetensors", "is a folder: not replaced"));
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    /* Bad arguments fail before anything is written. */
    loom_named_tensor twice[2] = {{"w", ts[0].tensor}, {"w", ts[0].tensor}};
    st = loom_safetensors_save(ctx, path, 2, twice);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("keep.safetensors: tensor 'w' is listed twice"));

    size_t len1;
    uint8_t *after = read_bytes(path, &len1);
    assert_int_equal(len1, len0);
    assert_memory_equal(after, before, len0);
    free(before);
    free(after);
    /* No temporary file is left behind. */
    DIR *d = opendir(tmp_dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp."))
            fail_msg("left behind: %s", e->d_name);
    closedir(d);
    /* And a good save replaces it. */
    assert_int_equal(loom_safetensors_save(ctx, path, 1, ts), LOOM_OK);
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, NULL, 0), LOOM_OK);
    assert_int_equal(loom_safetensors_count(f), 1);
    loom_safetensors_close(f);
    loom_tensor_release(ts[0].tensor);
    loom_context_destroy(ctx);
}

static void test_save_rejects_bad_names_and_handles(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float v[2] = {1, 2};
    loom_tensor *t = f32(ctx, 1, (int64_t[]){2}, v);
    const char *path = tmp_path("names.safetensors");
    static const struct {
        const char *name, *why;
    } cases[] = {
        {NULL, "the name of tensor 0 is NULL"},
        {"", "the name of tensor 0 is empty"},
        {"__metadata__", "the name of tensor 0 is reserved for the file's metadata"},
        {"a\nb", "the name of tensor 0 holds a control character"},
        {"a\x7f", "the name of tensor 0 holds a control character"},
        {"caf\xe9", "the name of tensor 0 is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        loom_named_tensor ts[1] = {{cases[i].name, t}};
        loom_status st = loom_safetensors_save(ctx, path, 1, ts);
        expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT(cases[i].why));
    }
    loom_tensor *dead = f32(ctx, 1, (int64_t[]){2}, v);
    loom_tensor_release(dead);
    loom_named_tensor stale[1] = {{"x", dead}};
    loom_status st = loom_safetensors_save(ctx, path, 1, stale);
    expect_ctx_error(ctx, st, LOOM_STATUS_STALE_HANDLE, WHAT("tensor 'x': the handle is stale"));
    loom_context *other = tu_context(true);
    loom_tensor *foreign = f32(other, 1, (int64_t[]){2}, v);
    loom_named_tensor wrong[1] = {{"x", foreign}};
    st = loom_safetensors_save(ctx, path, 1, wrong);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT,
                     WHAT("tensor 'x': not a tensor handle of this context"));
    st = loom_safetensors_save(ctx, path, -1, NULL);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("the tensor count is negative"));
    st = loom_safetensors_save(ctx, path, 1, NULL);
    expect_ctx_error(ctx, st, LOOM_STATUS_INVALID_ARGUMENT, WHAT("ts is NULL"));
    assert_int_equal(loom_safetensors_save(NULL, path, 0, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(access(path, F_OK), -1); /* nothing was written */
    /* Zero tensors is a valid, empty checkpoint. */
    assert_int_equal(loom_safetensors_save(ctx, path, 0, NULL), LOOM_OK);
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, NULL, 0), LOOM_OK);
    assert_int_equal(loom_safetensors_count(f), 0);
    loom_safetensors_close(f);
    loom_tensor_release(foreign);
    loom_context_destroy(other);
    loom_tensor_release(t);
    loom_context_destroy(ctx);
}

static void test_save_computes_pending_values_in_one_graph(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float v[3] = {1, -2, 3.5f};
    loom_tensor *x = f32(ctx, 1, (int64_t[]){3}, v);
    loom_tensor *w = f32(ctx, 1, (int64_t[]){3}, v);
    /* A result of this step and a pending assignment, neither computed yet. */
    loom_tensor *y = loom_mul(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 2));
    assert_int_equal(loom_assign(ctx, w, loom_add(ctx, w, x)), LOOM_OK);
    loom_named_tensor ts[2] = {{"y", y}, {"w", w}};
    const char *path = tmp_path("pending.safetensors");
    assert_int_equal(loom_safetensors_save(ctx, path, 2, ts), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "ForcedReads"), 1);
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, NULL, 0), LOOM_OK);
    const void *d;
    float got[3];
    assert_int_equal(
        loom_safetensors_tensor(f, loom_safetensors_find(f, "y"), NULL, NULL, NULL, NULL, &d, NULL),
        LOOM_OK);
    memcpy(got, d, sizeof got);
    assert_true(got[0] == 2 && got[1] == -4 && got[2] == 7);
    assert_int_equal(
        loom_safetensors_tensor(f, loom_safetensors_find(f, "w"), NULL, NULL, NULL, NULL, &d, NULL),
        LOOM_OK);
    memcpy(got, d, sizeof got);
    assert_true(got[0] == 2 && got[1] == -4 && got[2] == 7);
    loom_safetensors_close(f);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    expect_f32(ctx, w, (float[]){2, -4, 7}, 3);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

/* ---- out of memory ----------------------------------------------------------------------- */

/* Fails the k-th allocation after the context exists, for every k until the call succeeds:
 * each failure is OUT_OF_MEMORY, writes nothing, leaves the context working and leaks
 * nothing. */
static void test_out_of_memory_anywhere_in_save_fails_cleanly(void **state) {
    (void)state;
    int64_t failures = 0;
    for (int64_t k = 1; k < 400; k++) {
        test_alloc ta = {0};
        loom_context *ctx = tu_context_alloc(true, &ta);
        float v[4] = {1, 2, 3, 4};
        loom_tensor *a = f32(ctx, 1, (int64_t[]){4}, v);
        loom_tensor *b = f32(ctx, 2, (int64_t[]){2, 2}, v);
        loom_tensor *c = loom_add(ctx, a, a); /* pending: save computes it */
        loom_named_tensor ts[3] = {{"a", a}, {"b", b}, {"c", c}};
        char name[32];
        snprintf(name, sizeof name, "oom%d.safetensors", (int)k);
        const char *path = tmp_path(name);
        ta.fail_at = ta.n_allocs + k;
        loom_status st = loom_safetensors_save(ctx, path, 3, ts);
        ta.fail_at = 0;
        if (st == LOOM_OK) {
            loom_safetensors *f = NULL;
            assert_int_equal(loom_safetensors_open(path, &f, NULL, 0), LOOM_OK);
            const void *d;
            assert_int_equal(loom_safetensors_tensor(f, 2, NULL, NULL, NULL, NULL, &d, NULL),
                             LOOM_OK);
            assert_memory_equal(d, ((float[]){2, 4, 6, 8}), 16);
            loom_safetensors_close(f);
        } else {
            failures++;
            assert_int_equal(ta.n_failed, 1);
            expect_ctx_error(ctx, st, LOOM_STATUS_OUT_OF_MEMORY, WHAT("safetensors_save: "));
            assert_int_equal(access(path, F_OK), -1); /* nothing was written */
        }
        loom_tensor_release(a);
        loom_tensor_release(b);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        if (st == LOOM_OK)
            break;
    }
    assert_true(failures > 3);
}

static void test_out_of_memory_anywhere_in_load_fails_cleanly(void **state) {
    (void)state;
    loom_context *writer = tu_context(true);
    const char *path = write_wb(writer, "oom_load.safetensors");
    loom_context_destroy(writer);
    int64_t failures = 0;
    for (int64_t k = 1; k < 400; k++) {
        test_alloc ta = {0};
        loom_context *ctx = tu_context_alloc(true, &ta);
        float z[4] = {0};
        loom_named_tensor ts[2] = {{"w", f32(ctx, 2, (int64_t[]){2, 2}, z)},
                                   {"b", f32(ctx, 1, (int64_t[]){2}, z)}};
        ta.fail_at = ta.n_allocs + k;
        loom_status st = loom_safetensors_load(ctx, path, 2, ts, true);
        ta.fail_at = 0;
        if (st == LOOM_OK) {
            assert_int_equal(loom_mark_step(ctx), LOOM_OK);
            expect_f32(ctx, ts[0].tensor, (float[]){1, 2, 3, 4}, 4);
            expect_f32(ctx, ts[1].tensor, (float[]){5, 6}, 2);
        } else {
            failures++;
            expect_ctx_error(ctx, st, LOOM_STATUS_OUT_OF_MEMORY, WHAT("safetensors_load: "));
            expect_f32(ctx, ts[0].tensor, z, 4); /* nothing assigned */
        }
        loom_tensor_release(ts[0].tensor);
        loom_tensor_release(ts[1].tensor);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        if (st == LOOM_OK)
            break;
    }
    assert_true(failures > 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_dtype_round_trips_bit_exact_on_the_interpreter),
        cmocka_unit_test(test_every_dtype_round_trips_bit_exact_on_the_jit),
        cmocka_unit_test(test_a_saved_file_has_the_reference_writers_bytes_exactly),
        cmocka_unit_test(test_a_file_laid_out_by_the_reference_writer_loads),
        cmocka_unit_test(test_a_hand_written_file_with_spaces_escapes_and_no_padding_parses),
        cmocka_unit_test(test_parse_rejects_truncated_and_oversized_header_sizes),
        cmocka_unit_test(test_parse_rejects_text_that_is_not_json),
        cmocka_unit_test(test_parse_rejects_unknown_and_unsupported_dtypes),
        cmocka_unit_test(test_parse_rejects_offsets_that_do_not_match_the_shape),
        cmocka_unit_test(test_parse_rejects_offsets_out_of_bounds_overlapping_or_leaving_gaps),
        cmocka_unit_test(test_parse_rejects_duplicate_names_and_keys),
        cmocka_unit_test(test_parse_rejects_huge_negative_and_fractional_numbers),
        cmocka_unit_test(test_parse_rejects_rank_above_eight_and_bools_other_than_0_or_1),
        cmocka_unit_test(test_the_inspection_api_checks_its_arguments),
        cmocka_unit_test(test_load_of_a_missing_name_reports_it_and_assigns_nothing),
        cmocka_unit_test(test_load_rejects_dtype_and_shape_mismatches),
        cmocka_unit_test(test_strict_load_rejects_tensors_the_caller_did_not_list),
        cmocka_unit_test(test_load_of_a_corrupt_or_missing_file_names_the_path),
        cmocka_unit_test(test_fifos_and_huge_bad_files_are_refused_without_reading_them),
        cmocka_unit_test(test_a_failed_save_leaves_the_previous_file_intact),
        cmocka_unit_test(test_save_rejects_bad_names_and_handles),
        cmocka_unit_test(test_save_computes_pending_values_in_one_graph),
        cmocka_unit_test(test_out_of_memory_anywhere_in_save_fails_cleanly),
        cmocka_unit_test(test_out_of_memory_anywhere_in_load_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
