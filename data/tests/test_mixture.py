"""MixtureDataset: exact counts per block, stages, stop strategies, provenance."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import varied_texts, write_jsonl

from meltemi.data import (
    ByteTokenizer,
    DatasetExhausted,
    JsonlFiles,
    MixtureDataset,
    PackedDataset,
    build_store,
    exact_counts,
)


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
    assert exact_counts([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert exact_counts([0.7, 0.2, 0.1], 20).tolist() == [14, 4, 2]
    assert exact_counts([1, 0], 3).tolist() == [3, 0]


def test_every_batch_holds_the_exact_counts(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.3, "math": 0.2}, batch_size=10, seed=1)
    for step in range(6):
        comp = mix.batch(step)["component"]
        assert np.bincount(comp, minlength=3).tolist() == [5, 3, 2]


def test_slots_are_shuffled_within_the_block(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.3, "math": 0.2}, batch_size=10, seed=1)
    layouts = {tuple(mix.batch(s)["component"].tolist()) for s in range(8)}
    assert len(layouts) > 1


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
    mix = MixtureDataset(parts, stages, batch_size=10, seed=7, block_size=5)
    max_step = 12
    expected: dict[tuple, set] = {}
    for step in range(max_step):
        for row in range(10):
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
    with pytest.raises(ValueError, match="block_size=3.*must divide batch_size=10"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=10, block_size=3)
    with pytest.raises(ValueError, match="stop='never'"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=10, stop="never")
    with pytest.raises(KeyError, match="unknown component 'web'"):
        MixtureDataset(parts, {"code": 1.0}, batch_size=10).steps_of("web", 0, max_step=1)


SCHEDULE = [(0, 4), (3, 8), (5, 12)]


def test_batch_schedule_steps_read_consecutive_rows_with_exact_counts(parts):
    mix = MixtureDataset(parts, {"code": 0.5, "prose": 0.25, "math": 0.25}, batch_size=SCHEDULE)
    assert mix.block_size == 4 and mix.batch_size is None
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
    with pytest.raises(
        ValueError, match=r"block_size=8\): must divide batch_size=4 \(from step 0\).*block_size=4"
    ):
        MixtureDataset(parts, {"code": 1.0}, batch_size=SCHEDULE, block_size=8)
