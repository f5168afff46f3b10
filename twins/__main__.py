import sys

from twins.cli import main

sys.exit(main())
