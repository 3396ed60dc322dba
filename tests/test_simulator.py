"""Rollout simulator (benchmarks/simulator.py) on tiny synthetic inputs with hand-checkable answers,
the acceptance-profile reader, the cost models, and the profile script at tiny CPU shapes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.simulator import (
    AcceptanceProfile,
    CostGrid,
    MoeRooflineCost,
    Policy,
    RolloutSetup,
    ScaledVerification,
    TableCost,
    compare,
    dense_step_features,
    fit_roofline,
    long_trace_profiles,
    policies_for,
    profile_from_routed,
    simulate,
)
from testkit.data import lognormal_lengths

ROOT = Path(__file__).resolve().parents[1]
K = 3


def flat_cost(ms_per_step=10.0):
    """Free verification: every step costs the same, whatever q, batch and context."""
    return lambda b, q, c: ms_per_step


def setup(requests=6, max_num_seqs=4, replicas=1, tail=2, max_response=64):
    return RolloutSetup("tiny", requests, max_num_seqs, replicas, max_response, prompt_len=0, tail_batch=tail)


def run(cost, profile, policies, lengths, st=None, max_k=K):
    st = st or setup()
    grid = CostGrid.build(cost, st.max_num_seqs, max_k, st.max_response + 64, q_step=0.25, ctx_step=16.0)
    return {r["policy"]: r for r in compare(st, np.asarray(lengths, float), grid, profile.tables(max_k, 1), policies)}


def test_off_by_hand():
    # 4 slots, lengths 8,8,8,8,4,4: the first four run 8 steps, then two run 4: 12 steps of 10 ms
    st = setup()
    r = run(flat_cost(), AcceptanceProfile.constant(K, 1.0, 0.0), policies_for(st, K, (2,)), [8, 8, 8, 8, 4, 4])
    assert r["off"]["steps"] == 12 and r["off"]["wall_s"] == pytest.approx(0.12)
    assert r["off"]["tail_steps"] == 4  # the last 4 steps run 2 requests (<= tail 2)
    assert r["off"]["tokens"] == pytest.approx(40)


def test_no_acceptance_and_free_verification_change_nothing():
    st = setup()
    pols = policies_for(st, K, (2, 4))
    r = run(flat_cost(), AcceptanceProfile.constant(K, 1.0, 3.0), pols, [8, 8, 8, 8, 4, 4], st)
    for p in pols:
        assert r[p.name]["wall_s"] == pytest.approx(r["off"]["wall_s"]), p.name
        assert r[p.name]["reduction"] == pytest.approx(0.0, abs=1e-12)


def test_perfect_acceptance_with_free_verification_gives_k_plus_1_in_the_tail():
    st = setup(requests=2, max_num_seqs=2, tail=2)
    lengths = [400, 400]
    r = run(flat_cost(), AcceptanceProfile.constant(K, K + 1.0, K), policies_for(st, K, (2,)), lengths, st)
    assert r["threshold 2"]["tail_speedup"] == pytest.approx(K + 1)
    assert r["threshold 2"]["reduction"] == pytest.approx(1 - 1 / (K + 1))
    assert r["oracle"]["wall_s"] == pytest.approx(r["threshold 2"]["wall_s"])
    # the online switch pays for measuring: two plain steps, and two full ones that are accepted anyway
    assert r["auto"]["wall_s"] == pytest.approx(r["threshold 2"]["wall_s"] + 2 * 0.01 * K / (K + 1), rel=0.02)


def test_threshold_only_speeds_up_the_tail():
    # 4 slots, lengths 100 x4 then a lone 400: speculation at batch <= 1 touches only the lone tail
    st = setup(requests=5, max_num_seqs=4, tail=1)
    prof = AcceptanceProfile.constant(K, 2.0, 3.0)
    r = run(flat_cost(), prof, policies_for(st, K, (1,)), [100, 100, 100, 100, 400], st)
    # off: 100 steps at batch 4 (request 5 waits), then 400 steps alone -> tail 400 steps
    assert r["off"]["steps"] == 500 and r["off"]["tail_steps"] == 400
    assert r["threshold 1"]["steps"] == 100 + 200
    assert r["threshold 1"]["tail_speedup"] == pytest.approx(2.0)


def _linear_verification_cost(per_token):
    # memory-bound base plus a per-verified-token term: q tokens per request cost more with batch
    return lambda b, q, c: 10.0 + per_token * b * q + 0.001 * b * c


@pytest.mark.parametrize("per_token, tokens", [(0.05, 1.3), (0.5, 1.3), (2.0, 2.5), (0.2, 2.0), (5.0, 3.9)])
def test_oracle_never_worse_than_off_under_its_own_cost_model(per_token, tokens):
    st = setup(requests=40, max_num_seqs=16, tail=4, max_response=2000)
    lengths = lognormal_lengths(40, 300, 0.9, 2000, seed=3)
    prof = AcceptanceProfile(K, [0, 100, 400], [tokens, 1.1, tokens], [3.0, 2.0, 3.0], [1000, 1000, 1000])
    r = run(_linear_verification_cost(per_token), prof, policies_for(st, K, (4,)), lengths, st)
    assert r["oracle"]["wall_s"] <= r["off"]["wall_s"] * (1 + 1e-9)
    assert r["auto"]["wall_s"] <= r["off"]["wall_s"] * 1.03  # learning costs a few steps


def test_oracle_and_auto_turn_off_when_verification_is_dear():
    st = setup(requests=8, max_num_seqs=4, tail=4)
    cost = lambda b, q, c: 10.0 * q  # noqa: E731 - compute-bound: q tokens cost q times
    r = run(cost, AcceptanceProfile.constant(K, 2.0, 3.0), policies_for(st, K, (4,)), [50] * 8, st)
    assert r["oracle"]["spec_steps"] == 0 and r["oracle"]["wall_s"] == pytest.approx(r["off"]["wall_s"])
    assert r["auto"]["spec_steps"] <= 2 and r["auto"]["reduction"] > -0.05  # its two full measuring steps
    assert r["threshold 4"]["reduction"] < 0  # a fixed threshold loses here


def test_slowest_replica_sets_the_wall_time():
    st = setup(requests=4, max_num_seqs=4, replicas=2, tail=4)
    grid = CostGrid.build(flat_cost(), 4, K, 200, ctx_step=16.0)
    prof = AcceptanceProfile.constant(K, 1.0, 0.0).tables(K, 1)
    off = Policy("off", np.zeros(5, dtype=np.int64))
    r = simulate(st, np.array([10.0, 10.0, 10.0, 100.0]), grid, prof, off)
    assert r["wall_s"] == pytest.approx(1.0)  # 100 steps of 10 ms on the replica holding the 100


# ------------------------------------------------------------------------- acceptance input


def _write_profile(path, tokens, drafted, steps, edges=(0, 128, 512)):
    data = {
        "k": 3,
        "trace_set": "synthetic",
        "bin_edges": list(edges),
        "methods": {"sam_group_history": {"tokens_per_step": tokens, "drafted_per_step": drafted, "steps": steps}},
    }
    path.write_text(json.dumps(data))
    return path


def test_profile_reader_holds_the_last_well_populated_bin(tmp_path):
    p = _write_profile(tmp_path / "a.json", [1.5, 2.0, None], [2.0, 2.5, None], [5000, 3000, 0])
    prof = AcceptanceProfile.from_json(p, "sam_group_history")
    edges, tok, dr = prof.filled(min_steps=1000)
    assert list(edges) == [0, 128, 512] and list(tok) == [1.5, 2.0, 2.0] and list(dr) == [2.0, 2.5, 2.5]
    assert any("hold" in n for n in prof.notes)
    _, tk, dk = prof.tables(3, 1000)
    assert tk[3, 1] == pytest.approx(2.0) and tk[0, 1] == 1.0 and dk[0, 1] == 0.0
    assert tk[1, 1] < tk[2, 1] < tk[3, 1]
    tok_k, _ = prof.conservative(3, 1000)
    assert tok_k[3] == pytest.approx(1.5)  # the lowest well-populated bin


def test_profile_reader_rejects_bad_files(tmp_path):
    p = _write_profile(tmp_path / "b.json", [1.5, 2.0], [2.0, 2.5], [5000, 3000])
    with pytest.raises(ValueError, match="one per bin"):
        AcceptanceProfile.from_json(p, "sam_group_history")
    p = _write_profile(tmp_path / "c.json", [1.5, 2.0, 2.1], [2.0, 2.5, 2.6], [5000, 3000, 10])
    with pytest.raises(ValueError, match="no method"):
        AcceptanceProfile.from_json(p, "ngram")
    prof = AcceptanceProfile.from_json(p, "sam_group_history")
    with pytest.raises(ValueError, match="no bin"):
        prof.filled(min_steps=10**6)


def test_real_acceptance_file_when_present():
    path = ROOT / "benchmarks/results/acceptance_qwen25math_k3.json"
    if not path.exists():
        pytest.skip("acceptance curves not generated yet")
    prof = AcceptanceProfile.from_json(path, "sam_group_history")
    edges, tk, dk = prof.tables(3)
    assert np.all(tk >= 1.0) and np.all(tk[3] <= 4.0)


# ---------------------------------------------------------------------------------- costs


def _rows(fn, batches=(1, 4, 16), qs=(1, 2, 4, 5), ctxs=(2048, 8192)):
    return [
        dict(device="synthetic", ctx=c, batch=b, q=q, masked=0, ms_per_step_64_layers=fn(b, q, c))
        for b in batches
        for q in qs
        for c in ctxs
    ]


def test_table_cost_is_exact_on_a_linear_model_and_extrapolates_context():
    fn = lambda b, q, c: 5 + 0.5 * b * q + 0.001 * b * c  # noqa: E731 - linear in each argument
    t = TableCost(_rows(fn))
    for args in [(1, 1, 2048), (4, 3.5, 5000), (10, 2.0, 32768), (16, 5, 1000)]:
        assert t(*args) == pytest.approx(fn(*args))
    qs, cs = np.array([1.0, 2.5, 4.0]), np.array([0.0, 4096.0, 40000.0])
    grid = t.on_grid(16, qs, cs)
    assert grid[7, 1, 2] == pytest.approx(fn(7, 2.5, 40000.0))


def test_cost_grid_refuses_non_positive_step_times():
    t = TableCost(_rows(lambda b, q, c: 50 - 3 * b, batches=(1, 4)))  # extrapolates below zero by batch 17
    with pytest.raises(ValueError, match="profile the batches"):
        CostGrid.build(t, 32, K, 4096)


def test_anchor_csv_reads_and_verification_is_nearly_free_at_small_batch():
    from benchmarks.simulator import ANCHOR_CSV
    from testkit.data import shared_data_dir

    path = shared_data_dir() / ANCHOR_CSV
    if not path.exists():
        pytest.skip("shared anchor CSV not present")
    t = TableCost.from_csv(path)
    assert 1.0 <= t(8, 5, 8192) / t(8, 1, 8192) < 1.1
    assert t(256, 5, 2048) / t(256, 1, 2048) > 2
    rates = fit_roofline(t)
    assert np.all(rates >= 0)


def test_scaled_verification_and_moe_cost_shapes():
    fn = lambda b, q, c: 5 + 0.5 * b * q  # noqa: E731
    t = TableCost(_rows(fn))
    s = ScaledVerification(t, 3.0)
    assert s(4, 1, 2048) == pytest.approx(fn(4, 1, 2048))
    assert s(4, 4, 2048) - s(4, 1, 2048) == pytest.approx(3 * (fn(4, 4, 2048) - fn(4, 1, 2048)))
    rates = np.array([0.0, 1.0, 0.0, 0.0, 0.0])  # weights only: time follows distinct experts read
    moe = MoeRooflineCost(rates, tp=1)
    assert moe(1, 4, 1000) > moe(1, 1, 1000)
    assert moe(64, 4, 1000) / moe(64, 1, 1000) < 1.02  # 126 of 128 experts read already at q=1
    corr = MoeRooflineCost(rates, tp=1, correlation=1.0)
    assert corr(8, 4, 1000) == pytest.approx(corr(8, 1, 1000))
    f = dense_step_features(
        {"layers": 2, "hidden": 8, "heads": 2, "kv_heads": 1, "head_dim": 4, "intermediate": 16, "vocab": 10}, 1, 1, 0
    )
    assert f[0] == 1.0 and f[2] == 0.0


# ------------------------------------------------------------------------- profile script


def test_profile_script_runs_on_cpu_tiny_shapes(tmp_path):
    out = tmp_path / "profile.csv"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.profile_step_cost",
        "--device",
        "cpu",
        "--layers",
        "1",
        "--batches",
        "1,2",
        "--contexts",
        "256",
        "--qs",
        "1,4",
        "--tiny",
        "--repeats",
        "2",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, timeout=300, cwd=ROOT, capture_output=True)
    rows = list(csv.DictReader(out.open()))
    assert {r["batch"] for r in rows} == {"1", "2"} and {r["q"] for r in rows} == {"1", "4"}
    assert all(float(r["ms_per_step_64_layers"]) > 0 for r in rows)
    TableCost(rows)  # the simulator reads it

    moe_out = tmp_path / "moe.csv"
    cmd[cmd.index(str(out))] = str(moe_out)
    subprocess.run(cmd + ["--model", "moe"], check=True, timeout=300, cwd=ROOT, capture_output=True)
    rows = list(csv.DictReader(moe_out.open()))
    assert rows and all(0 < float(r["distinct_experts"]) <= float(r["experts"]) for r in rows)
    TableCost(rows)


def test_fixed_draft_proposer_verifies_exactly_q_tokens():
    from types import SimpleNamespace

    from testkit.engine_cost import DRAFT_TOKEN, FixedDraftProposer

    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=3), model_config=SimpleNamespace(max_model_len=10)
    )
    p = FixedDraftProposer(cfg)
    out = p.propose([[5], [], [7]], np.array([4, 3, 8]), None)
    assert out == [[DRAFT_TOKEN] * 3, [], [DRAFT_TOKEN] * 2]  # row 2 has room for 2 only


# ------------------------------------------------------------------------- replicas and routing


def test_default_routing_balances_load_and_spreads_siblings():
    from benchmarks.simulator import least_loaded_routing

    rng = np.random.default_rng(0)
    where = least_loaded_routing([8] * 32, 4, rng)
    counts = np.bincount(np.concatenate(where), minlength=4)
    assert counts.max() - counts.min() <= 1  # least in flight: the replicas fill evenly
    # 8 agent-loop workers interleave, so siblings land about independently: (8 - 1) / 4 share a replica
    shared = np.mean([(w == x).sum() - 1 for w in where for x in w])
    assert 1.2 < shared < 2.3
    # arriving one after another (one worker), a group of 8 over 4 replicas puts exactly 2 on each
    for w in least_loaded_routing([8] * 32, 4, rng, workers=1):
        assert sorted(np.bincount(w, minlength=4)) == [2, 2, 2, 2]
    assert all((w == 0).all() for w in least_loaded_routing([8] * 4, 1, rng))


def test_prompt_affinity_keeps_a_prompt_on_one_replica_every_epoch():
    from benchmarks.simulator import prompt_affinity_map, route

    rng = np.random.default_rng(1)
    prompt_replica = prompt_affinity_map(32, 8, rng)
    assert sorted(np.bincount(prompt_replica, minlength=8)) == [4] * 8
    first = route("affinity", [16] * 32, 8, rng, prompt_replica)
    later = route("affinity", [16] * 32, 8, rng, prompt_replica)
    for g, (a, b) in enumerate(zip(first, later)):
        assert (a == prompt_replica[g]).all() and (b == a).all()
    with pytest.raises(ValueError, match="routing must be one of"):
        route("random", [4], 2, rng)


def _sibling_groups(groups=12, siblings=8, length=160, vocab=5000, mutate=0.1, seed=0):
    """Groups whose siblings are copies of one random text with a share of tokens changed, each after
    an opening of its own length (so that some siblings are ahead of others in the shared text, as
    in real groups): drafting from siblings pays, drafting from other prompts' text does not."""
    from testkit.data import TraceGroup

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(groups):
        base = rng.integers(0, vocab, length).astype(np.int32)
        responses = []
        for i in range(siblings):
            r = base.copy()
            hit = rng.random(length) < mutate
            r[hit] = rng.integers(0, vocab, int(hit.sum()))
            responses.append(np.concatenate([rng.integers(0, vocab, 8 * i).astype(np.int32), r]))
        out.append(TraceGroup(rng.integers(0, vocab, 12).astype(np.int32), responses))
    return out


