"""``data.BlendedTokens``: several token files in fixed proportions, by global sample index."""

import pytest
import torch

from parc.runtime.train import data


def token_file(tmp_path, name, first, count=64):
    path = tmp_path / name
    torch.arange(first, first + count, dtype=torch.int32).to(torch.uint16).numpy().tofile(path)
    return data.TokenFile(str(path), 4, "uint16", seed=7)


@pytest.mark.parametrize("weights", [(0.3, 0.7), (1, 1, 1), (5, 0.001, 2.5), (0.25, 0.25, 0.5)])
def test_every_prefix_holds_each_file_in_proportion(weights):
    blend = data.BlendedTokens([None] * len(weights), weights)
    assert sum(blend.counts) == blend.PERIOD and min(blend.counts) >= 1
    total = sum(weights)
    seen = [0] * len(weights)
    for i in range(3 * blend.PERIOD):
        k, j = blend.locate(i)
        assert j == seen[k]  # each file's samples are read in order, none twice, none skipped
        seen[k] += 1
        for d, w in enumerate(weights):
            share = blend.counts[d] / blend.PERIOD
            assert abs(seen[d] - share * (i + 1)) <= 1
            assert abs(share - w / total) <= 1 / blend.PERIOD


def test_blend_counts_round_to_the_period():
    assert data.blend_counts([0.3, 0.7], 10) == [3, 7]
    assert data.blend_counts([1, 1, 1], 10) == [4, 3, 3]  # the first takes the tie
    assert data.blend_counts([1e-9, 1], 10) == [1, 9]  # no file is left out


def test_blend_reads_the_files_samples_and_is_deterministic(tmp_path):
    a, b = token_file(tmp_path, "a.bin", 0), token_file(tmp_path, "b.bin", 1000)
    blend = data.BlendedTokens([a, b], [0.3, 0.7])
    x, y = blend.batch(range(10))
    assert x.shape == y.shape == (10, 4) and torch.equal(x[:, 1:], y[:, :-1])
    from_a = [i for i in range(10) if blend.locate(i)[0] == 0]
    assert len(from_a) == 3 and all(int(x[i, 0]) < 1000 for i in from_a)
    assert all(int(x[i, 0]) >= 1000 for i in range(10) if i not in from_a)
    for i in range(10):
        k, j = blend.locate(i)
        assert torch.equal(x[i], (a, b)[k].batch([j])[0][0])
    again = data.BlendedTokens([a, b], [3, 7])  # the same proportions, spelled otherwise
    assert torch.equal(again.batch(range(10))[0], x)


def test_resume_under_another_dp_size_reads_the_same_samples(tmp_path):
    """The data position is the global sample index: steps 3-4 read the same samples
    at dp 1 (grad_accum 4) and dp 2 (grad_accum 2), wherever the run restarted."""
    blend = data.BlendedTokens([token_file(tmp_path, "a.bin", 0), token_file(tmp_path, "b.bin", 1000)], [1, 2])

    def step_rows(step, dp_size, grad_accum):
        rows = []
        for micro in range(grad_accum):
            for rank in range(dp_size):
                idx = data.sample_indices(step, micro, micro_batch=2, grad_accum=grad_accum, dp_rank=rank,
                                          dp_size=dp_size)
                rows.append(blend.batch(idx)[0])
        return sorted(map(tuple, torch.cat(rows).tolist()))

    for step in (3, 4):
        assert step_rows(step, 1, 4) == step_rows(step, 2, 2)


def test_a_blend_refuses_bad_weights():
    with pytest.raises(ValueError, match="one positive weight"):
        data.BlendedTokens([None, None], [1, 0])
    with pytest.raises(ValueError):
        data.BlendedTokens([], [])


def test_blend_of_files_needs_one_file_per_weight(tmp_path):
    token_file(tmp_path, "a.bin", 0)
    with pytest.raises(SystemExit, match="--data names 1 file, but the blend has 2 weights"):
        data.blend([str(tmp_path / "a.bin")], (1.0, 3.0), 4)
    token_file(tmp_path, "b.bin", 1000)
    both = data.blend([str(tmp_path / "a.bin"), str(tmp_path / "b.bin")], (1.0, 3.0), 4, seed=5)
    assert [f.seed for f in both.datasets] == [5, 6]  # each file draws its own windows
