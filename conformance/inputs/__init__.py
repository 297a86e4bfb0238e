"""What the suite feeds an implementation: Hypothesis strategies, fixed inputs, and the profiles' settings."""
