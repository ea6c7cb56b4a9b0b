"""Run an untrusted Python program (a program-of-thought agent's code) in a sandbox: `run_program(code, limits)`.

Each program runs in a process of its own, in a fresh temporary directory that is its working directory and is
deleted afterwards, with no inherited environment variable, in Python's isolated mode (`-I -S -B`), and with
wall-time, CPU-time, memory, output-size, file-size and process-count limits. `run_program` never raises for
what a program does: a refused, failed, killed or blocked program is a `SandboxResult` whose `verdict` says why
(`VERDICTS`), with its stdout and stderr (capped), exit status, wall and CPU time and the layers that were active.

Layers, outermost first (the Python layers are a guard against an honest model's mistakes and the first line
against a hostile one; PEP 578 says audit hooks are no sandbox, so the operating-system layers are the boundary):

| layer | what it stops | when active |
| --- | --- | --- |
| static check (`check_program`, ast) | imports outside `ALLOWED_MODULES`; relative imports; exec/eval/compile/open/`__import__`/globals/vars/input/breakpoint...; dunder and private attribute access (`().__class__.__base__.__subclasses__()`, `f.__globals__`, `random._os`); frame and escape attributes (`f_globals`, `gi_frame`, `attrgetter`...); string constants naming dunders; programs over `max_code_bytes`; syntax errors -- the program never starts (`refused`) | always (the `static_check=False` argument exists only for tests of the deeper layers) |
| restricted builtins | the same calls at run time: no open/exec/eval/compile/input; `__import__` only of allowed modules; getattr/setattr/delattr/hasattr refuse names starting with `_` (`blocked`) | always |
| audit hook (`sys.addaudithook`, installed by a bootstrap that runs before the program; the modules the program may use are imported first) | any `open` for reading outside the interpreter's own files and the working directory, any `open` for writing outside the working directory, file descriptors as paths; loading any module outside the allow-list (socket, ctypes, subprocess, importlib.util...); every `os.*` event (system, exec*, fork, posix_spawn, kill, remove, rename, listdir, putenv, chdir...), `subprocess.*`, `socket.*`, `ctypes.*`, `shutil.*`, `gc.*`, `sys.settrace`/`setprofile`/`addaudithook`, `code.__new__`, restricted attribute reads (`object.__getattr__`: frames, tracebacks' frames, code objects, generator internals) -- the process exits at once (`blocked`, can't be caught) | always |
| resource limits (setrlimit in the bootstrap, before the program) | CPU time (SIGXCPU, then SIGKILL one second later: signal tampering can't outlast it), address space (`MemoryError` -> `memory`), file size, open files, core dumps, and processes/threads (RLIMIT_NPROC, default 1: no fork, no thread) | always; RLIMIT_NPROC binds only a non-root process, so it needs the uid layer when the caller is root |
| parent-side limits | wall time and output size: the parent reads both pipes with a deadline and a cap, then SIGKILLs the child's whole process group (its own session) | always |
| clean environment, isolated interpreter | environment variables of the caller (secrets, PYTHON*), user site-packages, the current directory on sys.path | always |
| unique unprivileged uid (`setpriv --reuid/--regid --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs`, a fresh uid per program) | every file the uid doesn't own (only world-readable files can be read, only world-writable places written), capabilities, setuid binaries, signals to other processes, other programs' directories; makes RLIMIT_NPROC bind (a fork bomb fails at the first fork); every process of the uid is SIGKILLed after the run | root, util-linux `setpriv`, and an interpreter others can run (`bwrap` tier: always) |
| namespaces (`bwrap --unshare-net --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try --die-with-parent --new-session --clearenv`, else `unshare --net --pid --ipc --uts --fork --kill-child`) | any network (the namespace has only its own empty loopback: a connect to 127.0.0.1 reaches no host service, no name resolves), seeing or signalling host processes (unshare adds `--mount-proc`), SysV IPC; when the sandbox's first process ends every process in it is killed | root with bubblewrap (Debian `bubblewrap`) or util-linux `unshare` |
| file-system view (bubblewrap only) | everything outside a read-only /usr, /lib* and the interpreter's own prefix: no /etc, /home, /root, /work, /var; an empty read-only /tmp; the working directory is a size-capped tmpfs (`disk_mb`) that vanishes with the sandbox; program and bootstrap are mounted read-only | root with bubblewrap |

`active_layers()` names the layers this machine gives (the tier is probed once per process: bubblewrap, else
unshare, else plain). CI installs bubblewrap (`.ci/run`); without it the module still works, with the layers it
can have. What is left without bubblewrap, at the OS level only (the Python layers still stop it): the fresh uid
can read world-readable files (/etc/passwd) and write world-writable directories (/tmp, /dev/shm); without root
there is no fresh uid, so RLIMIT_NPROC counts all of the caller's processes (a fork still fails at limit 1).
"""

