"""The pure routing core: selection, cooldowns, classification, attempts.

Nothing in this package imports Django; it works on the frozen dataclasses of
`routing.types` and takes `now`, `rng` and `sleep` as arguments.
"""
