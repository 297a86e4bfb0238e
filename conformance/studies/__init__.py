"""The suite studied on implementations with known answers: mutants, an honest low-precision implementation, false
alarms on correct ones, PyTorch's tolerances, and the zoo of adapters."""
