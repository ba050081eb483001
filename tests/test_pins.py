"""Run-time pins (runtime/pins.py): HATCH_AUTOTUNE_PIN and Kernel.pin() force the default config or
a named variant per kernel or bucket, select() says so, calls launch what is pinned (the fast
path's plans are dropped), and every pin that cannot hold is one clear error. Over example_pkg's
generated package (built by the real pipeline for sm_90 from its committed lock) and, for calls,
the driver stand-in."""

from __future__ import annotations

import pytest

EXAMPLE_ARCHS = ("sm_90",)
DEFAULT_SAXPY = {"BLOCK": 256, "VEC": 1, "ITEMS": 1}


def tuned_bucket(kernel, **types):
    """A saxpy bucket whose tuned winner is not the default config (example_pkg's lock has several)."""
    for n in kernel.buckets["n"]:
        sel = kernel.select("sm_90", n=n, **types)
        if sel.tuned and sel.config != DEFAULT_SAXPY:
            return n, sel
    pytest.skip("the lock has no tuned saxpy winner other than the default")


@pytest.fixture
def kernels(rt, fresh, monkeypatch):
    """A fresh Library's kernels, loaded under the environment a test sets first."""
    monkeypatch.delenv(rt.PIN_ENV, raising=False)
    return fresh


def test_the_wheel_ships_each_tuned_buckets_default(rt, kernels):
    saxpy = kernels()["saxpy"]
    table = saxpy._selector.table
    tuned = [(tkey, arch, e) for tkey, arch, e in table.entries() if e.tuned]
    assert tuned
    for _, arch, entry in tuned:
        assert entry.default_variant is not None
        assert dict(table.variants[entry.default_variant].config) == DEFAULT_SAXPY
        assert arch in table.variants[entry.default_variant].binaries
    untuned = [e for *_, e in table.entries() if not e.tuned]
    assert all(e.default_variant is None for e in untuned)  # their own variant is what an untuned build runs


def test_pin_default_then_unpin(rt, kernels):
    saxpy = kernels()["saxpy"]
    n, tuned = tuned_bucket(saxpy, T="float32")
    assert tuned.pinned == ""
    saxpy.pin("default")
    sel = saxpy.select("sm_90", n=n, T="float32")
    assert (sel.config, sel.tuned, sel.pinned) == (DEFAULT_SAXPY, False, "saxpy.pin('default')")
    assert sel.variant != tuned.variant
    saxpy.unpin()
    assert saxpy.select("sm_90", n=n, T="float32") == tuned


def test_pin_one_bucket_to_a_named_variant(rt, kernels):
    saxpy = kernels()["saxpy"]
    n, tuned = tuned_bucket(saxpy, T="float32")
    other = next(b for b in saxpy.buckets["n"] if b != n)
    before = saxpy.select("sm_90", n=other, T="float32")
    saxpy.pin("default")
    default = saxpy.select("sm_90", n=n, T="float32")
    saxpy.unpin()
    saxpy.pin(default.variant, n=other)  # the default's variant, forced on another bucket only
    sel = saxpy.select("sm_90", n=other, T="float32")
    assert (sel.variant, sel.pinned) == (default.variant, f"saxpy.pin('{default.variant}', n={other})")
    assert saxpy.select("sm_90", n=n, T="float32") == tuned  # the other buckets select as before
    assert saxpy.select("sm_90", n=other, T="float16").pinned == ""  # a variant pin holds for its own instance
    saxpy.unpin(n=other)
    assert saxpy.select("sm_90", n=other, T="float32") == before


