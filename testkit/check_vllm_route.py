"""Which SAM route the installed vLLM offers and, given a model, whether SAM on it decodes greedily exactly
as the engine without speculation (device_checks.sh's vLLM part).

    python -m testkit.check_vllm_route --json OUT.json                  # route only (no engine)
    python -m testkit.check_vllm_route --json OUT.json --model PATH     # plus a greedy identity run

vLLM 0.34 runs SAM as method "sam", vLLM 0.23 to 0.32 as custom_class (sam_rollout/vllm/routes.py). Without
vLLM the JSON says so and the script exits 0: the accelerator machine may have none.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

PROMPTS = [
    "Count from 1 to 40 separated by commas: 1, 2, 3,",
    "Repeat the word 'alpha' twenty times: alpha alpha alpha",
    "Write the alphabet in capitals with spaces: A B C D",
    "List the even numbers below 60: 2, 4, 6,",
]


def speculative_config(route: str, k: int) -> dict:
    from sam_rollout.engine_kwargs import SAM_PROPOSER

    if route == "sam":
        return {"method": "sam", "num_speculative_tokens": k}
    return {"method": "custom_class", "model": SAM_PROPOSER, "num_speculative_tokens": k}


def greedy_identity(model: str, route: str, k: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs, seconds = {}, {}
    for arm in ("none", "sam"):
        extra = {}
        if arm == "sam":
            extra = {
                "speculative_config": speculative_config(route, k),
                "additional_config": {"sam_spec": {"switch": None}},
            }
        llm = LLM(model=model, max_model_len=1024, enforce_eager=True, disable_log_stats=False, **extra)
        t0 = time.perf_counter()
        outputs[arm] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
        seconds[arm] = time.perf_counter() - t0
        if arm == "sam":
            metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "spec_decode" in m.name}
        del llm
    return {"identical": outputs["none"] == outputs["sam"], "seconds": seconds, "spec_decode_metrics": metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--model", help="a local model path: also run the greedy identity check")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    report: dict = {"vllm": None, "routes": []}
    if importlib.util.find_spec("vllm") is None:
        report["engine"] = "skipped: vLLM is not installed"
    else:
        import vllm

        from sam_rollout.vllm import routes

        report["vllm"] = vllm.__version__
        report["routes"] = sorted(routes.available_routes())
        if not report["routes"]:
            report["engine"] = "skipped: " + routes.refusal(vllm.__version__, frozenset(), "sam")
        elif args.model is None:
            report["engine"] = "skipped: no --model"
        else:
            route = "sam" if "sam" in report["routes"] else "custom_class"
            report["engine"] = {"route": route, **greedy_identity(args.model, route, args.k, args.max_tokens)}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
