/* ktdeploy AMX probe: prove AMX works here, not just that the flag is listed.
 *
 * 1. CPUID leaf 7: AMX-TILE / AMX-INT8 / AMX-BF16 (+ AVX512 bits); XCR0 bits 17/18 (OS enabled tile state).
 * 2. arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux >= 5.16 grants per-process tile state.
 * 3. CPUID leaf 0x1D: tile palettes (hypervisors may report none).
 * 4. ldtilecfg + tileloadd + tdpbssd + tilestored on known int8 matrices, compared with a scalar reference;
 *    the same with tdpbf16ps on bf16 matrices (kt-kernel's amx build trains BF16 experts with it).
 * 5. One instruction of each AVX512 extension kt-kernel's builds need (avx512f, bw, vnni, vbmi, bf16).
 * Every instruction that may fault runs under a SIGILL/SIGSEGV handler (sigsetjmp), and nothing AMX runs
 * unless CPUID lists it. Prints exactly one JSON line. Build: cc -O1 -o amx_probe amx_probe.c
 * (gcc >= 11 or clang >= 12 for the AMX intrinsics; older compilers build a probe that reports the error).
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define HAVE_AMX_INTRIN 1
#include <immintrin.h>
#endif

static sigjmp_buf jump;
static volatile sig_atomic_t fault_sig;

static void on_fault(int sig) {
    fault_sig = sig;
    siglongjmp(jump, 1);
}

static void cpuid2(unsigned leaf, unsigned sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

#ifdef HAVE_AMX_INTRIN
struct tilecfg {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64)));

#define M 16
#define K 64
#define N 16
static int8_t A[M][K] __attribute__((aligned(64)));
static int8_t B[K / 4][N * 4] __attribute__((aligned(64))); /* VNNI layout: B[k/4][n*4 + k%4] = b(k, n) */
static int32_t C[M][N] __attribute__((aligned(64)));

__attribute__((target("amx-tile,amx-int8"), noinline)) static void tile_multiply(void) {
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = M; cfg.colsb[0] = N * 4; /* C: 16 x 16 int32 */
    cfg.rows[1] = M; cfg.colsb[1] = K;     /* A: 16 x 64 int8 */
    cfg.rows[2] = K / 4; cfg.colsb[2] = N * 4;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_loadd(1, A, K);
    _tile_loadd(2, B, N * 4);
    _tile_dpbssd(0, 1, 2);
    _tile_stored(0, C, N * 4);
    _tile_release();
}

#define KB 32 /* bf16 pairs: 16 rows of 64 bytes */
static uint16_t Ab[M][KB] __attribute__((aligned(64)));
static uint16_t Bb[KB / 2][N * 2] __attribute__((aligned(64))); /* Bb[k/2][n*2 + k%2] = b(k, n) */
static float Cf[M][N] __attribute__((aligned(64)));

static uint16_t to_bf16(float f) { /* exact for the small integers used here */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__attribute__((target("amx-tile,amx-bf16"), noinline)) static void tile_multiply_bf16(void) {
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = M; cfg.colsb[0] = N * 4;      /* C: 16 x 16 fp32 */
    cfg.rows[1] = M; cfg.colsb[1] = KB * 2;     /* A: 16 x 32 bf16 */
    cfg.rows[2] = KB / 2; cfg.colsb[2] = N * 4; /* B: 16 x (16 pairs) */
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_loadd(1, Ab, KB * 2);
    _tile_loadd(2, Bb, N * 4);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, Cf, N * 4);
    _tile_release();
}

static int check_result_bf16(void) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float ref = 0.0f;
            for (int k = 0; k < KB; k++) ref += from_bf16(Ab[m][k]) * from_bf16(Bb[k / 2][n * 2 + k % 2]);
            if (ref != Cf[m][n]) return 0;
        }
    return 1;
}

static int check_result(void) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t ref = 0;
            for (int k = 0; k < K; k++) ref += (int32_t)A[m][k] * (int32_t)B[k / 4][n * 4 + k % 4];
            if (ref != C[m][n]) return 0;
        }
    return 1;
}

__attribute__((target("avx512f"), noinline)) static int run_avx512f(void) {
    __m512i a = _mm512_set1_epi32(3), b = _mm512_set1_epi32(4);
    return _mm512_reduce_add_epi32(_mm512_add_epi32(a, b)) == 16 * 7;
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static int run_avx512_bf16(void) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512bh h = _mm512_cvtne2ps_pbh(one, one);
    __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), h, h); /* each lane: 1*1 + 1*1 */
    return _mm512_reduce_add_ps(acc) == 32.0f;
}

