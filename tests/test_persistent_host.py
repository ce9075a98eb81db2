"""The persistent program's interpreter (bench/persistent_cuda.py) on the CPU: every kernel
case of tests/fused_kernel_cases.py recorded as a program (its launches in order, argument
slots as the engine's ctypes values give them) and run by ``pk_program`` in one persistent
block of g++ threads (tests/test_fused_kernels_host.py's emulation), each kernel's blocks
walked as virtual blocks, with fewer threads than the persistent block where its own block is
smaller, and checked against the numpy references as the direct launches are. What only a GPU
shows (the grid barrier between resident blocks, the cooperative launch) is
tests/test_fused_gpu.py's."""

from __future__ import annotations

import ctypes
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from edgeomni.plugins import decoder_cuda as dc

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import cuda_host  # noqa: E402
import fused_kernel_cases as cases  # noqa: E402
import persistent_cuda as pc  # noqa: E402
from test_fused_kernels_host import MAIN, SHIM  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ for the emulation")

MIN_THREADS = 256  # the persistent block at least: smaller kernels run on part of it

@dataclass
class CopyCase(cases.KernelCase):
    """Device copies between a case's buffers: ((dst, offset), (src, offset), bytes)."""

    copies: list[tuple[tuple[str, int], tuple[str, int], int]] = field(default_factory=list)


def _copy_case() -> CopyCase:
    """pk_copy: 16-byte words where both ends and the length allow, else bytes; a copy of
    more bytes than a step's blocks and threads take at once; a copy reading the last one's
    output (the steps in order)."""
    src = np.random.default_rng(1).integers(0, 256, 70000).astype(np.uint8)
    copies = [(("a", 0), ("src", 0), 65536), (("b", 3), ("src", 5), 1001),
              (("c", 16), ("b", 0), 2000)]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        want = {"a": np.zeros(70000, np.uint8), "b": np.zeros(4096, np.uint8),
                "c": np.zeros(4096, np.uint8)}  # fmt: skip
        want["a"][:65536] = src[:65536]
        want["b"][3:1004] = src[5:1006]
        want["c"][16:2016] = want["b"][:2000]
        for name, array in want.items():
            np.testing.assert_array_equal(got[name], array, err_msg=name)

    buffers = {"src": src, "a": np.zeros(70000, np.uint8), "b": np.zeros(4096, np.uint8),
               "c": np.zeros(4096, np.uint8)}  # fmt: skip
    return CopyCase("copies", buffers, [], check, copies)


# float16 modules: their cases are float32's and the int4 ones (the module differs in macros)
CASES = [*cases.all_cases("float16", rows=(1, 3, 17), topk=((1, 384, 64), (2, 9000, 8))),
         _copy_case()]


def _value(arg: cases.Arg, names: list[str]) -> object:
    """A case's argument as the engine passes it: a buffer j as the stand-in address
    (j + 1) << 32 (plus an offset in the low bits), which the emulation's main relocates."""
    kind, *rest = arg
    if kind == "buf":
        return ctypes.c_void_p((names.index(rest[0]) + 1) << 32)
    if kind == "null":
        return ctypes.c_void_p(None)
    return {"f32": ctypes.c_float, "i32": ctypes.c_int32, "i64": ctypes.c_int64}[kind](rest[0])


def _program(source: str, all_cases: list[cases.KernelCase]) -> tuple[pc.Program, list[range]]:
    """One program of every case's launches, and each case's steps in it."""
    program, spans = pc.Program(), []
    for case in all_cases:
        names = list(case.buffers)
        first = len(program.steps)
        for launch in case.launches:
            program.launch(source, launch.kernel, launch.grid, launch.block, launch.shared,
                           [_value(a, names) for a in launch.args])  # fmt: skip
        for dst, src, nbytes in getattr(case, "copies", ()):
            program.copy(*(((names.index(b) + 1) << 32) + at for b, at in (dst, src)), nbytes)
        spans.append(range(first, len(program.steps)))
    return program, spans


def _source(program: pc.Program, spans: list[range], all_cases: list[cases.KernelCase]) -> str:
    """The program's module after the emulation's shim, and a main that runs case argv[1]'s
    steps on the files in argv[2]."""
    table, pointers = program.table(), program.pointer_slots()
    out = [program.source_text("#define PK_HOST 1\n" + SHIM), MAIN,
           "int main(int argc, char** argv) {", "  const int which = std::atoi(argv[1]);",
           "  const std::string dir = argv[2];", "  pk_host_init();",
           f"  const int stride = {program.stride};"]  # fmt: skip
    for i, (case, span) in enumerate(zip(all_cases, spans, strict=True)):
        out.append(f"  if (which == {i}) {{")
        names = list(case.buffers)
        sizes = [case.buffers[n].nbytes for n in names]
        loads = ", ".join(f'slurp((dir + "/{n}.bin").c_str(), {s})'
                          for n, s in zip(names, sizes, strict=True))  # fmt: skip
        out.append(f"    void* b[] = {{{loads}}};")
        words = ", ".join(f"{int(w)}ULL" for w in table[span.start:span.stop].reshape(-1))
        out.append(f"    unsigned long long t[] = {{{words}}};")
        for step, col in pointers:
            if step in span:
                at = (step - span.start) * program.stride + col
                out.append(f"    if (t[{at}]) t[{at}] = (unsigned long long)b[(t[{at}] >> 32) - 1]"
                           f" + (t[{at}] & 0xffffffffULL);")  # fmt: skip
        threads = max(MIN_THREADS, *(program.steps[s][2] for s in span))
        out.append("    unsigned bar[2] = {0, 0};")
        out.append(f"    grid(dim3{{1, 1, 1}}, {threads}, [&] {{ pk_program(t, {len(span)}, "
                   "stride, bar); });")  # fmt: skip
        for j, (name, size) in enumerate(zip(names, sizes, strict=True)):
            out.append(f'    spit((dir + "/{name}.bin").c_str(), b[{j}], {size});')
        out.append("  }")
    out.append("  return 0;\n}\n")
    return "\n".join(out)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    program, spans = _program(dc.Variant("float16", "float16").source(), CASES)
    work = tmp_path_factory.mktemp("persistent")
    cpp, exe = work / "program.cpp", work / "program"
    cpp.write_text(_source(program, spans, CASES))
    return cuda_host.compile_host(cpp, exe)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_a_kernel_run_by_the_persistent_program_matches_its_reference(emulator, index,
                                                                      tmp_path) -> None:  # fmt: skip
    case = CASES[index]
    case.check(cuda_host.run_case(emulator, index, case.buffers, tmp_path))
