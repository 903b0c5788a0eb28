/* Tests of the on-disk code cache: round trips, misses, every kind of damaged file, forged
 * entries, unsafely owned folders and entries, the key, the size cap, hash collisions,
 * unwritable folders, the default folder, XXH3 and out-of-memory. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/disk_cache.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- temp folders ------------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup_dir(void **state) {
    char *dir = strdup("/tmp/loom_disk_cache_XXXXXX");
    if (!dir || !mkdtemp(dir))
        return -1;
    *state = dir;
    return 0;
}

static int teardown_dir(void **state) {
    nftw(*state, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(*state);
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static void put_ok(const char *dir, const char *key, const void *data, size_t len) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_disk_cache_put(dir, key, data, len, &sys, &d) != LOOM_OK)
        fail_msg("put %s: %s", key, d.msg);
}

/* get that must succeed (hit or miss); returns the payload (free: len + 1) or NULL. */
static char *get_ok(const char *dir, const char *key, size_t *len) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    void *data = (void *)&d;
    if (loom_rt_disk_cache_get(dir, key, &sys, &data, len, &d) != LOOM_OK)
        fail_msg("get %s: %s", key, d.msg);
    return data;
}

static void path_of(char *buf, size_t n, const char *dir, const char *key) {
    snprintf(buf, n, "%s/%016llx.loomobj", dir,
             (unsigned long long)loom_rt_hash64(key, strlen(key)));
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Reads path whole into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* get must fail with CORRUPT_DATA naming the file and containing `what`. */
static void expect_corrupt(const char *dir, const char *key, const char *what) {
    char path[512];
    path_of(path, sizeof path, dir, key);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    void *data = (void *)&d;
    size_t len = 99;
    assert_int_equal(loom_rt_disk_cache_get(dir, key, &sys, &data, &len, &d),
                     LOOM_STATUS_CORRUPT_DATA);
    assert_null(data);
    assert_int_equal(len, 0);
    if (!strstr(d.msg, path) || !strstr(d.msg, what))
        fail_msg("message \"%s\" should name %s and say \"%s\"", d.msg, path, what);
}

static const char payload[] = "\x7f" "ELF object code \x00\x01\x02 with a NUL inside";
#define PAYLOAD_LEN (sizeof payload - 1)

/* ---- XXH3 --------------------------------------------------------------------------------- */

/* The checksum is libxxhash's XXH3-64 (seed 0): the value xxHash documents for the empty
 * input, and the library's own for short, mid and long inputs (each XXH3 size class). */
static void test_hash64_is_xxh3(void **state) {
    (void)state;
    assert_true(loom_rt_hash64("", 0) == 0x2D06800538D394C2ull);
    static char buf[4096];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (char)(i * 131 + 7);
    static const size_t lens[] = {1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1000, 4096};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        assert_true(loom_rt_hash64(buf, lens[k]) == XXH3_64bits(buf, lens[k]));
    assert_true(loom_rt_hash64("abc", 3) != loom_rt_hash64("abd", 3));
}

/* ---- round trips -------------------------------------------------------------------------- */

static void test_put_then_get_returns_the_payload(void **state) {
    const char *dir = *state;
    const char *key = "cpu=znver3 loom=0.1.0 opt=2 graph=0123456789abcdef";
    put_ok(dir, key, payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, key);
    /* 8 magic + 4 version + 4 key length + key + 8 payload length + payload + 32 MAC */
    assert_int_equal(file_size(path), (long)(56 + strlen(key) + PAYLOAD_LEN));
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600); /* the user's alone */

    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(loom_rt_disk_cache_get(dir, key, &a, &data, &len, &d), LOOM_OK);
    assert_non_null(data);
    assert_int_equal(len, PAYLOAD_LEN);
    assert_memory_equal(data, payload, PAYLOAD_LEN);
    assert_int_equal(((char *)data)[len], '\0');
    assert_int_equal(ta.live_bytes, (int64_t)len + 1); /* exactly the documented block */
    assert_int_equal(ta.live_blocks, 1);
    loom_ir_free(&a, data, len + 1);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_put_creates_missing_folders(void **state) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/a/b/c", (const char *)*state);
    put_ok(dir, "k", "xyz", 3);
    struct stat sb;
    assert_int_equal(stat(dir, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0700); /* only its owner can plant code there */
    size_t len = 0;
    char *data = get_ok(dir, "k", &len);
    assert_non_null(data);
    assert_string_equal(data, "xyz");
    loom_ir_free(&sys, data, len + 1);
}

static void test_empty_payload_is_a_hit_not_a_miss(void **state) {
    const char *dir = *state;
    put_ok(dir, "empty", NULL, 0);
    size_t len = 99;
    char *data = get_ok(dir, "empty", &len);
    assert_non_null(data);
    assert_int_equal(len, 0);
    assert_int_equal(data[0], '\0');
    loom_ir_free(&sys, data, 1);
}

static void test_put_replaces_an_earlier_payload(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", "first", 5);
    put_ok(dir, "k", "second!", 7);
    size_t len = 0;
    char *data = get_ok(dir, "k", &len);
    assert_int_equal(len, 7);
    assert_string_equal(data, "second!");
    loom_ir_free(&sys, data, len + 1);
}

static void test_get_of_an_unknown_key_or_folder_is_a_miss(void **state) {
    const char *dir = *state;
    put_ok(dir, "known", "v", 1);
    size_t len = 5;
    assert_null(get_ok(dir, "unknown", &len));
    assert_int_equal(len, 0);
    char missing[512];
    snprintf(missing, sizeof missing, "%s/no/such/folder", dir);
    assert_null(get_ok(missing, "known", &len));
}

/* ---- damaged files ------------------------------------------------------------------------ */

static void test_a_flipped_payload_byte_fails_the_mac(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    img[8 + 4 + 4 + 1 + 8 + 5] ^= 0x10; /* the payload's 6th byte */
    spit(path, img, n);
    free(img);
    expect_corrupt(dir, "k", "fails its MAC");
}

static void test_a_flipped_mac_byte_is_corrupt(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    img[n - 1] ^= 1;
    spit(path, img, n);
    free(img);
    expect_corrupt(dir, "k", "fails its MAC");
}

static void test_a_truncated_file_is_corrupt(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    spit(path, img, n - 10); /* lost part of the MAC */
    expect_corrupt(dir, "k", "truncated");
    spit(path, img, 20); /* shorter than the fixed fields */
    expect_corrupt(dir, "k", "truncated: 20 bytes");
    spit(path, img, 0);
    expect_corrupt(dir, "k", "truncated: 0 bytes");
    free(img);
}

static void test_trailing_bytes_are_corrupt(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    unsigned char *longer = malloc(n + 3);
    memcpy(longer, img, n);
    memset(longer + n, 0xab, 3);
    spit(path, longer, n + 3);
    free(longer);
    free(img);
    expect_corrupt(dir, "k", "stray bytes");
}

static void test_wrong_magic_or_version_is_corrupt(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    unsigned char *bad = malloc(n);
    memcpy(bad, img, n);
    memcpy(bad, "\x7f" "ELF\x02\x01\x01\x00", 8);
    spit(path, bad, n);
    expect_corrupt(dir, "k", "bad magic");
    memcpy(bad, img, n);
    bad[8] = 2; /* format version 2: an XXH3 checksum, an older Loom's */
    spit(path, bad, n);
    expect_corrupt(dir, "k", "format version 2, this Loom reads 3");
    free(bad);
    free(img);
}

static void test_a_key_length_past_the_end_is_corrupt(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    size_t n;
    unsigned char *img = slurp(path, &n);
    img[12] = 0xff; /* key length 255 in a file of ~100 bytes */
    spit(path, img, n);
    free(img);
    expect_corrupt(dir, "k", "runs past the end");
}

static void test_a_folder_in_place_of_the_file_is_corrupt(void **state) {
    const char *dir = *state;
    char path[512];
    path_of(path, sizeof path, dir, "k");
    assert_int_equal(mkdir(path, 0755), 0);
    expect_corrupt(dir, "k", "not a regular file");
    rmdir(path);
}

static void test_put_over_a_corrupt_file_repairs_it(void **state) {
    const char *dir = *state;
    char path[512];
    path_of(path, sizeof path, dir, "k");
    spit(path, "garbage", 7);
    expect_corrupt(dir, "k", "truncated");
    put_ok(dir, "k", "fresh", 5);
    size_t len = 0;
    char *data = get_ok(dir, "k", &len);
    assert_string_equal(data, "fresh");
    loom_ir_free(&sys, data, len + 1);
}

/* ---- collisions and unwritable folders ---------------------------------------------------- */

static void test_a_file_holding_another_key_is_a_miss(void **state) {
    const char *dir = *state;
    /* A valid file for key B under key A's name: what a 64-bit hash collision looks like. */
    put_ok(dir, "key-B", "payload of B", 12);
    char path_a[512], path_b[512];
    path_of(path_a, sizeof path_a, dir, "key-A");
    path_of(path_b, sizeof path_b, dir, "key-B");
    assert_int_equal(rename(path_b, path_a), 0);
    size_t len = 7;
    assert_null(get_ok(dir, "key-A", &len));
    assert_int_equal(len, 0);
    /* Same for a key that is a prefix of the stored one (lengths differ, bytes agree). */
    put_ok(dir, "key-AB", "x", 1);
    char path_ab[512];
    path_of(path_ab, sizeof path_ab, dir, "key-AB");
    assert_int_equal(rename(path_ab, path_a), 0);
    assert_null(get_ok(dir, "key-A", &len));
}

static void test_put_under_a_regular_file_fails_and_get_misses(void **state) {
    /* chmod cannot stop root from writing; a folder under a regular file fails for all. */
    char file[512], dir[512];
    snprintf(file, sizeof file, "%s/file.txt", (const char *)*state);
    spit(file, "x", 1);
    assert_true(snprintf(dir, sizeof dir, "%.500s/sub", file) < (int)sizeof dir);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(dir, "k", "v", 1, &sys, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "cannot create folder"));
    assert_non_null(strstr(d.msg, dir));
    size_t len = 3;
    assert_null(get_ok(dir, "k", &len));
    assert_int_equal(len, 0);
    /* The file itself as the folder. */
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(file, "k", "v", 1, &sys, &d), LOOM_STATUS_IO_ERROR);
    assert_null(get_ok(file, "k", &len));
}

