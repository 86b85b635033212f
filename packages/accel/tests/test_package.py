import importlib.metadata

import accel


def test_installed_version_matches_source():
    assert accel.__version__ == importlib.metadata.version("accel")
