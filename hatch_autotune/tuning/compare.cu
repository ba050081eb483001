// Verification on the GPU: verify.py's rule for one element of a variant's output against the
// reference, applied to whole arrays by a kernel that leaves only a 40-byte record behind, so that
// outputs of hundreds of MB are checked where they are instead of being downloaded per config.
//
// The same text compiles as plain host C++ (g++ -ffp-contract=off): the element rule and the
// tally are __host__ __device__, and HATCH_AUTOTUNE_COMPARE then defines a serial host loop
// instead of the kernel. tests/test_device_verify.py runs that loop against verify.compare_host,
// which is how the rule is proven on a machine without a GPU. Nothing here includes a header
// (NVRTC is not given the toolkit's headers for this program, and there is no libc): float16,
// bfloat16 and the FP8 formats are read as their bits and decoded here, complex as two floats
// or doubles, bool as its byte.
//
// device_verify.py appends one `HATCH_AUTOTUNE_COMPARE(got, expected)` line per dtype pair.
// Compile with --fmad=false (host: -ffp-contract=off): NumPy rounds `rtol * |e|` before adding
// atol, and a fused multiply-add would round once, deciding elements at the boundary otherwise.

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HATCH_AUTOTUNE_ON_DEVICE 1
#define HD __host__ __device__
#else
#define HD
#endif

typedef unsigned long long u64;

// What a launch leaves in device memory. The host sets the two firsts to all-ones bytes (none
// yet) and the rest to zero bytes before the launch; device_verify.py's RECORD_FIELDS is this.
struct CompareRecord {
    u64 first_unwritten;   // lowest flat index of an unwritten element (NaN where the reference has a number)
    u64 first_differ;      // lowest flat index of a differing element
    u64 unwritten;         // how many are unwritten
    u64 differ;            // how many differ
    u64 worst_error_bits;  // the largest |got - expected| of the differing ones, as a double's bits:
                           // for non-negative doubles the bits' integer order is the numbers' order
};

constexpr u64 NO_INDEX = ~0ULL;

// ---- bits and numbers -----------------------------------------------------------------------

// Reinterpreting bits: the device's intrinsics (NVRTC has no memcpy builtin), memcpy on the host.
HD inline float float_from_bits(unsigned int bits) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

HD inline double double_from_bits(u64 bits) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)bits);
#else
    double d;
    __builtin_memcpy(&d, &bits, sizeof d);
    return d;
#endif
}

HD inline u64 bits_of_double(double d) {
#ifdef __CUDA_ARCH__
    return (u64)__double_as_longlong(d);
#else
    u64 bits;
    __builtin_memcpy(&bits, &d, sizeof bits);
    return bits;
#endif
}

// IEEE binary16 bits -> the float of the same value (every half is exactly a float): zeros,
// subnormals (renormalised), normals, infinities and NaNs (payload kept), as NumPy converts.
HD inline float half_bits_to_float(unsigned short h) {
    unsigned int sign = (unsigned int)(h >> 15) << 31;
    unsigned int exponent = (h >> 10) & 0x1f;
    unsigned int mantissa = h & 0x3ff;
    if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return float_from_bits(sign);
        unsigned int biased = 127 - 15 + 1;  // a subnormal half is mantissa * 2^-24
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            biased -= 1;
        }
        return float_from_bits(sign | (biased << 23) | ((mantissa & 0x3ff) << 13));
    }
    return float_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// bfloat16 bits -> float: the upper half of a float32 (NaN payloads kept).
HD inline float bfloat16_bits_to_float(unsigned short b) { return float_from_bits((unsigned int)b << 16); }

// float8_e4m3fn (sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities, S.1111.111
// is NaN, the largest value 448) -> float: every value is exactly a float, subnormals included.
HD inline float e4m3fn_bits_to_float(unsigned char b) {
    unsigned int sign = (unsigned int)(b >> 7) << 31;
    unsigned int exponent = (b >> 3) & 0xf;
    unsigned int mantissa = b & 0x7;
    if (exponent == 0xf && mantissa == 0x7) return float_from_bits(sign | 0x7fc00000u);
    if (exponent == 0) {
        if (mantissa == 0) return float_from_bits(sign);
        unsigned int biased = 127 - 7 + 1;  // a subnormal is mantissa * 2^-9
        while (!(mantissa & 0x8)) {
            mantissa <<= 1;
            biased -= 1;
        }
        return float_from_bits(sign | (biased << 23) | ((mantissa & 0x7) << 20));
    }
    return float_from_bits(sign | ((exponent + 127 - 7) << 23) | (mantissa << 20));
}

