"""What a job did (``hpcml.observe.progress``): steps, samples, the last metric values, and
which rank's value each is."""

from __future__ import annotations

import numpy as np

from hpcml.observe.progress import last_values, line, summarise
from hpcml.observe.series import Series


def metric(rows: list[tuple[int, int, float]]) -> Series:
    """(rank, ts_us, value) rows as the store's series hold them."""
    r, t, v = zip(*rows)
    return Series(np.array(r, np.int64), np.array(t, np.int64), np.array(v, float))


def test_rank_0s_last_value_else_the_lowest_rank_that_logged_it():
    series = {("metric", "loss"): metric([(0, 10, 2.5), (1, 30, 2.3), (0, 20, 2.4173), (2, 40, 2.301)]),
              ("metric", "val_loss"): metric([(3, 10, 1.0), (2, 5, 1.5), (2, 50, 1.25), (3, 60, np.nan)]),
              ("metric", "empty"): metric([(0, 1, np.nan)]), ("host", "cpu"): metric([(0, 1, 50.0)])}
    got = last_values(series)
    assert {k: (v.value, v.rank) for k, v in got.items()} == {"loss": (2.4173, 0), "val_loss": (1.25, 2),
                                                               "empty": (None, 0)}
    assert got["empty"].non_finite == "nan" and got["empty"].last_finite is None


def test_a_last_value_that_is_not_a_number_is_said_with_the_one_before_never_replaced_by_it():
    """Rank 0's loss diverges: its last logged value was NaN (an infinity on rank 1). The last
    value is that, said with the last finite one before it, in the JSON and the sentence, and a
    NaN counter counts no samples (was: 2.1, the value before, as "the last loss")."""
    series = {("metric", "loss"): metric([(0, 10, 2.5), (0, 20, 2.1), (0, 30, np.nan), (1, 40, 1.9)]),
              ("metric", "grad_norm"): metric([(1, 10, 3.0), (1, 20, np.inf)]),
              ("metric", "samples"): metric([(0, 10, 640.0), (0, 20, np.nan)])}
    got = last_values(series)
    assert (got["loss"].value, got["loss"].non_finite, got["loss"].last_finite) == (None, "nan", 2.1)
    assert (got["grad_norm"].value, got["grad_norm"].rank, got["grad_norm"].non_finite) == (None, 1, "inf")
    done = summarise(series)
    assert done["metrics"]["loss"] == {"value": None, "rank": 0, "non_finite": "nan", "last_finite": 2.1}
    assert done["samples"] is None
    said = line(done)
    assert "loss nan (last finite 2.1)" in said and "grad_norm inf (last finite 3)" in said, said


def test_rank_0_steps_and_samples_from_a_rate_are_close_to_the_work_done():
    """Rank 0 does 100 steps of 64 samples, each step 0.05-0.5 s, and logs batch / step time
    right after each: the estimate is within 2 % of 6,400 (a mean rate times the total time
    would be far above it). Rank 1 did 90 steps: the spread is said."""
    rng = np.random.default_rng(1)
    took = rng.uniform(0.05, 0.5, 100)
    ends = (np.cumsum(took) * 1e6).astype(np.int64)
    steps = Series(np.r_[np.zeros(100), np.ones(90)].astype(np.int64), np.r_[ends, ends[:90]], np.r_[took, took[:90]],
                   np.r_[np.arange(100), np.arange(90)].astype(np.int64))
    rate = metric([(0, int(e) + 300, 64 / t) for e, t in zip(ends, took)])
    p = summarise({("section", "step"): steps, ("metric", "samples_per_s"): rate})
    assert p["steps"]["count"] == 100 and (p["steps"]["fewest"], p["steps"]["most"]) == (90, 100)
    assert p["samples"]["estimate"] and abs(p["samples"]["value"] - 6400) < 128, p["samples"]
    assert np.mean(64 / took) * took.sum() > 1.3 * 6400                     # what the naive estimate says
    text = line(p)
    assert text.startswith("100 steps (rank 0; ranks did 90-100); about 6,") and "samples on rank 0" in text, text


def test_a_rate_logged_every_10_steps_counts_the_10_steps_it_follows():
    """A script that logs ``samples_per_s`` every 10th step (``if step % 10 == 0``) of 1,000
    steps of 64 samples: about 64,000 samples, not the 6,400 of the steps that have a rate
    row of their own; the steps after the last rate row count at its rate."""
    took = np.full(1000, 1.0)
    ends = (np.cumsum(took) * 1e6).astype(np.int64)
    steps = Series(np.zeros(1000, np.int64), ends, took, np.arange(1000, dtype=np.int64))
    rate = metric([(0, int(ends[i]) + 300, 64.0) for i in range(0, 1000, 10)])
    p = summarise({("section", "step"): steps, ("metric", "samples_per_s"): rate})
    assert abs(p["samples"]["value"] - 64_000) < 1, p["samples"]
    assert "since the one before" in p["samples"]["how"]


def test_a_counter_is_the_count_and_no_rank_0_data_says_whose_values():
    steps = Series(np.array([1, 1]), np.array([1, 2]), np.array([0.1, 0.1]), np.array([0, 1]))
    p = summarise({("section", "step"): steps, ("metric", "consumed_samples"): metric([(1, 3, 512.0)]),
                   ("metric", "loss"): metric([(1, 3, 0.5)])})
    assert p["steps"]["rank"] == 1 and p["samples"] == {"value": 512.0, "unit": "consumed_samples", "rank": 1,
                                                        "estimate": False,
                                                        "how": "the last consumed_samples logged by rank 1"}
    assert line(p) == "2 steps (rank 1); 512 consumed_samples; last consumed_samples 512, loss 0.5 (rank 1)"
    assert summarise({}) is None and line(None) == "no steps and no metric logged"


def test_a_script_that_times_no_step_is_counted_by_the_steps_it_logged():
    """``observe.log(step=i, ...)`` only (no step section): the distinct step numbers of each
    rank, and a rate is no sample count without step times."""
    loss = metric([(0, t, 1.0) for t in range(10)] + [(1, t, 1.0) for t in range(5)])
    loss.step = np.r_[np.arange(10), np.arange(5)].astype(np.int32)
    rate = metric([(0, 3, 100.0)])
    rate.step = np.array([3], np.int32)
    p = summarise({("metric", "loss"): loss, ("metric", "samples_per_s"): rate})
    assert (p["steps"]["count"], p["steps"]["fewest"], p["steps"]["most"]) == (10, 5, 10) and p["samples"] is None


def test_a_step_timed_before_any_step_number_was_logged_is_still_a_step():
    """``with observe.section("step"): ...`` then ``observe.log(step=i)``, 12 times: the first
    section comes before any step number (stored without one); 12 steps, not 11."""
    steps = Series(np.zeros(12, np.int64), np.arange(12, dtype=np.int64) * 10, np.full(12, 0.02),
                   np.r_[-1, np.arange(11)].astype(np.int64))
    p = summarise({("section", "step"): steps})
    assert p["steps"]["count"] == 12 and line(p).startswith("12 steps"), p