@pytest.fixture(scope="module")
def routed():
    """routed_acceptance on synthetic sibling groups at 1, 2 and 4 replicas, both routings and epochs."""
    from benchmarks.simulator import EPOCHS, ROUTINGS, routed_acceptance

    groups = _sibling_groups()
    return {
        (routing, r, epoch): routed_acceptance(groups, r, routing, epoch, K, seed=3, bin_edges=[0])
        for r in (1, 2, 4)
        for routing in ROUTINGS
        for epoch in EPOCHS
    }


def test_one_replica_makes_both_routings_equal(routed):
    for epoch in ("first", "later"):
        d, a = routed[("default", 1, epoch)], routed[("affinity", 1, epoch)]
        assert d["mean_tokens_per_step"] == a["mean_tokens_per_step"] and d["steps"] == a["steps"]
        assert d["siblings_on_replica"] == d["siblings_in_group"]


def test_default_routing_acceptance_falls_with_replicas(routed):
    for epoch in ("first", "later"):
        acc = [routed[("default", r, epoch)]["mean_tokens_per_step"] for r in (1, 2, 4)]
        assert acc[0] > acc[1] > acc[2], (epoch, acc)
        siblings = [routed[("default", r, epoch)]["siblings_on_replica"] for r in (1, 2, 4)]
        assert siblings[0] > siblings[1] > siblings[2]
    # the earlier visit is on a later request's engine about 1/R of the time
    stored = routed[("default", 4, "later")]["earlier_responses_on_replica"]
    assert 0.4 < stored < 2.0 and routed[("affinity", 4, "later")]["earlier_responses_on_replica"] == 4


