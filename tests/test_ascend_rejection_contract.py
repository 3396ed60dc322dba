"""benchmarks.ascend_rejection_helpers against the real vllm-ascend 0.11.0 source: the vectorised
wrappers that benchmarks/bench_rejection.py times against vllm-ascend's Python-loop helpers (once a
patch on vllm-ascend up to 0.13.0rc1, removed: docs/patches.md).

The 0.11.0 wheel is fetched once with pip (no dependencies) into
``~/.cache/sam-spec-rollout/`` and only ``vllm_ascend/sample/rejection_sampler.py``
is read from it; nothing is installed. Tests that need it skip, saying why,
when the download is impossible (e.g. offline).

Checked: the loop helpers exist with the parameter names the wrappers assume, and the wrappers give
the same tokens as the loops.
"""

from __future__ import annotations

import ast
import functools
import inspect
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import require

from benchmarks.ascend_rejection_helpers import REPLACEMENTS

ASCEND_VERSION = "0.11.0"
SAMPLER_PATH_IN_WHEEL = "vllm_ascend/sample/rejection_sampler.py"
CACHE_DIR = Path.home() / ".cache" / "sam-spec-rollout" / f"vllm-ascend-{ASCEND_VERSION}"
# The wheel is pure Python plus platform binaries; pin a platform so any host can fetch it.
PIP_DOWNLOAD = [
    sys.executable,
    "-m",
    "pip",
    "download",
    f"vllm-ascend=={ASCEND_VERSION}",
    "--no-deps",
    "--only-binary",
    ":all:",
    "--platform",
    "manylinux_2_24_x86_64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    "--timeout",
    "30",
    "--retries",
    "1",
    "--quiet",
    "--dest",
]
# Callers in the 0.11.0 module that must reach each patched helper through a global name lookup.
CALLER_OF = {
    "expand_pytorch": "expand_batch_to_tokens",
    "sample_recovered_tokens_pytorch": "sample_recovered_tokens",
    "rejection_random_sample_pytorch": "rejection_sample",
}


