"""Builds walstream's one compiled module, the decoder's tuple encoder (optional).

Everything else is in pyproject.toml. Without a C compiler or Python's headers the
build goes on without it and walstream uses the same encoder in Python (slower);
bin/setup installs both from Debian.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # building without the declared build requirements
    extensions = []
else:
    extensions = cythonize(
        [
            Extension(
                "walstream.values._tuples", ["walstream/values/_tuples.pyx"], optional=True
            )
        ],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )

setup(ext_modules=extensions)
