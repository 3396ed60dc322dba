"""Rollout simulator: one synchronous RL rollout step under continuous batching, SAM off vs on.

Inputs, each measured or stated:
- response lengths (a list, or a long-tailed lognormal clipped at the maximum response length);
- the engine: ``max_num_seqs`` (continuous batching: a finished request's slot is refilled from
  the queue at the next step), replicas (the rollout ends when the slowest replica ends);
- an acceptance profile: expected tokens per decode step (bonus included) and drafted tokens, by
  response position (``AcceptanceProfile``, from ``python -m benchmarks.acceptance_curves`` JSON);
- a step-cost model ``T(batch, q, context)`` in ms (``TableCost`` from a profile CSV such as the
  shared H200 anchors, dense and MoE; ``MoeRooflineCost`` as a what-if, with ``model_error`` against the table).

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
schedule ``[(max_batch, k), ...]`` (what ``additional_config.sam_spec.switch`` takes); ``oracle``,
a per-step decision from the true cost model and acceptance (``benchmarks.cost_model.choose_k_arrays``: every
running request must progress at least as fast as without drafts, then the highest token rate wins);
``auto``, the online switch of ``switch: "auto"`` (``sam_rollout.drafter.auto_switch``, the same compiled code as in
the engine), which knows neither: it sees each step's batch, its time (with multiplicative noise,
``observe_noise``) and the fluid expectation of what full drafts would be accepted, whatever k it
chose, taken as the engine's scoring rounds take them (``sam_rollout.draft_scoring``: every row at a round
start, every max_k + 1 steps, and more rows in the steps between until the round holds ``ROUND_ROWS``),
and handed to the switch at the next round's start.

At cluster scale (``run_cluster``): R replicas, each its own engine and drafter, and a routing, verl
0.9.1's default (least-loaded, by request id) or prompt affinity, which decides what a request's
drafter can see: its siblings on the same engine, and its prompt's earlier visit in that engine's
prompt store. The acceptance per (routing, R, epoch) is replayed on real traces with R drafters
(``routed_acceptance``), not scaled by assumption; prefill is added as a roofline estimate.
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

from benchmarks.acceptance_curves import power_of_two_edges
from benchmarks.cost_model import acceptance_by_k, choose_k_arrays, expected_distinct_experts, k_by_batch_array
from benchmarks.drafters import SamDrafter
from benchmarks.model_shapes import QWEN3_32B, QWEN3_235B_A22B
from benchmarks.replay import EARLIER_VISIT, ReplayStats, replay_group
from sam_rollout.draft_scoring import ROUND_ROWS
from sam_rollout.drafter import DraftConfig, auto_switch
from testkit.data import TraceGroup

ANCHOR_CSV = "anchors/step_cost_h200_2026-11-30.csv"
MOE_ANCHOR_CSV = "anchors/step_cost_h200_moe_tp4_2026-12-04.csv"  # Qwen3-235B-A22B, one TP-4 rank

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
        """Read ``python -m benchmarks.acceptance_curves`` output (schema in the module docstring of that script)."""
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
    256 at 32k, which the anchor lacks), linear in batch, and in q: linear between measured q
    (``interpolated``); past the largest measured q, extended along the least-squares line through the
    measured verification steps (q >= 2) of that batch and context (``extrapolated``), which a single
    noisy last segment would not give; or, with ``extension`` (a cost model, e.g. the MoE roofline whose
    distinct experts saturate), the table's value at the largest q plus that model's increment from
    there. ``q_note`` says which q of a range are which.
    """

    def __init__(self, rows: Sequence[dict], label: str = "", extension=None):
        self.label = label
        self.extension = extension  # a cost model whose increments past the largest measured q are added
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
        missing = [(int(b), q) for b in self.batches for q in self.qs if (int(b), float(q)) not in pts]
        if missing:
            raise ValueError(f"profile lacks (batch, q) {missing[:4]}: every batch needs every q")
        self.curves = {}
        for key, v in pts.items():
            v.sort()
            self.curves[key] = (np.array([c for c, _ in v]), np.array([t for _, t in v]))

    @classmethod
    def from_csv(cls, path, extension=None) -> TableCost:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{path}: empty")
        return cls(rows, label=f"{Path(path).name} ({rows[0].get('device', '?')})", extension=extension)

    def q_provenance(self, q: float) -> str:
        """``measured``, ``interpolated`` (between two measured q) or ``extrapolated`` (past the largest)."""
        if np.any(np.isclose(self.qs, q)):
            return "measured"
        return "extrapolated" if q > self.qs[-1] or q < self.qs[0] else "interpolated"

    def q_note(self, max_q: int) -> str:
        """How each integer q up to ``max_q`` is priced, in one line."""
        by_kind: dict = {}
        for q in range(1, max_q + 1):
            by_kind.setdefault(self.q_provenance(q), []).append(q)
        fitted = ", ".join(f"{q:g}" for q in self._fitted_qs())
        parts = [f"measured q {by_kind['measured']}"] if "measured" in by_kind else []
        if "interpolated" in by_kind:
            parts.append(f"interpolated (linear between measured q) q {by_kind['interpolated']}")
        if "extrapolated" in by_kind:
            how = (
                f"the largest measured q plus the increments of {self.extension.label}"
                if self.extension is not None
                else f"least-squares line through measured q {fitted}, per batch and context"
            )
            parts.append(f"extrapolated ({how}) q {by_kind['extrapolated']}")
        return f"{self.label}: " + "; ".join(parts)

    def _fitted_qs(self) -> np.ndarray:
        """The measured q the extension is fitted on: the verification steps (q >= 2), or all if fewer than two."""
        verifying = self.qs[self.qs >= 2]
        return verifying if len(verifying) >= 2 else self.qs

    def _price_q(self, values: np.ndarray, q: float, batches: np.ndarray, contexts: np.ndarray) -> np.ndarray:
        """Values at q from ``values[..., i]`` at measured ``self.qs[i]`` (the rule in the class docstring);
        ``values[..., i]`` has shape ``[len(batches), len(contexts)]``, or is a scalar for one of each."""
        if q <= self.qs[-1] or len(self.qs) == 1:
            a, b, w = _bracket(q, self.qs)
            return (1 - w) * values[..., a] + w * values[..., b]
        if self.extension is not None:
            last = float(self.qs[-1])
            increment = np.array(
                [[self.extension(b, q, c) - self.extension(b, last, c) for c in contexts] for b in batches]
            )
            return values[..., -1] + increment.reshape(values[..., -1].shape)
        fitted = np.isin(self.qs, self._fitted_qs())
        x, y = self.qs[fitted], values[..., fitted]
        slope = ((x - x.mean()) * (y - y.mean(axis=-1, keepdims=True))).sum(axis=-1) / ((x - x.mean()) ** 2).sum()
        return values[..., -1] + slope * (q - self.qs[-1])

    def _at(self, b: float, q: float, ctx: float) -> float:
        xs, ys = self.curves[(int(b), float(q))]
        return _lin(lambda c: ys[int(np.searchsorted(xs, c))], ctx, xs)

    def __call__(self, batch: float, q: float, ctx: float) -> float:
        def at_batch(b):
            measured = np.array([self._at(b, qq, ctx) for qq in self.qs])
            return float(self._price_q(measured, q, np.array([b]), np.array([ctx])))

        return _lin(at_batch, batch, self.batches)

    def on_grid(self, max_batch: int, qs: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """Vectorised ``ms[b, i, j] = self(b, qs[i], cs[j])`` for b = 0..max_batch (row 0 unused)."""
        meas = np.empty((len(self.batches), len(cs), len(self.qs)))
        for bi, b in enumerate(self.batches):
            for qi, q in enumerate(self.qs):
                xs, ys = self.curves[(int(b), float(q))]
                if len(xs) == 1:
                    meas[bi, :, qi] = ys[0]
                    continue
                i = np.clip(np.searchsorted(xs, cs) - 1, 0, len(xs) - 2)
                meas[bi, :, qi] = ys[i] + (ys[i + 1] - ys[i]) * (cs - xs[i]) / (xs[i + 1] - xs[i])
        by_q = np.stack([self._price_q(meas, q, self.batches, cs) for q in qs], axis=1)  # [batch, q, ctx]
        out = np.zeros((max_batch + 1, len(qs), len(cs)))
        for bb in range(1, max_batch + 1):
            a, b, w = _bracket(bb, self.batches)
            out[bb] = (1 - w) * by_q[a] + w * by_q[b]
        return out

    def points(self):
        """Every measured (batch, q, ctx, ms)."""
        for (b, q), (ctxs, ts) in sorted(self.curves.items()):
            for c, t in zip(ctxs, ts):
                yield b, q, c, t


def model_error(model, table: TableCost) -> dict:
    """Relative error of a cost model against a measured table: on T, and on the ratio T(q) / T(1)
    that decides whether drafting pays. Mean of |error| and the largest |error|, over every point."""
    step, ratio = [], []
    for b, q, c, t in table.points():
        step.append(model(b, q, c) / t - 1)
        if q > 1:
            ratio.append((model(b, q, c) / model(b, 1, c)) / (t / table._at(b, 1.0, c)) - 1)
    step, ratio = np.abs(step), np.abs(ratio) if ratio else np.zeros(1)
    return dict(
        points=len(step),
        step_mean=float(step.mean()),
        step_max=float(step.max()),
        ratio_mean=float(ratio.mean()),
        ratio_max=float(ratio.max()),
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
    experts a step routes to, ``benchmarks.cost_model.expected_distinct_experts`` with ``correlation``), KV read,
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
        dense_layers: int = QWEN3_32B["layers"],  # the dense anchor's model
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


# Not cached (cache=False): numba's cache would not see a change in sam_rollout.drafter.auto_switch, which these call.
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
    """Returns (wall ms, tail ms, steps, tail steps, steps with drafts, tokens, request-steps, plain ms,
    overhead ms, trace[t_end, batch, k]). plain ms: what the steps would have cost without their
    drafts (T(b, 1, c)); overhead ms: the policy's per-step overhead; the rest is verification."""
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
    request_steps = 0
    plain = 0.0
    overhead = 0.0
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
        request_steps += b
        plain += _grid_cost(ms, q_step, ctx_step, b, 1.0, ctx)
        overhead += step_overhead_ms
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
    return (
        wall,
        tail,
        steps,
        tail_steps,
        spec_steps,
        emitted,
        request_steps,
        plain,
        overhead,
        trace[: min(steps, trace_cap)],
    )


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


def grouped_lognormal_lengths(
    prompts: int,
    group_size: int,
    median: float,
    sigma: float,
    max_len: int,
    corr: float,
    seed: int = 0,
    visit: int = 0,
) -> np.ndarray:
    """``testkit.data.lognormal_lengths`` in prompt order, with ``corr`` of the log-length variance shared by a
    prompt's samples (a hard prompt draws long answers from all of them); corr 0: independent. ``visit``:
    the same prompts' samples at another visit (the prompt's share drawn once, the samples' own anew)."""
    if not 0.0 <= corr <= 1.0:
        raise ValueError(f"length correlation must be in [0, 1], got {corr}")
    rng = np.random.default_rng(seed)
    shared = np.repeat(rng.standard_normal(prompts), group_size)
    for _ in range(visit):
        rng.standard_normal(prompts * group_size)
    own = rng.standard_normal(prompts * group_size)
    x = np.exp(np.log(median) + sigma * (math.sqrt(corr) * shared + math.sqrt(1.0 - corr) * own))
    return np.clip(np.round(x), 1, max_len).astype(np.float64)


def log_length_icc(groups) -> float:
    """Intraclass correlation of log response length within a prompt (one-way ANOVA, groups of equal
    size only): the share of the variance a prompt's samples share (``grouped_lognormal_lengths``' corr)."""
    n = max(len(g.responses) for g in groups)
    x = np.array([[math.log(max(len(r), 1)) for r in g.responses] for g in groups if len(g.responses) == n])
    if len(x) < 2 or n < 2:
        raise ValueError("need at least two groups of at least two responses of one size")
    between = n * x.mean(axis=1).var(ddof=1)
    within = float(((x - x.mean(axis=1, keepdims=True)) ** 2).sum() / (len(x) * (n - 1)))
    return float((between - within) / (between + (n - 1) * within))


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


def sam_policy(switch, k: int, max_num_seqs: int, step_overhead_ms: float = 0.0) -> Policy:
    """SAM under the engine's ``switch``: "auto" (the online switch) or a threshold t (k drafts in steps of at
    most t requests)."""
    if switch == "auto":
        return Policy("auto", np.zeros(1, dtype=np.int64), ONLINE, step_overhead_ms)
    arr = np.zeros(max_num_seqs + 1, dtype=np.int64)
    arr[1 : int(switch) + 1] = k
    return Policy(f"threshold {int(switch)}", arr, step_overhead_ms=step_overhead_ms)


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
    assignment: np.ndarray | None = None,
) -> dict:
    """One rollout step over all replicas; wall time is the slowest replica's. ``assignment``: the
    replica of each request (default: ``split_replicas``, dealt round-robin)."""
    edges, tok, dr = profile_tables
    if assignment is None:
        parts = split_replicas(lengths, setup.replicas)
    else:
        assignment = np.asarray(assignment)
        if assignment.shape != lengths.shape or assignment.min() < 0 or assignment.max() >= setup.replicas:
            raise ValueError(f"assignment must give each of the {len(lengths)} requests a replica < {setup.replicas}")
        parts = [lengths[assignment == r] for r in range(setup.replicas)]
    per = []
    for replica, rl in enumerate(parts):
        wall, tail, steps, tail_steps, spec, emitted, request_steps, plain, overhead, trace = _simulate_replica(
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
                request_steps=request_steps,
                plain_ms=plain,
                overhead_ms=overhead,
                requests=len(rl),
                trace=trace,
            )
        )
    slow = max(range(len(per)), key=lambda i: per[i]["wall_ms"])
    s = per[slow]
    return dict(
        policy=policy.name,
        wall_s=s["wall_ms"] / 1e3,
        # tail time summed over replicas: every replica ends in its own tail phase
        tail_s=sum(p["tail_ms"] for p in per) / 1e3,
        steps=s["steps"],
        tail_steps=s["tail_steps"],
        spec_steps=s["spec_steps"],
        tokens=float(sum(p["tokens"] for p in per)),
        slowest_replica=slow,
        # the slowest replica's time, split: plain steps, what drafts added, per-step overhead, its tail
        plain_s=s["plain_ms"] / 1e3,
        verify_s=(s["wall_ms"] - s["plain_ms"] - s["overhead_ms"]) / 1e3,
        overhead_s=s["overhead_ms"] / 1e3,
        slowest_tail_s=s["tail_ms"] / 1e3,
        slowest_tokens_per_request_step=s["tokens"] / max(s["request_steps"], 1),
        replica_wall_s=[p["wall_ms"] / 1e3 for p in per],
        replica_requests=[p["requests"] for p in per],
        trace=s["trace"],
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
    skip = ("trace", "replica_wall_s", "replica_requests")
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k not in skip}


