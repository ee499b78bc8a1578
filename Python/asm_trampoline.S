/*
 * The perf trampoline template (see Python/perf_trampoline.c).
 *
 * perf_trampoline.c copies the bytes between _PyPerf_TemplateStart and
 * _PyPerf_TemplateEnd into every slot of its executable arenas and gives
 * each Python code object a slot of its own, so that each Python function
 * gets a native address range of its own that perf can name.  The
 * template must therefore be position independent: it may not refer to
 * anything outside itself, which is why the evaluator arrives as an argument
 * instead of being called by name.  The equivalent C is
 *
 *     PyObject *
 *     trampoline(PyThreadState *tstate, _PyInterpreterFrame *frame,
 *                int throwflag, _PyFrameEvalFunction eval)
 *     {
 *         return eval(tstate, frame, throwflag);
 *     }
 *
 * compiled with frame pointers and without tail calls: the template sets up
 * a frame record of its own, so a frame-pointer unwinder walking out of
 * _PyEval_EvalFrameDefault finds a return address inside the trampoline
 * (and so its name), then, through the trampoline's frame record, its
 * caller.  The unwind description in
 * Python/perf_unwind.c (for perf_jit and gdb) follows these instructions
 * one by one; change both together.
 */

/* A GNU property note declaring the hardening features this object
   supports.  Without it, linking this object would strip them (IBT and
   SHSTK on x86_64, BTI and PAC on aarch64) from the whole binary. */
#define GNU_PROPERTY_NOTE(type, features) \
    .section .note.gnu.property, "a"; \
    .p2align 3; \
    .long 4;            /* name size: "GNU\0" */ \
    .long 16;           /* descriptor size */ \
    .long 5;            /* NT_GNU_PROPERTY_TYPE_0 */ \
    .asciz "GNU"; \
    .long type; \
    .long 4;            /* property data size */ \
    .long features; \
    .long 0             /* pad to 8 */

#if defined(__x86_64__)

#if defined(__CET__) && (__CET__ & 1)
#  define LANDING_PAD endbr64
#else
#  define LANDING_PAD
#endif

    .text
    .globl  _PyPerf_TemplateStart
    .type   _PyPerf_TemplateStart, @function
    .p2align 4
_PyPerf_TemplateStart:
    LANDING_PAD                 /* indirect call target under IBT */
    push    %rbp                /* frame record: saved %rbp ...        */
    mov     %rsp, %rbp          /* ... below the return address        */
    call    *%rcx               /* eval(tstate, frame, throwflag)      */
    pop     %rbp
    ret
    .globl  _PyPerf_TemplateEnd
_PyPerf_TemplateEnd:
    .size   _PyPerf_TemplateStart, . - _PyPerf_TemplateStart

#if defined(__CET__)
    /* GNU_PROPERTY_X86_FEATURE_1_AND: IBT = 1, SHSTK = 2 */
    GNU_PROPERTY_NOTE(0xc0000002, (__CET__ & 3))
#endif

#elif defined(__aarch64__) && defined(__AARCH64EL__) && !defined(__ILP32__)

#if defined(__ARM_FEATURE_BTI_DEFAULT) && __ARM_FEATURE_BTI_DEFAULT == 1
#  define BTI_C hint #34        /* bti c */
#  define FEATURE_BTI 1
#else
#  define BTI_C
#  define FEATURE_BTI 0
#endif
#if defined(__ARM_FEATURE_PAC_DEFAULT) && (__ARM_FEATURE_PAC_DEFAULT & 1)
#  define SIGN_LR hint #25      /* paciasp */
#  define AUTH_LR hint #29      /* autiasp */
#  define FEATURE_PAC 2
#else
#  define SIGN_LR
#  define AUTH_LR
#  define FEATURE_PAC 0
#endif

    .text
    .globl  _PyPerf_TemplateStart
    .type   _PyPerf_TemplateStart, %function
    .p2align 4
_PyPerf_TemplateStart:
    BTI_C                       /* indirect call target under BTI */
    SIGN_LR                     /* sign x30 with sp as modifier */
    stp     x29, x30, [sp, #-16]!   /* frame record: fp, lr */
    mov     x29, sp
    blr     x3                  /* eval(tstate, frame, throwflag) */
    ldp     x29, x30, [sp], #16
    AUTH_LR
    ret
    .globl  _PyPerf_TemplateEnd
_PyPerf_TemplateEnd:
    .size   _PyPerf_TemplateStart, . - _PyPerf_TemplateStart

#if FEATURE_BTI || FEATURE_PAC
    /* GNU_PROPERTY_AARCH64_FEATURE_1_AND: BTI = 1, PAC = 2 */
    GNU_PROPERTY_NOTE(0xc0000000, (FEATURE_BTI | FEATURE_PAC))
#endif

#else
/* configure enables perf trampolines only where a template exists. */
#  error "perf trampolines: no template for this architecture"
#endif

    .section .note.GNU-stack, "", %progbits
