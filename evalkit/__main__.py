"""`python -m evalkit ...`"""

from evalkit.cli import main

raise SystemExit(main())
