"""Benchmarks: attention throughput as a fraction of the machine's own matrix-multiply ceiling.

Not built yet (see the benchmarks issue); ``make bench`` will run them.
"""
