"""Declaring a plugin op to onnx (so onnx and onnxscript accept it): what each op's
``register_onnx_schema`` shares, once per process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def declare(
    registered: dict[str, Any],
    op: tuple[str, str, int],
    inputs: Sequence[tuple[str, str]],
    outputs: Sequence[tuple[str, str]],
    types: Sequence[tuple[str, list[str], str]],
    attributes: Sequence[tuple[str, int | float | None, str]],
    doc: str | None,
) -> None:
    """Register op (type, domain, version) with its (name, type variable) inputs and outputs,
    its type variables, and its attributes: (name, default, what it means), a default of None
    being a required integer. ``registered["schema"]`` keeps it."""
    if "schema" in registered:
        return
    import onnx
    from onnx import helper
    from onnx.defs import OpSchema

    fp = OpSchema.FormalParameter
    attrs = [
        OpSchema.Attribute(name, OpSchema.AttrType.INT, text)
        if default is None
        else OpSchema.Attribute(name, helper.make_attribute(name, default), text)
        for name, default, text in attributes
    ]
    op_type, domain, version = op
    schema = OpSchema(
        op_type, domain, version, inputs=[fp(n, t) for n, t in inputs],
        outputs=[fp(n, t) for n, t in outputs], type_constraints=list(types), attributes=attrs,
        doc=doc,
    )  # fmt: skip
    if not onnx.defs.has(op_type, domain):
        onnx.defs.register_schema(schema)
    registered["schema"] = schema
