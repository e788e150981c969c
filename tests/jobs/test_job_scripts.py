"""Every script in jobs/ imports and answers --help without starting anything (no Java:
these run in ``make unit`` too), and its help names only options it has. Their real runs
are in tests/spark/test_jobs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_help import help_text, unknown_options

JOBS = Path(__file__).resolve().parents[2] / "jobs"
SCRIPTS = sorted(p.name for p in JOBS.glob("*.py") if not p.name.startswith("_"))


def test_every_job_is_listed() -> None:
    assert {"demo.py", "stream_to_kafka.py", "bench_sink.py"} <= set(SCRIPTS), SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_names_only_options_the_job_has(script: str) -> None:
    text = help_text(JOBS / script)
    assert unknown_options(text) == set(), text


def test_the_check_finds_an_option_a_help_names_but_lacks() -> None:
    text = "usage: x [-h] [--rows ROWS]\n\nrun with --rows, or --broker\n\noptions:\n  --rows ROWS\n"
    assert unknown_options(text) == {"--broker"}
