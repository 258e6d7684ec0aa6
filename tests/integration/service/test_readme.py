"""The README's examples run as written, and again the same: every code block is taken from
README.md (not copied here) and run in its order against a real Redis and a running
`stateworker serve`, all of them twice, and the second pass must print what the first did.

- A `console` block is a terminal session: each `$ ` line runs in the project's directory;
  the lines after it, up to the next `$ `, are what it must print (`…` stands for any text).
- A `python` block is a program run as it is; one that calls `worker.serve()` is a worker:
  it runs in the background until the end (then SIGTERM), and the blocks after it call it.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docblocks import fenced_blocks, matches, session
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[3]


def readme_blocks() -> list[tuple[str, str]]:
    return fenced_blocks("README.md")


class Background:
    """Processes the examples leave running (the service, a worker), stopped at the end."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, args: list[str], env: dict[str, str], ready: str) -> None:
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        self.processes.append(process)
        assert process.stdout is not None
        seen = []
        while True:  # each line within 30 s, until the one that says it serves
            readable, _, _ = select.select([process.stdout], [], [], 30)
            assert readable, f"{args} said nothing for 30 s: {seen}"
            line = process.stdout.readline()
            assert line, f"{args} exited: {seen}"
            seen.append(line)
            if ready in line:
                return

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            assert process.wait(timeout=30) == 0, process.args

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture
def background() -> Iterator[Background]:
    running = Background()
    try:
        yield running
    finally:
        running.close()


def test_the_readme_opens_with_the_two_commands() -> None:
    _kind, first = readme_blocks()[0]
    assert (ROOT / "README.md").read_text().startswith("```")
    assert first.splitlines() == ["./scripts/run", "./scripts/test"]


def test_every_readme_example_runs_as_written_and_again_the_same(
        redis_server: RedisServer, tmp_path: Path, background: Background) -> None:
    """Every block, in order, twice against one service: each pass prints what the README
    says, and the second prints exactly what the first did (the parts the README elides
    with `…`, such as times and revisions, aside)."""
    env = {**os.environ, "STATEWORKER_REDIS_URL": redis_server.url,
           "STATEWORKER_PREFIX": f"readme{uuid.uuid4().hex[:8]}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    background.start([sys.executable, "-m", "stateworker", "serve"], env, '"serving"')
    first = run_blocks(readme_blocks()[1:], env, tmp_path, background)
    second = run_blocks(readme_blocks()[1:], env, tmp_path, background)
    assert sum(kind == "console" for kind, _, _ in first) >= 2, first
    assert sum(kind == "python" for kind, _, _ in first) >= 3, first
    for once, again in zip(first, second, strict=True):
        assert once == again, "printed something else when run again"
    background.stop()


Transcript = list[tuple[str, str, list[str]]]  # (kind, command or block, what it printed)


def run_blocks(blocks: list[tuple[str, str]], env: dict[str, str], tmp_path: Path,
               background: Background) -> Transcript:
    """Run the console and python blocks; what each printed, a line elided by the README
    (`…`) as the README writes it."""
    transcript: Transcript = []
    for n, (kind, text) in enumerate(blocks):
        if kind == "console":
            for command, expected in session(text):
                transcript.append((kind, command, run_command(command, expected, env)))
        elif kind == "python":
            program = tmp_path / f"example_{n}.py"
            program.write_text(text)
            if "worker.serve()" in text:
                background.start([sys.executable, str(program)], env, "serving")
                transcript.append((kind, text, []))
            else:
                transcript.append((kind, text, run_program(program, text, env, tmp_path)))
    return transcript


def run_command(command: str, expected: list[str], env: dict[str, str]) -> list[str]:
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    printed = done.stdout.splitlines()
    assert len(printed) == len(expected) or not expected, (command, printed)
    for want, got in zip(expected, printed, strict=False):
        assert matches(want, got), (command, want, got)
    return expected or printed


def run_program(program: Path, text: str, env: dict[str, str], tmp_path: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (text, done.stdout, done.stderr)
    for want in re.findall(r"# prints (.*)$", text, re.MULTILINE):
        assert any(matches(want.strip(), line) for line in
                   done.stdout.splitlines()), (want, done.stdout)
    return done.stdout.splitlines()
