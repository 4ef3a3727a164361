"""Data sources, filters and decontamination. Every source yields rows in one schema (see `schema`)."""
