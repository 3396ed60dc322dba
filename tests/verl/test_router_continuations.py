"""A prompt is a prompt (issue 39): a multi-turn trajectory's later turns and a partial rollout's resumes
reach the router under the trajectory's request id with a longer prompt (the first prompt, the
responses so far, tool outputs). They keep the first prompt's key and replica, count once as a request
of their prompt and never as a revisit; a new prompt that merely shares a prefix is not merged."""

import json
import random

import numpy as np
from verl_step import verl_step_only

verl_step_only()

from sam_rollout.routing_metrics import RoutingStepTracker  # noqa: E402
from sam_rollout.verl.runtime.router import LEAST_LOADED, PROMPT_AFFINITY, SamLoadBalancer  # noqa: E402

SERVERS = {f"10.0.0.{i}:8000": f"handle-{i}" for i in range(4)}
SYSTEM = list(range(100, 160))  # a system prompt every prompt starts with


def balancer(policy=PROMPT_AFFINITY):
    return SamLoadBalancer(dict(SERVERS), {"policy": policy})


def prompt(seed):
    rng = np.random.default_rng(seed)
    return SYSTEM + rng.integers(0, 50_000, size=int(rng.integers(20, 80))).tolist()


def turn_tokens(rid, turn, size=6):
    """A response or a tool output: tokens of its own (sampled text matches no other)."""
    return np.random.default_rng(abs(hash((rid, turn))) % 2**32).integers(50_000, 60_000, size=size).tolist()


def multi_turn_group(lb, ids, n, tag, turns=3):
    """n siblings of a GRPO group as verl's tool agent loop sends them: each turn acquires under the
    trajectory's request id with prompt + earlier responses + tool outputs, released when generated;
    the siblings' turns interleave. Returns {request id: [replica of each turn]}."""
    trajectories = {f"{tag}-{j}": list(ids) for j in range(n)}
    replicas = {rid: [] for rid in trajectories}
    for turn in range(turns):
        held = []
        for rid, so_far in trajectories.items():
            sid, _ = lb.acquire_server(request_id=rid, prompt_ids=so_far)
            replicas[rid].append(sid)
            held.append((sid, rid))
        random.Random(f"{tag}{turn}").shuffle(held)
        for sid, rid in held:
            lb.release_server(sid, request_id=rid)
            trajectories[rid] += turn_tokens(rid, f"response {turn}") + turn_tokens(rid, f"tool {turn}")
    return replicas


def saved_prompts(lb, tmp_path):
    lb.save_state(str(tmp_path / "router.json"))
    return json.loads((tmp_path / "router.json").read_text())["served"]


def test_a_three_turn_group_keeps_its_replica_and_key_and_counts_once(tmp_path):
    lb = balancer()
    ids = prompt(0)
    replicas = multi_turn_group(lb, ids, n=4, tag="g")
    assert len({sid for turns in replicas.values() for sid in turns}) == 1  # every turn of every sibling
    stats = lb.routing_stats()
    assert stats["requests"] == 12 and stats["continued_requests"] == 8 and stats["keyed_requests"] == 4
    assert stats["revisit_requests"] == 0 and stats["sibling_observations"] == 3  # first turns only
    (served,) = saved_prompts(lb, tmp_path).values()  # one prompt remembered, no key of a later turn
    assert served["replicas"] == {lb.get_status()["ring_names"][replicas["g-0"][0]]: 4}  # its four trajectories
    assert lb.estimates.group_size == 4  # a later turn is no group of one
    step = RoutingStepTracker().step_metrics(stats)
    assert step["rollout/requests"] - step["rollout/route_continued_requests"] == 4  # the trajectories


def test_turns_after_the_visit_ended_are_no_revisit_and_the_next_epoch_is_one(tmp_path):
    """One trajectory alone: between its turns nothing is in flight, so its visit ends at each release;
    the later turns still count as no revisit, and the prompt's next visit counts once per request."""
    lb = balancer()
    ids = prompt(1)
    first = multi_turn_group(lb, ids, n=1, tag="a")["a-0"]
    assert len(set(first)) == 1
    stats = lb.routing_stats()
    assert stats["revisit_requests"] == 0 and stats["keyed_requests"] == 1 and stats["continued_requests"] == 2
    (served,) = saved_prompts(lb, tmp_path).values()
    assert served["replicas"] == {lb.get_status()["ring_names"][first[0]]: 1}
    again = multi_turn_group(lb, ids, n=2, tag="b")  # the next epoch: two samples
    stats = lb.routing_stats()
    assert stats["revisit_requests"] == 2 and stats["revisit_store_share_sum"] == 2.0
    assert all(turns == [first[0]] * 3 for turns in again.values())


def test_a_partial_rollout_resumed_after_a_rebalance_keeps_its_key_and_replica():
    """Fully async: a weight sync aborts every request (each releases), verl clears its sticky cache to
    rebalance, and each request resumes under its id with prompt + the tokens generated so far."""
    lb = balancer()
    groups = {g: prompt(10 + g) for g in range(6)}
    placed = {}
    for g, ids in groups.items():
        for j in range(4):
            placed[(g, j)] = lb.acquire_server(request_id=f"{g}-{j}", prompt_ids=ids)[0]
    for (g, j), sid in placed.items():
        lb.release_server(sid, request_id=f"{g}-{j}")  # aborted
    assert lb.clear_sticky_cache()["cleared_entries"] == 24
    overflowed = lb.routing_stats()["overflowed_groups"]
    for (g, j), sid in placed.items():
        partial = turn_tokens(f"{g}-{j}", "partial", size=j)  # j = 0: aborted before its first token
        resumed, _ = lb.acquire_server(request_id=f"{g}-{j}", prompt_ids=groups[g] + partial)
        assert resumed == sid
    stats = lb.routing_stats()
    assert stats["continued_requests"] == 24 - 6 and stats["overflowed_groups"] == overflowed
    # the six resumed with no token, after their visit ended, the router cannot tell from a reused request
    # id's next visit of the same prompt (the next test): requests of their prompt, routed by the same key
    assert stats["keyed_requests"] == 24 + 6 and stats["revisit_requests"] == 6


