"""SAM metrics in verl's logs: per-step deltas of the proposer's counters, added by the wrapped
verl Tracking.log to every training step's dict, written by verl's real file logger and read back by
scripts/ab_compare.py; and Ray's worker setup hook installing all of it in a Ray worker."""

import importlib.util
import json
import os
import sys

import pytest
from verl_step import REPO, verl_step_only

verl_step_only()

import ray  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

from rollout.metrics import SamStepTracker  # noqa: E402
from rollout.verl import recipe_config, replica, tracking  # noqa: E402


def snapshot(calls, steps, steps_on, measured, accepted, rows, drafter_ms_per_call=0.5):
    """What SamMetrics.as_dict() returns (rollout/metrics.py), the fields the tracker reads."""
    return {
        "calls": calls,
        "steps": steps,
        "steps_on": steps_on,
        "drafter_seconds": drafter_ms_per_call * calls / 1e3,
        "num_drafts": measured,
        "num_draft_tokens": 3 * measured,
        "num_measured_drafts": measured,
        "num_accepted_tokens": accepted,
        "decode_row_steps": rows,
    }


def test_step_metrics_are_differences_since_the_last_step():
    tracker = SamStepTracker()
    first = tracker.step_metrics({"rollout_0": snapshot(100, 100, 40, 200, 150, 1000)})
    assert first["rollout/sam_acceptance_length"] == pytest.approx(1.75)
    assert first["rollout/sam_spec_on_fraction"] == pytest.approx(0.4)
    assert first["rollout/sam_drafter_ms"] == pytest.approx(0.5)
    assert first["rollout/sam_tokens_per_row_step"] == pytest.approx(1.15)
    second = tracker.step_metrics({"rollout_0": snapshot(300, 300, 140, 600, 350, 3000)})
    assert second["rollout/sam_acceptance_length"] == pytest.approx(1 + 200 / 400)
    assert second["rollout/sam_spec_on_fraction"] == pytest.approx(0.5)
    assert second["rollout/sam_draft_tokens"] == 1200


def test_engines_add_up_and_a_restart_counts_from_zero():
    tracker = SamStepTracker()
    tracker.step_metrics({"a": snapshot(100, 100, 50, 100, 100, 500), "b": snapshot(100, 100, 50, 100, 100, 500)})
    m = tracker.step_metrics({"a": snapshot(200, 200, 100, 200, 300, 1000), "b": snapshot(10, 10, 10, 20, 10, 50)})
    assert m["rollout/sam_accepted_tokens"] == 200 + 10  # b restarted: its counters are the delta
    assert m["rollout/sam_acceptance_length"] == pytest.approx(1 + 210 / 120)
    assert m["rollout/sam_engines"] == 2


def test_no_sam_engine_adds_nothing():
    assert SamStepTracker().step_metrics({}) == {}
    assert tracking.is_training_step({"timing_s/gen": 1.0})
    assert not tracking.is_training_step({"val-core/aime-2024/acc/mean@1": 0.1})


WORKER_START_S = 600  # a new Ray worker process (imports torch and verl) on a busy 2-core machine


@pytest.fixture(scope="module")
def ray_local():
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=80 * 2**20,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": "rollout.verl.hook.install", "env_vars": {"PYTHONPATH": REPO}},
    )
    yield
    ray.shutdown()


@ray.remote
class EngineCounters:
    """Stands in for SamvLLMHttpServer's engine: the counters its workers' proposers would return."""

    def __init__(self, snapshots):
        self.snapshots = list(snapshots)

    async def sam_spec_metrics(self):
        return [self.snapshots.pop(0), None]  # first worker has the drafter, as every TP rank does

    def ready(self):
        return True


@ray.remote
def hook_effects_in_a_ray_worker():
    from verl.utils.tracking import Tracking
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    loader = RolloutReplicaRegistry._registry["vllm"]
    return loader.__module__, loader.__name__, getattr(Tracking.log, "__sam_spec_wrapped__", False)


def test_ray_worker_setup_hook_installs_the_replica_and_metrics(ray_local):
    assert ray.get(hook_effects_in_a_ray_worker.remote(), timeout=WORKER_START_S) == (
        "rollout.verl.hook",
        "_load_sam_replica",
        True,
    )


def load_ab_compare():
    spec = importlib.util.spec_from_file_location("sam_ab_compare_v", os.path.join(REPO, "scripts", "ab_compare.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_metrics_reach_verls_file_log(ray_local, tmp_path, monkeypatch):
    log_path = tmp_path / "sam.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log_path))
    tracking.wrap()
    cfg = recipe_config.compose_recipe(
        "dapo_qwen3_32b",
        "dapo_qwen3_32b",
        ["actor_rollout_ref.model.path=/m", "data.train_files=/t", "data.val_files=/v"],
    )
    sam_replica = replica.SamvLLMReplica(0, cfg.actor_rollout_ref.rollout, None, gpus_per_node=16)
    sam_replica.servers = [
        EngineCounters.remote([snapshot(100, 100, 40, 200, 150, 1000), snapshot(300, 300, 140, 600, 350, 3000)])
    ]
    # a running server answers within tracking's RPC timeout; a new worker process on a busy machine may not
    assert ray.get(sam_replica.servers[0].ready.remote(), timeout=WORKER_START_S)
    verl_log = Tracking(project_name="sam-dapo", experiment_name="test", default_backend="file")
    verl_log.log({"val-core/aime-2024/acc/mean@1": 0.1}, step=0)
    verl_log.log({"timing_s/gen": 10.0, "critic/score/mean": 0.1}, step=1)
    verl_log.log({"timing_s/gen": 9.0, "critic/score/mean": 0.2}, step=2)
    verl_log.finish()
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert not any(k.startswith("rollout/sam_") for k in records[0]["data"])  # validation only
    assert records[1]["data"]["rollout/sam_acceptance_length"] == pytest.approx(1.75)
    assert records[2]["data"]["rollout/sam_acceptance_length"] == pytest.approx(1.5)
    assert records[2]["data"]["rollout/sam_spec_on_fraction"] == pytest.approx(0.5)
    assert records[2]["data"]["rollout/sam_drafter_ms"] == pytest.approx(0.5)
    steps = load_ab_compare().training_steps(load_ab_compare().read_metrics(log_path))
    assert sorted(steps) == [1, 2] and steps[2]["rollout/sam_acceptance_length"] == pytest.approx(1.5)
