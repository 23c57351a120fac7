"""The training loop's services: samples by global index (``data``), eval (``evaluate``), what each step
logs (``metrics``, ``observe``), measured memory (``memory``), fault handling (``faults``).
"""
