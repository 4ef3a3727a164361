"""The README and docs/ stay true: every relative link and anchor resolves, and every `posttrain`
command they show parses with the real CLI (and, for a shipped recipe on `tiny` or `demo`,
validates), every `make` target exists. The stage-kind example is run by test_architecture."""

import functools
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def commands(page: Path) -> list[tuple[str, bool]]:
    """(command, whole): `posttrain ...` and `make ...` lines of its bash blocks (whole commands),
    and `posttrain ...` inline code (whole unless it only names a subcommand or has a <placeholder>)."""
    text = page.read_text()
    found = []
    for lang, block in FENCE.findall(text):
        if lang in ("bash", "sh", ""):
            for line in block.splitlines():
                line = re.sub(r"^\$ |^\.venv/bin/", "", line.strip())
                if line.startswith(("posttrain ", "make ")):
                    found.append((line, True))
    prose = FENCE.sub("", text)
    for m in re.finditer(r"`((?:\.venv/bin/)?posttrain [^`]+)`", prose):
        found.append((m.group(1), len(argv_of(m.group(1))) > 1 and "<" not in m.group(1)))
    return found


def argv_of(command: str) -> list[str]:
    command = re.sub(r"\s+#.*$", "", command)  # a trailing comment
    command = re.sub(r"\[[^\]]*\]", "", command)  # optional parts, as usage lines write them
    # a one-letter placeholder for a number (`--keep-runs N`) stands for one
    return ["1" if re.fullmatch(r"[A-Z]", a) else a for a in shlex.split(command.removeprefix(".venv/bin/"))[1:]]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(resolved), f"{page.name}: link to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_example_parses_and_shipped_recipes_validate(page, capsys):
    from pipeline.cli.main import build_parser
    from pipeline.recipe import list_recipes, load_recipe

    parser, recipes = build_parser(), set(list_recipes())
    make_targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    shown = commands(page)
    for command, whole in shown:
        argv = argv_of(command)
        if command.startswith("make "):
            assert set(argv) <= make_targets, f"{page.name}: {command}: no such make target"
            continue
        if not whole:  # `posttrain eval` in a sentence: the subcommand exists
            assert argv[0] in subcommands, f"{page.name}: `{command}`: no such subcommand"
            continue
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: `{command}` does not parse: {capsys.readouterr().err.strip()}")
        if args.command in ("run", "validate") and args.recipe in recipes and args.profile in ("tiny", "demo") \
                and not any("models:/" in s for s in args.set):
            load_recipe(args.recipe, args.profile, args.set)  # raises RecipeError naming what is wrong
    if page.name in ("README.md", "using.md"):
        assert shown, f"{page.name} shows no command"
