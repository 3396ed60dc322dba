"""Tests for the vectorised rejection sampler and its plain-loop reference.

Exactness is tested in distribution with chi-square tests (200k draws, fixed
seeds, alpha = 1e-3); ``test_chi_square_detects_one_percent_error`` shows the
same checks reject a sampler whose output is off by 1% in total variation.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import sam_rollout.rejection
from sam_rollout.rejection import (
    PLACEHOLDER_TOKEN_ID,
    expand_batch_to_tokens,
    rejection_sample,
    sample_recovered_tokens,
)
from sam_rollout.rejection_loop import rejection_sample_reference
from testkit.chi_square import chi_square_p_value  # tests/test_vllm_cpu_sampler.py imports it from here

Sampler = Callable[..., torch.Tensor]


def rejection_sample_every_row(**arguments) -> torch.Tensor:
    """The vectorised sampler as it runs on an accelerator: a recovered token for every request."""
    original_rule = sam_rollout.rejection.recovers_every_request
    sam_rollout.rejection.recovers_every_request = lambda device: True
    try:
        return rejection_sample(**arguments)
    finally:
        sam_rollout.rejection.recovers_every_request = original_rule


VECTORISED = {"vectorised": rejection_sample, "vectorised-every-row": rejection_sample_every_row}
SAMPLERS = {**VECTORISED, "loop": rejection_sample_reference}
NUM_DRAWS = 200_000
# The loop reference is a Python loop per request (about 1 ms each); it also agrees token for token with
# the vectorised sampler given the same random numbers (below), so its own distribution checks use fewer.
DRAWS = {"vectorised": NUM_DRAWS, "vectorised-every-row": NUM_DRAWS, "loop": NUM_DRAWS // 4}
ALPHA = 1e-3


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def token_counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(tokens, minlength=vocab_size)


def pair_counts(first: np.ndarray, second: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(first * vocab_size + second, minlength=vocab_size**2).reshape(vocab_size, vocab_size)


def random_distributions(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Dirichlet(1) distributions over the last axis, float64."""
    weights = torch.empty(shape, dtype=torch.float64).exponential_(generator=generator)
    return weights / weights.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------
# Batch builders
# ---------------------------------------------------------------------------


def cumulative(num_draft_tokens: list[int]) -> torch.Tensor:
    return torch.tensor(num_draft_tokens, dtype=torch.int64).cumsum(0).to(torch.int32)