@functools.cache
def download_problem() -> str | None:
    """Fetch the wheel into CACHE_DIR once per session; the reason it failed, or None."""
    if list(CACHE_DIR.glob("vllm_ascend-*.whl")):
        return None
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run([*PIP_DOWNLOAD, str(CACHE_DIR)], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot download vllm-ascend {ASCEND_VERSION}: {error}"
    if result.returncode != 0 or not list(CACHE_DIR.glob("vllm_ascend-*.whl")):
        return f"cannot download vllm-ascend {ASCEND_VERSION} with pip: {result.stderr.strip()[-300:]}"
    return None


def fetch_sampler_source() -> str:
    """Text of vllm-ascend 0.11.0's rejection_sampler.py, downloading the wheel on first use."""
    extracted = CACHE_DIR / "rejection_sampler.py"
    if not extracted.exists():
        if (problem := download_problem()) is not None:
            require(False, problem)
        with zipfile.ZipFile(next(CACHE_DIR.glob("vllm_ascend-*.whl"))) as wheel:
            extracted.write_bytes(wheel.read(SAMPLER_PATH_IN_WHEEL))
    return extracted.read_text()


@pytest.fixture(scope="module")
def sampler_source() -> str:
    return fetch_sampler_source()


@pytest.fixture(scope="module")
def sampler_tree(sampler_source: str) -> ast.Module:
    return ast.parse(sampler_source)


def top_level_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def loop_functions_source(source: str, tree: ast.Module) -> str:
    """``import torch`` plus the module's constants and the patched functions, nothing vLLM."""
    lines = source.splitlines()
    wanted = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in REPLACEMENTS)
        or (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets))
    ]
    parts = ["import torch", ""] + ["\n".join(lines[node.lineno - 1 : node.end_lineno]) + "\n" for node in wanted]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def ascend_loops(sampler_source: str, sampler_tree: ast.Module) -> dict:
    namespace: dict = {}
    exec(compile(loop_functions_source(sampler_source, sampler_tree), "vllm_ascend_0_11_0_loops", "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------------
# Names and signatures
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", REPLACEMENTS)
def test_patched_function_exists_with_assumed_parameters(sampler_tree: ast.Module, name: str) -> None:
    function = top_level_functions(sampler_tree).get(name)
    assert function is not None, f"vllm-ascend {ASCEND_VERSION} has no {name}"
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    assert tuple(names) == tuple(inspect.signature(REPLACEMENTS[name]).parameters)
    assert arguments.vararg is None and arguments.kwarg is None


def test_placeholder_token_matches(ascend_loops: dict) -> None:
    from sam_rollout.rejection import PLACEHOLDER_TOKEN_ID

    assert ascend_loops["PLACEHOLDER_TOKEN_ID"] == PLACEHOLDER_TOKEN_ID


# ---------------------------------------------------------------------------
# Token for token against the original loops
# ---------------------------------------------------------------------------


def ascend_style_inputs(seed: int, with_draft_probs: bool, vocab_size: int = 32) -> dict:
    """Inputs as vllm-ascend 0.11.0's rejection_sample builds them for its helpers."""
    generator = torch.Generator().manual_seed(seed)
    num_draft_tokens = [3, 0, 2, 4, 1, 0, 4, 3]
    batch_size, num_tokens = len(num_draft_tokens), sum(num_draft_tokens)
    drafts = torch.randint(0, vocab_size, (num_tokens,), generator=generator, dtype=torch.int32)
    logits = torch.randn(num_tokens, vocab_size, generator=generator) * 2
    favoured = torch.rand(num_tokens, generator=generator) < 0.7
    logits[torch.arange(num_tokens)[favoured], drafts[favoured].long()] += 5
    draft_probs = None
    if with_draft_probs:
        draft_probs = (torch.randn(num_tokens, vocab_size, generator=generator) * 2).softmax(-1)
    return dict(
        num_draft_tokens=num_draft_tokens,
        cu_num_draft_tokens=torch.tensor(num_draft_tokens).cumsum(0).to(torch.int32),
        draft_token_ids=drafts,
        draft_probs=draft_probs,
        target_probs=logits.softmax(-1),
        bonus_token_ids=torch.randint(0, vocab_size, (batch_size, 1), generator=generator),
        uniform_probs=torch.rand(num_tokens, dtype=torch.float64, generator=generator),
        q=torch.empty(batch_size, vocab_size).exponential_(generator=generator),
        is_greedy=torch.tensor([False, False, True, False, False, True, False, False]),
        max_spec_len=max(num_draft_tokens),
        vocab_size=vocab_size,
    )


def run_recovered(function, inputs: dict) -> torch.Tensor:
    output = torch.empty_like(inputs["draft_token_ids"])
    target_probs = inputs["target_probs"].clone()
    function(
        output,
        inputs["cu_num_draft_tokens"],
        inputs["draft_token_ids"],
        inputs["draft_probs"],
        target_probs,
        inputs["q"],
        inputs["vocab_size"],
        IS_NGRAM=inputs["draft_probs"] is None,
    )
    assert torch.equal(target_probs, inputs["target_probs"])  # restored / untouched
    return output


def run_random_sample(function, inputs: dict, recovered: torch.Tensor) -> torch.Tensor:
    batch_size = len(inputs["num_draft_tokens"])
    output = torch.full((batch_size, inputs["max_spec_len"] + 1), -1, dtype=torch.int32)
    output[inputs["is_greedy"], 0] = 77  # greedy rows must stay as they are
    function(
        output,
        inputs["cu_num_draft_tokens"],
        inputs["draft_token_ids"],
        inputs["draft_probs"],
        inputs["target_probs"],
        inputs["bonus_token_ids"],
        recovered,
        inputs["uniform_probs"],
        inputs["is_greedy"],
        inputs["max_spec_len"],
        inputs["vocab_size"],
        IS_NGRAM=inputs["draft_probs"] is None,
    )
    return output


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["ngram", "draft-probs"])
@pytest.mark.parametrize("seed", range(5))
def test_wrappers_match_0_11_0_loops_token_for_token(ascend_loops: dict, with_draft_probs: bool, seed: int) -> None:
    inputs = ascend_style_inputs(seed, with_draft_probs)

    original_recovered = run_recovered(ascend_loops["sample_recovered_tokens_pytorch"], inputs)
    ours_recovered = run_recovered(REPLACEMENTS["sample_recovered_tokens_pytorch"], inputs)
    assert torch.equal(ours_recovered, original_recovered)

    original = run_random_sample(ascend_loops["rejection_random_sample_pytorch"], inputs, original_recovered)
    ours = run_random_sample(REPLACEMENTS["rejection_random_sample_pytorch"], inputs, original_recovered)
    assert torch.equal(ours, original)
    assert (ours[~inputs["is_greedy"]] != 77).all()


@pytest.mark.parametrize(
    "values", [torch.tensor([0.7, -1.0, 1.3, -1.0]), torch.tensor([5, 0, 9, 2])], ids=["temperature", "top-k"]
)
def test_expand_matches_0_11_0_loop(ascend_loops: dict, values: torch.Tensor) -> None:
    cu_num_tokens = torch.tensor([2, 2, 5, 6])
    for replace_from, replace_to in [(-1, 1), (0, 0)]:
        expected, ours = values.new_empty(6), values.new_empty(6)
        ascend_loops["expand_pytorch"](
            expected, values, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=ascend_loops["MAX_SPEC_LEN"]
        )
        REPLACEMENTS["expand_pytorch"](ours, values, cu_num_tokens, replace_from, replace_to, 32)
        assert torch.equal(ours, expected)
