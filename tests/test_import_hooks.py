"""sam_rollout.import_hooks.after_import: a patch runs once, right after its module's first import, or at once."""

from __future__ import annotations

import sys

from sam_rollout.import_hooks import after_import


def write_module(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))


def test_patch_runs_after_the_first_import(tmp_path):
    write_module(tmp_path, "sam_hook_probe_a")
    calls = []

    def patch():
        calls.append(sys.modules["sam_hook_probe_a"].VALUE)

    after_import("sam_hook_probe_a", patch)
    after_import("sam_hook_probe_a", patch)  # registered once
    assert calls == []
    import sam_hook_probe_a  # noqa: F401

    assert calls == [1]  # the module had run when the patch did
    import importlib

    importlib.reload(sys.modules["sam_hook_probe_a"])
    assert calls == [1]  # one shot


def test_patch_runs_at_once_when_already_imported(tmp_path):
    write_module(tmp_path, "sam_hook_probe_b")
    import sam_hook_probe_b  # noqa: F401

    calls = []
    after_import("sam_hook_probe_b", lambda: calls.append(True))
    assert calls == [True]
