"""Names are data: the one sanitiser (jobctl.model.slug) and the job folder that refuses names
leading out of it (jobctl.store.folder). Expected values written out by hand from the rule:
runs of characters other than letters, digits, '.', '_', '-' become one '-'; leading and
trailing '-' and '.' go; at most 48 characters; "job" when nothing is left."""

import stat

import pytest

from jobctl.model import slug
from jobctl.store.folder import FolderError, JobFolder


@pytest.mark.parametrize(("name", "expected"), [
    ("llama70b", "llama70b"),
    ("../../etc/passwd", "etc-passwd"),
    ("run%j %x", "run-j-x"),
    ("a\nb\x1b[31m", "a-b-31m"),
    (".hidden", "hidden"),
    ("../..", "job"),
    ("ünïcode name", "n-code-name"),
    ("x" * 60, "x" * 48),
])
def test_slug(name, expected):
    assert slug(name) == expected


def test_a_job_folder_is_the_id_and_a_slug_owner_only_and_refuses_names_that_leave_it(tmp_path):
    a = JobFolder.create(tmp_path / "jobs", 1, "../../escape")
    b = JobFolder.create(tmp_path / "jobs", 2, "../../escape")  # same name, same second: another folder
    assert a.path == tmp_path / "jobs" / "1-escape" and b.path == tmp_path / "jobs" / "2-escape"
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o700
    written = a.write_text("notes.txt", "x")
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    for bad in ("../x", "/etc/passwd", "logs/../../x"):
        with pytest.raises(FolderError):
            a.file(bad)
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == ["1-escape", "2-escape"]
