"""CUDA C kernel for edgeomni::CachedAttention, compiled by NVRTC through cuda-python.

The fused backend's attention (runtime/fused_engine.py). Everything the op's attributes say
(head counts, head size, scale, window, causal, the float type) is baked into the generated
source as ``#define``s, and a launch takes pointers plus the int32 sizes B, S and C.

One kernel serves prefill, chunked prefill and decode, with per-row lengths (plugins/attention.py
is the specification; its ``reference`` is the numpy meaning):

- Grid ``(ceil(S / WARPS), num_heads / HB, B)``, ``32 * WARPS`` threads. A block takes up to
  WARPS query positions of one row and HB query heads of one kv head (HB divides the GQA group,
  so a key row read once serves HB heads). Positions are split among the warps; when the block
  has fewer positions than warps (decode: one), the spare warps split that position's keys
  (powers of two), and their partial softmax states are merged in shared memory, in a fixed
  order (deterministic).
- Each warp runs an online softmax (float32, exp2 with the scale folded into q) over chunks of
  32 keys: each lane dots one key with the HB queries (held in shared memory, as float), then
  the lanes turn to the values, each accumulating a slice of the head dimension.
- Keys below a row's ``past_lens`` are read from the cache; the new tokens' keys and values are
  read from the ``k``/``v`` inputs directly, never from the cache slots this launch writes. Those
  slots (``past + i`` for ``i < query_lens``) are written by exactly one block each (head slice
  0 of the block whose positions hold token ``i``) with a bit-exact copy, so no block reads what
  another writes, and every other cache slot is left as it was.
- ``out`` is written in full: positions at or past a row's ``query_lens`` (and whole idle rows)
  get zeros. Lengths outside the op's contract are clamped so that nothing is written out of
  bounds (``past`` to [0, C], new tokens to [0, min(S, C - past)]).

Kernel parameters (tensor inputs, integer sizes, tensor outputs): ``q, k, v, past_key, past_value, past_lens, query_lens, B, S, C, out, present_key,
present_value``. ``present_*`` must be the same buffers as ``past_*`` (the op's in-place
contract): the kernel writes only the new slots.

No torch, CuPy or Triton: ``cuda.bindings.nvrtc`` compiles, ``cuda.bindings.driver`` loads and
launches (``CudaAttention``, for tests and benchmarks; plugins/cuda_driver.py, re-exported here).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgeomni.plugins.attention_source import BODY, ROPE_SOURCE  # the kernel's CUDA C
from edgeomni.plugins.cuda_driver import (  # noqa: F401 (re-exported: callers use ac.*)
    KernelError,
    _driver,
    _nvrtc,
    check,
    compile_cubin,
    compile_ptx,
    launch_kernel,
    stream_handle,
)

KERNEL_NAME = "edgeomni_cached_attention"
DTYPES = {"float16": 2, "float32": 4}
# the kernel's parameters, in order (see the module docstring)
PARAMS = ("q", "k", "v", "past_key", "past_value", "past_lens", "query_lens",
          "batch", "seq", "capacity", "out", "present_key", "present_value")  # fmt: skip
_STATIC_SHARED_LIMIT = 48 * 1024  # static shared memory needs no opt-in attribute up to this
_LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class KernelConfig:
    """Everything baked into one compiled kernel: the op's attributes, the float type, and two
    tuning knobs. ``heads_per_block`` (0: ``default_heads_per_block``) trades key reuse (a key
    row read once per HB heads) against the number of blocks, which a decode call at small
    batch needs to fill the GPU; ``warps`` is positions per block and key splits per position."""

    num_heads: int
    kv_num_heads: int
    head_dim: int
    dtype: str = "float16"
    scale: float = 0.0
    window: int = 0
    causal: int = 1
    heads_per_block: int = 0
    warps: int = 8
    # decode calls (seq 1) take q, k and v as the decoder's qkv projection (float32) and do
    # plugins/decoder_cuda.py's qk_rope themselves (edgeomni's fused backend; not the op's)
    fused_qk: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: the kernel has {', '.join(DTYPES)}")
        if self.num_heads <= 0 or self.kv_num_heads <= 0 or self.num_heads % self.kv_num_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a positive multiple of kv_num_heads "
                f"{self.kv_num_heads}"
            )
        if self.head_dim <= 0 or self.head_dim % 2 and self.dtype == "float16":
            raise ValueError(f"head_dim {self.head_dim}: float16 needs an even head size")
        if self.window < 0 or (self.window and not self.causal):
            raise ValueError("a sliding window needs causal attention (causal=0 takes window=0)")
        if self.causal not in (0, 1):
            raise ValueError(f"causal must be 0 or 1, not {self.causal}")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"warps {self.warps}: one of 1, 2, 4, 8, 16")
        if self.fused_qk not in (0, 1) or (self.fused_qk and self.head_dim % 2):
            raise ValueError(f"fused_qk {self.fused_qk}: 0, or 1 with an even head size")
        hb = self.block_heads
        if hb <= 0 or self.group % hb or hb & (hb - 1) or hb > 8:
            raise ValueError(
                f"heads_per_block {hb} must be a power of two up to 8 dividing the group "
                f"({self.group} query heads per kv head)"
            )
        if self.shared_bytes > _STATIC_SHARED_LIMIT:
            raise ValueError(
                f"{self.shared_bytes} bytes of shared memory per block (limit "
                f"{_STATIC_SHARED_LIMIT}): use fewer warps or heads per block"
            )

    @property
    def group(self) -> int:
        return self.num_heads // self.kv_num_heads

    @property
    def block_heads(self) -> int:
        return self.heads_per_block or default_heads_per_block(self.group)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def vector_bytes(self) -> int:
        """Bytes per load: 16 where the head size allows, down to one element."""
        row = self.head_dim * self.itemsize
        width = 16
        while row % width:
            width //= 2
        return max(width, self.itemsize)

    @property
    def shared_bytes(self) -> int:
        """Static shared memory: per warp its queries (float) and one chunk's probabilities;
        after the key loop the same memory holds the split merge's partial states."""
        hb, d, w = self.block_heads, self.head_dim, self.warps
        main = w * hb * (d + 32) + (w * d if self.fused_qk else 0)  # fused: a row a warp staged
        merge = max(w // 2, 1) * hb * (d + 2)
        return 4 * max(main, merge)

    def source(self) -> str:
        return _source(self)

    def launch_params(
        self, batch: int, seq: int, capacity: int | None = None
    ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """(grid, block, dynamic shared memory) for a call on [B, S] queries and a cache of C
        slots. The capacity does not change the grid; it is a parameter so that callers need
        not know that. Shared memory is static (``shared_bytes``)."""
        del capacity
        return ((-(-seq // self.warps), self.num_heads // self.block_heads, batch),
                (32 * self.warps, 1, 1), 0)  # fmt: skip


def default_heads_per_block(group: int) -> int:
    """Up to 4 query heads per block: a key row read once serves 4 heads, and a decode call
    still has ``B * num_heads / 4`` blocks (8 at batch 1 for 32 heads). More (8) suits large
    decode batches, fewer (1-2) batch 1 on a big GPU; bench/attention_kernels_gpu.py measures."""
    hb = 1
    while hb * 2 <= min(group, 4) and group % (hb * 2) == 0:
        hb *= 2
    return hb


def kernel_source(
    *,
    num_heads: int,
    kv_num_heads: int,
    head_dim: int,
    scale: float = 0.0,
    window: int = 0,
    causal: int = 1,
    dtype: str = "float16",
    heads_per_block: int = 0,
    warps: int = 8,
) -> str:
    """The CUDA C source of one kernel variant (entry ``KERNEL_NAME``), attributes baked in."""
    return KernelConfig(
        num_heads, kv_num_heads, head_dim, dtype, scale, window, causal, heads_per_block, warps
    ).source()


# ---------------------------------------------------------------------------------------------
# the CUDA C source
# ---------------------------------------------------------------------------------------------
def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _defines(cfg: KernelConfig) -> dict[str, Any]:
    elems = cfg.vector_bytes // cfg.itemsize  # elements per vector load
    nvec = cfg.head_dim // elems  # vectors per head row
    lanes_per_row = min(32, _pow2_at_least(nvec))  # lanes sharing one value row
    vecs_per_lane = -(-nvec // lanes_per_row)
    regs_per_value_chunk = lanes_per_row * vecs_per_lane * cfg.vector_bytes // 4
    scale = cfg.scale or 1.0 / math.sqrt(cfg.head_dim)
    return {
        "NUM_HEADS": cfg.num_heads,
        "KV_HEADS": cfg.kv_num_heads,
        "HEAD_DIM": cfg.head_dim,
        "GROUP": cfg.group,
        "HB": cfg.block_heads,
        "SLICES": cfg.group // cfg.block_heads,
        "WARPS": cfg.warps,
        "THREADS": cfg.threads,
        "IS_HALF": int(cfg.dtype == "float16"),
        "CAUSAL": cfg.causal,
        "WINDOW": cfg.window,
        # q * scale * log2(e): the softmax runs on exp2
        "SCALE_LOG2": f"{float(scale * _LOG2E).hex()}f",
        "VEC_BYTES": cfg.vector_bytes,
        "VL": elems,
        "NV": nvec,
        "LPR": lanes_per_row,
        "KPS": 32 // lanes_per_row,
        "VPL": vecs_per_lane,
        "PREFETCH_V": int(regs_per_value_chunk <= 64),
        "SMEM_FLOATS": cfg.shared_bytes // 4,
        "FUSED_QK": cfg.fused_qk,
        "STAGE_AT": cfg.warps * cfg.block_heads * (cfg.head_dim + 32),  # fused: staged rows
    }


def _source(cfg: KernelConfig) -> str:
    head = (
        f"// {KERNEL_NAME}: edgeomni::CachedAttention, generated by edgeomni.plugins.attention_cuda\n"
        f"// {cfg}\n"
    )
    lines = [f"#define {k} {v}" for k, v in _defines(cfg).items()]
    body = BODY.replace("// ROPE_SOURCE\n", ROPE_SOURCE if cfg.fused_qk else "")
    return head + "\n".join(lines) + f"\n#define KERNEL_NAME {KERNEL_NAME}\n" + body


@dataclass(frozen=True)
class FusedQK:
    """A fused_qk call's inputs (device pointers as ints, 0 for none): the qkv projection
    [batch, heads + 2 kv heads, D] (float32), positions [axes, batch], the q/k norms' weights,
    their epsilon, the rotary frequencies and each frequency's position axis (MRoPE)."""

    qkv: int
    pos: int
    q_norm: int
    k_norm: int
    eps: float
    inv_freq: int
    freq_axis: int = 0


class CudaAttention:
    """One compiled kernel variant, loaded into the current CUDA context (the caller makes one
    current, e.g. cuDevicePrimaryCtxRetain + cuCtxSetCurrent).

    By default it loads a cubin for the current device, which needs no PTX JIT and so no driver
    as new as NVRTC; ``ptx=True`` loads PTX instead, as TensorRT would."""

    def __init__(
        self, config: KernelConfig, *, ptx: bool = False,
        cubin: Callable[[str, str], bytes] | None = None,
    ) -> None:  # fmt: skip
        """``cubin``: how to get the cubin for (source, arch) (default: compile it; the fused
        backend passes its kernel cache)."""
        cu = _driver()
        self.config = config
        self.source = config.source()
        device = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        attr = cu.CUdevice_attribute
        major = check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute",
        )
        minor = check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute",
        )
        if ptx:
            self.image = compile_ptx(self.source, f"compute_{major}{minor}")
        else:
            self.image = (cubin or compile_cubin)(self.source, f"sm_{major}{minor}")
        self.module = check(cu.cuModuleLoadData(self.image), "cuModuleLoadData")
        self.function = check(
            cu.cuModuleGetFunction(self.module, KERNEL_NAME.encode()), "cuModuleGetFunction"
        )

    def registers(self) -> int:
        """Registers per thread the compiled kernel uses (for reports)."""
        cu = _driver()
        return check(
            cu.cuFuncGetAttribute(
                cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function
            ),
            "cuFuncGetAttribute",
        )

    def launch(
        self,
        q: int,
        k: int,
        v: int,
        past_key: int,
        past_value: int,
        past_lens: int,
        query_lens: int,
        out: int,
        *,
        batch: int,
        seq: int,
        capacity: int,
        stream: Any = 0,
        overlap: bool = False,
        qk: FusedQK | None = None,
    ) -> None:
        """Queue one call on ``stream`` (device pointers as ints). The cache is updated in
        place: present_key/present_value are past_key/past_value. ``overlap``: as a
        programmatic dependent launch (see ``launch_kernel``). A ``fused_qk`` kernel takes
        decode calls only, ``qk`` instead of q, k and v (pass 0 for those)."""
        if bool(self.config.fused_qk) != (qk is not None):
            raise ValueError("qk: given exactly when the kernel is fused_qk")
        if qk is not None and seq != 1:
            raise ValueError(f"a fused_qk kernel takes decode calls (seq 1), not seq {seq}")
        grid, block, shared = self.config.launch_params(batch, seq, capacity)
        pointers = (q, k, v, past_key, past_value, past_lens, query_lens)
        values: list[Any] = [ctypes.c_void_p(int(p)) for p in pointers]
        values += [ctypes.c_int32(int(n)) for n in (batch, seq, capacity)]
        values += [ctypes.c_void_p(int(p)) for p in (out, past_key, past_value)]
        if qk is not None:
            values += [ctypes.c_void_p(int(p)) for p in (qk.qkv, qk.pos, qk.q_norm, qk.k_norm)]
            values += [ctypes.c_float(qk.eps)]
            values += [ctypes.c_void_p(int(p)) for p in (qk.inv_freq, qk.freq_axis)]
        launch_kernel(self.function, grid, block[0], shared, stream, values, overlap=overlap,
                      what=KERNEL_NAME)  # fmt: skip

    def close(self) -> None:
        if getattr(self, "module", None) is not None:
            check(_driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None