from __future__ import annotations

import ast
import json
import math
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from functools import lru_cache

# ---------------------------------------------------------------- public types
OK = "ok"
REFUSED = "refused"  # the static check refused the program before it ran (reason says why)
TIMEOUT = "timeout"  # wall time or CPU time ran out
MEMORY = "memory"  # MemoryError, or killed for memory
OUTPUT_LIMIT = "output-limit"  # stdout or stderr went past max_output_bytes
ERROR = "error"  # the program raised, exited non-zero or died of a signal
BLOCKED = "blocked"  # a runtime guard (restricted builtins, audit hook) stopped a forbidden action
VERDICTS = (OK, REFUSED, TIMEOUT, MEMORY, OUTPUT_LIMIT, ERROR, BLOCKED)

ALLOWED_MODULES = frozenset({
    "math", "fractions", "decimal", "itertools", "functools", "statistics", "collections", "re", "datetime",
    "operator", "string", "heapq", "bisect", "cmath", "numbers", "random",
})


@dataclass(frozen=True)
class SandboxLimits:
    """A program's limits. Set by the caller (a server's are fixed in its configuration); nothing in a program
    or a request changes them."""

    wall_seconds: float = 5.0  # from the start of the process to its end, interpreter start-up included
    cpu_seconds: float = 4.0  # RLIMIT_CPU (whole seconds, rounded up); SIGKILL one second later
    memory_mb: int = 256  # RLIMIT_AS
    max_output_bytes: int = 64 * 1024  # per stream (stdout, stderr); more kills the program (output-limit)
    max_processes: int = 1  # RLIMIT_NPROC for the program's uid: 1 = the program alone, no fork, no thread
    max_file_bytes: int = 1024 * 1024  # RLIMIT_FSIZE: the largest file the program may write
    max_open_files: int = 32  # RLIMIT_NOFILE
    disk_mb: int = 16  # the working directory's size (a tmpfs; bubblewrap tier)
    max_code_bytes: int = 64 * 1024  # a longer program is refused before it runs

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"SandboxLimits.{f.name} must be a positive number, got {v!r}")


DEFAULT_LIMITS = SandboxLimits()


@dataclass(frozen=True)
class SandboxResult:
    """What became of one program. `stdout`/`stderr` hold at most `max_output_bytes` each (decoded as UTF-8,
    undecodable bytes replaced). `exit_status`: None when the program never ran (refused); 0 for a clean end, 1
    for an exception or a non-zero SystemExit, 3 (`EXIT_MEMORY`) for MemoryError, 4 (`EXIT_BLOCKED`) when a
    runtime guard stopped it; a signal is -N in the plain tier and 128+N under bubblewrap / unshare.
    `cpu_seconds`: as the program's bootstrap reported it, else as sampled just before the host killed it."""

    verdict: str  # one of VERDICTS
    reason: str = ""  # why, for every verdict but ok (the static check's reason, the blocked action, the limit)
    stdout: str = ""
    stderr: str = ""
    exit_status: int | None = None
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    layers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "stdout": self.stdout, "stderr": self.stderr,
                "exit_status": self.exit_status, "wall_seconds": round(self.wall_seconds, 4),
                "cpu_seconds": round(self.cpu_seconds, 4), "stdout_truncated": self.stdout_truncated,
                "stderr_truncated": self.stderr_truncated, "layers": list(self.layers)}


