import importlib.metadata

import accel_ops


def test_installed_version_matches_source():
    assert accel_ops.__version__ == importlib.metadata.version("accel-ops")
