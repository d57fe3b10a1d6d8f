import numpy as np

from amptrain.data.batching import BatchPlan, bucket_boundaries


def test_boundaries_are_multiples_of_8_bounded_in_number_and_cover_max_length():
    lengths = np.random.default_rng(0).integers(1, 300, size=1000)
    boundaries = bucket_boundaries(lengths, max_length=250, num_buckets=5)
    assert all(b % 8 == 0 for b in boundaries)
    assert len(boundaries) <= 5
    assert boundaries[-1] == 256  # 250 rounded up: any truncated example fits
    assert boundaries == sorted(boundaries)


def test_each_epoch_holds_every_example_once_in_full_fixed_shape_batches():
    lengths = [3, 9, 17, 5, 30, 8, 12, 1, 25, 7]
    plan = BatchPlan(lengths, batch_size=4, boundaries=[8, 16, 32], seed=1)
    # buckets: <=8: 3,5,8,1,7 (5) -> 2 batches; <=16: 9,12 -> 1; <=32: 17,30,25 -> 1
    assert plan.steps_per_epoch == 4
    batches = plan.epoch(0)
    indices = np.concatenate([b for b, _ in batches])
    assert sorted(indices[indices >= 0]) == list(range(10))
    assert all(len(b) == 4 for b, _ in batches)
    for batch, length in batches:
        assert all(lengths[i] <= length for i in batch if i >= 0)


def test_order_is_a_pure_function_of_seed_and_step():
    lengths = np.random.default_rng(0).integers(1, 64, size=50)
    a = BatchPlan(lengths, 8, [16, 32, 64], seed=3)
    b = BatchPlan(lengths, 8, [16, 32, 64], seed=3)
    steps = range(3 * a.steps_per_epoch)
    assert all(np.array_equal(a.batch(s)[0], b.batch(s)[0]) for s in reversed(steps))  # any access order
    assert not np.array_equal(a.epoch(0)[0][0], a.epoch(1)[0][0]) or not np.array_equal(
        a.epoch(0)[1][0], a.epoch(1)[1][0]
    )
    c = BatchPlan(lengths, 8, [16, 32, 64], seed=4)
    assert any(not np.array_equal(a.batch(s)[0], c.batch(s)[0]) for s in steps)


def test_unshuffled_plan_keeps_file_order_within_buckets():
    plan = BatchPlan([5, 5, 20, 5], batch_size=2, boundaries=[8, 24], shuffle=False)
    assert [list(b) for b, _ in plan.epoch(0)] == [[0, 1], [3, -1], [2, -1]]


def test_the_longest_length_gets_its_own_boundary_below_max_length():
    # training sentences up to 82 pieces, max_length 256 for longer test sentences: the
    # longest training batches are padded to 88, not 256
    lengths = np.random.default_rng(0).integers(5, 83, size=500)
    assert bucket_boundaries(lengths, max_length=256, num_buckets=6)[-2:] == [88, 256]
    assert len(bucket_boundaries(lengths, max_length=256, num_buckets=6)) <= 6
    assert bucket_boundaries(lengths, max_length=256, num_buckets=2) == [88, 256]
    assert bucket_boundaries(lengths, max_length=256, num_buckets=1) == [256]


def test_boundaries_minimise_padded_tokens_where_quantiles_collapse():
    # Slots of 8: (0, 8] holds 3 and 5, (8, 16] holds 9..12, (16, 24] none, (24, 32] holds 30.
    lengths = [3, 5, 9, 10, 11, 12, 30]
    # Two buckets, rows padded one by one (batch_size 1): [32] pads to 7 * 32 = 224 tokens,
    # [8, 32] to 2 * 8 + 5 * 32 = 176, [16, 32] to 6 * 16 + 32 = 128, [24, 32] to 176.
    assert bucket_boundaries(lengths, max_length=32, num_buckets=2) == [16, 32]
    # Three: [8, 16, 32] pads to 2 * 8 + 4 * 16 + 32 = 112 (the 1/3 and 2/3 quantiles,
    # 9 and 11.3, both round up to 16 and would have left one bucket unused).
    assert bucket_boundaries(lengths, max_length=32, num_buckets=3) == [8, 16, 32]
    # The empty (16, 24] slot never earns a boundary, however many are allowed.
    assert bucket_boundaries(lengths, max_length=32, num_buckets=8) == [8, 16, 32]
    # Batches of 4 rows pad each bucket's last batch: [16, 32] costs 2 * 4 * 16 + 1 * 4 * 32
    # = 256, as much as [32] alone (2 * 4 * 32); a tie goes to fewer shapes.
    assert bucket_boundaries(lengths, max_length=32, num_buckets=2, batch_size=4) == [32]
    assert bucket_boundaries(lengths, max_length=32, num_buckets=3, batch_size=4) == [8, 16, 32]  # 32 + 64 + 128