# --------------------------------------------------------------------------------------------
# Routing across replicas: which engine's drafter sees a request's siblings and its prompt's past
# --------------------------------------------------------------------------------------------
#
# Each rollout replica is its own vLLM engine with its own drafter: a request drafts from the
# siblings (GRPO group) on its engine and from the prompt store of its engine only. verl 0.9.1's
# default router gives every sample its own request id and sends it to the least-loaded replica, so
# siblings spread and a revisit rarely meets its prompt's earlier responses; prompt affinity sends
# every request of a prompt, every epoch, to one replica. The acceptance under each routing is
# measured, not assumed: the replay machinery (``benchmarks.replay``) runs R drafters, each request
# replayed on the drafter its routing picks.

ROUTINGS = ("default", "affinity")
# prompt affinity by the real balancer (``benchmarks.routing.place_batches``; needs verl): ours as it is
# (a group placed off its store's replica takes a copy of the store along), and with stores that stay
# where they are (``store_handoff: false``, the rule before)
ROUTER_ROUTINGS = ("handoff", "fixed_stores")
STORE_FOLLOWS_GROUP = ("handoff",)  # routings whose revisits find the whole store on their replica
ROUTER_SECONDS_PER_TOKEN = 0.03  # a request's seconds in flight per response token, as the balancer times it
ROUTER_BATCHES_PER_EPOCH = 4  # the dataset the balancer routes before the priced step: 4 steps' prompts
EPOCHS = ("first", "later")
AGENT_LOOP_WORKERS = 8  # verl 0.9.1 ``rollout.agent.num_workers`` default
FIRST_EPOCH_HISTORY = 1 << 21  # the same-run replay's "group + history": holds the whole trace set
LATER_EPOCH_HISTORY = 1 << 16  # the revisit proxy's: less than one epoch, so the store must carry the visit
_HISTORY_MARK = 1 << 24  # a token id beyond any vocabulary: prompts of the history-sharing requests


