"""A kernel's `inputs` and `reference` hooks (functions of the project, named "module:function"),
run for real: imported from the project root (and src/), called with a bucket's key, types and a
seeded generator, their results checked; every way a hook can be wrong is one clear error that
names the kernel, the hook and what was expected. Then the whole way through `tune()`: the user's
inputs and reference reach the worker's setup message (fake worker), and the real worker (over the
driver stand-in) verifies variants against the user's reference, not against the default config."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import load_project, tune_over_fake_worker, tune_over_standin, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.errors import BuildError
from hatch_autotune.tuning import tune
from hatch_autotune.tuning.inputs import InputError, InputRecipe, bucket_inputs, random_inputs, reference_outputs, resolved_dtype
from hatch_autotune.tuning.worker_client import WorkerClient

HERE = Path(__file__).parent

# A kernel with everything a hook has to match: a type parameter, a caller-passed float scalar,
# an integer scalar that is the key dim, an input and an output array, and a computed scalar.
AXPB_TABLE = """\
[tool.hatch.build.targets.wheel.hooks.autotune]
module = "hookpkg.kernels"
archs = ["sm_90"]

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.axpb]
template = "axpb.cu.j2"
types = {{ T = ["float32", "float64"] }}
args = [
  {{ name = "alpha", dtype = "float32" }},
  {{ name = "x", dtype = "T", shape = ["n"], intent = "in" }},
  {{ name = "y", dtype = "T", shape = ["n"], intent = "out" }},
  {{ name = "n", dtype = "int32" }},
  {{ name = "twice", dtype = "int32", value = "2 * n" }},
]
key = {{ n = {{ from = "n", buckets = [256, 4096] }} }}
space = {{ BLOCK = [128, 256] }}
default = {{ BLOCK = 128 }}
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
{hooks}
"""

AXPB_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(float alpha, const {{ T }}* x, {{ T }}* y, int n, int twice)
{
    int i = blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i < n) y[i] = alpha * x[i] + 1;
}
"""

GOOD_HOOKS = """\
import numpy as np

CALLS = []


def make_inputs(key, types, rng):
    CALLS.append((dict(key), dict(types)))
    n, dtype = key["n"], types["T"]
    return {
        "alpha": 0.5,
        "x": (np.arange(n) % 7 + 1).astype(dtype),
        "y": np.full(n, -1, dtype=dtype),
        "n": n,
    }


def expected(alpha, x, y, n):
    y[:] = alpha * x + 1  # may write into its own copy of y
    return y
"""


def write_axpb_project(root: Path, hooks_module: str | None = GOOD_HOOKS, *, module_dir: str = "", **refs: str) -> Path:
    """The axpb project; `refs` become kernel keys (inputs=..., reference=...); the hooks module
    is written as hooks_<root name>.py (unique: Python caches imported modules by name)."""
    root.mkdir(parents=True)
    (root / "axpb.cu.j2").write_text(AXPB_TEMPLATE)
    hooks = "\n".join(f'{k} = "{v}"' for k, v in refs.items())
    (root / "pyproject.toml").write_text(AXPB_TABLE.format(hooks=hooks))
    if hooks_module is not None:
        where = root / module_dir
        where.mkdir(parents=True, exist_ok=True)
        (where / f"hooks_{root.name}.py").write_text(hooks_module)
    return root


@pytest.fixture(autouse=True)
def isolated_imports(tmp_path):
    """Hooks are imported into this process with their project on sys.path: undo both (only
    the projects' own modules are forgotten; a library imported meanwhile stays imported)."""
    path = list(sys.path)
    yield
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def spec_of(root: Path):
    return load_project(root).kernels["axpb"]


KEY, TYPES = {"n": 256}, {"T": "float64"}


# ---- the hooks run ----------------------------------------------------------------------------


