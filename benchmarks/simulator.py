"""Rollout simulator: one synchronous RL rollout step under continuous batching, SAM off vs on.

Inputs, each measured or stated:
- response lengths (a list, or a long-tailed lognormal clipped at the maximum response length);
- the engine: ``max_num_seqs`` (continuous batching: a finished request's slot is refilled from
  the queue at the next step), replicas (the rollout ends when the slowest replica ends);
- an acceptance profile: expected tokens per decode step (bonus included) and drafted tokens, by
  response position (``AcceptanceProfile``, from ``scripts/acceptance_curves.py`` JSON);
- a step-cost model ``T(batch, q, context)`` in ms (``TableCost`` from a profile CSV such as the
  shared H200 anchor, or ``MoeRooflineCost``).

Model, and what it leaves out:
- Fluid progress: a request at position p emits ``tokens_per_step(bin(p))`` tokens per step (the
  mean; over thousands of steps the randomness averages out) and finishes when it reaches its length.
- A step verifying d drafted tokens per request on average costs ``T(batch, 1 + d, mean context)``;
  the anchor's cost is linear in context at fixed batch, so the mean context stands for the batch.
- Prefill is not modelled (prompts are short next to 34k-token responses); neither is the drafter's
  CPU time (about 1 us per request-step, RESULTS.md) nor the rejection sampler.
- vLLM turns async scheduling off for every engine with a ``custom_class`` (or CPU n-gram) drafter,
  in every step, drafted or not, while the plain engine keeps it: ``Policy.step_overhead_ms`` adds the
  host time that async scheduling would hide to each step of a SAM policy (``policies_for``'s
  ``sam_step_overhead_ms``; docs/vllm-hooks.md has the evidence for its size).

Policies: ``off``; a fixed threshold t (k drafts when the step schedules <= t requests); a
schedule ``[(max_batch, k), ...]`` (what ``additional_config.sam_spec.schedule`` takes); ``oracle``,
a per-step decision from the true cost model and acceptance (``sam.switch.choose_k_arrays``: every
running request must progress at least as fast as without drafts, then the highest token rate wins);
``auto``, the online switch of ``schedule: "auto"`` (``sam.auto_switch``, the same compiled code as in
the engine), which knows neither: it sees each step's batch, its time (with multiplicative noise,
``observe_noise``) and the fluid expectation of what full drafts would be accepted, whatever k it
chose, taken as the engine's scoring rounds take them (``rollout.draft_scoring``: every row at a round
start, every max_k + 1 steps, and more rows in the steps between until the round holds ``ROUND_ROWS``),
and handed to the switch at the next round's start.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from rollout.draft_scoring import ROUND_ROWS
from sam import auto_switch
from sam.switch import acceptance_by_k, choose_k_arrays, expected_distinct_experts, k_by_batch_array

ANCHOR_CSV = "anchors/step_cost_h200_2026-11-30.csv"

# --------------------------------------------------------------------------------------------
# Acceptance profile
# --------------------------------------------------------------------------------------------


@dataclass
class AcceptanceProfile:
    """Tokens per decode step by response position, for one drafting method at k drafts.

    ``bin_edges[i]`` is the lower edge of bin i (the last bin is open). ``tokens_per_step`` and
    ``drafted_per_step`` may hold None (no steps); ``steps`` counts the steps behind each bin.
    """

    k: int
    bin_edges: list
    tokens_per_step: list
    drafted_per_step: list
    steps: list
    method: str = ""
    source: str = ""
    notes: list = field(default_factory=list)

    @classmethod
    def from_json(cls, path, method: str) -> AcceptanceProfile:
        """Read ``scripts/acceptance_curves.py`` output (schema in the module docstring of that script)."""
        data = json.loads(Path(path).read_text())
        for key in ("k", "bin_edges", "methods"):
            if key not in data:
                raise ValueError(f"{path}: missing key {key!r}")
        if method not in data["methods"]:
            raise ValueError(f"{path}: no method {method!r}; has {sorted(data['methods'])}")
        m = data["methods"][method]
        n = len(data["bin_edges"])
        for key in ("tokens_per_step", "drafted_per_step", "steps"):
            if len(m.get(key, [])) != n:
                raise ValueError(f"{path}: methods.{method}.{key} must have {n} entries (one per bin)")
        edges = list(data["bin_edges"])
        if edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"{path}: bin_edges must start at 0 and increase strictly")
        return cls(
            k=int(data["k"]),
            bin_edges=edges,
            tokens_per_step=list(m["tokens_per_step"]),
            drafted_per_step=list(m["drafted_per_step"]),
            steps=[int(s) for s in m["steps"]],
            method=method,
            source=f"{path} ({data.get('trace_set', '?')})",
        )

    @classmethod
    def constant(cls, k: int, tokens_per_step: float, drafted_per_step: float | None = None) -> AcceptanceProfile:
        """One bin for every position (for tests and what-ifs)."""
        return cls(k, [0], [tokens_per_step], [k if drafted_per_step is None else drafted_per_step], [1], "constant")

    def filled(self, min_steps: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(edges, tokens, drafted) with thin bins replaced conservatively.

        A bin is well populated with >= min_steps steps. Beyond the last well-populated bin the
        value of that bin is held (no rise with length is assumed); a thin bin before it takes the
        previous well-populated bin's value (or the next one's, at the start).
        """
        good = [i for i, s in enumerate(self.steps) if s >= min_steps and self.tokens_per_step[i] is not None]
        if not good:
            raise ValueError(f"acceptance profile {self.method!r}: no bin with >= {min_steps} steps")
        tok, dr = [], []
        for i in range(len(self.bin_edges)):
            j = i if i in good else max((g for g in good if g < i), default=good[0])
            tok.append(float(self.tokens_per_step[j]))
            dr.append(float(self.drafted_per_step[j]))
        last = good[-1]
        if last < len(self.bin_edges) - 1:
            self.notes.append(
                f"{self.method}: positions >= {self.bin_edges[last + 1]} hold the {self.bin_edges[last]}+ bin "
                f"({tok[last]:.3f} tokens/step): thinner bins beyond it are not used"
            )
        return np.asarray(self.bin_edges, dtype=np.float64), np.asarray(tok), np.asarray(dr)

    def tables(self, max_k: int | None = None, min_steps: int = 1000):
        """(edges, tokens[k, bin], drafted[k, bin]) for k = 0..max_k (geometric model below k)."""
        edges, tok, dr = self.filled(min_steps)
        max_k = self.k if max_k is None else max_k
        tk = np.empty((max_k + 1, len(edges)))
        dk = np.empty((max_k + 1, len(edges)))
        for i in range(len(edges)):
            tk[:, i], dk[:, i] = acceptance_by_k(tok[i], dr[i], self.k, max_k)
        return edges, tk, dk

    def conservative(self, max_k: int | None = None, min_steps: int = 1000):
        """Position-free (tokens[k], drafted[k]) from the lowest well-populated bin (for schedules)."""
        edges, tk, dk = self.tables(max_k, min_steps)
        i = int(np.argmin(tk[-1]))
        return tk[:, i], dk[:, i]


