"""Command-line flags generated from a pydantic model's fields, so a CLI never copies a config by
hand: `--field-name` per scalar field, `choices` from a Literal, `--flag/--no-flag` for booleans,
`required` when the field has no default, the field's description as help."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Literal

from pydantic import BaseModel


def _scalar(annotation):
    """(python type, choices) for a CLI-able annotation, or None for lists, dicts and models."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar(options[0]) if len(options) == 1 else None
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), list(choices)
    if annotation in (bool, int, float, str):
        return annotation, None
    return None


def add_model_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], skip: set[str]) -> None:
    for name, field in model.model_fields.items():
        kind = _scalar(field.annotation)
        if name in skip or kind is None:
            continue
        python_type, choices = kind
        flag = "--" + name.replace("_", "-")
        help_text = field.description or ""
        if python_type is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            default = "required" if field.is_required() else f"default {field.default!r}"
            parser.add_argument(flag, dest=name, type=python_type, choices=choices, default=None,
                                required=field.is_required(), help=f"{help_text} ({default})".strip())


def model_fields_from(args: argparse.Namespace, model: type[BaseModel]) -> dict:
    """The flags the user gave, as field values for `model`."""
    return {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