@dataclass
class TwoPositionScenario:
    """N identical two-draft requests whose true next-two-token law is ``p1(a) * p2[a](b)``.

    The target at position 2 depends on the token at position 1 (the drafted
    prefix), as it does in a real model; drafts are random per request.
    """

    vocab_size: int
    p1: torch.Tensor  # [V] target at position 1
    p2: torch.Tensor  # [V, V] target at position 2 given the token at position 1
    sampler_kwargs: dict

    @classmethod
    def build(cls, num_requests: int, vocab_size: int, with_draft_probs: bool, seed: int) -> TwoPositionScenario:
        generator = torch.Generator().manual_seed(seed)
        p1 = random_distributions(generator, (vocab_size,))
        p2 = random_distributions(generator, (vocab_size, vocab_size))
        if with_draft_probs:
            q1 = random_distributions(generator, (vocab_size,))
            q2 = random_distributions(generator, (vocab_size, vocab_size))
            x1 = torch.multinomial(q1.expand(num_requests, -1), 1, generator=generator).squeeze(1)
            x2 = torch.multinomial(q2[x1], 1, generator=generator).squeeze(1)
            draft_probs = torch.stack([q1.expand(num_requests, -1), q2[x1]], dim=1)
            draft_probs = draft_probs.reshape(-1, vocab_size).to(torch.float32).contiguous()
        else:
            # A model-free drafter: a deterministic proposal that depends on the context.
            next_draft = torch.randint(0, vocab_size, (vocab_size,), generator=generator)
            x1 = torch.randint(0, vocab_size, (num_requests,), generator=generator)
            x2 = next_draft[x1]
            draft_probs = None
        target_probs = torch.stack([p1.expand(num_requests, -1), p2[x1]], dim=1).reshape(-1, vocab_size)
        num_draft_tokens = [2] * num_requests
        sampler_kwargs = dict(
            draft_token_ids=torch.stack([x1, x2], dim=1).reshape(-1).to(torch.int32),
            num_draft_tokens=num_draft_tokens,
            max_spec_len=2,
            cu_num_draft_tokens=cumulative(num_draft_tokens),
            draft_probs=draft_probs,
            target_logits=target_probs.log().to(torch.float32),
            bonus_token_ids=torch.zeros(num_requests, 1, dtype=torch.int64),
            temperature=torch.ones(num_requests),
        )
        return cls(vocab_size, p1, p2, sampler_kwargs)

    def first_two_tokens(self, output_token_ids: torch.Tensor, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens 1 and 2 of each request; where the step stopped after token 1,
        token 2 is the next step's draw from ``p2[token 1]``."""
        first = output_token_ids[:, 0].long()
        second = output_token_ids[:, 1].long()
        stopped = second == PLACEHOLDER_TOKEN_ID
        generator = torch.Generator().manual_seed(seed)
        next_step = torch.multinomial(self.p2[first], 1, generator=generator).squeeze(1)
        second = torch.where(stopped, next_step, second)
        return first.numpy(), second.numpy()

    def joint_probs(self) -> np.ndarray:
        return (self.p1.unsqueeze(1) * self.p2).numpy()


def move_mass(
    tokens: np.ndarray, from_token: int, to_token: int, mass: float, from_prob: float, seed: int
) -> np.ndarray:
    """Relabel ``from_token`` as ``to_token`` with probability ``mass / from_prob``: moves ``mass`` of probability."""
    rng = np.random.default_rng(seed)
    moved = (tokens == from_token) & (rng.random(tokens.shape) < mass / from_prob)
    return np.where(moved, to_token, tokens)


# ---------------------------------------------------------------------------
# Exactness in distribution
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sampler_name", SAMPLERS)
@pytest.mark.parametrize(("with_draft_probs", "vocab_size"), [(True, 6), (False, 8)], ids=["draft-probs", "point-mass"])
def test_first_two_tokens_follow_target(sampler_name: str, with_draft_probs: bool, vocab_size: int) -> None:
    torch.manual_seed(1234)
    scenario = TwoPositionScenario.build(DRAWS[sampler_name], vocab_size, with_draft_probs, seed=vocab_size)
    output = SAMPLERS[sampler_name](**scenario.sampler_kwargs)
    first, second = scenario.first_two_tokens(output, seed=99)

    assert chi_square_p_value(token_counts(first, vocab_size), scenario.p1.numpy()) > ALPHA
    assert chi_square_p_value(pair_counts(first, second, vocab_size), scenario.joint_probs()) > ALPHA


@pytest.mark.slow
def test_chi_square_detects_one_percent_error() -> None:
    """The checks above reject samplers that are off by 0.01 in total variation, with
    the mass moved between the two most likely outcomes, the hardest place to see it."""
    vocab_size = 6
    torch.manual_seed(1234)
    scenario = TwoPositionScenario.build(NUM_DRAWS, vocab_size, with_draft_probs=True, seed=vocab_size)
    first, second = scenario.first_two_tokens(rejection_sample(**scenario.sampler_kwargs), seed=99)
    p1, joint = scenario.p1.numpy(), scenario.joint_probs()
    assert chi_square_p_value(token_counts(first, vocab_size), p1) > ALPHA

    # Position 1 biased.
    top, runner_up = np.argsort(p1)[::-1][:2]
    biased_first = move_mass(first, top, runner_up, 0.01, p1[top], seed=1)
    assert chi_square_p_value(token_counts(biased_first, vocab_size), p1) < ALPHA

    # Position 2 biased given the most likely pair; position 1 untouched.
    top_pair = np.unravel_index(np.argmax(joint), joint.shape)
    row = joint[top_pair[0]]
    runner_up_in_row = np.argsort(row)[::-1][1]
    in_top_row = first == top_pair[0]
    # Within the row, relabelling with probability 0.01 / joint[a, b] moves 0.01 of joint mass.
    moved = move_mass(second, top_pair[1], runner_up_in_row, 0.01, row[top_pair[1]], seed=2)
    biased_second = np.where(in_top_row, moved, second)
    assert chi_square_p_value(pair_counts(first, biased_second, vocab_size), joint) < ALPHA


def constrained_target(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Independent numpy statement of the target after temperature, top-k and top-p."""
    scaled = logits.astype(np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")
    keep = np.zeros(len(scaled), dtype=bool)
    keep[order[:top_k]] = True
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    probs /= probs.sum()
    # Smallest set of most likely tokens whose mass reaches top_p.
    cumulative_mass = np.cumsum(probs[order])
    num_kept = int(np.searchsorted(cumulative_mass, top_p - 1e-12) + 1)
    nucleus = np.zeros(len(scaled), dtype=bool)
    nucleus[order[:num_kept]] = True
    probs = np.where(nucleus, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.slow
@pytest.mark.parametrize("sampler_name", SAMPLERS)
def test_temperature_top_k_top_p_define_the_target(sampler_name: str) -> None:
    vocab_size, temperature, top_k, top_p = 8, 0.7, 6, 0.85
    logits = torch.tensor([1.2, -0.3, 0.4, 2.0, 0.9, -1.5, 0.1, 1.6])
    expected = constrained_target(logits.numpy(), temperature, top_k, top_p)
    assert (expected == 0).sum() >= 3  # both cut-offs bite

    torch.manual_seed(7)
    num_requests = DRAWS[sampler_name]
    num_draft_tokens = [1] * num_requests
    drafts = torch.randint(0, vocab_size, (num_requests,), dtype=torch.int32)
    output = SAMPLERS[sampler_name](
        draft_token_ids=drafts,
        num_draft_tokens=num_draft_tokens,
        max_spec_len=1,
        cu_num_draft_tokens=cumulative(num_draft_tokens),
        draft_probs=None,
        target_logits=logits.expand(num_requests, -1).contiguous(),
        bonus_token_ids=torch.zeros(num_requests, 1, dtype=torch.int64),
        temperature=torch.full((num_requests,), temperature),
        top_k=torch.full((num_requests,), top_k),
        top_p=torch.full((num_requests,), top_p),
    )
    first = output[:, 0].long().numpy()
    assert chi_square_p_value(token_counts(first, vocab_size), expected) > ALPHA


# ---------------------------------------------------------------------------
# Token-for-token behaviour
# ---------------------------------------------------------------------------


def random_batch(
    generator: torch.Generator,
    batch_size: int,
    vocab_size: int,
    max_spec_len: int,
    with_draft_probs: bool,
    with_top_k_top_p: bool,
) -> dict:
    """A mixed batch: greedy and random requests, zero-draft requests, peaked targets."""
    num_draft_tokens = torch.randint(0, max_spec_len + 1, (batch_size,), generator=generator).tolist()
    num_tokens = sum(num_draft_tokens)
    drafts = torch.randint(0, vocab_size, (num_tokens,), generator=generator, dtype=torch.int32)
    logits = torch.randn(num_tokens, vocab_size, generator=generator) * 3
    # Favour the drafts so that acceptances, rejections and bonuses all occur.
    favoured = torch.rand(num_tokens, generator=generator) < 0.7
    logits[torch.arange(num_tokens)[favoured], drafts[favoured].long()] += 6
    temperature = torch.rand(batch_size, generator=generator) + 0.5
    temperature[torch.rand(batch_size, generator=generator) < 0.3] = 0.0
    draft_probs = None
    if with_draft_probs:
        draft_probs = (torch.randn(num_tokens, vocab_size, generator=generator) * 2).softmax(-1)
    return dict(
        draft_token_ids=drafts,
        num_draft_tokens=num_draft_tokens,
        max_spec_len=max_spec_len,
        cu_num_draft_tokens=cumulative(num_draft_tokens),
        draft_probs=draft_probs,
        target_logits=logits,
        bonus_token_ids=torch.randint(0, vocab_size, (batch_size, 1), generator=generator),
        temperature=temperature,
        top_k=torch.randint(0, vocab_size + 2, (batch_size,), generator=generator) if with_top_k_top_p else None,
        top_p=torch.rand(batch_size, generator=generator) * 0.6 + 0.4 if with_top_k_top_p else None,
    )


def pre_drawn_randoms(generator: torch.Generator, batch: dict) -> dict:
    num_tokens, vocab_size = batch["target_logits"].shape
    return dict(
        uniform_probs=torch.rand(num_tokens, dtype=torch.float64, generator=generator),
        recovery_noise=torch.empty(len(batch["num_draft_tokens"]), vocab_size).exponential_(generator=generator),
    )


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["point-mass", "draft-probs"])
@pytest.mark.parametrize("with_top_k_top_p", [False, True], ids=["plain", "top-k-top-p"])
def test_implementations_agree_token_for_token(with_draft_probs: bool, with_top_k_top_p: bool) -> None:
    generator = torch.Generator().manual_seed(2024)
    for trial in range(40):
        batch = random_batch(
            generator,
            batch_size=trial % 9,
            vocab_size=11,
            max_spec_len=4,
            with_draft_probs=with_draft_probs,
            with_top_k_top_p=with_top_k_top_p,
        )
        randoms = pre_drawn_randoms(generator, batch)
        loop = rejection_sample_reference(**batch, **randoms)
        for name, sampler in VECTORISED.items():
            vectorised = sampler(**batch, **randoms)
            assert torch.equal(vectorised, loop), f"{name} trial {trial}"
            assert vectorised.dtype == torch.int32


def test_implementations_agree_with_seeded_generators() -> None:
    generator = torch.Generator().manual_seed(5)
    for trial in range(20):
        batch = random_batch(
            generator,
            batch_size=6,
            vocab_size=13,
            max_spec_len=3,
            with_draft_probs=trial % 2 == 1,
            with_top_k_top_p=False,
        )
        seeds = {request: 100 * trial + request for request in range(0, 6, 2)}
        loop, *vectorised = [
            sampler(**batch, generators={r: torch.Generator().manual_seed(s) for r, s in seeds.items()})
            for sampler in (rejection_sample_reference, *VECTORISED.values())
        ]
        for output in vectorised:
            for request in seeds:
                assert torch.equal(output[request], loop[request]), f"trial {trial} request {request}"


def test_greedy_is_argmax_chain_then_target_argmax() -> None:
    vocab_size = 10
    target_argmax = [[3, 1, 2], [4, 4], [], [7, 0, 9]]
    drafts = [[3, 1, 5], [4, 4], [], [8, 0, 9]]
    bonus = [11, 12, 13, 14]
    expected = [[3, 1, 2, -1], [4, 4, 12, -1], [13, -1, -1, -1], [7, -1, -1, -1]]

    logits = torch.randn(sum(map(len, drafts)), vocab_size)
    flat_argmax = torch.tensor([token for row in target_argmax for token in row])
    logits[torch.arange(len(flat_argmax)), flat_argmax] = 10.0
    num_draft_tokens = [len(row) for row in drafts]
    batch = dict(
        draft_token_ids=torch.tensor([token for row in drafts for token in row], dtype=torch.int32),
        num_draft_tokens=num_draft_tokens,
        max_spec_len=3,
        cu_num_draft_tokens=cumulative(num_draft_tokens),
        draft_probs=None,
        target_logits=logits,
        bonus_token_ids=torch.tensor(bonus).unsqueeze(1),
        temperature=torch.zeros(4),
    )
    for sampler in SAMPLERS.values():
        assert sampler(**batch).tolist() == expected

    # Greedy rows are unaffected by random rows in the same batch.
    batch["temperature"] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    for sampler in SAMPLERS.values():
        output = sampler(**batch).tolist()
        assert [output[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]


@pytest.mark.parametrize("sampler_name", SAMPLERS)
def test_seeded_request_is_independent_of_batch(sampler_name: str) -> None:
    sampler = SAMPLERS[sampler_name]
    generator = torch.Generator().manual_seed(77)
    steps = [
        random_batch(
            generator, batch_size=5, vocab_size=50, max_spec_len=3, with_draft_probs=False, with_top_k_top_p=True
        )
        for _ in range(4)
    ]
    tracked = 3  # a request in each step's batch, forced to be random with drafts
    for step in steps:
        step["temperature"][tracked] = 0.9
        step["temperature"][0] = 0.0  # a greedy neighbour
    alone = [select_request(step, tracked) for step in steps]

    alone_generator = torch.Generator().manual_seed(4242)
    batched_generator = torch.Generator().manual_seed(4242)
    other_generator = torch.Generator().manual_seed(1)
    for step, alone_step in zip(steps, alone):
        alone_output = sampler(**alone_step, generators={0: alone_generator})
        batched_output = sampler(**step, generators={tracked: batched_generator, 1: other_generator})
        assert torch.equal(alone_output[0], batched_output[tracked])


def select_request(batch: dict, request: int) -> dict:
    """The single-request batch holding ``request`` of ``batch``."""
    num_draft_tokens = batch["num_draft_tokens"]
    start = sum(num_draft_tokens[:request])
    end = start + num_draft_tokens[request]
    rows = slice(start, end)
    return dict(
        draft_token_ids=batch["draft_token_ids"][rows],
        num_draft_tokens=[num_draft_tokens[request]],
        max_spec_len=batch["max_spec_len"],
        cu_num_draft_tokens=cumulative([num_draft_tokens[request]]),
        draft_probs=None if batch["draft_probs"] is None else batch["draft_probs"][rows],
        target_logits=batch["target_logits"][rows],
        bonus_token_ids=batch["bonus_token_ids"][request : request + 1],
        temperature=batch["temperature"][request : request + 1],
        top_k=None if batch["top_k"] is None else batch["top_k"][request : request + 1],
        top_p=None if batch["top_p"] is None else batch["top_p"][request : request + 1],
    )


# ---------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------


def single_shape_batch(
    num_requests: int, num_drafts: int, logits: torch.Tensor, drafts: torch.Tensor, temperature: float, **extra
) -> dict:
    num_draft_tokens = [num_drafts] * num_requests
    return dict(
        draft_token_ids=drafts.to(torch.int32),
        num_draft_tokens=num_draft_tokens,
        max_spec_len=num_drafts,
        cu_num_draft_tokens=cumulative(num_draft_tokens),
        draft_probs=extra.pop("draft_probs", None),
        target_logits=logits,
        bonus_token_ids=torch.full((num_requests, 1), 1),
        temperature=torch.full((num_requests,), temperature),
        **extra,
    )


@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_empty_batch(sampler: Sampler) -> None:
    batch = single_shape_batch(0, 3, torch.empty(0, 7), torch.empty(0, dtype=torch.int32), 1.0)
    assert sampler(**batch).shape == (0, 4)


@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["point-mass", "draft-probs"])
def test_all_drafts_rejected(sampler: Sampler, with_draft_probs: bool) -> None:
    num_requests, num_drafts, vocab_size = 64, 3, 9
    drafts = torch.randint(0, vocab_size, (num_requests * num_drafts,))
    logits = torch.randn(num_requests * num_drafts, vocab_size)
    logits[torch.arange(len(drafts)), drafts] = float("-inf")  # p(draft) = 0
    draft_probs = torch.rand(len(drafts), vocab_size).softmax(-1) if with_draft_probs else None
    output = sampler(**single_shape_batch(num_requests, num_drafts, logits, drafts, 1.0, draft_probs=draft_probs))
    first_drafts = drafts.view(num_requests, num_drafts)[:, 0]
    assert (output[:, 1:] == PLACEHOLDER_TOKEN_ID).all()
    assert (output[:, 0] != first_drafts).all()
    assert ((output[:, 0] >= 0) & (output[:, 0] < vocab_size)).all()


@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["point-mass", "draft-probs"])
def test_all_drafts_accepted_appends_bonus(sampler: Sampler, with_draft_probs: bool) -> None:
    num_requests, num_drafts, vocab_size = 64, 4, 9
    drafts = torch.randint(0, vocab_size, (num_requests * num_drafts,))
    logits = torch.full((len(drafts), vocab_size), float("-inf"))
    logits[torch.arange(len(drafts)), drafts] = 0.0  # p(draft) = 1
    draft_probs = logits.softmax(-1) if with_draft_probs else None  # q = p: ratio 1
    batch = single_shape_batch(num_requests, num_drafts, logits, drafts, 1.0, draft_probs=draft_probs)
    batch["bonus_token_ids"] = torch.arange(num_requests).unsqueeze(1)
    output = sampler(**batch)
    assert torch.equal(output[:, :num_drafts], drafts.view(num_requests, num_drafts).to(torch.int32))
    assert torch.equal(output[:, num_drafts], torch.arange(num_requests, dtype=torch.int32))


@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize(
    ("temperature", "top_k"),
    [(1.0, 1), (1e-3, None), (1e-6, None)],
    ids=["top-k-1", "temperature-1e-3", "temperature-1e-6"],
)
def test_near_deterministic_targets_match_greedy(sampler: Sampler, temperature: float, top_k: int | None) -> None:
    num_requests, num_drafts, vocab_size = 32, 3, 12
    generator = torch.Generator().manual_seed(3)
    # Distinct logits (gaps >= 0.1) so the tempered target is one-hot in float32.
    logits = torch.stack(
        [torch.randperm(vocab_size, generator=generator) * 0.1 for _ in range(num_requests * num_drafts)]
    )
    drafts = torch.where(
        torch.rand(len(logits), generator=generator) < 0.6,
        logits.argmax(1),
        torch.randint(0, vocab_size, (len(logits),), generator=generator),
    )
    extra = {} if top_k is None else {"top_k": torch.full((num_requests,), top_k)}
    greedy = sampler(**single_shape_batch(num_requests, num_drafts, logits, drafts, 0.0))
    output = sampler(**single_shape_batch(num_requests, num_drafts, logits, drafts, temperature, **extra))
    assert torch.equal(output, greedy)


def test_full_vocabulary() -> None:
    vocab_size, num_requests, num_drafts = 151_936, 4, 3
    generator = torch.Generator().manual_seed(11)
    num_tokens = num_requests * num_drafts
    drafts = torch.randint(0, vocab_size, (num_tokens,), generator=generator)
    logits = torch.randn(num_tokens, vocab_size, generator=generator)
    logits[torch.arange(num_tokens), drafts] += 12.0  # most drafts accepted, some not
    draft_probs = torch.randn(num_tokens, vocab_size, generator=generator).softmax(-1)
    for maybe_draft_probs in (None, draft_probs):
        batch = single_shape_batch(num_requests, num_drafts, logits, drafts, 1.0, draft_probs=maybe_draft_probs)
        randoms = pre_drawn_randoms(generator, batch)
        vectorised = rejection_sample(**batch, **randoms)
        assert torch.equal(vectorised, rejection_sample_reference(**batch, **randoms))
        assert ((vectorised == PLACEHOLDER_TOKEN_ID) | ((vectorised >= 0) & (vectorised < vocab_size))).all()


def test_padded_draft_is_rejected() -> None:
    """A draft id of -1 (vLLM's padding) is never accepted; the recovered token comes from p."""
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0]])
    batch = single_shape_batch(1, 2, logits, torch.tensor([1, -1]), 1.0)
    noise = torch.ones(1, 3)
    for sampler in SAMPLERS.values():
        output = sampler(**batch, uniform_probs=torch.zeros(2, dtype=torch.float64), recovery_noise=noise)
        assert output.tolist() == [[1, 0, -1]]


