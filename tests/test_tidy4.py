"""Issue 55 (items 3 and 4): one list of settings keys, and the crashes found on the way."""

import os
import subprocess
import sys

import pytest

from mtpcli import report, runlog
from mtpcli.errors import EXIT_IO, UsageError
from test_ux_stats import fake


def test_compare_takes_a_superscript_two_as_a_profile_not_a_run_id():
    runlog.append_safely(**fake(0, "a"))
    with pytest.raises(UsageError, match="--compare ²: no matching runs"):
        report.show(compare=["²", "1"])


def test_by_source_leaves_out_a_run_whose_sources_is_not_an_object(capsys):
    runlog.append_safely(**fake(0, sources={"ngram": {"cycles": 2, "drafted": 4, "accepted": 2, "committed": 4,
                                                      "seconds": 1.0}}))
    runlog.append_safely(**fake(1, sources=["ngram"]))
    report.show(by="source", as_json=True)
    out, err = capsys.readouterr()
    assert '"ngram": {"runs": 1' in out and "run 2 skipped (its stats' sources is a JSON list, not an object)" in err


def test_profile_list_to_a_full_stdout_is_one_line_and_exit_io():
    with open("/dev/full", "wb") as full:  # (unbuffered: the print itself fails, inside the command)
        r = subprocess.run([sys.executable, "-m", "mtpcli", "profile", "list"], stdout=full, stderr=subprocess.PIPE,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == EXIT_IO and err == "mtpcli: error: stdout: No space left on device\n", err


def test_every_settings_key_is_recorded_and_filed_under_one_panel():
    from mtpcli.config import SCHEMA, Config
    from mtpcli.options import PANELS

    assert set(Config().record()) == {"profile", "law", *SCHEMA}  # the run log can replay any run
    filed = [k for keys in PANELS.values() for k in keys]
    assert sorted(filed) == sorted(SCHEMA)  # each key once, none under "Options"


def test_a_table_without_rows_prints_its_headers():  # (`prefill list` with nothing kept crashed)
    import io

    from mtpcli.tables import table

    out = io.StringIO()
    table(["model", "size"], [], out, tty=False)
    assert out.getvalue() == "model  size\n"
