"""Engine plumbing without an engine: SamStepper and SamSettings against vLLM-shaped arrays.

These run in the plain unit-test suite (no vLLM needed); the real-engine tests are in
tests/test_engine_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sam_rollout.drafter.auto_switch import JUMP_KEEP
from sam_rollout.drafter.prompt_store import prompt_key
from sam_rollout.metrics import SamStepTracker
from sam_rollout.settings import SETTINGS_KEY, SamSettings
from sam_rollout.stepper import SamStepper, compile_kernels

W = 64  # row width (max_model_len)
ROOT = Path(__file__).resolve().parents[1]


class Batch:
    """A minimal stand-in for vLLM's InputBatch: rows, lengths, prompt lengths, req_ids."""

    def __init__(self, n_rows=8, width=W):
        self.tok = np.zeros((n_rows, width), dtype=np.int32)
        self.len = np.zeros(n_rows, dtype=np.int32)
        self.npt = np.zeros(n_rows, dtype=np.int32)
        self.req_ids: list = []

    def add(self, rid, prompt):
        i = len(self.req_ids)
        self.req_ids.append(rid)
        self.tok[i, : len(prompt)] = prompt
        self.len[i] = self.npt[i] = len(prompt)
        return i

    def append(self, i, toks):
        L = self.len[i]
        self.tok[i, L : L + len(toks)] = toks
        self.len[i] += len(toks)

    def remove(self, i):
        """vLLM's condense(): the last row moves into the hole."""
        last = len(self.req_ids) - 1
        for a in (self.tok, self.len, self.npt):
            a[i] = a[last]
        self.req_ids[i] = self.req_ids[last]
        self.req_ids.pop()


def step(st, b, sampled, **kw):
    return st.step(b.req_ids, b.npt, sampled, b.len, b.tok, **kw)


def settings(**kw):
    return SamSettings.from_mapping(kw.pop("k", 3), kw)


PERIOD = [5, 6, 7, 8, 9]


def test_drafts_follow_rows_when_rows_move():
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", [1, 2, 3] + PERIOD * 2)  # periodic: the next tokens are predictable
    b.add("b", [40, 41, 42, 43, 44, 40, 41])
    b.add("c", [20, 21])
    out = step(st, b, [[9], [41], [21]])
    assert out[0] == [5, 6, 7]
    assert out[1] == [42, 43, 44]
    # c has no repeat yet: no draft
    assert out[2] == []
    # a finishes; condense moves c into row 0; b stays at row 1
    st.finish("a")
    b.remove(0)
    assert b.req_ids == ["c", "b"]
    b.append(1, [42])
    out = step(st, b, [[21], [42]])
    assert out[1] == [43, 44, 40]
    assert "a" not in st.drafter and len(st.drafter) == 2


def test_never_more_than_k_and_not_past_max_model_len():
    st = SamStepper(settings(k=4, switch=None, length_policy="fixed"), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 4)
    out = step(st, b, [[9]])
    assert len(out[0]) == 4
    out = step(st, b, [[9]], k=2)  # the scheduler's per-step K caps it further
    assert len(out[0]) == 2
    st2 = SamStepper(settings(k=4, switch=None, length_policy="fixed"), max_model_len=22)
    out = step(st2, b, [[9]])
    assert len(out[0]) == 2  # 20 tokens, max_model_len 22


def test_no_draft_for_partial_prefill_rows_but_state_is_kept():
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 3)
    b.add("p", PERIOD * 3 + [1])  # still prefilling: no sampled token
    out = step(st, b, [[9], []])
    assert out[0] and out[1] == []
    assert st.drafter.num_tokens("p") == 16


def test_threshold_turns_speculation_off_and_keeps_state_current():
    st = SamStepper(settings(switch=2), max_model_len=W)
    b = Batch()
    for r in "abc":
        b.add(r, PERIOD * 2)
    out = step(st, b, [[9]] * 3)  # 3 scheduled > 2: off
    assert out == [[], [], []]
    for i in range(3):
        b.append(i, [5, 6])
    out = step(st, b, [[6]] * 3, num_scheduled_reqs=2)  # on
    assert out[0] == [7, 8, 9]
    assert st.drafter.num_tokens("a") == 12  # the tokens of the off step were fed
    m = st.metrics.as_dict()
    assert m["steps"] == 2 and m["steps_on"] == 1 and m["frac_steps_on"] == 0.5


