/* Runs the perf trampoline template (Python/asm_trampoline.S) outside the
 * interpreter, the way Python/perf_trampoline.c uses it: copied into an
 * anonymous mapping that is then made read-execute (with PROT_BTI where
 * the compiler enables BTI), and called through a function pointer.  It
 * checks that the arguments reach the evaluator, that its result comes
 * back, and that a frame-pointer walk from the evaluator goes through the
 * copy and on to the caller: what perf relies on, and what the evaluator
 * relies on to know a trampoline called it.  Built by
 * test_template.py natively and for aarch64 (run under qemu-user).
 *
 * Prints "ok" and exits 0, or names the first check that failed. */

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

extern char _PyPerf_TemplateStart[];
extern char _PyPerf_TemplateEnd[];

typedef void *(*eval_func)(void *tstate, void *frame, int throwflag);
typedef void *(*trampoline_func)(void *tstate, void *frame, int throwflag,
                                 eval_func eval);

/* _PyPerf_RECORD_AREA in pycore_perf.h */
#define RECORD_AREA 128

static char *copy_start, *copy_end;
static int seen_args, walk_ok;

/* A saved return address, without a pointer authentication code. */
static char *
code_address(void *p)
{
#if defined(__aarch64__)
    return (char *)((uintptr_t)p & ((UINT64_C(1) << 48) - 1));
#else
    return p;
#endif
}

__attribute__((noinline)) static void *
fake_eval(void *tstate, void *frame, int throwflag)
{
    seen_args = (tstate == (void *)0x1111 && frame == (void *)0x2222
                 && throwflag == 7);
    /* A frame record is {caller's frame pointer, return address} on both
       architectures.  Ours returns into the copy; the copy's own record,
       RECORD_AREA + 16 bytes above our CFA, returns into the caller
       (main), outside the copy, and the word below it holds our return
       address: how the evaluator knows a trampoline called it. */
    void **record = __builtin_frame_address(0);
    char *ret = code_address(record[1]);
    void **outer = record[0];
    walk_ok = (ret >= copy_start && ret < copy_end
               && outer != NULL && (uintptr_t)outer > (uintptr_t)record
               && (char *)outer
                  == (char *)__builtin_dwarf_cfa() + RECORD_AREA + 16
               && code_address(outer[-1]) == ret
               && (code_address(outer[1]) < copy_start
                   || code_address(outer[1]) >= copy_end));
    return (void *)0x3333;
}

int
main(int argc, char **argv)
{
    size_t size = _PyPerf_TemplateEnd - _PyPerf_TemplateStart;
    size_t map_size = 4096;
    int prot = PROT_READ | PROT_EXEC;
#if defined(__aarch64__) && defined(__ARM_FEATURE_BTI_DEFAULT) && defined(PROT_BTI)
    prot |= PROT_BTI;
#endif
    char *mem = mmap(NULL, map_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    /* Not at the start of the page: the copy must not depend on where
       it lands. */
    copy_start = mem + 64;
    copy_end = copy_start + size;
    memcpy(copy_start, _PyPerf_TemplateStart, size);
    if (mprotect(mem, map_size, prot) < 0) {
        perror("mprotect");
        return 1;
    }
    __builtin___clear_cache(mem, mem + map_size);

    trampoline_func t = (trampoline_func)copy_start;
    if (argc > 1 && strcmp(argv[1], "skip-landing-pad") == 0) {
        /* Enter past the landing pads (bti c; paciasp): under BTI this
           must trap. */
        t = (trampoline_func)(copy_start + 8);
    }
    void *res = t((void *)0x1111, (void *)0x2222, 7, fake_eval);
    if (res != (void *)0x3333) {
        puts("wrong result");
        return 1;
    }
    if (!seen_args) {
        puts("wrong arguments");
        return 1;
    }
    if (!walk_ok) {
        puts("frame-pointer walk does not go through the copy");
        return 1;
    }
    printf("ok %zu\n", size);
    return 0;
}
