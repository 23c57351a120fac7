"""Context parallelism: the attention core over cp ranks (``context``: ulysses, all-gather; ``ring``).
"""
