"""An offline wheelhouse: the wheels an air-gapped machine needs to run SAM with a given vLLM release.

Run on a machine with internet (scripts/wheelhouse.sh). Input: the target (Python version, platform tags,
vLLM version) and, optionally, what the target already has (its ``pip freeze``). Output: a folder with
exactly the wheels to carry (vLLM, the part of its dependency closure the target lacks, this project's
wheel), ``manifest.json`` (name, version, file, sha256, size of each) and the ``pip install --no-index``
commands to run on the target.

How the closure is found: pip's resolver runs in dry-run mode for the target's tags, in an interpreter of
the target's Python version (pip evaluates environment markers such as ``python_version > "3.11"`` on
the interpreter that runs it, not on ``--python-version``), with an empty environment in which every
package of the freeze list with a known version is installed as metadata only. pip keeps an installed
package that satisfies a requirement, so what it plans to install is what the target lacks. A planned
install of a package the target has at a known version means the target's version does not fit: that is
a conflict, an error unless ``--replace NAME`` accepts replacing it. A freeze line without a version
(this module's extension of the format: "present, version unknown") is not installed in that
environment, so its wheel is carried; on the target pip keeps the installed one if it fits.

This project's wheel is built with ``--no-deps`` and installed with ``--no-deps`` (as docker/ does): its
own pins (numpy, numba) are those of the CPU test environment, and the drafter needs only numpy and
numba, which vLLM requires anyway.

Caches, under ``~/.cache/sam-spec-rollout/wheelhouse`` (override: SAM_WHEELHOUSE_CACHE): the pinned pip
that resolves, one resolution per (target, requirements, freeze list, pip), and one pool of wheels by
file name (a wheel's name carries its version and tags), each checked against the index's sha256. A
second run with the same input reaches no network, and gives the same wheels even after new releases
(delete the cache to resolve afresh).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "sam-spec-rollout"
DEFAULT_VLLM = "0.26.0"
DEFAULT_PLATFORM = "manylinux_2_35_x86_64"
# the pip that resolves and downloads: >= 25 resolves for other tags in dry-run mode without --target
# (with --target pip ignores what is installed, which is how the freeze list is told to it)
PIP_VERSION = "26.3"
# --verl: verl 0.9.1's declared requirements (its install_requires, not its [vllm] extra, which pins
# vLLM 0.24), plus what docker/Dockerfile.cuda adds for its rollout server; not a measured import closure
VERL_REQUIREMENTS = (
    "verl==0.9.1",
    "cachetools==8.0.2",
    "fastapi==0.136.3",
    "uvicorn==0.54.0",
    "transferqueue==0.1.11",
)

NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
VERSION = re.compile(r"^[0-9][A-Za-z0-9.!+_-]*$")
MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(x86_64|aarch64)$")
LEGACY = re.compile(r"^(manylinux2014|manylinux2010|manylinux1)_(x86_64|aarch64)$")
LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


class WheelhouseError(Exception):
    """Bad input or a resolution that cannot be carried out; the message says which and why."""


class ConflictError(WheelhouseError):
    """The target has a package at a version that the closure cannot use."""

    def __init__(self, conflicts: list[Conflict]):
        self.conflicts = conflicts
        lines = [f"  {c.describe()}" for c in conflicts]
        names = " ".join(f"--replace {c.name}" for c in conflicts)
        super().__init__(
            "the target's packages conflict with the closure (pip on the target would replace them):\n"
            + "\n".join(lines)
            + f"\nTo carry the replacements and let pip replace them on the target, pass {names}; check first"
            " that nothing else on the target needs the old version."
        )


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the target -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    python_version: str  # "3.12"
    platforms: tuple[str, ...]  # as given: "manylinux_2_35_x86_64"

    @classmethod
    def parse(cls, python_version: str, platforms: list[str]) -> Target:
        match = re.fullmatch(r"3\.(\d{1,2})(\.\d+)?", python_version.strip())
        if not match:
            raise WheelhouseError(f"python version {python_version!r}: expected the form 3.12 (or 3.12.3)")
        if not platforms:
            raise WheelhouseError("no platform tag given (for example manylinux_2_35_x86_64)")
        for tag in platforms:
            if not (MANYLINUX.match(tag) or LEGACY.match(tag)):
                raise WheelhouseError(
                    f"platform tag {tag!r}: expected a manylinux tag such as manylinux_2_35_x86_64 or"
                    " manylinux2014_x86_64"
                )
        if len({_glibc_arch(tag)[1] for tag in platforms}) > 1:
            raise WheelhouseError(f"platform tags {platforms}: one machine type only")
        return cls(python_version=f"3.{match.group(1)}", platforms=tuple(platforms))

    @property
    def abi(self) -> str:
        return "cp" + self.python_version.replace(".", "")

    @property
    def arch(self) -> str:
        return _glibc_arch(self.platforms[0])[1]

    def expanded_platforms(self) -> list[str]:
        """Every tag a wheel for these platforms may carry: pip takes --platform literally, so
        manylinux_2_35_x86_64 must also name 2_34 ... 2_5 and the legacy aliases, as an installer on a
        glibc 2.35 machine accepts them."""
        out = []
        for tag in self.platforms:
            glibc, arch = _glibc_arch(tag)
            out += [f"manylinux_2_{m}_{arch}" for m in range(glibc, 4, -1)]
            out += [f"{legacy}_{arch}" for legacy, m in LEGACY_MANYLINUX.items() if m <= glibc]
        return list(dict.fromkeys(out)) + ["any"]

    def pip_flags(self) -> list[str]:
        flags = ["--only-binary", ":all:", "--python-version", self.python_version, "--implementation", "cp"]
        for abi in (self.abi, "abi3", "none"):
            flags += ["--abi", abi]
        for tag in self.expanded_platforms():
            flags += ["--platform", tag]
        return flags


def _glibc_arch(tag: str) -> tuple[int, str]:
    """manylinux_2_35_x86_64 -> (35, "x86_64"); manylinux2014_x86_64 -> (17, "x86_64")."""
    match = MANYLINUX.match(tag)
    if match:
        return int(match.group(1)), match.group(2)
    legacy, arch = LEGACY.match(tag).groups()
    return LEGACY_MANYLINUX[legacy], arch


# -- the freeze list --------------------------------------------------------------------------------------
def parse_freeze(text: str, source: str = "freeze list") -> dict[str, str | None]:
    """``pip freeze`` lines: name==version, or name @ URL and -e ...#egg=name (version unknown); a bare
    name means "present, version unknown". Comments and blank lines are skipped; anything else is an
    error naming the line."""
    found: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        name, version = _freeze_line(line)
        if name is None or not NAME.match(name) or (version is not None and not VERSION.match(version)):
            raise WheelhouseError(f"{source}:{number}: not a pip freeze line (name==version or a bare name): {raw!r}")
        key = normalize(name)
        if key in found and found[key] != version:
            raise WheelhouseError(f"{source}:{number}: {name} is listed twice ({found[key]} and {version})")
        found[key] = version
    return found


def _freeze_line(line: str) -> tuple[str | None, str | None]:
    if line.startswith(("-e ", "--editable ")):
        egg = re.search(r"#egg=([A-Za-z0-9._-]+)", line)
        return (egg.group(1) if egg else None), None
    if " @ " in line:
        return line.split(" @ ", 1)[0].strip(), None
    if "==" in line:
        name, _, version = line.partition("===" if "===" in line else "==")
        return name.strip(), version.strip()
    return (line if NAME.match(line) else None), None


# -- pip --------------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    default = Path.home() / ".cache" / "sam-spec-rollout" / "wheelhouse"
    return Path(os.environ.get("SAM_WHEELHOUSE_CACHE", default))


def pinned_pip(cache: Path) -> Path:
    """The pip wheel that resolves (pip runs from its own wheel: ``python pip.whl/pip``)."""
    wheel = cache / "pip" / f"pip-{PIP_VERSION}-py3-none-any.whl"
    if not wheel.exists():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        run_command(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
            + [f"pip=={PIP_VERSION}", "-d", str(wheel.parent)],
            f"downloading pip {PIP_VERSION}",
        )
    return wheel


def run_command(command: list[str], what: str, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if not line.startswith("WARNING: Location")]
        raise WheelhouseError(f"{what} failed:\n" + "\n".join(errors[-25:]))
    return result


def check_interpreter(python: str, target: Target) -> None:
    """pip evaluates markers on the interpreter that runs it: it must be the target's version, on the
    target's operating system and machine."""
    probe = "import platform, sys; v = sys.version_info; print(f'{v[0]}.{v[1]} {sys.platform} {platform.machine()}')"
    try:
        result = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    except OSError as e:
        raise WheelhouseError(f"interpreter {python!r} cannot run: {e}") from e
    if result.returncode != 0:
        raise WheelhouseError(f"interpreter {python!r} cannot run: {result.stderr.strip()[-300:]}")
    version, system, machine = result.stdout.split()
    wanted = (target.python_version, "linux", target.arch)
    if (version, system, machine) != wanted:
        raise WheelhouseError(
            f"interpreter {python} is Python {version} on {system} {machine}; the target is Python"
            f" {target.python_version} on linux {target.arch}. pip evaluates environment markers on the"
            f" interpreter that runs it: pass --python with a python{target.python_version} for that machine type"
        )