def test_acceptance_counting():
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 2)
    assert step(st, b, [[9]])[0] == [5, 6, 7]
    b.append(0, [5, 6, 1])  # two accepted, then a correction token
    step(st, b, [[5, 6, 1]])
    m = st.metrics.as_dict()
    assert m["num_measured_drafts"] == 1 and m["num_accepted_tokens"] == 2
    assert m["mean_acceptance_length"] == 3.0
    assert m["acceptance_per_pos"] == [1.0, 1.0, 0.0]


def test_acceptance_follows_the_request_when_rows_move():
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 2)
    b.add("c", [20, 21, 22])
    b.add("b", [40, 41, 42, 43, 44, 40, 41])
    assert step(st, b, [[9], [22], [41]]) == [[5, 6, 7], [], [42, 43, 44]]
    st.finish("a")  # its draft is never measured
    b.remove(0)  # condense: b moves into a's row
    assert b.req_ids == ["b", "c"]
    b.append(0, [42, 1])  # one of b's tokens accepted, then a correction token
    b.append(1, [23])
    step(st, b, [[42, 1], [23]])
    m = st.metrics.as_dict()
    assert m["num_drafts"] == 2 and m["num_draft_tokens"] == 6
    assert m["num_measured_drafts"] == 1 and m["num_accepted_tokens"] == 1
    assert m["acceptance_per_pos"] == [1.0, 0.0, 0.0]


def test_a_finished_request_id_that_returns_in_the_same_row_starts_from_its_new_prompt():
    """verl resumes a partial rollout under its request id with a longer prompt: after ``finish`` the
    same batch of ids is a new request in that row, not last step's."""
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 2)
    assert step(st, b, [[9]]) == [[5, 6, 7]]
    st.finish("a")
    b.remove(0)
    b.add("a", [30, 31, 32, 33, 30, 31, 32])
    assert step(st, b, [[32]]) == [[33, 30, 31]]
    assert st.metrics.started == 2 and st.drafter.num_tokens("a") == 7


def test_siblings_share_a_group_by_prompt():
    st = SamStepper(settings(switch=None, group_aware=True), max_model_len=W)
    b = Batch()
    prompt = [1, 2, 3]
    b.add("s0", prompt)
    b.add("s1", prompt)
    b.append(0, [30, 31, 32, 33, 34])  # sibling 0 wrote a response
    b.append(1, [30])
    out = step(st, b, [[34], [30]])
    assert out[1] == [31, 32, 33]  # drafted from its sibling's text
    assert prompt_key(np.array(prompt)) == prompt_key(np.array(prompt, dtype=np.int32))  # any int dtype

    st = SamStepper(settings(switch=None, group_aware=False), max_model_len=W)
    assert step(st, b, [[34], [30]])[1] == []


def test_rows_that_go_backwards_are_rebuilt(caplog):
    st = SamStepper(settings(switch=None), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 2)
    b.append(0, PERIOD)
    step(st, b, [[9]])
    b.len[0] -= 3  # cannot happen in vLLM today; must not kill the engine
    with caplog.at_level("WARNING"):
        out = step(st, b, [[6]])
    assert st.drafter.num_tokens("a") == 12  # rebuilt from its prompt, then synced to the row
    assert out[0] == [7, 8, 9]  # ... 5 6 -> drafts from the rebuilt text
    assert "rebuilt 1 request" in caplog.text


