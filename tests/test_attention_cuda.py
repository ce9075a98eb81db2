"""The CUDA C kernel of edgeomni::CachedAttention (plugins/attention_cuda.py) against the op's
numpy reference.

Three levels, each skipped with its reason where its tools are missing:
- NVRTC compiles every variant to PTX (needs cuda-python's NVRTC, no GPU);
- the same source, compiled by g++ with one std::thread per CUDA thread, runs a few small calls
  on the CPU (needs g++ with C++20): index arithmetic, masks, the key-split merge and the
  in-place cache write are checked without a GPU;
- the kernel on the GPU (``pytest -m gpu``): prefill, decode, chunked prefill, ragged and idle
  rows, a full cache, window, bidirectional, GQA and MHA, float32 and float16, and the cache
  bit for bit, untouched slots included.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.plugins import attention_cuda as ac
from edgeomni.plugins.attention import reference

sys.path.insert(0, str(Path(__file__).parent))
import cuda_host  # noqa: E402
from cuda_host import SHIM_CORE  # noqa: E402

# a NaN pattern for cache slots the call must neither read (it would spread) nor write
SENTINEL = {"float16": (np.uint16, 0x7E5A), "float32": (np.uint32, 0x7FC05A5A)}
NUMPY = {"float16": np.float16, "float32": np.float32}
TOL = {"float16": 2e-3, "float32": 1e-5}


# ---------------------------------------------------------------------------------------------
# cases: inputs, and what the call must leave behind
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    past_key: np.ndarray
    past_value: np.ndarray
    past_lens: np.ndarray
    query_lens: np.ndarray
    out: np.ndarray  # the reference, float64
    present_key: np.ndarray  # bit-exact expectation, in the call's dtype
    present_value: np.ndarray


def past_caches(rng: np.random.Generator, cfg: ac.KernelConfig, capacity: int,
                past: list[int]) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Key and value caches [rows, kv heads, capacity, head dim]: ``past[b]`` random positions
    a row, the SENTINEL pattern (which the call must neither read nor write) after them."""
    dt, hkv, d = NUMPY[cfg.dtype], cfg.kv_num_heads, cfg.head_dim
    bits_type, bits = SENTINEL[cfg.dtype]
    key = np.full((len(past), hkv, capacity, d), bits, bits_type).view(dt)
    value = key.copy()
    for b, n in enumerate(past):
        key[b, :, :n] = rng.standard_normal((hkv, n, d)).astype(dt)
        value[b, :, :n] = rng.standard_normal((hkv, n, d)).astype(dt)
    return key, value


def make_case(
    cfg: ac.KernelConfig, seq: int, capacity: int, past: list[int], fresh: list[int], seed: int = 0
) -> Case:
    rng = np.random.default_rng(seed)
    dt = NUMPY[cfg.dtype]
    batch, hq, hkv, d = len(past), cfg.num_heads, cfg.kv_num_heads, cfg.head_dim
    q = rng.standard_normal((batch, seq, hq * d)).astype(dt)
    k = rng.standard_normal((batch, seq, hkv * d)).astype(dt)
    v = rng.standard_normal((batch, seq, hkv * d)).astype(dt)
    past_key, past_value = past_caches(rng, cfg, capacity, past)
    past_lens, query_lens = np.array(past, np.int32), np.array(fresh, np.int32)
    wide = [x.astype(np.float64) for x in (q, k, v, past_key, past_value)]
    out, _, _ = reference(
        *wide, past_lens, query_lens, num_heads=hq, kv_num_heads=hkv, scale=cfg.scale,
        window=cfg.window, causal=cfg.causal,
    )  # fmt: skip
    present_key, present_value = past_key.copy(), past_value.copy()
    for b, (p, n) in enumerate(zip(past, fresh, strict=True)):
        present_key[b, :, p : p + n] = k[b, :n].reshape(n, hkv, d).transpose(1, 0, 2)
        present_value[b, :, p : p + n] = v[b, :n].reshape(n, hkv, d).transpose(1, 0, 2)
    return Case(q, k, v, past_key, past_value, past_lens, query_lens, out, present_key,
                present_value)  # fmt: skip