def test_affinity_never_worse_than_default_and_keeps_one_replica_acceptance(routed):
    for r in (1, 2, 4):
        for epoch in ("first", "later"):
            a = routed[("affinity", r, epoch)]["mean_tokens_per_step"]
            assert a >= routed[("default", r, epoch)]["mean_tokens_per_step"], (r, epoch)
            # every sibling and the whole earlier visit on the request's engine, whatever R
            assert a == pytest.approx(routed[("affinity", 1, epoch)]["mean_tokens_per_step"], rel=0.02), (r, epoch)


def test_later_epochs_with_affinity_beat_the_first(routed):
    for r in (1, 2, 4):
        later = routed[("affinity", r, "later")]["mean_tokens_per_step"]
        assert later > routed[("affinity", r, "first")]["mean_tokens_per_step"] + 0.2


def test_cluster_step_affinity_faster_equal_at_one_replica_and_time_adds_up():
    from benchmarks.simulator import cluster_step

    cost = _linear_verification_cost(0.05)
    slow = AcceptanceProfile.constant(K, 1.5, 3.0).tables(K, 1)
    fast = AcceptanceProfile.constant(K, 2.5, 3.0).tables(K, 1)
    auto = policies_for(setup(), K, ())[-1]
    assert auto.name == "auto"
    lengths = np.full(32, 300.0)  # equal lengths: any balanced placement loads the replicas alike
    for replicas in (1, 4):
        st = RolloutSetup("tiny", 32, 4, replicas, 400, prompt_len=0, tail_batch=2)
        grid = CostGrid.build(cost, st.max_num_seqs, K, 512, ctx_step=16.0)
        same = {(routing, epoch): slow for routing in ("default", "affinity") for epoch in ("first", "later")}
        rows = cluster_step(st, 8, lengths, grid, same, auto, seed=0, prefill=5.0)
        assert rows[("default", "later")]["wall_s"] == pytest.approx(rows[("affinity", "later")]["wall_s"])
        better = dict(same)
        better[("affinity", "later")] = fast
        rows = cluster_step(st, 8, lengths, grid, better, auto, seed=0, prefill=5.0)
        assert rows[("affinity", "later")]["wall_s"] < rows[("default", "later")]["wall_s"]
        off = rows[("default", "off")]
        assert off["verify_s"] == pytest.approx(0.0, abs=1e-9) and off["overhead_s"] == 0.0
        assert off["prefill_s"] == pytest.approx(32 / replicas * 5.0 / 1e3)
        for r in rows.values():
            assert r["plain_s"] + r["verify_s"] + r["overhead_s"] == pytest.approx(r["decode_s"])
            assert r["wall_s"] == pytest.approx(r["decode_s"] + r["prefill_s"])