def least_loaded_routing(group_sizes: Sequence[int], replicas: int, rng, workers: int = AGENT_LOOP_WORKERS):
    """verl 0.9.1's default router for one rollout step, as a replica per response of each group.

    The batch (siblings next to each other) is cut into ``workers`` contiguous chunks, one per
    agent-loop worker; the workers' requests reach the router interleaved, and each goes to the
    replica with the fewest requests in flight, ties at random (``GlobalRequestLoadBalancer``; nothing
    finishes while a step's requests are submitted). With R <= workers a group's siblings land
    independently and uniformly (about (n - 1) / R of its siblings share a request's replica); with
    more replicas, siblings arriving within R requests of each other avoid each other's replica.
    """
    sizes = np.asarray(group_sizes, dtype=np.int64)
    if replicas < 1 or workers < 1:
        raise ValueError(f"replicas and workers must be >= 1, got {replicas} and {workers}")
    chunks = np.array_split(np.arange(int(sizes.sum())), workers)
    arrival = [c[j] for j in range(max(len(c) for c in chunks)) for c in chunks if j < len(c)]
    load = np.zeros(replicas, dtype=np.int64)
    where = np.empty(int(sizes.sum()), dtype=np.int64)
    for i in arrival:
        r = int(rng.choice(np.flatnonzero(load == load.min())))
        where[i] = r
        load[r] += 1
    return np.split(where, np.cumsum(sizes)[:-1])


def prompt_affinity_map(prompts: int, replicas: int, rng) -> np.ndarray:
    """Prompt affinity: each prompt's replica, the same every epoch. The prompts in a random order
    dealt round-robin: a balanced stand-in for consistent hashing with bounded load (which may move
    a prompt when its replica is full; not modelled)."""
    out = np.empty(prompts, dtype=np.int64)
    out[rng.permutation(prompts)] = np.arange(prompts) % replicas
    return out


def router_steps(routing: str, replicas: int, steps, seed: int = 0) -> list[dict]:
    """The real balancer of ``routing`` (one of ROUTER_ROUTINGS) through synchronous rollout steps, each a
    list of (prompt id, response lengths in tokens) in arrival order; per step ``where`` ({prompt id:
    replica per response}), ``order`` (prompt ids as they arrived) and ``store_share``."""
    from benchmarks.routing import SIMULATOR_ROUTINGS, place_batches

    if routing not in ROUTER_ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTER_ROUTINGS}, got {routing!r}")
    batches = [[(p, np.asarray(n, dtype=np.float64) * ROUTER_SECONDS_PER_TOKEN) for p, n in step] for step in steps]
    placed = place_batches(SIMULATOR_ROUTINGS[routing], replicas, batches, seed)
    return [
        {"where": dict(zip((p for p, _ in step), out["where"])), "order": [p for p, _ in step],
         "store_share": out["store_share"], "store_available": out["store_available"]}
        for step, out in zip(steps, placed)
    ]  # fmt: skip


