"""One package per parallel axis: ``tensor``, ``context``, ``expert``, ``pipeline``, ``data``.
"""
