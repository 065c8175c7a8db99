"""Measurement code that checks jobctl's models: it is run by tests/ and benchmarks/, never by jobctl.

Modules (each imports its heavy dependencies itself; this package imports nothing):
  caching_allocator    a model of PyTorch's CUDA caching allocator (pure Python)
  alloc_recorder       records every storage a PyTorch step makes, for that model (torch)
  torch_reference      tiny reference Llama/GPT models and what they hold (torch)
  megatron_functional  Megatron-LM's functional tests' memory as jobctl Workloads and Plans
  published_throughput published training throughputs as jobctl Workloads, Plans and step times

`jobctl` itself never imports this package (a contract in pyproject.toml's [tool.importlinter]):
torch and the frameworks are test dependencies, and `jobctl plan` stays fast.
"""
