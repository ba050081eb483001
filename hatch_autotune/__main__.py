"""`python -m hatch_autotune`: the same command as the `hatch-autotune` script."""

from .cli import main

raise SystemExit(main())
