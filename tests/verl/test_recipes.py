"""Every recipe config composes against verl 0.9.1's real schema (pkg://verl.trainer.config), passes
verl's own validation, and resolves to vLLM engine kwargs with SAM's published settings; overrides
change them; invalid overrides fail before anything launches."""

import pytest
from verl_step import make_inputs, verl_step_only

verl_step_only()

from omegaconf import OmegaConf  # noqa: E402

from rollout.verl import launch, recipe_config  # noqa: E402
from rollout.verl.recipe_config import RecipeError  # noqa: E402

# (recipe, config, threshold, k, max_num_seqs, rollout TP, train batch, prompts in flight (train batches), nodes,
# strategy, prompt store bytes per replica): the published generation batch (96, 1536, 128 prompts) as V1's
# max_inflight_gen_batches
PUBLISHED = [
    ("dapo_qwen3_32b", "dapo_qwen3_32b", 8, 3, 128, 8, 32, 3, 2, "fsdp", 2 << 30),
    ("dapo_qwen3_32b", "dapo_qwen3_32b_8node", 4, 4, 256, 8, 512, 3, 8, "fsdp", 1 << 30),
    ("dapo_qwen3_235b", "dapo_qwen3_235b", 8, 3, 64, 4, 128, 1, 8, "megatron", 1 << 30),
]
CPU_PRESETS = [("dapo_smollm2_cpu", "dapo_smollm2_cpu"), ("dapo_smollm2_cpu", "dapo_smollm2_cpu_2replicas")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    model, data = make_inputs(tmp_path_factory.mktemp("inputs"))
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'dapo-math-17k.parquet'}",
        f"data.val_files={data / 'aime-2024.parquet'}",
    ]


def resolved(recipe, name, inputs, *overrides):
    return recipe_config.load_recipe(recipe, name, [*inputs, *overrides])


def composed(recipe, name, inputs, *overrides):
    """Composed and resolved, without the checks (the CPU presets' checks need this machine's CPU plugin
    and model, which the fairness comparison does not)."""
    cfg = recipe_config.compose_recipe(recipe, name, [*inputs, *overrides])
    OmegaConf.resolve(cfg)
    return cfg


@pytest.mark.parametrize("recipe,name,threshold,k,seqs,tp,train,gen,nodes,strategy,store_bytes", PUBLISHED)
def test_published_setup(inputs, recipe, name, threshold, k, seqs, tp, train, gen, nodes, strategy, store_bytes):
    cfg = resolved(recipe, name, inputs)
    rollout = cfg.actor_rollout_ref.rollout
    vllm = OmegaConf.to_container(rollout.engine_kwargs.vllm)
    assert vllm["speculative_config"] == {
        "method": "custom_class",
        "model": "rollout.proposer.SamProposer",
        "num_speculative_tokens": k,
    }
    assert vllm["additional_config"]["sam_spec"]["threshold"] == threshold
    assert vllm["additional_config"]["sam_spec"]["group_aware"] is True
    assert vllm["additional_config"]["sam_spec"]["prompt_store"] is True  # on in the SAM arm, bounded per replica
    assert vllm["additional_config"]["sam_spec"]["prompt_store_bytes"] == store_bytes
    assert rollout.router_config_path == "configs/router/prompt_affinity.yaml"
    assert (rollout.max_num_seqs, rollout.tensor_model_parallel_size) == (seqs, tp)
    assert cfg.data.train_batch_size == train and cfg.data.get("gen_batch_size") is None
    assert cfg.algorithm.filter_groups.max_inflight_gen_batches == gen
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device) == (nodes, 16, "npu")
    assert cfg.actor_rollout_ref.actor.strategy == strategy
    assert rollout.enforce_eager is True


@pytest.mark.parametrize("recipe,name", [(p[0], p[1]) for p in PUBLISHED])
def test_standard_dapo_settings(inputs, recipe, name):
    cfg = resolved(recipe, name, inputs)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, cfg.algorithm.adv_estimator) == (True, "acc", "grpo")
    assert cfg.reward.reward_manager.name == "dapo"
    ob = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 4096, 1.0)
    assert cfg.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length
    assert (rollout.n, rollout.temperature, rollout.top_p, rollout.top_k) == (16, 1.0, 1.0, -1)
    assert rollout.max_model_len == cfg.data.max_prompt_length + cfg.data.max_response_length
    assert cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == "rollout.verl.hook.install"


def test_32b_published_response_length(inputs):
    assert resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs).data.max_response_length == 34816


def test_overrides_reach_the_engine_kwargs(inputs):
    cfg = resolved(
        "dapo_qwen3_32b",
        "dapo_qwen3_32b",
        inputs,
        "sam.threshold=4",
        "sam.num_speculative_tokens=4",
        "sam.group_aware=false",
    )
    vllm = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert vllm.speculative_config.num_speculative_tokens == 4
    assert vllm.additional_config.sam_spec.threshold == 4
    assert vllm.additional_config.sam_spec.group_aware is False
    from verl.utils.config import omega_conf_to_dataclass

    engine_kwargs = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).engine_kwargs["vllm"]
    assert engine_kwargs["additional_config"]["sam_spec"]["threshold"] == 4  # what the server reads


