import importlib.metadata

import accel_ckpt


def test_installed_version_matches_source():
    assert accel_ckpt.__version__ == importlib.metadata.version("accel-ckpt")