def assert_matches(cfg: ac.KernelConfig, case: Case, out: np.ndarray, keys: np.ndarray,
                   values: np.ndarray) -> None:  # fmt: skip
    """The cache bit for bit (new slots written, every other slot untouched), out within the
    dtype's tolerance at valid positions and zero past each row's query length."""
    bits_type = SENTINEL[cfg.dtype][0]
    assert np.array_equal(keys.view(bits_type), case.present_key.view(bits_type)), "key cache"
    assert np.array_equal(values.view(bits_type), case.present_value.view(bits_type)), "values"
    tol = TOL[cfg.dtype]
    for b, n in enumerate(case.query_lens):
        assert not np.any(out[b, n:]), f"row {b}: padding positions are not zero"
        np.testing.assert_allclose(
            out[b, :n].astype(np.float64), case.out[b, :n], atol=tol, rtol=tol, err_msg=f"row {b}"
        )


# (seq, capacity, past per row, new tokens per row)
SHAPES = {
    "decode": (1, 48, [40, 0, 47, 5], [1, 1, 1, 0]),  # a full cache (47 + 1) and an idle row
    "prefill": (13, 40, [0, 0], [13, 7]),  # ragged
    "chunked": (6, 48, [10, 42, 3], [6, 6, 0]),  # past > 0; 42 + 6 fills the cache; idle row
    "long": (70, 80, [5], [70]),  # several blocks of positions, several key chunks
}


# ---------------------------------------------------------------------------------------------
# configuration (no CUDA needed)
# ---------------------------------------------------------------------------------------------
def test_launch_params_and_attributes() -> None:
    cfg = ac.KernelConfig(32, 4, 128, "float16")
    assert (cfg.scale, cfg.window, cfg.causal, cfg.block_heads, cfg.warps) == (0.0, 0, 1, 4, 8)
    assert cfg.launch_params(32, 1, 4096) == ((1, 8, 32), (256, 1, 1), 0)
    assert cfg.launch_params(1, 513, 4096) == ((65, 8, 1), (256, 1, 1), 0)
    assert ac.default_heads_per_block(2) == 2 and ac.default_heads_per_block(1) == 1
    assert ac.default_heads_per_block(6) == 2 and ac.default_heads_per_block(16) == 4
    assert cfg.shared_bytes <= 48 * 1024
    source = ac.kernel_source(num_heads=16, kv_num_heads=8, head_dim=128, scale=0.5, window=0,
                              causal=0, dtype="float32")  # fmt: skip
    assert "#define CAUSAL 0" in source and "#define IS_HALF 0" in source
    assert float.fromhex(_define(source, "SCALE_LOG2")) == pytest.approx(0.5 / np.log(2.0))
    with pytest.raises(ValueError, match="window"):
        ac.KernelConfig(8, 2, 64, window=4, causal=0)
    with pytest.raises(ValueError, match="multiple"):
        ac.KernelConfig(6, 4, 64)
    with pytest.raises(ValueError, match="heads_per_block"):
        ac.KernelConfig(8, 2, 64, heads_per_block=8)
    with pytest.raises(ValueError, match="dtype"):
        ac.KernelConfig(8, 2, 64, dtype="bfloat16")


def _define(source: str, name: str) -> str:
    line = next(x for x in source.splitlines() if x.startswith(f"#define {name} "))
    return line.split()[2].rstrip("f")


# ---------------------------------------------------------------------------------------------
# NVRTC (no GPU needed)
# ---------------------------------------------------------------------------------------------
def _nvrtc_reason() -> str | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        return f"cuda-python's NVRTC bindings do not import: {e}"
    try:
        err, *_ = nvrtc.nvrtcVersion()
    except Exception as e:  # the NVRTC shared library is not found
        return f"the NVRTC library does not load: {e}"
    return None if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else f"nvrtcVersion: {err}"


NVRTC_REASON = _nvrtc_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_REASON is not None, reason=NVRTC_REASON or "")

