"""Kernels of an LLM-inference library, built with hatch-autotune (tests/test_headers.py)."""
