"""Stage placement as data: which virtual stages a pipeline rank holds, and who its
neighbours are per chunk.

Takes: a placement kind, the pipeline ranks p and the model chunks per rank v. Gives:
``Placement`` (``stage`` of a rank's chunk, ``holder`` of a virtual stage, a chunk's
``previous`` and ``following`` holder, ``stages_of`` a rank) and ``placement_for``, the
placement a schedule kind runs on. Pure Python, no torch. Before: nothing. After:
``schedule`` (the lists' peers), ``schedule_sim`` (message keys, checks),
``model.build_stages`` (which layers a rank builds), ``pipeline`` (tags, local
hand-overs, the tied embedding's copies) and the planner's cost model.

Note [placements]: virtual stages 0 .. p·v-1 are the model in order (stage 0 embeds,
the last computes the loss); a placement says which (rank, chunk) runs each.
- ``interleaved`` (Megatron): chunk c of rank r is stage c·p + r, so activations go
  round the ranks v times, always to the next rank (1f1b, gpipe, zero_bubble: v = 1).
- ``v`` (ZB-V, Qi et al. 2024): v = 2, chunk 0 of rank r is stage r and chunk 1 is
  stage 2p-1-r: down the ranks and back up, so rank 0 holds the first and the last
  stage and the turn (stage p-1 → p) stays on rank p-1: a *local* edge, handed over
  in memory with no message.
- ``chimera`` (Li & Hoefler, SC21): two pipelines over the same p model stages in
  opposite directions; chunk 0 of rank r is stage r of the down pipeline, chunk 1 is
  stage p-1-r of the up one (a *replica*: each stage is held twice, by ranks r and
  p-1-r, whose gradients are summed). A micro-batch runs through one pipeline only
  (``carries``: even micro-batches down, odd ones up); stages are numbered 0..p-1 in
  both, and a micro-batch's messages are told apart by the micro-batch.
Chunks of a rank are numbered in increasing stage order under every placement but
chimera's (by pipeline there).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("interleaved", "v", "chimera")
FIXED_CHUNKS = {"v": 2, "chimera": 2}


@dataclass(frozen=True, slots=True)
class Placement:
    kind: str
    ranks: int  # p: ranks of the pipeline group
    chunks: int = 1  # v: model chunks per rank

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown stage placement {self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.ranks < 1 or self.chunks < 1:
            raise ValueError(f"a placement needs ranks >= 1 and chunks >= 1, got {self.ranks}, {self.chunks}")
        if self.kind in FIXED_CHUNKS and self.chunks != FIXED_CHUNKS[self.kind]:
            raise ValueError(f"the {self.kind} placement holds two chunks per rank, got chunks = {self.chunks}")
        if self.kind == "chimera" and self.ranks % 2:
            raise ValueError(f"the chimera placement needs an even number of ranks, got {self.ranks}")

    @property
    def virtual_stages(self) -> int:
        """Stages of one pipeline (chimera: of each of its two)."""
        return self.ranks if self.kind == "chimera" else self.ranks * self.chunks

    def pipeline(self, chunk: int) -> int:
        """Which pipeline ``chunk`` is in: always 0, but chimera's up pipeline (chunk 1)."""
        return chunk if self.kind == "chimera" else 0

    def replica(self, chunk: int) -> int | None:
        """Which copy of its stage ``chunk`` is, where the placement holds each stage twice
        (chimera's: the pipeline, 1 for the up one's copy); None elsewhere (Note [stage
        replicas] in model.py)."""
        return self.pipeline(chunk) if self.kind == "chimera" else None

    def carries(self, chunk: int, micro: int) -> bool:
        """Does ``micro`` run through ``chunk``? Every chunk, but chimera's even micro-batches
        take the down pipeline (chunk 0) and odd ones the up one (chunk 1)."""
        return self.kind != "chimera" or micro % 2 == chunk

    def stage(self, rank: int, chunk: int) -> int:
        """The virtual stage that ``chunk`` of ``rank`` runs."""
        if not (0 <= rank < self.ranks and 0 <= chunk < self.chunks):
            raise ValueError(f"no chunk {chunk} on rank {rank} in {self}")
        if self.kind == "v" and chunk == 1:
            return 2 * self.ranks - 1 - rank
        if self.kind == "chimera":
            return rank if chunk == 0 else self.ranks - 1 - rank
        return chunk * self.ranks + rank

    def holder(self, stage: int, pipeline: int = 0) -> tuple[int, int]:
        """(rank, chunk) that runs virtual stage ``stage`` (of ``pipeline``, under chimera)."""
        if not 0 <= stage < self.virtual_stages:
            raise ValueError(f"no virtual stage {stage} in {self}")
        if self.kind == "v" and stage >= self.ranks:
            return 2 * self.ranks - 1 - stage, 1
        if self.kind == "chimera":
            return (stage, 0) if pipeline == 0 else (self.ranks - 1 - stage, 1)
        return stage % self.ranks, stage // self.ranks

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The virtual stages ``rank`` holds, by chunk (increasing)."""
        return tuple(self.stage(rank, chunk) for chunk in range(self.chunks))

    def previous(self, rank: int, chunk: int) -> tuple[int, int] | None:
        """(rank, chunk) of the stage feeding this chunk its activations; None on stage 0."""
        here = self.stage(rank, chunk)
        return None if here == 0 else self.holder(here - 1, self.pipeline(chunk))

    def following(self, rank: int, chunk: int) -> tuple[int, int] | None:
        """(rank, chunk) of the stage this chunk's activations go to; None on the last stage."""
        here = self.stage(rank, chunk)
        return None if here == self.virtual_stages - 1 else self.holder(here + 1, self.pipeline(chunk))


PLACEMENT_OF = {"zero_bubble_v": "v", "chimera": "chimera"}
"""Schedule kinds that do not run on Megatron's placement."""


def placement_for(schedule: str, ranks: int, chunks: int = 1) -> Placement:
    """The placement a schedule kind runs on (Note [placements]): ZB-V's V, chimera's
    two pipelines, else Megatron's."""
    return Placement(PLACEMENT_OF.get(schedule, "interleaved"), ranks, chunks)


def chunk_stages(kind: str, ranks: int, stage_count: int) -> Placement:
    """The placement of ``stage_count`` model stages (train.py's ``PIPELINE_STAGES``)
    over ``ranks``: chimera holds its p stages twice, the others split them."""
    if kind == "chimera":
        return Placement(kind, ranks, 2)
    return Placement(kind, ranks, stage_count // ranks)
