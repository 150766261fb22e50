"""Straggler scores of a whole job store, for tests that check the model on real rows."""

from __future__ import annotations

from hpcml.observe.stragglers import RankScore, score_ranks


def from_job(job, section: str = "step", **kw) -> list[RankScore]:
    """Scores from a job store (``hpcml.observe.store.read_job``) for one section."""
    import pyarrow.compute as pc
    t = job.table
    mask = pc.and_(pc.equal(t["kind"], "section"), pc.equal(t["name"], section))
    rows = t.filter(pc.and_(mask, pc.is_valid(t["step"])))
    return score_ranks(rows["rank"].to_numpy(), rows["step"].to_numpy(), rows["value"].to_numpy(),
                       meta_ranks=job.meta.get("ranks"), **kw)
