import pytest

from accel_ckpt import InvalidArgumentError, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200KB", 200_000),
        ("1GB", 10**9),
        ("10GB", 10**10),
        ("10GiB", 10 * 2**30),
        ("3MiB", 3 * 2**20),
        ("1.5MB", 1_500_000),
        ("5Gb", 5 * 10**9 // 8),
        ("512", 512),
        (" 2 kb", 250),
        (1234, 1234),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "ten GB", "5XB", "-1GB", 0, -5, 1.5, True, None])
def test_parse_size_rejects_with_a_hint(bad):
    with pytest.raises(InvalidArgumentError, match="max_shard_size"):
        parse_size(bad)
