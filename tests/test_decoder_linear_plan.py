"""plugins/decoder_linear_cuda.py's choice of kernel, grid and block: what keeps a row's sums
in one order whatever the batch, and the calls it refuses."""

from __future__ import annotations

import pytest

from edgeomni.plugins import decoder_cuda as dc
from edgeomni.plugins import decoder_linear_cuda as lc


@pytest.mark.parametrize("weights", ["float16", "float32"])
def test_the_split_of_k_depends_on_k_alone(weights) -> None:
    """Within one family (SIMT below 8 rows, tensor cores from 8 with float16 weights) the
    warps splitting K, hence the order a row's partial sums are added in, are the same at every
    batch size; float32 weights stay SIMT at any size."""
    for k, n in ((1024, 4096), (3072, 1024), (136, 72)):
        simt = {lc.linear_launch(weights, rows, k, n).block for rows in range(1, 8)}
        assert len(simt) == 1
        wide = {lc.linear_launch(weights, rows, k, n) for rows in (8, 17, 32, 40, 63)}
        assert len({p.block for p in wide}) == 1
        mma = all(p.name.startswith("linear_m") for p in wide)
        assert mma == (weights == "float16")


@pytest.mark.parametrize(("k", "n", "gemm_from"), [
    (1024, 4096, 65),  # 64 x 64 tiles: 64 blocks at 64 rows, 128 at 65
    (3072, 1024, 4096),  # 16 blocks of columns: the GEMM once 8 blocks of rows fill a wave
    (136, 72, None),  # K not a multiple of 32: no GEMM
])  # fmt: skip
def test_the_gemm_runs_where_its_tiles_fill_the_gpu(k, n, gemm_from) -> None:
    """From GEMM_ROWS rows a float16 call runs as the GEMM once its 64 x 64 tiles make
    GEMM_MIN_BLOCKS blocks (the mma variants' blocks of 16 columns fill the SMs where they do
    not); float32 weights stay SIMT."""
    for rows in (64, 65, 300, 4096):
        gemm = gemm_from is not None and rows >= gemm_from
        assert lc.linear_launch("float16", rows, k, n).name == ("linear_gf" if gemm else
                                                                 "linear_mf32")  # fmt: skip
        assert lc.linear_launch("float32", rows, k, n).name == "linear_f16"
    assert lc.linear_launch("float16", 1, 1024, 4096).block == 32 * 4  # 4 passes of 256


def test_grids_cover_every_row_and_column() -> None:
    plan = lc.linear_launch("float16", 40, 1024, 75)  # tensor cores: 16 columns, 32 rows a block
    assert plan.grid == (5, 2) and plan.name == "linear_mf32"
    plan = lc.linear_launch("float16", 3, 1024, 75, swiglu=True)  # SIMT R=4: 4 columns a block
    assert plan.grid == (19, 1) and plan.name == "linear_f4s"
    plan = lc.linear_launch("float32", 20, 64, 10, swiglu=True)  # SIMT R=16 SwiGLU: 1 column
    assert plan.grid == (10, 2) and plan.name == "linear_f16s"
    # the GEMM (asked for: 6 tiles fill no GPU): 64 columns, 64 rows a block
    plan = lc.linear_launch("float16", 130, 1024, 75, gemm_way=True)
    assert plan.grid == (2, 3) and plan.name == "linear_gf" and plan.block == 128
    plan = lc.linear_launch("float16", 64, 1024, 75, swiglu=True, gemm_way=True)  # SwiGLU: 32
    assert plan.grid == (3, 1) and plan.name == "linear_gfs"  # gate and 32 up rows a block
    assert lc.linear_launch("float16", 130, 1024, 75).name == "linear_mf32"  # as the engine runs
    # a benchmark's own split of K keeps the mma variant
    assert lc.linear_launch("float16", 130, 1024, 75, warps=2).name == "linear_mf32"


def test_every_planned_kernel_is_in_the_source() -> None:
    source = {w: dc.Variant(w, w).source() for w in ("float16", "float32")}
    for w, src in source.items():
        for rows in (1, 2, 3, 5, 8, 16, 17, 32, 33, 64, 200):
            for half_input, swiglu in ((False, False), (False, True), (True, False)):
                gemm = rows >= 64  # asked for: N = 64 makes too few tiles to pay
                name = lc.linear_launch(w, rows, 1024, 64, half_input=half_input,
                                        swiglu=swiglu, gemm_way=gemm).name  # fmt: skip
                assert f" {name})" in src, (w, name)
                if w == "float16":  # int4 matrices: SIMT under 8 rows, tensor cores from 8,
                    # the GEMM from 64
                    plan = lc.linear_launch(w, rows, 1024, 64, half_input=half_input,
                                            swiglu=swiglu, int4=True, gemm_way=gemm)  # fmt: skip
                    family = "linear_gq" if rows >= 64 else "linear_mq" if rows >= 8 else "linear_q"
                    assert plan.name.startswith(family) and f" {plan.name})" in src, plan.name
                    # a step of 128 of K a warp on tensor cores, a pass of 256 on SIMT, the
                    # GEMM's four warps
                    want = 4 if rows >= 64 or rows < 8 else 8
                    assert plan.block == 32 * want and plan.scales, (rows, plan.block)
    with pytest.raises(ValueError, match="float16 modules"):
        lc.linear_launch("float32", 1, 1024, 64, int4=True)


@pytest.mark.parametrize(("args", "message"), [
    (("float16", 1, 1020, 8), "not a multiple of 8"),
    (("float32", 1, 1022, 8), "not a multiple of 4"),
])  # fmt: skip
def test_a_k_the_kernels_cannot_read_is_refused(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        lc.linear_launch(*args)


def test_no_swiglu_over_float16_input_and_no_split_beyond_eight_warps() -> None:
    with pytest.raises(ValueError, match="SwiGLU"):
        lc.linear_launch("float16", 1, 1024, 64, half_input=True, swiglu=True)
    with pytest.raises(ValueError, match="warps"):
        lc.linear_launch("float16", 1, 1024, 64, warps=9)
    with pytest.raises(ValueError, match="warps"):
        lc.linear_launch("float16", 9, 1024, 64, warps=9)

