"""The command line: `posttrain` and its subcommands (`main.py` holds the parser and run / list /
show / verify / gc / ui; one module per family of the others), and `posttrain ui`. The only place
that parses arguments. A new command is a parser in its family's module (`tools.py`, `eval.py`,
`curate.py`, `cluster.py`), wired in `main.py`'s `build_parser`. It may import anything in
`pipeline`; nothing imports it.
"""
