"""Correctness tools: each runs a check (schemathesis over the OpenAPI document, batch invariance on a device,
lm-eval against its hf backend, a server's reliability under flood, kill and drain, cluster faults, a call's peak
CPU memory) and reports what failed. The tests import them for their small runs; `python -m bench <tool>` runs the
bigger ones against a server. Timing, workloads and reports stay in bench/, which may import this package, never
the reverse."""