def test_setup_from_recipe_reads_the_published_replicas(tmp_path):
    from benchmarks.simulator import setup_from_recipe

    s32, n, tp = setup_from_recipe(
        [ROOT / "recipes/dapo_qwen3_32b/dapo_qwen3_32b_base.yaml", ROOT / "recipes/dapo_qwen3_32b/dapo_qwen3_32b.yaml"],
        "32b",
    )
    assert (s32.replicas, s32.requests, s32.max_num_seqs, s32.max_response, n, tp) == (4, 1536, 128, 34816, 16, 8)
    s235, _, _ = setup_from_recipe([ROOT / "recipes/dapo_qwen3_235b/dapo_qwen3_235b.yaml"], "235b")
    assert (s235.replicas, s235.requests, s235.max_num_seqs) == (32, 2048, 64)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "trainer: {nnodes: 1, n_gpus_per_node: 6}\nactor_rollout_ref: {rollout: {tensor_model_parallel_size: 4}}\n"
    )
    with pytest.raises(ValueError, match="do not split into rollout TP 4"):
        setup_from_recipe([bad], "bad")
    bad.write_text("trainer: {nnodes: 1}\n")
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        setup_from_recipe([bad], "bad")


def test_routed_acceptance_artifact_when_present():
    path = ROOT / "benchmarks/results/simulate_cluster_acceptance_qwen25math_k3.json"
    if not path.exists():
        pytest.skip("routed acceptance not replayed yet (python -m benchmarks.simulate_rollout --cluster)")
    p = json.loads(path.read_text())["profiles"]
    reps = sorted({int(key.split("/")[1][1:]) for key in p})
    for epoch in ("first", "later"):
        acc = [p[f"default/R{r}/{epoch}"]["mean_tokens_per_step"] for r in reps]
        assert all(a > b for a, b in zip(acc, acc[1:])), (epoch, acc)
        assert p[f"default/R1/{epoch}"]["mean_tokens_per_step"] == p[f"affinity/R1/{epoch}"]["mean_tokens_per_step"]
        for r in reps:
            assert (
                p[f"affinity/R{r}/{epoch}"]["mean_tokens_per_step"]
                >= p[f"default/R{r}/{epoch}"]["mean_tokens_per_step"]
            )
    for r in reps:
        assert p[f"affinity/R{r}/later"]["mean_tokens_per_step"] > p[f"affinity/R{r}/first"]["mean_tokens_per_step"]


