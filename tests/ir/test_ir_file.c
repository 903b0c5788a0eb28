/* The one file writer and reader (ir/file.c): atomic replacement, temp names nothing can be
 * planted at, special files written in place or refused but never replaced, stale temp
 * files of dead processes removed, regular files only read and never waited on. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ir/ir.h"
#include "test_util.h"

static loom_allocator sys;

typedef struct tmpdir {
    char path[256];
} tmpdir;

static void tmpdir_make(tmpdir *t) {
    const char *base = getenv("TMPDIR");
    snprintf(t->path, sizeof t->path, "%s/loom_ir_file_XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(t->path));
}

/* Number of entries in dir other than . and .. */
static int count_entries(const char *dir) {
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(dp);
    return n;
}

static void read_whole(const char *path, const loom_allocator *a, char **out, size_t *len) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_ir_read_file(path, a, out, len, &d);
    if (st != LOOM_OK)
        fail_msg("read %s: %s", path, d.msg);
}

static void test_files_round_trip_and_are_replaced_whole(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512];
    snprintf(path, sizeof path, "%s/graph.loom", t.path);
    loom_ir_diag d;
    loom_ir_diag_init(&d);

    /* 10000 bytes with embedded NULs: bigger than the reader's first buffer */
    enum { N = 10000 };
    char *data = malloc(N);
    assert_non_null(data);
    for (int i = 0; i < N; i++)
        data[i] = (char)(i * 7 % 251);
    assert_int_equal(loom_ir_write_file_atomic(path, data, N, &d), LOOM_OK);
    assert_int_equal(count_entries(t.path), 1); /* no temp file left */

    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    char *back = NULL;
    size_t len = 0;
    read_whole(path, &a, &back, &len);
    assert_int_equal(len, N);
    assert_memory_equal(back, data, N);
    assert_int_equal(back[len], '\0');
    assert_int_equal(ta.live_bytes, (int64_t)len + 1); /* exactly len + 1, as documented */
    loom_ir_free(&a, back, len + 1);
    assert_int_equal(ta.live_bytes, 0);

    /* replacing with shorter content leaves nothing of the old file */
    assert_int_equal(loom_ir_write_file_atomic(path, "short\n", 6, &d), LOOM_OK);
    read_whole(path, &a, &back, &len);
    assert_int_equal(len, 6);
    assert_string_equal(back, "short\n");
    loom_ir_free(&a, back, len + 1);

    /* an empty file */
    assert_int_equal(loom_ir_write_file_atomic(path, "", 0, &d), LOOM_OK);
    read_whole(path, &a, &back, &len);
    assert_int_equal(len, 0);
    assert_string_equal(back, "");
    loom_ir_free(&a, back, len + 1);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(d.code, LOOM_OK);
    assert_int_equal(count_entries(t.path), 1);

    /* reading under memory pressure fails cleanly at every allocation */
    assert_int_equal(loom_ir_write_file_atomic(path, data, N, &d), LOOM_OK);
    int failures = 0;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc tf = {.fail_at = fail_at};
        loom_allocator af = test_alloc_make(&tf);
        loom_ir_diag_init(&d);
        loom_status st = loom_ir_read_file(path, &af, &back, &len, &d);
        if (tf.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_int_equal(len, N);
            loom_ir_free(&af, back, len + 1);
            assert_int_equal(tf.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_non_null(strstr(d.msg, path));
        assert_int_equal(tf.live_bytes, 0);
        failures++;
    }
    assert_true(failures >= 1); /* one block: a regular file's size is known */
    free(data);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(t.path), 0);
}

