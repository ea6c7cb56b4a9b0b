"""`python -m train.gradient_snr`: the policy-gradient SNR per action direction, on the synthetic backend."""

from __future__ import annotations

import math

import pytest

from train.gradient_snr import DIRECTIONS, main, measure, parse_point

SMALL = ["rollout.episodes_per_iter=32", "rollout.envs_per_worker=16"]


def test_parse_point_reads_a_subset_and_names_bad_text():
    assert parse_point("p=0,T=0.1") == {"p": 0.0, "T": 0.1}
    with pytest.raises(ValueError, match="--at: expected p=..., T=..., top_p=..."):
        parse_point("temperature=0.1")


def test_measure_gives_every_direction():
    directions = measure("sim-stylised", SMALL, 2, {})
    assert [d.name for d in directions] == list(DIRECTIONS)
    assert all(math.isfinite(d.mean) and d.stderr > 0 and d.snr_one_batch >= 0 for d in directions)


def test_moving_the_start_to_read_nobody_silences_the_read_direction():
    read = measure("sim-stylised", SMALL, 2, {"p": 0.0})[2]
    assert abs(read.mean) < 0.05  # with p ~ 0 almost no pair is drawn, so its score is ~0


def test_cli_prints_the_table(capsys):
    assert main(["--config", "sim-stylised", "--batches", "2", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "| T |" in out and "| top-p |" in out and "synthetic" in out