// float8_e5m2 is the upper byte of an IEEE binary16 (same exponent, 2 of its 10 mantissa bits):
// infinities, NaNs and subnormals as float16 has them.
HD inline float e5m2_bits_to_float(unsigned char b) { return half_bits_to_float((unsigned short)(b << 8)); }

// float8_e8m0fnu: 2^(b - 127), no sign, no zero; 0xff is NaN. 2^-127 (b = 0) is a float32 subnormal.
HD inline float e8m0fnu_bits_to_float(unsigned char b) {
    if (b == 0xff) return float_from_bits(0x7fc00000u);
    return float_from_bits(b == 0 ? 0x00400000u : (unsigned int)b << 23);
}

// A correctly rounded square root: IEEE on both sides (not hypot, whose last bit libm and CUDA
// compute differently), so that complex magnitudes are the same numbers on the host and the device.
HD inline double sqrt_rn(double x) {
#ifdef __CUDA_ARCH__
    return __dsqrt_rn(x);
#else
    return __builtin_sqrt(x);
#endif
}

// |x| as np.abs gives it (+0 for -0, so that a worst error is never a negative zero's bits).
template <typename W> HD inline W magnitude(W x) { return x < W(0) ? -x : (x == W(0) ? W(0) : x); }
template <typename W> HD inline bool is_nan(W x) { return x != x; }
template <typename W> struct largest;
template <> struct largest<float> { HD static float value() { return 3.40282346638528859812e+38F; } };
template <> struct largest<double> { HD static double value() { return 1.79769313486231570815e+308; } };
template <typename W> HD inline bool is_infinite(W x) { return x > largest<W>::value() || x < -largest<W>::value(); }

// ---- dtypes: how an element is stored and what number it is ----------------------------------

// What a dtype's values are, which picks the rule: integers (and bool) exact, real floats within
// a tolerance in a work type, complex on magnitudes in double.
enum { KIND_INTEGER = 0, KIND_FLOAT = 1, KIND_COMPLEX = 2 };

// The real floats up to 32 bits: every value decodes to a float exactly.
#define HATCH_AUTOTUNE_NARROW_FLOAT(NAME, BITS, DECODE)     \
    struct dt_##NAME {                                      \
        typedef BITS bits;                                  \
        static constexpr int kind = KIND_FLOAT;             \
        static constexpr bool wide = false;                 \
        HD static float value(bits b) { return DECODE(b); } \
    };
HATCH_AUTOTUNE_NARROW_FLOAT(float16, unsigned short, half_bits_to_float)
HATCH_AUTOTUNE_NARROW_FLOAT(float32, unsigned int, float_from_bits)
HATCH_AUTOTUNE_NARROW_FLOAT(bfloat16, unsigned short, bfloat16_bits_to_float)
HATCH_AUTOTUNE_NARROW_FLOAT(float8_e4m3fn, unsigned char, e4m3fn_bits_to_float)
HATCH_AUTOTUNE_NARROW_FLOAT(float8_e5m2, unsigned char, e5m2_bits_to_float)
HATCH_AUTOTUNE_NARROW_FLOAT(float8_e8m0fnu, unsigned char, e8m0fnu_bits_to_float)
struct dt_float64 {
    typedef u64 bits;
    static constexpr int kind = KIND_FLOAT;
    static constexpr bool wide = true;
    HD static double value(bits b) { return double_from_bits(b); }
};

// complex64: one 8-byte word, the real part's float in its low half (little-endian, as NumPy and
// the GPU store it); complex128: two doubles' words. Parts are read as doubles (exactly).
struct dt_complex64 {
    typedef u64 bits;
    static constexpr int kind = KIND_COMPLEX;
    HD static double re(bits b) { return (double)float_from_bits((unsigned int)(b & 0xffffffffu)); }
    HD static double im(bits b) { return (double)float_from_bits((unsigned int)(b >> 32)); }
};
struct c128_bits {
    u64 re, im;
};
HD inline bool operator==(const c128_bits& a, const c128_bits& b) { return a.re == b.re && a.im == b.im; }
struct dt_complex128 {
    typedef c128_bits bits;
    static constexpr int kind = KIND_COMPLEX;
    HD static double re(bits b) { return double_from_bits(b.re); }
    HD static double im(bits b) { return double_from_bits(b.im); }
};

template <typename T> struct dt_integer {
    typedef T bits;
    static constexpr int kind = KIND_INTEGER;
    static constexpr bool wide = false;
    HD static T value(bits b) { return b; }
};
struct dt_int8 : dt_integer<signed char> {};
struct dt_int16 : dt_integer<short> {};
struct dt_int32 : dt_integer<int> {};
struct dt_int64 : dt_integer<long long> {};
struct dt_uint8 : dt_integer<unsigned char> {};
struct dt_uint16 : dt_integer<unsigned short> {};
struct dt_uint32 : dt_integer<unsigned int> {};
struct dt_uint64 : dt_integer<unsigned long long> {};
struct dt_bool : dt_integer<unsigned char> {};  // its byte: the poison 0x5A is neither false nor true