# -- resolution -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Planned:
    """One wheel pip plans to install for the target."""

    name: str
    version: str
    url: str
    sha256: str
    requires: tuple[str, ...]

    @property
    def file(self) -> str:
        return urllib.parse.unquote(self.url.rsplit("/", 1)[-1].split("#", 1)[0])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conflict:
    name: str
    target_version: str
    wheelhouse_version: str
    required_by: tuple[str, ...]  # "vllm 0.26.0: numba==0.65.0"

    def describe(self) -> str:
        why = "; ".join(self.required_by) or "a requirement of the closure"
        return f"{self.name}: target has {self.target_version}, the closure needs {self.wheelhouse_version} ({why})"


def write_installed_metadata(site: Path, frozen: dict[str, str | None]) -> None:
    """Each package of known version, installed as metadata only (no code, no requirements)."""
    for name, version in frozen.items():
        if version is None:
            continue
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("wheelhouse\n")


def resolve(
    *, target: Target, requirements: list[str], frozen: dict[str, str | None], python: str, cache: Path
) -> list[Planned]:
    """What pip installs on the target for ``requirements`` (cached per input)."""
    pip = pinned_pip(cache)
    key_input = {"target": dataclasses.asdict(target), "requirements": requirements, "frozen": frozen}
    key_input["pip"] = PIP_VERSION
    key = hashlib.sha256(json.dumps(key_input, sort_keys=True).encode()).hexdigest()[:20]
    cached = cache / "resolutions" / f"{key}.json"
    if not cached.exists():
        check_interpreter(python, target)
        with tempfile.TemporaryDirectory(prefix="wheelhouse-env-") as site:
            write_installed_metadata(Path(site), frozen)
            report = Path(site) / "report.json"
            # -S: no site-packages, so the installed packages pip sees are the metadata above and nothing else
            command = [python, "-S", str(pip / "pip"), "install", "--dry-run", "--report", str(report), "-q"]
            env = dict(os.environ, PYTHONPATH=site)
            result = subprocess.run(
                command + target.pip_flags() + requirements, capture_output=True, text=True, env=env
            )
            if result.returncode != 0:
                raise WheelhouseError(_resolution_failure(result.stderr, requirements, target))
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(report, cached)
    return [_planned(item) for item in json.loads(cached.read_text())["install"]]


