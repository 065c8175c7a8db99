"""Installing this jobctl on a cluster's login node, and checking that it is the same build.

`bootstrap` packages the running jobctl as a wheel (from its installed files and distribution
metadata: it works from a wheel install as from a checkout), uploads it over SFTP into
<login.workdir>/wheels/, creates login.remote_python's venv if it is missing (when it names
one: .../bin/python), installs the wheel there with its dependencies, then `check`s that the
login node runs `sbatch --version` and this very build of jobctl.
"""

from __future__ import annotations

import os
import shlex

from jobctl import __version__
from jobctl.errors import SchedulerError, UsageError
from jobctl.remote.client import check_same_jobctl, python_argv

PIP_TIMEOUT_S = 1200.0


def build_wheel(dest: str) -> str:
    """A wheel of the jobctl that is running (no dependencies) in `dest`; its path.

    Assembled from the installed package's own files and its distribution metadata, not built
    from a source tree: it works from a wheel install as from a checkout, and it holds exactly
    the files the source digest covers (a build folder left from an earlier layout cannot add
    stale modules)."""
    import base64
    import hashlib
    import importlib.metadata
    import zipfile
    from pathlib import Path

    import jobctl

    try:
        dist = importlib.metadata.distribution("jobctl")
        meta = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
        entry_points = dist.read_text("entry_points.txt")
    except importlib.metadata.PackageNotFoundError:
        meta = entry_points = None
    if not meta or f"\nVersion: {__version__}\n" not in meta:
        raise UsageError("cannot package this jobctl: it is not installed as a distribution (no metadata of "
                         f"jobctl {__version__} found)", hint="install it (pip install . or pip install -e .), "
                         f"or install jobctl {__version__} on the login node yourself")
    pkg = Path(jobctl.__file__).resolve().parent
    name = f"jobctl-{__version__}"
    wheel = os.path.join(dest, f"{name}-py3-none-any.whl")
    files = [(f"jobctl/{p.relative_to(pkg).as_posix()}", p.read_bytes()) for p in sorted(pkg.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")]
    files += [(f"{name}.dist-info/METADATA", meta.encode()),
              (f"{name}.dist-info/WHEEL", b"Wheel-Version: 1.0\nGenerator: jobctl\nRoot-Is-Purelib: true\n"
                                          b"Tag: py3-none-any\n"),
              (f"{name}.dist-info/entry_points.txt",
               (entry_points or "[console_scripts]\njobctl = jobctl.cli:run\n").encode())]
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{name}.dist-info/RECORD,,")
        z.writestr(f"{name}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def install(remote, say) -> dict:
    """Package, upload and install this jobctl on the login node (its venv made if missing)."""
    import posixpath
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jobctl-wheel-") as tmp:
        say("building the jobctl wheel")
        wheel = build_wheel(tmp)
        target = posixpath.join(remote.workdir, "wheels", os.path.basename(wheel))
        say(f"uploading {os.path.basename(wheel)} to {remote}:{target}")
        remote.files.put_file(wheel, target, mode=0o644)
    python = python_argv(remote)
    probe = remote.run([*python, "-c", "import sys; print(sys.prefix)"], idempotent=True, timeout_s=120)
    created = None
    if probe.rc != 0:
        venv = _venv_dir(python)
        if venv is None:
            raise SchedulerError(f"`{shlex.join(python)}` does not run on {remote}: "
                                 f"{(probe.stderr or probe.stdout).strip()[-300:] or f'exit code {probe.rc}'}",
                                 hint="set login.remote_python to a python there (a venv path .../bin/python is "
                                      "created by bootstrap)")
        say(f"creating the venv {venv} on {remote}")
        _ok(remote, ["python3", "-m", "venv", venv], "creating the venv", timeout_s=300)
        created = venv
    say(f"installing {posixpath.basename(target)} and its dependencies with `{shlex.join(python)} -m pip` "
        "(this can take a minute)")
    _ok(remote, [*python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", target],
        "pip install", timeout_s=PIP_TIMEOUT_S)
    # the same version number from a newer build: replace the package itself too
    _ok(remote, [*python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--force-reinstall",
                 "--no-deps", target], "pip install --force-reinstall", timeout_s=PIP_TIMEOUT_S)
    return {"wheel": target, "created_venv": created}


def check(remote, sbatch_version: str, say) -> dict:
    """The login node runs this very jobctl (version and source digest); what it reports."""

    version = check_same_jobctl(remote)
    say(f"{remote}: jobctl {version} (the same build as here), {sbatch_version}")
    return {"remote_version": version, "local_version": __version__, "remote_python": shlex.join(python_argv(remote)),
            "sbatch": sbatch_version}


def _venv_dir(python: list[str]) -> str | None:
    import posixpath

    if len(python) == 1 and posixpath.basename(posixpath.dirname(python[0])) == "bin" \
            and posixpath.basename(python[0]).startswith("python"):
        return posixpath.dirname(posixpath.dirname(python[0]))
    return None


def _ok(remote, argv: list[str], what: str, timeout_s: float) -> None:
    res = remote.run(argv, idempotent=True, timeout_s=timeout_s)
    if res.rc != 0:
        raise SchedulerError(f"{what} failed on {remote} (exit {res.rc}): "
                             f"{(res.stderr or res.stdout).strip()[-800:] or 'no output'}")