def test_grouped_lengths_share_a_prompt_effect():
    from benchmarks.simulator import grouped_lognormal_lengths

    same = grouped_lognormal_lengths(6, 4, 300.0, 0.8, 10_000, corr=1.0, seed=2).reshape(6, 4)
    assert (same == same[:, :1]).all() and len(set(same[:, 0])) == 6
    free = grouped_lognormal_lengths(6, 4, 300.0, 0.8, 10_000, corr=0.0, seed=2).reshape(6, 4)
    assert len(set(free.ravel())) > 20
    with pytest.raises(ValueError, match="length correlation"):
        grouped_lognormal_lengths(2, 2, 300.0, 0.8, 1000, corr=1.5)
    # another visit: the prompt's share kept, the samples' own drawn anew
    again = grouped_lognormal_lengths(6, 4, 300.0, 0.8, 10_000, corr=1.0, seed=2, visit=1).reshape(6, 4)
    assert (again == same).all()
    assert not (
        grouped_lognormal_lengths(6, 4, 300.0, 0.8, 10_000, corr=0.0, seed=2, visit=1).reshape(6, 4) == free
    ).all()


def test_real_balancer_keeps_groups_whole_and_returns_them_to_their_store():
    """The cluster simulator's balancer routings (with store handoffs, and with stores that stay) run the
    real balancer (verl's base class)."""
    pytest.importorskip("verl.workers.rollout.router")
    from benchmarks.simulator import ROUTER_ROUTINGS, grouped_lognormal_lengths, router_step_placements

    prompts, n, replicas = 12, 4, 3

    def visits(b, visit):
        return grouped_lognormal_lengths(prompts, n, 300.0, 0.8, 10_000, 0.8, 10 * b, visit)

    for routing in ROUTER_ROUTINGS:
        out = router_step_placements(routing, replicas, n, visits, seed=1)
        for epoch in ("first", "later"):
            where = out[epoch].reshape(prompts, n)
            assert (where == where[:, :1]).all(), (routing, epoch)  # siblings on their group's replica
            assert set(where[:, 0].tolist()) == set(range(replicas)), (routing, epoch)
        assert 0.5 <= out["store_share"] <= out["store_available"] <= 1.0, routing
        if routing == "handoff":
            assert out["store_available"] == 1.0  # every store went with its group
        else:
            assert out["store_available"] == out["store_share"]
    with pytest.raises(ValueError, match="routing must be one of"):
        router_step_placements("affinity", replicas, n, visits)