// Bitwise equality where both sides store the same dtype; never where they do not.
template <typename A, typename B> HD inline bool same_bits(const A&, const B&) { return false; }
template <typename A> HD inline bool same_bits(const A& a, const A& b) { return a == b; }

template <typename A, typename B> struct same_layout { static constexpr bool value = false; };
template <typename A> struct same_layout<A, A> { static constexpr bool value = true; };

// verify.work_dtype: float32 for float16/32, bfloat16 and FP8, float64 when either is.
template <bool Wide> struct work_type { typedef float type; };
template <> struct work_type<true> { typedef double type; };

// ---- the rule for one element ------------------------------------------------------------------

struct Verdict {
    bool unwritten;  // NaN where the reference has a number: reported before any difference
    bool differ;
    double error;    // |got - expected| when it differs (NaN, i.e. NaN against an infinity, as inf)
};

template <typename G, typename E, int Kind = G::kind> struct Rule;

template <typename G, typename E> struct Rule<G, E, KIND_FLOAT> {
    typedef typename work_type<G::wide || E::wide>::type W;
    HD static Verdict judge(typename G::bits got, typename E::bits expected, W rtol, W atol) {
        W g = (W)G::value(got), e = (W)E::value(expected);
        Verdict v;
        v.unwritten = is_nan(g) && !is_nan(e);
        W err = magnitude(W(g - e));
        W scaled = rtol * magnitude(e);  // rounded to W on its own: no fused multiply-add
        W tol = atol + scaled;
        // NaN compares false: NaNs are counted above, and a finite value where the reference is
        // NaN is not a difference. An infinite reference is matched exactly or not at all.
        v.differ = err > tol || (is_infinite(e) && g != e);
        v.error = is_nan(err) ? double_from_bits(0x7ff0000000000000ULL) : (double)err;  // +inf
        return v;
    }
};

// Complex: magnitudes in double, each step rounded (compare.cu and verify._judge_complex agree
// bit for bit). NaN when a part is; infinite when a part is and none is NaN.
template <typename G, typename E> struct Rule<G, E, KIND_COMPLEX> {
    typedef double W;
    HD static Verdict judge(typename G::bits got, typename E::bits expected, W rtol, W atol) {
        W gr = G::re(got), gi = G::im(got), er = E::re(expected), ei = E::im(expected);
        bool nan_e = is_nan(er) || is_nan(ei);
        Verdict v;
        v.unwritten = (is_nan(gr) || is_nan(gi)) && !nan_e;
        W dr = gr - er, di = gi - ei;
        W dr2 = dr * dr, di2 = di * di;  // each product rounded on its own: no fused multiply-add
        W err = sqrt_rn(dr2 + di2);
        W er2 = er * er, ei2 = ei * ei;
        W scaled = rtol * sqrt_rn(er2 + ei2);
        W tol = atol + scaled;
        bool infinite = (is_infinite(er) || is_infinite(ei)) && !nan_e;
        v.differ = err > tol || (infinite && (gr != er || gi != ei));
        v.error = is_nan(err) ? double_from_bits(0x7ff0000000000000ULL) : err;  // +inf
        return v;
    }
};

template <typename G, typename E> struct Rule<G, E, KIND_INTEGER> {
    typedef double W;  // integers compare exactly; the tolerances are not used
    HD static Verdict judge(typename G::bits got, typename E::bits expected, W, W) {
        Verdict v;
        v.unwritten = false;
        v.differ = got != expected;
        v.error = magnitude((double)got - (double)expected);
        return v;
    }
};

// ---- tallies: per thread, merged per warp, per block, then into the record ------------------------

struct Tally {
    u64 unwritten, first_unwritten, differ, first_differ;
    double worst;
};

HD inline Tally empty_tally() {
    Tally t;
    t.unwritten = 0;
    t.first_unwritten = NO_INDEX;
    t.differ = 0;
    t.first_differ = NO_INDEX;
    t.worst = 0.0;
    return t;
}

HD inline void add(Tally& t, u64 index, const Verdict& v) {
    if (v.unwritten) {
        t.unwritten += 1;
        if (index < t.first_unwritten) t.first_unwritten = index;
    }
    if (v.differ) {
        t.differ += 1;
        if (index < t.first_differ) t.first_differ = index;
        if (v.error > t.worst) t.worst = v.error;
    }
}

