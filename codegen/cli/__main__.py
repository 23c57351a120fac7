"""``python -m parc.codegen.cli ...``: the same as the ``parc`` command."""

import sys

from . import main

sys.exit(main())
