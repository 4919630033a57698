/* ktdeploy memory-bandwidth probe: how fast can this host's allowed CPUs stream memory (what the optimizer's
 * update of CPU-resident expert weights is bound by)? One worker process per allowed CPU (fork, no pthread: links
 * the same on every libc), each copying its own buffers; they start together on a pipe and the parent times them
 * from the start to the last one done. Copy bandwidth counts the bytes read and written (STREAM's convention).
 * Bounded: at most 64 workers, 2 GiB in all (well past any L3) or a quarter of the available memory if less,
 * best of 3 timed passes over the same buffers. Prints one JSON line.
 * Build: cc -O1 -o membw_probe membw_probe.c; run: ./membw_probe [MiB] (a smaller total, for tests)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 64
#define MAX_BYTES (2UL << 30)       /* source + destination, over all workers */
#define MIN_BYTES (64UL << 20)
#define PASSES 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    printf("{\"copy_gbs\": null, \"workers\": null, \"bytes\": null, \"error\": \"%s: %s\"}\n", what,
           strerror(errno));
    return 0;
}

static int read_n(int fd, int n) {
    char buf[MAX_WORKERS];
    int got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf, (size_t)(n - got));
        if (r <= 0) return -1;
        got += (int)r;
    }
    return 0;
}

static size_t total_bytes(size_t cap) {
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    size_t want = pages > 0 && size > 0 ? (size_t)pages * (size_t)size / 4 : MAX_BYTES;
    if (want > MAX_BYTES) want = MAX_BYTES;
    if (want < MIN_BYTES) want = MIN_BYTES;
    if (cap && want > cap) want = cap;    /* tests: a smaller total */
    return want;
}

static void worker(size_t half, int ready, int go, int done) {
    char *src = mmap(NULL, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *dst = mmap(NULL, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) _exit(2);
    memset(src, 1, half);    /* fault every page in before any pass is timed */
    memset(dst, 0, half);
    char c = 'r', g;
    if (write(ready, &c, 1) != 1) _exit(3);
    for (int pass = 0; pass < PASSES; pass++) {
        if (read(go, &g, 1) != 1) _exit(3);
        memcpy(dst, src, half);
        c = dst[half - 1] == 1 ? 'd' : 'x';
        if (write(done, &c, 1) != 1) _exit(4);
    }
    _exit(0);
}

int main(int argc, char **argv) {
    cpu_set_t set;
    int workers = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) workers = CPU_COUNT(&set);
    if (workers < 1) workers = 1;
    if (workers > MAX_WORKERS) workers = MAX_WORKERS;
    alarm(50);
    size_t cap = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) << 20 : 0;
    size_t half = total_bytes(cap) / 2 / (size_t)workers;   /* each worker: a source and a destination this size */
    half -= half % 4096;
    if (half < 4096) half = 4096;
    int ready[2], go[2], done[2];
    if (pipe(ready) || pipe(go) || pipe(done)) return fail("pipe");
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) return fail("fork");
        if (pid == 0) worker(half, ready[1], go[0], done[1]);
    }
    /* the parent keeps only its own ends: a worker that dies before its byte closes its pipes, so no read waits
     * on a writer that is gone; alarm() bounds the rest */
    close(ready[1]); close(go[0]); close(done[1]);
    double best = 0;
    char gobuf[MAX_WORKERS];
    memset(gobuf, 'g', sizeof(gobuf));
    if (read_n(ready[0], workers)) return fail("workers did not start");
    for (int pass = 0; pass < PASSES; pass++) {
        double t0 = now();
        if (write(go[1], gobuf, (size_t)workers) != workers) return fail("start");
        if (read_n(done[0], workers)) return fail("workers did not finish");
        double gbs = 2.0 * (double)half * workers / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    while (wait(NULL) > 0) {}
    printf("{\"copy_gbs\": %.2f, \"workers\": %d, \"bytes\": %lu, \"error\": null}\n", best, workers,
           (unsigned long)(2 * half * (size_t)workers));
    return 0;
}