# --------------------------------------------------------------------------------------------
# Step-cost models
# --------------------------------------------------------------------------------------------


def _bracket(x: float, xs: np.ndarray) -> tuple[int, int, float]:
    """Indices (i, j) and weight w so that f(x) ~ (1 - w) f(xs[i]) + w f(xs[j]); linear past both ends."""
    if len(xs) == 1:
        return 0, 0, 0.0
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    return i, i + 1, float((x - xs[i]) / (xs[i + 1] - xs[i]))


def _lin(f, x: float, xs: np.ndarray) -> float:
    i, j, w = _bracket(x, xs)
    return f(xs[i]) if i == j else (1.0 - w) * f(xs[i]) + w * f(xs[j])


class TableCost:
    """T(batch, q, context) from a profile CSV (columns device, ctx, batch, q, masked, ms_per_step_*).

    Linear in context at fixed (batch, q) (extended past the measured contexts, e.g. batch 128 and
    256 at 32k, which the anchor lacks), linear in q between measured q, linear in batch.
    """

    def __init__(self, rows: Sequence[dict], label: str = ""):
        self.label = label
        col = [c for c in rows[0] if c.startswith("ms_per_step")]
        if len(col) != 1:
            raise ValueError(f"profile rows need exactly one ms_per_step_* column, got {list(rows[0])}")
        pts: dict = {}
        for r in rows:
            if int(r.get("masked", 0) or 0):
                continue
            pts.setdefault((int(r["batch"]), float(r["q"])), []).append((float(r["ctx"]), float(r[col[0]])))
        if not pts:
            raise ValueError("profile has no unmasked rows")
        self.batches = np.array(sorted({b for b, _ in pts}), dtype=np.float64)
        self.qs = np.array(sorted({q for _, q in pts}), dtype=np.float64)
        self.curves = {}
        for key, v in pts.items():
            v.sort()
            self.curves[key] = (np.array([c for c, _ in v]), np.array([t for _, t in v]))

    @classmethod
    def from_csv(cls, path) -> TableCost:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{path}: empty")
        return cls(rows, label=f"{Path(path).name} ({rows[0].get('device', '?')})")

    def _at(self, b: float, q: float, ctx: float) -> float:
        xs, ys = self.curves[(int(b), float(q))]
        return _lin(lambda c: ys[int(np.searchsorted(xs, c))], ctx, xs)

    def __call__(self, batch: float, q: float, ctx: float) -> float:
        return _lin(lambda b: _lin(lambda qq: self._at(b, qq, ctx), q, self.qs), batch, self.batches)

    def on_grid(self, max_batch: int, qs: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """Vectorised ``ms[b, i, j] = self(b, qs[i], cs[j])`` for b = 0..max_batch (row 0 unused)."""
        meas = np.empty((len(self.batches), len(self.qs), len(cs)))
        for bi, b in enumerate(self.batches):
            for qi, q in enumerate(self.qs):
                xs, ys = self.curves[(int(b), float(q))]
                if len(xs) == 1:
                    meas[bi, qi] = ys[0]
                    continue
                i = np.clip(np.searchsorted(xs, cs) - 1, 0, len(xs) - 2)
                meas[bi, qi] = ys[i] + (ys[i + 1] - ys[i]) * (cs - xs[i]) / (xs[i + 1] - xs[i])
        by_q = np.empty((len(self.batches), len(qs), len(cs)))
        for i, q in enumerate(qs):
            a, b, w = _bracket(q, self.qs)
            by_q[:, i] = (1 - w) * meas[:, a] + w * meas[:, b]
        out = np.zeros((max_batch + 1, len(qs), len(cs)))
        for bb in range(1, max_batch + 1):
            a, b, w = _bracket(bb, self.batches)
            out[bb] = (1 - w) * by_q[a] + w * by_q[b]
        return out


# Shapes (public model configs): per-layer parameter counts and KV heads
QWEN3_32B = dict(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)
QWEN3_235B_A22B = dict(
    layers=94,
    hidden=4096,
    heads=64,
    kv_heads=4,
    head_dim=128,
    experts=128,
    top_k=8,
    moe_intermediate=1536,
    vocab=151936,
)


def _attn_params(s: dict) -> float:
    qo = 2 * s["hidden"] * s["heads"] * s["head_dim"]
    kv = 2 * s["hidden"] * s["kv_heads"] * s["head_dim"]
    return float(qo + kv)


def dense_step_features(s: dict, batch: float, q: float, ctx: float, tp: int = 1) -> np.ndarray:
    """[1, weight GB, KV GB, context kilo-tokens, TFLOP] read/done per device in one step."""
    layer = _attn_params(s) + 3 * s["hidden"] * s["intermediate"]
    weights = (s["layers"] * layer + s["vocab"] * s["hidden"]) * 2 / tp
    kv = batch * ctx * 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 / tp
    active = s["layers"] * layer + s["vocab"] * s["hidden"]
    flops = batch * q * (2 * active + 4 * s["layers"] * s["heads"] * s["head_dim"] * ctx) / tp
    return np.array([1.0, weights / 1e9, kv / 1e9, ctx / 1e3, flops / 1e12])


def fit_roofline(anchor: TableCost, shape: dict = QWEN3_32B) -> np.ndarray:
    """Non-negative least squares of the anchor's step times on dense_step_features (ms per unit)."""
    X, y = [], []
    for (b, q), (ctxs, ts) in anchor.curves.items():
        for c, t in zip(ctxs, ts):
            X.append(dense_step_features(shape, b, q, c))
            y.append(t)
    return nonnegative_lstsq(np.array(X), np.array(y))


def nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: drop the most negative column and refit until none is."""
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol = np.linalg.lstsq(X[:, active], y, rcond=None)[0]
        if sol.min() >= 0:
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


class MoeRooflineCost:
    """T(batch, q, context) for an MoE decoder, from device rates fitted on a dense profile.

    Per device (tensor parallel ``tp``): fixed time, weights read (attention + router + the distinct
    experts a step routes to, ``sam.switch.expected_distinct_experts`` with ``correlation``), KV read,
    context latency and FLOPs, each at the rate ``fit_roofline`` found on the dense anchor; plus two
    all-reduces per layer, and ``overhead_ms`` per step for what a dense fit cannot see (expert
    dispatch, many small kernels), which makes verification relatively cheaper. The expert term is
    what verification multiplies: q tokens per request reach more distinct experts.
    """

    def __init__(
        self,
        rates: np.ndarray,
        shape: dict = QWEN3_235B_A22B,
        tp: int = 4,
        correlation: float = 0.0,
        allreduce_us: float = 15.0,
        dense_layers: int = 64,
        overhead_ms: float = 0.0,
    ):
        self.rates, self.s, self.tp, self.rho, self.ar = rates, shape, tp, correlation, allreduce_us
        self.overhead_ms = overhead_ms
        self.layer_scale = shape["layers"] / dense_layers  # fixed and context-latency terms are per layer
        self.label = (
            f"MoE roofline from the dense anchor ({shape['layers']} layers, TP {tp}, routing correlation "
            f"{correlation}, +{overhead_ms:g} ms/step)"
        )

    def distinct(self, batch: float, q: float) -> float:
        s = self.s
        return expected_distinct_experts(s["experts"], s["top_k"], batch, q, self.rho)

    def __call__(self, batch: float, q: float, ctx: float) -> float:
        s, tp = self.s, self.tp
        expert = 3 * s["hidden"] * s["moe_intermediate"]
        layer_w = _attn_params(s) + s["hidden"] * s["experts"] + self.distinct(batch, q) * expert
        weights = (s["layers"] * layer_w + s["vocab"] * s["hidden"]) * 2 / tp
        kv = batch * ctx * 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 / tp
        active = s["layers"] * (_attn_params(s) + s["top_k"] * expert) + s["vocab"] * s["hidden"]
        flops = batch * q * (2 * active + 4 * s["layers"] * s["heads"] * s["head_dim"] * ctx) / tp
        a, w, k, c, f = self.rates
        t = a * self.layer_scale + w * weights / 1e9 + k * kv / 1e9 + c * self.layer_scale * ctx / 1e3
        t += f * flops / 1e12
        return float(t + self.overhead_ms + (2 * s["layers"] * self.ar / 1e3 if tp > 1 else 0.0))


class ScaledVerification:
    """``T(b, 1, c) + factor * (T(b, q, c) - T(b, 1, c))``: a device whose verification costs more.

    A what-if for platforms where verifying drafts is dearer than on the anchor's GPU (the published
    NPU threshold of 8 came from a verification kernel that degraded with batch x length).
    """

    def __init__(self, cost, factor: float):
        self.cost, self.factor = cost, factor
        self.label = f"{getattr(cost, 'label', 'cost')} with verification x{factor:g}"

    def __call__(self, batch: float, q: float, ctx: float) -> float:
        base = self.cost(batch, 1.0, ctx)
        return base + self.factor * (self.cost(batch, q, ctx) - base)

    def on_grid(self, max_batch: int, qs: np.ndarray, cs: np.ndarray) -> np.ndarray:
        ms = self.cost.on_grid(max_batch, qs, cs)
        return ms[:, :1] + self.factor * (ms - ms[:, :1])


@dataclass
class CostGrid:
    """A cost model sampled on a grid the compiled simulator interpolates (q and context linear)."""

    ms: np.ndarray  # [batch 0..max_batch, q index, ctx index]
    q_step: float
    ctx_step: float

    @classmethod
    def build(cls, cost, max_batch: int, max_k: int, max_ctx: float, q_step: float = 0.25, ctx_step: float = 1024.0):
        qs = np.arange(1.0, max_k + 1.0 + 1e-9, q_step)
        cs = np.arange(0.0, max_ctx + 2 * ctx_step, ctx_step)
        if hasattr(cost, "on_grid"):
            ms = cost.on_grid(max_batch, qs, cs)
        else:
            ms = np.zeros((max_batch + 1, len(qs), len(cs)))
            for b in range(1, max_batch + 1):
                for i, q in enumerate(qs):
                    for j, c in enumerate(cs):
                        ms[b, i, j] = cost(b, q, c)
        bad = np.argwhere(ms[1:] <= 0)
        if len(bad):  # e.g. a profile extrapolated far past its measured batches or contexts
            b, i, j = bad[0]
            raise ValueError(
                f"cost model {getattr(cost, 'label', '')!r} gives {ms[b + 1, i, j]:.3g} ms at batch {b + 1}, "
                f"q {qs[i]}, context {cs[j]:.0f}: profile the batches and contexts the setup needs"
            )
        return cls(ms, q_step, ctx_step)


# --------------------------------------------------------------------------------------------
# The compiled simulation of one replica
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _grid_cost(ms, q_step, ctx_step, b, q, ctx):
    qi = (q - 1.0) / q_step
    i0 = min(int(qi), ms.shape[1] - 2) if ms.shape[1] > 1 else 0
    fq = qi - i0 if ms.shape[1] > 1 else 0.0
    ci = ctx / ctx_step
    j0 = min(int(ci), ms.shape[2] - 2)
    fc = ci - j0
    i1 = min(i0 + 1, ms.shape[1] - 1)
    lo = ms[b, i0, j0] * (1 - fc) + ms[b, i0, j0 + 1] * fc
    hi = ms[b, i1, j0] * (1 - fc) + ms[b, i1, j0 + 1] * fc
    return lo * (1 - fq) + hi * fq


@njit(cache=True)
def _bin_of(pos, edges):
    i = 0
    while i + 1 < edges.shape[0] and pos >= edges[i + 1]:
        i += 1
    return i


SCHEDULE, ORACLE, ONLINE = 0, 1, 2  # how a policy chooses k


# Not cached (cache=False): numba's cache would not see a change in sam.auto_switch, which these call.
@njit
def _start_round_if_due(accept, scored, steps):
    """As the engine's stepper before it chooses k: on a step that starts a scoring round (every max_k + 1
    steps), the round under way (``scored``: rows, drafted_at, accepted_at) goes to the switch."""
    if steps % auto_switch.scoring_round_every(accept.shape[0] - 1) != 0:
        return False
    auto_switch.observe_acceptance(accept, scored[0, 0], scored[1], scored[2])
    scored[:] = 0.0
    return True


@njit
def _observe_online(cost, scored, round_start, b, d, t, steps, pos, edges, tok, dr, noise):
    """What the online switch sees of a step: its time (noisy) and the expected outcome per position of
    the full drafts scored in it, added to the round under way."""
    auto_switch.observe_cost(cost, b, d / b, t * math.exp(noise * np.random.standard_normal()))
    n = b if round_start else min(b, max(ROUND_ROWS - int(scored[0, 0]), 0))
    for m in range(n):
        i = _bin_of(pos[(steps + m) % b], edges)  # a different first row each step, as the engine
        for j in range(1, scored.shape[1]):
            scored[1, j] += dr[j, i] - dr[j - 1, i]
            scored[2, j] += tok[j, i] - tok[j - 1, i]
    scored[0, 0] += n


@njit
def _simulate_replica(
    lengths,
    prompt_len,
    max_num_seqs,
    ms,
    q_step,
    ctx_step,
    tok,
    dr,
    edges,
    k_by_batch,
    mode,
    step_overhead_ms,
    tail_batch,
    trace_cap,
    observe_noise,
    seed,
):
    """Returns (wall ms, tail ms, steps, tail steps, steps with drafts, tokens, trace[t_end, batch, k])."""
    np.random.seed(seed)
    n = lengths.shape[0]
    max_k = tok.shape[0] - 1
    pos = np.zeros(max_num_seqs)
    length = np.zeros(max_num_seqs)
    running = 0
    nxt = 0
    wall = 0.0
    tail = 0.0
    steps = 0
    tail_steps = 0
    spec_steps = 0
    emitted = 0.0
    trace = np.zeros((trace_cap, 3))
    step_ms = np.zeros(max_k + 1)
    min_tok = np.zeros(max_k + 1)
    sum_tok = np.zeros(max_k + 1)
    cost = np.zeros((auto_switch.NUM_BUCKETS, auto_switch.COST_FIELDS))
    accept = np.zeros((max_k + 1, auto_switch.ACCEPT_FIELDS))
    scored = np.zeros((3, max_k + 1))  # the scoring round under way: [0, 0] rows, [1] drafted_at, [2] accepted_at
    round_start = False
    while nxt < n or running > 0:
        started = 0
        while running < max_num_seqs and nxt < n:  # continuous batching: refill free slots
            pos[running] = 0.0
            length[running] = lengths[nxt]
            running += 1
            nxt += 1
            started += 1
        if mode == ONLINE and started:
            auto_switch.observe_new_requests(accept, started, running)
        b = running
        ctx = prompt_len
        for r in range(b):
            ctx += pos[r] / b
        if mode == ORACLE:
            for k in range(max_k + 1):
                min_tok[k] = 1e30
                sum_tok[k] = 0.0
                d = 0.0
                for r in range(b):
                    i = _bin_of(pos[r], edges)
                    min_tok[k] = min(min_tok[k], tok[k, i])
                    sum_tok[k] += tok[k, i]
                    d += dr[k, i]
                step_ms[k] = _grid_cost(ms, q_step, ctx_step, b, 1.0 + d / b, ctx) + step_overhead_ms
            k = choose_k_arrays(step_ms, min_tok, sum_tok)
        elif mode == ONLINE:
            round_start = _start_round_if_due(accept, scored, steps)
            k = auto_switch.choose_k(cost, accept, b, max_k)
        else:
            k = k_by_batch[min(b, k_by_batch.shape[0] - 1)]
        d = 0.0
        for r in range(b):
            d += dr[k, _bin_of(pos[r], edges)]
        t = _grid_cost(ms, q_step, ctx_step, b, 1.0 + d / b, ctx) + step_overhead_ms
        if mode == ONLINE:  # before the step's tokens move the positions
            _observe_online(cost, scored, round_start, b, d, t, steps, pos, edges, tok, dr, observe_noise)
        r = 0
        while r < running:
            adv = tok[k, _bin_of(pos[r], edges)]
            adv = min(adv, length[r] - pos[r])
            pos[r] += adv
            emitted += adv
            if pos[r] >= length[r] - 1e-9:  # finished: the last row moves into its slot
                running -= 1
                pos[r] = pos[running]
                length[r] = length[running]
            else:
                r += 1
        wall += t
        if b <= tail_batch:
            tail += t
            tail_steps += 1
        if k > 0:
            spec_steps += 1
        if steps < trace_cap:
            trace[steps, 0] = wall
            trace[steps, 1] = b
            trace[steps, 2] = k
        steps += 1
    return wall, tail, steps, tail_steps, spec_steps, emitted, trace[: min(steps, trace_cap)]


# --------------------------------------------------------------------------------------------
# Setup, policies, results
# --------------------------------------------------------------------------------------------


@dataclass
class RolloutSetup:
    name: str
    requests: int  # prompts x samples per prompt
    max_num_seqs: int
    replicas: int
    max_response: int
    prompt_len: int = 256
    tail_batch: int = 8  # "tail phase" = steps scheduling <= this many requests


def lognormal_lengths(n: int, median: float, sigma: float, max_len: int, seed: int = 0) -> np.ndarray:
    """Long-tailed response lengths: lognormal clipped at ``max_len`` (the clipped ones are truncated)."""
    rng = np.random.default_rng(seed)
    x = np.exp(np.log(median) + sigma * rng.standard_normal(n))
    return np.clip(np.round(x), 1, max_len).astype(np.float64)


def split_replicas(lengths: np.ndarray, replicas: int) -> list[np.ndarray]:
    """Requests dealt round-robin, in order, to replicas (the load balancer sees no lengths in advance;
    pass lengths in random order, as lognormal_lengths draws them)."""
    return [lengths[i::replicas] for i in range(replicas)]


@dataclass
class Policy:
    name: str
    k_by_batch: np.ndarray  # k per batch size (index 0 unused); ignored by the oracle and online modes
    mode: int = SCHEDULE
    step_overhead_ms: float = 0.0  # added to every step (SAM configured: no async scheduling)


def policies_for(
    setup: RolloutSetup,
    k: int,
    thresholds=(4, 8, 16, 32),
    schedules: dict | None = None,
    sam_step_overhead_ms: float = 0.0,
):
    """off, the thresholds, the oracle, the online switch (``auto``) and the given schedules; every policy
    but off pays ``sam_step_overhead_ms`` per step."""
    none = np.zeros(setup.max_num_seqs + 1, dtype=np.int64)
    sam = sam_step_overhead_ms
    out = [Policy("off", none)]
    for t in thresholds:
        arr = none.copy()
        arr[1 : t + 1] = k
        out.append(Policy(f"threshold {t}", arr, step_overhead_ms=sam))
    out.append(Policy("oracle", none, ORACLE, sam))
    out.append(Policy("auto", none, ONLINE, sam))
    for name, sched in (schedules or {}).items():
        out.append(Policy(name, k_by_batch_array(sched, setup.max_num_seqs), step_overhead_ms=sam))
    return out


OBSERVE_NOISE = 0.1  # the online switch's step timings: lognormal, sigma 10% (a shared host)


def simulate(
    setup: RolloutSetup,
    lengths: np.ndarray,
    grid: CostGrid,
    profile_tables,
    policy: Policy,
    trace_cap: int = 0,
    observe_noise: float = OBSERVE_NOISE,
    seed: int = 0,
) -> dict:
    """One rollout step over all replicas; wall time is the slowest replica's."""
    edges, tok, dr = profile_tables
    per = []
    for replica, rl in enumerate(split_replicas(lengths, setup.replicas)):
        wall, tail, steps, tail_steps, spec, emitted, trace = _simulate_replica(
            rl,
            float(setup.prompt_len),
            setup.max_num_seqs,
            grid.ms,
            grid.q_step,
            grid.ctx_step,
            tok,
            dr,
            edges,
            policy.k_by_batch,
            policy.mode,
            policy.step_overhead_ms,
            setup.tail_batch,
            trace_cap,
            observe_noise,
            seed * 1000 + replica,
        )
        per.append(
            dict(
                wall_ms=wall,
                tail_ms=tail,
                steps=steps,
                tail_steps=tail_steps,
                spec_steps=spec,
                tokens=emitted,
                trace=trace,
            )
        )
    slow = max(range(len(per)), key=lambda i: per[i]["wall_ms"])
    return dict(
        policy=policy.name,
        wall_s=per[slow]["wall_ms"] / 1e3,
        # tail time summed over replicas: every replica ends in its own tail phase
        tail_s=sum(p["tail_ms"] for p in per) / 1e3,
        steps=per[slow]["steps"],
        tail_steps=per[slow]["tail_steps"],
        spec_steps=per[slow]["spec_steps"],
        tokens=float(sum(p["tokens"] for p in per)),
        slowest_replica=slow,
        trace=per[slow]["trace"],
    )


def compare(
    setup: RolloutSetup,
    lengths,
    grid: CostGrid,
    profile_tables,
    policies: list[Policy],
    trace_cap: int = 0,
    seed: int = 0,
) -> list[dict]:
    """Each policy against off: wall time, reduction, and tail speed-up (time in steps with batch <= tail)."""
    runs = [simulate(setup, lengths, grid, profile_tables, p, trace_cap, seed=seed) for p in policies]
    base = next(r for r in runs if r["policy"] == "off")
    for r in runs:
        r["reduction"] = 1.0 - r["wall_s"] / base["wall_s"]
        r["tail_speedup"] = base["tail_s"] / r["tail_s"] if r["tail_s"] > 0 else math.nan
        r["spec_step_fraction"] = r["spec_steps"] / r["steps"]
    return runs


def summary_row(r: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "trace"}
