"""Build of isan's one compiled part, the engine's kernels (pyproject.toml holds everything else).

The extension is optional: where it cannot be compiled (no C compiler, or another platform), the
install still succeeds and the engine runs its numpy twins, saying so once
(``isan.engine.kernels.native_status()``).
"""

import sys

from setuptools import Extension, setup

# The extension's C files, one concept each (engine/kernels/csrc/native.h lists them): the
# instruction-set variants, the thread team, the three kernels and the Python bindings.
CSRC = "engine/kernels/csrc/"
sources = [CSRC + f for f in ("bindings.c", "isa.c", "team.c", "rows.c", "streams.c", "jumps.c", "seq.c")]
depends = [CSRC + f for f in ("native.h", "kern_impl.h", "team.h", "queues.h", "jobs.h", "rows.h", "trie.h")]

args = ["-O3", "-pthread", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-unknown-pragmas"]
if sys.platform == "win32":  # pragma: no cover - MSVC does not take GCC flags
    args = ["/O2"]

setup(
    ext_modules=[
        Extension(
            "isan.engine.kernels._native",
            sources=sources,
            depends=depends,
            extra_compile_args=args,
            libraries=["m"] if sys.platform != "win32" else [],
            extra_link_args=["-pthread"] if sys.platform != "win32" else [],
            optional=True,
        )
    ]
)