def test_the_prompt_store_carries_a_finished_response_to_the_next_visit():
    """The engine path: a request's response is kept under its prompt when it finishes, and the next
    request with that prompt (RL's next visit) drafts from it; a rebuilt row stores nothing."""
    prompt, response = [1, 2, 3], [30, 31, 32, 33, 34, 35]  # no repeats: only the store can draft
    st = SamStepper(settings(switch=None, prompt_store=True), max_model_len=W)
    b = Batch()
    b.add("visit1", prompt)
    b.append(0, response)
    step(st, b, [[35]])
    b.len[0] -= 2  # a row that went backwards is rebuilt, not finished: nothing is stored
    step(st, b, [[33]])
    assert st.snapshot()["prompt_store"]["added_responses"] == 0
    b.append(0, response[-2:])
    step(st, b, [[35]])
    st.finish("visit1")
    b.remove(0)
    b.add("visit2", prompt)
    b.append(0, response[:1])
    assert step(st, b, [[30]])[0] == response[1:4]
    stats = st.snapshot()["prompt_store"]
    assert (stats["added_responses"], stats["tokens"]) == (1, len(response))
    assert (stats["hits"], stats["misses"]) == (1, 2)  # visit1 and its rebuild found nothing
    assert "prompt_store" not in SamStepper(settings(), max_model_len=W).snapshot()  # off by default
    metrics = SamStepTracker().step_metrics({"engine0": st.snapshot()})
    assert metrics["rollout/sam_prompt_store_hit_fraction"] == pytest.approx(1 / 3)
    assert metrics["rollout/sam_prompt_store_bytes"] == stats["nbytes"] > 4 * len(response)


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"switch": -1}, "switch"),
        ({"switch": "8"}, "switch"),
        ({"threshold": 8}, "threshold"),  # a removed name: unknown
        ({"min_match": 0}, "min_match"),
        ({"length_policy": "long"}, "length_policy"),
        ({"group_aware": "yes"}, "group_aware"),
        ({"k": 3}, "num_speculative_tokens"),
        ({"tresh": 3}, "tresh"),
        ({"log_interval_s": -1}, "log_interval_s"),
        ({"continuation": "latest"}, "continuation"),
        ({"prompt_store_bytes": 0}, "prompt_store_bytes"),
    ],
)
def test_bad_settings_name_the_setting(raw, field):
    with pytest.raises(ValueError, match=field) as e:
        SamSettings.from_mapping(3, raw)
    assert SETTINGS_KEY in str(e.value) or field == "num_speculative_tokens"


def test_settings_defaults_and_null_threshold():
    s = SamSettings.from_mapping(3, None)
    assert (s.draft.k, s.switch, s.draft.min_match, s.draft.length_policy) == (3, 8, 1, "match")
    assert s.draft.group_aware is True
    assert SamSettings.from_mapping(5, {"switch": None}).switch is None
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SamSettings.from_mapping(0, {})
    draft = s.draft
    assert (draft.continuation, draft.prompt_store) == ("adaptive", False)  # the store is opt-in
    stored = SamSettings.from_mapping(3, {"prompt_store": True, "prompt_store_bytes": 1 << 20}).draft
    assert (stored.prompt_store, stored.prompt_store_bytes) == (True, 1 << 20)


