"""The prompt stores in verl 0.9.1's checkpoints (sam_rollout.verl.runtime.checkpoint): the folders verl's V1 trainer
saves to and resumes from, and its real ``_save_checkpoint``/``_load_checkpoint`` wrapped, on a sync
trainer built from the CPU recipe's config. Stood in: the actor worker group and the dataloader (no
model here), and each replica's server, a Ray actor whose one engine worker holds a real SamStepper
and answers through the worker RPCs of sam_rollout.vllm.runner_patch; with SamvLLMHttpServer's own
export and import methods, the router's store handoff goes server to server through Ray."""

import os
from types import SimpleNamespace

import numpy as np
import pytest
from verl_step import verl_step_only

verl_step_only()

import ray  # noqa: E402
from test_verl_metrics import WORKER_START_S, ray_local  # noqa: E402, F401 (Ray with the recipes' worker hook)
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path  # noqa: E402

from sam_rollout.drafter.prompt_store import prompt_key  # noqa: E402
from sam_rollout.verl.launcher import recipe_config  # noqa: E402
from sam_rollout.verl.runtime import checkpoint, replica  # noqa: E402
from sam_rollout.verl.runtime.store_handoff import RayStoreHandoff  # noqa: E402

RECIPE = ("dapo_smollm2_cpu", "dapo_smollm2_cpu")


def config(tmp_path, *overrides):
    return recipe_config.compose_recipe(
        *RECIPE,
        [
            "actor_rollout_ref.model.path=/m",
            "data.train_files=/t",
            "data.val_files=/v",
            f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
            "sam.spec.prompt_store=true",
            *overrides,
        ],
    )


# -- folders --------------------------------------------------------------------------------------
def test_the_resumed_folder_is_the_one_verl_finds(tmp_path):
    cfg = config(tmp_path, "trainer.resume_mode=auto").trainer
    root = tmp_path / "checkpoints"
    (root / "global_step_7").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    assert checkpoint.resumed_checkpoint_folder(cfg, 7) == find_latest_ckpt_path(str(root))
    assert checkpoint.saved_checkpoint_folder(cfg, 7) == str(root / "global_step_7")
    assert checkpoint.resumed_checkpoint_folder(cfg, 0) is None  # verl found nothing: from scratch


def test_resume_path_relative_to_the_working_folder_and_disable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, "trainer.resume_mode=resume_path", "trainer.resume_from_path=elsewhere/global_step_3")
    assert checkpoint.resumed_checkpoint_folder(cfg.trainer, 3) == str(tmp_path / "elsewhere" / "global_step_3")
    assert checkpoint.resumed_checkpoint_folder(config(tmp_path, "trainer.resume_mode=disable").trainer, 3) is None


def test_a_relative_default_local_dir_is_made_absolute_for_the_engines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, "trainer.default_local_dir=ckpts").trainer
    assert checkpoint.store_path(checkpoint.saved_checkpoint_folder(cfg, 2), "rollout_1") == str(
        tmp_path / "ckpts" / "global_step_2" / "sam_prompt_store" / "rollout_1.npz"
    )


def test_checkpoints_kept_follows_verls_actor_rule(tmp_path):
    assert checkpoint.checkpoints_kept(config(tmp_path).trainer) is None
    assert checkpoint.checkpoints_kept(config(tmp_path, "trainer.max_actor_ckpt_to_keep=2").trainer) == 2
    assert checkpoint.checkpoints_kept(config(tmp_path, "+trainer.remove_previous_ckpt_in_save=true").trainer) == 1


