"""What CUDA C needs to compile with g++ and run on the CPU, one std::thread per CUDA thread:
the shared core of the kernels' host emulations (tests/test_attention_cuda.py,
tests/test_fused_kernels_host.py). A block's threads run at once, blocks one after another, so
a static array stands for a block's shared memory; warp shuffles and barriers are std::barrier."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

SHIM_CORE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
using std::max;
using std::min;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct dim3 { unsigned x, y, z; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static thread_local int t_warp;
static std::barrier<>* g_block;
static std::vector<std::barrier<>*> g_warps;
static float g_exchange[64][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[t_warp]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float x, int mask) {
    const int lane = threadIdx.x & 31;
    g_exchange[t_warp][lane] = x;
    __syncwarp();
    const float r = g_exchange[t_warp][lane ^ mask];
    __syncwarp();
    return r;
}
inline float __shfl_sync(unsigned, float x, int src) {
    const int lane = threadIdx.x & 31;
    g_exchange[t_warp][lane] = x;
    __syncwarp();
    const float r = g_exchange[t_warp][src & 31];
    __syncwarp();
    return r;
}
template <class V> inline V __ldg(const V* p) { return *p; }
inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float half_to_f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline unsigned short f_to_half(float f) {
    _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h;
}
// a buffer read whole from a file, and written back
static void* slurp(const char* path, size_t n) {
    void* p = std::malloc(n ? n : 1);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(p, 1, n, f) != n) { std::fprintf(stderr, "reading %s\n", path); std::exit(2); }
    std::fclose(f);
    return p;
}
static void spit(const char* path, const void* p, size_t n) {
    FILE* f = std::fopen(path, "wb");
    std::fwrite(p, 1, n, f);
    std::fclose(f);
}
"""


def compile_host(cpp: Path, exe: Path) -> Path:
    """``cpp`` (kernel source with the shim) compiled by g++ into ``exe``; a skip where this
    g++ has no C++20 ``<barrier>``."""
    build = subprocess.run(
        ["g++", "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", "-o", str(exe), str(cpp)],
        capture_output=True, text=True,
    )  # fmt: skip
    if build.returncode:
        if "barrier" in build.stderr and "No such file" in build.stderr:
            pytest.skip("this g++ has no C++20 <barrier> for the host emulation")
        raise AssertionError(build.stderr[-4000:])
    return exe


def run_case(exe: Path, index: int, buffers: dict[str, np.ndarray], work: Path
             ) -> dict[str, np.ndarray]:  # fmt: skip
    """A kernel case's buffers written to ``work``, ``exe`` run on case ``index`` there, and
    the buffers read back."""
    for name, array in buffers.items():
        np.ascontiguousarray(array).tofile(work / f"{name}.bin")
    run = subprocess.run([str(exe), str(index), str(work)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return {name: np.fromfile(work / f"{name}.bin", a.dtype).reshape(a.shape)
            for name, a in buffers.items()}  # fmt: skip