def test_expand_batch_to_tokens() -> None:
    values = torch.tensor([10, 20, 30, 40])
    cu_num_tokens = torch.tensor([2, 2, 5, 6])  # request 1 has no tokens
    assert expand_batch_to_tokens(values, cu_num_tokens, 6).tolist() == [10, 10, 30, 30, 30, 40]
    temperature = torch.tensor([0.0, 0.5])
    expanded = expand_batch_to_tokens(temperature, torch.tensor([1, 3]), 3, replace_from=0, replace_to=1)
    assert expanded.tolist() == [1.0, 0.5, 0.5]
    assert expand_batch_to_tokens(values[:0], cu_num_tokens[:0], 0).shape == (0,)


def test_recovered_tokens_for_every_position() -> None:
    """Point-mass drafts: the recovered token is never the draft; draft probs: never where q >= p."""
    generator = torch.Generator().manual_seed(8)
    num_tokens, vocab_size = 500, 6
    cu_num_draft_tokens = torch.tensor([100, 100, 300, 500])
    drafts = torch.randint(0, vocab_size, (num_tokens,), generator=generator)
    target_probs = random_distributions(generator, (num_tokens, vocab_size)).float()
    draft_probs = random_distributions(generator, (num_tokens, vocab_size)).float()
    noise = torch.empty(4, vocab_size).exponential_(generator=generator)

    point_mass = sample_recovered_tokens(cu_num_draft_tokens, drafts, None, target_probs, noise)
    assert point_mass.shape == (num_tokens,) and (point_mass != drafts).all()
    with_probs = sample_recovered_tokens(cu_num_draft_tokens, drafts, draft_probs, target_probs, noise)
    residual_at_token = (target_probs - draft_probs).gather(1, with_probs.unsqueeze(1))
    assert (residual_at_token > 0).all()


