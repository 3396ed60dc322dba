"""The prompt-affinity router (sam_rollout.verl.runtime.router.SamLoadBalancer) against verl 0.9.1's own default
balancer: GRPO groups stay on one replica, revisits return to it, the load stays within its bound,
verl's stickiness and elastic add/remove keep working, and verl builds it from our YAML."""

import random

import numpy as np
import pytest
from verl_step import REPO, verl_step_only

verl_step_only()

from verl.workers.rollout.router import GlobalRequestLoadBalancer  # noqa: E402

from sam_rollout.drafter.prompt_store import prompt_key  # noqa: E402
from sam_rollout.routing_metrics import RoutingStepTracker  # noqa: E402
from sam_rollout.verl.runtime.router import LEAST_LOADED, PROMPT_AFFINITY, RouterSettings, SamLoadBalancer  # noqa: E402
from testkit.store_copies import StoreCopies  # noqa: E402

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
    router_class = "sam_rollout.verl.runtime.router.SamLoadBalancer"
    return SamLoadBalancer(dict(servers), {"router_class": router_class, "policy": policy, **settings})


def top_share(sids):
    return max(sids.count(s) for s in set(sids)) / len(sids)


def test_groups_stay_on_one_replica_where_verls_default_spreads_them():
    ps = prompts(32)
    batch = list(enumerate(ps))
    ours, _ = route_batch(balancer(group_chunk=0), batch, n=8, tag="a")  # whole groups
    assert all(top_share(s) == 1.0 for s in ours.values())
    chunked, _ = route_batch(balancer(), batch, n=8, tag="a")  # the default: chunks of 4
    assert all(sorted(s.count(x) for x in set(s)) in ([8], [4, 4]) for s in chunked.values())
    random.seed(0)
    default, _ = route_batch(GlobalRequestLoadBalancer(dict(SERVERS)), batch, n=8, tag="a")
    assert np.mean([top_share(s) for s in default.values()]) < 0.5  # about 1/4 over 4 replicas


def test_revisits_return_to_the_replica_that_served_the_prompt():
    ps = prompts(32)
    lb = balancer(group_chunk=0)
    first, _ = route_batch(lb, list(enumerate(ps)), n=8, tag="e1")
    order = list(enumerate(ps))
    random.Random(1).shuffle(order)  # the next epoch, in another order
    second, _ = route_batch(lb, order, n=8, tag="e2")
    assert all(len(set(s)) == 1 for s in second.values())  # whole groups
    # most go back; a few whose stores share a replica arrive together early in the batch and are passed
    # on by the one-group slack over what is in flight (benchmarks/routing.py measures the share at scale)
    back = sum(first[p] == second[p] for p in first)
    assert back >= 0.85 * len(first)
    stats = lb.routing_stats()
    assert stats["revisit_requests"] == 32 * 8 and stats["revisit_store_share_sum"] == 8 * back


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
    import itertools

    lb = SamLoadBalancer(
        dict(SERVERS), {"policy": PROMPT_AFFINITY, "group_chunk": 0}, clock=itertools.count().__next__
    )  # a tick an event
    batch = list(enumerate(prompts(64, seed=3)))
    placed, held = route_batch(lb, batch, n=8, tag="b", release=False)
    inflight = lb.get_status()["servers"]
    assert max(inflight.values()) <= 1.25 * np.mean(list(inflight.values()))
    assert all(top_share(s) == 1.0 for s in placed.values())
    step = RoutingStepTracker().step_metrics(lb.routing_stats())
    assert step["rollout/route_inflight_max_over_mean"] <= 1.25
    assert step["rollout/route_group_colocation"] == 1.0


def test_a_replica_over_its_bound_passes_the_group_on():
    """Stores that stay (no handoff): the ring's order, and the bound passes a group on along it."""
    two = dict(list(SERVERS.items())[:2])
    lb = balancer(servers=two, store_handoff=False)
    ps = prompts(200, seed=5)
    home = lb._ring.walk  # the ring's first choice of each prompt
    from sam_rollout.drafter.prompt_store import prompt_key

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
    assert all(p in moved for p, sids in placed.items() if sids[0] == victim)  # the removed replica's moved
    assert len(moved) <= 2 * sum(sids[0] == victim for sids in placed.values())  # and few others
    assert lb.get_total_inflight() == 0


