/* ktdeploy NUMA probe: can this process bind memory to NUMA node 0 (what kt-kernel does per threadpool)?
 * Docker's default seccomp profile blocks set_mempolicy/mbind unless the container has CAP_SYS_NICE
 * (`--cap-add SYS_NICE`); kt-kernel then only prints an error and runs slower (ktransformers #350).
 * Raw syscalls, no libnuma needed. Prints one JSON line. Build: cc -O1 -o numa_probe numa_probe.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_DEFAULT 0
#define MPOL_BIND 2

int main(void) {
    unsigned long mask = 1UL; /* node 0 exists on every Linux system */
    long rc = syscall(SYS_set_mempolicy, MPOL_BIND, &mask, sizeof(mask) * 8);
    int err = rc == 0 ? 0 : errno;
    if (rc == 0) syscall(SYS_set_mempolicy, MPOL_DEFAULT, NULL, 0);
    if (rc == 0)
        printf("{\"ok\": true, \"errno\": null, \"error\": null}\n");
    else
        printf("{\"ok\": false, \"errno\": %d, \"error\": \"set_mempolicy(MPOL_BIND, node 0): %s\"}\n", err,
               strerror(err));
    return 0;
}
