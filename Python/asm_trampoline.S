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
 * the function it calls finds a return address inside the trampoline (and
 * so its name), then, through the trampoline's frame record, its caller.
 *
 * Below its frame record it leaves RECORD_AREA + 16 bytes for
 * _PyEval_EvalFrameDefault, and the address it returns to right below the
 * record, where the evaluator finds it (Python/ceval.c): the evaluator,
 * which keeps no frame record of its own, makes the word below that the
 * pointer to the trampoline's record, which gives a record naming the
 * trampoline, and keeps one in the area for each Python call it runs
 * inline.  Any other function called (a stock evaluator, another PEP 523
 * function) makes its own record naming the trampoline, and the bytes stay
 * unused.  Only -X perf pays that stack, and only per trampoline call.
 * The unwind description (Python/perf_unwind.c, for perf_jit and gdb)
 * finds the CFA from the stack pointer, never from the frame pointer,
 * which the evaluator moves; it follows these instructions one by one:
 * change both together.
 */

/* _PyPerf_RECORDS * sizeof(_PyPerf_Record), from pycore_perf.h: room for
   the records of the calls the evaluator runs inline. */
#define RECORD_AREA 128

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
    lea     1f(%rip), %rax
    push    %rax                /* where eval returns to               */
    sub     $(RECORD_AREA + 8), %rsp
    call    *%rcx               /* eval(tstate, frame, throwflag)      */
    .globl  _PyPerf_TemplateReturn
_PyPerf_TemplateReturn:
1:  add     $(RECORD_AREA + 16), %rsp
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
    sub     sp, sp, #(RECORD_AREA + 32)
    stp     x29, x30, [sp, #(RECORD_AREA + 16)]  /* frame record */
    add     x29, sp, #(RECORD_AREA + 16)
    adr     x16, 1f
    str     x16, [sp, #(RECORD_AREA + 8)]   /* where eval returns to */
    blr     x3                  /* eval(tstate, frame, throwflag) */
    .globl  _PyPerf_TemplateReturn
_PyPerf_TemplateReturn:
1:  ldp     x29, x30, [sp, #(RECORD_AREA + 16)]
    add     sp, sp, #(RECORD_AREA + 32)
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