def test_environment_pins_by_kernel_module_and_bucket(rt, kernels, monkeypatch):
    n, tuned = tuned_bucket(kernels()["saxpy"], T="float32")
    monkeypatch.setenv(rt.PIN_ENV, "default")  # tuned selection off, every kernel
    k = kernels()
    assert k["saxpy"].select("sm_90", n=n, T="float32").config == DEFAULT_SAXPY
    assert k["sgemm"].select("sm_90", m=1024, n=1024, k=1024).pinned == f"{rt.PIN_ENV} default"
    monkeypatch.setenv(rt.PIN_ENV, f"default; saxpy[n={n}]=tuned")  # a bucket's pin before the broader ones
    sel = kernels()["saxpy"].select("sm_90", n=n, T="float32")
    assert (sel.variant, sel.tuned, sel.pinned) == (tuned.variant, True, f"{rt.PIN_ENV} saxpy[n={n}]=tuned")
    monkeypatch.setenv(rt.PIN_ENV, "other_pkg.kernels:saxpy=default")  # another module's kernel
    assert kernels()["saxpy"].select("sm_90", n=n, T="float32") == tuned
    monkeypatch.setenv(rt.PIN_ENV, "example_pkg.kernels:saxpy=default")
    k = kernels()
    assert k["saxpy"].select("sm_90", n=n, T="float32").config == DEFAULT_SAXPY
    k["saxpy"].pin("tuned")  # the program's pin comes before the environment's
    assert k["saxpy"].select("sm_90", n=n, T="float32").variant == tuned.variant


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("saxpy=fastest", r"HATCH_AUTOTUNE_PIN item 'saxpy=fastest': 'fastest' is not a pin; expected 'default'"),
        ("saxpy", r"item 'saxpy' is malformed; expected 'default', 'KERNEL=CHOICE'"),
        ("*=0123456789abcdef", "a variant id pins one kernel"),
        ("saxpy=0123456789abcdef", "kernel 'saxpy' ships no variant '0123456789abcdef'; it ships"),
        ("saxpy[n=1000]=default", r"n=1000 is not a bucket; the buckets of n are \[4096, 262144, 16777216\]"),
        ("saxpy[m=4096]=default", r"bucket item 'm=4096': expected DIM=VALUE, each key dim of \['n'\] once"),
        ("example_pkg.kernels:saxpi=default", r"module example_pkg.kernels has no kernel 'saxpi'; it has \["),
    ],
)
def test_a_bad_environment_pin_is_one_error_at_import(rt, kernels, monkeypatch, value, fragment):
    monkeypatch.setenv(rt.PIN_ENV, value)
    with pytest.raises(rt.PinError, match=fragment):
        kernels()


def test_a_pin_of_another_package_kernel_is_not_an_error(rt, kernels, monkeypatch):
    monkeypatch.setenv(rt.PIN_ENV, "flash_decode=default")  # unqualified: a kernel of some other package
    assert kernels()["saxpy"].select("sm_90", n=4096, T="float32").pinned == ""


def test_bad_program_pins(rt, kernels):
    saxpy = kernels()["saxpy"]
    with pytest.raises(rt.PinError, match=r"saxpy.pin\(\): 'best' is not a pin"):
        saxpy.pin("best")
    with pytest.raises(rt.PinError, match=r"saxpy.pin\(\): kernel 'saxpy' ships no variant 'ffffffffffffffff'"):
        saxpy.pin("ffffffffffffffff")
    with pytest.raises(rt.PinError, match=r"saxpy.pin\(\): n=5 is not a bucket"):
        saxpy.pin("default", n=5)
    with pytest.raises(rt.PinError, match=r"names every key dim \['n'\] once; unknown \['m'\]"):
        saxpy.pin("default", m=4096)
    assert saxpy.select("sm_90", n=4096, T="float32").pinned == ""  # nothing was pinned by the failures


def test_a_variant_pin_for_an_arch_the_variant_does_not_ship(rt, example_site):
    """example_pkg's wheel of every arch: a variant pinned where the wheel ships no binary of it
    for the arch asked (e.g. a wgmma variant of sm_90a, asked for sm_80)."""
    from conftest import imported_kernels

    with imported_kernels(example_site(None), "example_pkg") as k:
        library = k._LIBRARY
        name, vid, arch = next(
            (name, vid, arch)
            for name, kernel in library.kernels.items()
            for vid, v in kernel.variants.items()
            for arch in library.cubin_archs
            if arch not in v.binaries
        )
        kernel = library.kernels[name]
        variant = kernel.variants[vid]
        bucket = {dim: values[0] for dim, values in kernel.buckets.items()}
        kernel.pin(vid)
        with pytest.raises(k._runtime.PinError, match=f"variant {vid} of {name} ships for .*, not for {arch}, which this device runs"):
            kernel.select(arch, **bucket, **variant.types)
        kernel.unpin()
        assert kernel.select(arch, **bucket, **variant.types).pinned == ""


