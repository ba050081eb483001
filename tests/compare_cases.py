"""Outputs and references that verification must judge alike on the host and on the device.

Each case is (got, expected, rtol, atol) and, where the answer was worked out by hand while the
case was built, `expect` = (unwritten, first unwritten, differ, first differ); None where only
an oracle can tell (elements placed on the tolerance's rounding boundary, every float16 bit
pattern against another). Used by tests/test_device_verify.py: the host rule, compare.cu compiled
as host C++, the driver stand-in and a real GPU all run every case.

bfloat16 and FP8 arrays are ml_dtypes'; their cases use the default tolerances of verify.py, so
that what a tuning run applies is what is proven alike on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import ml_dtypes
import numpy as np

from hatch_autotune.tuning.verify import TOLERANCES

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
FP8 = (E4M3, E5M2, E8M0)


@dataclass(frozen=True)
class Case:
    name: str
    got: np.ndarray
    expected: np.ndarray
    rtol: float
    atol: float
    expect: tuple[int, int, int, int] | None  # (unwritten, first unwritten, differ, first differ)

    @property
    def pair(self) -> tuple[str, str]:
        return self.got.dtype.name, self.expected.dtype.name


F32_TOL = (1e-4, 1e-5)
F16_TOL = (1e-2, 1e-3)
F64_TOL = (1e-10, 1e-12)
FUSED_TOL = (0.3, 1e-3)
# For float64 sums in [0.25, 0.5) (a grid of 2^-54): an atol whose bits below that grid are just
# under half a step, so that where rtol * |e| rounded down, adding atol rounds down as well, while
# the exact sum rounds up: the case where fusing changes the tolerance.
FUSED_TOL_F64 = (0.3, float(Fraction(round(Fraction(1, 1000) * 2**54), 2**54) + Fraction(1, 2**55) - Fraction(1, 2**60)))
INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
NOTHING = (0, -1, 0, -1)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _poisoned(like: np.ndarray) -> np.ndarray:
    """What the worker's poison leaves in a float output: all-ones bytes, a NaN."""
    out = np.empty_like(like)
    out.view(np.uint8)[...] = 0xFF
    return out


def _f32_tolerance(e: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """The tolerance as the rule computes it for float32: two roundings, in float32."""
    return np.float32(atol) + np.float32(rtol) * np.abs(e)


def _just_inside_and_outside(e: np.float32, rtol: float, atol: float) -> tuple[np.float32, np.float32]:
    """The largest got above e whose float32 error is within the tolerance, and the next float32."""
    tol = _f32_tolerance(np.float32(e), rtol, atol)
    g = np.float32(e + tol)
    while np.float32(g - e) > tol:
        g = np.nextafter(g, np.float32(-np.inf))
    while np.float32(np.nextafter(g, np.float32(np.inf)) - e) <= tol:
        g = np.nextafter(g, np.float32(np.inf))
    return g, np.nextafter(g, np.float32(np.inf))


def _boundary_case() -> tuple[np.ndarray, np.ndarray]:
    """Outputs within a few ulps of e + tolerance: float32 rounding (not float64, not a fused
    multiply-add) decides which of them differ."""
    e = (_rng(7).standard_normal(4096) * 100).astype(np.float32)
    tol = _f32_tolerance(e, 1e-3, 1e-4)
    edge = (e + tol).astype(np.float32)
    steps = []
    for k in range(-2, 3):
        g = edge.copy()
        for _ in range(abs(k)):
            g = np.nextafter(g, np.float32(np.inf) if k > 0 else np.float32(-np.inf))
        steps.append(g)
    return np.concatenate(steps), np.tile(e, 5)


def _fused_case() -> tuple[np.ndarray, np.ndarray]:
    """Outputs exactly one float32 step more than the tolerance away from the reference, for
    references where a fused multiply-add rounds atol + rtol * |e| up to that step: the rule (two
    roundings) rejects them, a fused one would accept them. Every other element is exact."""
    e = _rng(8).uniform(1, 1.4, 20000).astype(np.float32)  # e + tol < 2: the sums below are exact
    rtol, atol = np.float32(FUSED_TOL[0]), np.float32(FUSED_TOL[1])
    two_roundings = atol + rtol * e
    fused = (np.float64(rtol) * e.astype(np.float64) + np.float64(atol)).astype(np.float32)  # the product is exact in float64
    at_fused = (e + fused).astype(np.float32)
    keep = (fused > two_roundings) & (at_fused - e == fused)
    assert keep.sum() >= 256, keep.sum()
    expected = np.repeat(e[keep][:256], 2)
    got = expected.copy()
    got[0::2] = at_fused[keep][:256]
    return got, expected


def _fused_complex_case() -> tuple[np.ndarray, np.ndarray]:
    """The same for complex128 (float64 arithmetic): references with no imaginary part, whose
    magnitude sqrt(er * er) is |er| exactly, and outputs exactly the fused tolerance away, where
    fusing atol + rtol * |e| rounds it up (worked out exactly with fractions)."""
    e = _rng(9).uniform(1, 1.4, 4000)
    rtol, atol = Fraction(FUSED_TOL_F64[0]), Fraction(FUSED_TOL_F64[1])
    kept = []
    for x in map(float, e):
        two_roundings = float(atol + Fraction(float(rtol * Fraction(x))))
        fused = float(rtol * Fraction(x) + atol)  # one rounding
        at_fused = x + fused
        if fused > two_roundings and at_fused - x == fused:
            kept.append((at_fused, x))
        if len(kept) == 256:
            break
    assert len(kept) == 256, len(kept)
    got, expected = (np.repeat(np.array(column, np.complex128), 2) for column in zip(*kept))
    got[1::2] = expected[1::2]
    return got, expected


def _every_half() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _every(dtype: np.dtype) -> np.ndarray:
    """Every bit pattern of a 1- or 2-byte dtype, NaNs, infinities and subnormals included."""
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint32).astype(f"u{dtype.itemsize}")
    return bits.view(dtype)


