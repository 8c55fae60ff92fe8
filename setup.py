"""Build of isan's one compiled part, the engine's kernels (pyproject.toml holds everything else).

The extension is optional: where it cannot be compiled (no C compiler, or another platform), the
install still succeeds and the engine runs its numpy twins, saying so once
(``isan.engine.kernels.native_status()``).
"""

import sys

from setuptools import Extension, setup

args = ["-O3", "-pthread", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-unknown-pragmas"]
if sys.platform == "win32":  # pragma: no cover - MSVC does not take GCC flags
    args = ["/O2"]

setup(
    ext_modules=[
        Extension(
            "isan.engine.kernels._native",
            sources=["engine/kernels/_native.c"],
            depends=["engine/kernels/kern_impl.h"],
            extra_compile_args=args,
            libraries=["m"] if sys.platform != "win32" else [],
            extra_link_args=["-pthread"] if sys.platform != "win32" else [],
            optional=True,
        )
    ]
)
