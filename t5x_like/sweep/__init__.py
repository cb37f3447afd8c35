"""Paper-table sweeps: gin grids of (row x seed) cells, run as train + evaluate subprocesses.

`config` (the `sweep` / `sweep_scale` gin configurables), `grid` (sweep files -> cells),
`runner` (subprocesses, resume, --print_commands), `costs` (measured params/FLOPs), `paper`
(published scores), `report` (Markdown/JSON, Kendall τ), `plots` (matplotlib Agg). CLI:
`python -m t5x_like.sweep` (see `__main__`).
"""
