"""Serve DEAR-regulated debates as an OpenAI-compatible chat model (Starlette + uvicorn).

    python -m dear.serve --policy my-policy --llm local --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    r = client.chat.completions.create(model="dear:integer", messages=[{"role": "user", "content": "17 * 23?"}])
    print(r.choices[0].message.content, r.model_extra["dear"]["rounds"])

Each request runs one debate on its last user message, by the method its `model` names: `dear` (the
policy regulates the debate) or a baseline (`mad`, `mad-stop`, `sc`, `cot`, `majority`; dear.serve.methods).
The voted answer is the assistant message; `dear` holds every round's answers per agent, the regulator's
masks and sampling; `usage` is the debate's total. `max_tokens` (or `max_completion_tokens`) caps the
debate's completion tokens over all agents and rounds, `dear_max_rounds` its exchange rounds: a debate a
budget stops early votes over what it has and ends with `finish_reason: "length"`. `stream: true` sends each
round as it finishes, then the answer. Requests that overlap in time share the backend's batches, whatever
their methods (`dear.serve.scheduler`). The request fields used, ignored and rejected are listed in
`dear.serve.schemas`; the whole contract is in docs/SERVING.md. With `--api-key` (or DEAR_API_KEY) every
endpoint but /health needs `Authorization: Bearer KEY` (the clients' `api_key`); request bodies over
`--max-body-size` get 413, and a question too long for the backend's context 400 before any agent runs.
`--agent-profiles` (dear/debate/profiles.py, as in dear.infer) gives each agent its backend, reply style and
token limit, in every method; the responses name them (`dear.agent_profiles`, each agent's `profile`).
"""