def router_visits(routing: str, visits, replicas: int, rng) -> list[dict]:
    """``router_steps`` with each visit (groups of responses, prompt order) one step, its groups arriving in
    a random order; ``where`` per group in prompt order."""
    steps = [[(g, [len(r) for r in group]) for g in rng.permutation(len(v)).tolist() for group in [v[g]]]
             for v in visits]  # fmt: skip
    out = router_steps(routing, replicas, steps, int(rng.integers(1 << 31)))
    return [dict(o, where=[o["where"][g] for g in range(len(v))]) for o, v in zip(out, visits)]


def router_step_placements(routing: str, replicas: int, group_size: int, visit_lengths, seed: int = 0) -> dict:
    """Where the real balancer puts one rollout step's requests, first and later epoch. The dataset is
    ROUTER_BATCHES_PER_EPOCH sets of the step's prompt count; ``visit_lengths(set, visit)``: a set's response
    lengths (prompt order) at its first (0) or second (1) visit; set 0 at visit 0 is the priced step. Epoch
    one routes every prompt in a random order, set 0's at their visit 1 (their earlier visit); epoch two
    the other sets, then set 0. Returns "first": the placement of epoch one's last step (new prompts,
    the balancer warmed), "later": set 0's in epoch two, per request in the priced step's order, and the
    "store_share" and "store_available" of that step."""
    rng = np.random.default_rng([seed, 1])
    prompts = len(visit_lengths(0, 0)) // group_size
    sets = ROUTER_BATCHES_PER_EPOCH

    def groups(b, visit):
        lengths = np.asarray(visit_lengths(b, visit)).reshape(prompts, group_size)
        return {(b, g): lengths[g] for g in range(prompts)}

    epoch1 = {**groups(0, 1), **{p: n for b in range(1, sets) for p, n in groups(b, 0).items()}}
    epoch2 = {**{p: n for b in range(1, sets) for p, n in groups(b, 1).items()}, **groups(0, 0)}
    order1 = [list(epoch1)[i] for i in rng.permutation(len(epoch1))]
    others = [p for p in epoch2 if p[0]]
    order2 = [others[i] for i in rng.permutation(len(others))] + [(0, g) for g in rng.permutation(prompts).tolist()]
    steps = [
        [(p, epoch[p]) for p in order[i : i + prompts]]
        for epoch, order in ((epoch1, order1), (epoch2, order2))
        for i in range(0, len(order), prompts)
    ]
    out = router_steps(routing, replicas, steps, seed)
    first, later = out[sets - 1], out[-1]
    return {
        "first": np.concatenate([first["where"][p] for p in first["order"]]),
        "later": np.concatenate([later["where"][(0, g)] for g in range(prompts)]),
        "store_share": later["store_share"],
        "store_available": later["store_available"],
    }


def route(routing: str, group_sizes: Sequence[int], replicas: int, rng, prompt_replica=None):
    """A replica per response of each group under ``routing`` (one of ROUTINGS)."""
    if routing == "default":
        return least_loaded_routing(group_sizes, replicas, rng)
    if routing == "affinity":
        if prompt_replica is None:
            prompt_replica = prompt_affinity_map(len(group_sizes), replicas, rng)
        return [np.full(int(n), prompt_replica[g], dtype=np.int64) for g, n in enumerate(group_sizes)]
    raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")


class ReplicaDrafters:
    """One drafter per replica, each request replayed on its replica's.

    ``share_history``: every replica's history also receives the responses finished on the others.
    A trace set holds one step's worth of responses, so a replica of R would otherwise see 1/R of the
    cross-prompt text an engine's history holds in a long run, where each engine's history is full
    (it is capped, whatever R); sharing keeps the history what R = 1 has, and leaves what the routing
    decides: the siblings and the prompt store on a request's engine.
    """

    def __init__(self, replicas: int, config, share_history: bool = True):
        self.drafters = [SamDrafter(f"replica {r}", config) for r in range(replicas)]
        self.share_history = share_history and config.history_tokens > 0
        self._shared = 0

    def replay(self, label: str, groups, where, k: int, stats) -> None:
        for g, (group, w) in enumerate(zip(groups, where)):
            for r, drafter in enumerate(self.drafters):
                mine = [resp for resp, x in zip(group.responses, w) if x == r]
                if mine:
                    replay_group(drafter, f"{label}-{g}", TraceGroup(group.prompt, mine), k, stats)
            if self.share_history:
                self._share(group.responses, [{int(x)} for x in w])

    def replay_copies(self, label: str, groups, replicas, k: int) -> None:
        """Each group replayed whole on each of its ``replicas`` (a store handoff's copies: the prompt's
        responses in those engines' stores), shared with the others' histories once."""
        for g, (group, where) in enumerate(zip(groups, replicas)):
            held = {int(x) for x in where}
            for r in sorted(held):
                replay_group(self.drafters[r], f"{label}-{g}", group, k, ReplayStats())
            if self.share_history:
                self._share(group.responses, [held] * len(group.responses))

    def _share(self, responses, held) -> None:
        """Each response into the history of every replica but those of ``held`` (per response: the
        replicas that replayed it)."""
        for r, drafter in enumerate(self.drafters):
            for resp, h in zip(responses, held):
                if r in h or not len(resp):
                    continue
                rid = ("shared history", self._shared)  # a prompt of its own: nothing stored under a real one
                prompt = np.array([_HISTORY_MARK, self._shared], dtype=np.int32)
                self._shared += 1
                drafter.drafter.start(rid, prompt)
                drafter.drafter.extend([rid], resp, [len(resp)])
                drafter.drafter.finish(rid)


def _co_located(where: np.ndarray) -> np.ndarray:
    """For each response, how many of the others in ``where`` share its replica."""
    return np.array([int((where == x).sum()) - 1 for x in where], dtype=np.int64)


