"""tests/bytecode.py writes pytest's rewritten test modules ahead of a run: pytest reads
them (with bytecode writing off, as on the CI machine, it would otherwise rewrite every
module in every xdist worker)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, AssertionRewritingHook, _read_pyc, get_cache_dir

from tests.bytecode import rewritten_modules, write_rewritten


def _names(code: types.CodeType) -> set[str]:
    """Every local name of ``code`` and of the functions it defines."""
    names = set(code.co_varnames)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def test_pytest_reads_the_rewritten_module_written_ahead(tmp_path: Path) -> None:
    source = tmp_path / "test_sample.py"
    source.write_text("def test_sample():\n    value = 1\n    assert value == 2\n")
    write_rewritten([source])
    code = _read_pyc(source, get_cache_dir(source) / f"test_sample{PYC_TAIL}")
    assert code is not None, "pytest does not read what tests/bytecode.py wrote"
    # The assertion as pytest rewrites it, not plain bytecode.
    assert any(name.startswith("@py_assert") for name in _names(code)), _names(code)
    # Changed since: pytest rewrites it again rather than run the stale code.
    source.write_text(source.read_text() + "\n\ndef test_other():\n    pass\n")
    assert _read_pyc(source, get_cache_dir(source) / f"test_sample{PYC_TAIL}") is None


def test_every_module_of_the_suite_pytest_rewrote_in_this_run_is_written_ahead(request: pytest.FixtureRequest) -> None:
    """(The plugins' packages that pytest rewrites too, in site-packages, cost nothing to
    measure, and a plugin given with -p, such as tests.cpu_profile, is the caller's: they
    are not written ahead.)"""
    tests = Path(__file__).parent
    given = set(request.config.option.plugins or ())
    rewritten = {Path(module.__file__) for name, module in list(sys.modules.items())
                 if isinstance(getattr(module, "__loader__", None), AssertionRewritingHook) and module.__file__
                 and Path(module.__file__).is_relative_to(tests) and name not in given}
    assert Path(__file__) in rewritten
    assert rewritten <= set(rewritten_modules()), rewritten - set(rewritten_modules())
