"""The synthetic server says what it answers (issue 59 item 7): `python -m dear.serve --llm sim` names the
synthetic task at start-up (with an example question) and in every `/v1/models` entry, refuses another question
with a 400 that shows the header it needs, and docs/SERVING.md's first example runs against it as written.

In process: the app `dear.serve` would run (`serve_app`), spoken to by the official `openai` client through
Starlette's TestClient (an httpx client that calls the ASGI app, lifespan included)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest

openai = pytest.importorskip("openai")
testclient = pytest.importorskip("starlette.testclient")

from dear.serve.__main__ import parse_args, serve_app  # noqa: E402
from dear.serve.app import synthetic_example  # noqa: E402
from tests import ROOT  # noqa: E402

SERVING = ROOT / "docs" / "SERVING.md"


def first_blocks() -> tuple[str, str]:
    """docs/SERVING.md's first ```bash block and first ```python block."""
    text = SERVING.read_text(encoding="utf-8")
    bash = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    return bash, python


@pytest.fixture(scope="module")
def quickstart():
    """The server of the first example's `python -m dear.serve ...` line, and its start-up lines."""
    bash, _ = first_blocks()
    line = next(x for x in bash.splitlines() if x.startswith("python -m dear.serve"))
    argv = shlex.split(line.split("#")[0])[3:]
    args = parse_args(argv)
    assert args.llm == "sim"  # the first example needs no model download
    app, lines = serve_app(args)
    with testclient.TestClient(app) as http:
        yield http, lines, args


def test_startup_and_the_model_list_name_the_synthetic_task(quickstart):
    http, lines, args = quickstart
    note = lines[-1]
    assert "answers only questions of the 'synthetic' task" in note and "[synthetic id=" in note
    assert repr(synthetic_example()) in note
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
    models = client.models.list().data
    assert models and all(m.model_extra["task"] == "synthetic" for m in models)
    assert "'synthetic' task" in models[0].model_extra["answers"]
    # a question without the header: 400 naming the task and showing the header it needs
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="dear", messages=[{"role": "user", "content": "What is 17 * 23?"}])
    assert "'synthetic' task" in err.value.message and "[synthetic id=" in err.value.message


def test_the_first_example_of_serving_md_works_as_written(quickstart):
    http, _, _ = quickstart
    _, python = first_blocks()
    assert _question_of(python) == synthetic_example()  # the doc's question is the task's first test question

    class OpenAI(openai.OpenAI):  # the example's own client, its requests sent into the app instead of a port
        def __init__(self, **kw):
            assert kw["base_url"] == "http://127.0.0.1:8000/v1"
            super().__init__(**kw, http_client=http, max_retries=0)

    out = io.StringIO()
    code = python.replace("from openai import OpenAI\n", "")
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(SERVING), "exec"), {"OpenAI": OpenAI})  # noqa: S102 - our own documentation
    answer, rounds, tokens = out.getvalue().splitlines()
    assert answer.strip() and rounds.startswith("[{") and int(tokens) > 0


def _question_of(python: str) -> str:
    scope: dict = {}
    start = python.index("question = ")
    end = python.index("\nr = ")
    exec(python[start:end], scope)  # noqa: S102 - the doc's own string literal
    return scope["question"]
