"""Throughput and memory benchmarks of sorjax against torch and flax.

    python -m benchmarks.run            # the full grid (long)
    python -m benchmarks.run --quick    # every target, ~13 minutes on 2 cores

Every framework runs in its own worker process (`jax_worker`, `torch_worker`)
and the driver (`run`, which imports neither) times the contenders of a group
in interleaved rounds, A B C A B C ..., so that ratios compare runs made
under the same machine load. Benchmarks are not tests: the test suite runs
only `tests/test_benchmarks_smoke.py`, a tiny run of the same harness.
"""