def test_calls_launch_the_pinned_variant_after_fast_calls(rt, fresh, monkeypatch):
    """Two calls record a fast plan; a pin drops it, so the next call launches the default's
    geometry; unpin() brings the tuned one back."""
    from cuda_standin import DeviceArray, install

    monkeypatch.delenv(rt.PIN_ENV, raising=False)
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    n, tuned = tuned_bucket(saxpy, T="float32")
    x, y = DeviceArray.empty(standin, (n,)), DeviceArray.empty(standin, (n,))
    blocks = lambda c: (n + c["BLOCK"] * c["VEC"] * c["ITEMS"] - 1) // (c["BLOCK"] * c["VEC"] * c["ITEMS"])  # noqa: E731
    saxpy(1.0, x, y)
    saxpy(1.0, x, y)
    assert standin.launches[-1].block[0] == tuned.config["BLOCK"] and standin.launches[-1].grid[0] == blocks(tuned.config)
    saxpy.pin("default")
    saxpy(1.0, x, y)
    saxpy(1.0, x, y)
    assert [(launch.block[0], launch.grid[0]) for launch in standin.launches[-2:]] == [(256, blocks(DEFAULT_SAXPY))] * 2
    saxpy.unpin()
    saxpy(1.0, x, y)
    assert standin.launches[-1].grid[0] == blocks(tuned.config)


def test_the_environment_parser_bounds_and_items():
    from hatch_autotune.runtime.pins import MAX_ENV_CHARS, PinError, parse_env

    assert parse_env("") == [] and parse_env(None) == []
    items = parse_env(" default ;gemm=tuned; m.k:sgemm[M=64,N=64,K=64]=0123456789abcdef ;")
    assert [(i.module, i.kernel, i.bucket, i.choice) for i in items] == [
        (None, "*", None, "default"),
        (None, "gemm", None, "tuned"),
        ("m.k", "sgemm", "M=64,N=64,K=64", "0123456789abcdef"),
    ]
    with pytest.raises(PinError, match=f"expected at most {MAX_ENV_CHARS}"):
        parse_env("default;" * MAX_ENV_CHARS)
    with pytest.raises(PinError, match="a bucket pins one kernel"):
        parse_env("*[n=4]=default")


def test_pin_default_on_an_arch_that_inherits_the_plain_archs_winners(rt, example_site):
    """example_pkg's wheel of every arch on a 9.0 GPU runs sm_90a's entries, which inherit sm_90's
    tuned winners (untuned, a fallback): `default` still runs the kernel's default config there."""
    from conftest import imported_kernels

    with imported_kernels(example_site(None), "example_pkg") as k:
        saxpy = k._LIBRARY.kernels["saxpy"]
        table = saxpy._selector.table  # sm_90's own entries: select() on a 9.0 device asks sm_90a's
        n, winner = next(
            (e.bucket[0], e.variant)
            for tkey, arch, e in table.entries()
            if (tkey, arch) == ("T=float32", "sm_90") and e.tuned and dict(table.variants[e.variant].config) != DEFAULT_SAXPY
        )
        inherited = saxpy.select("sm_90a", n=n, T="float32")
        assert (inherited.arch, inherited.tuned, inherited.variant) == ("sm_90a", False, winner)
        saxpy.pin("default")
        sel = saxpy.select("sm_90a", n=n, T="float32")
        assert (sel.arch, sel.config, sel.pinned) == ("sm_90a", DEFAULT_SAXPY, "saxpy.pin('default')")
        assert "sm_90a" in saxpy.variants[sel.variant].binaries
        saxpy.unpin()
