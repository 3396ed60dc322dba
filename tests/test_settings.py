"""sam_engine_kwargs: the engine arguments every script and test builds SAM from, read back as the engine
reads them (``SamSettings``): one switch under one name, every DraftConfig field, and the messages a
bad, unknown or removed setting gives."""

from dataclasses import fields

import pytest

from sam_rollout.drafter import DraftConfig
from sam_rollout.drafter.switch import k_for_batch
from sam_rollout.engine_kwargs import sam_engine_kwargs
from sam_rollout.settings import AUTO, DEFAULT_SWITCH, KNOWN_KEYS, SamSettings
from sam_rollout.verl.runtime.engine_args import check_sam_engine_kwargs


class _VllmConfig:  # the two attributes SamSettings.from_vllm_config reads
    def __init__(self, kw):
        self.speculative_config = type(
            "Spec", (), {"num_speculative_tokens": kw["speculative_config"]["num_speculative_tokens"]}
        )
        self.additional_config = kw["additional_config"]


def test_the_settings_reach_the_engine_and_verl_checks_alike():
    kw = sam_engine_kwargs(4, switch=[[2, 4], [8, 1]], group_aware=False)
    assert kw["speculative_config"] == {
        "method": "custom_class",
        "model": "sam_rollout.proposer.SamProposer",
        "num_speculative_tokens": 4,
    }
    from_engine = SamSettings.from_vllm_config(_VllmConfig(kw))
    assert from_engine == check_sam_engine_kwargs(kw)
    assert (from_engine.draft.k, from_engine.switch, from_engine.draft.group_aware) == (4, ((2, 4), (8, 1)), False)
    assert from_engine.draft.min_match == DraftConfig.min_match  # settings not given keep their defaults


def test_defaults():
    s = SamSettings.from_mapping(3, None)
    assert s == SamSettings.from_mapping(3, {}) == SamSettings(draft=DraftConfig(k=3))
    assert (s.switch, s.log_interval_s, s.draft) == (DEFAULT_SWITCH, 0.0, DraftConfig(k=3))
    assert s.draft.prompt_store is False  # the store is opt-in in the engine (the recipes turn it on)


def test_every_draft_config_field_but_k_is_a_setting_and_round_trips():
    changed = {"min_match": 2, "length_policy": "confidence", "continuation": "frequent", "min_token_prob": 0.3,
               "count_prior": 2.0, "recency_weight": 3.0, "long_match": 8, "group_aware": False,
               "history_tokens": 4096, "prompt_store": True, "prompt_store_bytes": 1 << 20,
               "prompt_store_tokens": 512, "base_k": 2, "match_scale": 3.0}  # fmt: skip
    assert set(changed) == {f.name for f in fields(DraftConfig)} - {"k"}
    assert all(changed[name] != getattr(DraftConfig, name) for name in changed)  # each one differs from its default
    s = SamSettings.from_mapping(5, {**changed, "switch": 2, "log_interval_s": 1.5})
    assert s.draft == DraftConfig(k=5, **changed)
    assert (s.switch, s.log_interval_s) == (2, 1.5)
    assert set(KNOWN_KEYS) == set(changed) | {"switch", "log_interval_s"}


@pytest.mark.parametrize(
    "raw,switch",
    [
        ({"switch": 4}, 4),
        ({"switch": 0}, 0),
        ({"switch": None}, None),
        ({"switch": "auto"}, AUTO),
        ({"switch": [[2, 3], [16, 1]]}, ((2, 3), (16, 1))),
    ],
)
def test_one_switch_four_kinds_of_value(raw, switch):
    assert SamSettings.from_mapping(3, raw).switch == switch