def _resolution_failure(stderr: str, requirements: list[str], target: Target) -> str:
    missing = re.search(r"No matching distribution found for (\S+)", stderr)
    where = f"Python {target.python_version} on {', '.join(target.platforms)}"
    if missing and missing.group(1) in requirements:
        return f"{missing.group(1)} is not on the index for {where} (no such release, or no wheel for these tags)"
    errors = [line for line in stderr.splitlines() if not line.startswith("WARNING: Location")]
    return f"pip could not resolve {' '.join(requirements)} for {where}:\n" + "\n".join(errors[-25:])


def _planned(item: dict) -> Planned:
    info = item["download_info"]
    sha = (
        info.get("archive_info", {}).get("hashes", {}).get("sha256")
        or info.get("archive_info", {}).get("hash", "=").partition("=")[2]
    )
    meta = item["metadata"]
    return Planned(
        name=normalize(meta["name"]),
        version=meta["version"],
        url=info["url"],
        sha256=sha,
        requires=tuple(meta.get("requires_dist", ())),
    )


def find_conflicts(planned: list[Planned], frozen: dict[str, str | None], target: Target) -> list[Conflict]:
    """Planned wheels the target has at a known version: pip would replace them, because a requirement
    in the closure excludes the target's version (those requirements are named)."""
    conflicts = []
    for wheel in planned:
        target_version = frozen.get(wheel.name)
        if target_version is None:
            continue
        required_by = tuple(
            f"{other.name} {other.version}: {req}"
            for other in planned
            for req in other.requires
            if _excludes(req, wheel.name, target_version, target)
        )
        conflicts.append(
            Conflict(
                name=wheel.name,
                target_version=target_version,
                wheelhouse_version=wheel.version,
                required_by=required_by,
            )
        )
    return conflicts