def _bits(dtype: np.dtype, *patterns: int) -> np.ndarray:
    return np.array(patterns, f"u{dtype.itemsize}").view(dtype)


def _narrow_cases(add) -> None:
    """bfloat16 and FP8: every bit pattern decoded (against its float32 and float64 value, and
    against its neighbour, which an oracle judges), hand-made cases at the default tolerance."""
    for dtype in (BF16, *FP8):
        every = _every(dtype)
        tol = TOLERANCES[dtype.name]
        far = 3 if dtype == BF16 else 2  # a step past the default tolerance, in places
        with np.errstate(invalid="ignore"):  # ml_dtypes warns casting float8_e8m0fnu's NaN to float64
            as32, as64, far32 = every.astype(np.float32), every.astype(np.float64), np.roll(every, far).astype(np.float32)
        add(Case(f"every {dtype.name} against its float32 value", every, as32, 0.0, 0.0, NOTHING))
        add(Case(f"every {dtype.name} against its float64 value", every, as64, 0.0, 0.0, NOTHING))
        add(Case(f"every {dtype.name} against the next bit pattern", every, np.roll(every, 1), *tol, None))
        add(Case(f"every {dtype.name} against the float32 value {far} bit patterns away", every, far32, *tol, None))

    # bfloat16, rtol 2^-6 (two ulps), atol 2^-8
    e = np.array([1.0, 2.0, -3.0, 0.5, 100.0, np.nan, np.inf, -np.inf], np.float32).astype(BF16)
    g = np.array([1.015625, 2.046875, -3.0, 0.5, 100.0, 7.0, np.inf, -3e38], np.float32).astype(BF16)  # 2 ulps, 3 ulps
    g[3:4].view(np.uint16)[...] = 0xFFFF  # the poison: a NaN
    add(Case("bfloat16: 2 ulps in, 3 ulps out, poison, finite against -inf", g, e, *TOLERANCES["bfloat16"], (1, 3, 2, 1)))
    e = np.float32([0.0, 1.0, 2.0, 0.0, 0.0])
    g = _bits(BF16, 0x8000, 0x3F80, 0x4000, 0x0001, 0x7FC1)  # -0; equal; the smallest subnormal; a NaN
    add(Case("bfloat16 output against a float32 reference: -0, subnormal, NaN", g, e, *TOLERANCES["bfloat16"], (1, 4, 0, -1)))

    # float8_e4m3fn, rtol 2^-3 (one ulp), atol 2^-4: no infinities, S.1111.111 is NaN
    e = np.array([1.0, 2.0, 448.0, -0.5, 2.0**-9, np.nan], np.float32).astype(E4M3)
    g = np.array([1.125, 2.5, 416.0, -0.5, 0.0, 1.0], np.float32).astype(E4M3)
    g[3:4].view(np.uint8)[...] = 0x7F
    add(Case("float8_e4m3fn: 1 ulp in, 2 ulps out, NaN, subnormal", g, e, *TOLERANCES["float8_e4m3fn"], (1, 3, 1, 1)))

    # float8_e5m2, rtol 2^-2 (one ulp), atol 2^-3: the upper byte of a float16
    e = np.array([1.0, 1.25, np.inf, -np.inf, 57344.0, 2.0**-16, np.nan], np.float32).astype(E5M2)
    g = np.array([1.25, 2.0, 57344.0, -np.inf, 49152.0, np.nan, 3.0], np.float32).astype(E5M2)
    add(Case("float8_e5m2: 1 ulp in, out, largest against inf, NaN", g, e, *TOLERANCES["float8_e5m2"], (1, 5, 2, 1)))

    # float8_e8m0fnu: powers of two 2^-127 ... 2^127, 0xFF is NaN; exact
    e = _bits(E8M0, 127, 128, 126, 0, 254, 0xFF)
    g = _bits(E8M0, 127, 129, 126, 0, 0xFF, 127)
    add(Case("float8_e8m0fnu: twice as large, poison, a number against NaN", g, e, *TOLERANCES["float8_e8m0fnu"], (1, 4, 1, 1)))
    add(Case("float8_e8m0fnu output against a float32 reference", g, e.astype(np.float32), 0.0, 0.0, (1, 4, 1, 1)))

    r = _rng(20).standard_normal(256)
    r[5] = 1.3
    for dtype in (BF16, E4M3, E5M2):
        for wide in (np.float32, np.float64):
            e = r.astype(wide)
            g = e.astype(dtype)  # rounded: within half an ulp
            g[5] = np.float32(2.6)  # twice the reference: outside any of their tolerances
            g[9:10].view(f"u{dtype.itemsize}")[...] = 0xFFFF if dtype.itemsize == 2 else 0xFF
            add(Case(f"{dtype.name} output rounded from a {np.dtype(wide).name} reference", g, e, *TOLERANCES[dtype.name], (1, 9, 1, 5)))
    e = (2.0 ** _rng(21).integers(-8, 9, 64)).astype(np.float64)
    g = e.astype(E8M0)
    g[33] = np.float32(e[33] * 2)
    add(Case("float8_e8m0fnu output against a float64 reference", g, e, 0.0, 0.0, (0, -1, 1, 33)))

    n = 300_001  # many blocks, for a 2-byte dtype
    e = _rng(22).standard_normal(n).astype(np.float32).astype(BF16)
    g = e.copy()
    bad = [299_999, 200_000, 70_000]
    g[bad] = (e[bad].astype(np.float32) + 4.0).astype(BF16)
    g[[262_143, 150_000]] = np.nan
    add(Case("bfloat16, many blocks", g, e, *TOLERANCES["bfloat16"], (2, 150_000, 3, 70_000)))