def test_an_added_replica_takes_a_share_and_most_prompts_stay():
    lb = balancer(servers=dict(list(SERVERS.items())[:3]))
    ps = prompts(120, seed=9)
    before, _ = route_batch(lb, list(enumerate(ps)), n=2, tag="x1")
    tracker = RoutingStepTracker()
    tracker.step_metrics(lb.routing_stats())
    new = list(SERVERS)[3]
    lb.add_servers({new: SERVERS[new]})
    after, _ = route_batch(lb, list(enumerate(ps)), n=2, tag="x2")
    step = tracker.step_metrics(lb.routing_stats())
    on_new = sum(sids[0] == new for sids in after.values())
    # the others keep the prompts whose stores they hold up to the bound, which pushes the rest to the new one
    assert on_new > 0 and step["rollout/route_requests_max_over_mean"] <= 1.25
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
        ({"load_bound": 0.9}, "load_bound must be a finite number >= 1"),
        ({"load_bound": float("inf")}, "load_bound must be a finite number >= 1, got inf"),
        ({"load_bound": float("nan")}, "load_bound must be a finite number >= 1, got nan"),
        ({"virtual_nodes": 0}, "virtual_nodes must be an integer >= 1"),
        ({"virtual_nodes": 10_000_000}, "virtual_nodes must be at most 4096, got 10000000"),
        ({"router_class": 5}, "router_class must be a qualified class name (a string), got 5"),
        ({"load_bond": 1.5}, "unknown key(s) ['load_bond']"),
        ({"store_handoff": "yes"}, "store_handoff must be true or false, got 'yes'"),
        ({"group_chunk": -1}, "group_chunk must be an integer >= 0 (0: whole groups), got -1"),
        ({"group_chunk": 2.5}, "group_chunk must be an integer >= 0 (0: whole groups), got 2.5"),
    ],
)
def test_bad_router_settings_name_the_setting(config, message):
    with pytest.raises(ValueError) as e:
        RouterSettings.from_yaml_dict({"router_class": "x.Y"} | config)
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
        lb._request_id_to_server[rid] = home  # a sticky request (verl's cache) without a prompt
        assert lb.acquire_server(request_id=rid)[0] == home
    assert route_batch(lb, [(0, ids)], n=4, tag="v2")[0][0] == [other] * 4
    for sid, rid in held:
        lb.release_server(sid, request_id=rid)
    # both replicas hold its responses now; the newest are on `other`, which it tries first
    assert route_batch(lb, [(0, ids)], n=4, tag="v3")[0][0] == [other] * 4
    assert lb.routing_stats()["revisit_store_share_sum"] == 4.0  # v2 found none of v1 there, v3 all of v2


def route_orders(lb, ps, order, tag):
    held = []
    for p in order:
        for j in range(4):
            rid = f"{tag}-{p}-{j}"
            held.append((lb.acquire_server(request_id=rid, prompt_ids=ps[p])[0], rid))
    for sid, rid in held:
        lb.release_server(sid, request_id=rid)


def test_a_resumed_router_named_by_replica_keys_routes_every_arrival_order_to_the_stores(tmp_path):
    """The CPU preset's resume: 4 groups of 4 on 2 replicas, any order in step 1, saved; a new router
    whose servers come in the other order with new addresses, named by replica key, loads the state
    and sends every group of step 2, in any order, to where its last visit ran (stores that stay)."""
    import itertools

    ps = prompts(4, seed=23)
    path = str(tmp_path / "router.json")
    two = list(SERVERS)[:2]
    for first in itertools.permutations(range(4)):
        lb = balancer(servers={s: None for s in two}, store_handoff=False)
        lb.set_ring_names({two[0]: "rollout_0", two[1]: "rollout_1"})
        route_orders(lb, ps, first, "s1")
        lb.save_state(path)
        for second in itertools.permutations(range(4)):
            renamed = {"10.9.9.1:9000": None, "10.9.9.0:9000": None}  # shuffled, new addresses
            resumed = balancer(servers=renamed, store_handoff=False)
            resumed.set_ring_names({"10.9.9.0:9000": "rollout_0", "10.9.9.1:9000": "rollout_1"})
            assert resumed.load_state(path) == {"prompts": 4, "warning": None}
            route_orders(resumed, ps, second, "s2")
            stats = resumed.routing_stats()
            assert stats["revisit_requests"] == 16 == stats["revisit_store_share_sum"], (first, second)