# every combination the exports use, and the corners: GQA 8/2 and 32/4, MHA, the code
# predictor's 16/8; windowed; bidirectional; float16 and float32; heads per block 1 to 8
VARIANTS = [
    ac.KernelConfig(hq, hkv, d, dtype, 0.0, window, causal, hb)
    for dtype, (hq, hkv, hb), d, (window, causal) in itertools.product(
        ("float16", "float32"),
        ((32, 4, 0), (32, 4, 8), (16, 2, 1), (16, 8, 0), (8, 8, 0), (8, 2, 2)),
        (128, 64),
        ((0, 1), (64, 1), (0, 0)),
    )
]


@needs_nvrtc
@pytest.mark.parametrize("cfg", VARIANTS, ids=str)
def test_nvrtc_compiles_every_variant(cfg: ac.KernelConfig) -> None:
    ptx = ac.compile_ptx(cfg.source(), "compute_87").rstrip(b"\x00").decode()
    assert f".visible .entry {ac.KERNEL_NAME}(" in ptx
    entry = ptx.split(f".entry {ac.KERNEL_NAME}(", 1)[1].split(")", 1)[0]
    assert entry.count(".param") == len(ac.PARAMS)  # 10 pointers and 3 int32 sizes


@needs_nvrtc
def test_nvrtc_errors_carry_the_log() -> None:
    with pytest.raises(ac.KernelError, match="undefined"):
        ac.compile_ptx(ac.KernelConfig(8, 2, 64).source() + "\nint broken = undefined_name;\n")


def test_nvrtc_writes_into_buffers_of_its_own(monkeypatch) -> None:
    """NVRTC writes the log and the image into the bytes objects it is given: each must be new.
    ``b" " * 1`` (the buffer of an empty log, once) is CPython's shared one-byte object, and
    NVRTC's NUL in it turned every ``b" "`` of the process into ``b"\\x00"``. A fake NVRTC
    records the buffers (checked before anything is written into them)."""
    import ctypes
    from types import SimpleNamespace

    from edgeomni.plugins import cuda_driver

    given: list[bytes] = []
    ok = SimpleNamespace(NVRTC_SUCCESS=0)

    def write(buf: bytes, text: bytes) -> tuple[int]:
        assert buf is not b" " * 1 and len(buf) >= 2, "NVRTC handed a shared bytes object"
        given.append(buf)
        ctypes.memmove(ctypes.c_char_p(buf), text, min(len(text), len(buf)))
        return (0,)

    fake = SimpleNamespace(
        nvrtcResult=ok,
        nvrtcCreateProgram=lambda *a: (0, "prog"),
        nvrtcCompileProgram=lambda *a: (0,),
        nvrtcGetProgramLogSize=lambda prog: (0, 1),  # an empty log: its NUL
        nvrtcGetProgramLog=lambda prog, buf: write(buf, b"\x00"),
        nvrtcGetPTXSize=lambda prog: (0, 4),
        nvrtcGetPTX=lambda prog, buf: write(buf, b"ptx\x00"),
        nvrtcDestroyProgram=lambda prog: (0,),
    )
    monkeypatch.setattr(cuda_driver, "_nvrtc", lambda: fake)
    assert cuda_driver.compile_ptx("// nothing") == b"ptx\x00"
    assert len(given) == 2 and given[0] is not given[1]
    space = chr(32)
    assert bytes([32]) == b" " * 1 and space.encode() == bytes([32])


@needs_nvrtc
def test_a_real_compile_leaves_the_shared_space_alone() -> None:
    ac.compile_ptx('extern "C" __global__ void k() {}')  # an empty log
    words = "a" + chr(32) + "b"
    assert bytes([32]) == b" " * 1 and words.encode().split() == [b"a", b"b"]


