"""Drops numba's cached drafter kernels when any drafter source (or numba) has changed.

numba validates a cached kernel against its own file's mtime and size only, yet the kernel holds
compiled copies of what it calls from the other drafter modules (docs/vllm-hooks.md). So the drafter's
sources and numba's version are hashed into one digest, kept in a stamp file beside the cached kernels;
where the stamp differs, the drafter modules' cache files go and numba compiles afresh. The folder is
the one numba's own locators choose (NUMBA_CACHE_DIR, else the `__pycache__` beside the sources, else
numba's user-wide cache where that is not writable), asked for at the moment numba would ask.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import types
from collections.abc import Sequence
from pathlib import Path

import numba
from numba.core.caching import CompileResultCacheImpl

log = logging.getLogger(__name__)

DRAFTER_DIR = Path(__file__).resolve().parent
STAMP_NAME = "kernel-sources.sha256"  # beside the cache files; numba ignores it (not .nbi/.nbc)
CACHE_SUFFIXES = (".nbi", ".nbc")


def sources_digest(sources: Sequence[Path]) -> str:
    """One SHA-256 over numba's version and each source's name and bytes (in name order)."""
    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(sources, key=lambda p: p.name):
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _placeholder():
    pass


def numba_cache_dir(module_file: Path) -> Path | None:
    """Where numba caches the kernels of `module_file`, by numba's own locators; None where it has none."""
    function_in_module = types.FunctionType(_placeholder.__code__.replace(co_filename=str(module_file)), {})
    try:
        return Path(CompileResultCacheImpl(function_in_module).locator.get_cache_path())
    except RuntimeError:  # no locator: numba cannot cache these kernels either
        return None


def drop_stale_kernels(module_files: Sequence[Path], sources: Sequence[Path]) -> int:
    """Delete the numba cache files of `module_files` unless their folder's stamp matches the digest of
    `sources`, then write the stamp. Returns how many files went. A folder where the stamp cannot be
    written is logged and left alone (numba would not save kernels there either)."""
    digest = sources_digest(sources)
    folders: dict[Path, set[str]] = {}
    for path in module_files:
        folder = numba_cache_dir(path)
        if folder is not None:
            folders.setdefault(folder, set()).add(path.stem)
    removed = 0
    for folder, modules in folders.items():
        try:
            removed += _refresh_folder(folder, modules, digest)
        except OSError as error:
            log.warning("numba kernel cache %s left unchecked (%s): kernels may be stale", folder, error)
    return removed


def _refresh_folder(folder: Path, modules: set[str], digest: str) -> int:
    stamp = folder / STAMP_NAME
    # Processes starting together (engine workers) check and clear one at a time, so only the first
    # clears, before anyone saves new kernels.
    with open(folder / (STAMP_NAME + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest:
            return 0
        stale = [
            entry
            for entry in folder.iterdir()
            if entry.name.endswith(CACHE_SUFFIXES) and entry.name.split(".", 1)[0] in modules
        ]
        for entry in sorted(stale, key=lambda e: not e.name.endswith(".nbi")):  # indexes first
            entry.unlink(missing_ok=True)
        partial = folder / (STAMP_NAME + f".{os.getpid()}")
        partial.write_text(digest)
        partial.replace(stamp)
    if stale:
        log.info("dropped %d cached drafter kernel files in %s: the drafter's sources changed", len(stale), folder)
    return len(stale)


def drop_stale_drafter_kernels() -> int:
    """The guard for this package, run once from its `__init__` before any kernel module loads."""
    sources = sorted(DRAFTER_DIR.glob("*.py"))
    return drop_stale_kernels(sources, sources)
