"""Command-line parsing for every entry point (absl flags): every mistake is one line, exit 2.

``flags_parser(...)`` (``trip_jax.main``) and ``command_parser(...)`` (the other commands: their
flags in a fresh FlagValues) turn absl's and ml_collections' failures into one ``error: ...``
line naming the flag, file or key; ``run`` also sets up the terminal (``runtime/terminal.py``).
"""

from __future__ import annotations

import glob
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import ml_collections
from absl import app, flags
from ml_collections.config_flags import config_flags as config_flags_lib

from trip_jax.config import files as config_files
from trip_jax.config.messages import closest, unknown_choice
from trip_jax.runtime import terminal

USAGE_EXIT_CODE = 2


class UsageError(Exception):
    """A mistake on the command line; its message is the one line shown to the user."""


def config_values(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
    """Every key of ``config`` (sections included) by dotted path, e.g. ``train.seed``."""
    out = {}
    for key, value in config.items():
        out[prefix + key] = value
        if isinstance(value, ml_collections.ConfigDict):
            out.update(config_values(value, f"{prefix}{key}."))
    return out


def _flag_argument(argv: Sequence[str], name: str) -> str | None:
    """The value given to ``--name`` in ``argv`` (``--name=V`` or ``--name V``; last wins)."""
    value = None
    for i, arg in enumerate(argv):
        match = re.fullmatch(rf"--?{re.escape(name)}(=(.*))?", arg, flags=re.DOTALL)
        if match:
            value = match.group(2) if match.group(1) else (argv[i + 1] if i + 1 < len(argv)
                                                           else None)
    return value


def _override_keys(argv: Sequence[str], name: str) -> list[str]:
    """The config keys overridden in ``argv``: ``--NAME.a.b=V`` or ``--noNAME.a.b`` -> a.b."""
    keys = []
    for arg in argv:
        match = re.match(rf"--?(?:no)?{re.escape(name)}\.([^=]+)", arg)
        if match:
            keys.append(match.group(1))
    return keys


def _last_line(text: str) -> str:
    """The last non-empty line of ``text`` (an exception message that embeds a traceback)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _config_file_error(argument: str, err: BaseException) -> str:
    """One line describing why the config file ``argument`` (PATH[:ARG]) did not load."""
    path = argument.split(":", 1)[0]
    if not os.path.isfile(path):
        siblings = glob.glob(os.path.join(os.path.dirname(path), "*.py"))
        suggestion = closest(path, siblings)
        hint = f"; did you mean --config={suggestion}?" if suggestion else ""
        return f"config file {path} does not exist{hint}"
    message = _last_line(err)
    # ml_collections wraps a ValueError/TypeError of get_config in a message holding its
    # traceback; the last line is the original "ValueError: ..." line.
    message = re.sub(r"^(ValueError|TypeError|OSError): ", "", message) or type(err).__name__
    if not isinstance(err, (ValueError, TypeError, OSError)):
        where = [f for f in traceback.extract_tb(err.__traceback__)
                 if os.path.abspath(f.filename) == os.path.abspath(path)]
        location = f" (line {where[-1].lineno})" if where else ""
        message = f"{type(err).__name__}: {message}{location}"
    return f"--config={argument}: {message}"


def load_config_file(argument: str, name: str = "config") -> ml_collections.ConfigDict:
    """Loads ``PATH[:ARG]`` as ``DEFINE_config_file`` does; UsageError if it cannot."""
    parser = config_flags_lib.ConfigFileFlagParser(name=name, lock_config=False)
    config_files.make_importable(argument)
    try:
        config = parser.parse(argument)
        config_values(config)  # a file that failed to load raises on first access
    except Exception as err:  # anything a user's config file raises is reported in one line
        raise UsageError(_config_file_error(argument, err)) from err
    return config


def check_config_keys(config: ml_collections.ConfigDict, keys: Iterable[str],
                      name: str = "config") -> None:
    """UsageError for the first of ``keys`` that is not a key of ``config``."""
    known = config_values(config)
    for key in keys:
        if key not in known:
            suggestion = closest(key, known)
            hint = f"; did you mean --{name}.{suggestion}?" if suggestion else ""
            raise UsageError(f"unknown config key --{name}.{key}{hint}")


def _flag_error(err: flags.Error, flag_values: flags.FlagValues, config: Any,
                config_flag: str) -> str:
    """One line for an absl error about a single flag."""
    if isinstance(err, flags.UnrecognizedFlagError):
        # Also offer the config keys: --learning_rate probably meant --config.train....
        candidates = list(flag_values)
        if isinstance(config, ml_collections.ConfigDict):
            candidates += [f"{config_flag}.{k}" for k in config_values(config)]
        suggestion = closest(err.flagname, candidates)
        hint = f"; did you mean --{suggestion}?" if suggestion else " (see --helpfull)"
        return f"unknown flag --{err.flagname}{hint}"
    text = str(err)
    match = re.match(r"flag --([^=]+)=(.*?): (.*)", text, flags=re.DOTALL)
    if not match:
        return _last_line(text)
    flag_name, value, reason = match.groups()
    if "must have a value other than None" in reason:
        return f"--{flag_name} is required"
    flag = flag_values[flag_name] if flag_name in flag_values else None
    enum_values = getattr(getattr(flag, "parser", None), "enum_values", None)
    if enum_values:
        return f"--{flag_name}: " + unknown_choice("value", value, enum_values)
    if flag_name.startswith(config_flag + ".") and isinstance(config, ml_collections.ConfigDict):
        key = flag_name[len(config_flag) + 1:]
        default = config_values(config).get(key)
        kind = type(default).__name__
        article = "an" if kind[:1] in "aeiou" else "a"
        return (f"bad value for --{flag_name}: {value!r} ({_last_line(reason)}; {key} takes "
                f"{article} {kind}, default {default!r})")
    return f"bad value for --{flag_name}: {value!r} ({_last_line(reason)})"


def describe_parse_error(err: Exception, argv: Sequence[str], flag_values: flags.FlagValues,
                         config_flag: str | None = "config") -> str | None:
    """One line explaining why parsing ``argv`` raised ``err``; None if it is not a usage
    error (a bug, whose traceback should be seen)."""
    config = None
    argument = _flag_argument(argv[1:], config_flag) if config_flag else None
    try:
        if argument is not None:
            # Load the config afresh: a bad file or argument is the cause of everything else.
            config = load_config_file(argument, config_flag)
            check_config_keys(config, _override_keys(argv[1:], config_flag), config_flag)
    except UsageError as usage:
        return str(usage)
    if isinstance(err, flags.Error):
        return _flag_error(err, flag_values, config, config_flag or "")
    return None


def exit_usage(message: str) -> None:
    """Prints ``error: MESSAGE`` (one line) on stderr and exits with status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_EXIT_CODE)


