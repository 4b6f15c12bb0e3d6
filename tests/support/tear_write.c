/* A torn write, for real: loaded with LD_PRELOAD into a process that writes a DuckDB file.
 *
 * Every pwrite of more than one page to the file named TEAR_PATH is counted (and logged as
 * "n offset size" to TEAR_LOG when set). The TEAR_AT-th one writes its first page only and
 * then the process kills itself with SIGKILL: what Linux leaves when a fatal signal arrives
 * in the middle of a buffered write of several pages.
 *
 * With TEAR_UNLINK set, the process kills itself instead when it is about to remove a file
 * whose name ends with TEAR_UNLINK.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static long count;

static int is_target(int fd) {
    const char *want = getenv("TEAR_PATH");
    char link[64], buf[4096];
    ssize_t n;
    if (!want) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, buf, sizeof buf - 1);
    if (n < 0) return 0;
    buf[n] = 0;
    return strcmp(buf, want) == 0;
}

/* Counting starts once the file named TEAR_ARM exists (at once without TEAR_ARM). */
static int armed(void) {
    const char *arm = getenv("TEAR_ARM");
    return !arm || access(arm, F_OK) == 0;
}

static void log_write(long n, off_t offset, size_t size) {
    const char *path = getenv("TEAR_LOG");
    char line[128];
    int fd, len;
    if (!path) return;
    fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0) return;
    len = snprintf(line, sizeof line, "%ld %lld %zu\n", n, (long long)offset, size);
    if (write(fd, line, (size_t)len) < 0) { /* nothing to do */ }
    close(fd);
}

static ssize_t torn_pwrite(int fd, const void *buf, size_t size, off_t offset) {
    if (!real_pwrite) real_pwrite = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    if (size > 4096 && is_target(fd) && armed()) {
        long n = ++count;
        const char *at = getenv("TEAR_AT");
        log_write(n, offset, size);
        if (at && atol(at) == n) {
            real_pwrite(fd, buf, 4096, offset);
            raise(SIGKILL);
        }
    }
    return real_pwrite(fd, buf, size, offset);
}

ssize_t pwrite(int fd, const void *buf, size_t size, off_t offset) {
    return torn_pwrite(fd, buf, size, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t size, off_t offset) {
    return torn_pwrite(fd, buf, size, offset);
}

int unlink(const char *path) {
    static int (*real_unlink)(const char *);
    const char *suffix = getenv("TEAR_UNLINK");
    if (!real_unlink) real_unlink = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    if (suffix && armed()) {
        size_t n = strlen(path), k = strlen(suffix);
        if (n >= k && strcmp(path + n - k, suffix) == 0) raise(SIGKILL);
    }
    return real_unlink(path);
}
