"""example_pkg: a library whose GPU kernels were pre-tuned by hatch-autotune at build time.

`from example_pkg import kernels` gives the generated module (built into the wheel)."""

__version__ = "0.1.0"
