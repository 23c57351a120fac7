"""Pipeline schedules as data, without torch: ``schedule`` (the kinds, ``build_schedule``), one module per
kind that needs its own orders (``schedule_zb``, ``schedule_zbv``, ``schedule_chimera``, ``schedule_terapipe``)
and the simulator (``schedule_sim``) the planner and ``parc explain`` read.
"""
