"""tkc: a Python compiler for ThunderKittens-style tile programs on NVIDIA GPUs.

    import tkc
    from tkc.lang import *

    @tkc.kernel(warps=4)
    def scale(X: gl[f32, 2], Y: gl[f32, 2]):
        i, j, _ = block_idx()
        x = load(X, (i * 4 + warp_id(), j), rt[f32, 16, 64])
        store(Y, x * 2.0, (i * 4 + warp_id(), j))

    print(scale.build())                     # tile IR
    scale.interpret(x, y, grid=(m // 64, n // 64, 1))   # run on the CPU
"""

from tkc._version import __version__
from tkc.errors import TkcError
from tkc.frontend import Kernel, build_module, helper, kernel
from tkc.lang import *  # noqa: F403  (the kernel language is part of the public API)
from tkc.lang import __all__ as _lang_all
from tkc.runtime.autotune import autotune

func = helper  # `@tkc.func` marks a helper that kernels call (inlined)

__all__ = ["__version__", "TkcError", "Kernel", "autotune", "build_module", "kernel", "func", "helper", *_lang_all]