def routed_acceptance(
    groups,
    replicas: int,
    routing: str,
    epoch: str,
    k: int = 3,
    seed: int = 0,
    bin_edges=None,
    earlier: int | None = None,
    share_history: bool = True,
) -> dict:
    """Acceptance of our drafter (``DraftConfig`` defaults, group-aware) with a rollout's requests
    spread over ``replicas`` engines by ``routing`` (ROUTINGS, or ROUTER_ROUTINGS: the real balancer, each
    visit one step, its requests timed by their lengths), in the simulator's profile schema.

    first epoch: the same-run replay (``replay``; a 2M-token history). later: the revisit proxy
    (``replay_revisits``; each group's first ``earlier`` responses are the prompt's earlier visit,
    routed one epoch before, its others the current visit, scored; 64k history and the prompt store).
    Also counts, per scored response, the siblings on its replica and (later) the earlier visit's
    responses on its replica, which its engine's prompt store holds.
    """
    if epoch not in EPOCHS:
        raise ValueError(f"epoch must be one of {EPOCHS}, got {epoch!r}")
    if bin_edges is None:
        bin_edges = power_of_two_edges(max(len(r) for g in groups for r in g.responses))
    rng = np.random.default_rng(seed)
    prompt_replica = prompt_affinity_map(len(groups), replicas, rng)
    stats = ReplayStats(bin_edges=tuple(bin_edges))
    by_router = routing in ROUTER_ROUTINGS
    if epoch == "first":
        cluster = ReplicaDrafters(replicas, DraftConfig(history_tokens=FIRST_EPOCH_HISTORY), share_history)
        if by_router:
            where = router_visits(routing, [[g.responses for g in groups]], replicas, rng)[0]["where"]
        else:
            where = route(routing, [len(g.responses) for g in groups], replicas, rng, prompt_replica)
        cluster.replay("first", groups, where, k, stats)
        siblings = np.concatenate([_co_located(w) for w in where])
        stored = np.zeros(0)
    else:
        earlier = EARLIER_VISIT if earlier is None else earlier
        if not all(0 < earlier < len(g.responses) for g in groups):
            raise ValueError(f"every group needs more than {earlier} responses to split off an earlier visit")
        before = [TraceGroup(g.prompt, g.responses[:earlier]) for g in groups]
        now = [TraceGroup(g.prompt, g.responses[earlier:]) for g in groups]
        config = DraftConfig(history_tokens=LATER_EPOCH_HISTORY, prompt_store=True)
        cluster = ReplicaDrafters(replicas, config, share_history)
        if by_router:  # the balancer times each visit's requests by their lengths
            visits = router_visits(routing, [[g.responses for g in before], [g.responses for g in now]], replicas, rng)
            where_before, where = (v["where"] for v in visits)
        else:
            where_before = route(routing, [len(g.responses) for g in before], replicas, rng, prompt_replica)
            where = route(routing, [len(g.responses) for g in now], replicas, rng, prompt_replica)
        if routing in STORE_FOLLOWS_GROUP:  # the earlier visit's responses were copied to each replica the group uses
            cluster.replay_copies("earlier", before, where, k)
            stored = np.concatenate([np.full(len(w), len(b.responses)) for w, b in zip(where, before)])
        else:
            cluster.replay("earlier", before, where_before, k, ReplayStats(bin_edges=tuple(bin_edges)))
            stored = np.concatenate([[int((wb == x).sum()) for x in w] for w, wb in zip(where, where_before)])
        cluster.replay("current", now, where, k, stats)
        siblings = np.concatenate([_co_located(w) for w in where])
    group_size = len(now[0].responses) if epoch == "later" else len(groups[0].responses)
    return {
        "k": k,
        "replicas": replicas,
        "routing": routing,
        "epoch": epoch,
        "bin_edges": list(bin_edges),
        "tokens_per_step": stats.by_position(),
        "drafted_per_step": stats.drafted_by_position(),
        "steps": stats.bin_steps.tolist(),
        "mean_tokens_per_step": stats.acceptance_length,
        "draft_efficiency": stats.draft_efficiency,
        "siblings_on_replica": float(siblings.mean()),
        "siblings_in_group": group_size - 1,
        "earlier_responses_on_replica": float(stored.mean()) if stored.size else None,
        "earlier_responses": earlier if epoch == "later" else None,
    }


def profile_from_routed(entry: dict, min_steps: int = 1000) -> AcceptanceProfile:
    """An AcceptanceProfile from one ``routed_acceptance`` entry."""
    return AcceptanceProfile(
        k=int(entry["k"]),
        bin_edges=list(entry["bin_edges"]),
        tokens_per_step=list(entry["tokens_per_step"]),
        drafted_per_step=list(entry["drafted_per_step"]),
        steps=[int(s) for s in entry["steps"]],
        method=f"{entry['routing']} routing, R {entry['replicas']}, {entry['epoch']} epoch",
    )


def profile_key(routing: str, replicas: int, epoch: str) -> str:
    return f"{routing}/R{replicas}/{epoch}"


def _mixed(a: dict, b: dict, share_a: float) -> tuple[list, list]:
    """Per bin, tokens and drafted per step of requests of equal length of which `share_a` follow
    curve a and the rest curve b: steps add up per token (1 / tokens per step), drafts per step."""
    tokens, drafted = [], []
    for ta, tb, da, db in zip(a["tokens_per_step"], b["tokens_per_step"], a["drafted_per_step"], b["drafted_per_step"]):
        if ta is None or tb is None:
            tokens.append(None)
            drafted.append(None)
            continue
        steps_a, steps_b = share_a / ta, (1.0 - share_a) / tb
        tokens.append(1.0 / (steps_a + steps_b))
        drafted.append((steps_a * da + steps_b * db) / (steps_a + steps_b))
    return tokens, drafted


def long_trace_profiles(first: dict, revisit: dict, method: str, replicas_list: Sequence[int]) -> dict:
    """Cluster profiles (keyed by ``profile_key``) from position curves measured on long traces without
    siblings: ``benchmarks.long_replay``'s first-visit and revisit profiles (``acceptance_curves`` schema),
    one method of each. A first epoch drafts as a first visit under every routing; a later epoch as a
    revisit under prompt affinity, and under verl's routing as a revisit on the replica holding the
    prompt's store (1 of R) and as a first visit elsewhere. Siblings are not modelled (the traces hold none)."""
    if first["bin_edges"] != revisit["bin_edges"] or first["k"] != revisit["k"]:
        raise ValueError("the first-visit and revisit profiles must share bins and k")
    a, b = first["methods"][method], revisit["methods"][method]
    steps = [min(x, y) for x, y in zip(a["steps"], b["steps"])]
    out = {}
    for replicas in replicas_list:
        for routing in ROUTINGS:
            for epoch in EPOCHS:
                if epoch == "first":
                    tokens, drafted = list(a["tokens_per_step"]), list(a["drafted_per_step"])
                else:
                    tokens, drafted = _mixed(b, a, 1.0 if routing == "affinity" else 1.0 / replicas)
                counted = [(t, s) for t, s in zip(tokens, steps) if t is not None]
                out[profile_key(routing, replicas, epoch)] = {
                    "k": first["k"],
                    "replicas": replicas,
                    "routing": routing,
                    "epoch": epoch,
                    "bin_edges": list(first["bin_edges"]),
                    "tokens_per_step": tokens,
                    "drafted_per_step": drafted,
                    "steps": steps,
                    "mean_tokens_per_step": sum(t * s for t, s in counted) / sum(s for _, s in counted),
                }
    return out