class Clock:
    """Simulated time: the engine step between two proposer calls takes what the test says."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_auto_switch_learns_the_step_cost_from_the_calls():
    """A periodic text (drafts always accepted) on an engine whose drafted steps cost 5x: the switch
    measures plain and drafted steps between its calls, confirms the cost with a few more, then stops
    drafting; at 1.05x it drafts."""
    for cost_per_draft_token, drafts in ((4.0 / 3, False), (0.05 / 3, True)):
        clock = Clock()
        st = SamStepper(settings(switch="auto"), max_model_len=1 << 12, clock=clock)
        b = Batch(n_rows=4, width=1 << 12)
        for r in "abcd":
            b.add(r, PERIOD * 2)
        out = [[]] * 4
        k_seen = []
        for _ in range(40):
            # the engine: accepts every draft token (the text is periodic) and emits a bonus token
            for i, draft in enumerate(out):
                nxt = [PERIOD[(b.len[i] + j) % 5] for j in range(len(draft) + 1)]
                assert draft == nxt[:-1]  # a correct draft of the period
                b.append(i, nxt)
            clock.now += 0.1 * (1 + cost_per_draft_token * np.mean([len(d) for d in out]))
            out = step(st, b, [[int(b.tok[i, b.len[i] - 1])] for i in range(4)])
            k_seen.append(len(out[0]))
        assert k_seen[:4] == [0, 0, 3, 3]  # the bucket's plain, then full steps
        if drafts:
            assert all(k == 3 for k in k_seen[4:])
        else:  # drafting would pay at half the learnt cost: a few more full steps confirm it, then none
            assert 0 < sum(k > 0 for k in k_seen[4:]) <= 6, k_seen
            assert all(k == 0 for k in k_seen[12:]), k_seen
        snap = st.snapshot()
        (bucket,) = snap["switch"]["buckets"].values()
        assert bucket["plain_step_ms"] == pytest.approx(100.0)
        assert bucket["cost_per_draft_token"] == pytest.approx(cost_per_draft_token, abs=1e-4)  # reported to 4 places
        assert snap["switch"]["acceptance_by_position"] == [1.0, 1.0, 1.0]


def test_auto_switch_starts_drafting_when_the_text_turns_predictable():
    """Noise over 6 tokens first (drafts mostly rejected, the switch sends none), then a periodic stretch: the
    scoring rounds see that full drafts would now be accepted, though none was sent, and the switch
    drafts. Its learnt acceptance is the scored one, not the last drafted steps'."""
    clock = Clock()
    width = 1 << 12
    st = SamStepper(settings(switch="auto"), max_model_len=width, clock=clock)
    rng = np.random.default_rng(0)
    noise_steps, periodic_steps = 150, 60
    text = np.concatenate([rng.integers(0, 6, size=(4, noise_steps + 10)), np.tile(PERIOD, (4, 200))], axis=1)
    b = Batch(n_rows=4, width=width)
    for r in range(4):
        b.add(f"r{r}", text[r, :10].tolist())
    out, k_seen = [[]] * 4, []
    for _ in range(noise_steps + periodic_steps):
        for i, draft in enumerate(out):  # the engine: the draft's correct prefix, then the true next token
            n = int(b.len[i])
            accepted = 0
            while accepted < len(draft) and draft[accepted] == text[i, n + accepted]:
                accepted += 1
            b.append(i, text[i, n : n + accepted + 1].tolist())
        clock.now += 0.1 * (1 + 0.6 * np.mean([len(d) for d in out]))
        out = step(st, b, [[int(b.tok[i, b.len[i] - 1])] for i in range(4)])
        k_seen.append(max(len(d) for d in out))
    k_seen = np.array(k_seen)
    assert np.mean(k_seen[10 : noise_steps - 20] == 0) > 0.95
    # drafting for good: the first of 5 drafted steps in a row (a single drafted step before it measures
    # the cost of full drafts, which the noise never made worth confirming)
    drafted_run = np.convolve(k_seen[noise_steps:] > 0, np.ones(5), mode="valid") == 5
    turned = noise_steps + np.argmax(drafted_run)
    assert drafted_run.any() and turned - noise_steps < 30, k_seen[noise_steps:]
    assert np.mean(k_seen[turned + 10 :] == 3) > 0.95  # the rest: a try of k = 0
    assert st.snapshot()["switch"]["acceptance_by_position"][0] > 0.9


def test_a_new_batch_admitted_over_a_few_steps_replaces_most_of_the_acceptance_estimate():
    """An engine admits a batch's requests over a few steps (LLM.generate hands them over one by one):
    the requests started since the last scoring round count together, and at the next round the old
    acceptance evidence keeps the weight of JUMP_KEEP x that many rows; one start a step beside requests
    that were running already does not."""

    def run(starts_by_step, running=4):
        clock = Clock()
        st = SamStepper(settings(switch="auto"), max_model_len=W, clock=clock)
        b = Batch(n_rows=24)
        weights = []
        for s, starts in enumerate([running] + starts_by_step):
            for r in range(starts):
                b.add(f"r{s}.{r}", [1, 2, 3] + PERIOD * 2)
            clock.now += 0.1
            step(st, b, [[int(b.tok[i, b.len[i] - 1])] for i in range(len(b.req_ids))])
            if s == 0:  # after the first round: a long sampled history of the running requests, 0.1 accepted
                st.switch.accept[1:] = [100.0, 100.0, 10.0]
            weights.append(float(st.switch.accept[1, 0]))
        return weights

    # scoring rounds begin at steps 0, 4, 8: eight requests admitted at steps 1-2 meet at the round of step 4
    admitted = run([4, 4, 0, 0, 0])
    assert admitted[3] == 100.0 and admitted[4] <= JUMP_KEEP * 8 + 1e-9, admitted
    trickle = run([1] * 8)  # one a step: four between two rounds, beside the four running
    assert min(trickle) > 50.0, trickle


