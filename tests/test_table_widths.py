"""Tables that hold at any width (issue 28): `history` and `status` of a history with failures,
an attempt chain, a long recipe name, a remote cluster, a sweep and a refused submission
(tests/ui_history.py), at 60, 80 and 120 columns: one line per job, nothing past the width,
no cell cut to one character, the reason and the chain never cut; `--wide` shows every cell in
full; and the column fitting itself (jobctl/ui/columns.py) on hand-made tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ui_history

from jobctl import cli
from jobctl.store.history import History
from jobctl.ui.columns import Column, fit, lines

ROOT = Path(__file__).resolve().parent.parent

CUT_TO_ONE = re.compile(r"(^|\s)\S…(\s|$)", re.M)


@pytest.fixture()
def ids(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TZ", "UTC")
    with History.open(clock=ui_history.start) as h:
        return ui_history.fill(h)


def show(capsys, monkeypatch, width: int, *argv) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return out.splitlines()


@pytest.mark.parametrize("command", ["history", "status"])
@pytest.mark.parametrize("width", [60, 80, 120])
def test_one_line_per_job_within_the_width(capsys, monkeypatch, ids, command, width):
    out = show(capsys, monkeypatch, width, command)
    jobs = sum(len(v) for v in ids.values())
    assert len(out) == 3 + jobs  # title, header, rule, one line per job: nothing wrapped
    assert all(len(line) <= width for line in out), [line for line in out if len(line) > width]
    assert not CUT_TO_ONE.search("\n".join(out))
    header = out[1].split()
    assert header[:2] == ["id", "recipe"] and {"state", "reason", "attempts"} <= set(header)
    rows = {int(m[1]): line for line in out if (m := re.match(r"#(\d+) ", line))}
    a, b, c = ids["chain"]
    assert f"1 of #{a}" in rows[a] and f"2 of #{a}" in rows[b] and f"3 of #{a}" in rows[c]
    assert "CUDA_OOM" in rows[a] and "CUDA_OOM" in rows[b]
    assert "signal 9" in rows[ids["signal"][0]] and "SUBMIT_FAILED" in rows[ids["never"][0]]
    assert "NODE_FAIL" in rows[ids["remote"][0]]


def test_columns_go_in_their_stated_order(capsys, monkeypatch, ids):
    # wider terminals keep more: 120 all but the scheduler's id... 60 the essentials only
    headers = {w: show(capsys, monkeypatch, w, "history")[1].split() for w in (60, 80, 100, 200)}
    assert headers[200] == ["id", "sched", "recipe", "cluster", "state", "N", "submitted", "elapsed", "reason",
                            "attempts"]
    assert "sched" not in headers[100] and "N" not in headers[80] and "cluster" in headers[80]
    assert headers[60] == ["id", "recipe", "state", "reason", "attempts"]
    for narrow, wide in ((60, 80), (80, 100), (100, 200)):
        assert set(headers[narrow]) <= set(headers[wide])


def test_wide_shows_every_cell_in_full_even_through_a_pipe(capsys, monkeypatch, ids):
    out = show(capsys, monkeypatch, 80, "history", "--wide")
    text = "\n".join(out)
    a, b, c = ids["chain"]
    assert len(out) == 3 + sum(len(v) for v in ids.values())  # still one line per job, however long
    assert f"#{a} → #{b} → #{c}" in text and ui_history.LONG_RECIPE in text and ui_history.REMOTE_CLUSTER in text
    assert "123456789_12" in text and "sbatch: error: Batch job submission failed: Invalid account" in text
    assert "…" not in text


# --- the fitting itself -----------------------------------------------------------------------

def test_a_table_that_fits_is_left_alone():
    cols = [Column("a"), Column("bb", right=True)]
    keep, widths = fit(cols, [["xyz", "1"], ["x", "22"]], 80)
    assert keep == [0, 1] and widths == [3, 2]
    # "a" padded to 3, a space, "bb"; "xyz", a space, "1" right-aligned in 2
    assert [t.plain for t in lines(cols, [["xyz", "1"]], 80, rule=False)] == ["a   bb", "xyz  1"]


def test_steps_narrow_only_as_far_as_needed_then_drop():
    cols = [Column("name"), Column("where"), Column("why", min_width=4)]
    rows = [["a" * 20, "b" * 10, "c" * 10]]  # natural width 20 + 1 + 10 + 1 + 10 = 42
    steps = [(0, 8), (1, None)]
    assert fit(cols, rows, 40, steps) == ([0, 1, 2], [18, 10, 10])  # 2 characters off the name, no more
    assert fit(cols, rows, 30, steps) == ([0, 1, 2], [8, 10, 10])  # the name at its step's width
    assert fit(cols, rows, 25, steps) == ([0, 2], [8, 10])  # then "where" goes whole
    # past the steps, the default: narrow to min_width, never below
    assert fit(cols, rows, 10, steps) == ([0, 2], [8, 4])


def test_cut_cells_end_in_an_ellipsis_and_keep_their_style():
    from rich.text import Text

    cols = [Column("x", min_width=5), Column("y")]
    out = lines(cols, [[Text("abcdefgh", style="red"), "z"]], 7, rule=False)
    assert out[1].plain == "abcd… z"
    assert out[1].spans and out[1].spans[0].style == "red"
