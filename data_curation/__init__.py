"""Data sources, filters and decontamination. Every source yields rows in one schema (`schema.py`).

A new data source is a module in `sources/` with a `NAME` and a `rows(split, n, seed, ...)`
generator, and one entry in `MODULES` (`sources/__init__.py`); recipes then name it as
`data: {source: NAME}`. Imports only the toolkit below it.
"""
