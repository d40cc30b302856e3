"""How `callqa` answers a mistyped command line: one line naming what is wrong and the command's --help, exit
status 2 (click's, for usage errors), with no "--verbose for details" hint (there is nothing more to show);
the root's ``--verbose`` taken after a sub-command too. A real process, as a newcomer runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def callqa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_bad_option_value_is_a_usage_error_naming_it() -> None:
    done = callqa("bench", "live", "--calls", "0")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--calls and --workers must be >= 1" in done.stderr and "`callqa bench live --help`" in done.stderr
    assert "for details" not in done.stderr
    unknown = callqa("bench", "check", "--only", "nonsense")
    assert unknown.returncode == 2 and "unknown checks nonsense (known: library-numbers" in unknown.stderr


def test_verbose_after_the_sub_command_is_the_root_s_option() -> None:
    done = callqa("bench", "gateway", "--legs", "1", "--verbose")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "No such option" not in done.stderr and "--legs >= 2 each" in done.stderr
    typo = callqa("bench", "gateway", "--verbos")
    assert typo.returncode == 2 and "No such option: --verbos" in typo.stderr
