import importlib.metadata

import accel_launch


def test_installed_version_matches_source():
    assert accel_launch.__version__ == importlib.metadata.version("accel-launch")