def test_module_is_free_of_vllm_and_verl() -> None:
    for module in ("rejection.py", "rejection_loop.py"):
        tree = ast.parse((Path(__file__).parents[1] / "sam_rollout" / module).read_text())
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {
            node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & {"vllm", "vllm_ascend", "verl"}


def test_reference_draws_on_the_logits_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop draws its uniforms and noise where the logits are (CUDA logits with CPU draws crashed)."""
    import sam_rollout.rejection_loop as reference

    devices = []
    original_rand, original_empty = torch.rand, torch.empty

    def recording(original):
        def draw(*args, **kwargs):
            devices.append(torch.device(kwargs.get("device", "cpu")))
            return original(*args, **kwargs)

        return draw

    batch = random_batch(
        torch.Generator().manual_seed(3),
        batch_size=4,
        vocab_size=9,
        max_spec_len=3,
        with_draft_probs=False,
        with_top_k_top_p=False,
    )
    batch["temperature"] = torch.ones(4)
    batch["num_draft_tokens"] = [3, 3, 3, 3]
    batch["cu_num_draft_tokens"] = torch.tensor([3, 6, 9, 12])
    batch["draft_token_ids"] = torch.zeros(12, dtype=torch.long)
    batch["target_logits"] = torch.randn(12, 9)
    # Logits that report a device the default (index-less "cpu") is not; draws there still run on the CPU.
    monkeypatch.setattr(reference.torch, "rand", recording(original_rand))
    monkeypatch.setattr(reference.torch, "empty", recording(original_empty))
    monkeypatch.setattr(torch.Tensor, "device", property(lambda tensor: torch.device("cpu", 0)), raising=False)
    rejection_sample_reference(**batch)
    assert devices and all(device == torch.device("cpu", 0) for device in devices), devices


def test_single_request_on_an_accelerator_goes_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sam_rollout.rejection.loop_is_cheaper(1, torch.device("cuda"))
    assert not sam_rollout.rejection.loop_is_cheaper(2, torch.device("cuda"))
    assert not sam_rollout.rejection.loop_is_cheaper(1, torch.device("cpu"))

    calls = []
    original_loop = sam_rollout.rejection.rejection_sample_reference

    def counted_loop(*args, **kwargs):
        calls.append(1)
        return original_loop(*args, **kwargs)

    monkeypatch.setattr(sam_rollout.rejection, "rejection_sample_reference", counted_loop)
    monkeypatch.setattr(sam_rollout.rejection, "loop_is_cheaper", lambda batch_size, device: batch_size == 1)
    batch = random_batch(
        torch.Generator().manual_seed(8),
        batch_size=1,
        vocab_size=10,
        max_spec_len=3,
        with_draft_probs=False,
        with_top_k_top_p=False,
    )
    batch["temperature"] = torch.ones(1)
    seeded = dict(generators={0: torch.Generator().manual_seed(4)})
    dispatched = rejection_sample(**batch, **seeded)
    assert calls == [1]
    assert torch.equal(dispatched, original_loop(**batch, generators={0: torch.Generator().manual_seed(4)}))