# ---------------------------------------------------------------- static check
# Builtins a program may not name (the restricted builtins leave them out, too).
FORBIDDEN_NAMES = frozenset({
    "exec", "eval", "compile", "open", "__import__", "globals", "locals", "vars", "input", "breakpoint", "help",
    "exit", "quit", "memoryview", "__builtins__", "__loader__", "__spec__", "__build_class__", "copyright",
    "credits", "license",
})
# Attributes that lead out of the allowed modules or into the interpreter, whatever their spelling.
FORBIDDEN_ATTRIBUTES = frozenset({
    "attrgetter", "methodcaller", "get_field", "f_globals", "f_locals", "f_back", "f_builtins", "f_code",
    "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code",
    "func_globals", "mro", "modules", "sys", "os", "builtins", "system", "popen", "spawn", "fork", "load_module",
    "exec_module", "import_module", "getframe",
})
# Dunder attributes a program may use (method definitions and calls such as `super().__init__()`).
SAFE_DUNDERS = frozenset({
    "__init__", "__name__", "__qualname__", "__doc__", "__str__", "__repr__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__hash__", "__len__", "__iter__", "__next__", "__contains__", "__getitem__",
    "__setitem__", "__delitem__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__",
    "__neg__", "__pos__", "__abs__", "__bool__", "__int__", "__float__", "__index__", "__round__",
    "__enter__", "__exit__", "__post_init__", "__call__", "__main__",
})
_DUNDER_TEXT = re.compile(r"__[A-Za-z]\w*__")


def _refuse_attr(name: str, base: ast.AST) -> str | None:
    if name in FORBIDDEN_ATTRIBUTES:
        return f"attribute {name!r} is not allowed"
    if name.startswith("__") and name not in SAFE_DUNDERS:
        return f"dunder attribute {name!r} is not allowed"
    if name.startswith("_") and not name.startswith("__") and not (isinstance(base, ast.Name)
                                                                   and base.id in ("self", "cls")):
        return f"private attribute {name!r} is only allowed on self or cls"
    return None


