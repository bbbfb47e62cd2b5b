"""The C core prototype of issue #27 (benchmarks/prototypes/memcore) still answers as memory://.

docs/design.md's "Compiled core" decision rests on that prototype's figures.
It is not shipped, but it reads the memory store's record layout and error
helpers, so a change to the store can leave it answering differently, and
the figures could no longer be rerun. Here it is built with gcc, as
benchmarks/bench_memcore_ceiling.py builds it, and checked against the pure
store: random operation sequences answered alike (results, snapshots'
``__dict__``s, exceptions with their facts; one-unit and group claims), again
with the collector run at every allocation, 8 threads racing that grant each
unit once, and 8 threads racing group claims that never share a unit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from layout import ROOT

CHECK = ROOT / "benchmarks" / "prototypes" / "memcore" / "check_memcore.py"


def _check(core: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, str(CHECK), "--core", str(core), *args],
        env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return run.stdout


def test_the_c_core_answers_as_the_memory_store(tmp_path: Path) -> None:
    out = _check(tmp_path, "--sequences", "400", "--races", "3")
    assert "400 sequences, 24000 operations: the C core answered as MemoryStore" in out
    assert out.count("each granted once") == 3
    assert "group -> result:True:new:confirmed" in out  # group claims were compared too
    assert out.count("no slot in two, all freed") == 3  # and raced


def test_the_c_core_keeps_its_references_when_the_collector_runs_at_every_allocation(
    tmp_path: Path,
) -> None:
    out = _check(tmp_path, "--sequences", "40", "--gc-stress", "--races", "0")
    assert "the C core answered as MemoryStore" in out
