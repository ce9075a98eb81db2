"""The fused backend's CUDA kernels (plugins/decoder_cuda.py) on the CPU: the same source,
compiled by g++ with one std::thread per CUDA thread (warp shuffles and block barriers as
std::barrier), runs tests/fused_kernel_cases.py's calls and their checks against the numpy
references, in CI where no GPU is. Index arithmetic, masks, the row and head offsets, the
reductions and the top-K's ordering are the GPU's; float16 conversion is g++'s _Float16
(round to nearest, as cvt.rn). tests/test_fused_gpu.py runs the same cases on a GPU."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from edgeomni.plugins import decoder_cuda as dc

sys.path.insert(0, str(Path(__file__).parent))
import cuda_host  # noqa: E402
import fused_kernel_cases as cases  # noqa: E402
from cuda_host import SHIM_CORE  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ for the emulation")

SHIM = "#define DECODER_HOST_EMULATION 1\n" + SHIM_CORE + r"""
#define DYNAMIC_SHARED(type, name) static type name[65536]
typedef unsigned short half_t;
inline float h2f(half_t h) { return half_to_f(h); }
inline half_t f2h(float f) { return f_to_half(f); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
// cp.async: the copy done at once (its commit and wait have nothing left to do)
inline void cp16(void* dst, const void* src, bool ok) {
    if (ok) std::memcpy(dst, src, 16); else std::memset(dst, 0, 16);
}
inline void cp4(void* dst, const void* src, bool ok) {
    if (ok) std::memcpy(dst, src, 4); else std::memset(dst, 0, 4);
}
inline void cp_commit() {}
template <int N> inline void cp_wait() {}
// mma.sync.m16n8k16.row.col f32 += f16 x f16 over a warp: each lane's fragments exchanged, each
// lane's four results summed from them by PTX's fragment layout (float32 sums in k order)
static unsigned g_mma_a[64][32][4], g_mma_b[64][32][2];
inline void mma16816(float* c, const unsigned* a, const unsigned* b) {
    const int lane = threadIdx.x & 31, w = t_warp;
    for (int i = 0; i < 4; ++i) g_mma_a[w][lane][i] = a[i];
    g_mma_b[w][lane][0] = b[0];
    g_mma_b[w][lane][1] = b[1];
    __syncwarp();
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 4; ++j) {
        const int row = g + 8 * (j >> 1), col = 2 * t + (j & 1);
        float sum = 0.f;
        for (int k = 0; k < 16; ++k) {
            const unsigned aw = g_mma_a[w][(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)];
            const unsigned bw = g_mma_b[w][col * 4 + (k % 8) / 2][k >= 8];
            sum += half_to_f((aw >> (16 * (k % 2))) & 0xffffu)
                 * half_to_f((bw >> (16 * (k % 2))) & 0xffffu);
        }
        c[j] += sum;
    }
    __syncwarp();
}
"""

MAIN = r"""
struct Any {
    void* p;
    template <class T> operator T*() const { return (T*)p; }
};
// blocks one after another (a static __shared__ array is one block's), a block's threads at once
template <class F> static void grid(dim3 g, unsigned threads, F call) {
    gridDim = g;
    blockDim = dim3{threads, 1, 1};
    for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
    for (unsigned x = 0; x < g.x; ++x) {
        std::barrier<> block(threads);
        g_block = &block;
        g_warps.clear();
        for (unsigned w = 0; w < threads / 32; ++w) g_warps.push_back(new std::barrier<>(32));
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([=] {
                threadIdx = dim3{t, 0, 0};
                blockIdx = dim3{x, y, z};
                t_warp = t / 32;
                call();
            });
        for (auto& t : pool) t.join();
        for (auto* w : g_warps) delete w;
    }
}
"""


def _source(variant: dc.Variant, all_cases: list[cases.KernelCase]) -> str:
    """The kernels with the shim, and a main that runs case argv[1] on the files in argv[2]."""
    source = variant.source()
    head, body = source.split("typedef unsigned short half_t;\n", 1)
    out = [head, SHIM, body, MAIN, "int main(int argc, char** argv) {",
           "  const int which = std::atoi(argv[1]);", "  const std::string dir = argv[2];"]
    for i, case in enumerate(all_cases):
        out.append(f"  if (which == {i}) {{")
        names = list(case.buffers)
        for j, name in enumerate(names):
            size = case.buffers[name].nbytes
            out.append(f'    void* b{j} = slurp((dir + "/{name}.bin").c_str(), {size});')
        for launch in case.launches:
            grid = (*launch.grid, 1, 1)[:3]
            args = ", ".join(_arg(a, names) for a in launch.args)
            out.append(f"    grid(dim3{{{grid[0]}, {grid[1]}, {grid[2]}}}, {launch.block}, "
                       f"[=] {{ {launch.kernel}({args}); }});")  # fmt: skip
        for j, name in enumerate(names):
            size = case.buffers[name].nbytes
            out.append(f'    spit((dir + "/{name}.bin").c_str(), b{j}, {size});')
        out.append("  }")
    out.append("  return 0;\n}\n")
    return "\n".join(out)


def _arg(arg: cases.Arg, names: list[str]) -> str:
    kind, *rest = arg
    if kind == "buf":
        return f"Any{{b{names.index(rest[0])}}}"
    if kind == "null":
        return "Any{nullptr}"
    if kind == "f32":
        return f"{float(rest[0])!r}f"
    return f"{int(rest[0])}{'LL' if kind == 'i64' else ''}"


CASES = {
    dtype: cases.all_cases(dtype, rows=(1, 3, 17), topk=((1, 384, 64), (2, 9000, 8)))
    for dtype in ("float16", "float32")
}


@pytest.fixture(scope="module", params=list(CASES))
def emulator(request, tmp_path_factory) -> tuple[Path, str]:
    dtype = request.param
    work = tmp_path_factory.mktemp(f"host-{dtype}")
    cpp, exe = work / "kernels.cpp", work / "kernels"
    cpp.write_text(_source(dc.Variant(dtype, dtype), CASES[dtype]))
    cuda_host.compile_host(cpp, exe)
    return exe, dtype


@pytest.mark.parametrize("index", range(len(CASES["float16"])),
                         ids=[c.name.replace("float16-", "") for c in CASES["float16"]])  # fmt: skip
def test_kernel_matches_its_reference_on_the_cpu(emulator, index, tmp_path) -> None:
    exe, dtype = emulator
    if index >= len(CASES[dtype]):
        pytest.skip(f"a float16 module's case (int4 weights): {dtype} modules have none")
    case = CASES[dtype][index]
    case.check(cuda_host.run_case(exe, index, case.buffers, tmp_path))
