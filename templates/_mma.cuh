// _mma.cuh - the sm_80 tensor-core warp collectives the GEMM template uses, as inline PTX.
// Pulled in by a Jinja include, like _async_copy.cuh; keep Jinja syntax out of this file (hence
// the space after each brace of the PTX operand lists: without it Jinja would read a tag).
//
//   at_ldmatrix<NUM, TRANS>(r, row)   ldmatrix.sync.aligned.m8n8.x{NUM}[.trans].shared.b16: lanes
//                                     8q .. 8q+7 give the shared addresses of the 8 rows (16
//                                     bytes, 16-byte aligned) of 8x8 matrix q < NUM; r[q] gets
//                                     this lane's two 16-bit elements of matrix q (of its
//                                     transpose with TRANS): row lane/4, columns 2 (lane%4) + {0,1}.
//   at_mma_m16n8k16<BF16>(d, a, b)    mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}: d += A B
//                                     for A 16x16 (a: 4 registers), B 16x8 (b: 2), d 16x8 floats
//                                     (4 per lane), in the PTX ISA's fragment layouts.
//
// Both are warp-wide: every lane of the warp must execute them together, with no lane exited.
// sm_80 and newer only (m16n8k16 with bf16 needs sm_80). Under AT_HOST_EMULATION (the tests'
// host emulator, tests/host_cuda/emulator.h) the emulator computes the same registers.
#ifndef AT_MMA_CUH
#define AT_MMA_CUH

#if !defined(AT_HOST_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "_mma.cuh: mma.sync m16n8k16 on bfloat16 / float16 needs sm_80 or newer"
#endif

template <int NUM, bool TRANS>
__device__ __forceinline__ void at_ldmatrix(unsigned (&r)[NUM], const void* row) {
    static_assert(NUM == 1 || NUM == 2 || NUM == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(AT_HOST_EMULATION)
    at_emu_ldmatrix(r, NUM, TRANS, row);
#else
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if (NUM == 4 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[NUM > 1 ? 1 : 0]), "=r"(r[NUM > 2 ? 2 : 0]), "=r"(r[NUM > 3 ? 3 : 0])
                     : "r"(s));
    else if (NUM == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[NUM > 1 ? 1 : 0]), "=r"(r[NUM > 2 ? 2 : 0]), "=r"(r[NUM > 3 ? 3 : 0])
                     : "r"(s));
    else if (NUM == 2 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 { %0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[NUM > 1 ? 1 : 0]) : "r"(s));
    else if (NUM == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[NUM > 1 ? 1 : 0]) : "r"(s));
    else if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 { %0}, [%1];\n" : "=r"(r[0]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 { %0}, [%1];\n" : "=r"(r[0]) : "r"(s));
#endif
}

template <bool BF16>
__device__ __forceinline__ void at_mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(AT_HOST_EMULATION)
    at_emu_mma_m16n8k16(d, a, b, d, BF16);
#else
    if (BF16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 { %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, { %0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 { %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, { %0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

#endif  // AT_MMA_CUH
