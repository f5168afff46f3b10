"""The command line: `twins compare` (the main job) and friends.

This package may use both backends, so it imports them lazily; neither backend imports it.
"""
