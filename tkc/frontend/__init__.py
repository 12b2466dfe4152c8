"""Python → tile IR: the `@tkc.kernel` decorator and the AST walker behind it."""

from tkc.frontend.kernel import Helper, Kernel, build_module, helper, kernel

__all__ = ["Helper", "Kernel", "build_module", "helper", "kernel"]