@pytest.mark.parametrize(
    "raw",
    [{"threshold": 8}, {"schedule": "auto"}, {"threshold": None, "schedule": [[2, 3]]}, {"switch": 4, "threshold": 8}],
)
def test_the_switchs_removed_names_fail_as_unknown_keys_listing_the_known_ones(raw):
    removed = sorted(set(raw) - {"switch"})
    with pytest.raises(ValueError) as e:
        SamSettings.from_mapping(3, raw)
    assert f"additional_config.sam_spec: unknown setting(s) {removed}; known: {sorted(KNOWN_KEYS)}" == str(e.value)


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"switch": -1}, r"sam_spec\.switch must be an integer >= 0 \(a threshold\), null \(every step\), \"auto\""),
        ({"switch": "always"}, r"sam_spec\.switch must be .*got 'always'"),  # null is the one spelling
        ({"switch": "sometimes"}, r"sam_spec\.switch must be .*got 'sometimes'"),
        ({"switch": True}, r"sam_spec\.switch must be .*got True"),
        ({"switch": [[2, 4]]}, r"sam_spec\.switch\[0\]: k must be an integer in 0\.\.3"),
        ({"switch": 2.5}, r"sam_spec\.switch must be .*got 2\.5"),
        ({"long_match": 0}, r"sam_spec: DraftConfig\.long_match must be in \[1, 16\]"),
        ({"log_interval_s": -1}, r"sam_spec\.log_interval_s must be a number >= 0"),
        ({"k": 3}, r"sam_spec\.k is not a setting: k is speculative_config\.num_speculative_tokens"),
    ],
)
def test_a_bad_setting_names_its_key(raw, message):
    with pytest.raises(ValueError, match=message):
        SamSettings.from_mapping(3, raw)


def test_an_unknown_key_fails_with_the_known_ones():
    with pytest.raises(ValueError) as e:
        SamSettings.from_mapping(3, {"treshold": 3})
    assert "unknown setting(s) ['treshold']" in str(e.value)
    assert all(repr(key) in str(e.value) for key in KNOWN_KEYS)


def test_a_bad_setting_fails_where_the_engine_reads_it():
    kw = sam_engine_kwargs(3, switch=-1)
    with pytest.raises(ValueError, match=r"additional_config.sam_spec.switch must be an integer >= 0"):
        SamSettings.from_vllm_config(_VllmConfig(kw))
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer >= 1, got 2.5"):
        check_sam_engine_kwargs(sam_engine_kwargs(2.5))
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be an integer >= 1, got 0"):
        SamSettings(draft=DraftConfig(k=0))


def test_fixed_schedule():
    assert SamSettings.from_mapping(3, {"switch": 8}).fixed_schedule() == ((8, 3),)
    assert SamSettings.from_mapping(3, {"switch": None}).fixed_schedule(64) == ((64, 3),)
    assert SamSettings.from_mapping(3, {"switch": 0}).fixed_schedule() == ((1, 0),)
    assert SamSettings.from_mapping(3, {"switch": [[2, 3]]}).fixed_schedule() == ((2, 3),)
    with pytest.raises(ValueError, match="no fixed schedule"):
        SamSettings.from_mapping(3, {"switch": "auto"}).fixed_schedule()


def test_the_sam_method_arguments_pass_vllm_034s_own_schedule_checks():
    """vLLM >= 0.34: method "sam" and the switch as num_speculative_tokens_per_batch_size, which 0.34's own
    validation accepts and expands to the k SAM's switch chooses at every batch size (the module is read
    from the 0.34 wheel, as tests/test_vllm034_contract.py reads it)."""
    import types

    from conftest import released_wheel

    from sam_rollout.vllm.speculator import sam_method_engine_kwargs

    source = released_wheel("vllm", "0.34.0").read("vllm/v1/spec_decode/dynamic/utils.py").decode()
    dynamic = types.ModuleType("vllm034_dynamic_sd")
    exec(compile(source, "vllm/v1/spec_decode/dynamic/utils.py", "exec"), dynamic.__dict__)
    max_num_seqs = 64
    for switch in (8, 0, None, [[2, 4], [16, 1]], [[2, 0], [8, 4]]):
        kw = sam_method_engine_kwargs(4, max_num_seqs, switch=switch, group_aware=False)
        spec = kw["speculative_config"]
        assert (spec["method"], spec["num_speculative_tokens"]) == ("sam", 4)
        assert kw["additional_config"] == {"sam_spec": {"switch": switch, "group_aware": False}}
        table = spec["num_speculative_tokens_per_batch_size"]
        assert dynamic.validate_and_normalize_dynamic_sd_schedule(table) == [tuple(r) for r in table]
        lookup = dynamic.build_dynamic_sd_schedule_lookup(table, max_num_seqs, 4)
        settings = SamSettings.from_mapping(4, kw["additional_config"]["sam_spec"])
        assert lookup[1:] == [k_for_batch(settings.fixed_schedule(max_num_seqs), b) for b in range(1, 65)]
    with pytest.raises(ValueError, match='switch="auto" is not supported'):
        sam_method_engine_kwargs(4, max_num_seqs, switch="auto")
    with pytest.raises(ValueError, match="sam_spec.switch must be an integer >= 0"):
        sam_method_engine_kwargs(4, max_num_seqs, switch=-1)
