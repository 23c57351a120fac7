"""checkpoint_dcp.load's boxes on one rank (runtime/checkpoints/checkpoint_dcp.py): two local
boxes of one tensor starting at the same place are read once; where they differ in size
(ZeRO-3 under ZB-V: rank 0 holds both copies of the tied embedding, their shards cut from
two units of different sizes) the smaller is the larger's leading part."""

from __future__ import annotations

import torch

from parc.runtime.checkpoints import checkpoint_dcp
from parc.runtime.checkpoints.checkpoint_shards import Piece


def test_boxes_at_one_place_of_two_sizes_both_load(tmp_path):
    table = torch.arange(40, dtype=torch.float32).view(10, 4)
    checkpoint_dcp.save({}, str(tmp_path / "ck"), [Piece("model.embed.weight", (10, 4), (0, 0), table)])
    rows = [torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, 4), torch.zeros(2, 4)]
    starts = [(2, 0), (2, 0), (2, 0), (7, 0)]
    checkpoint_dcp.load(str(tmp_path / "ck"), {},
                        [Piece("model.embed.weight", (10, 4), at, box) for at, box in zip(starts, rows)])
    for (row, _), box in zip(starts, rows):
        torch.testing.assert_close(box, table[row : row + box.shape[0]], rtol=0, atol=0)
