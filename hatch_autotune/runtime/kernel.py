"""A kernel of a generated module, as its callers see it: `select()` (selection.py's
`KernelSelector`), the call and `prepare()` (launch.py's `Launcher`, checks.py's `CallChecks`),
and its declaration, help() text and signature (declaration.py). `Binaries` (selection.py) is
what finds its compiled code: the wheel's `Library`, or the tuning worker's own."""

from __future__ import annotations

from .checks import CallChecks
from .launch import Launcher
from .pins import Pin, bucket_of, check_choice, check_variant
from .selection import KernelSelector

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping
    from typing import Any

    from .args import PreparedCall
    from .declaration import KernelDecl
    from .selection import Binaries, Selection
    from .table import KernelTable, Variant


class Kernel(Launcher):
    """One kernel of a generated module: `select()` to see the choice, call it to launch.

    `binaries` finds its compiled code: the wheel's Library, or the tuning worker's own."""

    def __init__(self, table: KernelTable, binaries: Binaries):
        selector = KernelSelector(table, binaries)
        checks = CallChecks(selector)
        super().__init__(selector, checks)
        self.declaration: KernelDecl = table.decl
        self.doc = table.decl.doc
        self.user_args: tuple[str, ...] = checks.user_args
        self.type_params: Mapping[str, tuple[str, ...]] = table.decl.type_params
        self.constants: Mapping[str, tuple[Any, ...]] = table.decl.constants  # declared order: the keywords' order
        self.variants: Mapping[str, Variant] = table.variants
        self.__doc__ = table.decl.call_doc()

    # ---- introspection ----------------------------------------------------------------------

    @property
    def buckets(self) -> dict[str, list[int]]:
        return self._selector.buckets

    @property
    def provenance(self) -> dict[str, Any]:
        """Per (types, arch, bucket): the variant, tuned or default, and where it was tuned."""
        return self._selector.provenance

    def __repr__(self) -> str:
        return f"<hatch-autotune kernel {self.name}({', '.join(self.user_args)}) key=({', '.join(self._selector.key_names)})>"

    @property
    def __signature__(self) -> Any:
        """So that help() and inspect.signature() show the real call: the arguments, then stream=."""
        import inspect

        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.user_args]
        for c, values in self.declaration.call_constants.items():  # layout constants are not passed
            default = values[0] if len(values) == 1 else inspect.Parameter.empty
            params.append(inspect.Parameter(c, inspect.Parameter.KEYWORD_ONLY, default=default))
        params.append(inspect.Parameter("stream", inspect.Parameter.KEYWORD_ONLY, default=None))
        return inspect.Signature(params)

    # ---- selection and checks, without the GPU ----------------------------------------------

    def select(self, arch: Any = None, *extra: Any, **key: Any) -> Selection:
        """Choose the variant for key dims (and type parameters and constants) on a device arch.

        ``arch`` is 'sm_86', '8.6', 86 or (8, 6); None asks the current CUDA device.
        """
        return self._selector.select(arch, extra, key)

    def pin(self, choice: str, **bucket: int) -> None:
        """Run `choice` instead of the tuned selection, until `unpin()`: 'default' (the kernel's
        default config, or where it may not run at a bucket its replacement), a variant id the wheel ships (select().variant names one; it
        holds for its own type instance), or 'tuned' (the wheel's choice, over an environment
        pin). Every bucket, or only the bucket given by its key dims (M=64, N=4096, ...).
        Pins of the program come before those of HATCH_AUTOTUNE_PIN (runtime/pins.py)."""
        where = f"{self.name}.pin()"
        choice = check_choice(choice, where)
        check_variant(choice, self.name, self.variants, where)
        at = bucket_of(bucket, self._selector.key_names, self.buckets, where) if bucket else None
        sizes = "".join(f", {n}={v}" for n, v in bucket.items())
        self._selector.pins.program[at] = Pin(choice, at, f"{self.name}.pin({choice!r}{sizes})")
        self._forget_plans()

    def unpin(self, **bucket: int) -> None:
        """Drop the program's pins of this kernel (those of the environment stay; pin('tuned')
        overrides them), or only the pin of the bucket given by its key dims."""
        if bucket:
            self._selector.pins.program.pop(bucket_of(bucket, self._selector.key_names, self.buckets, f"{self.name}.unpin()"), None)
        else:
            self._selector.pins.program.clear()
        self._forget_plans()

    def binary(self, selection: Selection) -> bytes:
        """The cubin (or PTX) bytes of a selection (a Library checks them against their sha256)."""
        return self._selector.binary(selection)

    def prepare(self, *args: Any, **kwargs: Any) -> PreparedCall:
        """Check and convert a call's arguments (and constants) without touching the GPU."""
        constants = self.checks.take_constants(kwargs)
        return self.checks.prepare(self.checks.bind(args, kwargs), -1, constants)
