"""`python -m jobctl` runs the command line."""

from jobctl.cli import main

raise SystemExit(main())