# ---------------------------------------------------------------------------------------------
# host emulation: the same source under g++
# ---------------------------------------------------------------------------------------------
SHIM = "#define ATTN_HOST_EMULATION 1\n" + SHIM_CORE + r"""
#if IS_HALF
inline float to_f(unsigned short h) { return half_to_f(h); }
inline unsigned short from_f(float f) { return f_to_half(f); }
#else
inline float to_f(float x) { return x; }
inline float from_f(float x) { return x; }
#endif
// blocks one after another (so a static __shared__ array is one block's), threads concurrent,
// each thread calling kernel()
template <class F> void run_grid(unsigned gx, unsigned gy, unsigned gz, F kernel) {
    for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
        std::barrier<> block(THREADS);
        g_block = &block;
        g_warps.clear();
        for (int w = 0; w < WARPS; ++w) g_warps.push_back(new std::barrier<>(32));
        std::vector<std::thread> threads;
        for (int t = 0; t < THREADS; ++t)
            threads.emplace_back([=] {
                threadIdx = dim3{(unsigned)t, 0, 0};
                blockIdx = dim3{x, y, z};
                t_warp = t / 32;
                kernel();
            });
        for (auto& t : threads) t.join();
        for (auto* w : g_warps) delete w;
    }
}
"""

MAIN = r"""
int main(int argc, char** argv) {
    const int B = std::atoi(argv[1]), S = std::atoi(argv[2]), C = std::atoi(argv[3]);
    const unsigned gx = std::atoi(argv[4]), gy = std::atoi(argv[5]), gz = std::atoi(argv[6]);
    const size_t nq = (size_t)B * S * NUM_HEADS * HEAD_DIM, nk = (size_t)B * S * KV_HEADS * HEAD_DIM;
    const size_t nc = (size_t)B * KV_HEADS * C * HEAD_DIM;
    T* q = (T*)slurp("q.bin", nq * sizeof(T));
    T* k = (T*)slurp("k.bin", nk * sizeof(T));
    T* v = (T*)slurp("v.bin", nk * sizeof(T));
    T* kc = (T*)slurp("kc.bin", nc * sizeof(T));
    T* vc = (T*)slurp("vc.bin", nc * sizeof(T));
    int* past = (int*)slurp("past.bin", B * 4);
    int* fresh = (int*)slurp("fresh.bin", B * 4);
    T* out = (T*)slurp("out.bin", nq * sizeof(T));
    run_grid(gx, gy, gz, [=] { KERNEL_NAME(q, k, v, kc, vc, past, fresh, B, S, C, out, kc, vc); });
    spit("out.bin", out, nq * sizeof(T));
    spit("kc.bin", kc, nc * sizeof(T));
    spit("vc.bin", vc, nc * sizeof(T));
    return 0;
}
"""


def _gxx_reason() -> str | None:
    if shutil.which("g++") is None:
        return "no g++ for the host emulation of the kernel"
    return None


GXX_REASON = _gxx_reason()


def compile_host(cfg: ac.KernelConfig, work: Path, main: str = MAIN) -> Path:
    """The kernel source of ``cfg`` with the host shim and ``main``, compiled by g++: the
    executable."""
    source = cfg.source()
    defines, body = source.split("\n#if IS_HALF\ntypedef", 1)  # the shim needs IS_HALF
    cpp = work / "attention_host.cpp"
    cpp.write_text(defines + SHIM + "\n#if IS_HALF\ntypedef" + body + main)
    return cuda_host.compile_host(cpp, work / "attention_host")


def emulate(cfg: ac.KernelConfig, case: Case, work: Path, exe: Path) -> tuple[np.ndarray, ...]:
    """One call of the kernel (``exe``, compile_host's of cfg) on the host: (out, key cache,
    value cache)."""
    dt = NUMPY[cfg.dtype]
    arrays = {"q": case.q, "k": case.k, "v": case.v, "kc": case.past_key, "vc": case.past_value}
    for name, array in arrays.items():
        np.ascontiguousarray(array, dt).tofile(work / f"{name}.bin")
    case.past_lens.tofile(work / "past.bin")
    case.query_lens.tofile(work / "fresh.bin")
    np.full(case.q.shape, np.nan, dt).tofile(work / "out.bin")  # every position must be written
    batch, seq, _ = case.q.shape
    capacity = case.past_key.shape[2]
    grid, _, _ = cfg.launch_params(batch, seq, capacity)
    args = [str(x) for x in (batch, seq, capacity, *grid)]
    subprocess.run([str(exe), *args], cwd=work, check=True, timeout=600)
    out = np.fromfile(work / "out.bin", dt).reshape(case.q.shape)
    keys = np.fromfile(work / "kc.bin", dt).reshape(case.past_key.shape)
    values = np.fromfile(work / "vc.bin", dt).reshape(case.past_value.shape)
    return out, keys, values


