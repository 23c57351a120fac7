"""The lowering passes, one module each; ``codegen/lower.py`` lists them in order."""
