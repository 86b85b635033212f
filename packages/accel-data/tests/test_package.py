import importlib.metadata

import accel_data


def test_installed_version_matches_source():
    assert accel_data.__version__ == importlib.metadata.version("accel-data")
