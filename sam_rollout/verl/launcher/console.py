"""The training console: what a person reads while verl's trainer runs.

Everything the trainer prints, with its Ray workers' output (Ray sends it to the driver), goes to a log
file; the console shows the log's path, a header, one ``[sam] step N/M`` line per training step (from
``sam_rollout.verl.runtime.tracking``) with a progress bar, and the end: where the metrics are, or on failure the
log's last lines. ``SAM_CONSOLE=full`` (or the launcher's ``--verbose``) keeps everything on the console.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

CONSOLE_ENV = "SAM_CONSOLE"
FULL = "full"
TAIL_LINES = 30
BAR_WIDTH = 20
DEFAULT_LOG_ROOT = "~/sam-dapo-metrics"  # configs/ray/runtime_env.yaml's VERL_FILE_LOGGER_ROOT
STEP_LINE = re.compile(r"\[sam\] step (\d+): (.*)")
METRICS_FILE = re.compile(r"Creating file logger at (\S+)")
WANDB_RUN_DIR = re.compile(r"wandb: Run data is saved locally in (\S+)")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def full_console(verbose: bool = False) -> bool:
    return verbose or os.environ.get(CONSOLE_ENV, "").strip().lower() == FULL


def log_file(env: Mapping[str, str], project: str, experiment: str, now: float | None = None) -> Path:
    """Beside the run's metrics (verl's file logger): VERL_FILE_LOGGER_PATH's folder, or
    <VERL_FILE_LOGGER_ROOT>/<project>/; named after the run and the time it started."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    metrics = env.get("VERL_FILE_LOGGER_PATH")
    if metrics:
        path = Path(metrics).expanduser()
        return path.with_name(f"{path.stem}-{stamp}.log").resolve()
    root = Path(env.get("VERL_FILE_LOGGER_ROOT") or DEFAULT_LOG_ROOT).expanduser()
    return (root / project / f"{experiment}-{stamp}.log").resolve()


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def text_bar(done: int, total: int) -> str:
    """``[#####...............]``: a progress bar that needs no terminal."""
    filled = min(BAR_WIDTH, BAR_WIDTH * done // max(total, 1))
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


class TrainingConsole:
    """Reads the trainer's output line by line: every line to the log, the step lines to the console.

    On a terminal a tqdm bar stays under the step lines (redrawn as lines arrive, so its clock runs);
    elsewhere (a pipe, a Ray job's log) each step line carries a text bar and nothing is redrawn."""

    def __init__(self, log: TextIO, total_steps: int | None, out: TextIO | None = None):
        self.log, self.total, self.out = log, total_steps, out or sys.stdout
        self.started = time.monotonic()
        self.last_step: int | None = None
        self.metrics_file: str | None = None
        self.wandb_dir: str | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.bar = None
        if self.out.isatty():
            from tqdm import tqdm

            shape = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]" if total_steps else "{desc}: {n_fmt} [{elapsed}]"
            self.bar = tqdm(total=total_steps, desc="[sam] training", bar_format=shape, file=self.out)
        self._redrawn = 0.0

    def say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def feed(self, line: str) -> None:
        self.log.write(line)
        plain = ANSI_CODE.sub("", line).rstrip("\n")
        self.tail.append(plain)
        if m := STEP_LINE.search(plain):
            self.on_step(int(m.group(1)), m.group(2))
        elif m := METRICS_FILE.search(plain):
            self.metrics_file = m.group(1)
        elif m := WANDB_RUN_DIR.search(plain):
            self.wandb_dir = m.group(1)
        if self.bar is not None and time.monotonic() - self._redrawn > 1.0:
            self._redrawn = time.monotonic()
            self.bar.refresh()

    def on_step(self, step: int, summary: str) -> None:
        self.last_step = step
        bar = f" {text_bar(step, self.total)}" if self.total and self.bar is None else ""
        self.say(f"[sam] {self.step_of(step)}{bar} {duration(self.elapsed())}: {summary}")
        if self.bar is not None:
            self.bar.n = step  # a resumed run starts past 0
            self.bar.refresh()

    def step_of(self, step: int) -> str:
        return f"step {step}/{self.total}" if self.total else f"step {step}"

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, returncode: int, log_path: Path) -> None:
        if self.bar is not None:
            self.bar.close()
        if returncode == 0:
            reached = self.step_of(self.last_step) if self.last_step else "no training step"
            self.say(f"[sam] done in {duration(self.elapsed())}: {reached}")
            if self.metrics_file:
                self.say(f"metrics: {self.metrics_file}")
            if self.wandb_dir:
                self.say(f"wandb run: {self.wandb_dir}")
        else:
            self.say(f"[sam] training failed (exit {returncode}) after {duration(self.elapsed())}; the log ends:")
            for line in self.tail:
                self.say(f"  {line}")
        self.say(f"full log: {log_path}")


def run_logged(
    cmd: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    header: Iterable[str],
    total_steps: int | None,
    preamble: str = "",
) -> int:
    """Run ``cmd`` with its output in ``log_path`` and the training console on stdout; its exit status."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"full log: {log_path}", flush=True)
    for line in header:
        print(line, flush=True)
    child_env = {**env, "PYTHONUNBUFFERED": "1"}  # the step lines reach the console as they are printed
    with open(log_path, "w", buffering=1, errors="replace") as log:
        log.write(preamble)
        log.write("+ " + shlex.join(cmd) + "\n")
        console = TrainingConsole(log, total_steps)
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")  # fmt: skip
        try:
            for line in proc.stdout:
                console.feed(line)
            returncode = proc.wait()
        except KeyboardInterrupt:  # the trainer got the same Ctrl-C: let it stop, then say where it was
            returncode = stop(proc)
    console.finish(returncode, log_path)
    return returncode


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    try:
        return proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        return proc.wait()