static void test_file_errors_name_the_path_and_leave_no_temp_file(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512];
    loom_ir_diag d;

    /* into a directory that does not exist */
    snprintf(path, sizeof path, "%s/missing/graph.loom", t.path);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(path, "x", 1, &d), LOOM_STATUS_IO_ERROR);
    assert_int_equal(d.code, LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, path));
    assert_non_null(strstr(d.msg, "No such file or directory"));
    assert_int_equal(count_entries(t.path), 0);

    /* onto a folder: refused before anything is written */
    snprintf(path, sizeof path, "%s/adir", t.path);
    assert_int_equal(mkdir(path, 0755), 0);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(path, "x", 1, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, path));
    assert_non_null(strstr(d.msg, "is a folder: not replaced"));
    assert_int_equal(count_entries(t.path), 1); /* only adir */
    assert_int_equal(count_entries(path), 0);
    assert_int_equal(rmdir(path), 0);

    /* reading a missing file */
    snprintf(path, sizeof path, "%s/nothing.loom", t.path);
    loom_ir_diag_init(&d);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(loom_ir_read_file(path, &sys, &out, &len, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, path));
    assert_non_null(strstr(d.msg, "cannot open"));
    assert_null(out);
    assert_int_equal(rmdir(t.path), 0);
}


static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void expect_text(const char *path, const char *text) {
    char *back = NULL;
    size_t len = 0;
    read_whole(path, &sys, &back, &len);
    assert_string_equal(back, text);
    loom_ir_free(&sys, back, len + 1);
}

static void test_links_planted_at_temp_names_are_never_followed(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512], victim[512], link[600];
    snprintf(path, sizeof path, "%s/out.json", t.path);
    snprintf(victim, sizeof victim, "%s/victim", t.path);
    write_text(victim, "precious\n");
    assert_int_equal(chmod(victim, 0600), 0);
    /* the names the old writer used (<path>.tmp.<pid>), and every pid near ours */
    for (long pid = (long)getpid() - 4; pid <= (long)getpid() + 64; pid++) {
        snprintf(link, sizeof link, "%s.tmp.%ld", path, pid);
        assert_int_equal(symlink(victim, link), 0);
    }
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(path, "new\n", 4, &d), LOOM_OK);
    expect_text(path, "new\n");
    expect_text(victim, "precious\n"); /* untouched */
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", t.path);
    assert_int_equal(system(cmd), 0);
}

static void test_a_link_at_the_target_is_followed_to_its_file_which_is_replaced(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char real[512], link[512];
    snprintf(real, sizeof real, "%s/real.safetensors", t.path);
    snprintf(link, sizeof link, "%s/latest.safetensors", t.path);
    write_text(real, "old");
    assert_int_equal(chmod(real, 0640), 0);
    assert_int_equal(symlink("real.safetensors", link), 0);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(link, "fresh", 5, &d), LOOM_OK);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* the link stays a link */
    expect_text(real, "fresh");
    assert_int_equal(stat(real, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640); /* the replaced file's permissions kept */
    /* a link to nothing is an error, not a file created somewhere */
    snprintf(link, sizeof link, "%s/dangling", t.path);
    assert_int_equal(symlink("nowhere/x", link), 0);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(link, "x", 1, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "a symbolic link to nothing"));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", t.path);
    assert_int_equal(system(cmd), 0);
}

static void test_fifos_and_devices_are_written_in_place_never_replaced(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/pipe", t.path);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    loom_ir_diag d;
    /* nothing reads it: an error at once, not a wait */
    loom_ir_diag_init(&d);
    time_t t0 = time(NULL);
    assert_int_equal(loom_ir_write_file_atomic(fifo, "x", 1, &d), LOOM_STATUS_IO_ERROR);
    assert_true(time(NULL) - t0 < 5);
    assert_non_null(strstr(d.msg, "a FIFO"));
    assert_non_null(strstr(d.msg, "nothing reads it"));
    /* a reader: the bytes go through the FIFO, which stays a FIFO */
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(rd >= 0);
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(fifo, "through", 7, &d), LOOM_OK);
    char buf[16] = {0};
    assert_int_equal(read(rd, buf, sizeof buf), 7);
    assert_string_equal(buf, "through");
    close(rd);
    struct stat st;
    assert_int_equal(lstat(fifo, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    /* /dev/null stays the system's device */
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic("/dev/null", "x", 1, &d), LOOM_OK);
    assert_int_equal(lstat("/dev/null", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(t.path), 0);
}

typedef struct racer {
    const char *path;
    int id;
    loom_status st;
    char msg[sizeof(loom_ir_diag){0}.msg];
} racer;

static void *race(void *ud) {
    racer *r = ud;
    char text[32];
    int n = snprintf(text, sizeof text, "writer %d\n", r->id);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    for (int i = 0; i < 10 && r->st == LOOM_OK; i++)
        r->st = loom_ir_write_file_atomic(r->path, text, (size_t)n, &d);
    snprintf(r->msg, sizeof r->msg, "%s", d.msg);
    return NULL;
}

static void test_writers_of_one_path_in_one_process_never_collide(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512];
    snprintf(path, sizeof path, "%s/shared.bin", t.path);
    enum { N = 40 };
    pthread_t th[N];
    racer rs[N];
    for (int i = 0; i < N; i++) {
        rs[i] = (racer){.path = path, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < N; i++)
        if (rs[i].st != LOOM_OK)
            fail_msg("writer %d: %s", i, rs[i].msg);
    char *back = NULL;
    size_t len = 0;
    read_whole(path, &sys, &back, &len);
    assert_int_equal(strncmp(back, "writer ", 7), 0); /* one writer's whole content */
    loom_ir_free(&sys, back, len + 1);
    assert_int_equal(count_entries(t.path), 1); /* no temp file left */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(t.path), 0);
}

