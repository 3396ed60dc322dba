"""The device pack's pure parts (testkit/device_pack.py), that its shared data holds the step-cost anchors
the simulator reads, and its runner's syntax; the build itself needs the wheelhouse, so it is run by hand
(docs/usage.md, Offline install)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sam_rollout.wheelhouse import PROJECT, WheelhouseError
from testkit.device_pack import (
    CARRY_LIMIT,
    CARRY_PATHS,
    PRUNED,
    DevicePackError,
    HouseWheel,
    build,
    copy_shared_data,
    plan_calls,
    prune,
    read_house,
    select_wheels,
    split_parts,
    write_sha256,
)

REPO = Path(__file__).resolve().parents[1]


def test_selection_keeps_what_the_image_lacks_less_the_dropped():
    house = [
        HouseWheel("vllm", "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl"),
        HouseWheel("numba", "numba-0.65.0-cp312-cp312-manylinux_2_28_x86_64.whl"),  # image has 0.68.0
        HouseWheel("pyyaml", "pyyaml-6.0.3-cp312-cp312-manylinux_2_28_x86_64.whl"),  # image: bare name
        HouseWheel("flashinfer-python", "flashinfer_python-0.6.14-py3-none-any.whl"),
        HouseWheel("nvidia-cutlass-dsl-libs-cu13", "nvidia_cutlass_dsl_libs_cu13-4.6.0-cp312-cp312-x.whl"),
        HouseWheel(PROJECT, "sam_spec_rollout-0.1.0-py3-none-any.whl"),
        HouseWheel("xgrammar", "xgrammar-0.2.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ]
    frozen = {"numba", "PyYAML", "torch"}  # freeze names in any spelling; torch is not in the house
    assert [w.name for w in select_wheels(house, frozen)] == ["vllm", "xgrammar"]


def test_selection_takes_the_drop_list_it_is_given():
    house = [HouseWheel("flashinfer-python", "f.whl"), HouseWheel("vllm", "v.whl")]
    assert [w.name for w in select_wheels(house, set(), dropped=())] == ["flashinfer-python", "vllm"]


def test_prune_removes_the_named_paths_and_nothing_beside_them(tmp_path):
    site = tmp_path / "site"
    for item in PRUNED[1:]:  # the first left out: reported as absent
        path = site / item.path
        if "." in Path(item.path).name or item.path.endswith("vllm-rs"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
        else:
            (path / "include").mkdir(parents=True)
            (path / "include" / "a.hpp").write_text("x")
    kept = [site / "vllm" / "_C_stable_libtorch.abi3.so", site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so"]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"y")
    assert prune(site) == [PRUNED[0].path]
    assert not any((site / item.path).exists() for item in PRUNED)
    assert all(path.read_bytes() == b"y" for path in kept)
    assert (site / "vllm" / "third_party").is_dir()  # only the named folders below it went


def test_parts_reassemble_in_glob_order_and_pass_sha256sum(tmp_path):
    archive = tmp_path / "site.tar.xz"
    archive.write_bytes(os.urandom(2500))
    parts = split_parts(archive, tmp_path / "parts", 1000)
    assert [p.name for p in parts] == ["site.part00", "site.part01", "site.part02"]
    assert [p.stat().st_size for p in parts] == [1000, 1000, 500]
    write_sha256(archive, tmp_path / "site.sha256")
    # as the runner does: cat the sorted glob, then sha256sum -c where the archive lands
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "site.tar.xz").write_bytes(
        b"".join(p.read_bytes() for p in sorted((tmp_path / "parts").glob("site.part*")))
    )
    check = subprocess.run(["sha256sum", "-c", str(tmp_path / "site.sha256")], cwd=landing, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    (landing / "site.tar.xz").write_bytes(parts[1].read_bytes() + parts[0].read_bytes() + parts[2].read_bytes())
    assert subprocess.run(["sha256sum", "-c", "--status", str(tmp_path / "site.sha256")], cwd=landing).returncode != 0
    assert (tmp_path / "site.sha256").read_text().split()[0] == hashlib.sha256(archive.read_bytes()).hexdigest()


def test_split_refuses_more_than_two_digit_parts(tmp_path):
    archive = tmp_path / "a"
    archive.write_bytes(b"z" * 101)
    with pytest.raises(DevicePackError, match="100"):
        split_parts(archive, tmp_path / "parts", 1)


def _files(folder: Path, sizes: dict[str, int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(b"\0" * size)
    return [folder / name for name in sizes]


def test_carry_plan_one_part_a_call_extras_on_the_last(tmp_path):
    parts = _files(tmp_path / "pack" / "parts", {"site.part00": 300, "site.part01": 300, "site.part02": 100})
    extras = _files(tmp_path / "pack", {"run.sh": 10, "site.sha256": 5})
    shared = tmp_path / "pack" / "shared" / "data"
    _files(shared, {"a.csv": 7})
    extras.append(tmp_path / "pack" / "shared")
    calls = plan_calls(parts, extras, tmp_path, tree_bytes=0)
    assert [c.paths for c in calls] == [
        ("pack/parts/site.part00",),
        ("pack/parts/site.part01",),
        ("pack/parts/site.part02", "pack/run.sh", "pack/site.sha256", "pack/shared"),
    ]
    assert [c.carried_bytes for c in calls] == [300, 300, 100 + 10 + 5 + 7]


def test_carry_plan_refuses_a_call_over_the_limit(tmp_path):
    parts = _files(tmp_path / "parts", {"site.part00": 1000})
    assert plan_calls(parts, [], tmp_path, tree_bytes=CARRY_LIMIT - 1000)
    with pytest.raises(DevicePackError, match="smaller --part-mib"):
        plan_calls(parts, [], tmp_path, tree_bytes=CARRY_LIMIT - 999)
    extras = _files(tmp_path / "extras", {f"e{i}": 1 for i in range(CARRY_PATHS)})
    with pytest.raises(DevicePackError, match="paths"):
        plan_calls(parts, extras, tmp_path, tree_bytes=0)


def _house(folder: Path, python_version: str) -> Path:
    folder.mkdir()
    target = {"python_version": python_version, "platforms": ["manylinux_2_35_x86_64"]}
    (folder / "manifest.json").write_text(json.dumps({"target": target, "wheels": []}))
    return folder


def test_bad_input_is_named(tmp_path):
    freeze = REPO / "configs" / "wheelhouse" / "h200_cuda_image.txt"
    args = {"freeze": freeze, "python": sys.executable, "out": tmp_path / "out", "part_mib": 50}
    with pytest.raises(DevicePackError, match="no such folder"):
        build(house=tmp_path / "absent", **args)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DevicePackError, match="no manifest.json"):
        read_house(tmp_path / "empty")
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.10"
    with pytest.raises(WheelhouseError, match=f"target is Python {other}"):
        build(house=_house(tmp_path / "house", other), **args)
    with pytest.raises(WheelhouseError, match="cannot run"):
        build(house=tmp_path / "house", **{**args, "python": str(tmp_path / "python3.12")})


def test_runner_parses_and_refuses_to_run_outside_a_pack():
    script = REPO / "scripts" / "device_lease.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    result = subprocess.run(["bash", str(script), "stage"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and "run the pack's copy" in result.stderr


def test_shared_data_holds_what_the_checks_read(tmp_path, monkeypatch):
    from benchmarks.simulator import ANCHOR_CSV, MOE_ANCHOR_CSV
    from testkit.data import DAPO, shared_data_dir

    try:
        source = shared_data_dir()
    except FileNotFoundError:
        pytest.skip("no shared data beside the checkout")
    copy_shared_data(tmp_path)
    monkeypatch.setenv("SAM_SHARED_DIR", str(tmp_path))
    for name in (DAPO, ANCHOR_CSV, MOE_ANCHOR_CSV):
        assert (shared_data_dir() / name).read_bytes() == (source / name).read_bytes()
