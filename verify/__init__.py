"""verify: replay a pipesim Schedule on real torch devices and prove it bit-identical.

This package imports torch; install it with ``pip install 'pipesim[verify]'``.
"""
