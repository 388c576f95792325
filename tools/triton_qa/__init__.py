"""``make triton-qa``: Triton's own qa cases run unchanged against a live conch.

``cases.py`` is the chosen set (files, cases, repository recipes, environment, flags),
``repository.py`` builds the repositories as the qa ``test.sh`` scripts do,
``source.py`` reads Triton's files from a local checkout, and ``run.py`` serves each
group and runs its cases. docs/triton-compatibility.md says how to run it and what it
found.
"""
