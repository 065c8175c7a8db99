"""Install jobctl on a cluster's login node, check it, and (internally) answer a laptop's requests.

`bootstrap CLUSTER` builds a wheel of this very jobctl here (`pip wheel --no-deps`), uploads it
over SFTP into <login.workdir>/wheels/, creates login.remote_python's venv if it is missing (when
it names one: .../bin/python), installs the wheel there with its dependencies, and checks that
the login node can run `sbatch --version` and that `remote_python -m jobctl --version` is this
version. Run it again after upgrading jobctl here: every remote command refuses to run when the
two versions differ.

`check CLUSTER` does the checks only. `agent ACTION` is what jobctl itself runs on the login
node (one JSON request on stdin, one JSON answer on stdout, jobctl.agent); it is not meant to be
typed by hand.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from jobctl.errors import EXIT_INTERNAL, JobctlError, SchedulerError, UsageError

HELP = "install this jobctl on a cluster's login node (bootstrap) and check it"
EPILOG = """examples:
  jobctl remote bootstrap big        # build, upload and install this jobctl for cluster `big`
  jobctl remote check big --json     # versions and sbatch on the login node

The cluster's inventory needs a `login:` block (host, user, key_file, known_hosts,
remote_python, workdir); host keys are checked strictly (add them with ssh-keyscan first).
exit codes: 0 ok, 2 bad input or the remote jobctl version differs, 4 SSH or the remote
            commands failed (pip install, sbatch --version)."""

PIP_TIMEOUT_S = 1200.0


def add_arguments(p) -> None:
    p.add_argument("action", choices=("bootstrap", "check", "agent"),
                   help="bootstrap: install jobctl there; check: versions and sbatch; agent: internal")
    p.add_argument("target", metavar="CLUSTER|ACTION", help="the cluster (an inventory with `login:`); "
                   "for agent: submit, status, cancel or requeue")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON on stdout")


def run(args) -> int:
    if args.action == "agent":
        return _agent(args.target)
    from jobctl import ui
    from jobctl.planning import load_inventory
    from jobctl.remote import Remote

    inv = load_inventory(args.target).value
    say = (lambda text: None) if args.as_json else ui.info
    with Remote.for_inventory(inv) as remote:
        out = bootstrap(remote, say) if args.action == "bootstrap" else {}
        out.update(check(remote, say))
    out = {"cluster": inv.name, "login": str(remote), **out}
    if args.as_json:
        ui.print_json(out)
    else:
        sys.stdout.write(f"{inv.name}: jobctl {out['remote_version']} with {out['remote_python']}; "
                         f"{out['sbatch']}\n")
    return 0


def build_wheel(dest: str) -> str:
    """A wheel of this jobctl (no dependencies) in `dest`; its path."""
    import subprocess
    from importlib.util import find_spec

    from jobctl import __version__
    from jobctl.workspace import REPO_ROOT

    if not (REPO_ROOT / "pyproject.toml").is_file():
        raise UsageError(f"cannot build a wheel: {REPO_ROOT} is not a jobctl source tree (jobctl was installed "
                         "from a wheel?)", hint="install jobctl from its source (pip install -e .) to bootstrap, "
                         f"or install jobctl {__version__} on the login node yourself")
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", dest, str(REPO_ROOT)]
    if find_spec("setuptools") and find_spec("wheel"):
        argv.insert(5, "--no-build-isolation")  # the build tools here: no download
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    wheels = [n for n in os.listdir(dest) if n.startswith("jobctl-") and n.endswith(".whl")]
    if p.returncode != 0 or len(wheels) != 1:
        raise SchedulerError(f"building the jobctl wheel failed: {(p.stderr or p.stdout).strip()[-800:]}")
    if f"-{__version__}-" not in wheels[0]:
        raise SchedulerError(f"the wheel built is {wheels[0]}, not version {__version__}")
    return os.path.join(dest, wheels[0])


def bootstrap(remote, say) -> dict:
    import posixpath
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jobctl-wheel-") as tmp:
        say("building the jobctl wheel")
        wheel = build_wheel(tmp)
        target = posixpath.join(remote.workdir, "wheels", os.path.basename(wheel))
        say(f"uploading {os.path.basename(wheel)} to {remote}:{target}")
        remote.put_file(wheel, target, mode=0o644)
    python = remote.python_argv()
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


def check(remote, say) -> dict:
    from jobctl import __version__

    res = remote.run(["sbatch", "--version"], idempotent=True, timeout_s=60)
    if res.rc != 0:
        raise SchedulerError(f"`sbatch --version` fails on {remote} (exit {res.rc}): "
                             f"{(res.stderr or res.stdout).strip()[-300:] or 'no output'}",
                             hint="jobctl submits with sbatch on the login node: check PATH and SLURM_CONF in "
                                  "the login shell there")
    sbatch = res.stdout.strip()
    from jobctl.remote_jobs import check_same_jobctl

    version = check_same_jobctl(remote)
    say(f"{remote}: jobctl {version} (the same build as here), {sbatch}")
    return {"remote_version": version, "local_version": __version__, "remote_python": shlex.join(remote.python_argv()),
            "sbatch": sbatch}


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


# --- the login node's side -------------------------------------------------------------------

def error_payload(e: JobctlError) -> dict:
    """The JSON shape of an error for a remote caller (remote.error_from_payload reads it)."""
    from jobctl.errors import ConfigError

    err = {"type": type(e).__name__ if type(e).__module__.startswith("jobctl") else "JobctlError",
           "exit_code": e.exit_code, "message": e.message, "hint": e.hint}
    if isinstance(e, ConfigError):
        err["issues"] = [{"file": i.file, "line": i.line, "key": i.key, "problem": i.problem} for i in e.issues]
    return {"error": err}


def _agent(action: str) -> int:
    """Read one request on stdin, answer on stdout; only the answer goes to stdout (what
    anything else prints, submitit's sbatch included, goes to stderr)."""
    import signal
    import traceback

    from jobctl.agent import handle

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped connection must not stop a submission halfway
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    code = 0
    try:
        try:
            request = json.loads(sys.stdin.read() or "{}")
        except ValueError as e:
            raise UsageError(f"the agent's request is not JSON: {e}") from None
        answer = handle(action, request)
    except JobctlError as e:
        answer, code = error_payload(e), e.exit_code
    except Exception as e:  # a bug: keep the traceback on stderr, answer in the usual shape
        traceback.print_exc()
        answer = {"error": {"type": "JobctlError", "exit_code": EXIT_INTERNAL,
                            "message": f"internal error on the login node: {type(e).__name__}: {e}", "hint": None}}
        code = EXIT_INTERNAL
    sys.stdout.flush()
    with os.fdopen(answer_fd, "w") as out:
        out.write(json.dumps(answer, default=str) + "\n")
    return code