def test_ring_names_must_be_unique_and_unnamed_replicas_are_reported():
    lb = balancer()
    a, b, c, _ = SERVERS
    with pytest.raises(ValueError, match="unique"):
        lb.set_ring_names({a: "x", b: "x"})
    named = lb.set_ring_names({a: "rollout_0", c: "rollout_2", "10.1.1.1:1": "gone"})
    assert named["named"] == ["rollout_0", "rollout_2"] and len(named["by_order"]) == 2


def test_an_older_router_state_says_so(tmp_path):
    path = tmp_path / "router.json"
    path.write_text('{"format": 1, "served": {}}')
    loaded = balancer().load_state(str(path))
    assert loaded["prompts"] == 0 and "expected 2" in loaded["warning"] and "older version" in loaded["warning"]


def test_a_smaller_batch_after_a_large_one_stays_within_one_group_of_the_bound():
    """8 groups of 8 new prompts on 4 replicas after a 64 x 8 batch (the issue's case: 32/8/16/8 before).
    Returning prompts are exempt: their store's replica takes them up to the batch's bound (next test)."""
    ps = prompts(64, seed=29)
    for trial in range(10):
        lb = balancer()
        route_batch(lb, list(enumerate(ps)), n=8, tag=f"big{trial}")
        fresh = prompts(8, seed=1000 + trial)
        route_batch(lb, [(64 + i, ids) for i, ids in enumerate(fresh)], n=8, tag=f"small{trial}", release=False)
        inflight = list(lb.get_status()["servers"].values())
        assert max(inflight) <= 1.25 * np.mean(inflight) + 8  # one group of slack: 28, so at most 24


def test_the_group_size_follows_the_live_groups():
    """After groups of 8, single requests of new prompts keep to their ring home while the load allows."""
    lb = balancer()
    route_batch(lb, list(enumerate(prompts(16, seed=31))), n=8, tag="eights")
    singles = list(enumerate(prompts(40, seed=37)))
    placed, _ = route_batch(lb, singles, n=1, tag="ones", release=False)
    assert lb.estimates.group_size == 1
    home = {p: lb._ring.walk(int.from_bytes(prompt_key(np.asarray(ids, dtype=np.int32))[:8], "big"))[0]
            for p, ids in singles}  # fmt: skip
    moved = sum(placed[p][0] != home[p] for p in placed)
    inflight = list(lb.get_status()["servers"].values())
    assert max(inflight) <= 1.25 * np.mean(inflight) + 1 and moved < len(singles) // 2


def test_a_group_whose_prompt_cost_more_weighs_more():
    """Load is work: a replica holding a prompt whose requests took long takes fewer new groups."""
    clock = [0.0]
    two = {s: None for s in list(SERVERS)[:2]}
    lb = SamLoadBalancer(dict(two), {"policy": PROMPT_AFFINITY}, clock=lambda: clock[0])
    ps = prompts(2, seed=41)
    costs = {0: 10.0, 1: 1.0}
    for p in (0, 1):  # first visits: prompt 0's requests take 10 s, prompt 1's 1 s
        held = [(lb.acquire_server(request_id=f"a{p}-{j}", prompt_ids=ps[p])[0], f"a{p}-{j}") for j in range(4)]
        clock[0] += costs[p]
        for sid, rid in held:
            lb.release_server(sid, request_id=rid)
    assert lb._served[next(k for k in lb._served)].request_cost in (10.0, 1.0)
    assert sorted(m.request_cost for m in lb._served.values()) == [1.0, 10.0]