__attribute__((target("avx512f,avx512bw"), noinline)) static int run_avx512bw(void) {
    __m512i c = _mm512_add_epi8(_mm512_set1_epi8(3), _mm512_set1_epi8(4)); /* vpaddb: 64 bytes of 7 */
    __m512i s = _mm512_sad_epu8(c, _mm512_setzero_si512());               /* 8 sums of 8 bytes */
    return _mm512_reduce_add_epi64(s) == 64 * 7;
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"), noinline)) static int run_avx512_vbmi(void) {
    unsigned char in[64], idx[64], out[64];
    for (int i = 0; i < 64; i++) { in[i] = (unsigned char)i; idx[i] = (unsigned char)(63 - i); }
    __m512i r = _mm512_permutexvar_epi8(_mm512_loadu_si512(idx), _mm512_loadu_si512(in)); /* vpermb */
    _mm512_storeu_si512(out, r);
    for (int i = 0; i < 64; i++)
        if (out[i] != 63 - i) return 0;
    return 1;
}

__attribute__((target("avx512f,avx512vnni"), noinline)) static int run_avx512_vnni(void) {
    __m512i a = _mm512_set1_epi8(2), b = _mm512_set1_epi8(3);
    __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b); /* each lane: 4 * 2*3 */
    return _mm512_reduce_add_epi32(acc) == 16 * 24;
}
#endif

/* Runs fn under the fault handler: 1/0 = its result, -1 = it faulted. */
static int guarded(int (*fn)(void)) {
    fault_sig = 0;
    if (sigsetjmp(jump, 1) == 0) return fn() ? 1 : 0;
    return -1;
}

static const char *jbool(int v) { return v > 0 ? "true" : (v == 0 ? "false" : "null"); }

#ifdef HAVE_AMX_INTRIN
static int do_tile(void) { tile_multiply(); return 1; }
static int do_tile_bf16(void) { tile_multiply_bf16(); return 1; }
#endif

int main(void) {
    unsigned r[4] = {0};
    char error[256] = "";
    int listed = 0, amx_int8 = 0, amx_bf16 = 0, xtile_os = -1, permission = -1, perm_errno = -1;
    int palettes = -1, max_names = -1, max_rows = -1, bytes_per_row = -1, tile_exec = -1, correct = -1;
    int avx512f = -1, avx512_bf16 = -1, avx512_vnni = -1, avx512bw = -1, avx512_vbmi = -1;
    int bf16_exec = -1, bf16_correct = -1;
    int f7_ebx = 0, f7_edx = 0, f7_1_eax = 0, f7_ecx = 0;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGILL, &sa, NULL);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);

    unsigned max_leaf = __get_cpuid_max(0, NULL);
    cpuid2(1, 0, r);
    int osxsave = (r[2] >> 27) & 1;
    if (max_leaf >= 7) {
        cpuid2(7, 0, r);
        f7_ebx = r[1]; f7_ecx = r[2]; f7_edx = r[3];
        listed = (f7_edx >> 24) & 1;
        amx_int8 = (f7_edx >> 25) & 1;
        amx_bf16 = (f7_edx >> 22) & 1;
        cpuid2(7, 1, r);
        f7_1_eax = r[0];
    }
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    if (osxsave) xtile_os = ((xcr0 >> 17) & 3) == 3;
    int avx512_os = osxsave && ((xcr0 & 0xe6) == 0xe6); /* SSE, AVX, opmask, ZMM state */

    if (listed) {
        long rc = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
        if (rc == 0) {
            unsigned long bitmask = 0;
            permission = syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) == 0 &&
                         (bitmask & (1UL << XFEATURE_XTILEDATA));
            if (!permission) snprintf(error, sizeof error, "XTILEDATA not in ARCH_GET_XCOMP_PERM bitmask");
        } else {
            permission = 0;
            perm_errno = errno;
            snprintf(error, sizeof error, "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: %s "
                     "(kernel < 5.16 or AMX state disabled)", strerror(errno));
        }
        if (max_leaf >= 0x1d) {
            cpuid2(0x1d, 0, r);
            palettes = (int)r[0];
            if (palettes >= 1) {
                cpuid2(0x1d, 1, r);
                bytes_per_row = r[1] & 0xffff;
                max_names = r[1] >> 16;
                max_rows = r[2] & 0xffff;
            }
        } else {
            palettes = 0;
        }
