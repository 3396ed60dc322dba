"""Run a command as on an x86 CPU without AVX-512: vLLM's ``_C_AVX2`` kernels, torch's, oneDNN's and MKL's
AVX2 code, on a machine that has AVX-512.

    python -m testkit.cpu_isa avx2 -- python -m benchmarks.demo_engine --json results/demo_avx2.json

vLLM picks its CPU kernel library by ``torch.cpu._is_avx512_supported()`` (and its BF16 variant) in every
process it starts, so a ``sitecustomize`` on PYTHONPATH (``avx2_site/``) answers False there; environment
variables cap torch's own kernels (ATEN_CPU_CAPABILITY), oneDNN's and MKL's. numba still compiles SAM's
kernels for the host: code built for its own host cannot fault on it. What this does not give is another
CPU's clock, caches or memory: a ratio measured so says what the AVX2 code paths cost on this core, not
what a given AVX2 machine runs at.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AVX2_SITE = Path(__file__).resolve().parent / "avx2_site"
ISAS = ("host", "avx2")
AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def host_has_avx512() -> bool:
    """From /proc/cpuinfo (imports no torch): False where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " avx512f" in line for line in text.splitlines())


def isa_env(isa: str, env: dict | None = None) -> dict:
    """``env`` (default os.environ) for a process that runs as on ``isa``: "host" leaves it as it is."""
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {ISAS}, got {isa!r}")
    out = dict(os.environ if env is None else env)
    if isa == "host":
        return out
    out.update(AVX2_CAPS)
    old = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join([str(AVX2_SITE)] + old)  # rollout, which the site imports, is installed
    return out


def kernel_libraries_for(isa: str) -> tuple[str, ...]:
    """The vLLM CPU kernel libraries a process run as on ``isa`` here loads: one of these."""
    if isa == "avx2" or not host_has_avx512():
        return ("_C_AVX2",)
    return ("_C", "_C_AVX512")  # _C: with AVX-512 BF16


def cpu_kernel_library() -> str | None:
    """Which of vLLM's CPU kernel libraries this process has loaded (``_C``, ``_C_AVX512``, ``_C_AVX2``),
    from its memory map; None if none is (or on a system without /proc)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        parent, name = os.path.split(fields[-1] if fields else "")
        if os.path.basename(parent) == "vllm" and name.startswith("_C") and name.endswith(".so"):
            return name.split(".")[0]
    return None


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ISAS:
        isas = ",".join(ISAS)
        raise SystemExit(f"usage: python -m testkit.cpu_isa {{{isas}}} [--] (-m MODULE | SCRIPT | COMMAND) [ARGS...]")
    isa, cmd = argv[0], argv[1:]
    if cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("testkit.cpu_isa: no command given")
    if cmd[0] == "-m" or cmd[0].endswith(".py"):  # a module or a script runs under this interpreter (the venv)
        cmd = [sys.executable, *cmd]
    try:
        os.execvpe(cmd[0], cmd, isa_env(isa))
    except FileNotFoundError:
        raise SystemExit(f"testkit.cpu_isa: no such command: {cmd[0]}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
