"""``python -m stability``: the command line (``stability.cli``), which loads TensorFlow
only once a command is to run (``stability.commands.startup``)."""

from stability.cli import main

raise SystemExit(main())
