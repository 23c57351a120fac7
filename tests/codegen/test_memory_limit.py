"""What the usable memory does to a build (Note: ``USABLE_MEMORY``, 95% of the device's).

A layout the planner must pick is refused when none fits, the message saying the usable
limit and pointing at the first ``auto``; a layout the spec writes whole builds, with a
PAR0808 warning when it is predicted over that limit (the prediction can be wrong).
"""

from __future__ import annotations

from parc.codegen.cli import main

BIG = ["--set", "model.seq_len=8192", "--set", "train.micro_batch=128", "--set", "train.global_batch=1024"]
WRITTEN = ["--set", "parallel.zero=0", "--set", "parallel.sp=false", "--set", "parallel.tp=1", "--set", "parallel.dp=8"]


def test_a_written_layout_over_the_usable_memory_builds_with_a_warning(tmp_path, capsys):
    assert main(["build", "examples/gpt2-small.par", "-o", str(tmp_path / "b"), *BIG, *WRITTEN]) == 0
    err = capsys.readouterr().err
    assert "warning[PAR0808]: this layout is predicted to need " in err
    assert "GiB per rank, over the usable 70.8 GiB (95% of the device's 74.5 GiB); built anyway, as written" in err
    assert (tmp_path / "b" / "train.py").is_file()


def test_a_written_layout_that_fits_says_nothing(tmp_path, capsys):
    assert main(["build", "examples/gpt2-small.par", "-o", str(tmp_path / "b")]) == 0
    assert "PAR0808" not in capsys.readouterr().err


def test_no_planned_layout_fits_says_the_limit_at_the_auto(tmp_path, capsys):
    assert main(["build", "examples/gpt2-small.par", "-o", str(tmp_path / "b"), "--set", "train.micro_batch=auto",
                 "--set", "model.layers=96", "--set", "model.hidden=12288", "--set", "model.heads=96",
                 "--set", "model.ffn=49152"]) == 1
    err = capsys.readouterr().err
    assert "--set 1:1:19: error[PAR0801]: no layout that parc build can generate fits in memory: the smallest" in err
    assert "over the usable 70.8 GiB (95% of the device's 74.5 GiB: allocator and runtime headroom)" in err
    assert not (tmp_path / "b").exists()
