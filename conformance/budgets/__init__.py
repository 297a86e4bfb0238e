"""How far a computed value may be from the exact one: error budgets derived by error analysis, one file a pass
(forward, backward, decoding) and the composites' budgets by propagation."""