EMULATED = [
    ac.KernelConfig(8, 2, 128, "float16"),  # 4 heads a block, values prefetched
    ac.KernelConfig(4, 2, 128, "float32", window=40, heads_per_block=1),
    ac.KernelConfig(4, 4, 32, "float16", causal=0, warps=4),  # MHA, bidirectional
]


@pytest.mark.skipif(GXX_REASON is not None, reason=GXX_REASON or "")
@pytest.mark.parametrize("cfg", EMULATED, ids=str)
def test_host_emulation_matches_reference(cfg: ac.KernelConfig, tmp_path: Path) -> None:
    # decode (a full cache, an idle row), a chunk after a past, decode over 10 key chunks, and
    # a prefill of several position blocks
    shapes = [SHAPES["decode"], SHAPES["chunked"], (1, 300, [290], [1]), (37, 100, [50], [37])]
    exe = compile_host(cfg, tmp_path)  # one source for every shape: compiled once
    for i, (seq, capacity, past, fresh) in enumerate(shapes):
        case = make_case(cfg, seq, capacity, past, fresh, seed=i)
        assert_matches(cfg, case, *emulate(cfg, case, tmp_path, exe))


# ---------------------------------------------------------------------------------------------
# the GPU
# ---------------------------------------------------------------------------------------------
def _gpu_reason() -> str | None:
    if NVRTC_REASON:
        return NVRTC_REASON
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        return f"cuda-python's driver bindings do not import: {e}"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"no usable NVIDIA GPU here (cuInit: {err.name})"
        err, count = cu.cuDeviceGetCount()
    except Exception as e:  # no libcuda
        return f"no CUDA driver here: {e}"
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return "no NVIDIA GPU here"
    return None


GPU_REASON = _gpu_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")


@pytest.fixture(scope="module")
def cuda_context() -> Any:
    """Device 0's primary context, current on this thread for the module's tests."""
    from cuda.bindings import driver as cu

    ac.check(cu.cuInit(0), "cuInit")
    device = ac.check(cu.cuDeviceGet(0), "cuDeviceGet")
    context = ac.check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    ac.check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    yield context
    ac.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ac.check(cu.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")


class DeviceBuffer:
    """cuMemAlloc'd copy of a host array."""

    def __init__(self, array: np.ndarray) -> None:
        from cuda.bindings import driver as cu

        self.like = np.ascontiguousarray(array)
        self.ptr = ac.check(cu.cuMemAlloc(max(self.like.nbytes, 1)), "cuMemAlloc")
        ac.check(cu.cuMemcpyHtoD(self.ptr, self.like.ctypes.data, self.like.nbytes),
                 "cuMemcpyHtoD")  # fmt: skip

    def get(self) -> np.ndarray:
        from cuda.bindings import driver as cu

        host = np.empty_like(self.like)
        ac.check(cu.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes), "cuMemcpyDtoH")
        return host

    def free(self) -> None:
        from cuda.bindings import driver as cu

        ac.check(cu.cuMemFree(self.ptr), "cuMemFree")


