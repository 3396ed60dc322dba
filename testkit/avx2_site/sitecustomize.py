"""Loaded at start-up by every Python process that ``testkit.cpu_isa`` runs with ``avx2``: torch, and so
vLLM, see a CPU without AVX-512 or AMX, and vLLM loads its ``_C_AVX2`` kernels (``testkit/cpu_isa.py``)."""

import sys

from sam_rollout.import_hooks import after_import

CPU_CHECKS = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_avx512_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _without_avx512() -> None:
    cpu = sys.modules["torch.cpu"]  # torch itself may still be importing: no attribute access on torch
    for name in CPU_CHECKS:
        if hasattr(cpu, name):
            setattr(cpu, name, lambda: False)


after_import("torch.cpu", _without_avx512)
