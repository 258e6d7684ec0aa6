""""Did you mean": the nearest name (errors.nearest, difflib) to a misspelt command, choice,
option or function, instead of the whole list of them; and a misspelt option of a
subcommand refused with that subcommand's usage, not the top level's."""

from __future__ import annotations

import argparse
from typing import Any

from stateworker.errors import StateError, UnknownFunction, nearest, shown
from stateworker.keys import STATE_SERVICE
from stateworker.specs import NATIVE


class Parser(argparse.ArgumentParser):
    """The parser of every level of the tree (subparsers are made of their parent's class):
    a value that is not one of its choices is refused with the nearest one, and a command's
    refusal does not list every command."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(choice) for choice in action.choices]
        near = nearest(str(value), choices)
        hint = f"did you mean {shown(near)}?" if near is not None else None
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(action, f"unknown command {shown(value)}; " + (
                hint or f"`{self.prog} --help` lists them"))
        raise argparse.ArgumentError(action, f"invalid choice: {shown(value)}; " + (
            hint or f"choose from {', '.join(choices)}"))


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command the arguments chose, its parser: `ls` for `ls orders`, `principal
    add` for `principal add bob`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return chosen(action.choices[name], args)
    return parser


def refuse_extras(tree: argparse.ArgumentParser, args: argparse.Namespace,
                  extras: list[str]) -> None:
    """Arguments the chosen command does not take: refused by that command's parser (its
    usage, status 2), a misspelt option named with the nearest of its options."""
    if not extras:
        return
    parser = chosen(tree, args)
    options = [option for action in parser._actions for option in action.option_strings
               if option.startswith("--")]
    hints = []
    for extra in extras:
        name = extra.partition("=")[0]
        near = nearest(name, options) if name.startswith("-") else None
        if near is not None:
            hints.append(f"{name}: did you mean {near}?")
    parser.error(f"unrecognized arguments: {' '.join(extras)}"
                 + ("" if not hints else "; " + "; ".join(hints)))


def function_hint(error: StateError, fn: str, service: str) -> StateError:
    """UNKNOWN_FUNCTION from the state service, which lists every function it serves: the
    nearest of them instead (details.nearest), when one is close; else the error as is."""
    if error.code != UnknownFunction.code or service != STATE_SERVICE:
        return error
    from stateworker.engines.catalog import CATALOG  # (only on this error: the engines are big)

    near = nearest(fn, [*CATALOG.functions, *(spec.name for spec in NATIVE)])
    if near is None:
        return error
    return UnknownFunction(f"fn: unknown function {shown(fn)}; did you mean {shown(near)}? "
                           "(`stateworker call --help`; README: Functions lists them all)",
                           {**error.details, "nearest": near})
