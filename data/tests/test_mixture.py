"""MixtureDataset: weights that hold at every row, stages, stop strategies, provenance."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import varied_texts, wordlevel_tokenizer, write_jsonl

from meltemi.data import (
    ByteTokenizer,
    DatasetExhausted,
    HfTokenizer,
    JsonlFiles,
    MixtureDataset,
    PackedDataset,
    build_store,
    exact_counts,
)
from meltemi.data._apportion import quota_schedule


@pytest.fixture
def parts(tmp_path):
    out = {}
    for name, count, seed in (("code", 31, 1), ("prose", 13, 2), ("math", 7, 3)):
        src = JsonlFiles(
            name, [str(write_jsonl(tmp_path / f"{name}.jsonl", varied_texts(count, seed)))]
        )
        store = build_store([src], ByteTokenizer(), tmp_path / name)
        out[name] = PackedDataset(store, seq_len=19, batch_size=10, seed=seed)
    return out


def test_exact_counts_sum_and_follow_weights():
    for weights, total in (([1, 1, 1], 10), ([0.7, 0.2, 0.1], 20), ([1, 0], 3), ([3, 5], 7)):
        counts = exact_counts(weights, total)
        share = np.asarray(weights) / np.sum(weights) * total
        assert counts.sum() == total and np.all(np.abs(counts - share) < 1), (weights, counts)


@pytest.mark.parametrize(
    ("weights", "total", "match"),
    [
        ([0, 0], 4, r"every weight is 0"),
        ([-1, 2], 3, r"'weights\[0\]' is -1\.0"),
        ([1, float("nan")], 3, r"'weights\[1\]' is nan"),
    ],
)
def test_exact_counts_refuses_bad_weights(weights, total, match):
    with pytest.raises(ValueError, match=match):
        exact_counts(weights, total)


def _fractions(mix, rows: int) -> np.ndarray:
    """Component fractions over the rows of the first steps holding `rows` rows."""
    got, step, seen = [], 0, 0
    while seen < rows:
        start, size = mix.rows_before(step), mix.batch_size_at(step)
        got.append(np.arange(start, start + size))
        seen += size
        step += 1
    comp = mix.components_of(np.concatenate(got))
    return np.bincount(comp, minlength=len(mix.names)) / len(comp)


@pytest.mark.parametrize(
    ("weights", "batch_size"),
    [
        ({"code": 0.96, "prose": 0.04}, 10),  # before the fix: 0% prose
        ({"code": 0.5, "prose": 0.3, "math": 0.2}, [(0, 7), (100, 8)]),  # before: 100% code
        ({"code": 0.7, "prose": 0.2, "math": 0.1}, 32),  # before: 0.719/0.188/0.094
        ({"code": 0.01, "prose": 0.99}, 3),
        ({"code": 0.01, "prose": 0.01, "math": 0.98}, [(0, 5), (7, 3), (40, 11)]),
        ({"code": 0.123457, "prose": 0.3, "math": 0.576543}, 1),  # no short exact period
    ],
)
def test_long_run_fractions_equal_the_weights(parts, weights, batch_size):
    mix = MixtureDataset(parts, weights, batch_size=batch_size, seed=1)
    want = np.asarray([weights.get(n, 0.0) for n in mix.names])
    got = _fractions(mix, 100_000)
    np.testing.assert_allclose(got, want, rtol=0.002)


def test_every_prefix_is_within_one_row_of_its_share(parts):
    w = np.asarray([0.45, 0.35, 0.2])
    mix = MixtureDataset(
        parts, dict(zip(["code", "prose", "math"], w)), batch_size=[(0, 3), (5, 7)]
    )
    comp = mix.components_of(np.arange(20_000))
    counts = np.cumsum(np.eye(3, dtype=np.int64)[comp], axis=0)
    share = np.arange(1, len(comp) + 1)[:, None] * w
    assert np.abs(counts - share).max() < 1


def test_every_batch_holds_the_exact_counts(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.3, "math": 0.2}, batch_size=10, seed=1)
    for step in range(6):
        comp = mix.batch(step)["component"]
        assert np.bincount(comp, minlength=3).tolist() == [5, 3, 2]


@pytest.mark.parametrize(
    ("weight", "shown"),
    [(float("nan"), "nan"), (float("inf"), "inf"), (-0.5, r"-0\.5"), ("lots", "'lots'")],
)
def test_bad_weights_are_refused_naming_component_and_value(parts, weight, shown):
    with pytest.raises(ValueError, match=rf"weight of 'prose' is {shown}"):
        MixtureDataset(parts, {"code": 1.0, "prose": weight}, batch_size=10)


def test_all_zero_weights_are_refused(parts):
    with pytest.raises(ValueError, match=r"at step 4: every weight is 0.*positive weight"):
        MixtureDataset(parts, [(0, {"code": 1}), (4, {"code": 0, "prose": 0})], batch_size=10)


def test_components_with_different_tokenizers_are_refused(parts, tmp_path):
    path = wordlevel_tokenizer(tmp_path / "words.json", ("<unk>", "<s>", "</s>", "<pad>"))
    src = JsonlFiles("words", [str(write_jsonl(tmp_path / "w.jsonl", varied_texts(40, 9)))])
    store = build_store([src], HfTokenizer(path), tmp_path / "words")
    words = PackedDataset(store, seq_len=19, batch_size=10)
    with pytest.raises(ValueError, match=r"components 'code' and 'words'.*different tokenizers"):
        MixtureDataset({"code": parts["code"], "words": words}, {"code": 1, "words": 1},
                       batch_size=10)  # fmt: skip


def test_components_with_different_pad_ids_are_refused(parts):
    other = PackedDataset(parts["prose"].store, seq_len=19, batch_size=10, pad_id=0)
    with pytest.raises(ValueError, match=r"'code' and 'prose' pad with different ids \(258 and 0"):
        MixtureDataset({"code": parts["code"], "prose": other}, {"code": 1}, batch_size=10)


def test_stages_switch_weights_at_their_step(parts):
    stages = [(0, {"code": 1.0}), (3, {"prose": 0.5, "math": 0.5})]
    mix = MixtureDataset(parts, stages, batch_size=10)
    assert set(mix.batch(2)["component"].tolist()) == {0}
    assert np.bincount(mix.batch(3)["component"], minlength=3).tolist() == [0, 5, 5]


def test_rows_match_their_component_sequences(parts):
    mix = MixtureDataset(parts, {"code": 0.6, "prose": 0.4}, batch_size=10, seed=3)
    b = mix.batch(2)
    for row in (0, 4, 9):
        name = mix.names[b["component"][row]]
        for p in mix.locate(2, row):
            assert p.component == name
            store = parts[name].store
            want = store.tokens(p.document, p.token_offset, p.token_offset + p.length)
            assert np.array_equal(b["tokens"][row, p.row_offset : p.row_offset + p.length], want)


def test_first_exhausted_stops_before_any_repeat(parts):
    mix = MixtureDataset(
        parts, {"code": 0.5, "prose": 0.3, "math": 0.2}, batch_size=10, stop="first_exhausted"
    )
    q = {n: d.num_sequences for n, d in parts.items()}
    # math: 2 rows per step; prose: 3; code: 5 -> the smallest of q // rows.
    assert mix.num_steps == min(q["code"] // 5, q["prose"] // 3, q["math"] // 2)
    mix.batch(mix.num_steps - 1)
    with pytest.raises(DatasetExhausted, match=r"past the end of this mixture"):
        mix.batch(mix.num_steps)


def test_all_exhausted_runs_until_every_component_is_seen(parts):
    mix = MixtureDataset(
        parts, {"code": 0.5, "prose": 0.3, "math": 0.2}, batch_size=10, stop="all_exhausted"
    )
    q = {n: d.num_sequences for n, d in parts.items()}
    per = {"code": 5, "prose": 3, "math": 2}
    assert mix.num_steps == max(-(-q[n] // per[n]) for n in q)


def test_all_exhausted_refuses_a_component_that_stops_being_drawn(parts):
    with pytest.raises(ValueError, match="'math' gets weight 0 from some stage on"):
        stages = [(0, {"code": 1, "prose": 1, "math": 1}), (1, {"code": 1, "prose": 1})]
        MixtureDataset(parts, stages, batch_size=10, stop="all_exhausted")


def test_steps_of_inverts_locate_across_stages(parts):
    stages = [(0, {"code": 0.5, "prose": 0.5}), (4, {"code": 0.2, "prose": 0.3, "math": 0.5})]
    mix = MixtureDataset(parts, stages, batch_size=[(0, 7), (3, 8)], seed=7)
    max_step = 12
    expected: dict[tuple, set] = {}
    for step in range(max_step):
        for row in range(mix.batch_size_at(step)):
            for p in mix.locate(step, row):
                expected.setdefault((p.component, p.document), set()).add((step, row))
    for key in [("code", 0), ("prose", 5), ("math", 3), ("code", 30)]:
        assert set(mix.steps_of(*key, max_step=max_step)) == expected.get(key, set())


def test_process_slices_concatenate_to_the_global_batch(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.5}, batch_size=10, seed=2)
    full = mix.batch(3)
    halves = [mix.batch(3, i, 2) for i in range(2)]
    for key in full:
        assert np.array_equal(np.concatenate([h[key] for h in halves]), full[key])


def test_mixture_errors_name_the_fix(parts):
    with pytest.raises(ValueError, match=r"unknown components \['web'\]"):
        MixtureDataset(parts, {"web": 1.0}, batch_size=10)
    with pytest.raises(ValueError, match="first stage must start at step 0"):
        MixtureDataset(parts, [(5, {"code": 1.0})], batch_size=10)
    with pytest.raises(ValueError, match="stop='never'"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=10, stop="never")
    with pytest.raises(KeyError, match="unknown component 'web'"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=10).steps_of("web", 0, max_step=1)


SCHEDULE = [(0, 4), (3, 8), (5, 12)]


def test_batch_schedule_steps_read_consecutive_rows_with_exact_counts(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.25, "math": 0.25}, batch_size=SCHEDULE)
    assert mix.batch_size is None
    assert [mix.rows_before(s) for s in range(7)] == [0, 4, 8, 12, 20, 28, 40]
    for step in range(7):
        size = mix.batch_size_at(step)
        start = mix.rows_before(step)
        b = mix.batch(step)
        rows = mix.sequences(np.arange(start, start + size))
        for key in b:
            assert np.array_equal(b[key], rows[key]), (step, key)
        counts = np.bincount(b["component"], minlength=3).tolist()
        assert counts == [size // 2, size // 4, size // 4]


def test_a_constant_batch_size_reads_row_step_times_size_plus_row(parts):
    mix = MixtureDataset(parts, {"code": 0.6, "prose": 0.4}, batch_size=10, seed=5)
    b = mix.batch(3)
    rows = mix.sequences(np.arange(30, 40))
    assert all(np.array_equal(b[k], rows[k]) for k in b)


def test_stage_switches_at_its_step_under_a_batch_schedule(parts):
    stages = [(0, {"code": 1.0}), (4, {"prose": 0.5, "math": 0.5})]
    mix = MixtureDataset(parts, stages, batch_size=SCHEDULE)
    assert set(mix.batch(3)["component"].tolist()) == {0}
    assert np.bincount(mix.batch(4)["component"], minlength=3).tolist() == [0, 4, 4]
    assert mix.components_of([19, 20]).tolist()[0] == 0  # the last row of step 3


def test_steps_of_inverts_locate_under_a_batch_schedule(parts):
    stages = [(0, {"code": 0.5, "prose": 0.5}), (4, {"code": 0.25, "math": 0.75})]
    mix = MixtureDataset(parts, stages, batch_size=SCHEDULE, seed=11)
    max_step = 7
    expected: dict[tuple, set] = {}
    for step in range(max_step):
        for row in range(mix.batch_size_at(step)):
            for p in mix.locate(step, row):
                expected.setdefault((p.component, p.document), set()).add((step, row))
    for key in [("code", 1), ("prose", 4), ("math", 2), ("code", 29)]:
        assert set(mix.steps_of(*key, max_step=max_step)) == expected.get(key, set())


def test_rows_past_a_stopping_mixture_are_refused(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "math": 0.5}, batch_size=SCHEDULE,
                         stop="first_exhausted")  # fmt: skip
    assert mix.num_rows == mix.rows_before(mix.num_steps)
    mix.sequences([mix.num_rows - 1])
    with pytest.raises(DatasetExhausted, match=r"row \d+ is past the end of this mixture"):
        mix.sequences([mix.num_rows])


def test_batch_schedule_errors_name_the_fix(parts):
    with pytest.raises(ValueError, match=r"first entry must start at step 0"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=[(2, 4)])
    with pytest.raises(ValueError, match=r"schedule steps must increase \(3 after 5\)"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=[(0, 4), (5, 8), (3, 4)])
    with pytest.raises(ValueError, match=r"size 0 \(from step 3\) must be >= 1"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=[(0, 4), (3, 0)])


def test_quota_sequences_stay_within_one_row_for_random_weights():
    rng = np.random.default_rng(0)
    for _ in range(40):
        weights = tuple(int(w) for w in rng.integers(0, 60, int(rng.integers(2, 7))))
        if sum(w > 0 for w in weights) < 2:
            continue
        q = quota_schedule(weights)
        counts = np.cumsum(np.eye(len(weights), dtype=np.int64)[q.component], axis=0)
        share = np.arange(1, q.period + 1)[:, None] * np.asarray(weights) / q.period
        assert np.abs(counts - share).max() < 1, weights
        assert counts[-1].tolist() == list(weights)  # the period closes: the sequence repeats
