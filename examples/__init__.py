"""prepjit's example scripts; `examples.models` holds the model code they share with the benchmarks."""
