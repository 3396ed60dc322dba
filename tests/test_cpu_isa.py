"""testkit.cpu_isa: a command run as on a CPU without AVX-512 sees one, in every process it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import require_module

from testkit.cpu_isa import AVX2_CAPS, AVX2_SITE, host_has_avx512, isa_env, kernel_libraries_for

REPO = AVX2_SITE.parents[1]


def test_host_leaves_the_environment_as_it_is():
    env = {"PYTHONPATH": "/x", "OTHER": "1"}
    assert isa_env("host", env) == env


def test_avx2_caps_the_libraries_and_puts_the_site_first():
    env = isa_env("avx2", {"PYTHONPATH": "/x"})
    assert {k: env[k] for k in AVX2_CAPS} == AVX2_CAPS
    assert env["PYTHONPATH"].split(":") == [str(AVX2_SITE), "/x"]


def test_an_unknown_isa_is_refused():
    with pytest.raises(ValueError, match="isa must be one of"):
        isa_env("avx512")


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "testkit.cpu_isa", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "usage:"),
        (("sse4",), "usage:"),
        (("avx2", "--"), "no command given"),
        (("avx2", "no-such-cmd-x"), "no such command"),
    ],
)
def test_bad_command_lines_get_a_clear_message(args, message):
    r = _run(*args)
    assert r.returncode != 0 and message in r.stderr


def test_a_script_and_the_processes_it_spawns_see_no_avx512(tmp_path):
    require_module("torch")
    script = tmp_path / "probe.py"
    script.write_text(
        "import multiprocessing as mp, torch\n"
        "def probe(_):\n"
        "    import torch\n"
        "    return torch.cpu._is_avx512_supported(), torch.backends.cpu.get_cpu_capability()\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context('spawn').Pool(1) as pool:\n"
        "        print(probe(0), pool.map(probe, [0])[0])\n"
    )
    r = _run("avx2", str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "(False, 'AVX2') (False, 'AVX2')"


def test_the_expected_kernel_libraries_follow_the_isa():
    assert kernel_libraries_for("avx2") == ("_C_AVX2",)
    assert kernel_libraries_for("host") == (("_C", "_C_AVX512") if host_has_avx512() else ("_C_AVX2",))
