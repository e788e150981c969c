"""A script's --help, run as a user would, and the options its text names that it lacks
(tests/jobs and tests/bench)."""

from __future__ import annotations

import json
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
    return checked_help((done.returncode, done.stdout, done.stderr))


# One process imports what the scripts share (pyarrow, numpy, kprod: most of a script's
# start-up) once, then forks a child per script that runs it as ``python script --help``
# would (its directory first on sys.path, __name__ "__main__"), each child's output to
# files of its own.
_FORKED_HELPS = r"""
import json, os, runpy, sys, tempfile, traceback
import numpy, pyarrow, pyarrow.compute, spark_sink, spark_sink.producer
answers = {}
for script in sys.argv[1:]:
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.argv = [script, "--help"]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            code = 0
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        answers[script] = [os.waitstatus_to_exitcode(status), out.read(), err.read()]
print(json.dumps(answers))
"""


def help_texts(scripts: list[Path]) -> dict[str, tuple[int, str, str]]:
    """Each script's ``--help`` (exit status, stdout, stderr) by name, from one process
    (see _FORKED_HELPS); ``checked_help`` checks one as ``help_text`` does."""
    done = subprocess.run([sys.executable, "-c", _FORKED_HELPS, *map(str, scripts)], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    return {Path(script).name: (code, out, err) for script, (code, out, err) in answers.items()}


def checked_help(answer: tuple[int, str, str]) -> str:
    """The help's text, which must have exited 0 with a usage line and no traceback."""
    code, out, err = answer
    assert code == 0, err
    assert "usage:" in out, out
    assert "Traceback" not in err, err
    return out


def unknown_options(text: str) -> set[str]:
    """Options the help's text names that its usage line does not list."""
    usage, _, rest = text.partition("\n\n")
    listed = {"--help", *re.findall(r"--[a-z][a-z0-9-]*", usage)}
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)) - listed - OTHER_COMMANDS