def test_a_resume_before_any_token_while_its_group_runs_is_a_continuation():
    lb = balancer()
    ids = prompt(2)
    sids = [lb.acquire_server(request_id=f"r{j}", prompt_ids=ids)[0] for j in range(4)]
    lb.release_server(sids[0], request_id="r0")  # aborted with nothing generated; its siblings run on
    assert lb.acquire_server(request_id="r0", prompt_ids=ids)[0] == sids[0]
    stats = lb.routing_stats()
    assert stats["continued_requests"] == 1 and stats["keyed_requests"] == 4 and stats["sibling_observations"] == 3


def test_a_new_prompt_that_extends_another_is_not_merged():
    """Same system prompt, and even a prompt that starts with another whole prompt: a request id of its
    own makes it a new prompt, with its own key, group and route."""
    lb = balancer()
    base = prompt(3)
    longer = base + turn_tokens("other", "question")
    sid, _ = lb.acquire_server(request_id="x", prompt_ids=base)
    lb.acquire_server(request_id="y", prompt_ids=longer)
    lb.acquire_server(request_id="z", prompt_ids=prompt(4))  # only the system prompt in common
    stats = lb.routing_stats()
    assert stats["continued_requests"] == 0 and stats["keyed_requests"] == 3 and stats["sibling_observations"] == 0
    assert lb.get_status()["groups_in_flight"] == 3


def test_a_reused_request_id_with_another_prompt_is_a_new_request():
    """verl's full_determinism names requests det-<sample index> every step: the next step's det-0 is
    another prompt, or the same prompt again (a revisit), never a continuation."""
    lb = balancer()
    a, b = prompt(5), prompt(6)
    for first, second in [(a, b), (b, a), (b, a)]:
        held = [(lb.acquire_server(request_id=f"det-{i}", prompt_ids=first if i < 4 else second)[0], f"det-{i}")
                for i in range(8)]  # fmt: skip
        for sid, rid in held:
            lb.release_server(sid, request_id=rid)
    stats = lb.routing_stats()
    assert stats["continued_requests"] == 0 and stats["keyed_requests"] == 24
    assert stats["revisit_requests"] == 16  # every request of steps 2 and 3


def test_verls_policy_through_our_class_counts_trajectories_alike():
    lb = balancer(LEAST_LOADED)
    random.seed(0)
    replicas = multi_turn_group(lb, prompt(7), n=4, tag="l")
    assert all(len(set(turns)) == 1 for turns in replicas.values())  # verl's stickiness per request id
    stats = lb.routing_stats()
    assert stats["continued_requests"] == 8 and stats["keyed_requests"] == 4 and stats["revisit_requests"] == 0


def test_verls_partial_rollout_client_resumes_under_one_request_id_with_the_tokens_so_far():
    """verl's own FullyAsyncLLMServerClient.generate against our router and a server that aborts each
    request's first attempt: the resume carries the same request id and prompt + partial response."""
    import asyncio

    import ray
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    @ray.remote(num_cpus=0)
    class AbortingServer:
        """Aborts a request's first attempt (its prompt alone) once both siblings' have arrived."""

        def __init__(self, prompt_length):
            self.prompt_length, self.seen, self.both = prompt_length, [], asyncio.Event()

        async def generate(self, request_id, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
            self.seen.append(list(prompt_ids))
            first = len(prompt_ids) == self.prompt_length
            if first:
                if sum(len(p) == self.prompt_length for p in self.seen) == 2:
                    self.both.set()
                await asyncio.wait_for(self.both.wait(), timeout=30)
            return TokenOutput(token_ids=[7, 8, 9], stop_reason="aborted" if first else "completed")

        def prompts(self):
            return self.seen

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        ids = prompt(8)
        servers = {f"10.0.0.{i}:8000": AbortingServer.remote(len(ids)) for i in range(2)}
        router = ray.remote(SamLoadBalancer).remote(servers, {"policy": PROMPT_AFFINITY})
        config = OmegaConf.create(
            {
                "actor_rollout_ref": {"rollout": {"full_determinism": False, "name": "vllm", "response_length": 64}},
                "async_training": {"partial_rollout": True},
            }
        )
        client = FullyAsyncLLMServerClient(config=config, load_balancer_handle=router)

        async def one(rid):
            return await client.generate(rid, prompt_ids=ids, sampling_params={"max_tokens": 64})

        async def group():  # two siblings, generated together
            return await asyncio.gather(one("p-0"), one("p-1"))

        outputs = asyncio.run(group())
        assert all(o.token_ids == [7, 8, 9] * 2 for o in outputs)
        seen = [p for s in servers.values() for p in ray.get(s.prompts.remote())]
        assert sorted(map(len, seen)) == [len(ids)] * 2 + [len(ids) + 3] * 2  # the resumes: prompt + partial
        stats = ray.get(router.routing_stats.remote())
        assert stats["requests"] == 4 and stats["continued_requests"] == 2 and stats["keyed_requests"] == 2
        assert stats["revisit_requests"] == 0
        assert sum(1 for n in stats["requests_by_server"].values() if n) == 1  # one replica, the group's
    finally:
        ray.shutdown()
