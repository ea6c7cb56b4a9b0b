"""Floor 4: evaluation of trained DEAR policies against baselines (runner, methods, report, plots).

    python -m eval.run --checkpoint RUN_DIR_OR_EXPORT --benchmarks math500,gpqa_diamond --n 100 --llm local

Metrics live in `dear.metrics` (plain arrays, no project imports); this package turns traces into them.
"""
