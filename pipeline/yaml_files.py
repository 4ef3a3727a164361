"""Reading recipe and profile YAML as untrusted input, before any of it is believed.

A recipe is a file someone hands you. Before a byte of it is parsed it must be a regular file (not a
directory, a FIFO that blocks forever, or /dev/zero that never ends) under MAX_BYTES, and UTF-8.
It is then scanned event by event, which costs time linear in its size, and refused when it uses
more than MAX_ALIASES aliases or more than MAX_NODES values once its aliases are expanded (an alias
bomb is small on disk and exponential once expanded by anything that walks it: 30 aliases, each
doubling the one before, make a billion values), or when it nests deeper than MAX_DEPTH (5,000
levels overflow the composer's recursion), or when an alias sits inside the value it names (a cycle,
which safe_load builds and nothing can walk). Only then is it composed and loaded with `safe_load`,
and an alias becomes a copy of its anchor, not the same object: an override of one stage that
shares a mapping with another through `<<: *anchor` must not change both. Duplicate keys, which
YAML silently resolves to the last value, are refused naming both lines. Every refusal is a
RecipeError naming the file (and line).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

MAX_BYTES = 1 << 20
MAX_ALIASES = 64
MAX_NODES = 1_000_000   # values once aliases are expanded; a 1 MB file of its own has at most ~260,000
MAX_DEPTH = 64


class YAMLRefused(ValueError):
    """The file cannot be read as a recipe; the message names it (and the line)."""


def read_text(path: Path, shown: Path) -> str:
    try:
        info = os.stat(path)
    except OSError as e:
        raise YAMLRefused(f"{shown}: cannot read it: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a file")
        raise YAMLRefused(f"{shown}: is {kind}, not a regular file")
    if info.st_size > MAX_BYTES:
        raise YAMLRefused(f"{shown}: {info.st_size} bytes; a recipe is at most {MAX_BYTES} bytes")
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YAMLRefused(f"{shown}: more than {MAX_BYTES} bytes; a recipe is at most that")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise YAMLRefused(f"{shown}:{line}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None


def check_events(text: str, shown: Path) -> None:
    """Refuse too many aliases, too many values once they are expanded, or too deep a nesting, in one
    linear pass over the parser's events (an alias counts the values its anchor stands for)."""
    aliases, values, too_many_at = 0, 0, None
    anchored: dict[str, int] = {}  # anchor -> the values it stands for, expanded
    opened: list[tuple[str | None, int]] = []  # per open mapping or sequence: its anchor, values before it
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YAMLRefused(f"{shown}:{event.start_mark.line + 1}: more than {MAX_ALIASES} aliases; "
                                  "a recipe has no use for that many (an alias bomb?)")
            if any(event.anchor == anchor for anchor, _ in opened):  # safe_load would build a cycle
                raise YAMLRefused(f"{shown}:{event.start_mark.line + 1}: *{event.anchor} refers to a value that "
                                  "contains it; a recipe cannot hold itself")
            values += anchored.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            if event.anchor:
                anchored[event.anchor] = 1
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(opened) == MAX_DEPTH:
                raise YAMLRefused(f"{shown}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
            opened.append((event.anchor, values))
            values += 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, before = opened.pop()
            if anchor:
                anchored[anchor] = values - before
        if too_many_at is None and values > MAX_NODES:
            too_many_at = event.start_mark.line + 1
    if too_many_at is not None:  # after the pass, so that a file with too many aliases is told that first
        raise YAMLRefused(f"{shown}:{too_many_at}: its aliases expand it past {MAX_NODES:,} values; "
                          "a recipe has no use for that many (an alias bomb?)")


def unshared(data):
    """The loaded YAML with every alias its own copy of the anchor's value (safe_load shares them)."""
    if isinstance(data, dict):
        return {k: unshared(v) for k, v in data.items()}
    if isinstance(data, list):
        return [unshared(v) for v in data]
    return data


def load_value(raw: str, shown: str):
    """A `--set key=value` value: YAML when it parses (checked like a file), else the string itself."""
    try:
        check_events(raw, shown)
        return unshared(yaml.safe_load(raw))
    except yaml.YAMLError:
        return raw


def load(path: Path, shown: Path) -> tuple[object, dict[tuple, str]]:
    """(data, {path tuple: "file:line"}) of a YAML file, checked as the module docstring says."""
    text = read_text(path, shown)
    try:
        check_events(text, shown)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = unshared(yaml.safe_load(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise YAMLRefused(f"{shown}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    where: dict[tuple, str] = {}
    duplicates: list[str] = []

    def walk(n, loc):
        where[loc] = f"{shown}:{n.start_mark.line + 1}"
        if isinstance(n, yaml.MappingNode):
            seen: dict = {}
            for k, v in n.value:
                if k.value in seen:
                    duplicates.append(f"{shown}:{k.start_mark.line + 1}: key {k.value!r} is given twice (first "
                                      f"at line {seen[k.value]}); YAML would keep only the last silently")
                seen.setdefault(k.value, k.start_mark.line + 1)
                walk(v, loc + (k.value,))
                where[loc + (k.value,)] = f"{shown}:{k.start_mark.line + 1}"
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, loc + (i,))
    if node is not None:
        walk(node, ())
    if duplicates:
        raise YAMLRefused("\n".join(duplicates))
    return data, where