def check_program(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> str | None:
    """Why the program is refused before it runs, or None when the static check lets it run. Never raises."""
    if not isinstance(code, str):
        return f"the program must be a str, got {type(code).__name__}"
    if len(code.encode("utf-8", "surrogatepass")) > limits.max_code_bytes:
        return f"the program is longer than {limits.max_code_bytes} bytes"
    if "\x00" in code:
        return "the program contains a NUL character"
    try:
        tree = ast.parse(code, filename="<program>")
    except SyntaxError as e:
        return f"syntax error, line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"unparsable program: {type(e).__name__}"
    try:
        nodes = list(ast.walk(tree))
    except RecursionError:
        return "the program is nested too deeply"
    for node in nodes:
        line = getattr(node, "lineno", "?")
        problem = None
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.partition(".")[0] not in ALLOWED_MODULES]
            if bad:
                problem = f"import of {bad[0]!r} (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                problem = "relative import"
            elif (node.module or "").partition(".")[0] not in ALLOWED_MODULES:
                problem = f"import from {node.module!r} (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
            else:
                bad = [a.name for a in node.names if a.name.startswith("_") or a.name in FORBIDDEN_ATTRIBUTES]
                if bad:
                    problem = f"import of the name {bad[0]!r} from {node.module!r}"
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                problem = f"name {node.id!r} is not allowed"
            elif node.id.startswith("__") and node.id != "__name__":
                problem = f"dunder name {node.id!r} is not allowed"
        elif isinstance(node, ast.Attribute):
            problem = _refuse_attr(node.attr, node.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            m = next((m for m in _DUNDER_TEXT.finditer(text) if m.group(0) not in SAFE_DUNDERS), None)
            if m:
                problem = f"string naming {m.group(0)!r}"
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bad = [n for n in node.names if n.startswith("__")]
            if bad:
                problem = f"dunder name {bad[0]!r} is not allowed"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in FORBIDDEN_NAMES:
                problem = f"name {node.name!r} is not allowed"
        elif isinstance(node, ast.arg) and node.arg in FORBIDDEN_NAMES:
            problem = f"name {node.arg!r} is not allowed"
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("__"):
            problem = f"keyword {node.arg!r} is not allowed"
        if problem:
            return f"line {line}: {problem}"
    return None


# ---------------------------------------------------------------- the bootstrap the child runs first
EXIT_MEMORY = 3
EXIT_BLOCKED = 4

# Runs in the sandboxed interpreter (any CPython >= 3.8) before the program: limits, the allowed modules, the audit
# hook and the restricted builtins. argv[1] is a JSON object: program path, limits, allowed modules.
_BOOT = r'''
import sys, os, json, resource, posixpath
cfg = json.loads(sys.argv[1])


def _make_report(fd, write, getrusage, self_, children):
    def report():
        try:
            a, b = getrusage(self_), getrusage(children)
            write(fd, ("%.6f" % (a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime)).encode("ascii"))
        except BaseException:
            pass
    return report


_report = _make_report(cfg["status_fd"], os.write, resource.getrusage, resource.RUSAGE_SELF,
                       resource.RUSAGE_CHILDREN)
for _name, _soft, _hard in cfg["rlimits"]:
    try:
        resource.setrlimit(getattr(resource, _name), (_soft, _hard))
    except (ValueError, OSError, AttributeError):
        pass
_ALLOWED = frozenset(cfg["allowed"])
for _m in sorted(_ALLOWED) + ["_strptime", "collections.abc"]:
    __import__(_m)
with open(cfg["program"], encoding="utf-8") as _f:
    _src = _f.read()
_code = compile(_src, "<program>", "exec", dont_inherit=True)
try:
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
except Exception:
    pass


def _make_guards(allowed, read_roots, write_root, exit_code, write, exit_, normpath, join, fspath, report):
    deny = ("os.", "subprocess.", "socket.", "ctypes.", "shutil.", "gc.", "fcntl.", "mmap.", "resource.",
            "pty.", "syslog.", "sqlite3.", "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
            "nntplib.", "telnetlib.", "webbrowser.", "marshal.", "pickle.", "_thread.", "threading.", "winreg.",
            "msvcrt.", "_winapi.", "ensurepip.", "glob.", "tempfile.", "builtins.input", "sys.settrace",
            "sys.setprofile", "sys.addaudithook", "sys._current_frames", "sys.setrecursionlimit",
            "code.__new__", "function.__new__", "object.__getattr__", "object.__delattr__", "cpython.run_",
            "setopencodehook", "signal.")
    new_loads = frozenset(allowed) | frozenset({"_strptime", "encodings"})

    def block(what):
        try:
            write(2, ("\nblocked by the sandbox: " + what[:300] + "\n").encode("utf-8", "replace"))
            report()
        finally:
            exit_(exit_code)

    def under(path, root):
        return path == root or path.startswith(root.rstrip("/") + "/")

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            try:
                if isinstance(path, int) or path is None:
                    block("open of file descriptor %r" % (path,))
                path = fspath(path)
                if isinstance(path, bytes):
                    path = path.decode("utf-8", "surrogateescape")
                path = normpath(join(write_root, path))
            except BaseException:
                block("open of an unreadable path")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & 0o3103)  # O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND
            if writing:
                if not under(path, write_root):
                    block("open for writing outside the working directory: " + path)
            elif not any(under(path, r) for r in read_roots):
                block("open outside the sandbox's files: " + path)
        elif event == "import":
            name = str(args[0]) if args else ""
            if name.partition(".")[0] not in new_loads:
                block("import of " + name)
        elif event.startswith(deny):
            block(event)

    def refuse(what):
        block(what)

    return hook, refuse


# Reads: the interpreter's standard library (its lazily loaded parts), the program's directory, the working directory.
_hook, _refuse = _make_guards(_ALLOWED, (posixpath.dirname(os.__file__), posixpath.dirname(cfg["program"]),
                                         os.getcwd()),
                              os.getcwd(), cfg["exit_blocked"], os.write, os._exit, posixpath.normpath,
                              posixpath.join, os.fspath, _report)


def _make_builtins(refuse, allowed, real_import, real_getattr, real_setattr, real_delattr, real_hasattr):
    import builtins

    def _name(name):
        if type(name) is not str or name.startswith("_"):
            refuse("attribute access by name %r" % (name,))
        return name

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        # _strptime: datetime's C code imports it through the caller's builtins, i.e. these
        if type(name) is not str or level or (name.partition(".")[0] not in allowed and name != "_strptime"):
            refuse("import of %r" % (name,))
        for item in fromlist or ():
            if type(item) is not str or (item.startswith("_") and item != "*"):
                refuse("import of %r from %s" % (item, name))
        return real_import(name, globals, locals, fromlist, 0)

    def getattr_(obj, name, *default):
        return real_getattr(obj, _name(name), *default)

    def setattr_(obj, name, value):
        return real_setattr(obj, _name(name), value)

    def delattr_(obj, name):
        return real_delattr(obj, _name(name))

    def hasattr_(obj, name):
        return real_hasattr(obj, _name(name))

    safe = {}
    for key in ("abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "classmethod",
                "complex", "dict", "dir", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
                "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
                "object", "oct", "ord", "pow", "print", "property", "range", "repr", "reversed", "round", "set",
                "slice", "sorted", "staticmethod", "str", "sum", "super", "tuple", "type", "zip", "aiter", "anext",
                "__build_class__", "True", "False", "None", "Ellipsis", "NotImplemented"):
        if hasattr(builtins, key):
            safe[key] = getattr(builtins, key)
    for key, value in vars(builtins).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            safe[key] = value
    safe.update(__import__=guarded_import, getattr=getattr_, setattr=setattr_, delattr=delattr_, hasattr=hasattr_)
    return safe


_exit = os._exit
_stdout, _stderr = sys.stdout, sys.stderr
if cfg["guards"]:
    _globals = {"__builtins__": _make_builtins(_refuse, _ALLOWED, __import__, getattr, setattr, delattr, hasattr),
                "__name__": "__main__"}
    sys.addaudithook(_hook)
else:  # tests of the operating-system layers alone
    _globals = {"__name__": "__main__"}
_status = 0
try:
    exec(_code, _globals)
except SystemExit as _e:
    if _e.code not in (None, 0):
        if isinstance(_e.code, str):
            try:
                print(_e.code[:1000], file=_stderr)
            except BaseException:
                pass
        _status = 1
except MemoryError:
    _status = cfg["exit_memory"]
    try:
        print("MemoryError: the program ran out of memory", file=_stderr)
    except BaseException:
        pass
except BaseException as _e:
    _status = 1
    try:
        _tb, _lines = _e.__traceback__, []
        while _tb is not None:
            _lines.append(_tb.tb_lineno)
            _tb = _tb.tb_next
        _msg = str(_e)[:1000]
        _lines = _lines[1:] or _lines
        _where = ", ".join(map(str, _lines)) if len(_lines) <= 6 else "%d, %d, %d, ..., %d, %d, %d" % (
            tuple(_lines[:3]) + tuple(_lines[-3:]))
        print("Traceback (line numbers, outermost first: %s)\n%s: %s" % (_where, type(_e).__name__, _msg), file=_stderr)
    except BaseException:
        pass
try:
    _stdout.flush()
    _stderr.flush()
except BaseException:
    pass
_report()
_exit(_status)
'''


# ---------------------------------------------------------------- tiers (probed once)
_BOX = "/sandbox"  # the program's view in the bubblewrap tier: /sandbox/in (read-only), /sandbox/work (its cwd)


def _others_can_run(path: str) -> bool:
    """True when a user that owns nothing can reach and execute `path` (every directory on its way o+x)."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        d = os.path.dirname(path)
        while True:
            if not os.stat(d).st_mode & 0o001:
                return False
            if d == "/":
                return True
            d = os.path.dirname(d)
    except OSError:
        return False


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _shared_interpreter() -> str | None:
    """An interpreter a fresh uid can run: this one, else a system python3 (the program needs only the standard
    library)."""
    for cand in (_interpreter(), "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand) and _others_can_run(cand):
            return os.path.realpath(cand)
    return None


def _bwrap_mounts(python: str) -> list[str]:
    """Read-only binds of the system libraries and the interpreter's prefix, each prefix's parents made 0755."""
    args = ["--ro-bind", "/usr", "/usr"]
    for p in ("/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"):
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python))}
    made = set()
    for root in sorted(roots):
        if any(root == s or root.startswith(s + "/") for s in ("/usr", "/lib", "/lib64", "/bin", "/sbin")):
            continue
        parts = root.strip("/").split("/")
        for k in range(1, len(parts)):
            d = "/" + "/".join(parts[:k])
            if d not in made:
                made.add(d)
                args += ["--perms", "0755", "--dir", d]
        args += ["--ro-bind", root, root]
    return args


@dataclass(frozen=True)
class _Tier:
    name: str  # bwrap, unshare, plain
    python: str
    drop_uid: bool  # a fresh uid per program (setpriv, or Popen(user=) in the plain tier)

    @property
    def layers(self) -> tuple[str, ...]:
        out = ["static-check", "restricted-builtins", "audit-hook", "rlimits", "wall-and-output-limits",
               "session-kill", "clean-env", "isolated-interpreter", "temp-workdir"]
        if self.drop_uid:
            out.append("fresh-uid")
        if self.name in ("bwrap", "unshare"):
            out += ["net-namespace", "pid-namespace", "ipc-uts-namespaces"]
        if self.name == "bwrap":
            out += ["mount-namespace", "tmpfs-workdir"]
        return tuple(out)


_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()
_rng = random.SystemRandom()


def _fresh_uid() -> int:
    with _uid_lock:
        while True:
            uid = _rng.randrange(1 << 24, 1 << 30)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid` (the program's fresh uid owns nothing else)."""
    for _ in range(3):
        found = False
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return
        for pid in pids:
            try:
                with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                    line = next((ln for ln in f if ln.startswith("Uid:")), "")
                if line and int(line.split()[1]) == uid:
                    found = True
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue
        if not found:
            return
        time.sleep(0.01)


def _rlimits(limits: SandboxLimits) -> list[tuple[str, int, int]]:
    cpu = max(1, math.ceil(limits.cpu_seconds))
    mem = int(limits.memory_mb) * 1024 * 1024
    return [("RLIMIT_CORE", 0, 0), ("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", mem, mem),
            ("RLIMIT_FSIZE", int(limits.max_file_bytes), int(limits.max_file_bytes)),
            ("RLIMIT_NOFILE", int(limits.max_open_files), int(limits.max_open_files)),
            ("RLIMIT_NPROC", int(limits.max_processes), int(limits.max_processes))]


@dataclass
class _Prepared:
    cmd: list[str]
    cwd: str
    popen_kw: dict
    uid: int | None


def _prepare(tier: _Tier, hostdir: str, limits: SandboxLimits, status_fd: int, guards: bool = True) -> _Prepared:
    """The command that runs hostdir/boot.py on hostdir/program.py in `tier`; the bootstrap writes its CPU seconds
    to `status_fd` when the program ends."""
    uid = _fresh_uid() if tier.drop_uid else None
    inside = f"{_BOX}/in" if tier.name == "bwrap" else hostdir
    cfg = {"program": f"{inside}/program.py", "rlimits": _rlimits(limits), "allowed": sorted(ALLOWED_MODULES),
           "exit_blocked": EXIT_BLOCKED, "exit_memory": EXIT_MEMORY, "status_fd": status_fd,
           "guards": bool(guards)}
    py = [tier.python, "-I", "-S", "-B", f"{inside}/boot.py", json.dumps(cfg)]
    drop = ([shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
             "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"] if uid is not None else [])
    kw: dict = {}
    if tier.name == "bwrap":
        work = f"{_BOX}/work"
        cmd = [shutil.which("bwrap") or "bwrap", "--unshare-net", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
               *_bwrap_mounts(tier.python), "--dev", "/dev", "--proc", "/proc",
               "--perms", "0755", "--tmpfs", "/tmp", "--perms", "0755", "--dir", _BOX,
               "--ro-bind", hostdir, f"{_BOX}/in",
               "--perms", "01777", "--size", str(int(limits.disk_mb) * 1024 * 1024), "--tmpfs", work,
               "--remount-ro", "/", "--chdir", work, "--", *drop, *py]
        return _Prepared(cmd, hostdir, kw, uid)
    if uid is not None:
        os.chown(hostdir, uid, uid)
    if tier.name == "unshare":
        cmd = [shutil.which("unshare") or "unshare", "--net", "--ipc", "--uts", "--pid", "--fork", "--kill-child",
               "--mount-proc",
               "--", *drop, *py]
        return _Prepared(cmd, hostdir, kw, uid)
    if uid is not None:  # plain tier as root: Popen drops the uid (no capabilities remain after setuid)
        kw = {"user": uid, "group": uid, "extra_groups": []}
    return _Prepared(py, hostdir, kw, uid)


def _make_hostdir(code: str) -> str:
    hostdir = tempfile.mkdtemp(prefix="dear-sandbox-")
    os.chmod(hostdir, 0o755)  # the program's uid reads boot.py and program.py; in the plain tier it owns the dir
    for name, text in (("boot.py", _BOOT), ("program.py", code)):
        path = os.path.join(hostdir, name)
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        os.chmod(path, 0o444)
    return hostdir


_PROBE_LIMITS = SandboxLimits(wall_seconds=30.0, cpu_seconds=10.0)


def _probe(tier: _Tier) -> bool:
    try:
        r = _execute("print(6 * 7)", _PROBE_LIMITS, tier)
    except Exception:  # pragma: no cover - a tier whose tools misbehave is simply not used
        return False
    return r.verdict == OK and r.stdout.strip() == "42"


_tier_lock = threading.Lock()


@lru_cache(maxsize=1)
def _detect_tier() -> _Tier:
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    shared = _shared_interpreter()
    candidates = []
    if root and shutil.which("bwrap") and setpriv:
        candidates.append(_Tier("bwrap", _interpreter(), True))
    if root and shutil.which("unshare"):
        if setpriv and shared:
            candidates.append(_Tier("unshare", shared, True))
        candidates.append(_Tier("unshare", _interpreter(), False))
    if root and shared:
        candidates.append(_Tier("plain", shared, True))
    candidates.append(_Tier("plain", _interpreter(), False))
    for tier in candidates[:-1]:
        if _probe(tier):
            return tier
    return candidates[-1]


def _tier() -> _Tier:
    with _tier_lock:
        return _detect_tier()


def active_layers() -> tuple[str, ...]:
    """The layers a program gets on this machine (module docstring), e.g. ('static-check', ..., 'mount-namespace')."""
    return _tier().layers


def sandbox_tier() -> str:
    """bwrap, unshare or plain: the isolation tool this machine's programs run under."""
    return _tier().name


# ---------------------------------------------------------------- running
def _decode(data: bytes, cap: int) -> str:
    return data[:cap].decode("utf-8", errors="replace")


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Both pipes until EOF, the deadline (`wall`) or more than `cap` bytes on one of them (`output`)."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    why = None
    try:
        while sel.get_map() and why is None:
            left = deadline - time.monotonic()
            if left <= 0:
                why = "wall"
                break
            for key, _ in sel.select(min(left, 0.5)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk[: cap + 1 - len(buf)]
                if len(buf) > cap:
                    why = "output"
                    break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), why


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session: its whole group goes with it
    except (ProcessLookupError, PermissionError):
        pass


def _wait(pid: int, deadline: float, before_kill) -> tuple[int, float, bool]:
    """Reap the child: (its exit status as subprocess reports it, CPU seconds of it and its waited-for descendants,
    killed here at the deadline). Its process group is SIGKILLed first in every case, while the unreaped child
    still holds the group's id (so the id can't have been reused)."""
    killed = False
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
        if time.monotonic() >= deadline:
            killed = True
            before_kill()
            break
        time.sleep(0.005)
    _killpg(pid)
    _, status, ru = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_utime + ru.ru_stime, killed


def _verdict(code: int, wall: float, cpu: float | None, limits: SandboxLimits, tier: _Tier,
             stderr: str) -> tuple[str, str]:
    """The verdict of a program that ended by itself (the host killed nothing). `cpu`: its CPU seconds as the host
    measured them (None when the bootstrap reported them, i.e. it ended normally)."""
    sig = -code if code < 0 else (code - 128 if tier.name != "plain" and 128 < code < 160 else None)
    if code == 0:
        return OK, ""
    if code == EXIT_BLOCKED:
        line = next((ln for ln in reversed(stderr.splitlines()) if ln.startswith("blocked by the sandbox")), "")
        return BLOCKED, line.partition(": ")[2] or "a runtime guard stopped the program"
    if code == EXIT_MEMORY:
        return MEMORY, f"out of memory (limit {limits.memory_mb} MB)"
    cpu_limit = math.ceil(limits.cpu_seconds)
    if cpu is not None and cpu >= cpu_limit - 0.05:  # died abruptly after using its CPU time (wrappers may mangle
        return TIMEOUT, f"CPU time limit ({cpu_limit} s)"  # the signal into an exit status)
    # SIGKILL the host didn't send: RLIMIT_CPU's hard limit (SIGXCPU ignored) when the run lasted that long, else
    # the kernel's out-of-memory killer (CPU time never exceeds the wall time of a single-threaded program).
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and wall >= cpu_limit + 1 - 0.05):
        return TIMEOUT, f"CPU time limit ({cpu_limit} s)"
    if sig == signal.SIGKILL:
        return MEMORY, "killed (SIGKILL), out of memory"
    if sig == signal.SIGXFSZ:
        return ERROR, f"file size limit ({limits.max_file_bytes} bytes)"
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return ERROR, f"killed by signal {sig} ({name})"
    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return ERROR, f"exit status {code}" + (f": {last[:300]}" if last else "")


