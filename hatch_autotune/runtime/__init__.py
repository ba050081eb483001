"""The run-time loader, copied whole into every wheel that hatch-autotune builds.

A built wheel carries this package as ``<module>/_runtime/``, so it must never import
``hatch_autotune``, its modules import each other relatively, and at import time it needs the
standard library alone (cuda-python and numpy are imported at the first launch or device query).
Logic that the build side needs too (expression trees, key -> bucket mapping, arch fallback,
dtype sizes, the table's format, the CUDA error funnel `check_cuda`) lives here, so there is one
copy. One concept per module:

  errors      what the runtime raises; `short_repr` for messages
  record      the base of its immutable records
  values      dtypes, sizes, integer ranges; how an instance's types and constants are named
  expr        expression trees (shapes, grid, block), evaluated within bounds, never eval()
  table       table.json: schema, the one reader and writer, `KernelTable`, `Variant`, `TableEntry`,
              the JSON decoder
  declaration a kernel's declaration as typed records (`KernelDecl`...), their JSON form, its prose
  cuda_seam   every CUDA call: `CudaApi`, `check_cuda`, `GpuState`, `use_gpu` (the tests' seam)
  args        array views, scalars' C values, streams; `PreparedCall`
  selection   key -> bucket, arch fallback, the driver a PTX needs; `KernelSelector`, `Selection`,
              `Binaries`
  checks      a call's arguments bound and checked against the declaration before any GPU call
  params      a kernel instance's parameters laid out once for cuLaunchKernel
  launch      the call path: the fast path, the checked path, loading, the launch
  pins        run-time pins: HATCH_AUTOTUNE_PIN and Kernel.pin() force a default or a named variant
  kernel      `Kernel`: select(), pin(), the call, prepare(), its help() text
  library     `Library`: the wheel's table and binaries, checked against their sha256
  torch_ops   the kernels as PyTorch operators, registered by the generated `torch_ops` module
              alone (never imported here: PyTorch is imported only when that module is)

This module re-exports their public names: the generated module uses `_runtime.Library`, its
stub `_runtime.Selection` and `_runtime.PreparedCall`, and the build side imports from here.
"""

from .args import ArrayView, PreparedCall, array_view, stream_handle
from .cuda_seam import MIN_CUDA_CORE, CudaApi, GpuState, check_cuda, cuda_api, current_device_cc, use_gpu
from .declaration import LAYOUTS, ArgDecl, KernelDecl, KeyDecl, LaunchDecl, TensorMapDecl, stride_name, unit_stride_constant
from .drivers import cuda_version, driver_words, ptx_driver_needed
from .errors import (
    ArrayInterfaceError,
    CudaCallError,
    DriverTooOldError,
    ExpressionError,
    IntegrityError,
    NoDriverError,
    TableError,
    short_repr,
)
from .expr import FUNCTIONS, MAX_EXPR_DEPTH, MAX_INT_BITS, cdiv, compile_expr, tree_names, tree_text
from .kernel import Kernel
from .library import Library
from .pins import PIN_ENV, PinError
from .selection import (
    MAPPINGS,
    MIN_SM,
    Binaries,
    Selection,
    as_compute_capability,
    choose_arch,
    map_to_bucket,
    parse_arch,
)
from .table import (
    MAX_JSON_DEPTH,
    TABLE_FILE,
    TABLE_SCHEMA,
    BinaryRef,
    KernelTable,
    TableEntry,
    Variant,
    load_json,
    parse_table,
    sha256_hex,
    table_bytes,
)
from .values import DTYPE_SIZES, INT_RANGES, MAX_SIZE, TYPESTRS, instance_env, types_key, value_text

__all__ = [
    "DTYPE_SIZES",
    "FUNCTIONS",
    "INT_RANGES",
    "LAYOUTS",
    "MAPPINGS",
    "MAX_EXPR_DEPTH",
    "MAX_INT_BITS",
    "MAX_JSON_DEPTH",
    "MAX_SIZE",
    "MIN_CUDA_CORE",
    "MIN_SM",
    "PIN_ENV",
    "TABLE_FILE",
    "TABLE_SCHEMA",
    "TYPESTRS",
    "ArgDecl",
    "ArrayInterfaceError",
    "ArrayView",
    "Binaries",
    "BinaryRef",
    "CudaApi",
    "CudaCallError",
    "DriverTooOldError",
    "ExpressionError",
    "GpuState",
    "IntegrityError",
    "Kernel",
    "KernelDecl",
    "KernelTable",
    "KeyDecl",
    "LaunchDecl",
    "Library",
    "NoDriverError",
    "PinError",
    "PreparedCall",
    "Selection",
    "TableEntry",
    "TableError",
    "TensorMapDecl",
    "Variant",
    "array_view",
    "as_compute_capability",
    "cdiv",
    "check_cuda",
    "choose_arch",
    "compile_expr",
    "cuda_api",
    "cuda_version",
    "current_device_cc",
    "driver_words",
    "instance_env",
    "load_json",
    "map_to_bucket",
    "parse_arch",
    "parse_table",
    "ptx_driver_needed",
    "sha256_hex",
    "short_repr",
    "stream_handle",
    "stride_name",
    "table_bytes",
    "tree_names",
    "tree_text",
    "types_key",
    "unit_stride_constant",
    "use_gpu",
    "value_text",
]