# -- the wrapped trainer methods --------------------------------------------------------------------
@ray.remote(num_cpus=0)
class StoreServer:
    """Stands in for SamvLLMHttpServer: an engine of `workers` workers, each with a real SamStepper, which
    the worker RPCs of sam_rollout.vllm.runner_patch answer as collective_rpc does (one result per worker).
    `unreadable_on`: workers whose load fails as on a node that cannot read the file."""

    def __init__(self, workers=1, unreadable_on=()):
        self.configure(workers, unreadable_on)

    def configure(self, workers=1, unreadable_on=()):
        """A new engine of ``workers`` workers (the tests reuse actors: a new Ray worker takes seconds)."""
        self.size, self.unreadable_on = workers, set(unreadable_on)
        self.restart()

    def restart(self):
        """A new engine: empty prompt stores."""
        from sam_rollout.settings import SamSettings
        from sam_rollout.stepper import SamStepper, StepperAdapter

        self.workers = []
        for rank in range(self.size):
            drafter = StepperAdapter()  # what every engine adapter is (SAM's RPCs go through with_stepper)
            drafter.stepper = SamStepper(SamSettings.from_mapping(3, {"prompt_store": True}), max_model_len=256)
            self.workers.append(SimpleNamespace(rank=rank, model_runner=SimpleNamespace(drafter=drafter)))

    def visit(self, prompt, response):
        for worker in self.workers:  # every worker drafts alike
            d = worker.model_runner.drafter.stepper.drafter
            d.start("r", np.array(prompt), group="g")
            d.extend(["r"], np.array(response), [len(response)])
            d.finish("r")

    def contents(self, worker=0):
        store = self.workers[worker].model_runner.drafter.stepper.drafter.prompt_store
        return [(key, [r.tolist() for r in responses]) for key, responses in store.items()]

    async def sam_save_prompt_store(self, path):
        from sam_rollout.vllm.runner_patch import worker_sam_save_prompt_store

        return [worker_sam_save_prompt_store(w, path) for w in self.workers]

    async def sam_load_prompt_store(self, path):
        from sam_rollout.vllm.runner_patch import worker_sam_load_prompt_store

        return [worker_sam_load_prompt_store(w, path + ".unreadable" if w.rank in self.unreadable_on else path)
                for w in self.workers]  # fmt: skip

    async def sam_clear_prompt_store(self):
        from sam_rollout.vllm.runner_patch import worker_sam_clear_prompt_store

        return [worker_sam_clear_prompt_store(w) for w in self.workers]

    # the store handoff: SamvLLMHttpServer's own methods, over this engine's workers
    sam_export_prompt_responses = replica.SamvLLMHttpServer.sam_export_prompt_responses
    sam_import_prompt_responses = replica.SamvLLMHttpServer.sam_import_prompt_responses

    @property
    def engine(self):
        """``collective_rpc`` over this engine's workers: each answers with the real worker RPC (built here:
        the Ray worker cannot import this test module)."""
        from sam_rollout.vllm.runner_patch import WORKER_RPCS

        workers = self.workers

        async def collective_rpc(method, args=()):
            return [WORKER_RPCS[method](w, *args) for w in workers]

        return SimpleNamespace(collective_rpc=collective_rpc)


@pytest.fixture(scope="module")
def store_servers(ray_local):  # noqa: F811
    """``store_servers(count, workers=1, unreadable_on=())``: ``count`` StoreServers with new engines, taken
    from actors the module's tests share."""
    pool = []

    def take(count, workers=1, unreadable_on=()):
        pool.extend(StoreServer.remote() for _ in range(count - len(pool)))
        chosen = pool[:count]
        ray.get([s.configure.remote(workers, unreadable_on) for s in chosen], timeout=WORKER_START_S)
        return chosen

    return take