def test_paused_steps_draft_nothing_and_teach_the_switch_nothing():
    """Paused (the demo's SAM-off arm), the stepper sends no drafts and its switch sees no step time and
    no scoring round, but the drafter follows the tokens; resumed, it drafts from the whole context."""
    clock = Clock()
    st = SamStepper(settings(switch="auto"), max_model_len=W, clock=clock)
    b = Batch()
    b.add("a", PERIOD * 2)
    st.pause(True)
    for _ in range(6):
        b.append(0, [PERIOD[b.len[0] % 5]])
        clock.now += 0.1
        assert step(st, b, [[int(b.tok[0, b.len[0] - 1])]]) == [[]]
    report = st.snapshot()["switch"]
    assert report["scored_rows"] == 0 and report["buckets"] == {}
    assert st.drafter.num_tokens("a") == 16
    st.pause(False)
    clock.now += 5.0  # the pause's gap is not a step
    b.append(0, [PERIOD[b.len[0] % 5]])
    out = step(st, b, [[int(b.tok[0, b.len[0] - 1])]])
    assert out == [[]]  # the new bucket's first plain step
    assert st.snapshot()["switch"]["buckets"]["1-1"]["plain_step_ms"] is None
    b.append(0, [PERIOD[b.len[0] % 5]])
    clock.now += 0.1
    step(st, b, [[int(b.tok[0, b.len[0] - 1])]])
    assert st.snapshot()["switch"]["buckets"]["1-1"]["plain_step_ms"] == pytest.approx(100.0)
    st2 = SamStepper(settings(switch=None), max_model_len=W)
    b2 = Batch()
    b2.add("x", PERIOD * 2)
    st2.pause(True)
    assert step(st2, b2, [[9]]) == [[]]
    st2.pause(False)
    b2.append(0, [5])
    assert step(st2, b2, [[5]]) == [[6, 7, 8]]  # a fixed schedule drafts again at once


def test_steps_with_prefill_teach_the_switch_nothing():
    clock = Clock()
    st = SamStepper(settings(switch="auto"), max_model_len=W, clock=clock)
    b = Batch()
    b.add("a", PERIOD * 2)
    for i in range(6):  # a new request each step: every step has a prefill in it
        clock.now += 1.0
        b.add(f"new{i}", [1, 2, 3])
        step(st, b, [[9]] * len(b.req_ids))
    assert all(v["plain_step_ms"] is None for v in st.snapshot()["switch"]["buckets"].values())


def test_an_interval_spent_in_the_stepper_itself_is_not_timed():
    """On a fresh machine a call compiles numba functions at their first use (seconds inside the call):
    the interval after it is the stepper's, not the engine's. Timed, it would become the bucket's plain
    step and make every drafted step there look free for a long time (docs/vllm-hooks.md)."""
    clock = Clock()
    st = SamStepper(settings(switch="auto"), max_model_len=W, clock=clock)
    b = Batch()
    b.add("a", PERIOD * 2)
    sync, calls = st.drafter.sync, []

    def compiling_sync(*args):
        calls.append(len(calls))
        if len(calls) == 2:
            clock.now += 5.0
        return sync(*args)

    st.drafter.sync = compiling_sync
    for _ in range(6):
        b.append(0, [PERIOD[b.len[0] % 5]])
        clock.now += 0.1
        step(st, b, [[int(b.tok[0, b.len[0] - 1])]])
    assert st.snapshot()["switch"]["buckets"]["1-1"]["plain_step_ms"] == pytest.approx(100.0)


