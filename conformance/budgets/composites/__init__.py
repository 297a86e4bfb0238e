"""The composites' budgets (layers, the whole model): the elementary budgets propagated through their chains, one file a
pass."""
