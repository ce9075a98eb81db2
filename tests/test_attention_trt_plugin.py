"""plugins/attention_trt_plugin.py's own Python (what it declares, the kernel variant and launch it
returns), run against a stand-in for the documented surface of ``tensorrt.plugin`` it uses.

TensorRT itself has not run this plugin: no TensorRT with ``tensorrt.plugin`` installs on this
project's machines (docs/design.md, "TensorRT: what ran where"). The kernel it returns is checked
against the op's reference in tests/test_attention_cuda.py.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from edgeomni.plugins import attention_cuda, attention_trt_plugin


class Expr:
    """A symbolic size (a name) or a build-time constant (an int)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    @property
    def is_constant(self) -> bool:
        return isinstance(self.value, int)

    def constant_value(self) -> int:
        assert self.is_constant
        return self.value

    def __repr__(self) -> str:
        return f"Expr({self.value!r})"


class Desc:
    def __init__(self, *shape: Any, dtype: str = "f16") -> None:
        self.shape_expr = [Expr(d) for d in shape]
        self.dtype = dtype

    def like(self) -> tuple:
        return ("like", self)

    def aliased(self) -> tuple:
        return ("aliased", self)


class Launch:
    pass


def stand_in() -> tuple[Any, Any, dict]:
    found: dict[str, Any] = {}

    def deco(kind: str):  # noqa: ANN202
        def named(name: str):  # noqa: ANN202
            def keep(fn):  # noqa: ANN001, ANN202
                found[kind] = (name, fn)
                return fn

            return keep

        return named

    trtp = types.SimpleNamespace(
        register=deco("register"), autotune=deco("autotune"), aot_impl=deco("aot_impl"),
        cdiv=lambda a, b: ("cdiv", a, b), KernelLaunchParams=Launch,
        SymInt32=lambda e: ("i32", e), SymIntExprs=types.SimpleNamespace(from_tuple=tuple),
        AutoTuneCombination=lambda spec, fmt: (spec, fmt), TensorDesc=Desc, SymExprs=tuple,
    )  # fmt: skip
    trt = types.SimpleNamespace(float16="f16", float32="f32")
    return trt, trtp, found


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(attention_trt_plugin, "_registered", set())
    compiled: list[tuple[str, str]] = []
    monkeypatch.setattr(attention_cuda, "compile_ptx",
                        lambda src, arch: compiled.append((src, arch)) or b"PTX")  # fmt: skip
    trt, trtp, found = stand_in()
    attention_trt_plugin.register(trt, trtp, arch="compute_87")
    return {"found": found, "compiled": compiled}


ATTRS = {"num_heads": 16, "kv_num_heads": 2, "scale": 0.0, "window": 0, "causal": 1}


def descs(head: Any = 128, dtype: str = "f16") -> list[Desc]:
    return [Desc("B", "S", 16 * 128, dtype=dtype), Desc("B", "S", 2 * 128, dtype=dtype),
            Desc("B", "S", 2 * 128, dtype=dtype), Desc("B", 2, 4096, head, dtype=dtype),
            Desc("B", 2, 4096, head, dtype=dtype), Desc("B", dtype="i32"), Desc("B", dtype="i32")]  # fmt: skip


def test_declares_out_like_q_and_caches_aliased(plugin: dict) -> None:
    name, desc = plugin["found"]["register"]
    assert name == "edgeomni::CachedAttention"
    ins = descs()
    out, key, value = desc(*ins, **ATTRS)
    assert out == ("like", ins[0]) and key == ("aliased", ins[3]) and value == ("aliased", ins[4])
    _, types_fn = plugin["found"]["autotune"]
    ((spec, fmt),) = types_fn(*ins, **ATTRS, outputs=None)
    assert spec.split(", ") == ["FP16|FP32"] * 5 + ["INT32"] * 2 + ["FP16|FP32"] * 3
    assert fmt == "LINEAR"


def test_aot_returns_the_kernel_for_the_node(plugin: dict) -> None:
    _, aot = plugin["found"]["aot_impl"]
    ins = descs()
    name, ptx, launch, extra = aot(*ins, **ATTRS, outputs=None, tactic=0)
    assert (name, ptx) == (attention_cuda.KERNEL_NAME.encode(), b"PTX")
    ((source, arch),) = plugin["compiled"]
    cfg = attention_cuda.from_node_attributes(ATTRS, 128, "float16")
    assert arch == "compute_87" and source == cfg.source()
    batch, seq, cap = ins[0].shape_expr[0], ins[0].shape_expr[1], ins[3].shape_expr[2]
    assert (launch.grid_x, launch.grid_y, launch.grid_z) == (
        ("cdiv", seq, cfg.warps), 16 // cfg.block_heads, batch)
    assert (launch.block_x, launch.block_y, launch.block_z, launch.shared_mem) == (
        cfg.threads, 1, 1, 0)
    # the kernel's int32 arguments after its seven inputs, as attention_cuda.PARAMS orders them
    assert extra == (("i32", batch), ("i32", seq), ("i32", cap))
    assert attention_cuda.PARAMS[7:10] == ("batch", "seq", "capacity")


def test_aot_refuses_a_dynamic_head_size_and_other_types(plugin: dict) -> None:
    _, aot = plugin["found"]["aot_impl"]
    with pytest.raises(ValueError, match="head size"):
        aot(*descs(head="D"), **ATTRS, outputs=None, tactic=0)
    with pytest.raises(ValueError, match="float16 and float32"):
        aot(*descs(dtype="bf16"), **ATTRS, outputs=None, tactic=0)
