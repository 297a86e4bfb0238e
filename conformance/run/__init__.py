"""How a run goes: the harness that calls an implementation and compares, the pytest plugin, the runner, the
process boundary, time limits, gradients' sources and the implementation's declarations."""
