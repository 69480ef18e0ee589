"""Small helpers every package needs and none owns: durable file writes, one-line messages, derived seeds.

Imports only the standard library, so data/, model/, checkpoint/ and training/ can all use it.
"""
