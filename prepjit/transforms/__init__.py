"""Function transformations users call on functions: `pj.grad` / `value_and_grad` / `vjp` and `pj.vmap`, on
traced values inside a prepared function and eagerly (prepared per call) on NumPy arguments."""
