"""A script's --help, run as a user would, and the options its text names that it lacks
(tests/jobs and tests/bench)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.brokers import subprocess_env

# Options of other commands that a help text may name: spark-submit's.
OTHER_COMMANDS = {"--master", "--py-files", "--archives", "--packages", "--jars", "--deploy-mode"}


def help_text(script: Path | str, *command: str) -> str:
    """What ``python script --help`` (``python -m module --help`` for a module's name, with
    ``command`` before --help) prints; it must exit 0 with no traceback."""
    run = [str(script)] if isinstance(script, Path) else ["-m", script]
    done = subprocess.run([sys.executable, *run, *command, "--help"], env=subprocess_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def unknown_options(text: str) -> set[str]:
    """Options the help's text names that its usage line does not list."""
    usage, _, rest = text.partition("\n\n")
    listed = {"--help", *re.findall(r"--[a-z][a-z0-9-]*", usage)}
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)) - listed - OTHER_COMMANDS
