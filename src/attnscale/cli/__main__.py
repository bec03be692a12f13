"""``python -m attnscale.cli``: the same as the ``attnscale`` command."""

from attnscale.cli import main

main()
