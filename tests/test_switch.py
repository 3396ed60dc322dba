"""sam_rollout.drafter.switch (schedules) and its wiring into sam_rollout.settings / sam_rollout.stepper
(additional_config.sam_spec.switch). The cost model that derives schedules: tests/test_cost_model.py."""

from __future__ import annotations

import numpy as np
import pytest

from sam_rollout.drafter.switch import k_for_batch, threshold_schedule, validate_schedule
from sam_rollout.settings import SamSettings
from sam_rollout.stepper import SamStepper

# ---------------------------------------------------------------------------------- schedules


def test_k_for_batch_picks_first_pair_covering_the_batch():
    s = validate_schedule([[4, 3], [16, 2], [32, 1]], max_k=3)
    assert s == ((4, 3), (16, 2), (32, 1))
    assert [k_for_batch(s, n) for n in (1, 4, 5, 16, 17, 32, 33, 500)] == [3, 3, 2, 2, 1, 1, 0, 0]


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("8", "list of [max_batch, k] pairs"),
        (8, "list of [max_batch, k] pairs"),
        ([], "at least one"),
        ([[8]], "pair"),
        ([[8, 3, 1]], "pair"),
        ([[0, 3]], "max_batch must be an integer >= 1"),
        ([[8.0, 3]], "max_batch must be an integer >= 1"),
        ([[True, 3]], "max_batch must be an integer >= 1"),
        ([[8, 4]], "k must be an integer in 0..3"),
        ([[8, -1]], "k must be an integer in 0..3"),
        ([[8, 3], [8, 2]], "increase strictly"),
        ([[16, 3], [8, 2]], "increase strictly"),
    ],
)
def test_validate_schedule_errors(raw, fragment):
    with pytest.raises(ValueError, match="sam_spec.switch") as e:
        validate_schedule(raw, max_k=3, where="additional_config.sam_spec.switch")
    assert fragment in str(e.value)


def test_threshold_is_a_one_pair_schedule():
    assert threshold_schedule(8, 3, 128) == ((8, 3),)
    assert threshold_schedule(None, 3, 128) == ((128, 3),)
    assert threshold_schedule(0, 3, 128) == ((1, 0),)


# ------------------------------------------------------------------------ rollout wiring


def test_settings_schedule_is_validated_with_a_clear_error():
    S = SamSettings
    assert S.from_mapping(3, {"switch": [[4, 3], [16, 1]]}).switch == ((4, 3), (16, 1))
    with pytest.raises(ValueError, match=r"additional_config\.sam_spec\.switch\[0\]: k must be"):
        S.from_mapping(3, {"switch": [[4, 5]]})
    with pytest.raises(ValueError, match=r"additional_config\.sam_spec\.switch\[1\]: max_batch must increase"):
        S.from_mapping(3, {"switch": [[4, 3], [4, 1]]})


def test_stepper_follows_the_schedule_per_step():
    st = SamStepper(SamSettings.from_mapping(3, {"switch": [[1, 3], [2, 1]]}), max_model_len=64)
    period = [5, 6, 7, 8, 9]
    rows = np.zeros((3, 64), dtype=np.int32)
    lengths = np.zeros(3, dtype=np.int32)
    for i in range(3):
        rows[i, :10] = period * 2
        lengths[i] = 10
    ids = ["a", "b", "c"]
    npt = lengths.copy()
    out = st.step(ids, npt, [[9]] * 3, lengths, rows, num_scheduled_reqs=3)
    assert out == [[], [], []]  # above the last pair
    out = st.step(ids, npt, [[9]] * 3, lengths, rows, num_scheduled_reqs=2)
    assert [len(o) for o in out] == [1, 1, 1]
    out = st.step(ids, npt, [[9]] * 3, lengths, rows, num_scheduled_reqs=1)
    assert [len(o) for o in out] == [3, 3, 3]
    assert st.switch.choose_k(1) == 3 and st.switch.choose_k(2) == 1 and st.switch.choose_k(3) == 0


def test_a_threshold_is_the_schedule_up_to_it():
    key = "switch"
    st = SamStepper(SamSettings.from_mapping(3, {key: 8}), max_model_len=64)
    assert [st.switch.choose_k(n) for n in (1, 8, 9)] == [3, 3, 0]
    st = SamStepper(SamSettings.from_mapping(3, {key: None}), max_model_len=64)
    assert st.switch.choose_k(10_000) == 3
    st = SamStepper(SamSettings.from_mapping(3, {key: 0}), max_model_len=64)
    assert st.switch.choose_k(1) == 0