class ActorGroup:
    """Stands in for the actor worker group: the actor's checkpoint is a folder."""

    def save_checkpoint(self, local_path, hdfs_path, global_step, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        assert os.path.isdir(local_path), local_path


class Dataloader:
    def state_dict(self):
        return {"consumed": 1}

    def load_state_dict(self, state):
        assert state == {"consumed": 1}


def manager(cfg, servers):
    replicas = []
    for rank, server in enumerate(servers):
        r = replica.SamvLLMReplica(rank, cfg.actor_rollout_ref.rollout, None, gpus_per_node=1)
        r.servers = [server]
        replicas.append(r)
    return SimpleNamespace(get_replicas=lambda: replicas)


def trainer(tmp_path, servers, *overrides, more_managers=()):
    cfg = config(tmp_path, *overrides)
    t = PPOTrainerSync(cfg)
    t.actor_rollout_wg, t.train_dataloader = ActorGroup(), Dataloader()
    t.llm_server_manager = manager(cfg, servers)
    others = [manager(cfg, more) for more in more_managers]
    t._rollout_server_managers = lambda: [t.llm_server_manager, *others]
    return t


def test_stores_are_saved_with_each_checkpoint_and_loaded_on_resume(store_servers, tmp_path, capsys):
    checkpoint.wrap()
    checkpoint.wrap()  # idempotent
    assert PPOTrainerSync._save_checkpoint.__wrapped__.__qualname__ == "PPOTrainer._save_checkpoint"
    servers = store_servers(2)
    ray.get(servers[0].visit.remote([1, 2, 3], [10, 11, 12]), timeout=WORKER_START_S)
    ray.get(servers[1].visit.remote([4, 5], [20, 21]), timeout=WORKER_START_S)
    ray.get(servers[1].visit.remote([6], [30]), timeout=WORKER_START_S)
    saved = ray.get([s.contents.remote() for s in servers])
    root = tmp_path / "checkpoints"

    t = trainer(tmp_path, servers, "trainer.max_actor_ckpt_to_keep=1")
    for step in (2, 4):
        t.global_steps = step
        t._save_checkpoint()
    out = capsys.readouterr().out
    assert "[sam] prompt store of rollout_1: saved 2 prompts, 3 tokens" in out
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert not (root / "global_step_2" / "sam_prompt_store").exists()  # kept: the newest one only
    assert sorted(os.listdir(root / "global_step_4" / "sam_prompt_store")) == ["rollout_0.npz", "rollout_1.npz"]

    ray.get([s.restart.remote() for s in servers])  # new engines
    os.remove(root / "global_step_4" / "sam_prompt_store" / "rollout_1.npz")
    resumed = trainer(tmp_path, servers, "trainer.resume_mode=auto")
    resumed._load_checkpoint()
    assert resumed.global_steps == 4
    assert ray.get(servers[0].contents.remote()) == saved[0]  # rank 0 has rank 0's store
    assert ray.get(servers[1].contents.remote()) == []  # its file is gone: empty, and said so
    out = capsys.readouterr().out
    assert "[sam] prompt store of rollout_0: loaded 1 prompts, 3 tokens" in out
    assert "[sam] WARNING: prompt store of rollout_1 starts empty" in out and "no such file" in out


def test_a_failed_save_is_loud_and_training_goes_on(store_servers, tmp_path, caplog):
    checkpoint.wrap()
    (server,) = store_servers(1)
    ray.get(server.visit.remote([1, 2, 3], [10, 11, 12]), timeout=WORKER_START_S)
    t = trainer(tmp_path, [server])
    t.global_steps = 1
    (tmp_path / "checkpoints" / "global_step_1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "global_step_1" / "sam_prompt_store").write_text("a file where the folder goes")
    t._save_checkpoint()  # does not raise
    assert "SAM prompt store of rollout_0 NOT saved" in caplog.text
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "1"


def test_two_managers_rank_r_replicas_save_to_their_own_files(store_servers, tmp_path, capsys):
    checkpoint.wrap()
    ours, theirs = store_servers(2)  # rank 0 of each of two rollout managers
    ray.get(ours.visit.remote([1, 2, 3], [10, 11, 12]), timeout=WORKER_START_S)
    ray.get(theirs.visit.remote([7, 8], [70, 71, 72, 73]), timeout=WORKER_START_S)
    saved = ray.get([ours.contents.remote(), theirs.contents.remote()])
    t = trainer(tmp_path, [ours], more_managers=[[theirs]])
    t.global_steps = 1
    t._save_checkpoint()
    folder = tmp_path / "checkpoints" / "global_step_1" / "sam_prompt_store"
    assert sorted(os.listdir(folder)) == ["manager1_rollout_0.npz", "rollout_0.npz"]
    ray.get([ours.restart.remote(), theirs.restart.remote()])
    trainer(tmp_path, [ours], "trainer.resume_mode=auto", more_managers=[[theirs]])._load_checkpoint()
    assert ray.get([ours.contents.remote(), theirs.contents.remote()]) == saved  # neither store lost


def test_a_partial_load_empties_every_worker_of_the_engine(store_servers, tmp_path, capsys):
    checkpoint.wrap()
    (server,) = store_servers(1, workers=2, unreadable_on=[1])
    ray.get(server.visit.remote([1, 2, 3], [10, 11, 12]), timeout=WORKER_START_S)
    t = trainer(tmp_path, [server])
    t.global_steps = 1
    t._save_checkpoint()
    ray.get(server.restart.remote())
    trainer(tmp_path, [server], "trainer.resume_mode=auto")._load_checkpoint()
    assert ray.get([server.contents.remote(0), server.contents.remote(1)]) == [[], []]  # the workers agree
    out = capsys.readouterr().out
    assert "[sam] WARNING: prompt store of rollout_0 starts empty: only 1 of 2 workers loaded it" in out
    assert "every worker emptied (2 of 2)" in out


def test_a_full_load_on_every_worker_is_kept(store_servers, tmp_path, capsys):
    checkpoint.wrap()
    (server,) = store_servers(1, workers=2)
    ray.get(server.visit.remote([1, 2, 3], [10, 11, 12]), timeout=WORKER_START_S)
    saved = ray.get(server.contents.remote())
    t = trainer(tmp_path, [server])
    t.global_steps = 1
    t._save_checkpoint()
    ray.get(server.restart.remote())
    trainer(tmp_path, [server], "trainer.resume_mode=auto")._load_checkpoint()
    assert ray.get([server.contents.remote(0), server.contents.remote(1)]) == [saved, saved]
    assert "[sam] prompt store of rollout_0: loaded 1 prompts, 3 tokens" in capsys.readouterr().out


# -- the router's store handoff between two servers (sam_rollout.verl.runtime.store_handoff) ----------
HANDOFF_PROMPT = [1, 2, 3, 4]


def key(prompt):
    return prompt_key(np.array(prompt, dtype=np.int32))


def test_a_handoff_copies_the_prompts_responses_to_every_worker_of_the_target(store_servers):
    source, other, target = store_servers(3, workers=2)
    ray.get(source.visit.remote(HANDOFF_PROMPT, [10, 11, 12]), timeout=WORKER_START_S)
    ray.get(other.visit.remote(HANDOFF_PROMPT, [20, 21]), timeout=WORKER_START_S)
    ray.get(target.visit.remote([9, 9, 9], [5]), timeout=WORKER_START_S)  # another prompt, kept
    assert RayStoreHandoff()(key(HANDOFF_PROMPT), [source, other], target) is True
    after = ray.get([target.contents.remote(0), target.contents.remote(1)])
    assert after[0] == after[1]  # the workers stay alike: TP ranks must draft alike
    held = dict(after[0])
    assert held[key(HANDOFF_PROMPT)] == [[10, 11, 12], [20, 21]] and held[key([9, 9, 9])] == [[5]]
    assert ray.get(source.contents.remote()) == [(key(HANDOFF_PROMPT), [[10, 11, 12]])]  # a copy: the source keeps it


def test_a_prompt_the_sources_no_longer_hold_is_reported_as_not_arrived(store_servers):
    source, target = store_servers(2)
    assert RayStoreHandoff()(key(HANDOFF_PROMPT), [source], target) is False
    assert ray.get(target.contents.remote(), timeout=WORKER_START_S) == []


def test_a_malformed_export_is_refused_before_any_worker_takes_it(store_servers):
    (target,) = store_servers(1, workers=2)
    with pytest.raises(ray.exceptions.RayTaskError, match="malformed"):
        ray.get(target.sam_import_prompt_responses.remote({"00" * 16: [b"\0\0\0"]}), timeout=WORKER_START_S)
    assert ray.get([target.contents.remote(0), target.contents.remote(1)]) == [[], []]


@ray.remote(num_cpus=0)
class PlainServer:
    """A server without SAM's methods (verl's own vLLMHttpServer)."""

    def ready(self):
        return True


def test_servers_without_sam_turn_handoffs_off_with_a_reason(ray_local):  # noqa: F811
    plain = PlainServer.remote()
    assert ray.get(plain.ready.remote(), timeout=WORKER_START_S)
    handoff = RayStoreHandoff()
    assert handoff(key(HANDOFF_PROMPT), [plain], plain) is False
    assert "cannot hand off prompt stores" in handoff.unsupported
