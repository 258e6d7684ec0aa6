import sys

from stateworker.cli import main

sys.exit(main())
