"""sam_engine_kwargs: the engine arguments every script and test builds SAM from, read back as the engine
reads them."""

import pytest

from rollout.engine_kwargs import sam_engine_kwargs
from rollout.settings import SamSettings
from rollout.verl.engine_args import check_sam_engine_kwargs


class _VllmConfig:  # the two attributes SamSettings.from_vllm_config reads
    def __init__(self, kw):
        self.speculative_config = type(
            "Spec", (), {"num_speculative_tokens": kw["speculative_config"]["num_speculative_tokens"]}
        )
        self.additional_config = kw["additional_config"]


def test_the_settings_reach_the_engine_and_verl_checks_alike():
    kw = sam_engine_kwargs(4, schedule=[[2, 4], [8, 1]], group_aware=False)
    assert kw["speculative_config"] == {
        "method": "custom_class",
        "model": "rollout.proposer.SamProposer",
        "num_speculative_tokens": 4,
    }
    from_engine = SamSettings.from_vllm_config(_VllmConfig(kw))
    assert from_engine == check_sam_engine_kwargs(kw)
    assert (from_engine.k, from_engine.schedule, from_engine.group_aware) == (4, ((2, 4), (8, 1)), False)
    assert from_engine.min_match == SamSettings.min_match  # settings not given keep their defaults


def test_a_bad_setting_fails_where_the_engine_reads_it():
    kw = sam_engine_kwargs(3, threshold=-1)
    with pytest.raises(ValueError, match=r"additional_config.sam_spec.threshold must be an integer >= 0"):
        SamSettings.from_vllm_config(_VllmConfig(kw))
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer >= 1, got 2.5"):
        check_sam_engine_kwargs(sam_engine_kwargs(2.5))
