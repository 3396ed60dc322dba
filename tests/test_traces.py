"""Trace files: written and read back unchanged with their settings, bad files refused clearly, and the
committed long-trace fixture has the promised shape."""

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.traces import FORMAT, SampledGroup, TraceFileError, load_trace_file, read_traces, write_traces
from testkit.data import TraceGroup

FIXTURE = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures" / "smollm2_dapo_T1.0_n8.npz"
SETTINGS = {
    "model": "tiny",
    "dtype": "bfloat16",
    "engine": "vllm 0.0",
    "seed": 7,
    "date": "2026-11-30",
    "vocab_size": 50000,
}


def sample_groups(vocab=50000) -> list[SampledGroup]:
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(0, vocab, size=n)  # noqa: E731
    # written out of prompt order, as groups finish in an engine; one empty response
    return [
        SampledGroup(5, ids(7), [ids(3), ids(0)], ["stop", "length"]),
        SampledGroup(2, ids(4), [ids(9), ids(1), ids(2)], ["length", "stop", "stop"]),
    ]


def test_round_trip_keeps_tokens_order_and_settings(tmp_path):
    path = write_traces(tmp_path / "t.npz", sample_groups(), SETTINGS)
    groups, settings = read_traces(path)
    expected = sorted(sample_groups(), key=lambda g: g.prompt_index)
    assert [g.prompt_index for g in groups] == [2, 5]
    for got, want in zip(groups, expected):
        assert np.array_equal(got.prompt, want.prompt) and got.prompt.dtype == np.int32
        assert [r.tolist() for r in got.responses] == [r.tolist() for r in want.responses]
        assert got.finish_reasons == want.finish_reasons
    assert settings == SETTINGS | {"format": FORMAT}
    loaded = load_trace_file(path)
    assert all(isinstance(g, TraceGroup) for g in loaded) and [len(g.responses) for g in loaded] == [3, 2]


def test_small_vocabularies_are_stored_as_uint16_large_ones_as_int32(tmp_path):
    write_traces(tmp_path / "small.npz", sample_groups(), SETTINGS)
    big = sample_groups(vocab=151_936)
    write_traces(tmp_path / "big.npz", big, SETTINGS | {"vocab_size": 151_936})
    with np.load(tmp_path / "small.npz") as z:
        assert z["response_tokens"].dtype == np.uint16
    with np.load(tmp_path / "big.npz") as z:
        assert z["response_tokens"].dtype == np.int32
    groups, _ = read_traces(tmp_path / "big.npz")
    assert groups[1].responses[0].tolist() == big[0].responses[0].tolist()


def test_writer_refuses_ids_outside_the_vocabulary_and_missing_vocab_size(tmp_path):
    with pytest.raises(ValueError, match="outside"):
        write_traces(tmp_path / "t.npz", sample_groups(vocab=50000), SETTINGS | {"vocab_size": 1000})
    with pytest.raises(ValueError, match="vocab_size"):
        write_traces(tmp_path / "t.npz", sample_groups(), {"model": "tiny"})
    assert not (tmp_path / "t.npz").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such trace file"),
        (lambda p: p.write_text("not a zip"), "not a readable"),
        (lambda p: np.savez(p, x=np.arange(3)), "missing"),
    ],
)
def test_bad_files_raise_a_clear_error(tmp_path, make, message):
    path = tmp_path / "bad.npz"
    make(path)
    with pytest.raises(TraceFileError, match=message):
        read_traces(path)


def test_a_file_of_another_format_is_refused(tmp_path):
    path = write_traces(tmp_path / "t.npz", sample_groups(), SETTINGS)
    with np.load(path) as z:
        arrays = {name: z[name] for name in z.files}
    arrays["settings_json"] = np.asarray(json.dumps({"format": "other/v9"}))
    np.savez(path, **arrays)
    with pytest.raises(TraceFileError, match="format"):
        read_traces(path)


def test_fixture_has_the_promised_shape():
    assert zipfile.is_zipfile(FIXTURE) and FIXTURE.stat().st_size <= 10 << 20
    groups, settings = read_traces(FIXTURE)
    assert settings["n"] >= 8 and settings["max_tokens"] <= 4096 and settings["temperature"] == 1.0
    assert settings["speculative_decoding"].startswith("none")
    assert len(groups) >= 8
    for g in groups:
        assert len(g.responses) == settings["n"] and len(g.finish_reasons) == settings["n"]
        assert max(len(r) for r in g.responses) <= settings["max_tokens"]
        assert all(int(r.max(initial=0)) < settings["vocab_size"] for r in g.responses)
        # a response stops for a reason; one cut by the cap holds exactly max_tokens tokens
        for r, reason in zip(g.responses, g.finish_reasons):
            assert reason in ("stop", "length") and (reason != "length" or len(r) == settings["max_tokens"])
    assert max(len(r) for g in groups for r in g.responses) > 2048  # long enough to show late positions
