"""The inspection stage: what the `hatch-autotune` command shows, compares and reports.

- `readers`: strict readers of what a user has at hand (project, lock file, wheel, table,
  generated or installed package) into the model; `load_source` tells which one it is.
- `model`: the view model (`Row`: one kernel / types / arch / bucket choice; `Source`: the
  rows of one input), `combine`, `provenance_lines`.
- `diff`: what changed between two sources, and which changes are regressions.
- `fmt`: how configs, buckets, times and sizes are written.
- `report`: the HTML/PNG report.
- `errors`: `CliError`, bad input shown as one line.
"""
