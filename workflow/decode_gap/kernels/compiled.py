"""What a Triton kernel compiles to for a named GPU architecture, without a GPU (Triton's own ptxas and cuobjdump,
from its wheel), and how many of its programs an SM holds at once.

A kernel change can be judged on a CPU host before spending device time: a form that spills, or whose registers
drop a program an SM, is unlikely to be faster, and a plan that counts resident programs (fp4moe's waves, the
stream-K grids) goes stale when the registers move. The tests, `benchmarks/kernel_resources.py` and the device
probes compile through here."""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SmLimits:
    """An SM's resources for the CUDA occupancy rules (the CUDA C++ Programming Guide's table of technical
    specifications per compute capability)."""

    registers: int = 65536
    threads: int = 2048
    shared: int = 233472  # bytes a program may reach in all, an SM (228 KiB on sm_90 and sm_100)
    programs: int = 32


# Hopper, datacenter Blackwell, and the RTX PRO 6000 / GeForce Blackwell (sm_120: 48 warps and 100 KiB an SM)
ARCH_LIMITS = {90: SmLimits(), 100: SmLimits(), 120: SmLimits(threads=1536, shared=102400)}


def programs_per_sm(registers: int, warps: int, shared: int = 0, limits: SmLimits = SmLimits()) -> int:
    """Programs of `warps` warps that an SM holds at once: the least of its program, thread, register and shared
    memory limits, registers allocated 256 a warp. Written out because the driver's occupancy query needs a GPU and
    this is asked of kernels compiled here, for a GPU this host has not."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    fits = [limits.programs, limits.threads // (32 * warps), limits.registers // (per_warp * warps)]
    if shared:
        fits.append(limits.shared // shared)
    return max(1, min(fits))


@dataclass(frozen=True)
class Compiled:
    """A kernel compiled for sm_`arch`: registers a thread, stack (spills) and shared memory bytes, its SASS one
    instruction a line (addresses stripped, so two builds diff line by line), its TTGIR and PTX, and `loop`: the
    instructions of its longest loop (loop_instructions), what a thread issues an iteration of the main loop."""

    arch: int
    warps: int
    registers: int
    stack: int
    shared: int
    sass: tuple[str, ...]
    ttgir: str
    ptx: str
    loop: int = 0

    @property
    def programs_per_sm(self) -> int:
        return programs_per_sm(self.registers, self.warps, self.shared, ARCH_LIMITS.get(self.arch, SmLimits()))


def loop_instructions(sass: str) -> int:
    """The instructions from a backward branch's target to the branch, the longest such span in cuobjdump's SASS
    (0 without a loop). For a kernel whose work is one loop, its instructions an iteration: divided by the bytes a
    thread loads an iteration, the issue cost of a byte, which a decode-bound kernel is bound by."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*)", line) for line in sass.splitlines()) if m]
    longest = 0
    for addr, ins in lines:
        branch = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", ins)
        if branch and int(branch.group(1), 16) <= addr:
            start = int(branch.group(1), 16)
            longest = max(longest, sum(1 for a, _ in lines if start <= a <= addr))
    return longest


def _tool(name: str) -> Path:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not tool.exists():
        raise FileNotFoundError(f"{tool}: this Triton wheel carries no {name}")
    return tool


def with_defaults(fn, constexprs: dict[str, Any]) -> dict[str, Any]:
    """`constexprs` and, for each constexpr argument of the @triton.jit `fn` not among them, its default, as a launch
    passes it (an argument left out would otherwise be compiled as a runtime integer: other code than the GPU runs,
    or none where a branch on it defines a value another branch reads)."""
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    return {**defaults, **constexprs}


def compile_for(fn, constexprs: dict[str, Any], pointers: dict[str, str], arch: int = 90, warps: int = 4,
                unaligned: tuple[str, ...] = ("M",), floats: tuple[str, ...] = ()) -> Compiled:
    """Compile the @triton.jit `fn` for sm_`arch` with `constexprs` by name (the others at their defaults). Every
    other argument is a pointer of the type `pointers` names, an fp32 if in `floats`, else an i32; as the runtime
    specialises the model's shapes, every pointer and integer is 16-byte aligned (a multiple of 16) but those in
    `unaligned` (without it the weight loads are 32-bit and the registers are not the GPU's)."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default; set so that it does not warn
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    unknown = set(constexprs) - set(names)
    if unknown:
        raise ValueError(f"{fn.fn.__name__} has no argument {sorted(unknown)}")
    constexprs = with_defaults(fn, constexprs)
    sig = {n: "constexpr" if n in constexprs else pointers.get(n) or ("fp32" if n in floats else "i32")
           for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in constexprs and n not in unaligned and n not in floats}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    tool = _tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    field = lambda key: int(re.search(rf"{key}:(\d+)", usage).group(1))  # noqa: E731
    code = tuple(re.sub(r"/\*[0-9a-f]{4}\*/", "", line).split(";")[0].strip() for line in sass.splitlines()
                 if re.match(r"\s+/\*[0-9a-f]{4}\*/", line))
    return Compiled(arch=arch, warps=warps, registers=field("REG"), stack=field("STACK"), shared=field("SHARED"),
                    sass=code, ttgir=kernel.asm.get("ttgir", ""), ptx=kernel.asm.get("ptx", ""),
                    loop=loop_instructions(sass))