static void test_bad_arguments_are_rejected(void **state) {
    const char *dir = *state;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(dir, "", "v", 1, &sys, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_disk_cache_put(NULL, "k", "v", 1, &sys, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_disk_cache_put(dir, "k", NULL, 1, &sys, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(loom_rt_disk_cache_get(dir, NULL, &sys, &data, &len, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_disk_cache_get(dir, "k", &sys, NULL, &len, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
}

/* ---- planted code ------------------------------------------------------------------------ */

/* An entry laid out exactly as Loom writes one, with a MAC under a key that is not this
 * user's (another user's Loom, or an attacker who recomputed every checksum): rejected. */
static void test_an_entry_under_another_key_is_rejected(void **state) {
    const char *dir = *state;
    char key_a[700], saved[600];
    snprintf(saved, sizeof saved, "%s", getenv("LOOM_CACHE_KEY"));
    snprintf(key_a, sizeof key_a, "%s.other", saved);
    setenv("LOOM_CACHE_KEY", key_a, 1); /* the other user's secret */
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    setenv("LOOM_CACHE_KEY", saved, 1);
    expect_corrupt(dir, "k", "fails its MAC");
    unlink(key_a);
    /* and once rewritten under this user's key, it loads */
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    size_t len = 0;
    char *data = get_ok(dir, "k", &len);
    assert_int_equal(len, PAYLOAD_LEN);
    loom_ir_free(&sys, data, len + 1);
}

static void expect_io_error(const char *dir, const char *what) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(loom_rt_disk_cache_get(dir, "k", &sys, &data, &len, &d),
                     LOOM_STATUS_IO_ERROR);
    assert_null(data);
    if (!strstr(d.msg, what) || !strstr(d.msg, dir))
        fail_msg("get: message \"%s\" should name %s and say \"%s\"", d.msg, dir, what);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(dir, "k", "v", 1, &sys, &d), LOOM_STATUS_IO_ERROR);
    if (!strstr(d.msg, what) || !strstr(d.msg, "chmod 700"))
        fail_msg("put: message \"%s\" should say \"%s\" and what to do", d.msg, what);
}

/* A folder others can write (a shared 1777 folder, a group's) is not used at all. */
static void test_a_folder_others_can_write_is_not_used(void **state) {
    const char *dir = *state;
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    assert_int_equal(chmod(dir, 01777), 0);
    expect_io_error(dir, "writable by group or others");
    assert_int_equal(chmod(dir, 0770), 0);
    expect_io_error(dir, "writable by group or others");
    assert_int_equal(chmod(dir, 0700), 0);
    size_t len = 0;
    char *data = get_ok(dir, "k", &len);
    assert_non_null(data);
    loom_ir_free(&sys, data, len + 1);
}

/* Entries and folders another user owns: only root can make them here (chown). */
static void test_entries_and_folders_of_another_user_are_not_used(void **state) {
    const char *dir = *state;
    if (geteuid() != 0) {
        print_message("not root: cannot give a file to another user (skipped)\n");
        skip();
    }
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    char path[512];
    path_of(path, sizeof path, dir, "k");
    assert_int_equal(chown(path, 1, 1), 0); /* daemon's */
    expect_corrupt(dir, "k", "owned by another user");
    assert_int_equal(chown(path, 0, 0), 0);
    assert_int_equal(chmod(path, 0666), 0);
    expect_corrupt(dir, "k", "writable by group or others");
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(chown(dir, 1, 1), 0);
    expect_io_error(dir, "owned by another user");
    assert_int_equal(chown(dir, 0, 0), 0);
}

/* A link, a FIFO at an entry's name: refused without following or waiting; a 3 GB sparse
 * file: refused from its header, not read whole. */
static void test_links_fifos_and_huge_files_are_refused_cheaply(void **state) {
    const char *dir = *state;
    char path[512], target[600];
    path_of(path, sizeof path, dir, "k");
    snprintf(target, sizeof target, "%s/elsewhere", dir);
    put_ok(dir, "k2", payload, PAYLOAD_LEN);
    char p2[512];
    path_of(p2, sizeof p2, dir, "k2");
    assert_int_equal(symlink(p2, path), 0);
    expect_corrupt(dir, "k", "not a regular file");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(10); /* a blocking open would hang: SIGALRM fails the test */
    expect_corrupt(dir, "k", "not a regular file");
    alarm(0);
    assert_int_equal(unlink(path), 0);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)3 << 30), 0);
    close(fd);
    expect_corrupt(dir, "k", "bad magic");
    getrusage(RUSAGE_SELF, &r1);
    assert_true(r1.ru_maxrss - r0.ru_maxrss < 64 * 1024); /* kB: not the file's 3 GB */
    assert_int_equal(unlink(path), 0);
}

/* The key: created 0600 on first use; one that others can read turns the cache off. */
static void test_the_key_is_private_or_the_cache_is_off(void **state) {
    const char *dir = *state;
    char saved[600], fresh[700];
    snprintf(saved, sizeof saved, "%s", getenv("LOOM_CACHE_KEY"));
    snprintf(fresh, sizeof fresh, "%s/keys/new.key", dir);
    setenv("LOOM_CACHE_KEY", fresh, 1);
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    put_ok(cache, "k", "v", 1);
    struct stat sb;
    assert_int_equal(stat(fresh, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_int_equal(sb.st_size, 32);
    char keys[600];
    snprintf(keys, sizeof keys, "%s/keys", dir);
    assert_int_equal(stat(keys, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0700);
    /* a second key file that others may read: the cache is off, saying how to fix it */
    char open_key[700];
    snprintf(open_key, sizeof open_key, "%s/keys/shared.key", dir);
    int fd = open(open_key, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "0123456789abcdef0123456789abcdef", 32), 32);
    close(fd);
    assert_int_equal(chmod(open_key, 0644), 0);
    setenv("LOOM_CACHE_KEY", open_key, 1);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(cache, "k", "v", 1, &sys, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "readable or writable by group or others"));
    assert_non_null(strstr(d.msg, "chmod 600"));
    /* and a key inside the cache folder is refused: who plants entries could read it */
    char inside[700];
    snprintf(inside, sizeof inside, "%s/cache/sub/k.key", dir);
    setenv("LOOM_CACHE_KEY", inside, 1);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(cache, "k", "v", 1, &sys, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "inside the cache folder"));
    setenv("LOOM_CACHE_KEY", saved, 1);
}

/* LOOM_CACHE_MAX_MB: a put evicts the least recently used entries down to 90% of the cap
 * (a hit counts as a use), and removes temp files of dead writers. */
static void test_the_cache_is_capped_least_recently_used_first(void **state) {
    const char *dir = *state;
    static char big[4000];
    memset(big, 'x', sizeof big);
    setenv("LOOM_CACHE_MAX_MB", "0.011", 1); /* 11534 bytes: two entries of 4 kB and more */
    char path[512], stale[700];
    put_ok(dir, "old", big, sizeof big);
    put_ok(dir, "mid", big, sizeof big);
    /* "old" used again: "mid" is now the least recently used */
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    size_t len = 0;
    char *data = get_ok(dir, "old", &len);
    loom_ir_free(&sys, data, len + 1);
    nanosleep(&ts, NULL);
    path_of(path, sizeof path, dir, "new");
    snprintf(stale, sizeof stale, "%s.tmp.%ld.0badcafe", path, (long)tu_dead_pid());
    spit(stale, "half an entry", 13);
    put_ok(dir, "new", big, sizeof big); /* three do not fit: one goes */
    assert_non_null(data = get_ok(dir, "new", &len));
    loom_ir_free(&sys, data, len + 1);
    assert_non_null(data = get_ok(dir, "old", &len));
    loom_ir_free(&sys, data, len + 1);
    assert_null(get_ok(dir, "mid", &len));
    assert_int_equal(access(stale, F_OK), -1);
    unsetenv("LOOM_CACHE_MAX_MB");
}

/* ---- out of memory ------------------------------------------------------------------------ */

static void test_out_of_memory_leaks_nothing(void **state) {
    const char *dir = *state;
    test_alloc ta = {.fail_at = 1};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_put(dir, "k", payload, PAYLOAD_LEN, &a, &d),
                     LOOM_STATUS_OUT_OF_MEMORY);
    assert_int_equal(ta.live_bytes, 0);
    put_ok(dir, "k", payload, PAYLOAD_LEN);
    /* get: the read buffer's allocation fails */
    ta = (test_alloc){.fail_at = 1};
    void *data = (void *)&d;
    size_t len = 0;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_disk_cache_get(dir, "k", &a, &data, &len, &d),
                     LOOM_STATUS_OUT_OF_MEMORY);
    assert_null(data);
    assert_int_equal(ta.live_bytes, 0);
}