def test_user_inputs_and_reference_run_with_the_bucket(tmp_path):
    root = write_axpb_project(tmp_path / "good", inputs="hooks_good:make_inputs", reference="hooks_good:expected")
    spec = spec_of(root)
    inputs = bucket_inputs(spec, TYPES, KEY, root, seed=3)
    assert sys.modules["hooks_good"].CALLS == [({"n": 256}, {"T": "float64"})]  # called once, with key and types
    assert sorted(inputs) == ["alpha", "n", "x", "y"]  # `twice` is computed from the key, not generated
    assert inputs["x"].dtype == np.float64 and inputs["x"].shape == (256,) and inputs["x"][:3].tolist() == [1, 2, 3]
    assert inputs["alpha"] == 0.5 and inputs["n"] == 256

    ref = reference_outputs(spec, inputs, root, TYPES)
    assert list(ref) == ["y"]  # one array returned -> the kernel's one output
    np.testing.assert_array_equal(ref["y"], 0.5 * inputs["x"] + 1)
    assert (inputs["y"] == -1).all()  # the reference got copies: the inputs are unchanged


def test_hooks_import_from_src_and_get_a_seeded_generator(tmp_path):
    module = textwrap.dedent(
        """\
        import numpy as np

        def make_inputs(key, types, rng):
            n = key["n"]
            return {"alpha": float(rng.uniform()), "x": rng.standard_normal(n).astype(types["T"]),
                    "y": np.zeros(n, types["T"]), "n": n}

        def expected(alpha, x, y, n):
            return {"y": (alpha * x + 1).astype(np.float64)}
        """
    )
    root = write_axpb_project(tmp_path / "srcl", module, module_dir="src", inputs="hooks_srcl:make_inputs", reference="hooks_srcl:expected")
    spec = spec_of(root)
    types = {"T": "float32"}
    a, b = bucket_inputs(spec, types, {"n": 4096}, root, seed=1), bucket_inputs(spec, types, {"n": 4096}, root, seed=1)
    c = bucket_inputs(spec, types, {"n": 4096}, root, seed=2)
    np.testing.assert_array_equal(a["x"], b["x"])  # the same seed: the same inputs
    assert not np.array_equal(a["x"], c["x"])
    ref = reference_outputs(spec, a, root, types)
    assert ref["y"].dtype == np.float64  # a float64 reference for a float32 output is accepted as is