def _complex_cases(add) -> None:
    """complex64/128: magnitudes of differences, a NaN part, infinite parts."""
    tol = TOLERANCES["complex64"]
    r = _rng(30).standard_normal((2, 1000)).astype(np.float32)
    e = (r[0] + 1j * r[1]).astype(np.complex64)
    g = (np.nextafter(e.real, np.float32(np.inf)) + 1j * e.imag).astype(np.complex64)  # one ulp: within
    g[17] += np.complex64(0.01j)
    g[3] = complex(np.nan, g[3].imag)
    e[30], g[30] = complex(1.0, np.nan), 5 + 5j  # a number where the reference is NaN
    e[40], g[40] = complex(np.inf, 0.0), complex(np.inf, 0.0)
    e[41], g[41] = complex(np.inf, 1.0), complex(np.inf, 2.0)  # an infinite reference, matched in part only
    e[42], g[42] = complex(np.nan, np.inf), 0  # NaN and infinite: NaN, which anything matches
    e[43], g[43] = complex(np.inf, 0.0), complex(np.nan, np.nan)  # unwritten, and infinitely wrong
    add(Case("complex64: a part off, a NaN part, infinite parts", g, e, *tol, (2, 3, 3, 17)))
    add(Case("complex64 equal", e.copy(), e, *tol, NOTHING))

    # on the tolerance's boundary: |g - e| within a few float64 steps of atol + rtol * |e|
    e = (r[0] + 1j * r[1]).astype(np.complex64)
    angle = _rng(31).uniform(0, 2 * np.pi, e.size)
    reach = np.float64(tol[1]) + np.float64(tol[0]) * np.abs(e.astype(np.complex128))
    steps = [((e.astype(np.complex128) + reach * f * np.exp(1j * angle)).astype(np.complex64)) for f in (0.999, 1.0, 1.001)]
    add(Case("complex64 on the tolerance's boundary", np.concatenate(steps), np.tile(e, 3), *tol, None))

    tol = TOLERANCES["complex128"]
    r = _rng(32).standard_normal((2, 100))
    e = r[0] + 1j * r[1]
    g = e + (1e-13 + 1e-13j)
    g[5] += 1e-9j
    g[60] = complex(g[60].real, np.nan)
    add(Case("complex128: within, an imaginary part off, a NaN part", g, e, *tol, (1, 60, 1, 5)))
    g = e.astype(np.complex64)
    g[2] += np.complex64(1e-3)
    add(Case("complex64 output against a complex128 reference", g, e, *TOLERANCES["complex64"], (0, -1, 1, 2)))


