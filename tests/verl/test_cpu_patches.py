"""The verl patches (sam_rollout.verl.cpu.patches, sam_rollout.verl.runtime.weight_checksums) as verl's plugin applies
them: each once, only with VERL_PLATFORM=cpu (the checksums only when asked), each switch turning its
patch off. In a fresh process each, as verl loads its plugins when it is imported."""

import json
import os
import subprocess
import sys

from verl_step import REPO, verl_step_only

verl_step_only()

from sam_rollout.verl.cpu.patches import _plain_gloo  # noqa: E402

IMPORT_VERL_TWICE = """
import importlib, json, os
import verl  # loads the verl plugin (entry point verl.plugins), which applies the patches
import sam_rollout.verl.plugin
importlib.reload(sam_rollout.verl.plugin)
from sam_rollout import patches
import verl.utils.config, verl.utils.distributed
import verl.workers.rollout.vllm_rollout.bucketed_weight_transfer as transfer
import verl.workers.rollout.vllm_rollout.vllm_rollout as vllm_rollout
targets = {
    "verl_plain_gloo": verl.utils.distributed.initialize_global_process_group_ray,
    "verl_cpu_config_check": verl.utils.config.validate_config,
    "verl_weight_sync_timeout": transfer.BucketedWeightSender._init_socket,
}
out = {name: [patches.is_patched(t, name), patches.is_patched(getattr(t, "original", None), name)]
       for name, t in targets.items()}
out["verl_fsdp_engine_device"] = os.environ.get("VERL_ENGINE_DEVICE")
from sam_rollout.verl.runtime import weight_checksums
out["weight_checksums"] = getattr(vllm_rollout.ServerAdapter.update_weights, weight_checksums._MARK, False)
out["applied"] = [d.patch.name for d in patches.decisions("verl") if d.apply]
print("RESULT", json.dumps(out))
"""


def import_verl_twice(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SAM_PATCH_") and k != "VERL_ENGINE_DEVICE"}
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_VERL_TWICE],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULT", 1)[1])


def test_cpu_patches_apply_once_with_verl_platform_cpu_and_switch_off():
    cpu_patches = ["verl_fsdp_engine_device", "verl_plain_gloo", "verl_cpu_config_check", "verl_weight_sync_timeout"]
    on = import_verl_twice(VERL_PLATFORM="cpu")
    assert on["applied"] == cpu_patches  # the checksums are opt-in
    assert all(on[name] == [True, False] for name in cpu_patches[1:]), on  # patched, and once
    assert on["verl_fsdp_engine_device"] == "cuda"
    off = import_verl_twice(VERL_PLATFORM="cpu", SAM_PATCH_VERL_PLAIN_GLOO="0", SAM_PATCH_WEIGHT_CHECKSUMS="1")
    assert off["applied"] == [*(p for p in cpu_patches if p != "verl_plain_gloo"), "weight_checksums"]
    assert off["verl_plain_gloo"] == [False, False] and off["weight_checksums"]
    elsewhere = import_verl_twice(VERL_PLATFORM="")
    assert elsewhere["applied"] == [] and not any(elsewhere[name][0] for name in cpu_patches[1:])


def test_plain_gloo_backend():
    assert _plain_gloo("cpu:gloo,cpu:gloo") == "gloo"
    assert _plain_gloo(None) == "gloo"
    assert _plain_gloo("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"  # a real device keeps verl's string
