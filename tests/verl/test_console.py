"""The training console (sam_rollout/verl/launcher/console.py): a command's whole output in the log file, the step
lines and the end on the console, the log's last lines on failure; where the log goes; and the
launcher's header."""

import io
import sys
import textwrap
from pathlib import Path

from verl_step import verl_step_only

verl_step_only()

from sam_rollout.verl.launcher import console  # noqa: E402

# what verl's driver prints while training: Ray's worker prefixes, colours, noise, our tracking's step lines
TRAINER = textwrap.dedent("""
    import sys
    print("ray init kwargs: {'num_cpus': 16}")
    for i in range(200):
        print(f"\\x1b[36m(SimpleStorageUnit pid=7)\\x1b[0m WARNING: noise {i}", file=sys.stderr)
    print("(TaskRunnerV1 pid=9) Creating file logger at /m/run.jsonl")
    print("\\x1b[36m(TaskRunnerV1 pid=9)\\x1b[0m [sam] step 1: reward 0.250, rollout s 18.1, SAM acceptance 1.63")
    print("(TaskRunnerV1 pid=9) [sam] step 2: reward 0.500, rollout s 4.0, SAM acceptance 1.19")
    sys.exit(int(sys.argv[1]))
""")


def run(tmp_path, exit_code, capsys):
    log = tmp_path / "run.log"
    cmd = [sys.executable, "-c", TRAINER, str(exit_code)]
    returncode = console.run_logged(cmd, {}, log, ["[sam] recipe r: SAM on"], total_steps=2, preamble="checks\n")
    return returncode, capsys.readouterr().out.splitlines(), log.read_text()


def test_the_console_shows_the_steps_and_the_log_holds_everything(tmp_path, capsys):
    returncode, out, log = run(tmp_path, 0, capsys)
    assert returncode == 0
    assert out[0] == f"full log: {tmp_path / 'run.log'}" and out[1] == "[sam] recipe r: SAM on"
    assert out[2].startswith("[sam] step 1/2 [##########..........] ")
    assert out[2].endswith(": reward 0.250, rollout s 18.1, SAM acceptance 1.63")
    assert out[3].startswith("[sam] step 2/2 [####################] ")
    assert out[4].startswith("[sam] done in ") and out[4].endswith(": step 2/2")
    assert out[5:] == ["metrics: /m/run.jsonl", f"full log: {tmp_path / 'run.log'}"]
    assert log.startswith("checks\n+ ") and "[sam] step 2: reward 0.500" in log
    assert all(f"noise {i}\n" in log for i in range(200))


def test_a_failed_run_shows_the_logs_last_lines_and_its_exit_status(tmp_path, capsys):
    returncode, out, _ = run(tmp_path, 3, capsys)
    assert returncode == 3
    failed = next(i for i, line in enumerate(out) if line.startswith("[sam] training failed (exit 3)"))
    tail = out[failed + 1 : -1]
    assert len(tail) == console.TAIL_LINES and "[sam] step 2: reward 0.500" in tail[-1]
    assert "\x1b" not in "".join(tail)  # colours stripped
    assert out[-1] == f"full log: {tmp_path / 'run.log'}"


def test_without_a_known_step_count_the_lines_carry_no_bar():
    out = io.StringIO()
    training = console.TrainingConsole(io.StringIO(), total_steps=None, out=out)
    training.feed("(TaskRunnerV1 pid=9) [sam] step 3: reward 1.000\n")
    (line,) = out.getvalue().splitlines()
    assert line.startswith("[sam] step 3 ") and line.endswith(": reward 1.000") and "[#" not in line


def test_the_log_goes_beside_the_metrics():
    at = 1_800_000_000
    stamp = console.time.strftime("%Y%m%d-%H%M%S", console.time.localtime(at))
    path = console.log_file({"VERL_FILE_LOGGER_PATH": "/runs/metrics_1.jsonl"}, "p", "e", at)
    assert path == Path(f"/runs/metrics_1-{stamp}.log")
    path = console.log_file({"VERL_FILE_LOGGER_ROOT": "/root/m"}, "sam-dapo", "exp", at)
    assert path == Path(f"/root/m/sam-dapo/exp-{stamp}.log")


def test_full_console_by_flag_or_environment(monkeypatch):
    monkeypatch.delenv(console.CONSOLE_ENV, raising=False)
    assert not console.full_console() and console.full_console(verbose=True)
    monkeypatch.setenv(console.CONSOLE_ENV, "full")
    assert console.full_console()


def test_the_header_names_the_recipe_arm_replicas_and_steps():
    from sam_rollout.verl.launcher import launch, recipe_config

    inputs = ["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"]
    runs = (
        ("dapo_smollm2_cpu", "sam=enabled", "SAM on, 1 rollout replica,"),
        ("dapo_smollm2_cpu_2replicas", "sam=disabled", "SAM off (baseline), 2 rollout replicas,"),
    )
    for config_name, arm, expected in runs:
        overrides = [*inputs, arm, "trainer.total_training_steps=3"]
        cfg = recipe_config.compose_recipe("dapo_smollm2_cpu", config_name, overrides)
        first, second = launch.console_header("dapo_smollm2_cpu", config_name, cfg)
        assert first.startswith(f"[sam] recipe dapo_smollm2_cpu ({config_name}): {expected} 3 training steps")
        assert "SAM_CONSOLE=full" in second
