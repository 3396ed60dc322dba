"""The prompt-affinity router (rollout.verl.router.SamLoadBalancer) against verl 0.9.1's own default
balancer: GRPO groups stay on one replica, revisits return to it, the load stays within its bound,
verl's stickiness and elastic add/remove keep working, and verl builds it from our YAML."""

import random

import numpy as np
import pytest
from verl_step import REPO, verl_step_only

verl_step_only()

from verl.workers.rollout.router import GlobalRequestLoadBalancer  # noqa: E402

from rollout.routing_metrics import RoutingStepTracker  # noqa: E402
from rollout.verl.router import LEAST_LOADED, PROMPT_AFFINITY, RouterSettings, SamLoadBalancer  # noqa: E402

SERVERS = {f"10.0.0.{i}:8000": f"handle-{i}" for i in range(4)}


def prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, size=int(rng.integers(20, 200))).tolist() for _ in range(n)]


def route_batch(lb, batch, n, tag, release=True):
    """One rollout batch as verl's agent loop sends it: every sample acquires (siblings adjacent), then
    all are released as they finish (shuffled). Returns {prompt index: [server of each sibling]}."""
    placed, held = {}, []
    for p, ids in batch:
        for j in range(n):
            rid = f"{tag}-{p}-{j}"
            fields = {"prompt_ids": ids} if "prompt_ids" in lb.require_acquire_fields() else {}  # as verl's client
            sid, _ = lb.acquire_server(request_id=rid, **fields)
            placed.setdefault(p, []).append(sid)
            held.append((sid, rid))
    if release:
        random.Random(tag).shuffle(held)
        for sid, rid in held:
            lb.release_server(sid, request_id=rid)
    return placed, held


def balancer(policy=PROMPT_AFFINITY, servers=SERVERS, **settings):
    return SamLoadBalancer(dict(servers), {"router_class": "rollout.verl.router.SamLoadBalancer", "policy": policy,
                                           **settings})  # fmt: skip


def top_share(sids):
    return max(sids.count(s) for s in set(sids)) / len(sids)


def test_groups_stay_on_one_replica_where_verls_default_spreads_them():
    ps = prompts(32)
    batch = list(enumerate(ps))
    ours, _ = route_batch(balancer(), batch, n=8, tag="a")
    assert all(top_share(s) == 1.0 for s in ours.values())
    random.seed(0)
    default, _ = route_batch(GlobalRequestLoadBalancer(dict(SERVERS)), batch, n=8, tag="a")
    assert np.mean([top_share(s) for s in default.values()]) < 0.5  # about 1/4 over 4 replicas


def test_revisits_return_to_the_replica_that_served_the_prompt():
    ps = prompts(32)
    lb = balancer()
    first, _ = route_batch(lb, list(enumerate(ps)), n=8, tag="e1")
    order = list(enumerate(ps))
    random.Random(1).shuffle(order)  # the next epoch, in another order
    second, _ = route_batch(lb, order, n=8, tag="e2")
    assert {p: set(s) for p, s in first.items()} == {p: set(s) for p, s in second.items()}
    stats = lb.routing_stats()
    assert stats["revisit_requests"] == 32 * 8 and stats["revisit_store_share_sum"] == 32 * 8


def test_verls_policy_through_our_class_measures_chance_level_revisits():
    ps = prompts(32)
    lb = balancer(LEAST_LOADED)
    random.seed(0)
    route_batch(lb, list(enumerate(ps)), n=8, tag="e1")
    route_batch(lb, list(enumerate(ps)), n=8, tag="e2")
    step = RoutingStepTracker().step_metrics(lb.routing_stats())
    assert step["rollout/requests"] == 2 * 32 * 8
    # a group spread over the 4 replicas left about a quarter of its responses on each
    assert step["rollout/route_group_colocation"] < 0.5
    assert 0.15 < step["rollout/route_revisit_store_share"] < 0.4


def test_the_load_bound_holds_with_groups_kept_whole():
    lb = balancer()
    batch = list(enumerate(prompts(64, seed=3)))
    placed, held = route_batch(lb, batch, n=8, tag="b", release=False)
    inflight = lb.get_status()["servers"]
    assert max(inflight.values()) <= 1.25 * np.mean(list(inflight.values()))
    assert all(top_share(s) == 1.0 for s in placed.values())
    step = RoutingStepTracker().step_metrics(lb.routing_stats())
    assert step["rollout/route_inflight_max_over_mean"] <= 1.25
    assert step["rollout/route_group_colocation"] == 1.0


