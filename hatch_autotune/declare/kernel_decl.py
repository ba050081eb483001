"""A declared kernel as the runtime's typed declaration (`KernelDecl`): the one conversion from
the build's `KernelSpec`, whose JSON form the selection table ships and the tuning worker reads."""

from __future__ import annotations

from ..runtime import ArgDecl, KernelDecl, KeyDecl, LaunchDecl, TensorMapDecl
from .args import ArgSpec
from .kernel import KernelSpec


def _arg_decl(a: ArgSpec) -> ArgDecl:
    return ArgDecl(
        name=a.name,
        dtype=a.dtype,
        shape=tuple(e.tree for e in a.shape) if a.shape is not None else None,
        intent=a.intent if a.shape is not None else None,
        align=a.align if a.shape is not None else None,
        value=a.value.tree if a.value is not None else None,
        strides=a.strides if a.shape is not None else None,
        optional=a.optional if a.shape is not None else False,
        unit_stride_variants=a.unit_stride_variants,
        tensor_map=None
        if a.tensor_map is None
        else TensorMapDecl(
            array=a.tensor_map.array,
            box=tuple(e.tree for e in a.tensor_map.box),
            swizzle=a.tensor_map.swizzle,
            l2_promotion=a.tensor_map.l2_promotion,
            oob_fill=a.tensor_map.oob_fill,
            when=a.tensor_map.when.tree if a.tensor_map.when is not None else None,
            order=a.tensor_map.order,
        ),
    )


def kernel_decl(spec: KernelSpec) -> KernelDecl:
    """A kernel's declaration as every later stage and the runtime read it."""
    return KernelDecl(
        name=spec.name,
        entry=spec.entry,
        doc=spec.doc,
        args=tuple(_arg_decl(a) for a in spec.args),
        key=tuple(KeyDecl(name=k.name, source=k.source, axis=k.axis, buckets=tuple(k.buckets), mapping=k.mapping) for k in spec.key),
        type_params={tp: tuple(values) for tp, values in spec.types.items()},
        constants={c: tuple(values) for c, values in spec.constants.items()},
        launch=LaunchDecl(
            grid=tuple(e.tree for e in spec.grid),
            block=tuple(e.tree for e in spec.block),
            shared=spec.shared.tree,
            cluster=None if spec.cluster is None else tuple(e.tree for e in spec.cluster),
        ),
        dims=dict(spec.dims),
        key_constraints=tuple(c.tree for _, c in spec.point_constraints if any(k.name in c.names for k in spec.key)),
    )