def test_big_random_arrays_are_drawn_in_parallel_blocks_and_the_same_whatever_the_threads(monkeypatch):
    from hatch_autotune.tuning import inputs as inputs_mod

    shape = (5, inputs_mod.RANDOM_BLOCK // 2 + 5)  # two blocks and a half
    monkeypatch.setattr(inputs_mod.os, "cpu_count", lambda: 1)
    one = inputs_mod._random_array(shape, "float16", (7, 1))
    monkeypatch.setattr(inputs_mod.os, "cpu_count", lambda: 4)
    four = inputs_mod._random_array(shape, "float16", (7, 1))
    np.testing.assert_array_equal(one, four)
    assert one.shape == shape and one.dtype == np.float16 and np.all(one != 0)  # float16 rounding to 0 is caught too
    blocks = one.reshape(-1)[: 2 * inputs_mod.RANDOM_BLOCK].reshape(2, -1)
    assert not np.array_equal(blocks[0], blocks[1])  # each block its own seed
    assert not np.array_equal(one, inputs_mod._random_array(shape, "float16", (7, 2)))
    ints = inputs_mod._random_array((1000,), "int32", (7, 1))
    assert ints.dtype == np.int32 and ints.min() >= 1 and ints.max() < 100


def test_without_hooks_inputs_are_random_and_there_is_no_reference(tmp_path):
    root = write_axpb_project(tmp_path / "none", None)
    spec = spec_of(root)
    inputs = bucket_inputs(spec, {"T": "float32"}, {"n": 4096}, root, seed=5)
    assert sorted(inputs) == ["alpha", "n", "x", "y"] and inputs["n"] == 4096  # the key dim's scalar is the bucket
    assert inputs["x"].dtype == np.float32 and inputs["x"].shape == (4096,) and np.all(inputs["x"] != 0)
    assert 0.5 < inputs["x"].std() < 2  # ~ N(0, 1)
    # an output-only array is poisoned by the worker before every run: zeros of its dtype and shape
    assert inputs["y"].dtype == np.float32 and inputs["y"].shape == (4096,) and not inputs["y"].any()
    wide = bucket_inputs(spec, {"T": "float64"}, {"n": 4096}, root, seed=5)
    assert wide["x"].dtype == np.float64 and np.all(wide["x"] != 0) and wide["y"].dtype == np.float64
    assert isinstance(inputs["alpha"], float) and inputs["alpha"] != 0
    np.testing.assert_array_equal(inputs["x"], random_inputs(spec, {"T": "float32"}, {"n": 4096}, seed=5)["x"])
    assert reference_outputs(spec, inputs, root, {"T": "float32"}) is None
    assert resolved_dtype("T", {"T": "float16"}) == "float16" and resolved_dtype("int32", {"T": "float16"}) == "int32"


# ---- and every way they can be wrong ----------------------------------------------------------


BROKEN_INPUTS = {
    # function body -> what the message must say (after the kernel and the hook)
    "return [1, 2]": "returned a list; expected a dict with the arguments ['alpha', 'x', 'y', 'n']",
    "return {'alpha': 1.0, 'x': x, 'n': n}": "missing ['y']",
    "return {'alpha': 1.0, 'x': x, 'y': x.copy(), 'n': n, 'twice': 2 * n}": "unknown ['twice']; expected ['alpha', 'x', 'y', 'n'] (twice computed from the key, not passed)",
    "return {'alpha': 1.0, 'x': x.astype('float32'), 'y': x.copy(), 'n': n}": "argument 'x' must be a float64 array of shape (256,), got a float32 array of shape (256,)",
    "return {'alpha': 1.0, 'x': x[:-1], 'y': x.copy(), 'n': n}": "argument 'x' must be a float64 array of shape (256,), got a float64 array of shape (255,)",
    "return {'alpha': 1.0, 'x': x.tolist(), 'y': x.copy(), 'n': n}": "argument 'x' must be a float64 array of shape (256,), got a list",
    "return {'alpha': 'fast', 'x': x, 'y': x.copy(), 'n': n}": "argument 'alpha' must be a number (float32), got 'fast'",
    "return {'alpha': 1.0, 'x': x, 'y': x.copy(), 'n': 2.5}": "argument 'n' must be an integer (int32), got 2.5",
    "return {'alpha': 1.0, 'x': x, 'y': x.copy(), 'n': 100}": "argument 'n' is the key dim 'n' and must be 256 in this bucket, got 100",
    "return {'alpha': 1.0, 'x': x, 'y': x.copy(), 'n': n // 0}": "raised ZeroDivisionError: integer division or modulo by zero (",
}


@pytest.mark.parametrize("body", list(BROKEN_INPUTS))
def test_a_wrong_inputs_hook_is_a_clear_error(tmp_path, body):
    module = f"import numpy as np\n\ndef make(key, types, rng):\n    n = key['n']\n    x = np.ones(n, types['T'])\n    {body}\n"
    root = write_axpb_project(tmp_path / "bad", module, inputs="hooks_bad:make")
    with pytest.raises(InputError) as info:
        bucket_inputs(spec_of(root), TYPES, KEY, root)
    message = str(info.value)
    assert message.startswith("kernel 'axpb': inputs = 'hooks_bad:make' (n=256, T=float64): "), message
    assert BROKEN_INPUTS[body] in message, message
    assert isinstance(info.value, BuildError)  # reported by the build and the command as one line
    if "raised" in message:
        assert "hooks_bad.py:6)" in message  # where, in the user's file


BROKEN_REFERENCES = {
    "return {'z': x}": "returned outputs ['z']; expected {'y': array} or one array",
    "return {'y': x, 'x': x}": "returned outputs ['x', 'y']; expected {'y': array} or one array",
    "return None": "returned a NoneType; expected {'y': array} or one array",
    "return x[:10]": "output 'y' must be a real numeric array of shape (256,), got float64 array of shape (10,)",
    "return {'y': x.astype(complex)}": "output 'y' must be a real numeric array of shape (256,), got complex128 array of shape (256,)",
    "return {'y': np.array(['a'] * 256)}": "output 'y' must be a real numeric array of shape (256,), got <U1 array of shape (256,)",
    "raise KeyError('beta')": "raised KeyError: 'beta' (",
}


@pytest.mark.parametrize("body", list(BROKEN_REFERENCES))
def test_a_wrong_reference_hook_is_a_clear_error(tmp_path, body):
    module = f"import numpy as np\n\ndef ref(alpha, x, y, n):\n    {body}\n"
    root = write_axpb_project(tmp_path / "badref", module, reference="hooks_badref:ref")
    spec = spec_of(root)
    inputs = bucket_inputs(spec, TYPES, KEY, root)  # random ones
    with pytest.raises(InputError) as info:
        reference_outputs(spec, inputs, root, TYPES)
    message = str(info.value)
    assert message.startswith("kernel 'axpb': reference = 'hooks_badref:ref': "), message
    assert BROKEN_REFERENCES[body] in message, message


@pytest.mark.parametrize(
    "module,ref,fragment",
    [
        (None, "hooks_missing:make", "no module named 'hooks_missing' (looked in "),
        ("import numpy as np\n", "hooks_nofn:make", "module 'hooks_nofn' ("),
        ("make = 42\n", "hooks_notfn:make", "hooks_notfn.make is a int, not a function"),
        (
            "import not_a_module_anywhere\n",
            "hooks_dep:make",
            "importing module 'hooks_dep' failed: ModuleNotFoundError: No module named 'not_a_module_anywhere'",
        ),
        ("def make(:\n", "hooks_syntax:make", "importing module 'hooks_syntax' failed: SyntaxError: "),
        ("1 / 0\n", "hooks_boom:make", "importing module 'hooks_boom' failed: ZeroDivisionError: division by zero ("),
    ],
)
@pytest.mark.parametrize("which", ["inputs", "reference"])
def test_a_hook_that_cannot_be_loaded_is_a_clear_error(tmp_path, module, ref, fragment, which):
    name = ref.partition(":")[0].removeprefix("hooks_")
    root = write_axpb_project(tmp_path / name, module, **{which: ref})
    spec = spec_of(root)
    with pytest.raises(InputError) as info:
        if which == "inputs":
            bucket_inputs(spec, TYPES, KEY, root)
        else:
            reference_outputs(spec, random_inputs(spec, TYPES, KEY, 0), root, TYPES)
    message = str(info.value)
    assert message.startswith(f"kernel 'axpb': {which} = {ref!r}"), message
    assert fragment in message, message
    if "no function" in fragment or fragment.startswith("module "):
        assert "has no function 'make'" in message
    if "SyntaxError" in fragment:
        assert "hooks_syntax.py:1)" in message


# ---- the whole way: tune() with the user's hooks ------------------------------------------------

EMULATED_TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:MODE=ok;FACTOR={{ FACTOR }};BLOCK={{ BLOCK }}";
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i];
}
"""

# The user's reference says y = 3x: only FACTOR=3 is right, although the default is FACTOR=2 (which
# is what variants would be checked against without a reference).
SCALE_HOOKS = """\
import numpy as np


