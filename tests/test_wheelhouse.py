"""The offline wheelhouse (sam_rollout/wheelhouse.py, scripts/wheelhouse.sh), built here as a user would on a
machine with internet, then installed with ``pip install --no-index`` as on the offline target.

- The lent H200 (configs/wheelhouse/h200_cuda_image.txt; Python 3.12, manylinux_2_35 x86_64), vLLM 0.26.0:
  its numba 0.68 and numpy 2.5.2 conflict with vLLM's pins (an error naming them), and with
  ``--replace numba --replace numpy`` the wheelhouse is exactly the closure less what the image has. The
  manifest's commands install it into a Python 3.12 environment that holds the image's packages as
  metadata only (so pip keeps them, as on the image), and SAM's drafter and the numba and numpy that
  replace the image's then import and run there. vLLM itself cannot be imported on 3.12 here: the
  image's torch is not in the wheelhouse, and no torch for Python 3.12 is on this machine.
- vLLM 0.26.0 imported: the same build for Python 3.11 (vLLM's wheel is abi3, so it is the same file),
  against a list that names torch 2.11.0, torchvision 0.26.0 and torchaudio 2.11.0 as present; its
  closure is installed by the manifest's commands, and this machine's torch 2.13.0 (CPU) is then laid
  under it. ``from vllm import LLM`` and vLLM's own plugin loader, which finds the project wheel's entry
  point and runs SAM's ``register`` (the custom_class route), then run on vLLM 0.26.0 and the carried
  wheels. One carried wheel is kept from importing: torchcodec, whose native library links CUDA 13
  (libnvrtc.so.13, libtorch_cuda.so) and so loads only beside a CUDA torch; vLLM treats it as optional
  (an ImportError leaves a placeholder). What this does not show: that vLLM's CUDA kernels and torchcodec
  load against torch 2.11.0+cu130 (only the H200 can), nor that the Python 3.12 builds import beyond the
  drafter's.

Downloads are cached in ~/.cache/sam-spec-rollout/wheelhouse (pip, resolutions, wheels by file name): a
second run reaches no network. Cold, the run downloads about 1.9 GB (227 wheels for both Pythons).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from sam_rollout import wheelhouse as wh

REPO = Path(__file__).resolve().parents[1]
H200_FREEZE = REPO / "configs" / "wheelhouse" / "h200_cuda_image.txt"
VLLM = "0.26.0"
PLATFORM = "manylinux_2_35_x86_64"
# this machine's torch (CPU build) and the packages only torch needs, laid under the Python 3.11 install
TORCH_VIEW = ("torch", "torchgen", "functorch", "sympy", "mpmath", "networkx")


def interpreter(version: str) -> str | None:
    """A python<version> that runs: on PATH, or pyenv's."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}")))
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if probe.returncode == 0 and probe.stdout.decode().strip() == str(tuple(map(int, version.split(".")))):
            return candidate
    return None


def offline_env() -> dict:
    """pip with no configuration and no index: what the target has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")


def target_environment(root: Path, python: str, frozen: dict[str, str | None]) -> Path:
    """A virtual environment standing for the target: the freeze list's packages as metadata (with a
    RECORD, so that pip can replace them), pip from the interpreter's own bundle."""
    subprocess.run([python, "-m", "venv", str(root)], check=True, capture_output=True)
    (site,) = root.glob("lib/python3.*/site-packages")
    wh.write_installed_metadata(site, frozen)
    for info in site.glob("*.dist-info"):
        if (info / "INSTALLER").read_text() == "wheelhouse\n":
            files = [f"{info.name}/{name}," for name in ("METADATA", "INSTALLER", "RECORD")]
            (info / "RECORD").write_text("\n".join(files) + "\n")
    return root / "bin" / "python"


