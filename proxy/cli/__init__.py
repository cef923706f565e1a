"""Entry points: ``loopguard serve | check-config | demo | replay``.

The top layer: may import every layer below it, and nothing imports it.
"""