# --------------------------------------------------------------------------------------------
# Rollout time at cluster scale: R replicas, routing, epoch
# --------------------------------------------------------------------------------------------


def _get(cfg: dict, dotted: str, where: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{where}: no setting {dotted!r}")
        node = node[part]
    return node


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, v in b.items():
        out[key] = _merge(out[key], v) if isinstance(v, dict) and isinstance(out.get(key), dict) else v
    return out


def setup_from_recipe(paths: Sequence, name: str) -> tuple[RolloutSetup, int, int]:
    """(setup, samples per prompt, tensor parallel size) of a recipe; ``paths`` are its YAML files,
    later ones overriding earlier ones (a base file, then the recipe). Replicas = nodes x devices per
    node / rollout TP; requests per rollout step = train batch x generation batches in flight x n."""
    import yaml

    cfg: dict = {}
    for p in paths:
        cfg = _merge(cfg, yaml.safe_load(Path(p).read_text()) or {})
    where = ", ".join(str(p) for p in paths)
    rollout = "actor_rollout_ref.rollout"
    tp = int(_get(cfg, f"{rollout}.tensor_model_parallel_size", where))
    devices = int(_get(cfg, "trainer.nnodes", where)) * int(_get(cfg, "trainer.n_gpus_per_node", where))
    if devices % tp:
        raise ValueError(f"{where}: {devices} devices do not split into rollout TP {tp}")
    n = int(_get(cfg, f"{rollout}.n", where))
    in_flight = int(_get(cfg, "algorithm.filter_groups.max_inflight_gen_batches", where))
    prompts = int(_get(cfg, "data.train_batch_size", where)) * in_flight
    setup = RolloutSetup(
        name=name,
        requests=prompts * n,
        max_num_seqs=int(_get(cfg, f"{rollout}.max_num_seqs", where)),
        replicas=devices // tp,
        max_response=int(_get(cfg, "data.max_response_length", where)),
    )
    return setup, n, tp


def prefill_ms(cost, prompt_len: int) -> float:
    """A request's prefill, from a roofline cost model: one forward of the prompt (q = prompt_len,
    mean context half of it). Added to its replica's time serially, which over-counts what chunked
    prefill hides inside decode steps."""
    return float(cost(1, float(prompt_len), prompt_len / 2))


class DenseRooflineCost:
    """T(batch, q, context) of a dense decoder from ``fit_roofline`` rates (any q, unlike the anchor's
    table, which stops at q = 5): for prefill estimates."""

    def __init__(self, rates: np.ndarray, shape: dict = QWEN3_32B, tp: int = 1):
        self.rates, self.s, self.tp = rates, shape, tp

    def __call__(self, batch: float, q: float, ctx: float) -> float:
        return float(self.rates @ dense_step_features(self.s, batch, q, ctx, self.tp))


def _run_with_prefill(setup, lengths, grid, tables, policy, seed, where, prefill) -> dict:
    r = simulate(setup, lengths, grid, tables, policy, seed=seed, assignment=where)
    slow = r["slowest_replica"]
    walls = [w + n * prefill / 1e3 for w, n in zip(r["replica_wall_s"], r["replica_requests"])]
    return dict(
        wall_s=max(walls),
        decode_s=r["wall_s"],
        plain_s=r["plain_s"],
        verify_s=r["verify_s"],
        overhead_s=r["overhead_s"],
        prefill_s=r["replica_requests"][slow] * prefill / 1e3,
        tail_s=r["slowest_tail_s"],
        steps=r["steps"],
        tokens_per_request_step=r["slowest_tokens_per_request_step"],
        spec_step_fraction=r["spec_steps"] / r["steps"],
    )


def cluster_step(
    setup: RolloutSetup,
    group_size: int,
    lengths: np.ndarray,
    grid: CostGrid,
    tables: dict,
    sam: Policy,
    seed: int = 0,
    prefill: float = 0.0,
    visit_lengths=None,
) -> dict:
    """One rollout step at ``setup.replicas`` replicas: no speculation, and ``sam`` under each routing
    and epoch (``tables[(routing, epoch)]``: profile tables), the requests placed by that routing
    (``lengths`` in prompt order, ``group_size`` per prompt). Returns {(routing, arm): row}, arm "off"
    or an epoch; times include ``prefill`` ms per request. A routing of ROUTER_ROUTINGS in ``tables``
    places each epoch by the real balancer (``router_step_placements`` over ``visit_lengths``, whose
    set 0 visit 0 is ``lengths``): its arms "off first", "off later" (no speculation so placed), the
    epochs, and the later step's "store_share" and "store_available"."""
    if setup.requests % group_size or len(lengths) != setup.requests:
        raise ValueError(f"{setup.requests} requests must be {len(lengths)} lengths, whole groups of {group_size}")
    off = Policy("off", np.zeros(setup.max_num_seqs + 1, dtype=np.int64))
    rng = np.random.default_rng(seed)
    out = {}
    for routing in ROUTINGS:
        where = np.concatenate(route(routing, [group_size] * (setup.requests // group_size), setup.replicas, rng))
        any_tables = tables[(routing, EPOCHS[0])]  # off drafts nothing: any profile
        out[(routing, "off")] = _run_with_prefill(setup, lengths, grid, any_tables, off, seed, where, prefill)
        for epoch in EPOCHS:
            row = _run_with_prefill(setup, lengths, grid, tables[(routing, epoch)], sam, seed, where, prefill)
            out[(routing, epoch)] = row
    for routing in (r for r in ROUTER_ROUTINGS if (r, EPOCHS[0]) in tables):
        if visit_lengths is None:
            raise ValueError(f"routing {routing!r} needs visit_lengths (the dataset the balancer routes)")
        placed = router_step_placements(routing, setup.replicas, group_size, visit_lengths, seed)
        for epoch in EPOCHS:
            t = tables[(routing, epoch)]
            out[(routing, f"off {epoch}")] = _run_with_prefill(
                setup, lengths, grid, t, off, seed, placed[epoch], prefill
            )
            out[(routing, epoch)] = _run_with_prefill(setup, lengths, grid, t, sam, seed, placed[epoch], prefill)
        out[(routing, "later")]["store_share"] = placed["store_share"]
        out[(routing, "later")]["store_available"] = placed["store_available"]
    return out


def mean_rows(runs: list[dict]) -> dict:
    """Per key, the mean over seeds of each number."""
    return {key: {f: float(np.mean([r[key][f] for r in runs])) for f in runs[0][key]} for key in runs[0]}


def constant_acceptance_for(
    ratio: float,
    setup: RolloutSetup,
    lengths_list: list[np.ndarray],
    grid: CostGrid,
    sam: Policy,
    off: Policy,
    k: int = 3,
    prefill: float = 0.0,
    iters: int = 7,
) -> float | None:
    """The tokens per step (bonus included; k drafted every step), held at every position, at which
    ``sam`` reaches ``ratio`` x ``off`` (mean over the length draws); None if not even k + 1 does.
    Bisection: a what-if for what acceptance a target needs."""

    def wall(policy, a):
        tables = AcceptanceProfile.constant(k, a).tables(k, 1)
        runs = [
            _run_with_prefill(setup, ls, grid, tables, policy, i, None, prefill) for i, ls in enumerate(lengths_list)
        ]
        return float(np.mean([r["wall_s"] for r in runs]))

    goal = ratio * wall(off, 1.0)
    lo, hi = 1.0, k + 1.0
    if wall(sam, hi) > goal:
        return None
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if wall(sam, mid) <= goal else (mid, hi)
    return hi


def routed_profiles(
    groups, replicas_list: Sequence[int], k: int = 3, seed: int = 0, log=print, routings: Sequence[str] = ROUTINGS
) -> dict:
    """``routed_acceptance`` for every routing, replica count and epoch, keyed by ``profile_key``."""
    import time

    out = {}
    for replicas in replicas_list:
        for routing in routings:
            for epoch in EPOCHS:
                t0 = time.perf_counter()
                entry = routed_acceptance(groups, replicas, routing, epoch, k, seed)
                out[profile_key(routing, replicas, epoch)] = entry
                log(
                    f"  {profile_key(routing, replicas, epoch):<22} {entry['mean_tokens_per_step']:.3f} tokens/step, "
                    f"siblings on replica {entry['siblings_on_replica']:.2f} of {entry['siblings_in_group']}"
                    + (
                        f", earlier responses on replica {entry['earlier_responses_on_replica']:.2f}"
                        f" of {entry['earlier_responses']}"
                        if epoch == "later"
                        else ""
                    )
                    + f" ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    return out


@dataclass
class ClusterScale:
    """A published setup at cluster scale: its rollout, samples per prompt, step cost and prefill."""

    setup: RolloutSetup
    group_size: int
    cost: object
    prefill_ms: float
    replicas: list  # replica counts to simulate (the setup's own among them)


def scale_rows(sc: ClusterScale, replicas, tables, draws, sam, grid, acceptance: dict, label="") -> list[dict]:
    """cluster_step over the length draws (``draws``: per seed, (set, visit) -> lengths; set 0 visit 0 is
    the priced step), averaged; one row per routing and arm, ``x_off`` against no speculation with the
    same placement of requests, ``x_default_off`` against no speculation placed by the default routing."""
    setup = RolloutSetup(**{**sc.setup.__dict__, "replicas": replicas})
    runs = [
        cluster_step(setup, sc.group_size, visits(0, 0), grid, tables, sam, seed, sc.prefill_ms, visits)
        for seed, visits in enumerate(draws)
    ]
    mean = mean_rows(runs)
    rows = []
    for (routing, arm), r in mean.items():
        own_off = (routing, arm if arm.startswith("off") else f"off {arm}")
        off = mean[own_off if own_off in mean else (routing, "off")]
        rows.append(
            dict(
                scale=sc.setup.name,
                case=label,
                replicas=replicas,
                published_replicas=sc.setup.replicas,
                routing=routing,
                arm=arm,
                replay_tokens_per_step=acceptance.get((routing, arm)),
                x_off=r["wall_s"] / off["wall_s"],
                x_default_off=r["wall_s"] / mean[("default", "off")]["wall_s"],  # against today's routing
                **r,
            )
        )
    return rows


def routed_tables(profiles: dict, replicas: int, k: int, min_steps: int):
    """Profile tables per (routing, epoch): ROUTINGS always, a ROUTER_ROUTINGS routing where replayed."""
    tables, acceptance = {}, {}
    replayed = [r for r in ROUTER_ROUTINGS if all(profile_key(r, replicas, e) in profiles for e in EPOCHS)]
    for routing in (*ROUTINGS, *replayed):
        for epoch in EPOCHS:
            key = profile_key(routing, replicas, epoch)
            if key not in profiles:
                raise ValueError(f"no routed acceptance profile {key!r}: replay it (--replay)")
            tables[(routing, epoch)] = profile_from_routed(profiles[key]).tables(k, min_steps)
            acceptance[(routing, epoch)] = profiles[key]["mean_tokens_per_step"]
    return tables, acceptance


def position_free(entry: dict, k: int = 3) -> AcceptanceProfile:
    """A routed profile's mean over all its steps (tokens and drafted per step), held at every position."""
    steps = np.asarray(entry["steps"], dtype=np.float64)
    tok = np.asarray([t or 0.0 for t in entry["tokens_per_step"]])
    dr = np.asarray([d or 0.0 for d in entry["drafted_per_step"]])
    return AcceptanceProfile.constant(k, float(tok @ steps / steps.sum()), float(dr @ steps / steps.sum()))


def length_draws(lengths_for, setup: RolloutSetup, seeds: int, corr: float) -> list:
    """Per seed, (set, visit) -> response lengths in prompt order: ``lengths_for(setup, seed, corr, visit)``
    for set 0 (the priced step), the other sets (the rest of the dataset the balancer routes) from seeds
    of their own."""
    return [lambda b, visit, seed=seed: lengths_for(setup, seed + 1000 * b, corr, visit) for seed in range(seeds)]


def run_cluster(
    scales: list[ClusterScale],
    profiles: dict,
    lengths_for,
    seeds: int,
    k: int = 3,
    sam_step_overhead_ms: float = 0.0,
    min_steps: int = 1000,
    log=print,
    switch="auto",
) -> dict:
    """Every scale x replica count: no speculation, SAM (``auto``, the online switch, paying
    ``sam_step_overhead_ms`` a step) under default routing and prompt affinity, first and later
    epochs, mean over ``seeds`` length draws (``lengths_for(setup, seed, corr, visit)``); also under the
    real balancer (ROUTER_ROUTINGS) at replica counts whose profiles were replayed. ``switch``: SAM's
    (``sam_policy``)."""
    rows = []
    for sc in scales:
        sam = sam_policy(switch, k, sc.setup.max_num_seqs, sam_step_overhead_ms)
        grid = CostGrid.build(sc.cost, sc.setup.max_num_seqs, k, sc.setup.max_response + 2048)
        for replicas in sc.replicas:
            setup = RolloutSetup(**{**sc.setup.__dict__, "replicas": replicas})
            tables, acceptance = routed_tables(profiles, replicas, k, min_steps)
            new = scale_rows(sc, replicas, tables, length_draws(lengths_for, setup, seeds, 0.0), sam, grid, acceptance)
            rows += new
            x = {(r["routing"], r["arm"]): r["x_default_off"] for r in new}
            log(
                f"  {sc.setup.name} R={replicas} (x default's no speculation): "
                + ", ".join(
                    f"{routing} {epoch} {x[(routing, epoch)]:.3f}x"
                    for routing in dict.fromkeys(ro for ro, _ in tables)
                    for epoch in EPOCHS
                ),
                flush=True,
            )
    return dict(rows=rows, sam_policy=str(switch), sam_step_overhead_ms=sam_step_overhead_ms, seeds=seeds)


def cluster_what_ifs(
    sc: ClusterScale,
    profiles: dict,
    lengths_for,
    seeds: int,
    ratio: float,
    k: int = 3,
    sam_step_overhead_ms: float = 0.0,
    min_steps: int = 1000,
    length_corr: float = 0.5,
    switch="auto",
) -> dict:
    """At a scale's own replica count, what the measured case leaves open:
    - each routed profile's mean held at every position (the trace set holds few steps past 1,024
      tokens, and the simulator holds its last well-populated bin to 34k);
    - response lengths correlated within a prompt (``length_corr`` of the log-length variance shared
      by a prompt's samples): prompt affinity then puts a prompt's long responses on one replica;
      and both of these at once;
    - the constant tokens per step (k drafted every step) at which SAM reaches ``ratio`` x no
      speculation."""
    sam = sam_policy(switch, k, sc.setup.max_num_seqs, sam_step_overhead_ms)
    off = Policy("off", np.zeros(sc.setup.max_num_seqs + 1, dtype=np.int64))
    grid = CostGrid.build(sc.cost, sc.setup.max_num_seqs, k, sc.setup.max_response + 2048)
    replicas = sc.setup.replicas
    tables, acceptance = routed_tables(profiles, replicas, k, min_steps)
    iid = length_draws(lengths_for, sc.setup, seeds, 0.0)
    flat = {(ro, ep): position_free(profiles[profile_key(ro, replicas, ep)], k).tables(k, 1) for ro, ep in tables}
    corr = length_draws(lengths_for, sc.setup, seeds, length_corr)
    correlated = f"lengths correlated within a prompt ({length_corr:.2f})"
    need = constant_acceptance_for(ratio, sc.setup, [d(0, 0) for d in iid], grid, sam, off, k, sc.prefill_ms)
    return dict(
        position_free=scale_rows(sc, replicas, flat, iid, sam, grid, acceptance, "position-free acceptance"),
        correlated_lengths=scale_rows(sc, replicas, tables, corr, sam, grid, acceptance, correlated),
        position_free_correlated=scale_rows(
            sc, replicas, flat, corr, sam, grid, acceptance, f"position-free acceptance, {correlated}"
        ),
        length_corr=length_corr,
        target=dict(scale=sc.setup.name, replicas=replicas, ratio=ratio, constant_tokens_per_step_needed=need),
    )


def cluster_table(result: dict) -> str:
    """Markdown: per scale, replica count and epoch, no speculation (default routing) against SAM under each
    routing (the real balancer's bounds where simulated: "-" elsewhere), every ratio dividing by the
    no-speculation time shown; and the balancer's later step's store share (where the stores were) and,
    with handoffs, what its revisits found on their replicas."""
    rows = {(r["scale"], r["replicas"], r["routing"], r["arm"]): r for r in result["rows"]}
    lines = [
        "| setup | replicas | epoch | no speculation | SAM, default routing | SAM, ideal affinity "
        "| SAM, affinity with store handoff | SAM, affinity with fixed stores "
        "| store share, handoff (available) / fixed stores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(scale, replicas, routing, epoch):
        r = rows.get((scale, replicas, routing, epoch))
        return "-" if r is None else f"{r['wall_s']:.0f} s ({r['x_default_off']:.3f}x)"

    for scale, replicas in dict.fromkeys((r["scale"], r["replicas"]) for r in result["rows"]):
        off = rows[(scale, replicas, "default", "off")]
        own = " (recipe's)" if replicas == off["published_replicas"] else ""
        for epoch in EPOCHS:
            moved, fixed = (rows.get((scale, replicas, ro, epoch), {}) for ro in ROUTER_ROUTINGS)
            moved_share = moved.get("store_share")
            share = " / ".join([
                "-" if moved_share is None else f"{moved_share:.3f} ({moved['store_available']:.3f})",
                "-" if fixed.get("store_share") is None else f"{fixed['store_share']:.3f}",
            ])  # fmt: skip
            lines.append(
                f"| {scale} | {replicas}{own} | {epoch} | {off['wall_s']:.0f} s | "
                + " | ".join(cell(scale, replicas, ro, epoch) for ro in (*ROUTINGS, *ROUTER_ROUTINGS))
                + f" | {share} |"
            )
    return "\n".join(lines)


def time_breakdown(rows: list[dict], routing: str, arm: str) -> dict:
    """Where the slowest replica's time goes in one row of ``rows`` (one scale and replica count),
    seconds: prefill (estimate), plain decode (each step at its no-draft cost), what verifying drafts
    added, per-step overhead; the tail (steps of <= tail_batch requests) is part of the decode terms."""
    r = next(x for x in rows if (x["routing"], x["arm"]) == (routing, arm))
    keys = ("wall_s", "prefill_s", "plain_s", "verify_s", "overhead_s", "tail_s", "steps", "tokens_per_request_step")
    return {key: r[key] for key in keys}
