"""autoplan: automatic parallel plans for transformer training.

Planning (``autoplan.schema``, ``autoplan.cost``, ``autoplan.search``, ``autoplan plan``) is plain Python
plus OR-Tools and never imports torch; ``autoplan.profiler`` is the one part that builds torch modules.
"""

__version__ = "0.1.0"
