"""The planner: pure code that turns a recipe and a partition into a plan that fits.

Nothing here reads files, the clock, the environment or the network, or prints.
"""
