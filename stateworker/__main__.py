import sys

from stateworker.app.cli import main

sys.exit(main())
