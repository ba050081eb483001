"""hatch-autotune: a Hatch build hook that turns CUDA kernel templates into wheels of
pre-tuned GPU binaries. See README.md; the hook itself is hatch_autotune.hatch.plugin."""

__version__ = "0.1.0"