def run_gpu(kernel: ac.CudaAttention, case: Case) -> tuple[np.ndarray, ...]:
    from cuda.bindings import driver as cu

    out0 = np.full(case.q.shape, np.nan, case.q.dtype)  # every position must be written
    names = ("q", "k", "v", "past_key", "past_value", "past_lens", "query_lens")
    bufs = {n: DeviceBuffer(getattr(case, n)) for n in names}
    bufs["out"] = DeviceBuffer(out0)
    batch, seq, _ = case.q.shape
    try:
        kernel.launch(
            *(int(bufs[n].ptr) for n in names), int(bufs["out"].ptr),
            batch=batch, seq=seq, capacity=case.past_key.shape[2], stream=0,
        )  # fmt: skip
        ac.check(cu.cuCtxSynchronize(), "cuCtxSynchronize (the kernel)")
        return bufs["out"].get(), bufs["past_key"].get(), bufs["past_value"].get()
    finally:
        for buf in bufs.values():
            buf.free()


GPU_CONFIGS = [
    ac.KernelConfig(8, 2, 128, "float16"),  # GQA 8/2
    ac.KernelConfig(8, 2, 128, "float32"),
    ac.KernelConfig(8, 2, 128, "float16", heads_per_block=1),
    ac.KernelConfig(8, 2, 128, "float16", window=16),
    ac.KernelConfig(8, 2, 128, "float32", window=16, heads_per_block=2),
    ac.KernelConfig(8, 2, 128, "float16", causal=0),
    ac.KernelConfig(8, 2, 128, "float32", causal=0),
    ac.KernelConfig(4, 4, 128, "float16"),  # MHA
    ac.KernelConfig(4, 4, 64, "float32", scale=0.2),
    ac.KernelConfig(32, 4, 128, "float16", heads_per_block=8),  # the thinker's heads
    ac.KernelConfig(16, 8, 128, "float16"),  # the code predictor's
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=str)
def test_gpu_matches_reference(cuda_context: Any, cfg: ac.KernelConfig, shape: str) -> None:
    seq, capacity, past, fresh = SHAPES[shape]
    case = make_case(cfg, seq, capacity, past, fresh)
    kernel = ac.CudaAttention(cfg)
    try:
        assert_matches(cfg, case, *run_gpu(kernel, case))
    finally:
        kernel.close()


@pytest.mark.gpu
@needs_gpu
def test_gpu_prefill_64_and_long_decode(cuda_context: Any) -> None:
    """Prefill of 64 tokens, then the thinker's shape at a long cache: decode of 3 rows with
    ~2000 tokens cached in a 4096-slot cache (one row idle), and a chunk after a past."""
    cfg = ac.KernelConfig(32, 4, 128, "float16")
    kernel = ac.CudaAttention(cfg)
    try:
        for seq, capacity, past, fresh in [
            (64, 128, [0, 0], [64, 33]),
            (1, 4096, [2000, 4095, 1500, 7], [1, 1, 0, 1]),
            (24, 4096, [3000, 4072], [24, 24]),
        ]:
            case = make_case(cfg, seq, capacity, past, fresh, seed=seq)
            assert_matches(cfg, case, *run_gpu(kernel, case))
    finally:
        kernel.close()


@pytest.mark.gpu
@needs_gpu
def test_gpu_is_deterministic_and_ptx_loads(cuda_context: Any) -> None:
    """Two runs give the same bits (the key-split merge has a fixed order), and the PTX a
    TensorRT plugin would carry loads and computes the same (where the driver takes this
    NVRTC's PTX version)."""
    cfg = ac.KernelConfig(8, 2, 128, "float16")
    seq, capacity, past, fresh = SHAPES["decode"]
    case = make_case(cfg, seq, capacity, past, fresh)
    kernel = ac.CudaAttention(cfg)
    try:
        first, second = run_gpu(kernel, case)[0], run_gpu(kernel, case)[0]
        assert np.array_equal(first.view(np.uint16), second.view(np.uint16))
    finally:
        kernel.close()
    try:
        ptx_kernel = ac.CudaAttention(cfg, ptx=True)
    except ac.KernelError as e:
        if "UNSUPPORTED_PTX_VERSION" in str(e):
            pytest.skip(f"the driver is older than NVRTC's PTX: {e}")
        raise
    try:
        assert np.array_equal(run_gpu(ptx_kernel, case)[0].view(np.uint16), first.view(np.uint16))
    finally:
        ptx_kernel.close()
