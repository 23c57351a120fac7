"""``model.documents = separate`` at one rank (runtime/models/documents.py, data.py's Note
[documents of a sample]): the mask and the positions change the loss on a batch of several
documents; a token's output does not depend on another document's tokens, nor on where its
document starts in the sequence; the data yields the ids (a token file's OUT.idx, synthetic
data's drawn documents) and leaves the tokens as joined reads them. Layouts are the parity
suite's (tests/parity/test_parity.py, ``DOCUMENT_LAYOUTS``)."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_loop import CONFIGS  # noqa: E402

from parc.runtime.models.documents import Documents  # noqa: E402
from parc.runtime.train import data  # noqa: E402
import built  # noqa: E402  (tests/runtime/built.py)

B = 2


def _net(arch, documents, *, last=True):
    config = dataclasses.replace(CONFIGS[arch], documents=documents)
    net = built.build(config, seed=3, device=torch.device("cpu"), kernels="eager").double()
    if not last:  # the hidden states before the final norm and head: each token's output
        net.last = False
    return net


def _batch(config, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = config.seq_len
    tokens = torch.randint(0, config.vocab, (B, T), generator=gen)
    targets = torch.randint(0, config.vocab, (B, T), generator=gen)
    # three documents in the first sequence, two in the second
    ids = torch.zeros(B, T, dtype=torch.int64)
    ids[0, T // 4 :], ids[0, T // 2 :] = 1, 2
    ids[1, T // 3 :] = 1
    return tokens, targets, ids


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_separate_changes_the_loss_of_a_batch_of_documents(arch):
    config = CONFIGS[arch]
    tokens, targets, ids = _batch(config)
    joined = _net(arch, "joined")(tokens, targets)
    separate = _net(arch, "separate")(tokens, targets, documents=ids)
    assert abs(separate.item() - joined.item()) > 1e-6
    one_document = _net(arch, "separate")(tokens, targets, documents=torch.zeros_like(ids))
    assert one_document.item() == pytest.approx(joined.item(), rel=1e-12)  # one document: joined's numbers


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_a_token_sees_only_its_own_document(arch):
    """Perturbing one document's tokens leaves every other document's outputs unchanged; a
    document moved to another place in the sequence gives the same outputs (positions
    restart at its start: rotary for llama, learned for gpt)."""
    config = CONFIGS[arch]
    tokens, _, ids = _batch(config)
    net = _net(arch, "separate", last=False)
    with torch.no_grad():
        out = net(tokens, documents=ids)
        changed = tokens.clone()
        changed[ids == 1] = (changed[ids == 1] + 7) % config.vocab  # the middle/last document of each row
        perturbed = net(changed, documents=ids)
        other = (ids != 1).unsqueeze(-1).expand_as(out)
        torch.testing.assert_close(perturbed[other], out[other], rtol=0, atol=0)
        assert not torch.allclose(perturbed[~other], out[~other])
        # the first row's last document (from T/2) alone at the start of a sequence of one document
        T = config.seq_len
        alone = tokens[:1, T // 2 :]
        moved = net(alone, documents=torch.zeros_like(alone))
        torch.testing.assert_close(moved[0], out[0, T // 2 :], rtol=1e-12, atol=1e-12)


def test_positions_restart_at_each_document():
    documents = Documents()
    documents.use(torch.tensor([[0, 0, 1, 1, 1, 2], [4, 4, 4, 4, 5, 5]]), "cpu")
    assert documents.positions(torch.arange(6)).tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 1]]
    assert documents.positions(torch.tensor([3, 5])).tolist() == [[1, 0], [3, 1]]
    mask = documents.mask(torch.tensor([2, 3]), torch.arange(6))[0, 0]
    assert mask.tolist() == [[False, False, True, False, False, False], [False, False, True, True, False, False]]


def test_synthetic_documents_keep_the_tokens():
    joined = data.SyntheticTokens(64, 32, seed=7)
    separate = data.SyntheticTokens(64, 32, seed=7, documents="separate")
    inputs, targets = joined.batch([0, 1, 2])
    inputs2, targets2, ids = separate.batch([0, 1, 2])
    assert torch.equal(inputs, inputs2) and torch.equal(targets, targets2)
    assert ids.shape == (3, 32) and (ids[:, :1] == 0).all() and (ids.diff(dim=1) >= 0).all()
    assert int(ids[:, -1].max()) >= 2  # several documents a sequence
    assert torch.equal(ids, separate.batch([0, 1, 2])[2])  # by (seed, index) alone


def test_token_file_reads_its_idx(tmp_path):
    path = tmp_path / "corpus.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    np.array([0, 10, 25, 60], dtype=np.uint64).tofile(tmp_path / "corpus.idx")
    tokens = data.TokenFile(str(path), 8, "uint16", seed=3, documents="separate")
    inputs, targets, ids = tokens.batch(list(range(6)))
    offsets = torch.tensor([0, 10, 25, 60])
    for row, row_ids in zip(inputs, ids):  # inputs are the file's positions (arange)
        expected = torch.searchsorted(offsets, row, right=True)
        assert row_ids.tolist() == (expected - expected[0]).tolist()
    assert torch.equal(inputs, data.TokenFile(str(path), 8, "uint16", seed=3).batch(list(range(6)))[0])


def test_a_token_file_without_idx_ends_the_run_in_one_line(tmp_path):
    path = tmp_path / "corpus.bin"
    np.arange(100, dtype=np.uint16).tofile(path)
    with pytest.raises(SystemExit) as ended:
        data.TokenFile(str(path), 8, "uint16", documents="separate")
    message = str(ended.value)
    assert message.startswith("train.py: --data ") and "corpus.idx" in message and "parc data prepare" in message
    assert "\n" not in message


def test_masked_blocks_merge_into_masked_attention():
    """The ring's step (kernels/reference.py with ``allowed``): two key blocks, one of which
    some query rows see nothing of (lse −∞, output 0), merge into SDPA with the whole mask."""
    from parc.runtime.kernels import reference
    from parc.runtime.parallel.context.ring import merge

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    documents = Documents()
    documents.use(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2]]), "cpu")
    positions = torch.arange(8)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=documents.mask(positions, positions))
    same = documents.same(positions, positions)
    out, lse = reference.block_attention(q, k[:, :, 4:], v[:, :, 4:], False, 0.5, allowed=same[..., 4:]
                                         & (positions[4:] <= positions[:, None]))
    assert torch.isinf(lse[0, 0, :3]).all() and (out[0, :, :3] == 0).all()  # document 0 sees no key from 4 on
    first, first_lse = reference.block_attention(q, k[:, :, :4], v[:, :, :4], False, 0.5, allowed=same[..., :4]
                                                 & (positions[:4] <= positions[:, None]))
    assert torch.isinf(first_lse[0, 0, 7])  # the last token, a document of its own, sees none of the first block
    merge(first, first_lse, out, lse)
    torch.testing.assert_close(first, whole, rtol=1e-12, atol=1e-12)
