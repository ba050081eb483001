// _dtypes.cuh - element-type helpers shared by the kernel templates.
//
// Pulled in textually by a Jinja include at the top of each template. NVRTC
// runs with no include path, so this file is self-contained: no #include,
// no cuda_fp16.h. Keep Jinja syntax (double braces etc.) out of this file.
//
//   at_half               16-bit IEEE half, stored as raw bits (no arithmetic).
//   at_to_f32(v)          load-side conversion to the compute type:
//                           float   -> float
//                           at_half -> float   (exact)
//                           double  -> double  (deliberately NOT narrowed, so
//                                               double data keeps full precision)
//   at_from_f32<T>(float) store-side conversion float -> T
//                           (at_half: round to nearest even; double: exact).
//   at_from_f32<T>(double) overload, picked when the value is a double (e.g. the
//                           result of arithmetic on at_to_f32(double)): exact for
//                           T=double, otherwise rounds through float.
//
// So generic code can write
//     y = at_from_f32<T>(a * at_to_f32(x) + at_to_f32(y));
// which computes in float for float/half data and in double for double data.
#ifndef AT_DTYPES_CUH
#define AT_DTYPES_CUH

struct __align__(2) at_half {
    unsigned short bits;
};

__device__ __forceinline__ float at_to_f32(float v) { return v; }

__device__ __forceinline__ double at_to_f32(double v) { return v; }

__device__ __forceinline__ float at_to_f32(at_half v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

// float -> T. Only the three specialisations below are defined.
template <class T> __device__ __forceinline__ T at_from_f32(float v);

template <> __device__ __forceinline__ float at_from_f32<float>(float v) { return v; }

template <> __device__ __forceinline__ double at_from_f32<double>(float v) { return (double)v; }

template <> __device__ __forceinline__ at_half at_from_f32<at_half>(float v) {
    at_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
}

// double -> T (overload resolution picks this for double arguments).
template <class T> __device__ __forceinline__ T at_from_f32(double v) {
    return at_from_f32<T>((float)v);
}

template <> __device__ __forceinline__ double at_from_f32<double>(double v) { return v; }

#endif  // AT_DTYPES_CUH
