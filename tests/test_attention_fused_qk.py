"""The attention kernel's fused_qk variant (plugins/attention_cuda.py), which the fused backend
runs for decode calls: it takes the layer's qkv projection (float32) instead of q, k and v and
does plugins/decoder_cuda.py's qk_rope itself (q/k RMSNorm, rotary, 1-D and MRoPE), writing the
new key and value into the cache. On the CPU (g++, one std::thread per CUDA thread, as
tests/test_attention_cuda.py emulates the op's kernel): the new cache slots are qk_rope's
reference rounded to the cache's type, every other slot untouched, and the output the
attention reference's over those q, k and v. On the GPU the fused backend's decode steps equal
qk_rope + attention bit for bit (tests/test_fused_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.plugins import attention_cuda as ac
from edgeomni.plugins import decoder_cuda as dc
from edgeomni.plugins.attention import reference

sys.path.insert(0, str(Path(__file__).parent))
from test_attention_cuda import GXX_REASON, NUMPY, SENTINEL, TOL, compile_host, past_caches  # noqa: E402

MAIN = r"""
int main(int argc, char** argv) {
    const int B = std::atoi(argv[1]), C = std::atoi(argv[2]), axes = std::atoi(argv[3]);
    const unsigned gx = std::atoi(argv[4]), gy = std::atoi(argv[5]), gz = std::atoi(argv[6]);
    const bool norm = std::atoi(argv[7]), mrope = axes > 1;
    const int rows = NUM_HEADS + 2 * KV_HEADS;
    const size_t nc = (size_t)B * KV_HEADS * C * HEAD_DIM, nq = (size_t)B * NUM_HEADS * HEAD_DIM;
    float* qkv = (float*)slurp("qkv.bin", (size_t)B * rows * HEAD_DIM * 4);
    long long* pos = (long long*)slurp("pos.bin", (size_t)axes * B * 8);
    float* qn = norm ? (float*)slurp("qn.bin", HEAD_DIM * 4) : nullptr;
    float* kn = norm ? (float*)slurp("kn.bin", HEAD_DIM * 4) : nullptr;
    float* inv_freq = (float*)slurp("inv_freq.bin", HEAD_DIM / 2 * 4);
    int* axis = mrope ? (int*)slurp("axis.bin", HEAD_DIM / 2 * 4) : nullptr;
    T* kc = (T*)slurp("kc.bin", nc * sizeof(T));
    T* vc = (T*)slurp("vc.bin", nc * sizeof(T));
    int* past = (int*)slurp("past.bin", B * 4);
    int* fresh = (int*)slurp("fresh.bin", B * 4);
    T* out = (T*)slurp("out.bin", nq * sizeof(T));
    run_grid(gx, gy, gz, [=] {
        KERNEL_NAME(nullptr, nullptr, nullptr, kc, vc, past, fresh, B, 1, C, out, kc, vc,
                    qkv, pos, qn, kn, 1e-6f, inv_freq, axis);
    });
    spit("out.bin", out, nq * sizeof(T));
    spit("kc.bin", kc, nc * sizeof(T));
    spit("vc.bin", vc, nc * sizeof(T));
    return 0;
}
"""

CONFIGS = [
    ac.KernelConfig(8, 4, 128, "float16", fused_qk=1),  # Qwen3's head size, 2 heads a block
    ac.KernelConfig(8, 2, 64, "float32", fused_qk=1, heads_per_block=4, warps=4),
]


def test_fused_qk_needs_its_inputs_and_decode_calls() -> None:
    cfg = CONFIGS[0]
    assert cfg.shared_bytes > ac.KernelConfig(8, 4, 128, "float16").shared_bytes  # staging
    with pytest.raises(ValueError, match="fused_qk 2"):
        ac.KernelConfig(8, 4, 128, "float16", fused_qk=2)
    # the op's TensorRT plugin kernel is not changed by the variant
    assert "float stage_row" not in ac.KernelConfig(8, 4, 128, "float16").source()
    assert "float stage_row" in cfg.source()


@pytest.mark.skipif(GXX_REASON is not None, reason=GXX_REASON or "")
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("mrope", [False, True], ids=["rope", "mrope"])
def test_fused_qk_decode_matches_qk_rope_and_attention(cfg, mrope, tmp_path: Path) -> None:
    """Decode rows with a long past, none, a full cache and an idle row."""
    rng = np.random.default_rng(7 + mrope)
    dt, d = NUMPY[cfg.dtype], cfg.head_dim
    hq, hkv = cfg.num_heads, cfg.kv_num_heads
    past, fresh, capacity = [40, 0, 47, 5], [1, 1, 1, 0], 48
    batch = len(past)
    qkv = rng.standard_normal((batch, (hq + 2 * hkv) * d)).astype(np.float32)
    norm = not mrope  # MRoPE without the q/k norms: the null weights too
    qn = (rng.uniform(0.5, 1.5, d).astype(np.float32) if norm else None)
    kn = (rng.uniform(0.5, 1.5, d).astype(np.float32) if norm else None)
    inv_freq = (1e6 ** (-np.arange(0, d, 2) / d)).astype(np.float32)
    axes = 3 if mrope else 1
    pos = (np.array(past)[None] + rng.integers(0, 5, (axes, batch))).astype(np.int64)
    axis = (np.arange(d // 2) % 3).astype(np.int32) if mrope else None
    kc, vc = past_caches(rng, cfg, capacity, past)
    bits_type = SENTINEL[cfg.dtype][0]
    files = {"qkv": qkv, "pos": pos, "inv_freq": inv_freq, "kc": kc, "vc": vc,
             "past": np.array(past, np.int32), "fresh": np.array(fresh, np.int32),
             "out": np.full((batch, hq * d), np.nan, dt)}  # fmt: skip
    if norm:
        files.update(qn=qn, kn=kn)
    if mrope:
        files["axis"] = axis
    for name, array in files.items():
        np.ascontiguousarray(array).tofile(tmp_path / f"{name}.bin")
    exe = compile_host(cfg, tmp_path, MAIN)
    grid, _, _ = cfg.launch_params(batch, 1, capacity)
    subprocess.run([str(exe), str(batch), str(capacity), str(axes), *map(str, grid), str(int(norm))],
                   cwd=tmp_path, check=True, timeout=600)  # fmt: skip
    out = np.fromfile(tmp_path / "out.bin", dt).reshape(batch, 1, hq * d)
    keys = np.fromfile(tmp_path / "kc.bin", dt).reshape(kc.shape)
    values = np.fromfile(tmp_path / "vc.bin", dt).reshape(vc.shape)

    q, k, v = dc.qk_rope_reference(qkv, pos, heads=hq, kv_heads=hkv,
                                   head_dim=d, inv_freq=inv_freq, q_norm=qn, k_norm=kn,
                                   freq_axis=axis)  # fmt: skip
    q, k, v = (x.astype(dt).reshape(batch, 1, -1) for x in (q, k, v))  # qk_rope's rounding
    tol = TOL[cfg.dtype]
    want_keys, want_values = kc.copy(), vc.copy()
    for b, (p, n) in enumerate(zip(past, fresh, strict=True)):
        want_keys[b, :, p : p + n] = k[b, :n].reshape(n, hkv, d).transpose(1, 0, 2)
        want_values[b, :, p : p + n] = v[b, :n].reshape(n, hkv, d).transpose(1, 0, 2)
    new = np.zeros(kc.shape, bool)
    for b, (p, n) in enumerate(zip(past, fresh, strict=True)):
        new[b, :, p : p + n] = True
    # every other slot untouched, bit for bit; the new ones qk_rope's, rounded to the cache type
    assert np.array_equal(keys[~new].view(bits_type), kc[~new].view(bits_type))
    assert np.array_equal(values[~new].view(bits_type), want_values[~new].view(bits_type))
    np.testing.assert_array_equal(values[new], want_values[new])  # v: a plain conversion
    np.testing.assert_allclose(keys[new].astype(np.float64), want_keys[new], atol=tol, rtol=tol)
    want, _, _ = reference(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
        kc.astype(np.float64), vc.astype(np.float64), np.array(past, np.int32),
        np.array(fresh, np.int32), num_heads=hq, kv_num_heads=hkv,
    )  # fmt: skip
    assert not np.any(out[3]), "an idle row's output is zeros"
    np.testing.assert_allclose(out[:3].astype(np.float64), want[:3], atol=tol, rtol=tol)
