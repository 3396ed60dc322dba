"""The engine-free harness of SAM's device-side drafting (``sam_rollout.device_drafts``): Model Runner V2
as ``SamSpeculator`` sees it, with the host ahead of the device, on any stream.

``SimulatedStream`` is a device on the CPU: a thread that runs the launched ops in order, so the host
can be steps ahead of it as on a GPU (``CudaStream`` is the real thing; the harness runs on both).

``AsyncHarness`` is an engine: each request has a fixed text (its "model output", ``streams``); a step
verifies each row's drafts against it, commits the accepted tokens and one more, as greedy decoding
of that text would, and then calls ``propose`` for the next step's drafts. Every step's device work is
launched, never waited for, except that the host schedules step t+1 only once step t-1's output is
there (vLLM's async scheduling keeps two steps in flight) and requests finish on a host schedule.
``run`` returns what the device received at every step; ``reference_drafts`` computes what synchronous
drafting (a ``SamStepper`` called after each step, as the custom_class route does) drafts on the same
steps, for the tests to compare step by step. On CUDA the same run times the pipeline against a plain
engine (``benchmarks.device_drafts_latency``).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from sam_rollout.settings import SETTINGS_KEY, SamSettings
from sam_rollout.stepper import SamStepper
from sam_rollout.vllm.speculator import SamSpeculator, batch_size_table, widths_by_batch_size


class _DeviceEvent:
    def __init__(self):
        self._reached = threading.Event()

    def synchronize(self) -> None:
        self._reached.wait()


class SimulatedStream:
    """A device on the CPU: launched ops run in order on a thread of their own."""

    def __init__(self):
        self.device = torch.device("cpu")
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="simulated device", daemon=True)
        self._thread.start()

    def launch(self, op, *args) -> None:
        if self._error is not None:
            raise RuntimeError("the simulated device failed") from self._error
        self._ops.put((op, args))

    def record(self) -> _DeviceEvent:
        event = _DeviceEvent()
        self._ops.put((event._reached.set, ()))
        return event

    def synchronize(self) -> None:
        self.record().synchronize()
        if self._error is not None:
            raise RuntimeError("the simulated device failed") from self._error

    def close(self) -> None:
        self._ops.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._ops.get()) is not None:
            op, args = item
            try:
                op(*args)
            except BaseException as e:  # later ops still run: events must be reached, or the host hangs
                self._error = self._error or e


def busy(stream, seconds: float) -> None:
    """Keep the device busy for ``seconds`` (a model's forward pass)."""
    if seconds <= 0:
        return
    if stream.device.type == "cuda":
        stream.launch(torch.cuda._sleep, int(seconds * _cycles_per_second(stream.device)))
    else:
        stream.launch(time.sleep, seconds)


@functools.cache
def _cycles_per_second(device) -> float:
    """``torch.cuda._sleep``'s cycles per second on this device, timed once."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(cycles // 10)  # the first call's start-up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


class HostToDevice:
    """Small host arrays to the device without a host wait: copies from a ring of pinned buffers (a
    plain ``.to(cuda)`` of pageable memory waits for the stream), as vLLM's runner stages its inputs."""

    def __init__(self, device: torch.device, size: int, depth: int = 8):
        self.device, self._next = device, 0
        pinned = device.type == "cuda"
        self._buffers = [torch.zeros(size, dtype=torch.int64, pin_memory=pinned) for _ in range(depth)]

    def __call__(self, values) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.as_tensor(np.asarray(values, dtype=np.int64))
        buffer = self._buffers[self._next]
        self._next = (self._next + 1) % len(self._buffers)
        n = len(values)
        buffer[:n] = torch.as_tensor(np.asarray(values, dtype=np.int64))
        return buffer[:n].to(self.device, non_blocking=True)


@dataclass
class Workload:
    """Requests and their texts: ``prompts[r]`` then ``responses[r]``. Request r may start at step
    ``arrive[r]`` once every request of an earlier ``wave`` has finished (and a batch row is free, in
    request order); it finishes at step ``finish[r]``, or, where that is None, once the host knows its
    response is committed (from the steps whose output it has: two steps late, as an async engine).
    Requests start in (wave, arrival, index) order."""

    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    arrive: list[int]
    finish: list[int | None]
    wave: list[int] | None = None

    @classmethod
    def texts(cls, prompts, responses, waves=None) -> Workload:
        """Real texts, each request running to its response's end, in waves (default: all at once)."""
        n = len(prompts)
        return cls(list(prompts), list(responses), [0] * n, [None] * n, list(waves) if waves is not None else None)

    @classmethod
    def periodic(cls, requests: int, steps: int, seed: int = 0, noise: float = 0.15) -> Workload:
        """Texts that mostly repeat a period shared by pairs of requests (GRPO siblings), with noise."""
        rng = np.random.default_rng(seed)
        prompts, responses, arrive, finish = [], [], [], []
        for r in range(requests):
            period = np.arange(5, 5 + 3 + (r // 2) % 4, dtype=np.int32) + 10 * ((r // 2) % 3)
            prompt = np.concatenate([[1, 2 + r // 2], np.tile(period, 2)]).astype(np.int32)
            response = np.tile(period, 4 * steps)[: 4 * steps].copy()
            noisy = rng.random(response.size) < noise
            response[noisy] = rng.integers(100, 140, int(noisy.sum()))
            prompts.append(prompt)
            responses.append(response.astype(np.int32))
            start = int(rng.integers(0, max(steps // 3, 1)))
            arrive.append(start)
            finish.append(int(min(steps, start + rng.integers(steps // 3, steps))))
        return cls(prompts, responses, arrive, finish)

    @classmethod
    def steady(cls, requests: int, steps: int, seed: int = 0) -> Workload:
        """``periodic`` texts, every request there from the first step to the last: a steady batch."""
        w = cls.periodic(requests, steps, seed)
        return cls(w.prompts, w.responses, [0] * requests, [steps] * requests)


@dataclass
class StepRecord:
    req_ids: list
    slots: np.ndarray
    width: int  # the drafts' width proposed at this step (verified at the next)
    finished_before: list = field(default_factory=list)


class AsyncHarness:
    """See the module docstring. ``sam_spec``: SAM's settings; ``k`` its draft width."""

    def __init__(
        self,
        workload: Workload,
        k: int,
        sam_spec: dict,
        stream,
        max_rows: int = 16,
        step_time_s: float = 0.0,
        speculate: bool = True,
    ):
        self.w, self.k, self.stream, self.max_rows = workload, k, stream, max_rows
        self.step_time_s = step_time_s
        device = stream.device
        # room past the longest text: a request runs on for up to 3 steps after its end (the host learns of
        # it two steps late), each committing up to k + 1 tokens of padding
        length = max(len(p) + len(r) for p, r in zip(workload.prompts, workload.responses)) + 4 * (k + 1)
        self.max_model_len = length
        self.texts = torch.zeros((len(workload.prompts), length), dtype=torch.int32, device=device)
        for r, (p, resp) in enumerate(zip(workload.prompts, workload.responses)):
            self.texts[r, : len(p) + len(resp)] = torch.from_numpy(np.concatenate([p, resp]))
        self.rs = SimpleNamespace(
            all_token_ids=SimpleNamespace(gpu=torch.zeros((max_rows, length), dtype=torch.int32, device=device)),
            total_len=SimpleNamespace(gpu=torch.zeros(max_rows, dtype=torch.int32, device=device)),
            prompt_len=SimpleNamespace(np=np.zeros(max_rows, dtype=np.int32)),
            prefill_len=SimpleNamespace(np=np.zeros(max_rows, dtype=np.int32)),
            last_sampled_tokens=torch.zeros((max_rows, 1), dtype=torch.int64, device=device),
            draft_tokens=torch.zeros((max_rows, k), dtype=torch.int64, device=device),
        )
        self.text_of_slot = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None),
            additional_config={SETTINGS_KEY: dict(sam_spec)},
            model_config=SimpleNamespace(max_model_len=length),
            scheduler_config=SimpleNamespace(max_num_seqs=max_rows),
        )
        self.settings = SamSettings.from_mapping(k, sam_spec)
        self.widths = widths_by_batch_size(batch_size_table(self.settings, max_rows))
        self.config.speculative_config.num_speculative_tokens_per_batch_size = batch_size_table(self.settings, max_rows)
        self.speculator = None
        if speculate:
            self.speculator = SamSpeculator(self.config, device, self.rs, compile=False, stream=stream)
        self.to_device = HostToDevice(device, max_rows)
        self.received: list[torch.Tensor] = []  # the drafts the device stored at each step
        self.sampled: list[torch.Tensor] = []  # tokens each row committed at each step
        self.steps: list[StepRecord] = []

    # -- the engine ---------------------------------------------------------------------------------
    def run(self, steps: int | None = None) -> float:
        """Run ``steps`` steps (None: until every request has finished); returns the wall seconds from the
        first launch until the device is done."""
        w, rs, stream = self.w, self.rs, self.stream
        waves = w.wave or [0] * len(w.prompts)
        free, slot_of, live = list(range(self.max_rows))[::-1], {}, []
        pending = sorted(range(len(w.prompts)), key=lambda r: (waves[r], w.arrive[r], r))  # not started
        committed = dict.fromkeys(range(len(w.prompts)), 0)  # response tokens the host knows are committed
        width_prev = {}  # request -> width of the drafts it holds
        outputs: list = []  # per step with rows: (its output event, its rows)
        seen = 0  # steps whose output the host has read
        t0, t = time.perf_counter(), 0
        while (steps is None and (pending or live)) or (steps is not None and t < steps):
            if len(outputs) >= 2:  # async scheduling: two steps in flight
                outputs[-2][0].synchronize()
                for counts, (_, rows) in zip(self.sampled[seen : len(outputs) - 1], outputs[seen:-1]):
                    for r, c in zip(rows, counts.tolist()):
                        committed[r] += c
                seen = len(outputs) - 1
            finished = [r for r in live if _finishes(w.finish[r], t, committed[r], len(w.responses[r]))]
            if finished and self.speculator is not None:
                self.speculator.on_requests_finished([str(r) for r in finished])
            for r in finished:
                live.remove(r)
                free.append(slot_of.pop(r))
            open_wave = min((waves[r] for r in pending + live), default=0)
            while pending and free and t >= w.arrive[pending[0]] and waves[pending[0]] <= open_wave:
                r = pending.pop(0)
                if w.finish[r] is not None and t >= w.finish[r]:
                    continue
                s = slot_of[r] = free.pop()
                n = len(w.prompts[r])
                rs.prompt_len.np[s] = rs.prefill_len.np[s] = n
                stream.launch(_add_request, rs, self.text_of_slot, self.texts, s, r, n)
                live.append(r)
                width_prev[r] = 0
            t += 1
            if not live:
                self.steps.append(StepRecord([], np.zeros(0, dtype=np.int64), 0, finished))
                continue
            order = sorted(live, key=lambda r: (width_prev[r] == 0, r)) if t % 2 else list(reversed(live))
            slots = np.array([slot_of[r] for r in order], dtype=np.int64)
            n = len(order)
            idx = self.to_device(slots)
            verify = self.to_device([width_prev[r] for r in order])
            num_sampled = torch.zeros(n, dtype=torch.int32, device=stream.device)
            busy(stream, self.step_time_s)
            stream.launch(_verify_and_commit, rs, self.texts, self.text_of_slot, idx, verify, num_sampled)
            stream.launch(self.sampled.append, num_sampled)
            outputs.append((stream.record(), order))
            width = int(self.widths[min(n, self.widths.size - 1)])
            if self.speculator is not None:
                batch = SimpleNamespace(
                    num_reqs=n, req_ids=[str(r) for r in order], idx_mapping=idx, idx_mapping_np=slots
                )
                out = self.speculator.propose(
                    batch, None, None, None, None, num_sampled, None, rs.last_sampled_tokens, None, None, None
                )
                stream.launch(_store_drafts, rs, idx, out, self.received)
            else:
                width = 0
            for r in order:
                width_prev[r] = width
            self.steps.append(StepRecord([str(r) for r in order], slots, width, [str(r) for r in finished]))
        if self.speculator is not None:
            self.speculator.on_requests_finished([str(r) for r in live])
        self.synchronize()
        return time.perf_counter() - t0

    def synchronize(self) -> None:
        if isinstance(self.stream, SimulatedStream):
            self.stream.synchronize()
        elif self.stream.device.type == "cuda":
            torch.cuda.synchronize(self.stream.device)
        if self.speculator is not None:
            self.speculator.pipeline.drain()
            self.speculator.pipeline.raise_if_failed()

    def close(self) -> None:
        if self.speculator is not None:
            self.speculator.pipeline.close()
        if isinstance(self.stream, SimulatedStream):
            self.stream.close()

    # -- the check ----------------------------------------------------------------------------------
    def reference_drafts(self) -> list[np.ndarray]:
        """What synchronous drafting sends at each step of the run, as ``[rows, k]`` with the fillers:
        a fresh ``SamStepper`` with the same settings, called after each step with the tokens the run
        committed (its rows in the runner's batch order)."""
        stepper = SamStepper(self.settings, self.max_model_len)
        texts = self.texts.cpu().numpy()
        length, rows = {}, np.zeros((self.max_rows, self.max_model_len), dtype=np.int32)
        sampled = iter(s.cpu().numpy() for s in self.sampled)
        out = []
        for record in self.steps:
            for r in sorted(record.finished_before):  # as SamSpeculator.on_requests_finished orders them
                stepper.finish(r)
                length.pop(r, None)
            if not record.req_ids:
                continue
            counts = next(sampled)
            lengths, sampled_ids = [], []
            for i, rid in enumerate(record.req_ids):
                r = int(rid)
                start = length.get(rid, len(self.w.prompts[r]))
                end = start + int(counts[i])
                rows[i, :end] = texts[r, :end]
                length[rid] = end
                lengths.append(end)
                sampled_ids.append(texts[r, start:end].tolist())
            lengths = np.array(lengths, dtype=np.int64)
            prompts = np.array([len(self.w.prompts[int(r)]) for r in record.req_ids], dtype=np.int32)
            drafts = stepper.step(record.req_ids, prompts, sampled_ids, lengths, rows, k=record.width)
            dense = np.repeat(rows[np.arange(len(lengths)), lengths - 1][:, None].astype(np.int64), self.k, axis=1)
            for i, d in enumerate(drafts):
                dense[i, : len(d)] = d
            out.append(dense)
        return out


def _finishes(at_step: int | None, t: int, committed: int, response_tokens: int) -> bool:
    return t >= at_step if at_step is not None else committed >= response_tokens


def _add_request(rs, text_of_slot, texts, slot: int, text: int, prompt_len: int) -> None:
    rs.all_token_ids.gpu[slot, :prompt_len] = texts[text, :prompt_len]
    rs.total_len.gpu[slot] = prompt_len
    rs.last_sampled_tokens[slot, 0] = texts[text, prompt_len - 1].to(torch.int64)
    text_of_slot[slot] = text


def _verify_and_commit(rs, texts, text_of_slot, idx, verify, num_sampled) -> None:
    """One engine step, vectorised: each row's drafts accepted while they match its text, then one more."""
    k = rs.draft_tokens.shape[1]
    start = rs.total_len.gpu[idx].to(torch.int64)
    ahead = torch.arange(k + 1, device=idx.device)
    truth = texts[text_of_slot[idx][:, None], (start[:, None] + ahead).clamp_max(texts.shape[1] - 1)]
    match = (rs.draft_tokens[idx] == truth[:, :k].to(torch.int64)) & (ahead[None, :k] < verify[:, None])
    count = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1) + 1
    keep = ahead[None, :] < count[:, None]
    positions = (start[:, None] + ahead).clamp_max(texts.shape[1] - 1)
    rows = idx[:, None].expand_as(positions)
    # no boolean indexing: on a GPU it waits for the device; positions past the count keep their value
    rs.all_token_ids.gpu[rows, positions] = torch.where(keep, truth, rs.all_token_ids.gpu[rows, positions])
    rs.total_len.gpu[idx] = (start + count).to(torch.int32)
    rs.last_sampled_tokens[idx, 0] = truth.gather(1, (count - 1)[:, None])[:, 0].to(torch.int64)
    num_sampled.copy_(count.to(torch.int32))


def _store_drafts(rs, idx, out, received) -> None:
    rs.draft_tokens[idx] = out
    received.append(out.clone())
