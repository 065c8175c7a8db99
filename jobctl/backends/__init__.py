"""Schedulers behind one protocol: Slurm (the only code that runs Slurm's commands) and local."""