def flat(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


# what may differ between the arms: SAM itself (sam.*, and what the sam group derives from it: the engine
# kwargs and the router, configs/router/${sam.routing}.yaml), and the run's name (its log and checkpoints)
ARM_KEYS = (
    "sam.",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.",
    "actor_rollout_ref.rollout.router_config_path",
    "trainer.experiment_name",
    "actor_rollout_ref.rollout.trace.experiment_name",
    "trainer.default_local_dir",
)


@pytest.mark.parametrize("recipe,name", [(p[0], p[1]) for p in PUBLISHED] + CPU_PRESETS)
def test_baseline_differs_only_in_sam(inputs, recipe, name):
    sam = composed(recipe, name, inputs)
    base = composed(recipe, name, inputs, "sam=disabled")
    base_engine = OmegaConf.to_container(base.actor_rollout_ref.rollout.engine_kwargs.vllm)
    assert not {"speculative_config", "additional_config"} & set(base_engine)  # no SAM in the baseline's engine
    assert (sam.sam.routing, base.sam.routing) == ("prompt_affinity", "least_loaded")  # verl's default policy
    a, b = flat(OmegaConf.to_container(sam)), flat(OmegaConf.to_container(base))
    differing = {k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>")}
    assert differing and all(k.startswith(ARM_KEYS) for k in differing), sorted(differing)
    assert sam.trainer.experiment_name != base.trainer.experiment_name  # separate metric logs


def test_ab_seeds_are_shared_and_overridable(inputs):
    for arm in ("sam=enabled", "sam=disabled"):
        cfg = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, arm)
        assert (cfg.data.shuffle, cfg.data.seed, cfg.actor_rollout_ref.rollout.seed) == (True, 1, 1)
    cfg = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, "ab.seed=7")
    assert (cfg.data.seed, cfg.actor_rollout_ref.rollout.seed) == (7, 7)


@pytest.mark.parametrize(
    "override,message",
    [
        ("sam.threshold=-1", "threshold must be an integer >= 0"),
        ("sam.num_speculative_tokens=0", "num_speculative_tokens must be an integer >= 1"),
        ("sam.length_policy=wild", "length_policy"),
        ("sam.treshold=3", "invalid override"),
        ("sam=sometimes", "invalid override"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=7", "does not divide"),
        ("actor_rollout_ref.rollout.max_model_len=65536", "max_position_embeddings"),
        ("actor_rollout_ref.model.path=/nonexistent", "no config.json"),
        ("data.train_files=/nonexistent.parquet", "not found"),
        ("actor_rollout_ref.actor.clip_ratio_low=oops", "clip_ratio_low takes a number"),
        ("sam.group_aware=maybe", "group_aware takes a boolean"),
    ],
)
def test_invalid_overrides_fail_early(inputs, override, message):
    with pytest.raises(RecipeError, match=message):
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, override)


def test_training_command_is_verl_cores_trainer(inputs):
    cmd = launch.training_command("dapo_qwen3_32b", "dapo_qwen3_32b", ["sam.threshold=4"])
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert cmd[3] == f"--config-path={launch.recipe_dir('dapo_qwen3_32b')}" and cmd[-1] == "sam.threshold=4"
    dapo = launch.training_command("dapo_qwen3_32b", "dapo_qwen3_32b", [], trainer="dapo-recipe")
    assert dapo[1:3] == ["-m", "recipe.dapo.main_dapo"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("algorithm.filter_groups.max_num_gen_batches=10", "max_num_gen_batches=10 is ignored by verl's V1 trainer"),
        ("+data.gen_batch_size=96", "max_inflight_gen_batches=3 for about as many prompts"),
    ],
)
def test_settings_v1_would_ignore_fail_early(inputs, override, message):
    with pytest.raises(RecipeError, match=message):
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, override)
    # verl-recipe's main_dapo reads them: allowed there
    recipe_config.load_recipe("dapo_qwen3_32b", "dapo_qwen3_32b", [*inputs, override], trainer="dapo-recipe")


def router_yaml(tmp_path, text):
    path = tmp_path / "router.yaml"
    path.write_text(text)
    return f"actor_rollout_ref.rollout.router_config_path={path}"


@pytest.mark.parametrize(
    "text,message",
    [
        ("policy: prompt_affinity\n", "has no router_class"),
        ("router_class: rollout.verl.router.NoSuchBalancer\n", "cannot be loaded"),
        ("router_class: no_such_package.Balancer\n", "cannot be loaded"),
        ("router_class: rollout.verl.router.SamLoadBalancer\nload_bond: 2\n", "unknown key(s) ['load_bond']"),
        ("router_class: rollout.verl.router.SamLoadBalancer\npolicy: random\n", "policy must be one of"),
        ("router_class: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_router_config_fails_before_launch(inputs, tmp_path, text, message):
    with pytest.raises(RecipeError) as e:
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, router_yaml(tmp_path, text))
    assert message in str(e.value) and "router_config_path" in str(e.value)


def test_routing_is_chosen_by_sam_routing_and_checked(inputs):
    cfg = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, "sam.routing=least_loaded")
    assert cfg.actor_rollout_ref.rollout.router_config_path == "configs/router/least_loaded.yaml"
    with pytest.raises(RecipeError, match="not found"):
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, "sam.routing=round_robin")
    # the launcher hands verl an absolute path: its router loader resolves relative ones from the trainer's cwd
    (override,) = launch.absolute_path_overrides(cfg)
    assert (
        override
        == f"actor_rollout_ref.rollout.router_config_path={recipe_config.REPO}/configs/router/least_loaded.yaml"
    )