/* ---- default folder ----------------------------------------------------------------------- */

/* The build ID keys the cache by build: it is this executable's, read back from its ELF
 * notes by readelf's rules (hex digits of the GNU note), and stable within the process. */
static void test_build_id_is_the_binarys_gnu_build_id(void **state) {
    (void)state;
    const char *id = loom_rt_build_id();
    assert_non_null(id);
    size_t n = strlen(id);
    if (strcmp(id, "none") == 0) {
        print_message("this toolchain links without --build-id: cache keys cannot tell builds "
                      "apart\n");
        skip();
    }
    assert_true(n >= 16 && n % 2 == 0);
    for (size_t i = 0; i < n; i++)
        assert_non_null(strchr("0123456789abcdef", id[i]));
    /* the same bytes the linker wrote: compare with the note in /proc/self/exe */
    FILE *f = fopen("/proc/self/exe", "rb");
    assert_non_null(f);
    static unsigned char image[64 << 20];
    size_t len = fread(image, 1, sizeof image, f);
    fclose(f);
    unsigned char raw[64];
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        assert_int_equal(sscanf(id + 2 * i, "%2x", &v), 1);
        raw[i] = (unsigned char)v;
    }
    bool found = false;
    for (size_t off = 0; off + 16 + n / 2 <= len && !found; off++) /* "GNU\0" then the ID */
        found = memcmp(image + off, "GNU", 4) == 0 && memcmp(image + off + 4, raw, n / 2) == 0;
    assert_true(found);
    assert_ptr_equal(loom_rt_build_id(), id);
}