@pytest.mark.parametrize("raw", [{"switch": "auto"}, {}, {"prompt_store": True}, {"history_tokens": 2048}])
def test_compile_kernels_leaves_nothing_to_compile_in_an_engine_session(raw):
    """After ``compile_kernels`` (which the engine adapters run before serving), a session shaped like an
    engine's (vLLM's dtypes, groups of siblings, rows that move when requests finish, a shrinking batch)
    reaches no numba kernel with a signature it lacks: nothing compiles inside the first rollout. In a
    fresh process, so that no other test has compiled them."""
    session = textwrap.dedent(
        """
            import json
            import numpy as np
            from numba.core.registry import CPUDispatcher
            from sam_rollout import drafter
            import sam_rollout.drafter.auto_switch, sam_rollout.drafter.draft
            from sam_rollout.settings import SamSettings
            from sam_rollout.stepper import SamStepper, compile_kernels

            def signatures():
                names = ("layout", "edges", "token_log", "build", "draft", "auto_switch")
                modules = [getattr(drafter, name) for name in names]
                return {f"{m.__name__}.{name}": len(f.signatures) for m in modules
                        for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}

            settings = SamSettings.from_mapping(3, SETTINGS)
            compile_kernels(settings)
            before = signatures()
            rng = np.random.default_rng(0)
            width, rows = 1024, 16
            st = SamStepper(settings, max_model_len=width)
            tok = np.zeros((rows, width), dtype=np.int32)
            length = np.zeros(rows, dtype=np.int32)
            prompt_len = np.zeros(rows, dtype=np.int32)
            req_ids, started, draft = [], 0, []
            for step in range(400):
                while len(req_ids) < (12 if step < 200 else 3) and started < 40:  # groups of 4; prompts come back
                    i = len(req_ids)
                    prompt = np.random.default_rng(started // 4 % 5).integers(0, 50, size=20).astype(np.int32)
                    tok[i, :20], length[i], prompt_len[i] = prompt, 20, 20
                    req_ids.append(f"r{started}")
                    draft.append([])
                    started += 1
                sampled = []
                for i, d in enumerate(draft):
                    n = int(length[i])
                    accepted = d[: rng.integers(0, len(d) + 1)] if d else []
                    new = list(accepted) + [int(rng.integers(0, 50)) if rng.random() < 0.5 else int(tok[i, n - 5])]
                    new = new[: width - n]
                    tok[i, n : n + len(new)] = new
                    length[i] = n + len(new)
                    sampled.append(new)
                draft = st.step(req_ids, prompt_len, sampled, length, tok)
                done = [i for i in range(len(req_ids)) if length[i] >= 200 + 40 * (i % 3) or length[i] >= width - 4]
                for i in sorted(done, reverse=True):  # vLLM's condense: the last row moves into the hole
                    st.finish(req_ids[i])
                    last = len(req_ids) - 1
                    for a in (tok, length, prompt_len):
                        a[i] = a[last]
                    req_ids[i], draft[i] = req_ids[last], draft[last]
                    req_ids.pop()
                    draft.pop()
            after = signatures()
            print(json.dumps({name: [before[name], n] for name, n in after.items() if n != before[name]}))
            """
    )
    code = session.replace("SETTINGS", repr(raw))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("k", [1, 16, 40])
def test_compile_kernels_runs_at_any_draft_cap(k):
    """Its synthetic session accepts every draft, so its rows grow by k + 1 a step: they are sized for
    that (at k = 16 the session overran its rows, and the engine adapters failed at set-up)."""
    settings = SamSettings.from_mapping(k, {"prompt_store": True, "history_tokens": 2048})
    assert compile_kernels(settings) > 0


def test_auto_schedule_setting():
    assert SamSettings.from_mapping(3, {"switch": "auto"}).switch == "auto"
    with pytest.raises(ValueError, match=r"switch must be .*\"auto\", or a list .*got 'fast'"):
        SamSettings.from_mapping(3, {"switch": "fast"})


@pytest.mark.parametrize("switch", [{"switch": 8}, {"switch": "auto"}])
def test_the_snapshot_is_plain_data(switch):
    """sam_spec_metrics crosses vLLM's RPC (msgspec), which refuses numpy scalars: plain JSON types only."""
    st = SamStepper(settings(**switch), max_model_len=W)
    b = Batch()
    b.add("a", PERIOD * 2)
    for _ in range(6):
        out = step(st, b, [[9]])
        b.append(0, (out[0] or [])[:1] + [PERIOD[b.len[0] % 5]])
    assert_plain(st.snapshot())


def assert_plain(value, where="snapshot"):
    """Only dict, list, str, int, float, bool and None, exactly (numpy.float64 subclasses float)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, where
            assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (str, int, float, bool), (where, type(value))


def test_draft_length_per_request_up_to_the_cap():
    """k (num_speculative_tokens) 16 with the match length: a long match drafts up to 16 tokens, a short
    one base_k (3), in the same step; each row's list is its own length (vLLM's ragged custom_class
    return), and the default length at k 3 drafts 3 for both."""
    period = list(range(100, 120))
    long_row, short_row = [1, 2] + period * 2, [40, 41, 42, 40]
    for k, lengths in ((16, [16, 3]), (3, [3, 3])):
        st = SamStepper(settings(k=k, switch=None), max_model_len=W)
        b = Batch()
        b.add("long", long_row)  # its last 20 tokens repeat: a match of 20 tokens
        b.add("short", short_row)  # a match of 1 token
        out = step(st, b, [[period[-1]], [40]])
        assert [len(d) for d in out] == lengths
        assert out[0] == period[: lengths[0]] and out[1] == [41, 42, 40][: lengths[1]]
