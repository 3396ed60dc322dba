"""Run a patch right after a third-party module is first imported (or now, if it already is).

Plugins load before the modules they patch exist in a process (vLLM's general plugins, verl's
``verl.plugins``), and importing those modules early is either expensive or changes what they bind,
so patches wait for the import: a one-shot finder on ``sys.meta_path`` wraps the module's loader.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, module_name: str, patch: Callable[[], object]):
        self.module_name = module_name
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.patch()

        spec.loader.exec_module = exec_and_patch
        return spec


def after_import(module_name: str, patch: Callable[[], object]) -> None:
    """``patch()`` now if ``module_name`` is imported, else right after its first import (once per pair)."""
    if module_name in sys.modules:
        patch()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and (finder.module_name, finder.patch) == (module_name, patch):
            return
    sys.meta_path.insert(0, _AfterImport(module_name, patch))