def test_constant_acceptance_needed_for_a_target():
    from benchmarks.simulator import constant_acceptance_for

    st = RolloutSetup("tiny", 8, 4, 1, 400, prompt_len=0, tail_batch=2)
    grid = CostGrid.build(flat_cost(), st.max_num_seqs, K, 512, ctx_step=16.0)
    pols = {p.name: p for p in policies_for(st, K, (4,))}
    lengths = [np.full(8, 300.0)]
    # free verification, drafts every step: half the time takes 2 tokens a step
    need = constant_acceptance_for(0.5, st, lengths, grid, pols["threshold 4"], pols["off"], K)
    assert need == pytest.approx(2.0, abs=0.05)
    assert constant_acceptance_for(0.2, st, lengths, grid, pols["threshold 4"], pols["off"], K) is None


def test_log_length_icc():
    from benchmarks.simulator import log_length_icc
    from testkit.data import TraceGroup

    rng = np.random.default_rng(0)
    prompt = np.zeros(2, dtype=np.int32)
    shared = [TraceGroup(prompt, [np.zeros(n, np.int32)] * 4) for n in rng.integers(10, 2000, 30)]
    assert log_length_icc(shared) == pytest.approx(1.0)
    own = [TraceGroup(prompt, [np.zeros(n, np.int32) for n in rng.integers(10, 2000, 4)]) for _ in range(200)]
    assert abs(log_length_icc(own)) < 0.1


