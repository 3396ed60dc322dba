"""The log-prob check's use of verl 0.9.1's compute_offpolicy_metrics (evals/fixed_weight_logprobs.py): the
per-response metrics, weighted by tokens, give back the batch's token means; and why it also evaluates
verl's formulas in float64: at fp32 engine/trainer gaps (~1e-5) float32 cannot resolve k3_kl."""

import numpy as np
import pytest
from verl_step import verl_step_only

verl_step_only()

from evals import fixed_weight_logprobs as fl  # noqa: E402


def gaps(rng, scale, responses=40):
    trainer = [list(-rng.uniform(0.01, 4.0, rng.integers(3, 30))) for _ in range(responses)]
    engine = [[x + scale * rng.normal(0.3, 1.0) for x in t] for t in trainer]
    return trainer, engine


@pytest.mark.parametrize("scale", [1e-2, 1e-5])
def test_token_weighted_per_response_metrics_are_the_batch_metrics(scale):
    trainer, engine = gaps(np.random.default_rng(0), scale)
    batch = fl.offpolicy_metrics(trainer, engine, float64=True)
    per = fl.per_response_metrics(trainer, engine)
    tokens = np.array([len(t) for t in trainer])
    # verl's masked_mean divides by tokens + 1e-8: chi2_token = mean(rho^2) - 1 of one response moves by
    # about 1e-8 / tokens, far below the gaps measured (>= 1e-5)
    for key, tolerance in (("kl", 1e-12), ("k3_kl", 1e-20), ("chi2_token", 1e-9)):
        assert np.dot(per[key], tokens) / tokens.sum() == pytest.approx(batch[key], rel=1e-6, abs=tolerance), key


def test_float32_k3_kl_reads_rounding_at_fp32_gaps():
    trainer, engine = gaps(np.random.default_rng(1), 1e-5)
    exact = fl.offpolicy_metrics(trainer, engine, float64=True)["k3_kl"]
    as_logged = fl.offpolicy_metrics(trainer, engine)["k3_kl"]  # float32, as in the trainer's batch
    assert 0 < exact < 1e-9  # about (1e-5)^2 / 2 a token
    assert abs(as_logged - exact) > 5 * exact  # exp(r) - r - 1 in float32: rounding of ~6e-8 dominates
    bf16_scale = fl.offpolicy_metrics(*gaps(np.random.default_rng(1), 1e-2))
    exact_bf16 = fl.offpolicy_metrics(*gaps(np.random.default_rng(1), 1e-2), float64=True)
    assert bf16_scale["k3_kl"] == pytest.approx(exact_bf16["k3_kl"], rel=1e-2)  # bf16-sized gaps: float32 suffices