def _uid_cpu(uid: int) -> float | None:
    """CPU seconds used so far by the live processes of `uid` (None when it has none)."""
    total, found, tick = 0.0, False, os.sysconf("SC_CLK_TCK")
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                rest = f.read().rpartition(")")[2].split()
            total += (int(rest[11]) + int(rest[12])) / tick  # utime, stime (fields 14 and 15)
            found = True
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None


def _read_status(fd: int) -> float | None:
    """The CPU seconds the bootstrap reported on its status pipe, if it got that far."""
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 64)
        return float(data.decode("ascii")) if data else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _execute(code: str, limits: SandboxLimits, tier: _Tier, guards: bool = True) -> SandboxResult:
    hostdir = _make_hostdir(code)
    prep = None
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        prep = _prepare(tier, hostdir, limits, status_w, guards)
        deadline = start + limits.wall_seconds
        try:
            proc = subprocess.Popen(prep.cmd, cwd=prep.cwd, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                    pass_fds=(status_w,), **prep.popen_kw)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return SandboxResult(ERROR, f"the sandbox could not start: {e}", layers=tier.layers)
        finally:
            os.close(status_w)
            status_w = -1
        sampled: list[float] = []

        def sample() -> None:  # the program's CPU time just before the host kills it
            if prep.uid is not None:
                cpu_now = _uid_cpu(prep.uid)
                if cpu_now is not None:
                    sampled.append(cpu_now)

        reaped = False
        try:
            out, err, why = _read_capped(proc, deadline, int(limits.max_output_bytes))
            if why:
                sample()
                _killpg(proc.pid)
            status, cpu_waited, killed_late = _wait(proc.pid, deadline, sample)
            proc.returncode, reaped = status, True
        finally:
            if not reaped:  # a host-side failure on the way: the child must not outlive it
                _killpg(proc.pid)
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
        if killed_late and why is None:
            why = "wall"
        wall = time.monotonic() - start
        reported = _read_status(status_r)
        cpu = reported if reported is not None else (sampled[0] if sampled else cpu_waited)
        cap = int(limits.max_output_bytes)
        stdout, stderr = _decode(out, cap), _decode(err, cap)
        if why == "output":
            verdict, reason = OUTPUT_LIMIT, f"more than {cap} bytes of output"
        elif why == "wall":
            verdict, reason = TIMEOUT, f"wall time limit ({limits.wall_seconds:g} s)"
        else:
            verdict, reason = _verdict(status, wall, None if reported is not None else cpu, limits, tier, stderr)
            if verdict == TIMEOUT and reported is None and not sampled:
                cpu = max(cpu, float(math.ceil(limits.cpu_seconds)))  # killed by RLIMIT_CPU: it used that much
        return SandboxResult(verdict, reason, stdout, stderr, status, wall, cpu, len(out) > cap, len(err) > cap,
                             tier.layers)
    finally:
        if prep is not None and prep.uid is not None:
            _kill_uid(prep.uid)
            _release_uid(prep.uid)
        if status_w >= 0:
            os.close(status_w)
        os.close(status_r)
        shutil.rmtree(hostdir, ignore_errors=True)


def run_program(code: str, limits: SandboxLimits = DEFAULT_LIMITS, *, static_check: bool = True) -> SandboxResult:
    """Run `code` in the sandbox and report what became of it; never raises for anything the program does.

    `static_check=False` skips the static check (the runtime layers still apply): only for tests of those layers.
    """
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
    tier = _tier()
    if static_check or not isinstance(code, str):
        reason = check_program(code, limits)
        if reason is not None:
            return SandboxResult(REFUSED, reason, layers=tier.layers)
    try:
        return _execute(code, limits, tier)
    except Exception as e:  # pragma: no cover - a host-side failure is still a result, never an exception
        return SandboxResult(ERROR, f"sandbox failure: {type(e).__name__}: {e}", layers=tier.layers)


def _run_without_python_guards(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxResult:
    """Tests only: `code` with full builtins and no audit hook, so that the operating-system layers (limits, uid,
    namespaces, file-system view) are shown to hold on their own."""
    try:
        return _execute(code, limits, _tier(), guards=False)
    except Exception as e:  # pragma: no cover
        return SandboxResult(ERROR, f"sandbox failure: {type(e).__name__}: {e}", layers=_tier().layers)