def _bool_cases(add) -> None:
    """bool: its byte, exactly; the poison 0x5A is neither false nor true."""
    e = _rng(40).integers(0, 2, 100).astype(bool)
    e[70] = True
    add(Case("bool equal", e.copy(), e, 0.0, 0.0, NOTHING))
    g = e.copy()
    g[40] = not e[40]
    g[70:71].view(np.uint8)[...] = 0x5A  # unwritten: the worker's poison
    add(Case("bool: one flipped, one poisoned", g, e, 0.0, 0.0, (0, -1, 2, 40)))


def _build() -> list[Case]:
    cases: list[Case] = []
    add = cases.append

    ref = np.arange(10, dtype=np.float32)
    add(Case("equal float32", ref.copy(), ref, *F32_TOL, NOTHING))

    e = _rng(1).standard_normal(1000).astype(np.float32)
    g = np.nextafter(e, np.float32(np.inf))
    e[17], g[17] = 0.0, -0.0  # not the same bits, the same number
    add(Case("within tolerance float32 (one ulp, and -0 against 0)", g, e, *F32_TOL, NOTHING))

    e = np.linspace(-4, 4, 12).astype(np.float32)
    e[3] = e[7] = 1.0
    g = e.copy()
    g[3], g[7] = _just_inside_and_outside(np.float32(1.0), *F32_TOL)
    add(Case("just inside (3) and just outside (7) the float32 tolerance", g, e, *F32_TOL, (0, -1, 1, 7)))

    g, e = _boundary_case()
    add(Case("on the float32 tolerance's rounding boundary", g, e, 1e-3, 1e-4, None))

    g, e = _fused_case()
    add(Case("exactly the tolerance away, where a fused multiply-add would round it up", g, e, *FUSED_TOL, (0, -1, 256, 0)))
    g, e = _fused_complex_case()
    add(Case("complex128 exactly the tolerance away, where a fused multiply-add would round it up", g, e, *FUSED_TOL_F64, (0, -1, 256, 0)))

    e = np.arange(10, dtype=np.float32)
    g = _poisoned(e)
    g[:5] = e[:5]
    add(Case("NaN where the reference has a number (unwritten)", g, e, *F32_TOL, (5, 5, 0, -1)))

    e = np.arange(6, dtype=np.float64)
    e[2] = e[4] = np.nan
    g = e.copy()
    g[4] = np.uint64(0x7FF8_0000_DEAD_BEEF).view(np.float64)  # another NaN's bits
    g[5] += 1e-3  # so that the arrays are not bitwise equal as a whole
    add(Case("NaN where the reference is NaN, same bits or not", g, e, *F64_TOL, (0, -1, 1, 5)))

    e = np.array([1.0, np.nan, 3.0], np.float32)
    g = np.array([1.0, 2.0, 3.0], np.float32)
    add(Case("a number where the reference is NaN is no difference", g, e, *F32_TOL, NOTHING))

    e = np.array([1.0, 2.0, 3.0, np.inf, -np.inf], np.float32)
    g = np.array([1.0, 2.0, 3.0, 1e30, -np.inf], np.float32)
    add(Case("finite where the reference is infinite", g, e, *F32_TOL, (0, -1, 1, 3)))

    e = np.array([np.inf, -np.inf, 1.0], np.float32)
    add(Case("inf against inf (float16 output, float32 reference)", e.astype(np.float16), e, *F16_TOL, NOTHING))
    g = np.array([np.inf, -np.inf, 1.5], np.float32)
    add(Case("inf against inf, another element off", g, e, *F32_TOL, (0, -1, 1, 2)))

    e = np.array([1.0, np.inf, np.inf, -np.inf], np.float64)
    g = np.array([1.0, -np.inf, np.inf, np.inf], np.float64)
    add(Case("-inf against inf", g, e, *F64_TOL, (0, -1, 2, 1)))

    e = np.array([0.0, 1.0, np.inf, 2.0], np.float32)
    g = np.array([0.0, 1.0, np.nan, np.nan], np.float32)
    add(Case("NaN against inf: unwritten and different", g, e, *F32_TOL, (2, 2, 1, 2)))

    e = np.zeros(37, np.int32)
    g = np.full(37, 0x5A5A5A5A, np.int32)  # the worker's integer poison
    add(Case("int32 poison against zeros", g, e, 0.0, 0.0, (0, -1, 37, 0)))

    for i, dtype in enumerate(INTEGERS):
        info = np.iinfo(dtype)
        e = _rng(10 + i).integers(info.min, info.max, 100, dtype=dtype, endpoint=True)
        add(Case(f"{dtype} equal", e.copy(), e, 0.0, 0.0, NOTHING))
        g, e = e.copy(), e.copy()
        g[40], e[40] = info.max, info.min  # the widest difference the dtype has
        g[90] = e[90] ^ 1
        add(Case(f"{dtype} different", g, e, 0.0, 0.0, (0, -1, 2, 40)))

    halves = _every_half()
    add(Case("every float16 against its float32 value", halves, halves.astype(np.float32), 0.0, 0.0, NOTHING))
    add(Case("every float16 against its float64 value", halves, halves.astype(np.float64), 0.0, 0.0, NOTHING))
    add(Case("every float16 against the next bit pattern", halves, np.roll(halves, 1), *F16_TOL, None))

    tiny = np.float16(2.0**-24)  # the smallest subnormal
    e = np.array([tiny, 3 * tiny, 1023 * tiny, -tiny, np.float16(6.104e-5), np.inf, -np.inf, 65504, 0.0], np.float16)
    g = e.copy()
    g[1] = 4 * tiny  # a subnormal, one step off: outside atol = 0.5 step
    g[2] = 1022 * tiny  # the largest subnormal, one step off
    g[5] = 65504  # the largest half where the reference is inf
    g[8] = tiny
    add(Case("float16 subnormals and infinities", g, e, 0.0, float(tiny) / 2, (0, -1, 4, 1)))
    g = g.copy()
    g[1], g[2], g[8] = 3.5 * tiny, 1023 * tiny, tiny / 2  # 3.5 and 0.5 round to even: 4 and 0
    add(Case("float16 subnormals within half a step", g, e, 0.0, float(tiny), (0, -1, 1, 5)))

    e64 = _rng(2).standard_normal(64)
    g = e64.astype(np.float32)
    g[11] = np.float32(e64[11] + 1.0)
    add(Case("float32 output against a float64 reference", g, e64, *F32_TOL, (0, -1, 1, 11)))
    g = e64.astype(np.float16)
    g[50] = np.float16(e64[50] + 0.5)
    add(Case("float16 output against a float64 reference", g, e64, *F16_TOL, (0, -1, 1, 50)))
    e32 = e64.astype(np.float32)
    g = e32.astype(np.float16)
    g[0] = np.nan
    g[63] = np.float16(e32[63] - 0.5)
    add(Case("float16 output against a float32 reference", g, e32, *F16_TOL, (1, 0, 1, 63)))

    n = 300_001  # many blocks, and more than one of compare_host's chunks
    e = _rng(3).standard_normal(n).astype(np.float32)
    g = e.copy()
    bad = [299_999, 262_144, 200_000, 75_100, 70_000]  # the first is in a late block of the first pass
    g[bad] += 1.0
    g[[262_143, 150_000]] = np.nan
    add(Case("many blocks: counts add up and the first is the lowest", g.reshape(1, n), e.reshape(1, n), *F32_TOL, (2, 150_000, 5, 70_000)))

    add(Case("n = 0", np.zeros((3, 0), np.float32), np.zeros((3, 0), np.float32), *F32_TOL, NOTHING))
    add(Case("n = 1 (0-d) equal", np.array(2.5), np.array(2.5), *F64_TOL, NOTHING))
    add(Case("n = 1 different", np.array([-3], np.int16), np.array([3], np.int16), 0.0, 0.0, (0, -1, 1, 0)))

    e = np.arange(5, dtype=np.float32)
    g = e.copy()
    g[0], e[0] = -0.0, 0.0
    add(Case("a negative atol: equal bits still match, -0 against 0 does not", g, e, 0.0, -1.0, (0, -1, 1, 0)))

    e = _rng(4).standard_normal(50).astype(np.float32)
    g = -e
    e[9], g[9] = np.inf, 1.0
    add(Case("atol past float32's range: only an infinite reference differs", g, e, 0.0, 1e300, (0, -1, 1, 9)))

    e = _rng(5).standard_normal((4, 8, 3))
    g = e + 1e-9
    add(Case("float64 1e-9 off everywhere", g, e, *F64_TOL, (0, -1, 96, 0)))
    _narrow_cases(add)
    _complex_cases(add)
    _bool_cases(add)
    return cases


CASES = _build()
