"""sam_rollout/ascend/ngram_route.py against the real vllm-ascend source (parsed with ast; no NPU, no import).

Source: the vllm-ascend wheel matching vLLM 0.23 (the verl 0.9.1 Ascend stack). Located by
env SAM_VLLM_ASCEND_WHEEL (a .whl path), else fetched with
``pip download --no-deps vllm-ascend==0.23.0`` into a temporary dir; skipped if neither works.
The second half checks the SAM n-gram subclass against both propose() call forms with a fake runner.
"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import require

from sam_rollout.ascend import ngram_route

ASCEND_VERSION = "0.23.0"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    env = os.environ.get("SAM_VLLM_ASCEND_WHEEL")
    if env:
        return zipfile.ZipFile(env)
    d = tmp_path_factory.mktemp("ascend")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"vllm-ascend=={ASCEND_VERSION}", "-d", str(d)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    whls = list(d.glob("vllm_ascend-*.whl"))
    if r.returncode != 0 or not whls:
        require(False, f"could not fetch vllm-ascend=={ASCEND_VERSION}: {r.stderr.strip()[-300:]}")
    return zipfile.ZipFile(whls[0])


def tree(wheel, path) -> ast.Module:
    return ast.parse(wheel.read(path).decode())


def cls_def(mod: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(mod):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def methods(c: ast.ClassDef) -> dict[str, list[ast.FunctionDef]]:
    """Methods of the class body, including defs under class-level `if vllm_version_is(...)`
    (not closures inside methods)."""
    out: dict[str, list] = {}
    todo = list(c.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.FunctionDef):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.If):
            todo.extend(node.body + node.orelse)
    return out


def argnames(f: ast.FunctionDef) -> list[str]:
    return [a.arg for a in f.args.args]


def test_custom_class_is_not_dispatched(wheel):
    mod = tree(wheel, "vllm_ascend/spec_decode/__init__.py")
    src = ast.unparse(mod)
    assert "def get_spec_decode_method(method, vllm_config, device, runner)" in src
    assert "'custom_class'" not in src and '"custom_class"' not in src
    assert "if method == 'ngram':\n        return AscendNgramProposer(vllm_config, runner)" in src


def test_ngram_proposer_shape(wheel):
    c = cls_def(tree(wheel, "vllm_ascend/spec_decode/ngram_proposer.py"), "AscendNgramProposer")
    assert [ast.unparse(b) for b in c.bases] == ["NgramProposer"]
    m = methods(c)
    assert argnames(m["__init__"][0]) == ["self", "vllm_config", "runner"]
    assert "load_model" in m and "dummy_run" in m
    forms = sorted(argnames(f)[:3] for f in m["propose"])
    # 0.23 form (sampled first) and the newer form (K first) both exist, selected by vllm_version_is
    assert forms == [
        ["self", "num_speculative_tokens", "sampled_token_ids"],
        ["self", "sampled_token_ids", "num_tokens_no_spec"],
    ]


def test_runner_builds_drafter_in_get_drafter_and_dispatches_by_isinstance(wheel):
    mod = tree(wheel, "vllm_ascend/worker/model_runner_v1.py")
    c = cls_def(mod, "NPUModelRunner")
    assert [ast.unparse(b) for b in c.bases] == ["GPUModelRunner"]
    m = methods(c)
    (gd,) = m["_get_drafter"]
    assert argnames(gd) == ["self"]
    assert "get_spec_decode_method(self.speculative_config.method, self.vllm_config, self.device, self)" in ast.unparse(
        gd
    )
    # __init__ -> _set_up_drafter() -> self.drafter = self._get_drafter()
    assert "self._set_up_drafter()" in ast.unparse(m["__init__"][0])
    assert "self.drafter = self._get_drafter()" in ast.unparse(m["_set_up_drafter"][0])
    (pd,) = m["propose_draft_token_ids"]
    src = ast.unparse(pd)
    assert "isinstance(self.drafter, AscendNgramProposer)" in src
    assert "self.drafter.propose(valid_sampled_token_ids)" in src  # 0.23
    assert "self.drafter.propose(scheduler_output.num_spec_tokens_to_schedule, valid_sampled_token_ids" in src
    # finished requests: NPUModelRunner._update_states defers to vLLM's (patched by sam_rollout.vllm.runner_patch)
    (us,) = m["_update_states"]
    assert "super()._update_states(scheduler_output)" in ast.unparse(us)


def test_drafting_runs_after_bookkeeping(wheel):
    src = wheel.read("vllm_ascend/worker/model_runner_v1.py").decode()
    book = src.index("= self._bookkeeping_sync(")
    call = src.index("propose_draft_token_ids(valid_sampled_token_ids)")
    assert book < call, "token_ids_cpu / num_tokens_no_spec would be stale when SAM reads them"


def test_input_batch_fields(wheel):
    c = cls_def(tree(wheel, "vllm_ascend/worker/npu_input_batch.py"), "NPUInputBatch")
    src = ast.unparse(c)
    for field in (
        "self.token_ids_cpu =",
        "self.num_tokens_no_spec =",
        "self.num_prompt_tokens =",
        "self.spec_decode_unsupported_reqs",
    ):
        assert field in src, field
    assert [ast.unparse(b) for b in c.bases] == ["InputBatch"]  # req_ids comes from vLLM's InputBatch


def test_adapt_patch_runs_in_worker_init(wheel):
    c = cls_def(tree(wheel, "vllm_ascend/worker/worker.py"), "NPUWorker")
    assert "adapt_patch()" in ast.unparse(methods(c)["__init__"][0])


def _loops_outside(node: ast.AST, optional_branch: str) -> list[int]:
    """Lines of for/while loops and .item() calls in `node`, not counting the body of
    ``if <optional_branch>:`` (an opt-in mode, off by default)."""
    if isinstance(node, ast.If) and ast.unparse(node.test) == optional_branch:
        return [line for child in node.orelse for line in _loops_outside(child, optional_branch)]
    here = []
    if isinstance(node, (ast.For, ast.While)):
        here.append(node.lineno)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item":
        here.append(node.lineno)
    return here + [line for child in ast.iter_child_nodes(node) for line in _loops_outside(child, optional_branch)]


def test_rejection_helpers_need_no_patch(wheel):
    """The helpers that a removed patch vectorised on vllm-ascend up to 0.13.0rc1 (docs/patches.md,
    "Removed") have no per-token loop or host sync in their default path in the supported release."""
    functions = {
        f.name: f for f in tree(wheel, "vllm_ascend/sample/rejection_sampler.py").body if isinstance(f, ast.FunctionDef)
    }
    for name in ("expand_pytorch", "sample_recovered_tokens_pytorch", "rejection_random_sample_pytorch"):
        assert _loops_outside(functions[name], "enable_reduce_sampling") == [], name


def test_module_paths_used_by_the_ngram_route(wheel):
    names = set(wheel.namelist())
    for mod in (ngram_route.RUNNER_MODULE, ngram_route.NGRAM_MODULE):
        assert mod.replace(".", "/") + ".py" in names


# ---- the subclass itself, with a fake runner -------------------------------------------------


class _FakeNgram:
    def __init__(self, vllm_config, runner):  # must not be called by the SAM subclass
        raise AssertionError("base __init__ called")


class _NS:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _runner(rows, unsupported=()):
    W = 64
    ib = _NS(
        req_ids=[],
        token_ids_cpu=np.zeros((4, W), np.int32),
        num_tokens_no_spec=np.zeros(4, np.int32),
        num_prompt_tokens=np.zeros(4, np.int32),
        spec_decode_unsupported_reqs=set(unsupported),
    )
    for i, (rid, toks, npt) in enumerate(rows):
        ib.req_ids.append(rid)
        ib.token_ids_cpu[i, : len(toks)] = toks
        ib.num_tokens_no_spec[i] = len(toks)
        ib.num_prompt_tokens[i] = npt
    return _NS(input_batch=ib)


def _config(k=3, sam=None):
    return _NS(
        speculative_config=_NS(num_speculative_tokens=k, method="ngram"),
        model_config=_NS(max_model_len=64),
        additional_config={"sam_spec": sam if sam is not None else {"switch": None}},
    )


def test_sam_ngram_subclass_both_call_forms():
    cls = ngram_route.make_ngram_proposer_class(_FakeNgram)
    assert issubclass(cls, _FakeNgram)  # the runner's isinstance dispatch holds
    period = [5, 6, 7, 8, 9] * 3
    runner = _runner([("a", period, 5), ("b", [1, 2, 3], 3), ("u", period, 5)], unsupported={"u"})
    p = cls(_config(), runner)
    out = p.propose([[9], [], [9]])  # vllm-ascend 0.23 form
    assert out[0] == [5, 6, 7] and out[1] == [] and out[2] == []
    out = p.propose(2, [[9], [3], [9]], runner.input_batch.num_tokens_no_spec, runner.input_batch.token_ids_cpu)
    assert out[0] == [5, 6]  # K from the scheduler caps the draft
    p.on_request_finished("a")
    assert "a" not in p.stepper.drafter
    assert ngram_route.sam_requested(_config()) and not ngram_route.sam_requested(_NS(additional_config={}))


def test_sam_ngram_subclass_validates_settings():
    cls = ngram_route.make_ngram_proposer_class(_FakeNgram)
    with pytest.raises(ValueError, match="sam_spec.switch"):
        cls(_config(sam={"switch": -3}), _runner([]))


def test_sam_ngram_subclass_sets_up_as_the_vllm_routes_do(caplog, monkeypatch):
    """The shared set-up (sam_rollout.stepper.StepperAdapter): kernels compiled before serving, and
    the settings with the compile time in vLLM's log."""
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)  # vLLM's own config stops it
    cls = ngram_route.make_ngram_proposer_class(_FakeNgram)
    with caplog.at_level(logging.INFO, logger=ngram_route.logger.name):
        p = cls(_config(k=2), _runner([]))
    assert p.k == 2 and p.max_model_len == 64 and p.metrics is p.stepper.metrics
    assert "SAM n-gram route proposer: {'draft': {'k': 2" in caplog.text
    assert "kernels ready in" in caplog.text