def install(house: wh.Wheelhouse, python: Path) -> None:
    """The manifest's commands, run as printed, in the copied folder, with the target's python3."""
    env = dict(offline_env(), PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}")
    for command in house.install_commands:
        assert command.startswith("python3 -m pip install --no-index ")
        result = subprocess.run(command, shell=True, cwd=house.out, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"


def installed(python: Path) -> dict[str, str]:
    code = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return {wh.normalize(k): v for k, v in json.loads(out).items()}


# -- input checks (no network) ----------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["3", "3.x", "12", "python3.12", "3.12.1.4"])
def test_a_python_version_that_is_not_one_is_refused(version):
    with pytest.raises(wh.WheelhouseError, match="expected the form 3.12"):
        wh.Target.parse(version, [PLATFORM])


@pytest.mark.parametrize("tag", ["linux_x86_64", "manylinux_2_35", "win_amd64", "manylinux2014_i686"])
def test_a_platform_tag_that_is_not_manylinux_is_refused(tag):
    with pytest.raises(wh.WheelhouseError, match="expected a manylinux tag"):
        wh.Target.parse("3.12", [tag])


def test_platform_tags_cover_older_glibc_and_legacy_aliases():
    tags = wh.Target.parse("3.12.3", [PLATFORM]).expanded_platforms()
    assert tags[0] == PLATFORM and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags and tags[-1] == "any"


@pytest.mark.parametrize(
    "line, number",
    [("torch>=2.10", 2), ("torch==", 2), ("==2.11.0", 2), ("-e ./local", 2), ("torch==2.11.0 extra words", 2)],
)
def test_a_malformed_freeze_list_names_the_line(line, number):
    with pytest.raises(wh.WheelhouseError, match=f"freeze.txt:{number}: not a pip freeze line"):
        wh.parse_freeze(f"numpy==2.5.2\n{line}\n", "freeze.txt")


def test_freeze_list_forms():
    text = "# comment\nTorch==2.11.0+cu130\nnumba\nfoo @ file:///w/foo.whl\n-e git+https://x/y.git#egg=Bar_Baz\n\n"
    assert wh.parse_freeze(text) == {"torch": "2.11.0+cu130", "numba": None, "foo": None, "bar-baz": None}
    with pytest.raises(wh.WheelhouseError, match="listed twice"):
        wh.parse_freeze("numpy==2.5.2\nnumpy==2.4.0\n")


def test_the_h200_list_parses_with_the_versions_read_off_the_machine():
    frozen = wh.parse_freeze(H200_FREEZE.read_text(), str(H200_FREEZE))
    assert frozen["torch"] == "2.11.0+cu130" and frozen["triton"] == "3.6.0" and frozen["numpy"] == "2.5.2"
    assert frozen["transformers"] == "5.17.0" and frozen["numba"] == "0.68.0" and frozen["scipy"] is None


def test_an_interpreter_of_another_python_is_refused():
    target = wh.Target.parse("3.12", [PLATFORM])
    with pytest.raises(wh.WheelhouseError, match="pip evaluates environment markers"):
        wh.check_interpreter(sys.executable, target)  # the test interpreter is 3.11


def test_a_folder_that_is_not_a_wheelhouse_is_not_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(wh.WheelhouseError, match="is not a wheelhouse"):
        wh.build(target=wh.Target.parse("3.11", [PLATFORM]), out=tmp_path, python=sys.executable)
    assert (tmp_path / "notes.txt").read_text() == "mine"


# -- the index (network on a cold cache) ------------------------------------------------------------------
def test_a_vllm_release_not_on_the_index_is_a_clear_error(tmp_path):
    target = wh.Target.parse("3.11", [PLATFORM])
    with pytest.raises(wh.WheelhouseError, match=r"vllm==0\.0\.999 is not on the index for Python 3\.11"):
        wh.build(target=target, vllm_version="0.0.999", out=tmp_path / "house", python=sys.executable)
    assert not (tmp_path / "house").exists()


@pytest.fixture(scope="module")
def python312() -> str:
    python = interpreter("3.12")
    if python is None:  # a property of the machine, like a GPU: skipped even under SAM_STRICT=1
        pytest.skip("no Python 3.12 interpreter (python3.12 on PATH or pyenv's) to install the H200's closure into")
    return python


@pytest.fixture(scope="module")
def h200_frozen() -> dict[str, str | None]:
    return wh.parse_freeze(H200_FREEZE.read_text(), str(H200_FREEZE))


@pytest.fixture(scope="module")
def h200_house(tmp_path_factory, python312, h200_frozen) -> wh.Wheelhouse:
    target = wh.Target.parse("3.12", [PLATFORM])
    out = tmp_path_factory.mktemp("h200") / "house"
    with pytest.raises(wh.ConflictError) as refused:
        wh.build(target=target, vllm_version=VLLM, frozen=h200_frozen, out=out, python=python312)
    conflicts = {c.name: c for c in refused.value.conflicts}
    assert set(conflicts) == {"numba", "numpy"}, refused.value
    assert conflicts["numba"].required_by == ("vllm 0.26.0: numba==0.65.0",)
    assert conflicts["numba"].target_version == "0.68.0" and conflicts["numba"].wheelhouse_version == "0.65.0"
    assert any(r.startswith("numba 0.65.0: numpy<2.5") for r in conflicts["numpy"].required_by)
    assert "--replace numba --replace numpy" in str(refused.value) and not out.exists()
    return wh.build(
        target=target, vllm_version=VLLM, frozen=h200_frozen, out=out, python=python312, replace=("numba", "numpy")
    )


def test_h200_wheelhouse_is_the_closure_less_what_the_image_has(h200_house, h200_frozen):
    manifest = json.loads((h200_house.out / "manifest.json").read_text())
    wheels = {w["name"]: w for w in manifest["wheels"]}
    assert wheels["vllm"]["version"] == VLLM and wheels["vllm"]["file"].endswith("-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert wheels["sam-spec-rollout"]["role"] == "project"
    assert wheels["numba"]["version"] == "0.65.0" and wheels["numba"]["role"] == "replaces the target's"
    # the image's packages of known version stay on the image, unless replaced
    carried_known = {n for n in wheels if h200_frozen.get(n) is not None}
    assert carried_known == {"numba", "numpy"}
    assert not {"torch", "triton", "transformers", "tokenizers", "torchvision"} & set(wheels)
    # a wheel of a tag the target cannot use would not install there: cp312, abi3 or pure, manylinux <= 2.35
    for w in manifest["wheels"]:
        assert any(t in w["file"] for t in ("-cp312-", "-abi3-", "-none-")), w["file"]
    # the folder is the manifest: same files, sizes and hashes
    files = {p.name for p in h200_house.out.iterdir()} - {"manifest.json"}
    assert files == {w["file"] for w in manifest["wheels"]}
    for w in manifest["wheels"]:
        path = h200_house.out / w["file"]
        assert path.stat().st_size == w["size"] and wh.sha256_of(path) == w["sha256"]


def test_h200_wheelhouse_installs_offline_with_the_printed_commands(h200_house, h200_frozen, python312, tmp_path):
    python = target_environment(tmp_path / "h200", python312, h200_frozen)
    install(h200_house, python)
    versions = installed(python)
    assert versions["vllm"] == VLLM and versions["sam-spec-rollout"] == "0.1.0"
    assert versions["numba"] == "0.65.0" and versions["numpy"] == "2.3.5"  # replaced, as reported
    assert versions["torch"] == "2.11.0+cu130" and versions["transformers"] == "5.17.0"  # kept
    # the drafter, on the carried cp312 numba and numpy
    code = (
        "import numba, numpy; from sam_rollout.drafter import SuffixAutomaton; sa = SuffixAutomaton([1, 2, 3, 1, 2]);"
        " print(numba.__version__, numpy.__version__, sa.draft(3).tolist())"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["0.65.0", "2.3.5", "[3,", "1,", "2]"]


def test_a_second_build_reaches_no_index(h200_house, h200_frozen, python312, tmp_path, monkeypatch):
    """Everything comes from the cache: with pip told there is no index, the same wheelhouse is built."""
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    target = wh.Target.parse("3.12", [PLATFORM])
    again = wh.build(
        target=target, vllm_version=VLLM, frozen=h200_frozen, out=tmp_path / "again", python=python312,
        replace=("numba", "numpy"),
    )  # fmt: skip
    closure = [w for w in h200_house.manifest["wheels"] if w["role"] != "project"]
    assert [w for w in again.manifest["wheels"] if w["role"] != "project"] == closure


# -- vLLM imported (Python 3.11, this machine's torch laid under the install) -------------------------------
@pytest.fixture(scope="module")
def torch_view(tmp_path_factory) -> Path:
    """This interpreter's torch and the packages only torch needs, as a folder of links (no metadata:
    the target environment's claims stand for them)."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    view = tmp_path_factory.mktemp("torch-view")
    for name in TORCH_VIEW:
        (view / name).symlink_to(site / name)
    return view


def test_vllm_imports_from_the_wheelhouse_and_loads_the_sam_plugin(tmp_path, torch_view):
    import torch

    require(torch.__version__.startswith("2.13.0"), f"torch 2.13.0 expected here, found {torch.__version__}")
    frozen = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
    frozen |= {name: _version(name) for name in ("sympy", "mpmath", "networkx")}
    target = wh.Target.parse("3.11", [PLATFORM])
    house = wh.build(target=target, vllm_version=VLLM, frozen=frozen, out=tmp_path / "house", python=sys.executable)
    python = target_environment(tmp_path / "cp311", sys.executable, frozen)
    install(house, python)
    (site,) = (tmp_path / "cp311").glob("lib/python3.*/site-packages")
    (site / "torch_view.pth").write_text(f"{torch_view}\n")
    code = """
import json, sys
sys.modules["torchcodec"] = None  # CUDA-only native library (see the module docstring): an ImportError
import vllm, sam_rollout
from vllm import LLM
from vllm.plugins import load_plugins_by_group
from sam_rollout.patches import decisions
from sam_rollout.vllm import routes
plugins = load_plugins_by_group("vllm.general_plugins")
for register in plugins.values():
    register()
print(json.dumps({"vllm": vllm.__version__, "vllm_file": vllm.__file__, "sam_rollout_file": sam_rollout.__file__,
                  "llm": LLM.__module__, "routes": sorted(routes.available_routes()),
                  "plugins": {name: f"{f.__module__}:{f.__name__}" for name, f in plugins.items()},
                  "patches": [d.patch.name for d in decisions("vllm") if d.apply]}))
"""
    env = dict(offline_env(), VLLM_PLUGINS="sam_spec_rollout")
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["vllm"] == VLLM and seen["vllm_file"].startswith(str(tmp_path / "cp311"))
    assert seen["sam_rollout_file"].startswith(str(tmp_path / "cp311")), "SAM must come from the project wheel"
    # 0.26 offers the speculator route too (GPU only: the engine refuses it on this CPU platform)
    assert seen["llm"] == "vllm.entrypoints.llm" and seen["routes"] == ["custom_class", "speculator"]
    assert seen["plugins"] == {"sam_spec_rollout": "sam_rollout.plugin:register"}  # found through the entry point


def _version(name: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(name)