def test_a_replica_over_its_bound_passes_the_group_on():
    two = dict(list(SERVERS.items())[:2])
    lb = balancer(servers=two)
    ps = prompts(200, seed=5)
    home = lb._ring.walk  # the ring's first choice of each prompt
    from sam.prompt_store import prompt_key

    first = [home(int.from_bytes(prompt_key(np.asarray(p, dtype=np.int32))[:8], "big"))[0] for p in ps]
    same = [p for p, h in zip(ps, first) if h == first[0]][:4]  # four prompts with one home
    placed, _ = route_batch(lb, list(enumerate(same)), n=4, tag="o", release=False)
    counts = lb.get_status()["servers"]
    assert sorted(counts.values()) == [8, 8]  # two groups passed on: 16 requests split evenly
    assert lb.routing_stats()["overflowed_groups"] == 2
    assert all(top_share(s) == 1.0 for s in placed.values())


def test_a_request_id_sticks_to_its_replica_across_turns():
    lb = balancer()
    (ids,) = prompts(1)
    sid, _ = lb.acquire_server(request_id="chat", prompt_ids=ids)
    lb.release_server(sid, request_id="chat")
    turn2 = ids + [1, 2, 3]  # a multi-turn request's next turn carries a longer prompt
    sid2, _ = lb.acquire_server(request_id="chat", prompt_ids=turn2)
    assert sid2 == sid


def test_removing_a_replica_mid_run_reroutes_its_prompts_and_loses_no_request():
    lb = balancer()
    ps = prompts(40, seed=7)
    placed, held = route_batch(lb, list(enumerate(ps)), n=4, tag="r1", release=False)
    victim = max(SERVERS, key=lambda s: sum(sids[0] == s for sids in placed.values()))
    lb.remove_servers([victim])
    for sid, rid in held:  # requests in flight on every replica, the removed one included, finish
        lb.release_server(sid, request_id=rid)
    assert lb.get_total_inflight() == 0 and victim not in lb.get_all_servers()
    again, held2 = route_batch(lb, list(enumerate(ps)), n=4, tag="r2")
    assert all(s != victim for sids in again.values() for s in sids)
    assert all(top_share(s) == 1.0 for s in again.values())
    moved = [p for p, sids in placed.items() if sids[0] != again[p][0]]
    assert moved and all(placed[p][0] == victim for p in moved)  # only the removed replica's prompts moved
    assert lb.get_total_inflight() == 0


def test_an_added_replica_takes_a_share_and_most_prompts_stay():
    lb = balancer(servers=dict(list(SERVERS.items())[:3]))
    ps = prompts(120, seed=9)
    before, _ = route_batch(lb, list(enumerate(ps)), n=2, tag="x1")
    tracker = RoutingStepTracker()
    tracker.step_metrics(lb.routing_stats(reset_peaks=True))
    new = list(SERVERS)[3]
    lb.add_servers({new: SERVERS[new]})
    after, _ = route_batch(lb, list(enumerate(ps)), n=2, tag="x2")
    step = tracker.step_metrics(lb.routing_stats())
    on_new = sum(sids[0] == new for sids in after.values())
    # the others keep the prompts whose stores they hold up to the bound, which pushes the rest to the new one
    assert on_new > 0 and step["rollout/route_inflight_max_over_mean"] <= 1.25
    stayed = sum(before[p][0] == after[p][0] for p in before)
    assert stayed >= 0.6 * len(ps)


def test_the_ring_is_kept_by_replica_order_across_a_restart():
    ps = prompts(50, seed=11)
    first, _ = route_batch(balancer(), list(enumerate(ps)), n=1, tag="s1")
    renamed = {f"10.9.9.{i}:9000": h for i, h in enumerate(SERVERS.values())}  # new addresses, same ranks
    again, _ = route_batch(balancer(servers=renamed), list(enumerate(ps)), n=1, tag="s2")
    rank = {a: i for i, a in enumerate(SERVERS)} | {a: i for i, a in enumerate(renamed)}
    assert all(rank[first[p][0]] == rank[again[p][0]] for p in first)


def test_requests_without_prompt_ids_fall_back_to_verls_least_loaded():
    lb = balancer()
    sids = [lb.acquire_server(request_id=f"q{i}")[0] for i in range(8)]
    assert sorted(sids.count(s) for s in SERVERS) == [2, 2, 2, 2]