# ------------------------------------------------------------------------- long drafts: q past the table


def test_table_cost_interpolates_between_and_extends_past_its_measured_q():
    fn = lambda b, q, c: 5 + 0.5 * b * q + 0.001 * b * c  # noqa: E731 - linear: interpolation and the fit are exact
    t = TableCost(_rows(fn))  # measured q 1, 2, 4, 5
    assert [t.q_provenance(q) for q in (1, 3, 5, 9, 17)] == [
        "measured",
        "interpolated",
        "measured",
        "extrapolated",
        "extrapolated",
    ]
    note = t.q_note(17)
    assert "interpolated (linear between measured q) q [3]" in note and "q [6, 7, 8, 9," in note
    for args in [(4, 9, 2048), (16, 17, 8192), (3, 17, 40000)]:
        assert t(*args) == pytest.approx(fn(*args))
    grid = t.on_grid(16, np.array([1.0, 9.0, 17.0]), np.array([2048.0, 8192.0]))
    assert grid[16, 2, 1] == pytest.approx(fn(16, 17.0, 8192.0))
    assert grid[5, 1, 0] == pytest.approx(t(5, 9.0, 2048.0))


def test_table_cost_extension_model_adds_its_increments_past_the_table():
    fn = lambda b, q, c: 10 + b * q  # noqa: E731
    saturating = lambda b, q, c: 100 * min(b * q, 20)  # noqa: E731 - e.g. experts that run out
    t = TableCost(_rows(fn), extension=saturating)
    assert t(1, 9, 2048) == pytest.approx(fn(1, 5, 2048) + saturating(1, 9, 2048) - saturating(1, 5, 2048))
    assert t(4, 17, 2048) == pytest.approx(fn(4, 5, 2048))  # saturated at q=5 already
    assert t(4, 3, 2048) == pytest.approx(fn(4, 3, 2048))  # inside the table the extension is not used
    grid = t.on_grid(4, np.array([9.0]), np.array([2048.0]))
    assert grid[1, 0, 0] == pytest.approx(t(1, 9, 2048)) and grid[2, 0, 0] == pytest.approx(t(2, 9, 2048))


