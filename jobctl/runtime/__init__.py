"""What runs inside the job on the nodes: the runner, the GPU sampler, failure classification, hooks."""