@pytest.mark.parametrize(
    "config,message",
    [
        ({"policy": "round_robin"}, "policy must be one of"),
        ({"load_bound": 0.9}, "load_bound must be a number >= 1"),
        ({"virtual_nodes": 0}, "virtual_nodes must be an integer >= 1"),
        ({"load_bond": 1.5}, "unknown key(s) ['load_bond']"),
    ],
)
def test_bad_router_settings_name_the_setting(config, message):
    with pytest.raises(ValueError) as e:
        RouterSettings.from_yaml_dict({"router_class": "x.Y", **config})
    assert message in str(e.value)


def test_verl_builds_our_balancer_from_the_yaml_and_sends_prompt_ids():
    """verl's own factory and client: the YAML named by router_config_path, the Ray actor, and the
    prompt_ids field the client serialises because the balancer asks for it."""
    import asyncio

    import ray
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # not a running head
    try:
        handle = get_router_handle(dict(SERVERS), router_config_path=f"{REPO}/configs/router/prompt_affinity.yaml")
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"full_determinism": False}}})
        client = LLMServerClient(config=config, load_balancer_handle=handle)
        ps = prompts(6, seed=13)

        async def rollout():
            out = {}
            for p, ids in enumerate(ps):
                for j in range(4):
                    sid, server = await client._acquire_server(f"{p}-{j}", prompt_ids=ids, sampling_params={})
                    out.setdefault(p, []).append(sid)
                    client._release_server(sid, request_id=f"{p}-{j}")
            return out

        placed = asyncio.run(rollout())
        assert all(top_share(s) == 1.0 for s in placed.values())
        stats = ray.get(handle.routing_stats.remote())
        assert stats["policy"] == PROMPT_AFFINITY and stats["keyed_requests"] == 24
    finally:
        ray.shutdown()


def test_a_restarted_router_with_its_saved_state_sends_prompts_where_their_stores_are(tmp_path):
    lb = balancer(servers=dict(list(SERVERS.items())[:2]))
    ps = prompts(24, seed=17)
    first, _ = route_batch(lb, list(enumerate(ps)), n=4, tag="c1")  # the bound passes some groups on
    assert lb.save_state(str(tmp_path / "router.json")) == 24
    renamed = {f"10.9.9.{i}:9000": h for i, h in enumerate(list(SERVERS.values())[:2])}  # a resumed run
    resumed = balancer(servers=renamed)
    assert resumed.load_state(str(tmp_path / "router.json")) == {"prompts": 24, "warning": None}
    again, _ = route_batch(resumed, list(enumerate(ps)), n=4, tag="c2")
    rank = {a: i for i, a in enumerate(SERVERS)} | {a: i for i, a in enumerate(renamed)}
    assert all(rank[first[p][0]] == rank[again[p][0]] for p in first)
    stats = resumed.routing_stats()
    assert stats["revisit_requests"] == 24 * 4 == stats["revisit_store_share_sum"]


@pytest.mark.parametrize("content", [None, "{not json", '{"format": 99, "served": {}}', '{"format": 1}'])
def test_a_missing_or_bad_router_state_leaves_the_memory_empty_and_says_why(tmp_path, content):
    path = tmp_path / "router.json"
    if content is not None:
        path.write_text(content)
    loaded = balancer().load_state(str(path))
    assert loaded["prompts"] == 0 and str(path) in loaded["warning"]


def test_a_prompt_goes_first_to_where_its_last_visit_ran():
    lb = balancer(servers=dict(list(SERVERS.items())[:2]))
    (ids,) = prompts(1, seed=19)
    home = route_batch(lb, [(0, ids)], n=4, tag="v1")[0][0][0]
    other = next(s for s in list(SERVERS)[:2] if s != home)
    held = [(home, f"hold-{i}") for i in range(8)]  # the home replica busy: the next visit is passed on
    for _, rid in held:
        lb._inflight_requests[home] += 1
        lb._inflight_by_request[rid] = (None, home)
    lb._last_burst_peak = 8
    assert route_batch(lb, [(0, ids)], n=4, tag="v2")[0][0] == [other] * 4
    for sid, rid in held:
        lb.release_server(sid, request_id=rid)
    # both replicas hold its responses now; the newest are on `other`, which it tries first
    assert route_batch(lb, [(0, ids)], n=4, tag="v3")[0][0] == [other] * 4
    assert lb.routing_stats()["revisit_store_share_sum"] == 4.0  # v2 found none of v1 there, v3 all of v2