#ifdef HAVE_AMX_INTRIN
        if (permission == 1 && amx_int8) {
            for (int m = 0; m < M; m++)
                for (int k = 0; k < K; k++) A[m][k] = (int8_t)((m * 7 + k * 3) % 17 - 8);
            for (int k = 0; k < K; k++)
                for (int n = 0; n < N; n++) B[k / 4][n * 4 + k % 4] = (int8_t)((k * 5 + n * 11) % 13 - 6);
            memset(C, 0, sizeof C);
            tile_exec = guarded(do_tile);
            if (tile_exec == 1) {
                correct = check_result();
                if (!correct) snprintf(error, sizeof error, "tdpbssd result differs from the scalar reference");
            } else {
                tile_exec = 0;
                snprintf(error, sizeof error, "tile instruction raised %s (hypervisor or kernel blocks AMX)",
                         fault_sig == SIGILL ? "SIGILL" : fault_sig == SIGSEGV ? "SIGSEGV" : "a signal");
            }
        } else if (permission == 1) {
            snprintf(error, sizeof error, "AMX-TILE listed without AMX-INT8: no tile multiply to run");
        }
        if (permission == 1 && amx_bf16) {
            for (int m = 0; m < M; m++)
                for (int k = 0; k < KB; k++) Ab[m][k] = to_bf16((float)((m * 5 + k * 3) % 9 - 4));
            for (int k = 0; k < KB; k++)
                for (int n = 0; n < N; n++) Bb[k / 2][n * 2 + k % 2] = to_bf16((float)((k * 7 + n * 3) % 7 - 3));
            memset(Cf, 0, sizeof Cf);
            bf16_exec = guarded(do_tile_bf16);
            if (bf16_exec == 1) {
                bf16_correct = check_result_bf16();
                if (!bf16_correct && !error[0])
                    snprintf(error, sizeof error, "tdpbf16ps result differs from the scalar reference");
            } else {
                bf16_exec = 0;
                if (!error[0])
                    snprintf(error, sizeof error, "tdpbf16ps raised %s (hypervisor or kernel blocks AMX-BF16)",
                             fault_sig == SIGILL ? "SIGILL" : fault_sig == SIGSEGV ? "SIGSEGV" : "a signal");
            }
        }
#else
        snprintf(error, sizeof error, "compiler too old for AMX intrinsics (need gcc >= 11 or clang >= 12)");
#endif
    }

#ifdef HAVE_AMX_INTRIN
    if (((f7_ebx >> 16) & 1) && avx512_os) {
        avx512f = guarded(run_avx512f);
        if ((f7_1_eax >> 5) & 1) avx512_bf16 = guarded(run_avx512_bf16);
        else avx512_bf16 = 0;
        if ((f7_ecx >> 11) & 1) avx512_vnni = guarded(run_avx512_vnni);
        else avx512_vnni = 0;
        if ((f7_ebx >> 30) & 1) avx512bw = guarded(run_avx512bw);
        else avx512bw = 0;
        if (((f7_ecx >> 1) & 1) && avx512bw == 1) avx512_vbmi = guarded(run_avx512_vbmi);
        else avx512_vbmi = 0;
    } else {
        avx512f = avx512_bf16 = avx512_vnni = avx512bw = avx512_vbmi = 0;
    }
#endif

    printf("{\"listed\": %s, \"amx_int8\": %s, \"amx_bf16\": %s, \"xtiledata_os\": %s, \"permission\": %s, "
           "\"permission_errno\": ",
           jbool(listed), jbool(amx_int8), jbool(amx_bf16), jbool(xtile_os), jbool(permission));
    if (perm_errno >= 0) printf("%d", perm_errno); else printf("null");
    printf(", \"palettes\": ");
    if (palettes >= 0) printf("%d", palettes); else printf("null");
    printf(", \"max_names\": ");
    if (max_names >= 0) printf("%d", max_names); else printf("null");
    printf(", \"max_rows\": ");
    if (max_rows >= 0) printf("%d", max_rows); else printf("null");
    printf(", \"bytes_per_row\": ");
    if (bytes_per_row >= 0) printf("%d", bytes_per_row); else printf("null");
    printf(", \"tile_exec\": %s, \"correct\": %s, \"amx_bf16_exec\": %s, \"amx_bf16_correct\": %s, "
           "\"avx512f_exec\": %s, \"avx512bw_exec\": %s, \"avx512_vnni_exec\": %s, \"avx512_vbmi_exec\": %s, "
           "\"avx512_bf16_exec\": %s, \"error\": ",
           jbool(tile_exec), jbool(correct), jbool(bf16_exec), jbool(bf16_correct), jbool(avx512f), jbool(avx512bw),
           jbool(avx512_vnni), jbool(avx512_vbmi), jbool(avx512_bf16));
    if (error[0]) printf("\"%s\"}\n", error); else printf("null}\n");
    return 0;
}
