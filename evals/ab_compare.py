"""Compare a baseline run and a SAM run from verl's file-logger JSONL (one {"step", "data"} per line).

    python -m evals.ab_compare BASELINE.jsonl SAM.jsonl [--plots DIR] [--tolerance 0.05]

Prints, per step and in total: rollout time (timing_s/gen, summed over a DAPO step's generation
batches), the speed-up baseline/SAM, rollout time per 1,000 generated tokens and requests per step
where both arms log them (rollout/generated_tokens, rollout/requests), SAM's mean acceptance length,
speculation-on fraction and drafter time (rollout/sam_*), and the reward and response-length curves
side by side. Then a
verdict per training curve (reward, response length) on the paired per-step difference SAM - baseline:

  agree         the 95% moving-block bootstrap interval of the mean difference lies within
                +-margin (equivalence), margin = tolerance x max(|baseline mean|, baseline range
                over the run): "within 5% of how far the curve moves in training"
  differ        otherwise, when the interval excludes 0 (a significant, not negligible difference)
  inconclusive  otherwise (the interval contains 0 but reaches past the margin: too noisy), or
                with fewer than 10 steps in common; then the run's power is stated: how many steps
                would bring the interval inside the margin if its width shrinks as 1/sqrt(steps)

Block bootstrap, because successive training steps are correlated. Writes PNG plots with --plots.
Exit status: 0 when every curve agrees, 1 when one differs or is inconclusive, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROLLOUT_TIME = "timing_s/gen"
GEN_BATCHES = "train/num_gen_batches"
REWARD = "critic/score/mean"
RESPONSE_LENGTH = "response_length/mean"
ACCEPTANCE = "rollout/sam_acceptance_length"
SPEC_ON = "rollout/sam_spec_on_fraction"
DRAFTER_MS = "rollout/sam_drafter_ms"
GENERATED_TOKENS = "rollout/generated_tokens"
REQUESTS = "rollout/requests"
CURVES = (REWARD, RESPONSE_LENGTH)
MIN_STEPS = 10


def read_metrics(path: Path) -> dict[int, dict]:
    """step -> merged metrics of that step (a step may be logged in several lines)."""
    steps: dict[int, dict] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, data = int(record["step"]), record["data"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a verl file-logger record ({e})") from None
            steps.setdefault(step, {}).update(data)
    return steps


def training_steps(metrics: dict[int, dict]) -> dict[int, dict]:
    """Steps that trained (have a rollout time), not validation-only records."""
    return {s: m for s, m in metrics.items() if ROLLOUT_TIME in m}


def series(steps: dict[int, dict], key: str, order: list[int]) -> np.ndarray:
    return np.array([float(steps[s].get(key, np.nan)) for s in order])


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    key: str
    mean_difference: float
    low: float
    high: float
    margin: float
    steps: int

    @property
    def steps_for_a_verdict(self) -> int:
        """Steps at which this interval, shrinking as 1/sqrt(steps) about its mean, would fit the margin;
        0 where the mean difference itself is outside the margin (no number of steps shows agreement)."""
        half = (self.high - self.low) / 2
        room = self.margin - abs(self.mean_difference)
        return 0 if room <= 0 else max(MIN_STEPS, int(np.ceil(self.steps * (half / room) ** 2)))

    @property
    def label(self) -> str:
        if self.steps < MIN_STEPS:
            return "inconclusive"  # a bootstrap over a handful of steps understates its own spread
        if -self.margin <= self.low and self.high <= self.margin:
            return "agree"  # equivalent: any difference is inside the margin
        if self.low > 0 or self.high < 0:
            return "differ"  # significant and not negligible
        return "inconclusive"


def block_bootstrap_interval(d: np.ndarray, block: int, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of mean(d) by the moving-block bootstrap (keeps short-range correlation)."""
    n = len(d)
    block = max(1, min(block, n))
    starts = np.arange(n - block + 1)
    per_sample = -(-n // block)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(starts, size=(draws, per_sample))
    idx = (chosen[:, :, None] + np.arange(block)[None, None, :]).reshape(draws, -1)[:, :n]
    means = d[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def compare_curve(key: str, base: np.ndarray, sam: np.ndarray, tolerance: float) -> Verdict:
    ok = ~(np.isnan(base) | np.isnan(sam))
    if ok.sum() < 2:
        raise ValueError(f"{key}: fewer than 2 steps carry it in both runs")
    d = sam[ok] - base[ok]
    block = max(1, int(round(len(d) ** (1 / 3))))  # the usual n^(1/3) block length
    low, high = block_bootstrap_interval(d, block)
    b = base[ok]
    margin = tolerance * max(abs(float(np.mean(b))), float(np.max(b) - np.min(b)))
    return Verdict(key, float(np.mean(d)), low, high, margin, int(ok.sum()))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def fmt(x: float, digits: int = 3) -> str:
    return "-" if np.isnan(x) else f"{x:.{digits}f}"


def step_table(order, base_steps, sam_steps) -> list[str]:
    cols = [
        ("gen_s base", base_steps, ROLLOUT_TIME, 1),
        ("gen_s sam", sam_steps, ROLLOUT_TIME, 1),
        ("accept_len", sam_steps, ACCEPTANCE, 2),
        ("spec_on", sam_steps, SPEC_ON, 2),
        ("reward base", base_steps, REWARD, 3),
        ("reward sam", sam_steps, REWARD, 3),
        ("resp_len base", base_steps, RESPONSE_LENGTH, 0),
        ("resp_len sam", sam_steps, RESPONSE_LENGTH, 0),
    ]
    lines = ["step  speedup  " + "  ".join(f"{c[0]:>13}" for c in cols)]
    for s in order:
        gb, gs = base_steps[s][ROLLOUT_TIME], sam_steps[s][ROLLOUT_TIME]
        cells = [f"{fmt(float(src[s].get(k, np.nan)), dg):>13}" for _, src, k, dg in cols]
        lines.append(f"{s:>4}  {gb / gs:>6.3f}x  " + "  ".join(cells))
    return lines


def summary(order, base_steps, sam_steps) -> list[str]:
    gb, gs = series(base_steps, ROLLOUT_TIME, order), series(sam_steps, ROLLOUT_TIME, order)
    nb, ns = series(base_steps, GEN_BATCHES, order), series(sam_steps, GEN_BATCHES, order)
    lines = [
        f"steps compared: {len(order)}",
        f"rollout time per step: baseline {gb.mean():.2f} s, SAM {gs.mean():.2f} s, "
        f"change {100 * (gs.sum() / gb.sum() - 1):+.1f}%, speed-up {gb.sum() / gs.sum():.3f}x",
    ]
    if not (np.isnan(nb).any() or np.isnan(ns).any()):
        # DAPO's group filter may need a different number of generation batches per step in each arm
        lines.append(
            f"rollout time per generation batch: speed-up {(gb.sum() / nb.sum()) / (gs.sum() / ns.sum()):.3f}x"
        )
    tb, ts = series(base_steps, GENERATED_TOKENS, order), series(sam_steps, GENERATED_TOKENS, order)
    if not (np.isnan(tb).any() or np.isnan(ts).any()) and tb.sum() and ts.sum():
        per_b, per_s = 1e3 * gb.sum() / tb.sum(), 1e3 * gs.sum() / ts.sum()
        lines.append(
            f"rollout time per 1,000 generated tokens: baseline {per_b:.2f} s ({tb.sum():.0f} tokens), "
            f"SAM {per_s:.2f} s ({ts.sum():.0f} tokens), speed-up {per_b / per_s:.3f}x"
        )
    rb, rs = series(base_steps, REQUESTS, order), series(sam_steps, REQUESTS, order)
    if not (np.isnan(rb).all() or np.isnan(rs).all()):
        lines.append(f"requests per step: baseline {np.nanmean(rb):.1f}, SAM {np.nanmean(rs):.1f}")
    for label, key in (
        ("mean acceptance length", ACCEPTANCE),
        ("speculation-on fraction", SPEC_ON),
        ("drafter ms per engine step", DRAFTER_MS),
    ):
        v = series(sam_steps, key, order)
        lines.append(f"{label} (SAM): {fmt(float(np.nanmean(v)) if not np.isnan(v).all() else np.nan)}")
    return lines


def plot(order, base_steps, sam_steps, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    panels = [
        (ROLLOUT_TIME, "rollout time per step (s)"),
        (REWARD, "reward (score mean)"),
        (RESPONSE_LENGTH, "response length (mean tokens)"),
        (ACCEPTANCE, "SAM mean acceptance length"),
    ]
    written = []
    for key, title in panels:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, steps in (("baseline", base_steps), ("SAM", sam_steps)):
            y = series(steps, key, order)
            if not np.isnan(y).all():
                ax.plot(order, y, marker=".", label=name)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.legend()
        fig.tight_layout()
        path = out / (key.replace("/", "_") + ".png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def compare(base_path: Path, sam_path: Path, tolerance: float, plots: Path | None) -> tuple[list[str], list[Verdict]]:
    base_steps, sam_steps = training_steps(read_metrics(base_path)), training_steps(read_metrics(sam_path))
    order = sorted(set(base_steps) & set(sam_steps))
    if len(order) < 2:
        raise ValueError(f"fewer than 2 training steps in both logs ({len(base_steps)} and {len(sam_steps)} steps)")
    verdicts = [compare_curve(k, series(base_steps, k, order), series(sam_steps, k, order), tolerance) for k in CURVES]
    lines = step_table(order, base_steps, sam_steps) + [""] + summary(order, base_steps, sam_steps) + [""]
    for v in verdicts:
        lines.append(
            f"{v.key}: {v.label} (mean SAM - baseline {v.mean_difference:+.4g}, 95% block-bootstrap interval "
            f"[{v.low:+.4g}, {v.high:+.4g}], equivalence margin +-{v.margin:.4g}, {v.steps} steps)"
        )
        if v.label == "inconclusive":
            need = v.steps_for_a_verdict
            lines.append(
                f"  power: the interval is {(v.high - v.low) / (2 * v.margin):.1f}x the margin; "
                + (
                    f"about {need} steps would fit it inside the margin (width as 1/sqrt(steps))"
                    if need
                    else "the mean difference alone exceeds the margin: more steps could only show a change"
                )
            )
    if plots is not None:
        lines += [f"plot: {p}" for p in plot(order, base_steps, sam_steps, plots)]
    return lines, verdicts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("baseline", type=Path)
    p.add_argument("sam", type=Path)
    p.add_argument("--plots", type=Path, help="folder for PNG plots")
    p.add_argument("--tolerance", type=float, default=0.05, help="equivalence margin, fraction of the baseline's scale")
    args = p.parse_args(argv)
    try:
        lines, verdicts = compare(args.baseline, args.sam, args.tolerance, args.plots)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if all(v.label == "agree" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
