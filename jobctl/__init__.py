"""jobctl: plan, submit, watch and recover LLM training jobs on GPU clusters."""

__version__ = "0.1.0"
