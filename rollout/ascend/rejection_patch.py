"""Replace vllm-ascend's Python-loop rejection-sampler fallbacks with sam.rejection.

vllm-ascend up to v0.13.0rc1 (v0.11.0 included) implements three helpers of
``vllm_ascend/sample/rejection_sampler.py`` as Python loops over requests and
tokens with a ``.item()`` host sync per token, which costs tens of
milliseconds per decoding step:

* ``expand_pytorch``: per-request values to per-draft-token values;
* ``sample_recovered_tokens_pytorch``: recovered token for every draft position;
* ``rejection_random_sample_pytorch``: accept / reject, recovered and bonus tokens.

``apply()`` swaps those module attributes for vectorised wrappers with the
same signatures. That works because the module's callers (``rejection_sample``,
``sample_recovered_tokens``, ``expand_batch_to_tokens``) look these names up in
the module's globals at call time. The wrappers produce the same tokens as the
loops given the same random numbers (``tests/test_ascend_rejection_contract.py``
checks this against the real v0.11.0 source).

A helper is replaced only when its source still contains a Python loop or a
``.item()`` call (or, if its source cannot be read, when the installed version
is at most v0.13.0rc1) and its parameters are the ones assumed here; newer,
already vectorised releases are left alone.

Ordering: ``apply()`` must run after vllm-ascend's own ``adapt_patch`` (its
platform / worker patches import and may re-bind this module), i.e. from the
plugin once vllm-ascend is set up, never at import time of this file.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import sys
import textwrap
from collections.abc import Callable

import torch

from sam.rejection import expand_batch_to_tokens, rejection_random_sample, sample_recovered_tokens

logger = logging.getLogger(__name__)

ASCEND_REJECTION_MODULE = "vllm_ascend.sample.rejection_sampler"
LAST_VERSION_WITH_LOOPS = "0.13.0rc1"


# ---------------------------------------------------------------------------
# Vectorised replacements, with vllm-ascend 0.11.0's exact signatures
# ---------------------------------------------------------------------------


def expand_pytorch_vectorised(
    output_ptr: torch.Tensor,  # [num_tokens]
    input_ptr: torch.Tensor,  # [batch_size]
    cu_num_tokens_ptr: torch.Tensor,  # [batch_size]
    replace_from: int | float,
    replace_to: int | float,
    MAX_NUM_TOKENS: int,  # noqa: N803 - vllm-ascend's name; unused, no per-request cap is needed
) -> None:
    """In place: ``output_ptr[t] = input_ptr[request of t]`` with ``replace_from -> replace_to``."""
    output_ptr.copy_(
        expand_batch_to_tokens(input_ptr, cu_num_tokens_ptr, output_ptr.shape[0], replace_from, replace_to)
    )


def sample_recovered_tokens_pytorch_vectorised(
    output_token_ids: torch.Tensor,  # [num_tokens]
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_token_ids: torch.Tensor,  # [num_tokens]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size] or None
    target_probs: torch.Tensor,  # [num_tokens, vocab_size]
    q: torch.Tensor,  # [batch_size, vocab_size] Exp(1) noise
    vocab_size: int,
    IS_NGRAM: bool = False,  # noqa: N803 - vllm-ascend's name
) -> None:
    """In place: ``output_token_ids[t] = argmax(residual_t / q[request of t])``.

    Unlike the loop, ``target_probs`` is never written to, not even temporarily.
    """
    del vocab_size  # implied by the tensors
    recovered = sample_recovered_tokens(
        cu_num_draft_tokens, draft_token_ids, None if IS_NGRAM else draft_probs, target_probs, q
    )
    output_token_ids.copy_(recovered)


def rejection_random_sample_pytorch_vectorised(
    output_token_ids: torch.Tensor,  # [batch_size, max_spec_len + 1]
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_token_ids: torch.Tensor,  # [num_tokens]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size] or None
    target_probs: torch.Tensor,  # [num_tokens, vocab_size]
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    recovered_token_ids: torch.Tensor,  # [num_tokens]
    uniform_probs: torch.Tensor,  # [num_tokens] float64
    is_greedy: torch.Tensor | None,  # [batch_size] bool
    max_spec_len: int,
    vocab_size: int,
    IS_NGRAM: bool = False,  # noqa: N803 - vllm-ascend's name
) -> None:
    """In place on the non-greedy rows of ``output_token_ids``; same tokens as the loop."""
    del max_spec_len, vocab_size  # implied by the tensors
    rejection_random_sample(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        None if IS_NGRAM else draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
    )


# vllm-ascend function name -> replacement. The replacement's parameter names
# are the ones the v0.11.0 original has; apply() refuses any other signature.
REPLACEMENTS: dict[str, Callable[..., None]] = {
    "expand_pytorch": expand_pytorch_vectorised,
    "sample_recovered_tokens_pytorch": sample_recovered_tokens_pytorch_vectorised,
    "rejection_random_sample_pytorch": rejection_random_sample_pytorch_vectorised,
}


def parameter_names(function: Callable[..., object]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


# ---------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------


def source_has_python_loop(function: Callable[..., object]) -> bool | None:
    """True if the function's source has a ``for``/``while`` loop or an ``.item()`` call; None if unreadable."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item":
            return True
    return False


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("vllm_ascend")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.import_module("vllm_ascend._version").__version__
    except (ImportError, AttributeError):
        return None


def version_has_loops(version: str | None) -> bool:
    """Whether a release of this version ships the loop fallbacks (unknown versions: no)."""
    if version is None:
        return False
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return False
    try:
        return Version(version) <= Version(LAST_VERSION_WITH_LOOPS)
    except InvalidVersion:
        return False


def needs_replacement(function: Callable[..., object], version: str | None) -> bool:
    has_loop = source_has_python_loop(function)
    return version_has_loops(version) if has_loop is None else has_loop


def vllm_ascend_present() -> bool:
    if "vllm_ascend" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("vllm_ascend") is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def apply() -> bool:
    """Install the vectorised helpers where vllm-ascend still has loops.

    Returns True when vllm-ascend's module now uses at least one of our helpers
    (installed by this call or an earlier one), False otherwise, including
    quietly when vllm-ascend is not installed. Idempotent.
    """
    if not vllm_ascend_present():
        return False
    try:
        module = importlib.import_module(ASCEND_REJECTION_MODULE)
    except Exception as error:  # vllm-ascend is present but its sampler does not import here
        logger.warning("vllm-ascend rejection sampler not importable (%s); not patched", error)
        return False

    version = installed_version()
    in_place, replaced_now = [], []
    for name, replacement in REPLACEMENTS.items():
        original = getattr(module, name, None)
        if original is None:
            continue
        if original is replacement:
            in_place.append(name)
            continue
        if not callable(original) or parameter_names(original) != parameter_names(replacement):
            logger.warning("vllm-ascend %s: %s has an unexpected signature; left alone", version, name)
            continue
        if needs_replacement(original, version):
            setattr(module, name, replacement)
            in_place.append(name)
            replaced_now.append(name)

    if replaced_now:
        logger.info(
            "vllm-ascend %s: replaced Python-loop rejection-sampler helpers with vectorised ones: %s",
            version,
            ", ".join(replaced_now),
        )
    elif not in_place:
        logger.info(
            "vllm-ascend %s: rejection-sampler helpers are already vectorised or absent; left alone",
            version,
        )
    return bool(in_place)
