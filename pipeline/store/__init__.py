"""The home ($POSTTRAIN_HOME) and what is recorded in it: paths and environment, locks, run records,
garbage collection, the earnability-probe cache, checks of published outputs, the `posttrain ui`
server record. The bottom of `pipeline`: imports nothing of it, only the toolkit.
"""