def missing_path(what: str, path: str) -> str | None:
    """``WHAT: PATH does not exist`` (with the closest sibling, if one is close), or None when
    ``path`` exists; ``what`` names the flag (``--predictions``) or argument (``RUN_DIR``)."""
    if os.path.exists(path):
        return None
    parent = os.path.dirname(path.rstrip(os.sep))
    siblings = glob.glob(os.path.join(parent, "*")) if os.path.isdir(parent or ".") else []
    suggestion = closest(path, siblings)
    hint = f"; did you mean {suggestion}?" if suggestion else ""
    return f"{what}: {path} does not exist{hint}"


def check_paths(flag_values: flags.FlagValues, names: Iterable[str]) -> None:
    """UsageError for the first flag of ``names`` (those ``flag_values`` has) set to a path that
    does not exist."""
    for name in names:
        value = flag_values[name].value if name in flag_values else None
        message = missing_path(f"--{name}", value) if value else None
        if message:
            raise UsageError(message)


# What asks a command for its help (absl's spellings, and argparse's -h).
HELP_ARGUMENTS = ("--help", "-h", "-?", "--helpshort", "--helpfull")


def _wants_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (without the program name) asks for help before any ``--``."""
    before = argv[:list(argv).index("--")] if "--" in argv else argv
    return any(arg in HELP_ARGUMENTS for arg in before)


def flags_parser(flag_values: flags.FlagValues = flags.FLAGS, *,
                 config_flag: str | None = "config",
                 config_check: Callable[[ml_collections.ConfigDict], Any] | None = None,
                 check: Callable[[flags.FlagValues], None] | None = None,
                 positional: str | None = None,
                 ) -> Callable[[list[str]], list[str]]:
    """A ``flags_parser`` for ``absl.app.run``: parses ``argv`` into ``flag_values``, loads the
    config (``config_flag``, a config-file flag; None for a command without one), then runs
    ``config_check(config)`` (main's builds the typed config) and ``check(flag_values)`` (both
    may raise UsageError); arguments besides the flags are refused unless ``positional`` names
    them (then at least one is needed). Any usage error is one ``error: ...`` line on stderr and
    exit status 2; on absl's FLAGS, ``--help`` is absl's help with exit status 0."""

    def parse(argv: list[str]) -> list[str]:
        if flag_values is flags.FLAGS and _wants_help(argv[1:]):
            # absl.app's help, but exit status 0 as the other commands' (command_parser).
            app.usage(shorthelp="--helpfull" not in argv, writeto_stdout=True)
            if "--helpfull" not in argv:
                print("\nTry --helpfull to get a list of all flags.")
            sys.exit(0)
        config = None
        argument = _flag_argument(argv[1:], config_flag) if config_flag else None
        if argument:
            config_files.make_importable(argument)  # its ``configs``, from any folder
        try:
            try:
                rest = flag_values(argv)
                if config_flag is not None:
                    config = flag_values[config_flag].value
                    if config is not None:
                        config_values(config)  # a config file that failed to load raises here
            except UsageError:
                raise
            except Exception as err:  # absl, ml_collections and config files raise many types
                message = describe_parse_error(err, argv, flag_values, config_flag)
                if message is None:
                    raise
                raise UsageError(message) from err
            if positional is None and len(rest) > 1:
                raise UsageError(f"unexpected arguments: {' '.join(rest[1:])}")
            if positional is not None and len(rest) < 2:
                raise UsageError(f"missing {positional} (one or more)")
            if config is not None:
                if config_check is not None:
                    config_check(config)
            if check is not None:
                check(flag_values)
        except UsageError as err:
            exit_usage(str(err))
        return rest

    return parse


class Command(NamedTuple):
    """A parsed command line: its flags and the arguments besides them (for ``data``, the
    command's name first)."""

    values: flags.FlagValues
    args: list[str]


def _print_help(doc: str, values: flags.FlagValues | None = None) -> None:
    """``doc`` and the flags of ``values`` on stdout (what ``--help`` shows)."""
    text = doc.strip() + "\n"
    if values is not None:
        text += "\nflags:\n" + values.get_help(include_special_flags=False) + "\n"
    print(text, end="")


def command_parser(define: Callable[[flags.FlagValues], None]
                   | Mapping[str, Callable[[flags.FlagValues], None]], *, doc: str,
                   positional: str | None = None,
                   check: Callable[[Command], None] | None = None,
                   ) -> Callable[[Sequence[str]], Command]:
    """The ``flags_parser`` of a command other than ``trip_jax.main`` (``run``): ``define``
    puts its flags into a fresh FlagValues at each parse, so commands imported together never
    clash; a mapping of names to ``define`` makes the first argument a command (as ``python -m
    trip_jax.datatools stats``). ``--help`` prints ``doc`` and the flags, exit 0; any mistake (also
    a UsageError of ``check(command)``) is ``flags_parser``'s one line, exit 2."""

    def parse(argv: Sequence[str]) -> Command:
        argv = list(argv)
        names: list[str] = []
        chosen = define
        if isinstance(define, Mapping):
            first = argv[1] if len(argv) > 1 else None
            if first in HELP_ARGUMENTS:
                _print_help(doc)
                sys.exit(0)
            if first is None:
                exit_usage(f"missing command: one of {', '.join(define)} (see --help)")
            if first not in define:
                exit_usage(unknown_choice("command", first, define))
            names, chosen = [first], define[first]
            argv = [f"{argv[0]} {first}", *argv[2:]]
        values = flags.FlagValues()
        chosen(values)
        if _wants_help(argv[1:]):
            _print_help(doc, values)
            sys.exit(0)
        rest = flags_parser(values, config_flag=None, positional=positional)(argv)
        command = Command(values, names + rest[1:])
        if check is not None:
            try:
                check(command)
            except UsageError as err:
                exit_usage(str(err))
        return command

    return parse


def run(main: Callable[[Command], int | None], parser: Callable[[Sequence[str]], Command]
        ) -> None:
    """``absl.app.run(main)`` with ``parser`` (``command_parser``) as its flags parser; absl's
    own flags (logging) keep their defaults, as under ``trip_jax.main``; the terminal is set up
    first (``terminal.setup``)."""
    terminal.setup()

    def parse(argv: list[str]) -> Command:
        command = parser(argv)
        flags.FLAGS.mark_as_parsed()  # absl.app.run requires its FLAGS to be parsed
        return command

    app.run(main, flags_parser=parse)