def test_a_mid_epoch_checkpoint_keeps_every_remembered_prompt(tmp_path):
    """Saved after the first of an epoch's two batches, while the next one's requests are in flight:
    every prompt whose visit ended is in the state, and the resumed router sends each home."""
    ps = prompts(16, seed=43)
    lb = balancer()
    lb.set_ring_names({s: f"rollout_{i}" for i, s in enumerate(SERVERS)})
    first, _ = route_batch(lb, list(enumerate(ps[:8])), n=4, tag="b1")
    route_batch(lb, list(enumerate(ps[8:], start=8)), n=4, tag="b2", release=False)  # mid-step
    assert lb.save_state(str(tmp_path / "router.json")) == 8
    renamed = {f"10.9.9.{i}:9000": None for i in reversed(range(4))}
    resumed = balancer(servers=renamed)
    resumed.set_ring_names({f"10.9.9.{i}:9000": f"rollout_{i}" for i in range(4)})
    assert resumed.load_state(str(tmp_path / "router.json")) == {"prompts": 8, "warning": None}
    again, _ = route_batch(resumed, list(enumerate(ps[:8])), n=4, tag="b3")
    rank = {a: i for i, a in enumerate(SERVERS)} | {f"10.9.9.{i}:9000": i for i in range(4)}
    assert all(rank[first[p][0]] == rank[again[p][0]] for p in first)


def test_the_launcher_refuses_a_non_string_router_class(tmp_path):
    from omegaconf import OmegaConf

    from sam_rollout.verl.launcher.recipe_config import RecipeError, check_router

    path = tmp_path / "router.yaml"
    path.write_text("router_class: 5\n")
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"router_config_path": str(path)}}})
    with pytest.raises(RecipeError, match="router_class must be a qualified class name"):
        check_router(cfg)


def dapo_step_one(lb, clock, ps):
    """Step 1 of the training test as verl 0.9.1's sync DAPO trainer ran it in CI (issue 39): 4 groups of 4
    on 2 replicas, the requests on prompt 0's replica done in 2 s, the others' in 10 s (seconds in flight
    on a loaded CPU, not work); two groups were filtered, and their refills came one at a time as slots
    freed: prompt 0's while its group still ran (it joins the group: an 8-request visit), prompt 1's after
    the batch drained (a busy period of 4). Returns {prompt: replica}."""

    def acquire(tag, p):
        return [(lb.acquire_server(request_id=f"{tag}{p}-{j}", prompt_ids=ps[p])[0], f"{tag}{p}-{j}") for j in range(4)]

    def release(held, seconds):
        clock[0] += seconds
        for sid, rid in held:
            lb.release_server(sid, request_id=rid)

    held = {p: acquire("a", p) for p in range(4)}
    home = {p: held[p][0][0] for p in held}
    fast = [p for p in held if home[p] == home[0]]
    release(held[fast[1]], 2.0)  # done and filtered: its slot takes prompt 0's refill
    release(held[0] + acquire("r", 0), 0.0)
    release([h for p in held if p not in fast for h in held[p]], 8.0)
    release(acquire("r", 1), 2.0)  # the second refill, after the batch drained
    return home


def interleavings(groups, n=4):
    """Step 2's acquires: every order of the groups, each group's requests adjacent or round-robin."""
    import itertools

    for order in itertools.permutations(groups):
        yield [(p, j) for p in order for j in range(n)]
        yield [(p, j) for j in range(n) for p in order]


def saved_dapo_step_one(tmp_path, clock, ps, two):
    """CI's step 1 on a router named by replica keys, saved as verl saves it: (state path, home). Groups whole,
    as CI's router placed them (a refill joined its group's replica)."""
    config = {"policy": PROMPT_AFFINITY, "group_chunk": 0}
    lb = SamLoadBalancer({s: s for s in two}, config, clock=lambda: clock[0])
    lb.set_ring_names({two[0]: "rollout_0", two[1]: "rollout_1"})
    home = dapo_step_one(lb, clock, ps)
    assert sorted(list(home.values()).count(s) for s in two) == [2, 2]
    path = str(tmp_path / "router.json")
    lb.save_state(path)  # verl saves the checkpoint before it logs the step
    assert lb.end_step() == 16 and lb.estimates.batch_requests == 16  # the batch, not the refill's 4
    return path, home


