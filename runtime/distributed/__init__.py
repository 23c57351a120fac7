"""Processes and communication: ``mesh`` (process groups), ``comm`` (communication mappings, the exposed
communication clock, asynchronous launches), ``traffic`` (bytes per group).
"""
