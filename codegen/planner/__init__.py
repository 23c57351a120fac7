"""The planner: the cost model (``cost/``), the layout search (``search.py``), what
``parc profile`` measures (``profile.py``) and the reasons ``parc plan`` gives (``why.py``).

Takes: a ``Spec`` and the hardware. Gives: ranked layouts with predicted time and memory;
``passes/choose_layout.py`` builds the winner, ``cli/plan.py`` prints the ranking.
"""
