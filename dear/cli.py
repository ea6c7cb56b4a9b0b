"""How every command-line entry point answers a user's mistake: one line naming what is wrong, exit code 2.

The traceback appears only with -v/--verbose. `python -m X` modules end with
``if __name__ == "__main__": run(main, "python -m X")``, and their code reports a user error by raising it
(a ValueError naming the flag, file or line, or a missing file): `run` prints ``python -m X: error: ...``.
A command-line mistake argparse finds (an unknown flag, a bad value, a missing argument) is answered the same
way inside `run` and `exit_code`: its one error line and a hint to `--help` (`short_usage_errors`), not argparse's
usage block, which buries the line that names the fix. The flags the CLIs share are declared once in
dear.debate.cli_args."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence

# Mistakes a user makes on the command line or in a file they named: a bad value, a missing path.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError,
                                                 IsADirectoryError)


def command_line(prog: str, argv: Sequence[str] | None = None) -> str:
    """The command as a user would type it again: `prog` and the shell-quoted arguments (sys.argv[1:] by
    default). Reports and run records name their command through here."""
    return " ".join([prog, *(shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))])


def wants_traceback(argv: Sequence[str]) -> bool:
    return any(a in ("-v", "--verbose") for a in argv)


def usage_hint(prog: str) -> str:
    """The line under a command-line error: where the usage is."""
    return f"run `{prog} --help` for usage"


def _short_error(self: argparse.ArgumentParser, message: str):
    """`ArgumentParser.error` as the CLIs answer: the error line and a hint to --help, exit code 2."""
    self.exit(2, f"{self.prog}: error: {message}\n{usage_hint(self.prog)}\n")


@contextlib.contextmanager
def short_usage_errors() -> Iterator[None]:
    """While inside: every argparse parser answers a command-line mistake with one error line and a hint to
    `--help` instead of its usage block (exit code 2, as argparse). `exit_code` (so `run`) wraps `main` in it."""
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _short_error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def exit_code(main: Callable[[], object], prog: str, *,
              errors: tuple[type[BaseException], ...] = USER_ERRORS,
              codes: Mapping[type[BaseException], int] | None = None,
              argv: Sequence[str] | None = None) -> int:
    """Run `main()` and return its exit code (its int result, else 0); a user error prints ``prog: error: ...``
    and gives 2, and so does a command-line mistake argparse finds (with a hint to `--help`; it raises SystemExit).

    `codes` maps other exception types to their own exit codes (checked first), e.g. a failed check = 1."""
    argv = sys.argv[1:] if argv is None else argv
    codes = dict(codes or {})
    try:
        with short_usage_errors():
            code = main()
    except (*codes, *errors) as e:
        if wants_traceback(argv):
            traceback.print_exc()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return next((c for t, c in codes.items() if isinstance(e, t)), 2)
    return code if isinstance(code, int) else 0  # a main() may return its results: success


STOPPED = 130  # exit code of a job stopped by SIGINT / SIGTERM after its cleanup ran (128 + SIGINT)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, so a job's `finally` blocks run and it
    keeps what finished. Needed for SIGINT too: a job started in the background by a non-interactive shell
    inherits SIGINT ignored, Python then installs no handler, and `kill -INT` does nothing at all."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)


def run(main: Callable[[], object], prog: str, **kwargs) -> None:
    """The `__main__` block of every CLI: `sys.exit(exit_code(main, prog, ...))`, with SIGINT and SIGTERM
    raising KeyboardInterrupt (`stop_on_signals`); a stopped job exits with STOPPED after its cleanup."""
    stop_on_signals()
    try:
        code = exit_code(main, prog, **kwargs)
    except KeyboardInterrupt:
        print(f"{prog}: stopped", file=sys.stderr)
        code = STOPPED
    sys.exit(code)


def require_at_least(args: argparse.Namespace, minimum: int, *dests: str) -> None:
    """Raise ValueError naming the first flag of `dests` (argparse destinations) whose value is below `minimum`."""
    for dest in dests:
        value = getattr(args, dest)
        if value < minimum:
            raise ValueError(f"--{dest.replace('_', '-')} must be >= {minimum}, got {value}")


def comma_list(kind: Callable[[str], object] = float) -> Callable[[str], tuple]:
    """An argparse `type` that reads "a,b,c" as a tuple of `kind(...)` values (at least one), naming bad text."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            name = getattr(kind, "__name__", "value")
            raise argparse.ArgumentTypeError(f"expected comma-separated {name} values, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values

    return parse