def test_moe_anchor_prices_the_measured_ratios_and_the_roofline_error_is_reported():
    from benchmarks.simulator import ANCHOR_CSV, MOE_ANCHOR_CSV, model_error
    from testkit.data import shared_data_dir

    if not (shared_data_dir() / MOE_ANCHOR_CSV).exists():
        pytest.skip("shared MoE anchor CSV not present")
    rates = fit_roofline(TableCost.from_csv(shared_data_dir() / ANCHOR_CSV))
    table = TableCost.from_csv(shared_data_dir() / MOE_ANCHOR_CSV, extension=MoeRooflineCost(rates))
    assert 1.6 < table(1, 5, 2048) / table(1, 1, 2048) < 1.7  # measured: 31.62 / 19.21 ms
    assert 1.15 < table(64, 5, 2048) / table(64, 1, 2048) < 1.25
    assert table(8, 17, 2048) > table(8, 5, 2048)  # extended, not held
    error = model_error(MoeRooflineCost(rates), table)
    assert error["points"] == 96 and 0 < error["ratio_mean"] < error["ratio_max"]


def test_acceptance_with_a_long_draft_cap_is_priced_up_to_its_q():
    """An artifact with k = 16 drafts up to 16 (q up to 17): with free verification and full acceptance the
    tail runs at 17 tokens a step, against 4 at k = 3."""
    lengths = [170] * 2
    st = setup(requests=2, max_num_seqs=2, tail=2, max_response=256)
    policies = [Policy("off", np.zeros(3, dtype=np.int64)), Policy("k everywhere", np.full(3, 16))]
    long = run(flat_cost(), AcceptanceProfile.constant(16, 17.0), policies, lengths, st, max_k=16)
    assert long["k everywhere"]["steps"] == 10 and long["off"]["steps"] == 170


def test_chunked_groups_find_their_whole_store_on_every_replica_they_use():
    """The balancer with group_chunk 2 (store handoffs): a group of 8's current visit (4 requests) runs in two
    chunks, on up to two replicas, and each replica it uses holds the whole earlier visit (the copies);
    fewer siblings share a replica than with whole groups."""
    pytest.importorskip("verl.workers.rollout.router")
    from benchmarks.routing import affinity_settings
    from benchmarks.simulator import routed_acceptance

    groups = _sibling_groups()
    with affinity_settings(group_chunk=0):
        whole = routed_acceptance(groups, 4, "handoff", "later", K, seed=3, bin_edges=[0])
    with affinity_settings(group_chunk=2):
        chunked = routed_acceptance(groups, 4, "handoff", "later", K, seed=3, bin_edges=[0])
    for entry in (whole, chunked):
        assert entry["earlier_responses_on_replica"] == entry["earlier_responses"]  # the store, copied
    assert whole["siblings_on_replica"] == whole["siblings_in_group"]
    assert chunked["siblings_on_replica"] < whole["siblings_on_replica"]


def test_long_trace_profiles_mix_revisits_by_where_the_store_is():
    """Prompt affinity's later epoch drafts as a revisit; verl's routing as one on 1 of R replicas: per token,
    its steps are the share-weighted steps of the two curves (requests of equal length)."""
    bins = [0, 1024]
    first = {
        "k": 3,
        "bin_edges": bins,
        "methods": {"sam": {"tokens_per_step": [2.0, 2.0], "drafted_per_step": [3.0, 3.0], "steps": [10, 5]}},
    }
    revisit = {
        "k": 3,
        "bin_edges": bins,
        "methods": {"sam": {"tokens_per_step": [4.0, None], "drafted_per_step": [3.0, 1.0], "steps": [10, 0]}},
    }
    profiles = long_trace_profiles(first, revisit, "sam", [1, 4])
    assert profiles["affinity/R4/later"]["tokens_per_step"] == [4.0, None]
    assert profiles["default/R1/later"]["tokens_per_step"] == [4.0, None]
    assert profiles["default/R4/first"]["tokens_per_step"] == [2.0, 2.0]
    mixed = profiles["default/R4/later"]
    assert mixed["tokens_per_step"][0] == pytest.approx(1 / (0.25 / 4.0 + 0.75 / 2.0))
    assert mixed["drafted_per_step"][0] == pytest.approx(3.0)
    profile_from_routed(mixed).tables(3, min_steps=1)  # the simulator reads it
