"""The wheel's side of a generated module: `Library.load` reads the selection table next to the
module (checked against the sha256 the module pins), builds its kernels, and reads their
binaries, each checked against the sha256 the table records."""

from __future__ import annotations

import os

from .drivers import cuda_version
from .errors import IntegrityError, TableError, short_repr
from .kernel import Kernel
from .pins import EVERY_KERNEL, PIN_ENV, EnvItem, PinError, Pins, check_variant, env_pins, parse_env
from .selection import Binaries, choose_arch
from .table import TABLE_FILE, KernelTable, parse_table, sha256_hex

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping, Sequence
    from typing import Any


class Library(Binaries):
    """The table of a generated module plus the files next to it."""

    def __init__(self, directory: str, table: Mapping[str, Any]):
        self.directory = directory
        self.table = table
        self.module: str = table["module"]
        self.cubin_archs: list[str] = list(table["archs"])
        # table arch -> the PTX arch compiled from that arch's winners
        self.ptx_for: dict[str, str] = dict(table.get("ptx", {}))
        self.provenance: dict[str, Any] = dict(table.get("provenance", {}))
        # binary arch -> the oldest CUDA driver (major, minor) that loads it: a cubin that of the
        # NVRTC major that made it, PTX that of its ISA
        self.floors: dict[str, tuple[int, int]] = {arch: cuda_version(v) for arch, v in table["drivers"].items()}
        self._arch_cache: dict[tuple[tuple[int, int], tuple[int, int] | None], tuple[str, str]] = {}
        self.kernels = {name: Kernel(KernelTable.from_json(name, spec), self) for name, spec in sorted(table["kernels"].items())}
        self._pin_from_env(parse_env(os.environ.get(PIN_ENV)))

    def _pin_from_env(self, items: Sequence[EnvItem]) -> None:
        """HATCH_AUTOTUNE_PIN's items for this module's kernels (pins.py); PinError for one that
        names this module's kernel that does not exist, a bucket it does not declare, or a
        variant it does not ship."""
        for item in items:
            if item.module == self.module and item.kernel != EVERY_KERNEL and item.kernel not in self.kernels:
                raise PinError(
                    f"{PIN_ENV} item {item.text!r}: module {self.module} has no kernel {item.kernel!r}; it has {sorted(self.kernels)}"
                )
        for name, kernel in self.kernels.items():
            selector = kernel._selector
            pins = env_pins(items, self.module, name, selector.key_names, kernel.buckets)
            for pin in pins:
                check_variant(pin.choice, name, kernel.variants, pin.source)
            selector.pins = Pins(name, pins)

    @classmethod
    def load(cls, directory: str, table_sha256: str | None = None) -> Library:
        path = os.path.join(directory, TABLE_FILE)
        with open(path, "rb") as f:
            raw = f.read()
        if table_sha256 is not None and sha256_hex(raw) != table_sha256:
            raise IntegrityError(
                f"{path} does not match the sha256 recorded in the generated module "
                f"(expected {table_sha256}, got {sha256_hex(raw)}); reinstall the package"
            )
        try:
            return cls(directory, parse_table(raw, path))
        except TableError as exc:
            raise IntegrityError(str(exc)) from None
        except PinError:  # the environment's pin, not the table, is wrong
            raise
        except (LookupError, TypeError, ValueError, AttributeError) as exc:
            # parse_table checks the frame; what is inside is read by the constructors, and a
            # table whose sha256 matched but whose content is malformed was built wrong
            raise IntegrityError(
                f"{path}: malformed selection table ({type(exc).__name__}: {short_repr(str(exc), 200)}); rebuild the wheel"
            ) from None

    def binary_for(self, cc: tuple[int, int], driver: tuple[int, int] | None = None) -> tuple[str, str]:
        """(table arch, binary arch) for a compute capability and driver, memoised per device."""
        hit = self._arch_cache.get((cc, driver))
        if hit is None:
            arch, how = choose_arch(cc, self.cubin_archs, sorted(self.ptx_for.values()), driver, self.floors)
            if how == "ptx":
                hit = (next(t for t, p in self.ptx_for.items() if p == arch), arch)
            else:
                hit = (arch, arch)
            hit = self._arch_cache.setdefault((cc, driver), hit)
        return hit

    def read(self, table: KernelTable, variant: str, binary: str) -> bytes:
        info = table.variants[variant].binaries[binary]
        return self.read_checked(info.file, info.sha256)

    def read_checked(self, relpath: str, expected_sha256: str) -> bytes:
        path = os.path.join(self.directory, relpath)
        with open(path, "rb") as f:
            data = f.read()
        if sha256_hex(data) != expected_sha256:
            raise IntegrityError(
                f"{path} does not match its sha256 in {TABLE_FILE} "
                f"(expected {expected_sha256}, got {sha256_hex(data)}); reinstall the package"
            )
        return data
