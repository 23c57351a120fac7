"""The per-step line's tokens seen and time left (``metrics.MetricsLogger``): their format
and arithmetic, never a measured time."""

from __future__ import annotations

import re

import pytest

from parc.runtime.train import metrics

RECORD = dict(step=1, loss=2.5, grad_norm=0.75, lr=1e-3, tokens_per_s=1000.0, mfu=None,
              peak_mem_bytes=2**20, step_time_s=10.0, tokens_seen=1024)


@pytest.mark.parametrize("value, words", [(7, "7"), (1024, "1.02k"), (20_480, "20.5k"),
                                          (1_310_720, "1.31M"), (2.1e9, "2.1B"), (3e12, "3T")])
def test_count_words(value, words):
    assert metrics.count_words(value) == words


@pytest.mark.parametrize("seconds, words", [(0, "0:00:00"), (7.4, "0:00:07"), (3723, "1:02:03"),
                                            (183845, "2d 3:04:05"), (-3, "0:00:00")])
def test_duration_words(seconds, words):
    assert metrics.duration_words(seconds) == words


def test_the_line_ends_with_tokens_seen_and_the_time_left(capsys):
    logger = metrics.MetricsLogger(None, enabled=True, steps=10)
    logger.log(RECORD)  # 9 steps left at 10 s
    logger.log({**RECORD, "step": 2, "step_time_s": 30.0, "tokens_seen": 2048})  # the first left out: 8 × 30 s
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(" | 1.02k tokens | eta 0:01:30")
    assert lines[1].endswith(" | 2.05k tokens | eta 0:04:00")
    assert re.search(r"\| 1,000 tok/s \|", lines[0])


def test_without_steps_or_tokens_seen_the_line_says_neither(capsys):
    logger = metrics.MetricsLogger(None, enabled=True)
    logger.log({k: v for k, v in RECORD.items() if k != "tokens_seen"})
    line = capsys.readouterr().out
    assert "eta" not in line and "tokens |" not in line and line.rstrip().endswith("10.000 s")
