"""Issue 46's benchmarks on the CPU: device_drafts_latency on the simulated device, gpu_loss_split's table from
modes' results (the engines themselves run on a GPU: scripts/device_lease.sh), and device_drafts_replay on a
slice of the real traces."""

from __future__ import annotations

import json

from benchmarks import device_drafts_latency, device_drafts_replay, gpu_loss_split


def test_device_drafts_benchmark_checks_every_step_and_times_three_engines(tmp_path):
    out = device_drafts_latency.main(
        ["--device", "cpu", "--json", str(tmp_path / "dd.json"), "--steps", "15", "--batches", "2", "--step-ms", "2"]
    )
    assert out["correctness"]["equal_at_every_step"] and out["correctness"]["steps_compared"] > 40
    rows = {r["mode"]: r for r in out["rows"]}
    assert set(rows) == {"plain", "sam_nodraft", "sam_k3"}
    assert rows["plain"]["tokens_per_step"] == rows["sam_nodraft"]["tokens_per_step"] == 1.0
    assert rows["sam_k3"]["tokens_per_step"] > 1.2  # its drafts were verified, and many accepted
    assert rows["plain"]["minus_plain_ms"] == 0 and json.loads((tmp_path / "dd.json").read_text())["rows"]


def _mode(tmp_path, mode, rows=None, tokens=None):
    result = dict(mode=mode, shape="smollm2", identity=tokens is not None, rows=rows or [])
    if tokens is not None:
        result["tokens"] = tokens
    name = f"loss_{'id_' if tokens is not None else ''}{mode}.json"
    (tmp_path / name).write_text(json.dumps(result))


def test_loss_split_table_divides_by_the_plain_v2_engine_and_compares_tokens(tmp_path):
    row = lambda batch, tps: dict(batch=batch, part="greedy", step_ms=1.0, tok_per_s=tps)
    _mode(tmp_path, "plain_v2_async", [row(1, 400.0), row(8, 3200.0)])
    _mode(tmp_path, "sam_v2_nodraft", [row(1, 392.0), row(8, 3100.0)])
    _mode(tmp_path, "plain_v1_sync", [row(1, 200.0)])
    _mode(tmp_path, "plain_v2_async", tokens=[[1, 2, 3], [4, 5, 6]])
    _mode(tmp_path, "plain_v1_sync", tokens=[[1, 2, 3], [4, 5, 7]])
    _mode(tmp_path, "sam_v2", tokens=[[1, 2, 3], [4, 5, 6]])
    table = gpu_loss_split.table(tmp_path)
    ratios = {(r["mode"], r["batch"]): r["x_plain_v2_async"] for r in table["rows"]}
    assert ratios == {
        ("plain_v2_async", 1): 1.0,
        ("plain_v2_async", 8): 1.0,
        ("sam_v2_nodraft", 1): 0.98,
        ("sam_v2_nodraft", 8): 0.969,
        ("plain_v1_sync", 1): 0.5,
    }
    identity = table["identity"]
    assert identity["sam_v2 vs plain_v2_async"]["identical"] is True
    assert identity["plain_v1_sync vs plain_v2_async"]["divergence_rate"] == 0.5
    assert identity["sam_v2 vs plain_v1_sync"]["identical"] is False


def test_every_mode_has_its_engine_arguments():
    assert set(gpu_loss_split.ORDER) == set(gpu_loss_split.MODES)
    for name, mode in gpu_loss_split.MODES.items():
        spec = gpu_loss_split.speculation(mode, 128).get("speculative_config")
        assert (spec is None) == (mode.sam is None and mode.method is None), name
    v2 = gpu_loss_split.speculation(gpu_loss_split.MODES["sam_v2_nodraft"], 128)["speculative_config"]
    assert v2["model"] == "sam_rollout.vllm.speculator.RegisteredSamSpeculator"
    assert v2["num_speculative_tokens_per_batch_size"] == [[1, 128, 0]]  # width 0 at every batch size


def test_device_drafts_replay_on_a_slice_of_real_traces(tmp_path):
    out = device_drafts_replay.main(
        ["--sets", "qwen25math", "--caps", "3", "--limit", "2", "--rows", "8", "--json", str(tmp_path / "r.json")]
    )
    row = out["results"]["qwen25math"]["3"]
    assert row["steps"] > 100 and row["steps_differing_from_synchronous"] == 0
    assert row["share_of_synchronous_gain"] == 1.0
    assert row["device_drafts"]["acceptance_length"] > 1.3
    assert row["replay"]["sam_synchronous"]["acceptance_length"] > 1.3
