"""verl 0.9.1's own actor on the CPU, in one process: the log-probs its trainer computes for given responses
(the old log-probs that the rollout correction compares with the engine's). For evals and tests.

``actor_log_probs`` builds ``ActorRolloutRefWorker(role="actor")`` from a composed recipe config (the CPU
preset: FSDP2 over gloo, one rank) and feeds it as verl's trainer does (``ray_trainer._compute_old_log_prob``:
the padded batch to no-padding tensors, ``compute_log_prob``, back to padding). It sets up a one-rank
process group, so ``score_in_subprocess`` runs it in a fresh spawned process with ``VERL_PLATFORM=cpu``
before verl is first imported there.
"""

from __future__ import annotations

import os
import socket


def _one_rank_env() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "VERL_PLATFORM": "cpu",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def padded_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, temperature: float):
    """verl's rollout batch: prompts left-padded, responses right-padded, position ids from the mask."""
    import torch
    from verl.protocol import DataProto

    width_p = max(len(p) for p in prompts)
    width_r = max(max(len(r) for r in responses), 1)
    ids, mask, resp, resp_mask = [], [], [], []
    for p, r in zip(prompts, responses, strict=True):
        left, right = width_p - len(p), width_r - len(r)
        ids.append([pad_id] * left + list(p) + list(r) + [pad_id] * right)
        mask.append([0] * left + [1] * (len(p) + len(r)) + [0] * right)
        resp.append(list(r) + [pad_id] * right)
        resp_mask.append([1] * len(r) + [0] * right)
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0),
        "prompts": ids[:, :width_p],
        "responses": torch.tensor(resp),
        "response_mask": torch.tensor(resp_mask),
    }
    return DataProto.from_dict(tensors, meta_info={"temperature": temperature})


def actor_log_probs(config: dict, prompts, responses, temperature: float, pad_id: int) -> list[list[float]]:
    """Log-probs of each response token under verl's actor built from ``config`` (a whole recipe config
    as a plain dict). Call it in a process whose environment already has ``_one_rank_env()``."""
    from omegaconf import OmegaConf
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    cfg = OmegaConf.create(config)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    micro = int(cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)
    n = len(responses)
    fill = -n % micro  # the trainer pads its batch to a multiple of the micro-batch too
    batch = padded_batch(prompts + prompts[-1:] * fill, responses + responses[-1:] * fill, pad_id, temperature)
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    log_probs = no_padding_2_padding(tu.get(worker.compute_log_prob(td), "log_probs"), td)
    return [log_probs[i, : len(r)].double().tolist() for i, r in enumerate(responses)]


def _child(env: dict, *args):
    os.environ.update(env)
    return actor_log_probs(*args)


def score_in_subprocess(config: dict, prompts, responses, temperature: float, pad_id: int) -> list[list[float]]:
    """``actor_log_probs`` in a fresh spawned process (its own one-rank process group and verl platform)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_child, _one_rank_env(), config, prompts, responses, temperature, pad_id).result()
