"""The held-out selection rule of benchmarks/policy_split.py."""

from benchmarks.policy_split import TARGET_MARGIN, candidates, choose


def results_with(tune: dict[str, tuple[float, float]]) -> dict:
    """Two trace sets; Arctic at 1.0 on both; candidates not named score 1.0 (no margin)."""
    out = {}
    for i, name in enumerate(("a", "b")):
        row = {"arctic": 1.0} | {c: 1.0 for c in candidates()}
        row |= {c: 1.0 + margins[i] for c, margins in tune.items()}
        out[name] = {"tune": row}
    return out


def test_targets_met_count_first_then_the_smaller_margin():
    names = list(candidates())
    big = TARGET_MARGIN + 0.05
    results = results_with({names[1]: (big, 0.0), names[2]: (big, TARGET_MARGIN), names[3]: (0.02, 0.02)})
    assert choose(results) == names[2]  # meets both
    results = results_with({names[1]: (big, 0.01), names[2]: (TARGET_MARGIN, 0.02)})
    assert choose(results) == names[2]  # both meet one target; the smaller margin is larger