def _excludes(requirement: str, name: str, version: str, target: Target) -> bool:
    """Whether ``requirement`` (a Requires-Dist line) applies on the target, names ``name`` and rejects
    ``version``."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy: present wherever pip is
        from pip._vendor.packaging.requirements import Requirement
    parsed = Requirement(requirement)
    if normalize(parsed.name) != name:
        return False
    environment = {
        "python_version": target.python_version,
        "python_full_version": f"{target.python_version}.0",
        "platform_machine": target.arch,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    if parsed.marker is not None and not parsed.marker.evaluate(environment):
        return False
    return not parsed.specifier.contains(version, prereleases=True)


# -- download and assembly --------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheels(planned: list[Planned], *, target: Target, cache: Path) -> dict[str, Path]:
    """Every planned wheel in the pool (downloaded once, by file name), checked against its sha256."""
    pool = cache / "wheels"
    pool.mkdir(parents=True, exist_ok=True)
    missing = [w for w in planned if not (pool / w.file).exists()]
    if missing:
        with tempfile.TemporaryDirectory(prefix="wheelhouse-dl-", dir=pool) as tmp:
            command = [sys.executable, str(pinned_pip(cache) / "pip"), "download", "-q", "--no-deps", "-d", tmp]
            pins = [f"{w.name}=={w.version}" for w in missing]
            run_command(command + target.pip_flags() + pins, "downloading wheels")
            for w in missing:
                got = Path(tmp) / w.file
                if not got.exists():
                    raise WheelhouseError(f"pip download did not produce {w.file} (from {w.url})")
                got.replace(pool / w.file)
    paths = {}
    for w in planned:
        path = pool / w.file
        if w.sha256 and sha256_of(path) != w.sha256:
            path.unlink()
            raise WheelhouseError(f"{w.file}: sha256 differs from the index's; removed from the cache, run again")
        paths[w.name] = path
    return paths


def build_project_wheel(out: Path) -> Path:
    """This project's wheel, without its dependencies; built with this interpreter's setuptools where it
    reads the project's license field (>= 77), so that no build environment is downloaded each time."""
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)]
    if _setuptools_major() >= 77:
        command.insert(4, "--no-build-isolation")
    run_command(command, "building this project's wheel")
    (wheel,) = out.glob("sam_spec_rollout-*.whl")
    return wheel


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wheelhouse:
    out: Path
    manifest: dict

    @property
    def install_commands(self) -> list[str]:
        return self.manifest["install"]

    @property
    def total_bytes(self) -> int:
        return sum(w["size"] for w in self.manifest["wheels"])


def build(
    *,
    target: Target,
    vllm_version: str = DEFAULT_VLLM,
    frozen: dict[str, str | None] | None = None,
    verl: bool = False,
    replace: tuple[str, ...] = (),
    out: Path,
    python: str | None = None,
    cache: Path | None = None,
) -> Wheelhouse:
    if not VERSION.match(vllm_version):
        raise WheelhouseError(f"vLLM version {vllm_version!r} is not a version (for example 0.26.0)")
    _check_out(out)
    frozen = dict(frozen or {})
    cache = cache or cache_dir()
    python = python or f"python{target.python_version}"
    requirements = [f"vllm=={vllm_version}"] + (list(VERL_REQUIREMENTS) if verl else [])
    planned = resolve(target=target, requirements=requirements, frozen=frozen, python=python, cache=cache)
    replace = {normalize(name) for name in replace}
    conflicts = find_conflicts(planned, frozen, target)
    refused = [c for c in conflicts if c.name not in replace]
    if refused:
        raise ConflictError(refused)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))  # renamed to out when complete
    try:
        manifest = _assemble(work, planned, frozen, conflicts, requirements, target, vllm_version, replace, cache)
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Wheelhouse(out=out, manifest=manifest)


def _assemble(work, planned, frozen, conflicts, requirements, target, vllm_version, replace, cache) -> dict:
    paths = fetch_wheels(planned, target=target, cache=cache)
    wheels = []
    for w in planned:
        _link_or_copy(paths[w.name], work / w.file)
        wheels.append(_entry(work / w.file, name=w.name, version=w.version, role=_role(w, frozen, conflicts)))
    project = build_project_wheel(work)
    wheels.append(_entry(project, name=PROJECT, version=project.name.split("-")[1], role="project"))
    manifest = {
        "target": {"python_version": target.python_version, "platforms": list(target.platforms)},
        "vllm": vllm_version,
        "requirements": requirements,
        "replaced": {c.name: {"target": c.target_version, "wheelhouse": c.wheelhouse_version} for c in conflicts},
        "kept_from_target": sorted(n for n, v in frozen.items() if v is not None and n not in replace),
        "wheels": sorted(wheels, key=lambda w: w["name"]),
        "install": install_commands(requirements, project.name),
    }
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _role(wheel: Planned, frozen: dict[str, str | None], conflicts: list[Conflict]) -> str:
    if any(c.name == wheel.name for c in conflicts):
        return "replaces the target's"
    if wheel.name in frozen:
        return "target's version unknown"
    return "closure"


