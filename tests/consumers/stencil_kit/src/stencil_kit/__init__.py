"""stencil-kit: box filters and a transpose, pre-tuned by hatch-autotune (a test consumer)."""