def resumed_router(path, clock, handoff=None, **settings):
    """A restarted router: servers in another order with new addresses, named by the same keys."""
    renamed = {"10.9.9.1:9000": "10.9.9.1:9000", "10.9.9.0:9000": "10.9.9.0:9000"}
    lb = SamLoadBalancer(renamed, {"policy": PROMPT_AFFINITY, **settings}, clock=lambda: clock[0], handoff=handoff)
    lb.set_ring_names({"10.9.9.0:9000": "rollout_0", "10.9.9.1:9000": "rollout_1"})
    assert lb.load_state(path) == {"prompts": 4, "warning": None}
    return lb


def test_a_resumed_dapo_step_goes_back_to_the_stores_in_every_arrival_order(tmp_path):
    """CI read store share 0.5 on the training test's resumed step: the saved bound expected a batch of 8
    (the refill's busy period), the seconds its prompts took made one replica's stores look 5x heavier,
    and prompt 0's merged visit looked like a group of 8. With stores that cannot move
    (store_handoff: false), a resumed router sends every group of step 2 back to its store, in every
    arrival order."""
    clock = [0.0]
    two = list(SERVERS)[:2]
    ps = prompts(4, seed=47)
    path, home = saved_dapo_step_one(tmp_path, clock, ps, two)
    rank = {s: i for i, s in enumerate(two)}
    for arrivals in interleavings(range(4)):
        resumed = resumed_router(path, clock, store_handoff=False)
        placed = {p: resumed.acquire_server(request_id=f"b{p}-{j}", prompt_ids=ps[p])[0] for p, j in arrivals}
        assert {p: int(s[-6]) for p, s in placed.items()} == {p: rank[s] for p, s in home.items()}, arrivals
        stats = resumed.routing_stats()
        assert stats["revisit_requests"] == 16 == stats["revisit_store_share_sum"], arrivals
        assert stats["store_handoffs"] == 0


def test_a_resumed_dapo_step_finds_every_store_on_its_replica_with_handoffs(tmp_path):
    """With store handoffs (the default), a group the load bound sends off its store's replica takes the
    store along: in every arrival order, every revisit finds its prompt's whole last visit on its
    replica, and a copy is made exactly for the groups placed away from their stores."""
    clock = [0.0]
    two = list(SERVERS)[:2]
    ps = prompts(4, seed=47)
    path, home = saved_dapo_step_one(tmp_path, clock, ps, two)
    new_address = {"10.0.0.0:8000": "10.9.9.0:9000", "10.0.0.1:8000": "10.9.9.1:9000"}
    moved_orders = 0
    for arrivals in interleavings(range(4)):
        copies = StoreCopies()
        resumed = resumed_router(path, clock, handoff=copies)
        placed = {p: resumed.acquire_server(request_id=f"b{p}-{j}", prompt_ids=ps[p])[0] for p, j in arrivals}
        away = {p for p in placed if placed[p] != new_address[home[p]]}
        keys = {p: prompt_key(np.asarray(ps[p], dtype=np.int32)) for p in placed}
        assert sorted(keys[p] for p in away) == sorted(k for k, _, _ in copies.copies)
        for key, sources, target in copies.copies:
            p = next(p for p in away if keys[p] == key)
            assert sources == [new_address[home[p]]] and target == placed[p]
        stats = resumed.routing_stats()
        assert stats["revisit_requests"] == 16 == stats["revisit_store_available_sum"], arrivals
        assert stats["store_handoffs"] == len(away) and stats["store_handoff_failures"] == 0
        moved_orders += bool(away)
    assert moved_orders  # the work bound does move groups here: the copies are exercised


