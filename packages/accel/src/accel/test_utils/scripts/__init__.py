"""accel's own test programs, at Accelerate's ``accelerate.test_utils.scripts`` module path.

Each module has a ``main()`` that checks accel's behaviour on however many processes run it: under
``debug_launcher(module.main)`` (forked CPU processes), under ``accel launch module.py``, or in one
plain process. A failed check raises ``AssertionError`` naming what differed.
"""