static void test_default_dir_follows_the_environment(void **state) {
    (void)state;
    char buf[256];
    setenv("LOOM_CACHE_DIR", "/data/loom-cache", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/u", 1);
    assert_string_equal(loom_rt_disk_cache_default_dir(buf, sizeof buf), "/data/loom-cache");
    unsetenv("LOOM_CACHE_DIR");
    assert_string_equal(loom_rt_disk_cache_default_dir(buf, sizeof buf), "/xdg/loom");
    setenv("XDG_CACHE_HOME", "relative/path", 1); /* invalid per the XDG spec: ignored */
    assert_string_equal(loom_rt_disk_cache_default_dir(buf, sizeof buf), "/home/u/.cache/loom");
    unsetenv("XDG_CACHE_HOME");
    assert_string_equal(loom_rt_disk_cache_default_dir(buf, sizeof buf), "/home/u/.cache/loom");
    assert_null(loom_rt_disk_cache_default_dir(buf, 8)); /* does not fit */
    unsetenv("HOME");
    assert_null(loom_rt_disk_cache_default_dir(buf, sizeof buf));
    setenv("LOOM_CACHE_DIR", "", 1); /* set but empty: off */
    setenv("HOME", "/home/u", 1);
    assert_null(loom_rt_disk_cache_default_dir(buf, sizeof buf));
    unsetenv("LOOM_CACHE_DIR");
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)

int main(void) {
    sys = loom_allocator_system();
    /* the key, outside every test's folder */
    static char keydir[] = "/tmp/loom_disk_cache_key_XXXXXX", key[64];
    if (!mkdtemp(keydir))
        return 1;
    snprintf(key, sizeof key, "%s/cache.key", keydir);
    setenv("LOOM_CACHE_KEY", key, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash64_is_xxh3),
        T(test_put_then_get_returns_the_payload),
        T(test_put_creates_missing_folders),
        T(test_empty_payload_is_a_hit_not_a_miss),
        T(test_put_replaces_an_earlier_payload),
        T(test_get_of_an_unknown_key_or_folder_is_a_miss),
        T(test_a_flipped_payload_byte_fails_the_mac),
        T(test_a_flipped_mac_byte_is_corrupt),
        T(test_a_truncated_file_is_corrupt),
        T(test_trailing_bytes_are_corrupt),
        T(test_wrong_magic_or_version_is_corrupt),
        T(test_a_key_length_past_the_end_is_corrupt),
        T(test_a_folder_in_place_of_the_file_is_corrupt),
        T(test_put_over_a_corrupt_file_repairs_it),
        T(test_an_entry_under_another_key_is_rejected),
        T(test_a_folder_others_can_write_is_not_used),
        T(test_entries_and_folders_of_another_user_are_not_used),
        T(test_links_fifos_and_huge_files_are_refused_cheaply),
        T(test_the_key_is_private_or_the_cache_is_off),
        T(test_the_cache_is_capped_least_recently_used_first),
        T(test_a_file_holding_another_key_is_a_miss),
        T(test_put_under_a_regular_file_fails_and_get_misses),
        T(test_bad_arguments_are_rejected),
        T(test_out_of_memory_leaks_nothing),
        cmocka_unit_test(test_build_id_is_the_binarys_gnu_build_id),
        cmocka_unit_test(test_default_dir_follows_the_environment),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(key);
    rmdir(keydir);
    return rc;
}