def test_a_failed_handoff_is_counted_and_the_group_runs_without_its_store(tmp_path):
    clock = [0.0]
    two = list(SERVERS)[:2]
    ps = prompts(4, seed=47)
    path, _ = saved_dapo_step_one(tmp_path, clock, ps, two)
    for arrivals in interleavings(range(4)):
        resumed = resumed_router(path, clock, handoff=lambda key, sources, target: False)
        for p, j in arrivals:
            resumed.acquire_server(request_id=f"b{p}-{j}", prompt_ids=ps[p])
        stats = resumed.routing_stats()
        assert stats["revisit_store_available_sum"] == stats["revisit_store_share_sum"]
        if stats["store_handoff_failures"]:
            return
    raise AssertionError("no arrival order moved a group: the failure path was not exercised")


def test_servers_without_the_handoff_methods_turn_handoffs_off_once():
    from sam_rollout.verl.runtime.store_handoff import RayStoreHandoff

    handoff = RayStoreHandoff()
    assert handoff(b"k" * 16, [object()], object()) is False
    assert "cannot hand off" in handoff.unsupported
    assert handoff(b"k" * 16, [object()], object()) is False  # not tried again


def test_with_handoffs_a_store_keeps_its_group_only_near_the_least_loaded():
    """Two replicas, other groups' work 10 in flight on the second; a prompt's store on the first (a group
    of 4 at 1.0 a request: work 4). Within half a group (2.0) of the least loaded, the group goes back to
    its store (no copy); further off, the least loaded takes it and a copy of the store."""
    two = dict(list(SERVERS.items())[:2])
    a, b = list(two)
    target = prompts(1, seed=11)[0]
    for work_on_a, expect in ((11.5, a), (12.5, b)):
        copies = StoreCopies()
        lb = SamLoadBalancer(dict(two), {"policy": PROMPT_AFFINITY}, clock=lambda: 0.0, handoff=copies)
        lb._remember(prompt_key(np.asarray(target, dtype=np.int32)), {a: 4}, request_cost=1.0)
        lb._load.work.update({a: work_on_a, b: 10.0})  # other groups' work in flight
        sid, _ = lb.acquire_server(request_id="t-0", prompt_ids=target)
        assert sid == expect, (work_on_a, sid)
        assert [(t, src) for _, src, t in copies.copies] == ([] if sid == a else [(two[b], [two[a]])])
        stats = lb.routing_stats()
        assert stats["revisit_store_available_sum"] == 1.0 and stats["store_handoffs"] == (sid != a)


def test_group_chunks_spread_a_group_and_each_chunk_takes_the_store_along():
    """group_chunk 4: a group of 16 goes out in chunks of 4, each to the least loaded replica then, so a
    new prompt's long group cannot gather on one replica; on the prompt's next visit every replica a
    chunk lands on and that lacks the store gets a copy, and every revisit finds the whole last visit."""
    copies = StoreCopies()
    config = {"policy": PROMPT_AFFINITY, "group_chunk": 4}
    lb = SamLoadBalancer(dict(SERVERS), config, clock=lambda: 0.0, handoff=copies)
    ps = list(enumerate(prompts(2, seed=5)))
    placed, _ = route_batch(lb, ps, 16, "first")
    for sids in placed.values():
        assert sorted(sids.count(s) for s in set(sids)) == [4, 4, 4, 4]  # one chunk per replica
        assert all(len(set(sids[i : i + 4])) == 1 for i in range(0, 16, 4))  # siblings fill their chunk
    assert copies.copies == []  # first visits: nothing to copy
    placed, _ = route_batch(lb, ps, 16, "again")
    stats = lb.routing_stats()
    assert stats["revisit_requests"] == 32 == stats["revisit_store_available_sum"]
    for _key, sources, target in copies.copies:  # never from the replica it goes to
        assert target not in sources
    assert stats["store_handoffs"] == len(copies.copies)


@pytest.mark.parametrize("settings", [{"group_chunk": 0}, {"store_handoff": False}])
def test_with_group_chunk_0_or_without_handoffs_a_group_stays_whole(settings):
    config = {"policy": PROMPT_AFFINITY, **settings}
    lb = SamLoadBalancer(dict(SERVERS), config, clock=lambda: 0.0, handoff=StoreCopies())
    placed, _ = route_batch(lb, list(enumerate(prompts(3, seed=6))), 16, "whole")
    assert all(len(set(sids)) == 1 for sids in placed.values())