def make_inputs(key, types, rng):
    n = key["n"]
    return {"x": np.linspace(1, 2, n, dtype=np.float32), "y": np.zeros(n, np.float32)}


def triple(x, y):
    return {"y": 3 * x}
"""


def scale_project_with_hooks(tmp_path: Path, name: str) -> Path:
    root = write_tiny_project(tmp_path / name, template=EMULATED_TEMPLATE)
    (root / f"{name}_hooks.py").write_text(SCALE_HOOKS)
    text = (root / "pyproject.toml").read_text().replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace(", BAD = [false] }", " }").replace(", BAD = false }", " }")
    (root / "pyproject.toml").write_text(text + f'inputs = "{name}_hooks:make_inputs"\nreference = "{name}_hooks:triple"\n')
    return root


class RecordingClient(WorkerClient):
    """A worker client that keeps, for each setup message, the inputs and reference its recipe
    makes (what the worker makes from it: no array travels in the message)."""

    def __init__(self, seen: list, **kw):
        super().__init__(**kw)
        self.seen = seen

    def request(self, message, timeout):
        if message["op"] == "setup":
            recipe = InputRecipe.from_json(json.loads(json.dumps(message["inputs"])))
            inputs = recipe.make()
            self.seen.append((message, inputs, recipe.reference_outputs(inputs)))
        return super().request(message, timeout)


def test_the_user_reference_reaches_the_workers_setup(tmp_path):
    root = scale_project_with_hooks(tmp_path, "fake")
    seen: list = []
    fake = [sys.executable, str(HERE / "fake_worker.py")]
    summary = tune(
        load_project(root),
        log=lambda m: None,
        gpu_arch="sm_90",
        cache=CompileCache(tmp_path / "cache"),
        client_factory=lambda device: RecordingClient(seen, command=fake, env={**os.environ, "FAKE_WORKER": "{}"}),
    )
    assert len(summary.tuned) == 1 and len(seen) == 1
    message, inputs, reference = seen[0]
    x = np.linspace(1, 2, 5000, dtype=np.float32)
    np.testing.assert_array_equal(inputs["x"], x)  # the user's inputs, not random ones
    assert set(reference) == {"y"}
    np.testing.assert_array_equal(reference["y"], 3 * x)  # the user's reference
    assert message["key"] == {"n": 5000} and all(
        isinstance(v, (str, int, float, bool, list, dict, type(None))) for v in message["inputs"].values()
    )
    # with a user reference, no variant is run as the reference
    (entry,) = json.loads((root / "autotune.lock.json").read_text())["entries"].values()
    assert entry["tuned"] and len(entry["measurements"]) == 6
    assert not any("reference (no user reference" in m.get("reason", "") for m in entry["measurements"])


def test_the_real_worker_verifies_against_the_user_reference(tmp_path):
    root = scale_project_with_hooks(tmp_path, "real")
    summary = tune_over_standin(root, tmp_path / "cache")
    assert len(summary.tuned) == 1
    (entry,) = json.loads((root / "autotune.lock.json").read_text())["entries"].values()
    by = {(m["config"]["FACTOR"], m["config"]["BLOCK"]): m for m in entry["measurements"]}
    for block in (64, 128, 256):
        assert by[(2, block)]["status"] == "rejected" and "wrong result" in by[(2, block)]["reason"], by[(2, block)]
        assert by[(3, block)]["status"] in ("ok", "eliminated"), by[(3, block)]
    assert entry["tuned"] and entry["config"]["FACTOR"] == 3  # not the default's FACTOR=2


def test_a_broken_hook_stops_tune_with_its_message(tmp_path):
    root = scale_project_with_hooks(tmp_path, "stop")
    (root / "stop_hooks.py").write_text(SCALE_HOOKS.replace('"y": np.zeros(n, np.float32)', '"y": np.zeros(n + 1, np.float32)'))
    with pytest.raises(
        BuildError,
        match=r"kernel 'scale': inputs = 'stop_hooks:make_inputs' \(n=5000\): argument 'y' must be a float32 array of shape \(5000,\), got a float32 array of shape \(5001,\)",
    ):
        tune_over_fake_worker(root, tmp_path / "cache")
    assert not (root / "autotune.lock.json").exists()