template <typename G, typename E> HD inline void add_element(Tally& t, u64 i, const void* got, const void* expected,
                                                             typename Rule<G, E>::W rtol, typename Rule<G, E>::W atol) {
    typename G::bits g = ((const typename G::bits*)got)[i];
    typename E::bits e = ((const typename E::bits*)expected)[i];
    if (same_layout<G, E>::value && same_bits(g, e)) return;  // bitwise the reference: NaN bits included
    add(t, i, Rule<G, E>::judge(g, e, rtol, atol));
}

HD inline void write_record(const Tally& t, CompareRecord* out) {
    out->first_unwritten = t.first_unwritten;
    out->first_differ = t.first_differ;
    out->unwritten = t.unwritten;
    out->differ = t.differ;
    out->worst_error_bits = bits_of_double(t.worst);
}

#ifdef HATCH_AUTOTUNE_ON_DEVICE

__device__ inline Tally merged(Tally a, const Tally& b) {
    a.unwritten += b.unwritten;
    a.first_unwritten = b.first_unwritten < a.first_unwritten ? b.first_unwritten : a.first_unwritten;
    a.differ += b.differ;
    a.first_differ = b.first_differ < a.first_differ ? b.first_differ : a.first_differ;
    a.worst = b.worst > a.worst ? b.worst : a.worst;
    return a;
}

__device__ inline Tally warp_merged(Tally t) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        Tally other;
        other.unwritten = __shfl_down_sync(0xffffffffu, t.unwritten, offset);
        other.first_unwritten = __shfl_down_sync(0xffffffffu, t.first_unwritten, offset);
        other.differ = __shfl_down_sync(0xffffffffu, t.differ, offset);
        other.first_differ = __shfl_down_sync(0xffffffffu, t.first_differ, offset);
        other.worst = __shfl_down_sync(0xffffffffu, t.worst, offset);
        t = merged(t, other);
    }
    return t;  // lane 0 holds the warp's
}

// The grid-stride loop over every element, then one set of atomics per block that found
// something; a block that found nothing leaves after one barrier. blockDim.x: a multiple of 32.
template <typename G, typename E>
__device__ void compare_on_device(const void* got, const void* expected, u64 n, double rtol, double atol, CompareRecord* out) {
    typedef typename Rule<G, E>::W W;
    const W rtol_w = (W)rtol, atol_w = (W)atol;  // NumPy casts the tolerances to the work type too
    Tally t = empty_tally();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) add_element<G, E>(t, i, got, expected, rtol_w, atol_w);
    if (!__syncthreads_or(t.unwritten != 0 || t.differ != 0)) return;
    __shared__ Tally per_warp[32];
    t = warp_merged(t);
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) per_warp[warp] = t;
    __syncthreads();
    if (warp != 0) return;
    t = lane < (blockDim.x >> 5) ? per_warp[lane] : empty_tally();
    t = warp_merged(t);
    if (lane != 0) return;
    if (t.unwritten) {
        atomicAdd(&out->unwritten, t.unwritten);
        atomicMin(&out->first_unwritten, t.first_unwritten);
    }
    if (t.differ) {
        atomicAdd(&out->differ, t.differ);
        atomicMin(&out->first_differ, t.first_differ);
        atomicMax(&out->worst_error_bits, bits_of_double(t.worst));
    }
}

#define HATCH_AUTOTUNE_COMPARE(GOT, EXPECTED)                                                                      \
    extern "C" __global__ void hatch_autotune_compare_##GOT##_##EXPECTED(const void* got, const void* expected, \
                                                                          u64 n, double rtol, double atol,     \
                                                                          CompareRecord* out) {                 \
        compare_on_device<dt_##GOT, dt_##EXPECTED>(got, expected, n, rtol, atol, out);                          \
    }

#else  // host C++: the same rule, one element after another

template <typename G, typename E>
void compare_on_host(const void* got, const void* expected, u64 n, double rtol, double atol, CompareRecord* out) {
    typedef typename Rule<G, E>::W W;
    const W rtol_w = (W)rtol, atol_w = (W)atol;
    Tally t = empty_tally();
    for (u64 i = 0; i < n; ++i) add_element<G, E>(t, i, got, expected, rtol_w, atol_w);
    write_record(t, out);
}

#define HATCH_AUTOTUNE_COMPARE(GOT, EXPECTED)                                                                    \
    extern "C" void hatch_autotune_compare_host_##GOT##_##EXPECTED(const void* got, const void* expected, u64 n, \
                                                                   double rtol, double atol, CompareRecord* out) { \
        compare_on_host<dt_##GOT, dt_##EXPECTED>(got, expected, n, rtol, atol, out);                             \
    }

#endif
