"""The command line: `posttrain` and its subcommands (`main.py` holds the parser and run / list /
show / verify / gc / ui; one module per family of the others), and `posttrain ui`. The only place
that parses arguments. It may import anything in `pipeline`; nothing imports it.
"""