static void test_temp_files_of_dead_processes_are_removed(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512], stale[600], live[600], other[600];
    snprintf(path, sizeof path, "%s/model.safetensors", t.path);
    snprintf(stale, sizeof stale, "%s.tmp.%ld.0badcafe", path, (long)tu_dead_pid());
    snprintf(live, sizeof live, "%s.tmp.%ld.12345678", path, (long)getpid());
    snprintf(other, sizeof other, "%s/unrelated.tmp.%ld.0badcafe", t.path, (long)tu_dead_pid());
    write_text(stale, "half a checkpoint");
    write_text(live, "being written");
    write_text(other, "not ours to judge");
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file_atomic(path, "whole", 5, &d), LOOM_OK);
    assert_int_equal(access(stale, F_OK), -1); /* its writer is gone */
    assert_int_equal(access(live, F_OK), 0);   /* ours: maybe still being written */
    assert_int_equal(access(other, F_OK), 0);  /* another file's */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", t.path);
    assert_int_equal(system(cmd), 0);
}

static void test_permissions_are_kept_or_set(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char path[512];
    snprintf(path, sizeof path, "%s/secret", t.path);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_write_file(path, "k", 1, 0600, &d), LOOM_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(loom_ir_write_file_atomic(path, "k2", 2, &d), LOOM_OK);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600); /* replaced, not widened */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(t.path), 0);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_ir_file: the reader blocked on a FIFO\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

static void test_only_regular_files_are_read_and_none_is_waited_on(void **state) {
    (void)state;
    tmpdir t;
    tmpdir_make(&t);
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/pipe.loom", t.path);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_alarm);
    alarm(10); /* a blocking open would hang here */
    loom_ir_diag d;
    char *out = NULL;
    size_t len = 0;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_read_file(fifo, &sys, &out, &len, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "is a FIFO: only regular files are read"));
    assert_null(out);
    int fd;
    uint64_t size;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_open_regular(t.path, &fd, &size, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "is a folder"));
    loom_ir_diag_init(&d);
    assert_int_equal(loom_ir_open_regular("/dev/zero", &fd, &size, &d), LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(d.msg, "is a character device"));
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(t.path), 0);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_files_round_trip_and_are_replaced_whole),
        cmocka_unit_test(test_file_errors_name_the_path_and_leave_no_temp_file),
        cmocka_unit_test(test_links_planted_at_temp_names_are_never_followed),
        cmocka_unit_test(test_a_link_at_the_target_is_followed_to_its_file_which_is_replaced),
        cmocka_unit_test(test_fifos_and_devices_are_written_in_place_never_replaced),
        cmocka_unit_test(test_writers_of_one_path_in_one_process_never_collide),
        cmocka_unit_test(test_temp_files_of_dead_processes_are_removed),
        cmocka_unit_test(test_permissions_are_kept_or_set),
        cmocka_unit_test(test_only_regular_files_are_read_and_none_is_waited_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
