"""Install jobctl on a cluster's login node, check it, and (internally) answer a laptop's requests.

`bootstrap CLUSTER` packages this very jobctl as a wheel (from its installed files), uploads it
over SFTP into <login.workdir>/wheels/, creates login.remote_python's venv if it is missing (when
it names one: .../bin/python), installs the wheel there with its dependencies, and checks that
the login node can run `sbatch --version` and that `remote_python -m jobctl --version` is this
version. Run it again after upgrading jobctl here: every remote command refuses to run when the
two versions differ.

`check CLUSTER` does the checks only. `agent ACTION` is what jobctl itself runs on the login
node (one JSON request on stdin, one JSON answer on stdout, jobctl.jobs.agent); it is not meant to be
typed by hand.
"""

from __future__ import annotations

from jobctl import ui
from jobctl.jobs.agent import serve
from jobctl.planning import load_inventory
from jobctl.planning.clusters import remote_setup

HELP = "install this jobctl on a cluster's login node (bootstrap) and check it"
EPILOG = """examples:
  jobctl remote bootstrap big        # build, upload and install this jobctl for cluster `big`
  jobctl remote check big --json     # versions and sbatch on the login node

The cluster's inventory needs a `login:` block (host, user, key_file, known_hosts,
remote_python, workdir); host keys are checked strictly (add them with ssh-keyscan first).
exit codes: 0 ok, 2 bad input or the remote jobctl version differs, 5 SSH or the remote
            commands failed (pip install, sbatch --version)."""


def add_arguments(p) -> None:
    p.add_argument("action", choices=("bootstrap", "check", "agent"),
                   help="bootstrap: install jobctl there; check: versions and sbatch; agent: internal")
    p.add_argument("target", metavar="CLUSTER|ACTION", help="the cluster (an inventory with `login:`); "
                   "for agent: submit, status, cancel or requeue")
    p.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON on stdout")


def run(args) -> int:
    if args.action == "agent":

        return serve(args.target)

    inv = load_inventory(args.target).value
    say = (lambda text: None) if args.as_json else ui.info
    out = remote_setup(inv, install=args.action == "bootstrap", say=say)
    if args.as_json:
        ui.print_json(out)
    else:
        ui.line(f"{inv.name}: jobctl {out['remote_version']} with {out['remote_python']}; {out['sbatch']}")
    return 0
