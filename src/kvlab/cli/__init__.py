"""kvlab's command line. ``main`` turns a user's mistake (KvlabError) into one red line and exit code 2."""

from __future__ import annotations

import importlib
import os
import signal
import sys

from kvlab.sweep import stop

# Ctrl-C or SIGTERM while kvlab starts (importing, checking the options: nothing is done yet), and SIGTERM until a
# command that keeps work (sweep, capacity) takes the signals itself: one line, exit 128 + signum, no traceback
# (kvlab.sweep.stop.exit_on_signals). Only in the kvlab command itself (`kvlab`, `python -m kvlab`), not in a
# program that imports kvlab.cli.
_COMMAND = bool(sys.argv) and sys.argv[0].replace("\\", "/").endswith(("/kvlab", "kvlab/__main__.py"))
_HANDLED = stop.exit_on_signals() if _COMMAND else set()

from kvlab.cli.app import app  # noqa: E402  (after the handlers: importing Typer and Rich takes a moment)

# Commands that keep their work in a store (kvlab.sweep.session.Session): until the session takes the signals
# (kvlab.sweep.stop), nothing is stored, and a signal ends them at once.
KEEP_WORK = ("sweep", "capacity", "paper")
# One module per topic; each registers its commands on ``app`` when imported, in this order (the help's).
COMMAND_MODULES = ("catalog", "size", "sim", "workloads", "sweep", "paper", "lab", "vllm", "vllm_timing", "bench", "cost",
                   "capacity")


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(f"kvlab.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvlab.cli.{name}":
                raise


def main(argv: list[str] | None = None) -> None:
    import typer
    import typer.main

    from kvlab.errors import KvlabError

    # Click's usage errors (a bad number, an unknown option, a missing argument), from the Click that Typer uses
    # (its own copy in recent versions): the class BadParameter derives from.
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    _register()
    command = typer.main.get_command(app)
    _one_line_summaries(command)
    args = sys.argv[1:] if argv is None else list(argv)
    if _HANDLED and next((a for a in args if not a.startswith("-")), None) not in KEEP_WORK:
        stop.unwind_on_exit()  # (a command that keeps no work may start a server, a process: SIGTERM unwinds it)
        if signal.SIGINT in _HANDLED:
            stop.interrupt_on_ctrl_c()
    try:
        _check_repeats(command, args)
        _check_values(command, args)
        args = _read_vllm_ints(command, args)
        _check_whole_numbers(command, args)
        code = command.main(args=args, prog_name="kvlab", standalone_mode=False)
    except KvlabError as exc:
        _error(_elsewhere(exc, command, args) or str(exc))
    except usage_error as exc:
        if not exc.format_message():  # (a bare `kvlab`: Click printed the help, which is the answer)
            sys.exit(exc.exit_code)
        _error(_lowered(_usage_message(exc, args, _command_path(command, args), command)))
    except typer.Abort:  # (Ctrl-C, in the Click of older Typers; recent ones exit 130 and say nothing)
        code = 130
    if stop.interrupted():
        stop.forget_interrupt_in_exec()
    if code == 130 and stop.interrupted():
        print("stopped by SIGINT", file=sys.stderr, flush=True)
    sys.exit(code if isinstance(code, int) else 0)  # (as Click's standalone mode ends)


def _one_line_summaries(group) -> None:
    """A group's list of commands shows each command's first paragraph; Rich keeps the docstring's line breaks, which
    cut a sentence mid-way in the list (trial58: "its licence / and citation"), so each gets its paragraph as one line."""
    import inspect

    for sub in getattr(group, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
        _one_line_summaries(sub)


def _error(message: str, code: int = 2) -> None:
    from rich.console import Console
    from rich.markup import escape

    # (escaped: a message may name `pip install '.[calibrate]'`, which is not markup)
    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def _lowered(message: str) -> str:
    """Click's sentence ("No such option", "Missing argument", "Option '--rate' requires ...") begun in lower case, as
    kvlab's own messages are after "error:" (trial 55, finding 16); a word in capitals (GPU, KV) is left."""
    return message[0].lower() + message[1:] if message[:1].isupper() and message[1:2].islower() else message


# Typer's parse messages (pydantic's, in recent versions) in kvlab's words: what the value is not, what would do.
_PARSE_MESSAGES = {"number": "not a number; valid: a number such as 2 or 0.5",
                   "integer": "not a whole number; valid: a whole number such as 16"}


def _kind(message: str) -> str:
    lowered = message.lower()
    return "integer" if "integer" in lowered else "number" if "number" in lowered or "float" in lowered else ""


def _command_path(command, args: list[str]) -> str:
    """``kvlab`` and the subcommands ``args`` name, as far as they go (Click gives some errors no context)."""
    path = ["kvlab"]
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        path.append(arg)
        command = sub
    return " ".join(path)


def _check_repeats(command, args: list[str]) -> None:
    """An option given twice, or a flag with its --no- form, is refused: Click would keep the last one silently.
    (An option Click takes several times, ``multiple``, would be left to it; what follows ``--`` is not parsed.)"""
    for name in _command_path(command, args).split()[1:]:
        command = command.commands[name]
    args = args[:args.index("--")] if "--" in args else args  # (what follows -- is passed on, not parsed)
    values = _value_positions(command, args)
    for param in getattr(command, "params", ()):
        opts, negative = list(getattr(param, "opts", ())), list(getattr(param, "secondary_opts", ()))
        if not opts or getattr(param, "multiple", False) or getattr(param, "count", False) or param.is_eager:
            continue
        short = [o for o in opts if len(o) == 2 and not o.startswith("--")]  # (-n5: a short option with its value)
        given = [i for i, a in enumerate(args) if i not in values and (a.split("=", 1)[0] in (*opts, *negative)
                 or any(a.startswith(s) and len(a) > 2 and not a[2].isalpha() for s in short))]  # (-nan: a value)
        if len(given) < 2:
            continue
        from kvlab.errors import KvlabError

        exact = [args[i].split("=", 1)[0] in (*opts, *negative) for i in given]  # (else -n5: a short one, attached)
        spelled = [args[i].split("=", 1)[0] if whole else args[i][:2] for i, whole in zip(given, exact)]
        if negative and any(a in negative for a in spelled) and any(a in opts for a in spelled):
            raise KvlabError(f"{' and '.join(dict.fromkeys(spelled))} are both given; valid: one of them (only the "
                             "last would count)")
        attached = ["=" in args[i] or not whole for i, whole in zip(given, exact)]  # (-dcp 2 is not attached)
        shown = [args[i] if joined or param.is_flag or i + 1 == len(args) else f"{args[i]} {args[i + 1]}"
                 for i, joined in zip(given, attached)]
        name = next((o for o in opts if o.startswith("--")), max(opts, key=len))  # (as the command's help names it)
        raise KvlabError(f"{name} is given {len(given)} times ({', '.join(shown)}); valid: once"
                         + (ONE_LIST.get(name, "") or " (only the last would count)"))


def _read_vllm_ints(command, args: list[str]) -> list[str]:
    """``args`` with the value of an option vLLM reads as a human-readable integer (--max-model-len 32k: 32,000;
    32K: 32,768), or a kvlab length read alike (--context-len; HUMAN_READABLE_INT_OPTIONS), or with int() (the
    engine's other whole numbers, VLLM_INT_ARGS: '2_048' is 2,048), written in digits, as `vllm serve` would read it
    (kvlab.validate.vllm_reads_int)."""
    from kvlab.validate import HUMAN_READABLE_INT_OPTIONS, VLLM_INT_ARGS, vllm_reads_int

    path = _command_path(command, args)
    for name in path.split()[1:]:
        command = command.commands[name]
    end = args.index("--") if "--" in args else len(args)
    values = _value_positions(command, args[:end])
    args = list(args)
    for param in getattr(command, "params", ()):
        opts = [o for o in getattr(param, "opts", ()) if o.startswith("-")]
        if param.name not in (*HUMAN_READABLE_INT_OPTIONS, *VLLM_INT_ARGS) or not opts:
            continue
        for i, arg in enumerate(args[:end]):
            at, given = (i + 1, args[i + 1]) if arg in opts and i + 1 < end else (i, _attached(arg, opts))
            if i in values or given is None:
                continue
            if param.name == "max_model_len" and given.strip().lower() in ("auto", "-1"):
                from kvlab.errors import KvlabError
                from kvlab.validate import VLLM_AUTO_MAX_MODEL_LEN

                raise KvlabError(f"{'/'.join(opts)} {given!r}: {VLLM_AUTO_MAX_MODEL_LEN} (see '{path} --help')")
            try:
                number = vllm_reads_int(given, human_readable=param.name in HUMAN_READABLE_INT_OPTIONS)
            except ValueError as exc:
                from kvlab.errors import KvlabError

                raise KvlabError(f"{'/'.join(opts)} {given!r}: {exc} (see '{path} --help')") from None
            if number is not None:
                args[at] = str(number) if at != i else f"{arg[:len(arg) - len(given)]}{number}"
    return args


def _check_whole_numbers(command, args: list[str]) -> None:
    """A whole-number option's value in digits only (kvlab.validate.whole_number_text): Click reads it with int(),
    which takes '5_0' (as 50), '+5' and ' 5', while it refuses '1e3'; those int() takes are refused here, in the
    line Click's refusal gets (_parse_refusal)."""
    from kvlab.validate import HUMAN_READABLE_INT_OPTIONS, NUMBER_TEXT, whole_number_problem

    path = _command_path(command, args)
    for name in path.split()[1:]:
        command = command.commands[name]
    args = args[:args.index("--")] if "--" in args else args
    values = _value_positions(command, args)
    for param in getattr(command, "params", ()):
        opts = [o for o in getattr(param, "opts", ()) if o.startswith("-")]
        if not opts or not _takes_whole_number(param):
            continue
        for i, arg in enumerate(args):
            if i in values:
                continue
            given = args[i + 1] if arg in opts and i + 1 < len(args) else _attached(arg, opts)
            if given is None:
                continue
            vllm_int = param.name in HUMAN_READABLE_INT_OPTIONS  # (32k already read: _read_vllm_ints)
            problem = whole_number_problem(given, vllm_int=vllm_int)
            # (int() reads '5_0', Typer's float reading '4096.0'; what neither takes, 'auto', a short option's '=5',
            # is Click's to refuse, with its hints (_usage_message), but for a vLLM integer's, whose forms differ)
            if problem and (vllm_int or _int_reads(given) or NUMBER_TEXT.fullmatch(given.strip())):
                from kvlab.errors import KvlabError

                raise KvlabError(f"{'/'.join(opts)} {given!r}: {problem} (see '{path} --help')")


def _int_reads(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _takes_whole_number(param) -> bool:
    """Whether a Click/Typer option reads its value as an int: its annotation (recent Typers, which parse with
    pydantic), else its Click type (older ones: IntParamType, IntRange)."""
    import typing

    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        annotation = descriptor.annotation
        return annotation is int or int in typing.get_args(annotation)
    return any(c.__name__ == "IntParamType" for c in type(getattr(param, "type", None)).__mro__)


def _parse_refusal(opts, given: str, kind: str) -> str:
    """A value an option cannot take, in one line: the option, the value as given, what it is not and what would do."""
    from kvlab.validate import comma_list_hint

    return f"{'/'.join(opts)} {given!r}: {_PARSE_MESSAGES.get(kind, kind)}{comma_list_hint(given)}"


def _check_values(command, args: list[str]) -> None:
    """An option whose value is one of the command's own options (``--model -n 5``: its value forgotten) is refused,
    naming the option that lacks its value; Click would take '-n' as the model."""
    root, path = command, _command_path(command, args)
    for name in path.split()[1:]:
        command = command.commands[name]
    args = args[:args.index("--")] if "--" in args else args
    options = {o for p in getattr(command, "params", ()) for o in (*getattr(p, "opts", ()),
                                                                   *getattr(p, "secondary_opts", ()))
               if o.startswith("-")} | {"-h", "--help"}  # (the help option is Click's, not among the params)
    for i in sorted(_value_positions(command, args)):
        if i >= len(args) or args[i - 1] not in options or not args[i].startswith("-"):
            continue
        flag, word = args[i - 1], args[i]
        # (a word that is an option of another kvlab command, `size --gpu -n 5`, was forgotten too; a value that
        # merely starts with '-', --workload -w.csv, is a value)
        owners = [] if word in options or _grid_takes(command, word) else _commands_with(root, word.split("=")[0])
        if word in options or _grid_takes(command, word) or owners:
            from kvlab.errors import KvlabError

            whose = f"of {path}" if not owners else f"of {', '.join(owners[:4])}, not of {path}"
            file = f", or {flag}=./{word} for the file ./{word}" if os.path.lexists(word) else ""
            raise KvlabError(f"{flag} needs a value: the word after it, {word}, is an option {whose}; valid: "
                             f"{flag} VALUE {word} ...{file} (see '{path} --help')")


def _value_positions(command, args: list[str]) -> set[int]:
    """The positions in ``args`` Click reads as an option's value: the words after an option that takes values,
    given without its value attached (Click takes the next word whatever it looks like: ``--model -n`` is the
    model '-n', not the option -n)."""
    takes = {o: p.nargs for p in getattr(command, "params", ()) for o in getattr(p, "opts", ())
             if o.startswith("-") and not getattr(p, "is_flag", False) and not getattr(p, "count", False)}
    values: set[int] = set()
    for i, arg in enumerate(args):
        if i not in values and arg in takes:
            values.update(range(i + 1, i + 1 + max(takes[arg], 1)))
    return values


# Options whose one value holds several things: said when one is given twice (what the user meant, in one value).
ONE_LIST = {"--slo": ", its terms in one comma list: --slo 'p99_ttft<2s,p99_tpot<100ms'",
            "--strategy": ", the strategies in one comma list: --strategy vllm,orca-max"}


def _elsewhere(exc, root, args: list[str]) -> str:
    """For an option a sweep's or capacity's grid does not take but another command does (capacity --slo-classes,
    --wide: kvlab run's), the line other misplaced options get (_usage_message); "" for any other error."""
    from kvlab.sweep.grid import UnknownGridOption

    if not isinstance(exc, UnknownGridOption) or not exc.spelling.startswith("--"):
        return ""
    flag = exc.spelling.split("=", 1)[0]
    owners = _commands_with(root, flag)
    where = _command_path(root, args)
    if not owners:
        return ""
    return (f"no such option: {flag}: it is an option of {', '.join(owners)}, not of {where}; "
            f"{_instead(flag, where)} (see '{where} --help')")


def _instead(flag: str, where: str) -> str:
    """What a sweep or capacity (``where``) does instead of a `kvlab run` option it does not take (``flag``): how
    their own output or input stands in for it; for the others, that they vary the options that set a point."""
    if flag in ("--plots", "--no-plots"):
        from kvlab.cli.capacity import CAPACITY_PLOTS
        from kvlab.cli.sweep import SWEEP_PLOTS

        plots = ", ".join(CAPACITY_PLOTS if where.endswith("capacity") else SWEEP_PLOTS)
        return f"{where} always writes its plots ({plots}) into --out (kvlab's cache without it): there is no switch"
    if flag == "--wide":
        return f"it sets how wide their tables are, and {where} has no such setting"
    if flag == "--config":
        return f"{where} reads a file of options with --grid (one value or a list per option)"
    return f"{where} varies any `kvlab run` option that sets a point"


def _commands_with(command, option: str | None, path: str = "kvlab") -> list[str]:
    """The commands under ``command`` (their paths) that take ``option``."""
    found = []
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands_with(sub, option, f"{path} {name}")
    if any(option in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())) for p in command.params) \
            or _grid_takes(command, option):
        found.append(path)
    return found


def _grid_takes(command, option: str | None) -> bool:
    """Whether ``command`` takes ``option`` among the extra options its grid parser reads (sweep, capacity: any
    `kvlab run` option, kvlab.sweep.grid), not among its own Click parameters."""
    if not option or not option.startswith("-") or not getattr(command, "context_settings", {}).get("allow_extra_args"):
        return False
    from kvlab.errors import KvlabError
    from kvlab.sweep.grid import option_name

    try:
        option_name(option)
    except KvlabError:
        return False
    return True


# Commands whose strategies are arguments (sweep and capacity vary them as an option, --strategy).
STRATEGIES_AS_ARGUMENTS = ("kvlab run", "kvlab race")


def _attached(arg: str, opts) -> str | None:
    """The value ``arg`` carries, as Click reads it: after '=' of a long option (--num-requests=5), everything after a
    short one (-n5; -n=5 gives '=5'); None where ``arg`` is none of ``opts`` with a value."""
    for opt in opts:
        if opt.startswith("--") and arg.startswith(opt + "="):
            return arg[len(opt) + 1:]
        if not opt.startswith("--") and arg.startswith(opt) and len(arg) > len(opt):
            return arg[len(opt):]
    return None


# Engine options a simulated run takes in the strategy's name instead (kvlab.strategies: +prefix, +noprefix).
_PREFIX_IN_THE_NAME = ("; in {where}, prefix caching is part of the strategy's name: vllm has it on (as vllm serve), "
                       "vllm+noprefix off, e.g. {where} vllm+noprefix (a paged strategy takes +prefix or +noprefix)")
IN_THE_STRATEGY = {"--enable-prefix-caching": _PREFIX_IN_THE_NAME, "--no-enable-prefix-caching": _PREFIX_IN_THE_NAME}


def _usage_message(exc, args: list[str], command_path: str = "kvlab", root=None) -> str:
    """Click's message in kvlab's form: the option, the value given, what would do, and where help is."""
    import typer

    from kvlab.sweep.grid import auto_hint

    message = exc.format_message().rstrip(".")
    option = getattr(exc, "option_name", None)
    where = exc.ctx.command_path if exc.ctx is not None else command_path
    if option == "--strategy" and where in STRATEGIES_AS_ARGUMENTS:
        one = where.endswith(" run")  # (run takes one strategy, race several)
        return (f"{where} takes its {'strategy as an argument' if one else 'strategies as arguments'}, not --strategy: "
                f"e.g. {where} vllm{'' if one else ' orca-max'} (sweep and capacity take --strategy) (see '{where} "
                "--help')")
    owners = _commands_with(root, option) if root is not None and exc.__class__.__name__ == "NoSuchOption" else []
    if owners and option:
        instead = IN_THE_STRATEGY.get(option, "") if where in STRATEGIES_AS_ARGUMENTS else ""
        return (f"No such option: {option}: it is an option of {', '.join(owners)}, not of {where}"
                f"{instead.format(where=where)} (see '{where} --help')")
    if isinstance(exc, typer.BadParameter) and exc.param is not None and getattr(exc.param, "opts", None):
        opts = exc.param.opts
        given = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in opts), None)
        given = given or next((_attached(a, opts) for a in args if _attached(a, opts) is not None), None)
        if given is not None:
            message = _parse_refusal(opts, given, _kind(exc.message) or exc.message)
            short = next((o for o in opts if not o.startswith("--")), None)
            if short and given.startswith("="):
                value = given[1:] or "N"
                message += f" (a short option takes its value as {short} {value} or {short}{value}, without '=')"
            if given.strip().lower() == "auto":
                message += auto_hint(opts[0].lstrip("-").replace("-", "_"), given)
    return f"{message} (see '{where} --help')"