def _entry(path: Path, *, name: str, version: str, role: str) -> dict:
    size = path.stat().st_size
    return {"name": name, "version": version, "file": path.name, "sha256": sha256_of(path), "size": size, "role": role}


def _check_out(out: Path) -> None:
    """The output is new, empty, or a wheelhouse this tool wrote before (then it is replaced whole)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").exists())):
        raise WheelhouseError(f"{out} exists and is not a wheelhouse (no manifest.json): choose an empty folder")


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def install_commands(requirements: list[str], project_wheel: str) -> list[str]:
    """What to run on the target, in the copied folder (the paths are relative: the folder moves)."""
    requirements_text = " ".join(shlex.quote(r) for r in requirements)
    return [
        f"python3 -m pip install --no-index --find-links . {requirements_text}",
        f"python3 -m pip install --no-index --no-deps ./{project_wheel}",
    ]


# -- command line -----------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wheelhouse",
        description="Collect the wheels an offline machine needs to run SAM with vLLM: vLLM, the part of its"
        " dependency closure the target lacks (resolved for the target's Python and platform), and this"
        " project's wheel, plus manifest.json and the pip install --no-index commands for the target.",
    )
    p.add_argument("--out", required=True, type=Path, help="folder to write (empty, or a previous wheelhouse)")
    p.add_argument("--python-version", required=True, help="the target's Python, e.g. 3.12")
    p.add_argument(
        "--platform",
        action="append",
        default=None,
        help=f"the target's platform tag (repeatable; default {DEFAULT_PLATFORM}); manylinux_2_N accepts"
        " wheels for any glibc up to 2.N",
    )
    p.add_argument("--vllm", default=DEFAULT_VLLM, help=f"vLLM release (default {DEFAULT_VLLM})")
    p.add_argument(
        "--freeze",
        type=Path,
        help="the target's `pip freeze`: packages it has are not carried (a bare name: present, version"
        " unknown, so it is carried); configs/wheelhouse/h200_cuda_image.txt is the lent H200's",
    )
    p.add_argument(
        "--verl",
        action="store_true",
        help="also verl 0.9.1 for its rollout server: verl's DECLARED requirements (not a measured import"
        " closure, so more than the server imports: wandb, datasets, tensorboard, ...) plus what"
        " docker/Dockerfile.cuda adds (cachetools, fastapi, uvicorn, transferqueue)",
    )
    p.add_argument(
        "--replace",
        action="append",
        default=[],
        metavar="NAME",
        help="carry NAME although the target has another version that the closure cannot use (pip on the"
        " target replaces it); without it such a conflict is an error",
    )
    p.add_argument("--python", help="interpreter of the target's Python version to resolve with (default pythonX.Y)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        target = Target.parse(args.python_version, args.platform or [DEFAULT_PLATFORM])
        frozen = parse_freeze(_read(args.freeze), str(args.freeze)) if args.freeze else {}
        house = build(
            target=target,
            vllm_version=args.vllm,
            frozen=frozen,
            verl=args.verl,
            replace=tuple(args.replace),
            out=args.out,
            python=args.python,
        )
    except WheelhouseError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 2
    print(summary(house))
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise WheelhouseError(f"cannot read the freeze list: {e}") from e


def summary(house: Wheelhouse) -> str:
    m = house.manifest
    lines = [f"{house.out}: {len(m['wheels'])} wheels, {house.total_bytes / 1e6:.0f} MB (manifest.json)"]
    for name, versions in m["replaced"].items():
        lines.append(f"  replaces on the target: {name} {versions['target']} -> {versions['wheelhouse']}")
    unknown = [w["name"] for w in m["wheels"] if w["role"] == "target's version unknown"]
    if unknown:
        lines.append(f"  carried, the target's version being unknown (pip keeps the target's if it fits): {unknown}")
    lines.append("On the target, in the copied folder:")
    lines += [f"  {command}" for command in m["install"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
